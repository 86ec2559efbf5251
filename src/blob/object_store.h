// Object storage behind an interface: a local directory or an S3-compatible bucket, both through
// the Rust adapter rust/oml-storage (object_store crate). Tests wrap a store to inject faults.
//
// Keys are '/'-separated relative paths ("oml-heads/<tenant>"): non-empty, no leading or
// trailing '/', no empty, "." or ".." segment (else kInvalidArgument). On a local directory a
// key whose last segment has only digits after its first '#' is reserved (staging files of writers).
//
// Errors from the backend: kNotFound only where stated, kAborted when a conditional write lost
// its race, kUnavailable for I/O and network failures (retry later; "storage-permission" when
// the backend refused the credentials), kInternal otherwise.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/config.h"
#include "common/periodic.h"
#include "common/status.h"

namespace oml::blob {

// A streaming write of one object: bytes go up in parts while they arrive, and the object
// appears at its key only at Finish, whole and atomically (replacing any object there). S3 runs
// a multipart upload with parts of kWriterPartBytes (the last may be smaller); a local
// directory writes a hidden staging file and renames it into place.
//
// Memory: at most one part is buffered; a Write that fills a part uploads it before returning.
// Thread safety: none; one owner uses a writer. It may outlive the store that opened it.
// States: open -> finished (Finish ok) | aborted (Abort) | failed (a Write or Finish failed:
// the parts are discarded, nothing appears). Write/Finish when not open: kFailedPrecondition.
// Destroying a writer that is still open aborts it (best effort).
class ObjectWriter {
 public:
  virtual ~ObjectWriter() = default;
  virtual Status Write(std::string_view bytes) = 0;
  virtual Status Finish() = 0;
  // Discards everything written; the key keeps what it had. Ok again when already aborted or
  // failed; kFailedPrecondition after Finish (the object exists: Delete it instead).
  virtual Status Abort() = 0;
};

// What a writer buffers before uploading a part (S3 needs >= 5 MiB but the last; at most
// 10,000 parts, so a written object can reach 80 GiB).
inline constexpr uint64_t kWriterPartBytes = uint64_t{8} << 20;

class ObjectStore {
 public:
  virtual ~ObjectStore() = default;
  // Creates or replaces the object atomically (readers see old or new bytes, never a mix).
  virtual Status Put(const std::string& key, const std::string& bytes) = 0;
  // Creates the object only if the key is free: true if it wrote, false if an object already
  // had the key (nothing written; the old bytes stay). Atomic against concurrent writers (S3:
  // If-None-Match: *, which the S3-compatible store must honour).
  virtual Result<bool> PutIfAbsent(const std::string& key, const std::string& bytes) = 0;
  // std::nullopt if the object does not exist.
  virtual Result<std::optional<std::string>> Get(const std::string& key) = 0;
  // Bytes [offset, min(offset + length, size)) of the object: "" when length is 0 or offset is
  // at or past the end; offset + length may exceed the size. std::nullopt if it does not exist.
  virtual Result<std::optional<std::string>> GetRange(const std::string& key, uint64_t offset,
                                                      uint64_t length) = 0;
  // GetRange's bytes into *out, replacing what it held: false (and *out empty) if the object
  // does not exist. *out's memory is reused, so a reader that passes one string for ranges of one
  // size allocates nothing after the first (a local store reads the file straight into it). The
  // default calls GetRange (so a store that wraps another, faults and all, stays whole).
  // REQUIRES: `length` is a size the caller means to hold: *out is sized to it before the read.
  virtual Result<bool> GetRangeInto(const std::string& key, uint64_t offset, uint64_t length, std::string* out) {
    OML_ASSIGN_OR_RETURN(std::optional<std::string> got, GetRange(key, offset, length));
    if (!got) {
      out->clear();
      return false;
    }
    *out = std::move(*got);
    return true;
  }
  // The object's size in bytes (HEAD); std::nullopt if it does not exist.
  virtual Result<std::optional<uint64_t>> Size(const std::string& key) = 0;
  // Keys under prefix (recursive), sorted.
  virtual Result<std::vector<std::string>> List(const std::string& prefix) = 0;
  // As List, with each object's size and last modification (one listing; S3: ListObjectsV2
  // pages, no request per object). The default lists, then asks each object's Size, with
  // modified_ms 0 (unknown).
  struct Meta {
    std::string key;
    uint64_t size = 0;
    int64_t modified_ms = 0;  // Unix milliseconds; 0: unknown
  };
  virtual Result<std::vector<Meta>> ListMeta(const std::string& prefix);
  // Deleting a missing object succeeds.
  virtual Status Delete(const std::string& key) = 0;
  // Server-side copy within this store, replacing any object at to_key atomically; the bytes
  // never pass through this process (local: a hard link; S3: CopyObject, up to 5 GiB; beyond,
  // use CopyBetween). kNotFound if from_key does not exist.
  virtual Status Copy(const std::string& from_key, const std::string& to_key) = 0;
  // Starts a streaming write of key (see ObjectWriter). Nothing is visible until Finish.
  virtual Result<std::unique_ptr<ObjectWriter>> OpenWriter(const std::string& key) = 0;
  // ---- Resumable writes: one object written part by part across requests and processes, its
  // progress (the handle, each part's tag) kept by the caller (upload sessions, uploads.h).
  // S3: a multipart upload at `key` (the staging key), parts numbered from 1, each at least
  // ResumableMinPart() bytes but the last; Finish completes it and server-side copies it to
  // final_key (CopyObject: at most 5 GiB). Local directory: an append-only staging file at `key`;
  // ResumablePut truncates it to `offset` and writes there (so a part whose commit never came is
  // cut off by the next); Finish renames it to final_key. Every write is durable before it
  // returns. The staging object is visible to List under `key` on a local store, never on S3.
  //
  // The smallest part but the last: 5 MiB on S3, 0 locally.
  virtual uint64_t ResumableMinPart() const = 0;
  // Starts one; returns its handle (S3: the UploadId).
  virtual Result<std::string> ResumableStart(const std::string& key) = 0;
  // Part `part_no` (1..10000), the object's bytes from `offset`; returns its tag (S3: ETag; "").
  // kNotFound when the write is gone (S3: aborted or completed; local: no staging file, or one
  // shorter than `offset`, which is never padded).
  // `sync` false (a local store only): the bytes are written but not fsynced yet; a later put with
  // `sync` (of any length, even 0) makes the whole file durable. S3 parts are always durable.
  virtual Result<std::string> ResumablePut(const std::string& key, const std::string& handle, uint32_t part_no,
                                           uint64_t offset, std::string_view bytes, bool sync) = 0;
  // The object appears at final_key, whole (`size` bytes; tags[i] is part i+1's), and the staging
  // object goes. Idempotent after a crash: final_key already holding `size` bytes, or a multipart
  // upload completed before, carries on from there.
  virtual Status ResumableFinish(const std::string& key, const std::string& handle, const std::vector<std::string>& tags,
                                 uint64_t size, const std::string& final_key) = 0;
  // Forgets it (S3: AbortMultipartUpload, its parts freed; local: the staging file deleted).
  // A write that is gone already: Ok.
  virtual Status ResumableAbort(const std::string& key, const std::string& handle) = 0;

