#include "journal/canonical_json.h"

#include "common/json_escape.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <string_view>
#include <vector>

namespace oml::journal {
namespace {

using nlohmann::json;

// 2^53: every integer of at most this magnitude is exactly one IEEE double.
constexpr uint64_t kMaxExactInteger = uint64_t{1} << 53;

Status IntegerTooLarge(const std::string& text) { return InvalidArgument("integer " + text + " exceeds 2^53"); }

Status TooDeep() {
  return InvalidArgument("JSON nests deeper than " + std::to_string(kMaxCanonicalDepth) + " levels");
}

// Decodes the UTF-8 sequence at s[i] and advances i past it. Returns -1 (i unchanged) for anything
// that is not a shortest-form encoding of a Unicode scalar value (overlong forms, encoded
// surrogates U+D800..U+DFFF, code points above U+10FFFF, stray or missing continuation bytes).
int32_t DecodeUtf8(std::string_view s, size_t& i) {
  const auto c = static_cast<unsigned char>(s[i]);
  if (c < 0x80) {
    ++i;
    return c;
  }
  size_t len;
  uint32_t cp, min;
  if ((c & 0xE0) == 0xC0) {
    len = 2, cp = c & 0x1F, min = 0x80;
  } else if ((c & 0xF0) == 0xE0) {
    len = 3, cp = c & 0x0F, min = 0x800;
  } else if ((c & 0xF8) == 0xF0) {
    len = 4, cp = c & 0x07, min = 0x10000;
  } else {
    return -1;
  }
  if (s.size() - i < len) return -1;
  for (size_t k = 1; k < len; ++k) {
    const auto cc = static_cast<unsigned char>(s[i + k]);
    if ((cc & 0xC0) != 0x80) return -1;
    cp = (cp << 6) | (cc & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return -1;
  i += len;
  return static_cast<int32_t>(cp);
}

Status NotUtf8(size_t at) { return InvalidArgument("string is not valid UTF-8 at byte " + std::to_string(at)); }

// RFC 8785 §3.2.2.2 (ECMAScript JSON.stringify's QuoteJSONString on well-formed text).
Status AppendString(std::string_view s, std::string& out) {
  out.push_back('"');
  size_t i = 0;
  while (i < s.size()) {
    const size_t start = i;
    const int32_t cp = DecodeUtf8(s, i);
    if (cp < 0) return NotUtf8(start);
    AppendJsonEscaped(s.substr(start, i - start), &out);  // a multi-byte character passes as is
  }
  out.push_back('"');
  return Status::Ok();
}

// The sort key of RFC 8785 §3.2.3: the name as UTF-16 code units (char16_t compares unsigned).
Result<std::u16string> Utf16(std::string_view s) {
  std::u16string u;
  u.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const size_t start = i;
    int32_t cp = DecodeUtf8(s, i);
    if (cp < 0) return NotUtf8(start);
    if (cp < 0x10000) {
      u.push_back(static_cast<char16_t>(cp));
    } else {
      cp -= 0x10000;
      u.push_back(static_cast<char16_t>(0xD800 + (cp >> 10)));
      u.push_back(static_cast<char16_t>(0xDC00 + (cp & 0x3FF)));
    }
  }
  return u;
}

// RFC 8785 §3.2.2.3: ECMAScript Number::toString(d) (ECMA-262 Number.prototype.toString, radix 10).
Status AppendDouble(double d, std::string& out) {
  if (std::isnan(d)) return InvalidArgument("NaN is not a JSON number");
  if (std::isinf(d)) return InvalidArgument("Infinity is not a JSON number");
  if (d == 0) {  // +0 and -0
    out.push_back('0');
    return Status::Ok();
  }
  if (d < 0) {
    out.push_back('-');
    d = -d;
  }
  // Shortest round-trip digits s (k of them) and exponent: d = s * 10^(n-k), as ECMAScript defines n
  // and k. to_chars writes "D[.DDD]e(+|-)XX" with no trailing zeros in the digits.
  char buf[64];
  const auto [end, ec] = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  if (ec != std::errc()) return Internal("to_chars failed for a double");
  const std::string_view sci(buf, static_cast<size_t>(end - buf));
  const size_t e = sci.find('e');
  std::string digits(1, sci[0]);
  if (e > 1) digits.append(sci.substr(2, e - 2));
  int exp10 = 0;
  std::from_chars(sci.data() + e + 2, sci.data() + sci.size(), exp10);
  if (sci[e + 1] == '-') exp10 = -exp10;
  const int k = static_cast<int>(digits.size());
  const int n = exp10 + 1;
  if (k <= n && n <= 21) {  // integer: the digits, then n-k zeros
    out += digits;
    out.append(static_cast<size_t>(n - k), '0');
  } else if (0 < n && n <= 21) {  // n digits, ".", the rest
    out.append(digits, 0, static_cast<size_t>(n));
    out.push_back('.');
    out.append(digits, static_cast<size_t>(n));
  } else if (-6 < n && n <= 0) {  // "0.", -n zeros, the digits
    out += "0.";
    out.append(static_cast<size_t>(-n), '0');
    out += digits;
  } else {  // exponential: D[.DDD]e+X / e-X
    out.push_back(digits[0]);
    if (k > 1) {
      out.push_back('.');
      out.append(digits, 1);
    }
    out += n - 1 < 0 ? "e-" : "e+";
    out += std::to_string(std::abs(n - 1));
  }
  return Status::Ok();
}

class Serializer {
 public:
  explicit Serializer(bool allow_floats) : allow_floats_(allow_floats) {}

  // depth = the number of arrays/objects enclosing v. Recursion is bounded by kMaxCanonicalDepth.
  Status Append(const json& v, int depth) {
    switch (v.type()) {
      case json::value_t::null: out_ += "null"; return Status::Ok();
      case json::value_t::boolean: out_ += v.get<bool>() ? "true" : "false"; return Status::Ok();
      case json::value_t::number_integer: {
        const auto i = v.get<int64_t>();
        const uint64_t magnitude = i < 0 ? uint64_t{0} - static_cast<uint64_t>(i) : static_cast<uint64_t>(i);
        if (magnitude > kMaxExactInteger) return IntegerTooLarge(std::to_string(i));
        out_ += std::to_string(i);
        return Status::Ok();
      }
      case json::value_t::number_unsigned: {
        const auto u = v.get<uint64_t>();
        if (u > kMaxExactInteger) return IntegerTooLarge(std::to_string(u));
        out_ += std::to_string(u);
        return Status::Ok();
      }
      case json::value_t::number_float:
        if (!allow_floats_) return InvalidArgument("floating-point numbers are not allowed in signed JSON");
        return AppendDouble(v.get<double>(), out_);
      case json::value_t::string: return AppendString(v.get_ref<const std::string&>(), out_);
      case json::value_t::array: {
        if (depth >= kMaxCanonicalDepth) return TooDeep();
        out_.push_back('[');
        bool first = true;
        for (const auto& e : v) {
          if (!first) out_.push_back(',');
          first = false;
          OML_RETURN_IF_ERROR(Append(e, depth + 1));
        }
        out_.push_back(']');
        return Status::Ok();
      }
      case json::value_t::object: {
        if (depth >= kMaxCanonicalDepth) return TooDeep();
        struct Member {
          std::u16string order;
          const std::string* name;
          const json* value;
        };
        std::vector<Member> members;
        members.reserve(v.size());
        for (auto it = v.begin(); it != v.end(); ++it) {
          OML_ASSIGN_OR_RETURN(std::u16string order, Utf16(it.key()));
          members.push_back({std::move(order), &it.key(), &it.value()});
        }
        // Names are unique (std::map keys), so the order is total and stable_sort is not needed.
        std::sort(members.begin(), members.end(), [](const Member& a, const Member& b) { return a.order < b.order; });
        out_.push_back('{');
        for (size_t i = 0; i < members.size(); ++i) {
          if (i > 0) out_.push_back(',');
          OML_RETURN_IF_ERROR(AppendString(*members[i].name, out_));
          out_.push_back(':');
          OML_RETURN_IF_ERROR(Append(*members[i].value, depth + 1));
        }
        out_.push_back('}');
        return Status::Ok();
      }
      case json::value_t::binary:
        return InvalidArgument(allow_floats_ ? "binary values are not JSON"
                                             : "binary values are not allowed in signed JSON");
      case json::value_t::discarded:
      default: return InvalidArgument("discarded value is not JSON");
    }
  }

  std::string Take() { return std::move(out_); }

 private:
  const bool allow_floats_;
  std::string out_;
};

Result<std::string> Serialize(const json& v, bool allow_floats) {
  Serializer s(allow_floats);
  OML_RETURN_IF_ERROR(s.Append(v, 0));
  return s.Take();
}

// Builds the DOM like nlohmann's own SAX DOM parser (an explicit stack, no recursion) and applies
// the I-JSON checks that a plain parse cannot: duplicate names and the literal text of integers.
class Rfc8785InputBuilder : public nlohmann::json_sax<json> {
 public:
  bool null() override { return Put(json(nullptr)) != nullptr; }
  bool boolean(bool b) override { return Put(json(b)) != nullptr; }
  bool number_integer(number_integer_t i) override {
    const uint64_t magnitude = i < 0 ? uint64_t{0} - static_cast<uint64_t>(i) : static_cast<uint64_t>(i);
    if (magnitude > kMaxExactInteger) return Fail(IntegerTooLarge(std::to_string(i)));
    return Put(json(i)) != nullptr;
  }
  bool number_unsigned(number_unsigned_t u) override {
    if (u > kMaxExactInteger) return Fail(IntegerTooLarge(std::to_string(u)));
    return Put(json(u)) != nullptr;
  }
  bool number_float(number_float_t d, const string_t& literal) override {
    // An integer literal too large for 64 bits arrives here as a (rounded) double.
    if (literal.find_first_of(".eE") == string_t::npos) return Fail(IntegerTooLarge(literal));
    return Put(json(d)) != nullptr;
  }
  bool string(string_t& s) override { return Put(json(std::move(s))) != nullptr; }
  bool binary(binary_t&) override { return Fail(InvalidArgument("binary values are not JSON")); }
  bool start_object(std::size_t) override { return Open(json::object()); }
  bool key(string_t& k) override {
    if (stack_.back()->contains(k)) {
      std::string quoted;
      if (!AppendString(k, quoted).ok()) quoted = "(not UTF-8)";
      return Fail(InvalidArgument("duplicate member name " + quoted));
    }
    key_ = std::move(k);
    return true;
  }
  bool end_object() override {
    stack_.pop_back();
    return true;
  }
  bool start_array(std::size_t) override { return Open(json::array()); }
  bool end_array() override {
    stack_.pop_back();
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& ex) override {
    return Fail(InvalidArgument(std::string("not JSON: ") + ex.what()));
  }

  Result<json> Finish(bool parsed) {
    if (!status_.ok()) return status_;
    if (!parsed) return InvalidArgument("not JSON");
    return std::move(root_);
  }

 private:
  json* Put(json v) {
    if (stack_.empty()) {
      root_ = std::move(v);
      return &root_;
    }
    json& parent = *stack_.back();
    if (parent.is_array()) {
      parent.push_back(std::move(v));
      return &parent.back();
    }
    json& slot = parent[key_];
    slot = std::move(v);
    return &slot;
  }
  bool Open(json container) {
    if (stack_.size() >= static_cast<size_t>(kMaxCanonicalDepth)) return Fail(TooDeep());
    stack_.push_back(Put(std::move(container)));
    return true;
  }
  bool Fail(Status s) {
    if (status_.ok()) status_ = std::move(s);
    return false;
  }

  json root_;
  std::vector<json*> stack_;
  string_t key_;
  Status status_;
};

}  // namespace

Result<std::string> CanonicalizeRfc8785(const nlohmann::json& v) { return Serialize(v, /*allow_floats=*/true); }

Result<std::string> Canonicalize(const nlohmann::json& v) { return Serialize(v, /*allow_floats=*/false); }

Result<nlohmann::json> ParseCanonical(const std::string& bytes) {
  nlohmann::json v = nlohmann::json::parse(bytes, nullptr, /*allow_exceptions=*/false);
  if (v.is_discarded()) return DataLoss("signed bytes are not valid JSON");
  auto again = Canonicalize(v);
  if (!again.ok() || *again != bytes) return DataLoss("signed bytes are not canonical JSON");
  return v;
}

Result<nlohmann::json> ParseRfc8785Input(const std::string& text) {
  Rfc8785InputBuilder builder;
  bool parsed = false;
  try {
    parsed = nlohmann::json::sax_parse(text, &builder);
  } catch (const nlohmann::json::exception& e) {
    return InvalidArgument(std::string("not JSON: ") + e.what());
  }
  return builder.Finish(parsed);
}

}  // namespace oml::journal
