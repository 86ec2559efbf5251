#include "review/review.h"

#include <openssl/evp.h>

#include <climits>
#include <cstdlib>
#include <limits>
#include <optional>
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

namespace {

// Bytes in memory, given in pieces of kPiece (the detection prefix copies pieces, not the whole).
class StringSource : public ByteSource {
 public:
  static constexpr size_t kPiece = size_t{1} << 20;
  explicit StringSource(std::string_view bytes) : bytes_(bytes) {}
  Result<std::string_view> Next() override {
    const std::string_view p = bytes_.substr(at_, kPiece);
    at_ += p.size();
    return p;
  }
  Status Restart() override {
    at_ = 0;
    return Status::Ok();
  }

 private:
  std::string_view bytes_;
  size_t at_ = 0;
};

// SHA-256 over pieces.
class Sha256Stream {
 public:
  Sha256Stream() : ctx_(EVP_MD_CTX_new()) {
    if (ctx_ == nullptr || EVP_DigestInit_ex(ctx_, EVP_sha256(), nullptr) != 1) std::abort();
  }
  ~Sha256Stream() { EVP_MD_CTX_free(ctx_); }
  Sha256Stream(const Sha256Stream&) = delete;
  Sha256Stream& operator=(const Sha256Stream&) = delete;
  void Update(std::string_view b) {
    if (EVP_DigestUpdate(ctx_, b.data(), b.size()) != 1) std::abort();
  }
  std::string Digest() {
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int n = 0;
    if (EVP_DigestFinal_ex(ctx_, md, &n) != 1) std::abort();
    return std::string(reinterpret_cast<const char*>(md), n);
  }

 private:
  EVP_MD_CTX* ctx_;
};

// The source as a review reads it. On the first pass (and only then) every byte read is counted,
// hashed and streamed to clamd (when `account`); Restart finishes the first pass and reads
// again from the first byte without any of that. `prefix` is replayed first: the bytes read for
// type detection, before any extractor ran.
class Reader {
 public:
  Reader(ByteSource* source, bool account, ClamdStream* clamd) : source_(source), account_(account), clamd_(clamd) {}
  ~Reader() { crypto::Wipe(&prefix_); }

  // Reads ahead until `bytes` are buffered for detection (or the input ends); they are given
  // again by Next.
  Status Buffer(size_t bytes) {
    while (prefix_.size() < bytes) {
      OML_ASSIGN_OR_RETURN(std::string_view p, Read());
      if (p.empty()) break;
      prefix_.append(p);
    }
    return Status::Ok();
  }
  const std::string& prefix() const { return prefix_; }

  Result<std::string_view> Next() {
    if (!prefix_given_) {
      prefix_given_ = true;
      if (!prefix_.empty()) return std::string_view(prefix_);
    }
    return Read();
  }
  // Reads the rest of the first pass (for the count, the hash and clamd).
  Status Drain() {
    while (!first_done_) OML_RETURN_IF_ERROR(Read().status());
    return Status::Ok();
  }
  Status Restart() {
    if (account_) OML_RETURN_IF_ERROR(Drain());
    OML_RETURN_IF_ERROR(source_->Restart());
    crypto::Wipe(&prefix_);
    prefix_.clear();
    prefix_given_ = true;
    second_pass_ = true;
    return Status::Ok();
  }
  uint64_t count() const { return count_; }
  std::string Digest() { return sha_.Digest(); }
  // clamd's verdict once the first pass ended (Drain); nullopt without clamd.
  const std::optional<ScanResult>& verdict() const { return verdict_; }

 private:
  Result<std::string_view> Read() {
    OML_ASSIGN_OR_RETURN(std::string_view p, source_->Next());
    if (second_pass_) return p;
    if (first_done_) {
      if (!p.empty()) return Internal("the review's byte source gave bytes after its end");
      return p;
    }
    if (p.empty()) {
      first_done_ = true;
      // clamd has every byte: its verdict is read now, not after a second pass over the item
      // (clamd drops a stream that stays idle for its ReadTimeout).
      if (account_ && clamd_ != nullptr) verdict_ = clamd_->Finish();
      return p;
    }
    count_ += p.size();
    if (account_) {
      sha_.Update(p);
      // A failed send is clamd's answer to come (e.g. its size limit): Finish reports it.
      if (clamd_ != nullptr && clamd_ok_) clamd_ok_ = clamd_->Write(p).ok();
    }
    return p;
  }

  ByteSource* source_;
  bool account_;
  ClamdStream* clamd_;
  bool clamd_ok_ = true;
  std::optional<ScanResult> verdict_;
  std::string prefix_;
  bool prefix_given_ = false;
  bool first_done_ = false, second_pass_ = false;
  uint64_t count_ = 0;
  Sha256Stream sha_;
};

// JSON pieces from a Reader, UTF-8 as read; the first error ends them and is kept.
class RawPieces : public JsonPieces {
 public:
  explicit RawPieces(Reader* r) : r_(r) {}
  std::string_view Next() override {
    if (!error_.ok()) return {};
    Result<std::string_view> p = r_->Next();
    if (!p.ok()) {
      error_ = p.status();
      return {};
    }
    return *p;
  }
  Status error() const { return error_; }

