// Delta Lake tables of the lake, created through rust/oml-storage (delta-rs). See delta_tables.h.
//
// Table bronze/events (Delta name "bronze.events", at <lake_root>/bronze/events):
// one row per journal event, exactly as signed, plus the columns analytics and reconciliation
// read without parsing the signed bytes (journal/bronze_row.h derives them from the payload);
// later tiers derive from it. docs/data/delta-tables.md documents each column.
//
// | column            | Delta type | nullable | meaning                                              |
// |-------------------|------------|----------|------------------------------------------------------|
// | tenant_id         | string     | no       | tenant the event belongs to                          |
// | seq               | long       | no       | per-tenant chain sequence number                     |
// | prev_hash         | string     | no       | hash of the previous event in the chain (lower hex)  |
// | event_hash        | string     | no       | hash of this event (lower hex)                       |
// | event_type        | string     | no       | event type name                                      |
// | key_id            | string     | no       | id of the signing key                                |
// | principal         | string     | yes      | acting principal, if any                             |
// | occurred_at       | timestamp  | no       | event time, microseconds since epoch, UTC            |
// | artifact_id       | string     | yes      | payload artifact_id (claim.submitted, artifact.erased) |
// | version           | long       | yes      | payload version (claim.submitted)                    |
// | workarea_id       | string     | yes      | payload workarea_id (claim.submitted)                |
// | path              | string     | yes      | payload path at write (claim.submitted)              |
// | provenance        | string     | yes      | payload provenance class (claim.submitted)           |
// | simulation_id     | string     | yes      | payload simulation_id (claim.submitted, may be null) |
// | plaintext_sha256  | string     | yes      | payload plaintext digest, lower hex                  |
// | ciphertext_sha256 | string     | yes      | payload ciphertext digest, lower hex                 |
// | signed_bytes      | binary     | no       | the exact bytes that were signed                     |
// | signature         | binary     | no       | signature over signed_bytes                          |
// | outbox_seq        | long       | no       | outbox sequence the lake writer consumed it from     |
//
// Partition columns: none (delta-tables.md says why). File statistics: delta-rs's default, on
// for every column (the first 32). Created empty (version 0) by EnsureBronzeEvents; creation is
// idempotent and an existing table whose columns (name, type, nullability, order) or partition
// columns differ is reported as kFailedPrecondition naming the columns, and left untouched.
#include "lake/delta_tables.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

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
    {"tenant_id", "string", false},        {"seq", "long", false},
    {"prev_hash", "string", false},        {"event_hash", "string", false},
    {"event_type", "string", false},       {"key_id", "string", false},
    {"principal", "string", true},         {"occurred_at", "timestamp", false},
    {"artifact_id", "string", true},       {"version", "long", true},
    {"workarea_id", "string", true},       {"path", "string", true},
    {"provenance", "string", true},        {"simulation_id", "string", true},
    {"plaintext_sha256", "string", true},  {"ciphertext_sha256", "string", true},
    {"signed_bytes", "binary", false},     {"signature", "binary", false},
    {"outbox_seq", "long", false},
};

// silver/claims: one row per promoted claim version (tenant_id, artifact_id, version); written by
// MERGE from the silver outbox rows that promotion, demotion and erasure enqueue
// (admission/review). Never plaintext, never a held body: digests and where the ciphertext lives.
constexpr Column kSilverClaims[] = {
    {"tenant_id", "string", false},          {"artifact_id", "string", false},
    {"version", "long", false},              {"workarea_id", "string", false},
    {"path", "string", false},               {"writer_key_id", "string", false},
    {"principal", "string", false},          {"submitted_at", "timestamp", false},
    {"promoted_at", "timestamp", false},     {"provenance", "string", false},
    {"simulation_id", "string", true},       {"plaintext_sha256", "string", false},
    {"ciphertext_sha256", "string", false},  {"media_type", "string", false},
    {"size_bytes", "long", false},           {"body_location", "string", false},
    {"state", "string", false},              {"state_changed_at", "timestamp", false},
    {"last_event_seq", "long", false},       {"outbox_seq", "long", false},
};

