#include "review/extract.h"

#include <poppler-document.h>
#include <poppler-global.h>
#include <poppler-page.h>

#include <climits>
#include <cstdint>
#include <iterator>
#include <memory>
#include <mutex>
#include <new>
#include <nlohmann/json.hpp>

#include "crypto/crypto.h"

namespace oml::review {

namespace {
constexpr uint32_t kReplacement = 0xFFFD;
}  // namespace

namespace {
constexpr size_t kTapPiece = 64 * 1024;  // text handed to a tap in pieces of about this size
}  // namespace

TextSink::~TextSink() {
  crypto::Wipe(&out_);
  crypto::Wipe(&tap_buf_);
  crypto::Wipe(&partial_);
}

void TextSink::AppendCodePoint(uint32_t cp) {
  FlushPartial();
  Put(cp);
}

void TextSink::Put(uint32_t cp) {
  if (full()) return;
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
  total_ += n;
  if (tap_ != nullptr) {
    tap_buf_.append(buf, n);
    if (tap_buf_.size() >= kTapPiece) {
      tap_->Text(tap_buf_);
      tap_buf_.clear();
    }
  }
  // Invariant: out_ only ever grows by whole characters, so a cut is never inside one; once a
  // character did not fit, nothing more is kept (the kept text stays a prefix).
  if (truncated_) return;
  if (out_.size() + n > max_bytes_) {
    truncated_ = true;
    return;
  }
  out_.append(buf, n);
}

size_t TextSink::DecodeUtf8(const unsigned char* p, size_t len, bool final) {
  size_t i = 0;
  while (i < len && !full()) {
    const unsigned char b = p[i];
    if (b < 0x80) {
      Put(b);
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
      Put(kReplacement);
      ++i;
      continue;
    }
    bool ok = true;
    size_t k = 1;
    for (; k <= need && i + k < len; ++k) {
      const unsigned char c = p[i + k];
      const unsigned char l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
      if (c < l || c > h) {
        ok = false;
        break;
      }
      cp = (cp << 6) | (c & 0x3F);
    }
    if (ok && k <= need) {  // the input ends inside a character, well-formed so far
      if (!final) return i;
      ok = false;
    }
    if (!ok) {
      Put(kReplacement);
      ++i;
      continue;
    }
    Put(cp);
    i += need + 1;
  }
  return full() ? len : i;
}

size_t TextSink::DecodeUtf16(const unsigned char* p, size_t len, bool big_endian, bool final) {
  auto unit = [&](size_t at) -> uint32_t {
    return big_endian ? (uint32_t(p[at]) << 8 | p[at + 1]) : (uint32_t(p[at + 1]) << 8 | p[at]);
  };
  size_t i = 0;
  while (i + 2 <= len && !full()) {
    const uint32_t u = unit(i);
    if (u >= 0xD800 && u <= 0xDBFF) {
      if (i + 4 <= len) {
        const uint32_t v = unit(i + 2);
        if (v >= 0xDC00 && v <= 0xDFFF) {
          Put(0x10000 + ((u - 0xD800) << 10) + (v - 0xDC00));
          i += 4;
          continue;
        }
      } else if (!final) {
        return i;  // a high surrogate whose partner may come with the next piece
      }
    }
    Put(u);  // a lone surrogate becomes U+FFFD there
    i += 2;
  }
  if (full()) return len;
  if (i < len) {  // one odd byte
    if (!final) return i;
    Put(kReplacement);
  }
  return len;
}

void TextSink::AppendUtf8(std::string_view s) {
  if (partial_utf16_) FlushPartial();  // a held character of another encoding ends here
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  if (!partial_.empty()) {
    // Complete the held character with at most 3 more bytes (no character is longer), then go on
    // with the rest of s from where that decode stopped.
    const size_t held = partial_.size();
    std::string joined = partial_;
    joined.append(s.substr(0, std::min<size_t>(3, s.size())));
    partial_.clear();
    const size_t used = DecodeUtf8(reinterpret_cast<const unsigned char*>(joined.data()), joined.size(), false);
    if (used < held) {  // still incomplete: all of s went into it
      partial_ = joined.substr(used);
      return;
    }
    p += used - held;
    s.remove_prefix(used - held);
  }
  const size_t used = DecodeUtf8(p, s.size(), false);
  if (used < s.size()) {
    partial_.assign(s.substr(used));
    partial_utf16_ = false;
  }
}

void TextSink::AppendLatin1(std::string_view s) {
  FlushPartial();
  for (char c : s) {
    if (full()) return;
    Put(static_cast<unsigned char>(c));
  }
}

void TextSink::AppendUtf16(std::string_view s, bool big_endian) {
  if (!partial_utf16_ || partial_big_endian_ != big_endian) FlushPartial();
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  if (!partial_.empty()) {
    const size_t held = partial_.size();  // at most 3: a high surrogate and one odd byte
    std::string joined = partial_;
    joined.append(s.substr(0, std::min<size_t>(4, s.size())));
    partial_.clear();
    const size_t used =
        DecodeUtf16(reinterpret_cast<const unsigned char*>(joined.data()), joined.size(), big_endian, false);
    if (used < held) {
      partial_ = joined.substr(used);
      return;
    }
    p += used - held;
    s.remove_prefix(used - held);
  }
  const size_t used = DecodeUtf16(p, s.size(), big_endian, false);
  if (used < s.size()) {
    partial_.assign(s.substr(used));
    partial_utf16_ = true;
    partial_big_endian_ = big_endian;
  }
}

void TextSink::FlushPartial() {
  if (partial_.empty()) return;
  std::string held;
  held.swap(partial_);
  const auto* p = reinterpret_cast<const unsigned char*>(held.data());
  if (partial_utf16_) {
    DecodeUtf16(p, held.size(), partial_big_endian_, true);
  } else {
    DecodeUtf8(p, held.size(), true);
  }
  crypto::Wipe(&held);
}

void TextSink::Finish() {
  FlushPartial();
  if (tap_ != nullptr && !tap_buf_.empty()) {
    tap_->Text(tap_buf_);
    tap_buf_.clear();
  }
}

void PlainTextDecoder::Decode(std::string_view bytes) {
  switch (mode_) {
    case Mode::kUtf16Le: sink_->AppendUtf16(bytes, false); break;
    case Mode::kUtf16Be: sink_->AppendUtf16(bytes, true); break;
    case Mode::kLatin1: sink_->AppendLatin1(bytes); break;
    default: sink_->AppendUtf8(bytes); break;
  }
}

void PlainTextDecoder::Settle() {
  std::string head;
  head.swap(head_);
  std::string_view h(head);
  // A UTF-8 BOM is 3 bytes: with fewer (only at the end of the input) it cannot be one.
  if (h.starts_with("\xEF\xBB\xBF")) {
    mode_ = Mode::kUtf8;
    h.remove_prefix(3);
  } else if (h.starts_with("\xFF\xFE")) {
    mode_ = Mode::kUtf16Le;
    h.remove_prefix(2);
  } else if (h.starts_with("\xFE\xFF")) {
    mode_ = Mode::kUtf16Be;
    h.remove_prefix(2);
  } else if (charset_ == "utf-16le") {
    mode_ = Mode::kUtf16Le;
  } else if (charset_ == "utf-16be") {
    mode_ = Mode::kUtf16Be;
  } else if (charset_ == "iso-8859-1") {
    mode_ = Mode::kLatin1;
  } else {
    mode_ = Mode::kUtf8;
  }
  Decode(h);
}

void PlainTextDecoder::Feed(std::string_view bytes) {
  if (mode_ != Mode::kUndecided) return Decode(bytes);
  // The BOM question needs the first 3 bytes (or the end of the input: Finish); only those are
  // held here, the rest of the piece is decoded in place.
  const size_t take = std::min(bytes.size(), 3 - head_.size());
  head_.append(bytes.substr(0, take));
  if (head_.size() < 3) return;
  Settle();
  Decode(bytes.substr(take));
}

void PlainTextDecoder::Finish() {
  if (mode_ == Mode::kUndecided) Settle();
  sink_->Finish();
}

void ExtractPlainText(std::string_view bytes, std::string_view charset, TextSink* sink) {
  PlainTextDecoder d(charset, sink);
  d.Feed(bytes);
  d.Finish();
}

namespace {

// Writes keys and string values to the sink as the parser meets them.
class JsonTextSax {
 public:
  using json = nlohmann::json;
  // `since_event` (may be null): the input bytes read since the parser's last event, reset at
  // each event (PieceIterator counts them); `max_depth`: nesting beyond it stops the parse.
  JsonTextSax(TextSink* sink, uint64_t* since_event = nullptr, size_t max_depth = SIZE_MAX)
      : sink_(sink), since_(since_event), max_depth_(max_depth) {}

