// ObjectStore over the C ABI of rust/oml-storage (object_store crate). See object_store.h.
#include "blob/object_store.h"
#include "blob/storage_status.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <utility>

#include "oml_storage.h"

namespace oml::blob {

Status FromStorageError(int32_t rc, OmlStorageError& err, const std::string& what) {
  std::string msg = what;
  if (err.message != nullptr) {
    msg += ": ";
    msg += err.message;
    oml_storage_free_string(err.message);
    err.message = nullptr;
  }
  switch (rc) {
    case OML_STORAGE_INVALID_ARGUMENT:
      return InvalidArgument(std::move(msg));
    case OML_STORAGE_NOT_FOUND:
      return NotFound(std::move(msg));
    case OML_STORAGE_ALREADY_EXISTS:
      return Status(Code::kAborted, std::move(msg));
    case OML_STORAGE_CONFLICT:
      // A Delta commit lost its race: the lake writer refreshes and re-checks its txn.
      return Status(Code::kAborted, std::move(msg), "lake-commit-conflict");
    case OML_STORAGE_PERMISSION_DENIED:
      // Storage credentials are operator configuration, not the caller's role.
      return Unavailable(std::move(msg), "storage-permission");
    case OML_STORAGE_UNAVAILABLE:
      return Unavailable(std::move(msg));
    default:
      return Internal(std::move(msg));
  }
}

namespace {

class RustObjectStore final : public ObjectStore {
 public:
  RustObjectStore(OmlStorageStore* handle, std::string url)
      : handle_(handle), url_(std::move(url)) {}
  ~RustObjectStore() override { oml_storage_store_close(handle_); }
  RustObjectStore(const RustObjectStore&) = delete;
  RustObjectStore& operator=(const RustObjectStore&) = delete;

  Status Put(const std::string& key, const std::string& bytes) override {
    OmlStorageError err{};
    int32_t rc = oml_storage_store_put(handle_, key.c_str(),
                                       reinterpret_cast<const uint8_t*>(bytes.data()),
                                       bytes.size(), &err);
    if (rc != OML_STORAGE_OK) return FromStorageError(rc, err, "put " + Describe(key));
    return Status::Ok();
  }

  Result<std::optional<std::string>> Get(const std::string& key) override {
    OmlStorageError err{};
    OmlStorageBuffer buf{};
    int32_t rc = oml_storage_store_get(handle_, key.c_str(), &buf, &err);
    if (rc == OML_STORAGE_NOT_FOUND) {
      oml_storage_free_string(err.message);
      return std::optional<std::string>();
    }
    if (rc != OML_STORAGE_OK) return FromStorageError(rc, err, "get " + Describe(key));
    std::string out(reinterpret_cast<const char*>(buf.data), buf.len);
    oml_storage_free_buffer(&buf);
    return std::optional<std::string>(std::move(out));
  }

  Result<std::vector<std::string>> List(const std::string& prefix) override {
    OmlStorageError err{};
    char* json = nullptr;
    int32_t rc = oml_storage_store_list(handle_, prefix.c_str(), &json, &err);
    if (rc != OML_STORAGE_OK) return FromStorageError(rc, err, "list " + Describe(prefix));
    std::string text = json != nullptr ? json : "[]";
    oml_storage_free_string(json);
    auto parsed = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (!parsed.is_array()) return Internal("list " + Describe(prefix) + ": malformed key list");
    std::vector<std::string> keys;
    keys.reserve(parsed.size());
    for (const auto& k : parsed) {
      if (!k.is_string()) return Internal("list " + Describe(prefix) + ": malformed key list");
      keys.push_back(k.get<std::string>());
    }
    return keys;  // sorted by the adapter
  }

  Status Delete(const std::string& key) override {
    OmlStorageError err{};
    int32_t rc = oml_storage_store_delete(handle_, key.c_str(), &err);
    if (rc != OML_STORAGE_OK) return FromStorageError(rc, err, "delete " + Describe(key));
    return Status::Ok();
  }

 private:
  std::string Describe(const std::string& key) const { return "'" + key + "' in " + url_; }

  OmlStorageStore* handle_;
  std::string url_;
};

}  // namespace

Result<std::unique_ptr<ObjectStore>> OpenObjectStore(const std::string& url) {
  OmlStorageError err{};
  OmlStorageStore* handle = nullptr;
  int32_t rc = oml_storage_store_open(url.c_str(), &handle, &err);
  if (rc != OML_STORAGE_OK) return FromStorageError(rc, err, "open object store " + url);
  return std::unique_ptr<ObjectStore>(new RustObjectStore(handle, url));
}

}  // namespace oml::blob