// gold/daily_activity: events per (tenant, UTC day, workarea, event type), derived by the lake
// writer from each batch's bronze rows and MERGEd with `events` added. workarea_id is "" for
// events that name no workarea (keys are never null).
constexpr Column kGoldDailyActivity[] = {
    {"tenant_id", "string", false}, {"day", "date", false},
    {"workarea_id", "string", false}, {"event_type", "string", false},
    {"events", "long", false},      {"last_outbox_seq", "long", false},
};

struct TableDef {
  const char* path;  // under the lake root; also outbox.target_table
  const char* name;  // Delta table name
  const Column* cols;
  size_t n;
};

constexpr TableDef kTables[] = {
    {"bronze/events", "bronze.events", kBronzeEvents, std::size(kBronzeEvents)},
    {"silver/claims", "silver.claims", kSilverClaims, std::size(kSilverClaims)},
    {"gold/daily_activity", "gold.daily_activity", kGoldDailyActivity, std::size(kGoldDailyActivity)},
};

using blob::FromStorageError;

std::string SchemaJson(const Column* cols, size_t n) {
  nlohmann::json arr = nlohmann::json::array();
  for (size_t i = 0; i < n; ++i) {
    arr.push_back({{"name", cols[i].name}, {"type", cols[i].type}, {"nullable", cols[i].nullable}});
  }
  return arr.dump();
}

// An existing table whose schema is not `want`: kFailedPrecondition "lake-schema-mismatch"
// naming the columns it lacks, has in excess, or has with another type, nullability or place,
// and the fix. The table is never altered in place: adding columns would append them after
// the existing ones, out of the documented order, so the table would still not match.
Status SchemaMismatch(const std::string& uri, int64_t version, const Column* want, size_t n);

}  // namespace

namespace {

Status EnsureTable(const std::string& lake_root, const TableDef& def) {
  if (lake_root.empty()) return InvalidArgument("lake root is empty");
  const std::string uri = TableUri(lake_root, def.path);
  const std::string schema = SchemaJson(def.cols, def.n);
  OmlStorageError err{};
  int64_t version = -1;
  int32_t created = 0;
  int32_t matches = 0;
  int32_t rc = oml_storage_delta_create_table(uri.c_str(), schema.c_str(),
                                              /*partition_columns_json=*/nullptr, def.name,
                                              &version, &created, &matches, &err);
  if (rc != OML_STORAGE_OK) return FromStorageError(rc, err, "create Delta table " + uri);
  if (!matches) return SchemaMismatch(uri, version, def.cols, def.n);
  return Status::Ok();
}

}  // namespace

Status EnsureBronzeEvents(const std::string& lake_root) { return EnsureTable(lake_root, kTables[0]); }

std::string TableUri(const std::string& lake_root, const std::string& name) {
  std::string out = lake_root;
  while (out.size() > 1 && out.back() == '/') out.pop_back();
  if (out.empty() || out.back() != '/') out += '/';
  return out + name;
}

Status EnsureLakeTables(const std::string& lake_root) {
  for (const auto& def : kTables) OML_RETURN_IF_ERROR(EnsureTable(lake_root, def));
  return Status::Ok();
}

std::vector<std::string> LakeTableNames() {
  std::vector<std::string> out;
  for (const auto& def : kTables) out.emplace_back(def.path);
  return out;
}

Result<std::vector<ArrowColumnSpec>> LakeTableColumns(const std::string& name) {
  for (const auto& def : kTables) {
    if (name != def.path) continue;
    std::vector<ArrowColumnSpec> out;
    for (size_t i = 0; i < def.n; ++i) {
      OML_ASSIGN_OR_RETURN(ArrowColumnType type, ArrowColumnTypeOf(def.cols[i].type));
      out.push_back({def.cols[i].name, type, def.cols[i].nullable});
    }
    return out;
  }
  return NotFound("no lake table named '" + name + "'", "lake-table-unknown");
}

Result<int64_t> TableVersion(const std::string& table_uri) {
  OmlStorageError err{};
  int64_t version = -1;
  int32_t rc = oml_storage_delta_table_version(table_uri.c_str(), &version, &err);
  if (rc != OML_STORAGE_OK) return FromStorageError(rc, err, "Delta table version of " + table_uri);
  return version;
}