  bool null() { return Event(); }
  bool boolean(bool) { return Event(); }
  bool number_integer(json::number_integer_t) { return Event(); }
  bool number_unsigned(json::number_unsigned_t) { return Event(); }
  bool number_float(json::number_float_t, const json::string_t&) { return Event(); }
  bool string(json::string_t& s) { return Event() && Emit(s); }
  bool binary(json::binary_t&) { return Event(); }
  bool start_object(std::size_t) { return Event() && Deeper(); }
  bool key(json::string_t& s) { return Event() && Emit(s); }
  bool end_object() { return Event() && Shallower(); }
  bool start_array(std::size_t) { return Event() && Deeper(); }
  bool end_array() { return Event() && Shallower(); }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) {
    failed_ = true;
    return false;
  }

  bool failed() const { return failed_; }
  bool too_deep() const { return too_deep_; }

 private:
  bool Event() {
    if (since_ != nullptr) *since_ = 0;
    return true;
  }
  bool Deeper() {
    if (++depth_ <= max_depth_) return true;
    too_deep_ = true;
    return false;
  }
  bool Shallower() {
    --depth_;
    return true;
  }
  bool Emit(const std::string& s) {
    sink_->AppendUtf8(s);
    sink_->AppendCodePoint('\n');
    return !sink_->full();  // false stops the parser: nothing more is of use
  }
  TextSink* sink_;
  uint64_t* since_;
  size_t max_depth_;
  size_t depth_ = 0;
  bool failed_ = false;
  bool too_deep_ = false;
};

// An input iterator over JsonPieces, for nlohmann's iterator input adapter: it reads a byte at a
// time and asks for the next piece only when the current one is used up. Equal to the end
// iterator (null state) once the pieces are exhausted, or once more than max_token bytes were
// read without a parser event (the lexer holds a token whole, twice: the input ends there, which
// the parser reports as an error, and `over` says why).
class PieceIterator {
 public:
  using iterator_category = std::input_iterator_tag;
  using value_type = char;
  using difference_type = std::ptrdiff_t;
  using pointer = const char*;
  using reference = const char&;

