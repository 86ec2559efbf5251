// Delta Lake tables of the lake, created through rust/oml-storage (delta-rs). See delta_tables.h.
//
// Table bronze/events (Delta name "bronze.events", at <lake_root>/bronze/events):
// one row per journal event, exactly as signed; later tiers derive from it.
//
// | column       | Delta type | nullable | meaning                                              |
// |--------------|------------|----------|------------------------------------------------------|
// | tenant_id    | string     | no       | tenant the event belongs to                          |
// | seq          | long       | no       | per-tenant chain sequence number                     |
// | prev_hash    | string     | no       | hash of the previous event in the chain (lower hex)  |
// | event_hash   | string     | no       | hash of this event (lower hex)                       |
// | event_type   | string     | no       | event type name                                      |
// | key_id       | string     | no       | id of the signing key                                |
// | principal    | string     | yes      | acting principal, if any                             |
// | occurred_at  | timestamp  | no       | event time, microseconds since epoch, UTC            |
// | signed_bytes | binary     | no       | the exact bytes that were signed                     |
// | signature    | binary     | no       | signature over signed_bytes                          |
// | outbox_seq   | long       | no       | outbox sequence the lake writer consumed it from     |
//
// Partition columns: none. Created empty (version 0) by EnsureBronzeEvents; creation is
// idempotent and an existing table whose columns (name, type, nullability, order) or partition
// columns differ is reported as kFailedPrecondition and left untouched.
#include "lake/delta_tables.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <iterator>
#include <string>
#include <utility>

#include "blob/storage_status.h"
#include "oml_storage.h"

namespace oml::lake {
namespace {

struct Column {
  const char* name;
  const char* type;
  bool nullable;
};

constexpr Column kBronzeEvents[] = {
    {"tenant_id", "string", false},   {"seq", "long", false},
    {"prev_hash", "string", false},   {"event_hash", "string", false},
    {"event_type", "string", false},  {"key_id", "string", false},
    {"principal", "string", true},    {"occurred_at", "timestamp", false},
    {"signed_bytes", "binary", false}, {"signature", "binary", false},
    {"outbox_seq", "long", false},
};

constexpr const char* kBronzeEventsName = "bronze.events";
constexpr const char* kBronzeEventsPath = "bronze/events";

using blob::FromStorageError;

std::string JoinUri(const std::string& root, const std::string& rel) {
  std::string out = root;
  while (out.size() > 1 && out.back() == '/') out.pop_back();
  if (out.empty() || out.back() != '/') out += '/';
  return out + rel;
}

std::string SchemaJson(const Column* cols, size_t n) {
  nlohmann::json arr = nlohmann::json::array();
  for (size_t i = 0; i < n; ++i) {
    arr.push_back({{"name", cols[i].name}, {"type", cols[i].type}, {"nullable", cols[i].nullable}});
  }
  return arr.dump();
}

}  // namespace

Status EnsureBronzeEvents(const std::string& lake_root) {
  if (lake_root.empty()) return InvalidArgument("lake root is empty");
  const std::string uri = JoinUri(lake_root, kBronzeEventsPath);
  const std::string schema = SchemaJson(kBronzeEvents, std::size(kBronzeEvents));
  OmlStorageError err{};
  int64_t version = -1;
  int32_t created = 0;
  int32_t matches = 0;
  int32_t rc = oml_storage_delta_create_table(uri.c_str(), schema.c_str(),
                                              /*partition_columns_json=*/nullptr,
                                              kBronzeEventsName, &version, &created, &matches,
                                              &err);
  if (rc != OML_STORAGE_OK) return FromStorageError(rc, err, "create Delta table " + uri);
  if (!matches) {
    return FailedPrecondition("Delta table " + uri + " (version " + std::to_string(version) +
                                  ") exists with a schema different from bronze.events",
                              "lake-schema-mismatch");
  }
  return Status::Ok();
}

Result<int64_t> TableVersion(const std::string& table_uri) {
  OmlStorageError err{};
  int64_t version = -1;
  int32_t rc = oml_storage_delta_table_version(table_uri.c_str(), &version, &err);
  if (rc != OML_STORAGE_OK) return FromStorageError(rc, err, "Delta table version of " + table_uri);
  return version;
}

}  // namespace oml::lake
