// Object storage behind an interface: a local directory or an S3-compatible bucket, both through
// the Rust adapter rust/oml-storage (object_store crate). Tests wrap a store to inject faults.
//
// Keys are '/'-separated relative paths ("oml-heads/<tenant>"). Values are whole objects.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"

namespace oml::blob {

class ObjectStore {
 public:
  virtual ~ObjectStore() = default;
  // Creates or replaces the object atomically (readers see old or new bytes, never a mix).
  virtual Status Put(const std::string& key, const std::string& bytes) = 0;
  // std::nullopt if the object does not exist.
  virtual Result<std::optional<std::string>> Get(const std::string& key) = 0;
  // Keys under prefix (recursive), sorted.
  virtual Result<std::vector<std::string>> List(const std::string& prefix) = 0;
  virtual Status Delete(const std::string& key) = 0;
};

// Opens a store by URL:
//   file:///abs/dir          a local directory (created if missing)
//   s3://bucket[/prefix]     S3; endpoint/credentials from the AWS_* environment variables
//                            (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
//                            AWS_REGION, AWS_ALLOW_HTTP=true for loopback servers).
// A bare absolute path is treated as file://. kInvalidArgument for other schemes.
Result<std::unique_ptr<ObjectStore>> OpenObjectStore(const std::string& url);

}  // namespace oml::blob
