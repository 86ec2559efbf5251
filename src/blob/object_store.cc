// ObjectStore over the C ABI of rust/oml-storage (object_store crate). See object_store.h.
#include "blob/object_store.h"
#include "blob/storage_status.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <string_view>
#include <utility>

#include "common/log.h"
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
    case OML_STORAGE_STALE_REWRITE:
      // An OPTIMIZE would have landed over another rewrite of its files: run it again.
      return Status(Code::kAborted, std::move(msg), "lake-rewrite-stale");
    case OML_STORAGE_DAMAGED_COMMIT:
      // A commit file of a Delta log is empty or not JSON: never read as an empty version.
      return Status(Code::kDataLoss, std::move(msg), "lake-commit-damaged");
    case OML_STORAGE_DAMAGED_FILE:
      // A data file a snapshot names is not Parquet of the table's columns.
      return Status(Code::kDataLoss, std::move(msg), "lake-file-damaged");
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

// Invariant: handle_ is non-null until destruction; state_ mirrors the adapter's writer state,
// so misuse is answered here with kFailedPrecondition before reaching the adapter.
class RustObjectWriter final : public ObjectWriter {
 public:
  RustObjectWriter(OmlStorageWriter* handle, std::string what)
      : handle_(handle), what_(std::move(what)) {}
  ~RustObjectWriter() override { oml_storage_writer_close(handle_); }  // aborts if still open
  RustObjectWriter(const RustObjectWriter&) = delete;
  RustObjectWriter& operator=(const RustObjectWriter&) = delete;

  Status Write(std::string_view bytes) override {
    OML_RETURN_IF_ERROR(RequireOpen("write"));
    OmlStorageError err{};
    int32_t rc = oml_storage_writer_write(handle_, reinterpret_cast<const uint8_t*>(bytes.data()),
                                          bytes.size(), &err);
    if (rc != OML_STORAGE_OK) {
      state_ = State::kFailed;
      return FromStorageError(rc, err, "write " + what_);
    }
    return Status::Ok();
  }

  Status Finish() override {
    OML_RETURN_IF_ERROR(RequireOpen("finish"));
    OmlStorageError err{};
    int32_t rc = oml_storage_writer_finish(handle_, &err);
    if (rc != OML_STORAGE_OK) {
      state_ = State::kFailed;
      return FromStorageError(rc, err, "finish " + what_);
    }
    state_ = State::kFinished;
    return Status::Ok();
  }

  Status Abort() override {
    if (state_ == State::kFinished) return FailedPrecondition("abort of the finished write " + what_);
    OmlStorageError err{};
    int32_t rc = oml_storage_writer_abort(handle_, &err);
    state_ = State::kAborted;
    if (rc != OML_STORAGE_OK) return FromStorageError(rc, err, "abort " + what_);
    return Status::Ok();
  }

 private:
  enum class State { kOpen, kFinished, kAborted, kFailed };
  Status RequireOpen(const char* op) const {
    if (state_ == State::kOpen) return Status::Ok();
    static constexpr const char* kNames[] = {"open", "finished", "aborted", "failed"};
    return FailedPrecondition(std::string(op) + " on the " + kNames[static_cast<int>(state_)] + " write " +
                              what_);
  }