  struct State {
    JsonPieces* pieces;
    uint64_t max_token;
    std::string_view cur;
    bool done = false;
    bool over = false;
    uint64_t since_event = 0;
    // Makes cur non-empty unless the input is exhausted (or cut).
    bool Fill() {
      while (cur.empty() && !done) {
        cur = pieces->Next();
        if (cur.empty()) done = true;
      }
      return !cur.empty();
    }
  };
  PieceIterator() = default;
  explicit PieceIterator(State* s) : s_(s) {}
  reference operator*() const {
    s_->Fill();
    return s_->cur.front();
  }
  PieceIterator& operator++() {
    s_->Fill();
    s_->cur.remove_prefix(1);
    if (++s_->since_event > s_->max_token) {
      s_->over = true;
      s_->done = true;
      s_->cur = {};
    }
    return *this;
  }
  bool operator==(const PieceIterator& o) const { return AtEnd() == o.AtEnd(); }
  bool operator!=(const PieceIterator& o) const { return !(*this == o); }

 private:
  bool AtEnd() const { return s_ == nullptr || !s_->Fill(); }
  State* s_ = nullptr;
};

}  // namespace

bool ExtractJson(std::string_view json_utf8, TextSink* sink) {
  JsonTextSax sax(sink);
  try {
    nlohmann::json::sax_parse(json_utf8.data(), json_utf8.data() + json_utf8.size(), &sax);
  } catch (const std::exception&) {
    return false;
  }
  sink->Finish();
  return !sax.failed();
}

bool ExtractJsonPieces(JsonPieces* pieces, TextSink* sink, std::string* not_json) {
  PieceIterator::State state{pieces, kMaxJsonTokenBytes, {}};
  JsonTextSax sax(sink, &state.since_event, kMaxJsonDepth);
  try {
    nlohmann::json::sax_parse(PieceIterator(&state), PieceIterator(), &sax);
  } catch (const std::bad_alloc&) {
    throw;  // out of memory is not a property of the document
  } catch (const std::exception&) {
    return false;
  }
  if (state.over || sax.too_deep()) {
    if (not_json != nullptr)
      *not_json = state.over ? "a JSON token longer than " + std::to_string(kMaxJsonTokenBytes) + " bytes"
                             : "JSON nested deeper than " + std::to_string(kMaxJsonDepth) + " levels";
    return false;
  }
  sink->Finish();
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
    for (int i = 0; i < n && !sink->full(); ++i) {
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
      if (!sink->full()) out.pages_extracted = i + 1;
    }
    if (out.pages > kMaxPdfPages) sink->MarkIncomplete();
    sink->Finish();
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