  // Removes what interrupted writes (a kill -9 mid-Put or mid-writer) left, which List never
  // shows: on a local store, staging files `<name>#<digits>` not modified for `grace`; on S3,
  // incomplete multipart uploads under the store's prefix initiated at least `grace` ago.
  // Returns how many. REQUIRES: `grace` exceeds the longest write in progress (a younger one
  // is never touched; an older one would lose its staging file and fail).
  virtual Result<uint64_t> SweepStaging(std::chrono::seconds grace) = 0;
};

// Resumable writes to local staging files that went out with O_DIRECT, whole, in this process
// (tests show with it that the direct path ran; the bytes are the same either way).
uint64_t DirectWriteCount();

// Runs SweepStaging(grace) on each store at once and then every `interval`, on its own thread,
// until destroyed; logs what it removed and every failure (the next round retries).
class StagingSweeper {
 public:
  // REQUIRES: the stores outlive this object.
  StagingSweeper(std::vector<ObjectStore*> stores, std::vector<std::string> names, std::chrono::seconds grace,
                 std::chrono::milliseconds interval);

 private:
  void SweepAll();
  const std::vector<ObjectStore*> stores_;
  const std::vector<std::string> names_;
  const std::chrono::seconds grace_;
  PeriodicThread thread_;  // last: runs SweepAll over the members above
};

// Ranges CopyBetween reads at a time.
inline constexpr uint64_t kCopyRangeBytes = uint64_t{8} << 20;

// Streams src_key of `src` into dst_key of `dst` (e.g. quarantine -> bodies, two buckets) with
// the same bytes: ranges of kCopyRangeBytes through an ObjectWriter, so memory stays at one
// range plus one part whatever the size. dst_key appears atomically at the end, replacing any
// object there; on failure nothing appears. kNotFound if src_key does not exist (or vanishes
// during the copy); kDataLoss if the source ends before the size it had at the start.
// REQUIRES: nobody replaces src_key during the copy (content-addressed keys never change).
Status CopyBetween(ObjectStore& src, const std::string& src_key, ObjectStore& dst,
                   const std::string& dst_key);

// Opens a store by URL:
//   file:///abs/dir          a local directory (created if missing)
//   s3://bucket[/prefix]     S3; endpoint/credentials from the AWS_* environment variables
//                            (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
//                            AWS_REGION, AWS_ALLOW_HTTP=true for loopback servers).
// A bare absolute path is treated as file://. kInvalidArgument for other schemes.
Result<std::unique_ptr<ObjectStore>> OpenObjectStore(const std::string& url);

// The URL of a named bucket (config quarantine_bucket / bodies_bucket) next to
// config.object_store_url: with file:///dir (or /dir) the bucket is the subdirectory
// file:///dir/<bucket> (local profile: $OML_HOME/objects/<bucket>); with s3://... it is the S3
// bucket s3://<bucket> (the object_store_url's own bucket and prefix do not apply; endpoint and
// credentials come from the same AWS_* variables). kInvalidArgument if bucket is not a valid
// S3 bucket name or the object_store_url's scheme is neither.
Result<std::string> BucketUrl(const Config& config, const std::string& bucket);
// OpenObjectStore(BucketUrl(config, bucket)).
Result<std::unique_ptr<ObjectStore>> OpenBucket(const Config& config, const std::string& bucket);

}  // namespace oml::blob
