#include "review/review.h"

#include <limits>
#include <nlohmann/json.hpp>

#include "crypto/crypto.h"
#include "review/extract.h"
#include "review/media_type.h"

namespace oml::review {

Result<Options> OptionsFromConfig(const Config& config) {
  Options o;
  OML_ASSIGN_OR_RETURN(o.deny_list, DenyList::Load(config.deny_list_file));
  o.clamd_address = config.clamd_address;
  o.clamd_timeout_ms = config.clamd_timeout_ms;
  o.max_text_bytes = config.review_max_text_bytes;
  // A malformed address is a configuration error, found at startup. Whether clamd answers is
  // not tried here: a scan error is reported per review ("scan-error").
  if (!o.clamd_address.empty()) OML_RETURN_IF_ERROR(ParseClamdAddress(o.clamd_address).status());
  if (o.clamd_timeout_ms < 1) return InvalidArgument("setting clamd_timeout_ms: must be at least 1");
  if (o.max_text_bytes < 1) return InvalidArgument("setting review_max_text_bytes: must be at least 1");
  return o;
}

Result<std::shared_ptr<PdfSandbox>> PdfSandboxFromConfig(const Config& config, const std::string& binary) {
  if (binary.empty()) return InvalidArgument("the PDF extractor needs the oml binary's path");
  PdfSandboxOptions p;
  p.binary = binary;
  p.memory_bytes = static_cast<uint64_t>(config.pdf_extract_memory_mb) << 20;
  p.cpu_seconds = static_cast<int>(config.pdf_extract_cpu_s);
  p.wall = std::chrono::seconds(config.pdf_extract_timeout_s);
  p.max_concurrent = static_cast<int>(config.pdf_extract_max);
  p.max_per_tenant = static_cast<int>(config.pdf_extract_per_tenant);
  return std::make_shared<PdfSandbox>(std::move(p));
}

const char* ReviewKindName(ReviewKind k) { return k == ReviewKind::kTextExtraction ? "text-extraction" : "opaque"; }

std::vector<std::string> Review::Flags() const {
  std::vector<std::string> f;
  if (!hits.empty()) f.push_back("deny-list");
  if (scan.outcome == ScanResult::Outcome::kInfected) f.push_back("infected");
  if (scan.outcome == ScanResult::Outcome::kError) f.push_back("scan-error");
  if (media_type_mismatch) f.push_back("media-type-mismatch");
  if (text_truncated) f.push_back("text-truncated");
  if (method == "pdf-encrypted" || method == "pdf-unreadable" || method == "pdf-too-large" || method == "pdf-limit")
    f.push_back("not-extracted");
  return f;
}

Result<Review> ReviewContent(const Options& options, std::string_view declared_media_type, std::string_view bytes,
                             const std::string& tenant) {
  Review r;
  r.size = bytes.size();
  r.sha256_hex = crypto::Hex(crypto::Sha256(bytes));
  r.declared_media_type = NormalizeMediaType(declared_media_type);
  OML_ASSIGN_OR_RETURN(Detected detected, DetectMediaType(bytes));
  r.detected_media_type = detected.media_type;
  const Resolved resolved = Resolve(r.declared_media_type, r.detected_media_type);
  r.media_type = resolved.media_type;
  r.media_type_mismatch = resolved.mismatch;

  TextSink sink(options.max_text_bytes);
  // The detected type picks the extractor (never the declaration alone); the resolved type only
  // refines text (JSON).
  if (bytes.empty()) {
    r.kind = ReviewKind::kTextExtraction;
    r.method = "empty";
  } else if (IsPdf(r.detected_media_type)) {
    PdfText pdf;
    if (options.pdf) {
      OML_ASSIGN_OR_RETURN(pdf, options.pdf->Extract(bytes, &sink, tenant));
    } else {
      pdf = ExtractPdf(bytes, &sink);
    }
    r.pdf_pages = pdf.pages;
    r.notes = std::move(pdf.notes);
    switch (pdf.outcome) {
      case PdfOutcome::kOk: r.kind = ReviewKind::kTextExtraction; r.method = "pdf"; break;
      case PdfOutcome::kEncrypted: r.method = "pdf-encrypted"; break;
      case PdfOutcome::kUnreadable: r.method = "pdf-unreadable"; break;
      case PdfOutcome::kTooLarge: r.method = "pdf-too-large"; break;
      case PdfOutcome::kLimit: r.method = "pdf-limit"; break;
    }
  } else if (IsTextFamily(r.detected_media_type)) {
    r.kind = ReviewKind::kTextExtraction;
    r.charset = detected.charset;
    if (IsJson(r.media_type) || IsJson(r.declared_media_type)) {
      // nlohmann reads UTF-8 only: other charsets are decoded first (whole, uncapped: the JSON
      // must parse as a whole).
      const bool utf8 = (detected.charset == "us-ascii" || detected.charset == "utf-8") &&
                        !bytes.starts_with("\xEF\xBB\xBF");
      std::string decoded;
      if (!utf8) {
        TextSink all(std::numeric_limits<size_t>::max());
        ExtractPlainText(bytes, detected.charset, &all);
        decoded = all.Take();
      }
      if (ExtractJson(utf8 ? bytes : std::string_view(decoded), &sink)) {
        r.method = "json";
      } else {
        r.method = "json-invalid-as-text";
        TextSink fresh(options.max_text_bytes);
        ExtractPlainText(bytes, detected.charset, &fresh);
        r.text_truncated = fresh.truncated();
        r.text = fresh.Take();
      }
    } else {
      r.method = "text";
      ExtractPlainText(bytes, detected.charset, &sink);
    }
  } else {
    r.method = "binary";
  }
  if (r.kind == ReviewKind::kTextExtraction && r.method != "json-invalid-as-text") {
    r.text_truncated = sink.truncated();
    r.text = sink.Take();
  }
  if (r.text_truncated) r.notes.push_back("text truncated at " + std::to_string(r.text.size()) + " bytes");

  const DenyList& deny = options.deny_list ? *options.deny_list : *DenyList::Builtin();
  ScanHits hits = deny.Scan(r.text, options.max_hits);
  r.hits = std::move(hits.hits);
  r.hits_truncated = hits.truncated;
  r.scan = ClamdScan(options.clamd_address, bytes, options.clamd_timeout_ms);
  return r;
}

ScanHits GateText(const Options& options, std::string_view text) {
  const DenyList& deny = options.deny_list ? *options.deny_list : *DenyList::Builtin();
  return deny.Scan(text, options.max_hits);
}

nlohmann::json ReviewToJson(const Review& r) {
  nlohmann::json hits = nlohmann::json::array();
  for (const auto& h : r.hits) hits.push_back({{"pattern", h.pattern_id}, {"offset", h.offset}});
  nlohmann::json j = {
      {"declared_media_type", r.declared_media_type},
      {"detected_media_type", r.detected_media_type},
      {"media_type", r.media_type},
      {"media_type_mismatch", r.media_type_mismatch},
      {"review", ReviewKindName(r.kind)},
      {"method", r.method},
      {"sha256", r.sha256_hex},
      {"size", r.size},
      {"text_bytes", r.text.size()},
      {"text_truncated", r.text_truncated},
      {"deny_list_hits", std::move(hits)},
      {"hits_truncated", r.hits_truncated},
      {"scan", r.scan.ToString()},
      {"notes", r.notes},
      {"flags", r.Flags()},
  };
  if (!r.charset.empty()) j["charset"] = r.charset;
  if (r.detected_media_type == "application/pdf") j["pdf_pages"] = r.pdf_pages;
  return j;
}

}  // namespace oml::review
