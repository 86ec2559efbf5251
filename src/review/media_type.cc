#include "review/media_type.h"

#include <magic.h>

#include <cctype>

namespace oml::review {
namespace {

// One libmagic handle per thread, opened on first use and closed at thread exit.
class MagicHandle {
 public:
  MagicHandle() = default;
  ~MagicHandle() {
    if (m_ != nullptr) magic_close(m_);
  }
  MagicHandle(const MagicHandle&) = delete;
  MagicHandle& operator=(const MagicHandle&) = delete;

  Result<magic_t> Get() {
    if (m_ != nullptr) return m_;
    magic_t m = magic_open(MAGIC_MIME_TYPE | MAGIC_MIME_ENCODING | MAGIC_ERROR);
    if (m == nullptr) return Internal("libmagic: magic_open failed");
    if (magic_load(m, nullptr) != 0) {
      std::string why = magic_error(m) ? magic_error(m) : "unknown error";
      magic_close(m);
      return Internal("libmagic: cannot load the magic database (is libmagic-mgc installed?): " + why);
    }
    m_ = m;
    return m_;
  }

 private:
  magic_t m_ = nullptr;
};

bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

MagicHandle& ThreadHandle() {
  thread_local MagicHandle handle;
  return handle;
}

}  // namespace

Result<size_t> MediaTypeBytesMax() {
  OML_ASSIGN_OR_RETURN(magic_t m, ThreadHandle().Get());
  size_t v = 0;
  if (magic_getparam(m, MAGIC_PARAM_BYTES_MAX, &v) != 0) return Internal("libmagic: cannot read bytes_max");
  return v;
}

Result<Detected> DetectMediaType(std::string_view bytes) {
  OML_ASSIGN_OR_RETURN(magic_t m, ThreadHandle().Get());
  const char* answer = magic_buffer(m, bytes.data(), bytes.size());
  if (answer == nullptr) {
    std::string why = magic_error(m) ? magic_error(m) : "unknown error";
    return Internal("libmagic: magic_buffer failed: " + why);
  }
  // "type/subtype; charset=xyz"
  std::string_view a(answer);
  Detected d;
  auto semi = a.find(';');
  d.media_type = NormalizeMediaType(a.substr(0, semi));
  if (semi != std::string_view::npos) {
    auto cs = a.find("charset=", semi);
    if (cs != std::string_view::npos) d.charset = std::string(a.substr(cs + 8));
  }
  return d;
}

std::string NormalizeMediaType(std::string_view media_type) {
  std::string_view t = media_type.substr(0, media_type.find(';'));
  while (!t.empty() && std::isspace(static_cast<unsigned char>(t.front()))) t.remove_prefix(1);
  while (!t.empty() && std::isspace(static_cast<unsigned char>(t.back()))) t.remove_suffix(1);
  std::string out(t);
  for (auto& ch : out) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  static const std::pair<std::string_view, std::string_view> kAliases[] = {
      {"image/jpg", "image/jpeg"},
      {"image/pjpeg", "image/jpeg"},
      {"application/x-pdf", "application/pdf"},
      {"text/x-markdown", "text/markdown"},
      {"application/x-zip-compressed", "application/zip"},
      {"text/json", "application/json"},
  };
  for (const auto& [alias, name] : kAliases)
    if (out == alias) return std::string(name);
  return out;
}

bool IsEmptyType(std::string_view t) { return t == "application/x-empty" || t == "inode/x-empty"; }

bool IsJson(std::string_view t) {
  return t == "application/json" || (t.starts_with("application/") && EndsWith(t, "+json"));
}

bool IsPdf(std::string_view t) { return t == "application/pdf"; }

bool IsTextFamily(std::string_view t) {
  return t.starts_with("text/") || IsJson(t) || t == "application/xml" || EndsWith(t, "+xml") ||
         t == "application/x-ndjson" || t == "application/javascript" || IsEmptyType(t);
}

Resolved Resolve(std::string_view declared, std::string_view detected) {
  if (declared.empty() || declared == "application/octet-stream") return {std::string(detected), false};
  if (IsTextFamily(declared) && IsTextFamily(detected)) {
    const bool generic = detected == "text/plain" || IsEmptyType(detected);
    return {std::string(generic ? declared : detected), false};
  }
  return {std::string(detected), declared != detected};
}

}  // namespace oml::review