  OmlStorageWriter* handle_;
  std::string what_;
  State state_ = State::kOpen;
};

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

  Result<bool> PutIfAbsent(const std::string& key, const std::string& bytes) override {
    OmlStorageError err{};
    int32_t rc = oml_storage_store_put_if_absent(handle_, key.c_str(),
                                                 reinterpret_cast<const uint8_t*>(bytes.data()),
                                                 bytes.size(), &err);
    if (rc == OML_STORAGE_ALREADY_EXISTS) {
      oml_storage_free_string(err.message);
      return false;
    }
    if (rc != OML_STORAGE_OK) return FromStorageError(rc, err, "put-if-absent " + Describe(key));
    return true;
  }

  Result<std::optional<std::string>> GetRange(const std::string& key, uint64_t offset,
                                              uint64_t length) override {
    OmlStorageError err{};
    OmlStorageBuffer buf{};
    int32_t rc = oml_storage_store_get_range(handle_, key.c_str(), offset, length, &buf, &err);
    if (rc == OML_STORAGE_NOT_FOUND) {
      oml_storage_free_string(err.message);
      return std::optional<std::string>();
    }
    if (rc != OML_STORAGE_OK) {
      return FromStorageError(rc, err,
                              "get range " + std::to_string(offset) + "+" + std::to_string(length) + " of " +
                                  Describe(key));
    }
    std::string out(reinterpret_cast<const char*>(buf.data), buf.len);
    oml_storage_free_buffer(&buf);
    return std::optional<std::string>(std::move(out));
  }

  Result<bool> GetRangeInto(const std::string& key, uint64_t offset, uint64_t length, std::string* out) override {
    // Sized once to the range (no fill when *out was at least this long before), cut to what came.
    if (length > out->max_size()) return InvalidArgument("range of " + std::to_string(length) + " bytes is too large");
    out->resize(length);
    OmlStorageError err{};
    uint64_t got = 0;
    int32_t rc = oml_storage_store_read_range(handle_, key.c_str(), offset, length,
                                              reinterpret_cast<uint8_t*>(out->data()), &got, &err);
    if (rc == OML_STORAGE_NOT_FOUND) {
      oml_storage_free_string(err.message);
      out->clear();
      return false;
    }
    if (rc != OML_STORAGE_OK) {
      out->clear();
      return FromStorageError(rc, err,
                              "read range " + std::to_string(offset) + "+" + std::to_string(length) + " of " +
                                  Describe(key));
    }
    out->resize(got);
    return true;
  }

  Result<std::optional<uint64_t>> Size(const std::string& key) override {
    OmlStorageError err{};
    uint64_t size = 0;
    int32_t rc = oml_storage_store_head(handle_, key.c_str(), &size, &err);
    if (rc == OML_STORAGE_NOT_FOUND) {
      oml_storage_free_string(err.message);
      return std::optional<uint64_t>();
    }
    if (rc != OML_STORAGE_OK) return FromStorageError(rc, err, "head " + Describe(key));
    return std::optional<uint64_t>(size);
  }

  Status Copy(const std::string& from_key, const std::string& to_key) override {
    OmlStorageError err{};
    int32_t rc = oml_storage_store_copy(handle_, from_key.c_str(), to_key.c_str(), &err);
    if (rc != OML_STORAGE_OK) {
      return FromStorageError(rc, err, "copy '" + from_key + "' to " + Describe(to_key));
    }
    return Status::Ok();
  }

  uint64_t ResumableMinPart() const override { return oml_storage_resumable_min_part(handle_); }

  Result<std::string> ResumableStart(const std::string& key) override {
    OmlStorageError err{};
    char* h = nullptr;
    int32_t rc = oml_storage_resumable_start(handle_, key.c_str(), &h, &err);
    if (rc != OML_STORAGE_OK) return FromStorageError(rc, err, "start a resumable write of " + Describe(key));
    std::string out = h != nullptr ? h : "";
    oml_storage_free_string(h);
    return out;
  }

  Result<std::string> ResumablePut(const std::string& key, const std::string& handle, uint32_t part_no,
                                   uint64_t offset, std::string_view bytes, bool sync) override {
    OmlStorageError err{};
    char* tag = nullptr;
    int32_t rc = oml_storage_resumable_put(handle_, key.c_str(), handle.c_str(), part_no, offset,
                                           reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), sync ? 1 : 0,
                                           &tag, &err);
    if (rc != OML_STORAGE_OK)
      return FromStorageError(rc, err, "put part " + std::to_string(part_no) + " of " + Describe(key));
    std::string out = tag != nullptr ? tag : "";
    oml_storage_free_string(tag);
    return out;
  }

  Status ResumableFinish(const std::string& key, const std::string& handle, const std::vector<std::string>& tags,
                         uint64_t size, const std::string& final_key) override {
    OmlStorageError err{};
    std::vector<const char*> ptrs;
    ptrs.reserve(tags.size());
    for (const auto& t : tags) ptrs.push_back(t.c_str());
    int32_t rc = oml_storage_resumable_finish(handle_, key.c_str(), handle.c_str(), ptrs.data(), ptrs.size(), size,
                                              final_key.c_str(), &err);
    if (rc != OML_STORAGE_OK) return FromStorageError(rc, err, "finish " + Describe(key) + " into '" + final_key + "'");
    return Status::Ok();
  }

  Status ResumableAbort(const std::string& key, const std::string& handle) override {
    OmlStorageError err{};
    int32_t rc = oml_storage_resumable_abort(handle_, key.c_str(), handle.c_str(), &err);
    if (rc != OML_STORAGE_OK) return FromStorageError(rc, err, "abort the resumable write of " + Describe(key));
    return Status::Ok();
  }

  Result<uint64_t> SweepStaging(std::chrono::seconds grace) override {
    OmlStorageError err{};
    uint64_t removed = 0;
    int32_t rc = oml_storage_store_sweep_staging(handle_, static_cast<uint64_t>(std::max<int64_t>(0, grace.count())),
                                                 &removed, &err);
    if (rc != OML_STORAGE_OK) return FromStorageError(rc, err, "staging sweep of " + url_);
    return removed;
  }

  Result<std::unique_ptr<ObjectWriter>> OpenWriter(const std::string& key) override {
    OmlStorageError err{};
    OmlStorageWriter* w = nullptr;
    int32_t rc = oml_storage_writer_open(handle_, key.c_str(), &w, &err);
    if (rc != OML_STORAGE_OK) return FromStorageError(rc, err, "open writer for " + Describe(key));
    return std::unique_ptr<ObjectWriter>(new RustObjectWriter(w, Describe(key)));
  }

  Result<std::vector<Meta>> ListMeta(const std::string& prefix) override {
    OmlStorageError err{};
    char* json = nullptr;
    int32_t rc = oml_storage_store_list_meta(handle_, prefix.c_str(), &json, &err);
    if (rc != OML_STORAGE_OK) return FromStorageError(rc, err, "list " + Describe(prefix));
    std::string text = json != nullptr ? json : "[]";
    oml_storage_free_string(json);
    auto parsed = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (!parsed.is_array()) return Internal("list " + Describe(prefix) + ": malformed listing");
    std::vector<Meta> out;
    out.reserve(parsed.size());
    for (const auto& e : parsed) {
      if (!e.is_object() || !e["key"].is_string() || !e["size"].is_number_unsigned() ||
          !e["modified_ms"].is_number_integer())
        return Internal("list " + Describe(prefix) + ": malformed listing");
      out.push_back({e["key"].get<std::string>(), e["size"].get<uint64_t>(), e["modified_ms"].get<int64_t>()});
    }
    return out;  // sorted by the adapter
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

StagingSweeper::StagingSweeper(std::vector<ObjectStore*> stores, std::vector<std::string> names,
                               std::chrono::seconds grace, std::chrono::milliseconds interval)
    : stores_(std::move(stores)),
      names_(std::move(names)),
      grace_(grace),
      thread_(interval, [this] { SweepAll(); }, /*run_at_start=*/true) {}

void StagingSweeper::SweepAll() {
  for (size_t i = 0; i < stores_.size(); ++i) {
    const std::string& name = i < names_.size() ? names_[i] : std::to_string(i);
    auto n = stores_[i]->SweepStaging(grace_);
    if (!n.ok()) {
      log::Warn("staging sweep failed; the next round retries", {{"store", name}, {"error", n.status().ToString()}});
    } else if (*n > 0) {
      log::Info("staging sweep removed what interrupted writes left",
                {{"store", name}, {"removed", std::to_string(*n)}, {"grace_s", std::to_string(grace_.count())}});
    }
  }
}

Result<std::unique_ptr<ObjectStore>> OpenObjectStore(const std::string& url) {
  OmlStorageError err{};
  OmlStorageStore* handle = nullptr;
  int32_t rc = oml_storage_store_open(url.c_str(), &handle, &err);
  if (rc != OML_STORAGE_OK) return FromStorageError(rc, err, "open object store " + url);
  return std::unique_ptr<ObjectStore>(new RustObjectStore(handle, url));
}

Result<std::vector<ObjectStore::Meta>> ObjectStore::ListMeta(const std::string& prefix) {
  OML_ASSIGN_OR_RETURN(std::vector<std::string> keys, List(prefix));
  std::vector<Meta> out;
  out.reserve(keys.size());
  for (auto& k : keys) {
    OML_ASSIGN_OR_RETURN(std::optional<uint64_t> size, Size(k));
    if (!size) continue;  // deleted since the listing
    out.push_back({std::move(k), *size, 0});
  }
  return out;
}

Status CopyBetween(ObjectStore& src, const std::string& src_key, ObjectStore& dst,
                   const std::string& dst_key) {
  OML_ASSIGN_OR_RETURN(std::optional<uint64_t> size, src.Size(src_key));
  if (!size) return NotFound("copy source '" + src_key + "' does not exist");
  OML_ASSIGN_OR_RETURN(std::unique_ptr<ObjectWriter> writer, dst.OpenWriter(dst_key));
  // Any early return destroys the open writer, which aborts it: nothing appears at dst_key.
  uint64_t offset = 0;
  while (offset < *size) {
    OML_ASSIGN_OR_RETURN(std::optional<std::string> range,
                         src.GetRange(src_key, offset, std::min(kCopyRangeBytes, *size - offset)));
    if (!range) return NotFound("copy source '" + src_key + "' vanished at byte " + std::to_string(offset));
    if (range->empty()) {
      return DataLoss("copy source '" + src_key + "' ended at byte " + std::to_string(offset) + " of " +
                      std::to_string(*size));
    }
    OML_RETURN_IF_ERROR(writer->Write(*range));
    offset += range->size();
  }
  return writer->Finish();
}

Result<std::string> BucketUrl(const Config& config, const std::string& bucket) {
  if (!IsValidBucketName(bucket)) return InvalidArgument("not a valid bucket name: '" + bucket + "'");
  const std::string& base = config.object_store_url;
  std::string dir;
  if (base.rfind("file://", 0) == 0) {
    dir = base;
  } else if (base.rfind('/', 0) == 0) {
    dir = "file://" + base;
  } else if (base.rfind("s3://", 0) == 0) {
    return "s3://" + bucket;
  } else {
    return InvalidArgument("object_store_url '" + base + "': want file:// or s3:// to place bucket '" + bucket + "'");
  }
  while (dir.size() > std::string_view("file://").size() && dir.back() == '/') dir.pop_back();
  return dir + "/" + bucket;  // "file://" + "/" + bucket for the root directory
}

Result<std::unique_ptr<ObjectStore>> OpenBucket(const Config& config, const std::string& bucket) {
  OML_ASSIGN_OR_RETURN(std::string url, BucketUrl(config, bucket));
  return OpenObjectStore(url);
}

uint64_t DirectWriteCount() { return oml_storage_direct_write_count(); }

}  // namespace oml::blob
