#include "review/extract.h"

#include <poppler-document.h>
#include <poppler-global.h>
#include <poppler-page.h>

#include <climits>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>

namespace oml::review {

namespace {
constexpr uint32_t kReplacement = 0xFFFD;
}  // namespace

void TextSink::AppendCodePoint(uint32_t cp) {
  if (truncated_) return;
  // CR LF -> LF, lone CR -> LF: a CR is written as LF at once, and an LF right after it is
  // dropped.
  if (cp == '\n' && last_was_cr_) {
    last_was_cr_ = false;
    return;
  }
  last_was_cr_ = cp == '\r';
  if (cp == '\r') cp = '\n';
  if (cp == 0 || (cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF) cp = kReplacement;
  char buf[4];
  size_t n;
  if (cp < 0x80) {
    buf[0] = static_cast<char>(cp);
    n = 1;
  } else if (cp < 0x800) {
    buf[0] = static_cast<char>(0xC0 | (cp >> 6));
    buf[1] = static_cast<char>(0x80 | (cp & 0x3F));
    n = 2;
  } else if (cp < 0x10000) {
    buf[0] = static_cast<char>(0xE0 | (cp >> 12));
    buf[1] = static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    buf[2] = static_cast<char>(0x80 | (cp & 0x3F));
    n = 3;
  } else {
    buf[0] = static_cast<char>(0xF0 | (cp >> 18));
    buf[1] = static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    buf[2] = static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    buf[3] = static_cast<char>(0x80 | (cp & 0x3F));
    n = 4;
  }
  // Invariant: out_ only ever grows by whole characters, so a cut is never inside one.
  if (out_.size() + n > max_bytes_) {
    truncated_ = true;
    return;
  }
  out_.append(buf, n);
}

void TextSink::AppendUtf8(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t len = s.size();
  size_t i = 0;
  while (i < len && !truncated_) {
    const unsigned char b = p[i];
    if (b < 0x80) {
      AppendCodePoint(b);
      ++i;
      continue;
    }
    // Well-formed sequences per RFC 3629 (no overlongs, no surrogates, at most U+10FFFF); any
    // other byte is replaced by U+FFFD on its own and decoding resumes at the next byte.
    size_t need;
    uint32_t cp;
    unsigned char lo = 0x80, hi = 0xBF;
    if (b >= 0xC2 && b <= 0xDF) {
      need = 1;
      cp = b & 0x1F;
    } else if (b >= 0xE0 && b <= 0xEF) {
      need = 2;
      cp = b & 0x0F;
      if (b == 0xE0) lo = 0xA0;
      if (b == 0xED) hi = 0x9F;
    } else if (b >= 0xF0 && b <= 0xF4) {
      need = 3;
      cp = b & 0x07;
      if (b == 0xF0) lo = 0x90;
      if (b == 0xF4) hi = 0x8F;
    } else {
      AppendCodePoint(kReplacement);
      ++i;
      continue;
    }
    bool ok = i + need < len;  // the continuation bytes p[i+1 .. i+need] exist
    if (ok) {
      for (size_t k = 1; k <= need; ++k) {
        const unsigned char c = p[i + k];
        const unsigned char l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
        if (c < l || c > h) {
          ok = false;
          break;
        }
        cp = (cp << 6) | (c & 0x3F);
      }
    }
    if (!ok) {
      AppendCodePoint(kReplacement);
      ++i;
      continue;
    }
    AppendCodePoint(cp);
    i += need + 1;
  }
}

void TextSink::AppendLatin1(std::string_view s) {
  for (char c : s) {
    if (truncated_) return;
    AppendCodePoint(static_cast<unsigned char>(c));
  }
}

void TextSink::AppendUtf16(std::string_view s, bool big_endian) {
  const size_t units = s.size() / 2;
  auto unit = [&](size_t k) -> uint32_t {
    const auto a = static_cast<unsigned char>(s[2 * k]), b = static_cast<unsigned char>(s[2 * k + 1]);
    return big_endian ? (uint32_t(a) << 8 | b) : (uint32_t(b) << 8 | a);
  };
  for (size_t k = 0; k < units && !truncated_; ++k) {
    const uint32_t u = unit(k);
    if (u >= 0xD800 && u <= 0xDBFF && k + 1 < units) {
      const uint32_t v = unit(k + 1);
      if (v >= 0xDC00 && v <= 0xDFFF) {
        AppendCodePoint(0x10000 + ((u - 0xD800) << 10) + (v - 0xDC00));
        ++k;
        continue;
      }
    }
    AppendCodePoint(u);  // a lone surrogate becomes U+FFFD there
  }
  if (s.size() % 2 != 0) AppendCodePoint(kReplacement);
}

void ExtractPlainText(std::string_view bytes, std::string_view charset, TextSink* sink) {
  if (bytes.starts_with("\xEF\xBB\xBF")) {
    sink->AppendUtf8(bytes.substr(3));
  } else if (bytes.starts_with("\xFF\xFE")) {
    sink->AppendUtf16(bytes.substr(2), /*big_endian=*/false);
  } else if (bytes.starts_with("\xFE\xFF")) {
    sink->AppendUtf16(bytes.substr(2), /*big_endian=*/true);
  } else if (charset == "utf-16le") {
    sink->AppendUtf16(bytes, false);
  } else if (charset == "utf-16be") {
    sink->AppendUtf16(bytes, true);
  } else if (charset == "iso-8859-1") {
    sink->AppendLatin1(bytes);
  } else {
    sink->AppendUtf8(bytes);
  }
}

namespace {

// Writes keys and string values to the sink as the parser meets them.
class JsonTextSax {
 public:
  using json = nlohmann::json;
  explicit JsonTextSax(TextSink* sink) : sink_(sink) {}

  bool null() { return true; }
  bool boolean(bool) { return true; }
  bool number_integer(json::number_integer_t) { return true; }
  bool number_unsigned(json::number_unsigned_t) { return true; }
  bool number_float(json::number_float_t, const json::string_t&) { return true; }
  bool string(json::string_t& s) { return Emit(s); }
  bool binary(json::binary_t&) { return true; }
  bool start_object(std::size_t) { return true; }
  bool key(json::string_t& s) { return Emit(s); }
  bool end_object() { return true; }
  bool start_array(std::size_t) { return true; }
  bool end_array() { return true; }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) {
    failed_ = true;
    return false;
  }

  bool failed() const { return failed_; }

 private:
  bool Emit(const std::string& s) {
    sink_->AppendUtf8(s);
    sink_->AppendCodePoint('\n');
    return !sink_->truncated();  // false stops the parser: nothing more fits
  }
  TextSink* sink_;
  bool failed_ = false;
};

}  // namespace

bool ExtractJson(std::string_view json_utf8, TextSink* sink) {
  JsonTextSax sax(sink);
  try {
    nlohmann::json::sax_parse(json_utf8.data(), json_utf8.data() + json_utf8.size(), &sax);
  } catch (const std::exception&) {
    return false;
  }
  return !sax.failed();
}

namespace {

std::mutex& PopplerMutex() {
  static std::mutex m;
  return m;
}

void DropPopplerMessage(const std::string&, void*) {}

}  // namespace

PdfText ExtractPdf(std::string_view bytes, TextSink* sink) {
  PdfText out;
  if (bytes.size() > static_cast<size_t>(INT_MAX)) {
    out.outcome = PdfOutcome::kTooLarge;
    return out;
  }
  std::lock_guard<std::mutex> lock(PopplerMutex());
  static std::once_flag silence;
  std::call_once(silence, [] { poppler::set_debug_error_function(&DropPopplerMessage, nullptr); });
  try {
    // poppler reads the buffer in place; it outlives the document (both end in this scope).
    std::unique_ptr<poppler::document> doc(
        poppler::document::load_from_raw_data(bytes.data(), static_cast<int>(bytes.size())));
    if (doc == nullptr) {
      out.outcome = PdfOutcome::kUnreadable;
      return out;
    }
    if (doc->is_locked()) {
      out.outcome = PdfOutcome::kEncrypted;
      return out;
    }
    out.pages = doc->pages();
    if (doc->has_embedded_files()) out.notes.push_back("embedded files not reviewed");
    const int n = std::min(out.pages, kMaxPdfPages);
    for (int i = 0; i < n && !sink->truncated(); ++i) {
      std::unique_ptr<poppler::page> page(doc->create_page(i));
      bool utf8_ends_with_ff = false;
      if (page == nullptr) {
        out.notes.push_back("page " + std::to_string(i + 1) + " unreadable");
      } else {
        const poppler::byte_array utf8 =
            page->text(poppler::rectf(), poppler::page::non_raw_non_physical_layout).to_utf8();
        sink->AppendUtf8(std::string_view(utf8.data(), utf8.size()));
        utf8_ends_with_ff = !utf8.empty() && utf8.back() == '\f';
      }
      // poppler ends a page's text with a form feed itself; a page without one gets one, so
      // pages stay apart whatever poppler does.
      if (!utf8_ends_with_ff) sink->AppendCodePoint('\f');
      if (!sink->truncated()) out.pages_extracted = i + 1;
    }
    if (out.pages > kMaxPdfPages) sink->MarkTruncated();
  } catch (const std::bad_alloc&) {
    throw;  // the memory limit, not an unreadable file: the sandboxed child names it (pdf_sandbox.h)
  } catch (const std::exception& e) {
    out = PdfText{};
    out.outcome = PdfOutcome::kUnreadable;
    out.notes.push_back(std::string("poppler: ") + e.what());
  }
  return out;
}

}  // namespace oml::review