 private:
  Reader* r_;
  Status error_;
};

// JSON pieces decoded to UTF-8 from another charset (nlohmann reads UTF-8 only) as they are read.
class DecodedPieces : public JsonPieces {
 public:
  DecodedPieces(Reader* r, std::string_view charset) : r_(r), utf8_(std::numeric_limits<size_t>::max()), dec_(charset, &utf8_) {}
  std::string_view Next() override {
    while (error_.ok() && !ended_) {
      Result<std::string_view> p = r_->Next();
      if (!p.ok()) {
        error_ = p.status();
        break;
      }
      if (p->empty()) {
        dec_.Finish();
        ended_ = true;
      } else {
        dec_.Feed(*p);
      }
      cur_ = utf8_.DrainKept();
      if (!cur_.empty()) return cur_;
    }
    return {};
  }
  Status error() const { return error_; }

 private:
  Reader* r_;
  TextSink utf8_;
  PlainTextDecoder dec_;
  std::string cur_;
  bool ended_ = false;
  Status error_;
};

// Plain text from `r` into `sink` until the input ends or nothing more is of use.
Status DecodePlain(Reader* r, std::string_view charset, TextSink* sink) {
  PlainTextDecoder dec(charset, sink);
  while (!sink->full()) {
    OML_ASSIGN_OR_RETURN(std::string_view p, r->Next());
    if (p.empty()) break;
    dec.Feed(p);
  }
  dec.Finish();
  return Status::Ok();
}

// Whether an item libmagic saw only a prefix of, and called text/plain, may be JSON: its first
// byte (after whitespace and a UTF-8 BOM) opens an object or an array. libmagic recognises JSON
// by parsing the buffer it is given, which a cut prefix fails.
bool MayBeLongJson(const Detected& d, std::string_view prefix, uint64_t size, size_t sniff) {
  if (size <= sniff || d.media_type != "text/plain" || (d.charset != "us-ascii" && d.charset != "utf-8")) return false;
  if (prefix.starts_with("\xEF\xBB\xBF")) prefix.remove_prefix(3);
  const size_t first = prefix.find_first_not_of(" \t\r\n");
  return first != std::string_view::npos && (prefix[first] == '{' || prefix[first] == '[');
}

// One review over `source`; `full` false: the text only (ExtractTextStream), with the extractor
// the review recorded (`recorded_method`, "" to decide as the review does).
Result<Review> Run(const Options& options, std::string_view declared_media_type, uint64_t size, ByteSource* source,
                   const std::string& tenant, bool full, std::string_view recorded_method = "") {
  Review r;
  r.size = size;
  r.declared_media_type = NormalizeMediaType(declared_media_type);

  std::optional<ClamdStream> clamd;
  std::optional<ScanResult> scan;  // decided before the stream: not configured, or unreachable
  if (!full || options.clamd_address.empty()) {
    scan = ScanResult{};
  } else {
    Result<ClamdStream> opened = ClamdStream::Open(options.clamd_address, options.clamd_timeout_ms);
    if (opened.ok()) {
      clamd.emplace(std::move(*opened));
    } else {
      scan = ScanResult{ScanResult::Outcome::kError, opened.status().message()};
    }
  }
  Reader reader(source, full, clamd ? &*clamd : nullptr);

  // libmagic is given the item's first bytes_max bytes, exactly (whatever the pieces): the most it
  // reads of any item, so detection does not depend on how the bytes arrive. Its JSON check
  // parses what it is given; a longer JSON item is recognised by MayBeLongJson.
  OML_ASSIGN_OR_RETURN(size_t sniff, MediaTypeBytesMax());
  sniff = std::max<size_t>(sniff, 1);
  OML_RETURN_IF_ERROR(reader.Buffer(sniff));
  const std::string_view head = std::string_view(reader.prefix()).substr(0, sniff);
  OML_ASSIGN_OR_RETURN(Detected detected, DetectMediaType(head));
  r.detected_media_type = detected.media_type;
  const Resolved resolved = Resolve(r.declared_media_type, r.detected_media_type);
  r.media_type = resolved.media_type;
  r.media_type_mismatch = resolved.mismatch;

  std::shared_ptr<const DenyList> deny = options.deny_list ? options.deny_list : DenyList::Builtin();
  std::unique_ptr<DenyScanner> scanner;
  std::unique_ptr<TextSink> sink;
  auto fresh = [&] {
    scanner = full ? std::make_unique<DenyScanner>(deny, options.max_hits) : nullptr;
    sink = std::make_unique<TextSink>(options.max_text_bytes, scanner.get());
  };
  fresh();

  // The detected type picks the extractor (never the declaration alone); the resolved type only
  // refines text (JSON).
  if (reader.prefix().empty()) {
    r.kind = ReviewKind::kTextExtraction;
    r.method = "empty";
  } else if (IsPdf(r.detected_media_type)) {
    PdfText pdf;
    if (options.pdf) {
      OML_ASSIGN_OR_RETURN(pdf, options.pdf->Extract([&] { return reader.Next(); }, size, sink.get(), tenant));
    } else if (size > static_cast<uint64_t>(INT_MAX)) {
      pdf.outcome = PdfOutcome::kTooLarge;
    } else {
      // In-process (tests and tools, not the server): poppler needs the file in one piece.
      std::string all;
      struct WipeOnExit {
        std::string* s;
        ~WipeOnExit() { crypto::Wipe(s); }
      } wipe{&all};
      for (;;) {
        OML_ASSIGN_OR_RETURN(std::string_view p, reader.Next());
        if (p.empty()) break;
        all.append(p);
      }
      pdf = ExtractPdf(all, sink.get());
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
    const bool json_candidate = recorded_method.empty()
                                    ? IsJson(r.media_type) || IsJson(r.declared_media_type) ||
                                          MayBeLongJson(detected, head, size, sniff)
                                    : recorded_method == "json";
    if (json_candidate) {
      // Declared or detected JSON; or text/plain that libmagic saw only a prefix of and that
      // opens like JSON: JSON if it parses, plain text ("text") otherwise.
      const bool declared_or_detected = IsJson(r.media_type) || IsJson(r.declared_media_type);
      // nlohmann reads UTF-8 only: other charsets are decoded as they are read.
      const bool utf8 = (detected.charset == "us-ascii" || detected.charset == "utf-8") &&
                        !reader.prefix().starts_with("\xEF\xBB\xBF");
      bool parsed;
      std::string not_json;  // why a document was not parsed to its end (a limit), if it was not
      if (utf8) {
        RawPieces pieces(&reader);
        parsed = ExtractJsonPieces(&pieces, sink.get(), &not_json);
        OML_RETURN_IF_ERROR(pieces.error());
      } else {
        DecodedPieces pieces(&reader, detected.charset);
        parsed = ExtractJsonPieces(&pieces, sink.get(), &not_json);
        OML_RETURN_IF_ERROR(pieces.error());
      }
      if (parsed) {
        r.method = "json";
      } else {
        // Reviewed again from the first byte as plain text, with a fresh text and deny-list.
        r.method = declared_or_detected || !recorded_method.empty() ? "json-invalid-as-text" : "text";
        if (!not_json.empty()) r.notes.push_back("reviewed as text: " + not_json);
        OML_RETURN_IF_ERROR(reader.Restart());
        fresh();
        OML_RETURN_IF_ERROR(DecodePlain(&reader, detected.charset, sink.get()));
      }
    } else {
      r.method = "text";
      OML_RETURN_IF_ERROR(DecodePlain(&reader, detected.charset, sink.get()));
    }
  } else {
    r.method = "binary";
  }
  sink->Finish();
  if (r.kind == ReviewKind::kTextExtraction) {
    r.text_kept_truncated = sink->truncated();
    r.text_truncated = sink->incomplete();
    r.text_bytes = sink->total_bytes();
    r.text = sink->Take();
    if (r.text_truncated) r.notes.push_back("text extraction stopped after " + std::to_string(r.text_bytes) + " bytes");
  }
  if (!full) return r;

  struct WipeText {  // until the review is returned: an error leaves no extracted text behind
    std::string* s;
    bool keep = false;
    ~WipeText() {
      if (!keep) crypto::Wipe(s);
    }
  } wipe_text{&r.text};
  OML_RETURN_IF_ERROR(reader.Drain());
  if (reader.count() != size)
    return Status(Code::kDataLoss,
                  "the item is " + std::to_string(reader.count()) + " bytes, not " + std::to_string(size), "integrity");
  r.sha256_hex = crypto::Hex(reader.Digest());
  // An opaque review has no text and no hits (a PDF child may have sent some text before it hit
  // a limit: that is not a review of the file).
  ScanHits hits = scanner->Finish();
  if (r.kind == ReviewKind::kTextExtraction) {
    r.hits = std::move(hits.hits);
    r.hits_truncated = hits.truncated;
  }
  r.scan = scan ? *scan : *reader.verdict();
  wipe_text.keep = true;
  return r;
}

}  // namespace

Result<Review> ReviewStream(const Options& options, std::string_view declared_media_type, uint64_t size,
                            ByteSource* source, const std::string& tenant) {
  return Run(options, declared_media_type, size, source, tenant, /*full=*/true);
}

Result<Review> ExtractTextStream(const Options& options, std::string_view declared_media_type, uint64_t size,
                                 ByteSource* source, std::string_view recorded_method, const std::string& tenant) {
  return Run(options, declared_media_type, size, source, tenant, /*full=*/false, recorded_method);
}

Result<Review> ReviewContent(const Options& options, std::string_view declared_media_type, std::string_view bytes,
                             const std::string& tenant) {
  StringSource source(bytes);
  return ReviewStream(options, declared_media_type, bytes.size(), &source, tenant);
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
      {"text_bytes", r.text_bytes},
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