Result<SetAside> SetAsideDamagedHead(const std::string& table_uri) {
  OmlStorageError err{};
  SetAside out;
  int32_t rc = oml_storage_delta_set_aside_damaged_head(table_uri.c_str(), &out.count, &out.lowest_version, &err);
  if (rc != OML_STORAGE_OK) return FromStorageError(rc, err, "damaged commits of " + table_uri);
  return out;
}

// ---- DeltaTable ---------------------------------------------------------------------------

namespace {

std::string MetadataJson(const TxnCommit& commit) {
  return commit.metadata.is_null() ? std::string() : commit.metadata.dump();
}

std::string ColumnsJson(const std::vector<std::string>& cols) {
  return nlohmann::json(cols).dump();
}

// A heap string the adapter returned, copied and freed ("" for NULL).
std::string TakeAdapterString(char* s) {
  std::string out = s != nullptr ? std::string(s) : std::string();
  oml_storage_free_string(s);
  return out;
}

}  // namespace

Result<DeltaTable> DeltaTable::Open(const std::string& table_uri) {
  OmlStorageError err{};
  OmlStorageDeltaTable* handle = nullptr;
  int32_t rc = oml_storage_delta_open(table_uri.c_str(), &handle, &err);
  if (rc != OML_STORAGE_OK) return FromStorageError(rc, err, "open Delta table " + table_uri);
  return DeltaTable(handle, table_uri);
}

Result<DeltaTable> DeltaTable::OpenUnchecked(const std::string& table_uri) {
  OmlStorageError err{};
  OmlStorageDeltaTable* handle = nullptr;
  int32_t rc = oml_storage_delta_open_unchecked(table_uri.c_str(), &handle, &err);
  if (rc != OML_STORAGE_OK) return FromStorageError(rc, err, "open Delta table " + table_uri);
  return DeltaTable(handle, table_uri);
}

DeltaTable::DeltaTable(DeltaTable&& other) noexcept
    : handle_(std::exchange(other.handle_, nullptr)), uri_(std::move(other.uri_)) {}

DeltaTable& DeltaTable::operator=(DeltaTable&& other) noexcept {
  if (this != &other) {
    oml_storage_delta_close(handle_);
    handle_ = std::exchange(other.handle_, nullptr);
    uri_ = std::move(other.uri_);
  }
  return *this;
}

DeltaTable::~DeltaTable() { oml_storage_delta_close(handle_); }

Result<int64_t> DeltaTable::SnapshotVersion() const {
  OmlStorageError err{};
  int64_t version = -1;
  int32_t rc = oml_storage_delta_snapshot_version(handle_, &version, &err);
  if (rc != OML_STORAGE_OK) return FromStorageError(rc, err, "snapshot version of " + uri_);
  return version;
}

Result<int64_t> DeltaTable::Refresh() {
  OmlStorageError err{};
  int64_t version = -1;
  int32_t rc = oml_storage_delta_refresh(handle_, &version, &err);
  if (rc != OML_STORAGE_OK) return FromStorageError(rc, err, "refresh Delta table " + uri_);
  return version;
}

Result<LastTxn> DeltaTable::ReadLastTxn(const std::string& app_id) const {
  OmlStorageError err{};
  LastTxn out;
  int64_t commit_version = -1;
  char* metadata = nullptr;
  int32_t rc = oml_storage_delta_last_txn(handle_, app_id.c_str(), &out.version,
                                          &commit_version, &metadata, &err);
  if (rc != OML_STORAGE_OK) {
    return FromStorageError(rc, err, "last txn of " + app_id + " in " + uri_);
  }
  if (metadata != nullptr) {
    std::string text(metadata);
    oml_storage_free_string(metadata);
    nlohmann::json parsed = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (parsed.is_discarded() || !parsed.is_object()) {
      return Internal("commit metadata of " + uri_ + " is not a JSON object: " + text);
    }
    out.metadata = std::move(parsed);
    out.commit_version = commit_version;
  }
  return out;
}

Result<int64_t> DeltaTable::Append(const std::string& rows_jsonl, const TxnCommit& commit) {
  OmlStorageError err{};
  int64_t version = -1;
  const std::string metadata = MetadataJson(commit);
  int32_t rc = oml_storage_delta_append(handle_, rows_jsonl.data(), rows_jsonl.size(),
                                        commit.app_id.c_str(), commit.version, metadata.c_str(),
                                        &version, &err);
  if (rc != OML_STORAGE_OK) {
    return FromStorageError(rc, err, "append to " + uri_ + " (txn " + std::to_string(commit.version) + ")");
  }
  return version;
}

Result<int64_t> DeltaTable::AppendBatch(ArrowBatch* rows, const TxnCommit& commit) {
  ArrowArray array{};
  ArrowSchema schema{};
  rows->Export(&array, &schema);  // the adapter owns both from here, on every path
  OmlStorageError err{};
  int64_t version = -1;
  const std::string metadata = MetadataJson(commit);
  int32_t rc = oml_storage_delta_append_arrow(handle_, &array, &schema, commit.app_id.c_str(), commit.version,
                                              metadata.c_str(), &version, &err);
  // The adapter moves both structs first thing; were one left (a failure before that), free it here.
  if (array.release != nullptr) array.release(&array);
  if (schema.release != nullptr) schema.release(&schema);
  if (rc != OML_STORAGE_OK) {
    return FromStorageError(rc, err, "append to " + uri_ + " (txn " + std::to_string(commit.version) + ")");
  }
  return version;
}

Result<int64_t> DeltaTable::Merge(const std::string& rows_jsonl, const MergeSpec& spec,
                                  const TxnCommit& commit) {
  OmlStorageError err{};
  int64_t version = -1;
  const std::string metadata = MetadataJson(commit);
  const std::string keys = ColumnsJson(spec.key_columns);
  const std::string updates = spec.update_columns ? ColumnsJson(*spec.update_columns) : "";
  const std::string adds = spec.add_columns.empty() ? std::string() : ColumnsJson(spec.add_columns);
  int32_t rc = oml_storage_delta_merge(handle_, rows_jsonl.data(), rows_jsonl.size(), keys.c_str(),
                                       spec.update_columns ? updates.c_str() : nullptr,
                                       adds.empty() ? nullptr : adds.c_str(),
                                       spec.newer_column.empty() ? nullptr : spec.newer_column.c_str(),
                                       commit.app_id.c_str(), commit.version, metadata.c_str(),
                                       &version, &err);
  if (rc != OML_STORAGE_OK) {
    return FromStorageError(rc, err, "merge into " + uri_ + " (txn " + std::to_string(commit.version) + ")");
  }
  return version;
}

Result<int64_t> DeltaTable::Truncate(const TxnCommit& commit) {
  OmlStorageError err{};
  int64_t version = -1;
  const std::string metadata = MetadataJson(commit);
  int32_t rc = oml_storage_delta_truncate(handle_, commit.app_id.c_str(), commit.version, metadata.c_str(), &version,
                                          &err);
  if (rc != OML_STORAGE_OK) {
    return FromStorageError(rc, err, "truncate " + uri_ + " (txn " + std::to_string(commit.version) + ")");
  }
  return version;
}

Result<RowCheck> DeltaTable::CheckRows(const std::string& rows_jsonl) const {
  OmlStorageError err{};
  int64_t bad = -1;
  int32_t rc = oml_storage_delta_check_rows(handle_, rows_jsonl.data(), rows_jsonl.size(), &bad, &err);
  if (rc == OML_STORAGE_OK) return RowCheck{};
  Status st = FromStorageError(rc, err, "row does not fit " + uri_);
  if (rc == OML_STORAGE_INVALID_ARGUMENT && bad >= 0) return RowCheck{bad, st.message()};
  return st;
}

Result<std::string> DeltaTable::ReadRowsJsonl() const {
  OmlStorageError err{};
  char* rows = nullptr;
  int32_t rc = oml_storage_delta_read_rows(handle_, &rows, &err);
  if (rc != OML_STORAGE_OK) return FromStorageError(rc, err, "read rows of " + uri_);
  return TakeAdapterString(rows);
}

Result<std::vector<std::string>> DeltaTable::MissingFiles() const {
  OML_ASSIGN_OR_RETURN(std::vector<DataFile> files, Files());
  std::vector<std::string> missing;
  for (const DataFile& f : files)
    if (!f.stored_size) missing.push_back(f.path);
  return missing;
}

Result<std::vector<DataFile>> DeltaTable::Files() const { return DataFiles(/*list_store=*/true); }

Result<std::vector<DataFile>> DeltaTable::SnapshotFiles() const { return DataFiles(/*list_store=*/false); }

Result<std::vector<DataFile>> DeltaTable::DataFiles(bool list_store) const {
  OmlStorageError err{};
  char* out = nullptr;
  int32_t rc = oml_storage_delta_files(handle_, list_store ? 1 : 0, &out, &err);
  if (rc != OML_STORAGE_OK) return FromStorageError(rc, err, "data files of " + uri_);
  const std::string text = TakeAdapterString(out);
  nlohmann::json parsed = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!parsed.is_array()) return Internal("data files of " + uri_ + " are not the adapter's JSON: " + text.substr(0, 200));
  auto opt = [](const nlohmann::json& v) {
    return v.is_number_integer() ? std::optional<int64_t>(v.get<int64_t>()) : std::nullopt;
  };
  std::vector<DataFile> files;
  files.reserve(parsed.size());
  for (const auto& f : parsed) {
    if (!f.is_object() || !f["path"].is_string() || !f["size"].is_number_integer())
      return Internal("a data file of " + uri_ + " is not the adapter's JSON: " + f.dump());
    files.push_back({f["path"].get<std::string>(), f["size"].get<int64_t>(), opt(f["num_records"]),
                     opt(f["stored_size"]), opt(f["stored_modified_ms"])});
  }
  return files;
}

Result<ColumnScan> DeltaTable::Scan(const std::vector<ArrowColumnSpec>& columns,
                                    const std::vector<std::string>* files) const {
  nlohmann::json names = nlohmann::json::array();
  std::vector<ArrowColumnType> types;
  for (const auto& c : columns) {
    names.push_back(c.name);
    types.push_back(c.type);
  }
  std::string files_json;
  if (files != nullptr) files_json = nlohmann::json(*files).dump();
  OmlStorageError err{};
  OmlStorageDeltaScan* h = nullptr;
  int32_t rc = oml_storage_delta_scan_open(handle_, names.dump().c_str(), files ? files_json.c_str() : nullptr, &h, &err);
  if (rc != OML_STORAGE_OK) return FromStorageError(rc, err, "scan of " + uri_);
  return ColumnScan(h, std::move(types), uri_);
}

ColumnScan::ColumnScan(ColumnScan&& o) noexcept
    : handle_(o.handle_), types_(std::move(o.types_)), uri_(std::move(o.uri_)) {
  o.handle_ = nullptr;
}
ColumnScan& ColumnScan::operator=(ColumnScan&& o) noexcept {
  if (this != &o) {
    oml_storage_delta_scan_close(handle_);
    handle_ = o.handle_;
    types_ = std::move(o.types_);
    uri_ = std::move(o.uri_);
    o.handle_ = nullptr;
  }
  return *this;
}
ColumnScan::~ColumnScan() { oml_storage_delta_scan_close(handle_); }

Result<bool> ColumnScan::Next(ArrowBatchView* out) {
  if (handle_ == nullptr) return FailedPrecondition("scan of " + uri_ + " is closed");
  ArrowArray array{};
  ArrowSchema schema{};
  int64_t rows = 0;
  OmlStorageError err{};
  int32_t rc = oml_storage_delta_scan_next(handle_, &array, &schema, &rows, &err);
  if (rc != OML_STORAGE_OK) return FromStorageError(rc, err, "scan of " + uri_);
  if (rows == 0) return false;
  OML_RETURN_IF_ERROR(out->Import(&array, &schema, types_));
  return true;
}

Result<nlohmann::json> DeltaTable::Schema() const {
  OmlStorageError err{};
  char* out = nullptr;
  int32_t rc = oml_storage_delta_schema(handle_, &out, &err);
  if (rc != OML_STORAGE_OK) return FromStorageError(rc, err, "schema of " + uri_);
  const std::string text = TakeAdapterString(out);
  nlohmann::json parsed = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded() || !parsed.is_object() || !parsed["columns"].is_array())
    return Internal("schema of " + uri_ + " is not the adapter's JSON: " + text);
  return parsed;
}

Result<std::pair<int64_t, int64_t>> DeltaTable::Optimize(uint64_t target_bytes) {
  OmlStorageError err{};
  int64_t removed = 0, added = 0;
  int32_t rc = oml_storage_delta_optimize(handle_, target_bytes, &removed, &added, &err);
  if (rc != OML_STORAGE_OK) return FromStorageError(rc, err, "optimize " + uri_);
  return std::make_pair(removed, added);
}

Result<int64_t> DeltaTable::Checkpoint() const {
  OmlStorageError err{};
  int64_t version = -1;
  int32_t rc = oml_storage_delta_checkpoint(handle_, &version, &err);
  if (rc != OML_STORAGE_OK) return FromStorageError(rc, err, "checkpoint " + uri_);
  return version;
}

Result<int64_t> DeltaTable::Vacuum(int64_t retention_hours) {
  OmlStorageError err{};
  int64_t deleted = 0;
  int32_t rc = oml_storage_delta_vacuum(handle_, retention_hours, &deleted, &err);
  if (rc != OML_STORAGE_OK) return FromStorageError(rc, err, "vacuum " + uri_);
  return deleted;
}

namespace {

Status SchemaMismatch(const std::string& uri, int64_t version, const Column* want, size_t n) {
  std::string detail;
  auto table = DeltaTable::Open(uri);
  auto got = table.ok() ? table->Schema() : Result<nlohmann::json>(table.status());
  if (got.ok()) {
    const nlohmann::json& cols = (*got)["columns"];
    std::vector<std::string> missing, extra, differ;
    for (size_t i = 0; i < n; ++i) {
      size_t j = 0;
      while (j < cols.size() && cols[j].value("name", "") != want[i].name) ++j;
      if (j == cols.size()) {
        missing.push_back(want[i].name);
      } else if (cols[j].value("type", "") != want[i].type || cols[j].value("nullable", true) != want[i].nullable ||
                 j != i) {
        differ.push_back(std::string(want[i].name) + " (is " + cols[j].value("type", "") +
                         (cols[j].value("nullable", true) ? " nullable" : " not null") + " at position " +
                         std::to_string(j + 1) + "; want " + want[i].type +
                         (want[i].nullable ? " nullable" : " not null") + " at position " + std::to_string(i + 1) +
                         ")");
      }
    }
    for (const auto& c : cols) {
      bool known = false;
      for (size_t i = 0; i < n && !known; ++i) known = c.value("name", "") == want[i].name;
      if (!known) extra.push_back(c.value("name", ""));
    }
    auto join = [](const std::vector<std::string>& v) {
      std::string out;
      for (const auto& s : v) out += (out.empty() ? "" : ", ") + s;
      return out;
    };
    if (!missing.empty()) detail += "; missing columns: " + join(missing);
    if (!extra.empty()) detail += "; unknown columns: " + join(extra);
    if (!differ.empty()) detail += "; differing columns: " + join(differ);
    if (!(*got)["partition_columns"].empty()) detail += "; partitioned by " + (*got)["partition_columns"].dump() + ", want none";
  } else {
    detail = "; its schema cannot be read: " + got.status().message();
  }
  const std::string fix =
      version == 0 ? ". It holds no rows (version 0): remove " + uri + " and run `oml init` again"
                   : ". It has commits (version " + std::to_string(version) +
                         "): move it aside (keep it until the new table is filled), remove it from " + uri +
                         ", run `oml init`, and let the lake writer fill the new table";
  return FailedPrecondition("Delta table " + uri + " (version " + std::to_string(version) +
                                ") exists with a schema other than this oml's bronze.events" + detail + fix,
                            "lake-schema-mismatch");
}

}  // namespace

}  // namespace oml::lake
