#include "lake/delta_tables.h"
#include "common/sync_point_testing.h"
#include "common/temp_dir_testing.h"
#include "lake/compactor.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "oml_storage.h"

namespace oml::lake {
namespace {

namespace fs = std::filesystem;

class DeltaTablesTest : public ::testing::Test {
 protected:
  oml::testing::ScopedTempDir tmp_{"oml-lake-test"};
  const fs::path root_ = tmp_.path();
};

TEST_F(DeltaTablesTest, CreatesBronzeEventsAtVersionZero) {
  const fs::path lake = root_ / "lake";  // does not exist yet
  Status st = EnsureBronzeEvents(lake.string());
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_TRUE(fs::is_regular_file(lake / "bronze" / "events" / "_delta_log" /
                                  "00000000000000000000.json"));
  auto v = TableVersion((lake / "bronze" / "events").string());
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(*v, 0);

  // The commit records the table name and every column.
  std::ifstream in(lake / "bronze" / "events" / "_delta_log" / "00000000000000000000.json");
  std::string log((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(log.find("\"name\":\"bronze.events\""), std::string::npos) << log;
  for (const char* col : {"tenant_id", "seq", "prev_hash", "event_hash", "event_type", "key_id",
                          "principal", "occurred_at", "artifact_id", "version", "workarea_id", "path",
                          "provenance", "simulation_id", "plaintext_sha256", "ciphertext_sha256",
                          "signed_bytes", "signature", "outbox_seq"}) {
    EXPECT_NE(log.find(std::string("\\\"") + col + "\\\""), std::string::npos) << col;
  }
}

TEST_F(DeltaTablesTest, Idempotent) {
  ASSERT_TRUE(EnsureBronzeEvents(root_.string()).ok());
  Status again = EnsureBronzeEvents(root_.string() + "/");  // trailing slash: same table
  ASSERT_TRUE(again.ok()) << again.ToString();
  auto v = TableVersion(root_.string() + "/bronze/events");
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(*v, 0);
}

TEST_F(DeltaTablesTest, FileUrlRoot) {
  ASSERT_TRUE(EnsureBronzeEvents("file://" + root_.string()).ok());
  auto v = TableVersion("file://" + root_.string() + "/bronze/events");
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(*v, 0);
}

TEST_F(DeltaTablesTest, TableVersionOnEmptyDirIsNotFound) {
  auto v = TableVersion(root_.string());
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.status().code(), Code::kNotFound) << v.status().ToString();

  auto missing = TableVersion((root_ / "does-not-exist").string());
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), Code::kNotFound) << missing.status().ToString();
}

TEST_F(DeltaTablesTest, DifferentExistingSchemaIsFailedPrecondition) {
  const std::string uri = (root_ / "bronze" / "events").string();
  OmlStorageError err{};
  int64_t version = -1;
  int32_t created = 0, matches = 0;
  ASSERT_EQ(oml_storage_delta_create_table(uri.c_str(),
                                           R"([{"name":"tenant_id","type":"string","nullable":false}])",
                                           nullptr, nullptr, &version, &created, &matches, &err),
            OML_STORAGE_OK)
      << (err.message ? err.message : "");
  EXPECT_EQ(created, 1);
  EXPECT_EQ(version, 0);
  Status st = EnsureBronzeEvents(root_.string());
  EXPECT_EQ(st.code(), Code::kFailedPrecondition) << st.ToString();
  EXPECT_EQ(st.type(), "lake-schema-mismatch");
  EXPECT_NE(st.message().find("missing columns: seq, prev_hash, event_hash"), std::string::npos) << st.message();
}

// A table created by an oml before the payload columns (11 columns): refused, naming the eight
// missing columns, the columns that moved, and the fix; left at version 0, unaltered.
TEST_F(DeltaTablesTest, TableOfTheOlderSchemaIsRefusedNamingTheMissingColumns) {
  const std::string uri = (root_ / "bronze" / "events").string();
  OmlStorageError err{};
  int64_t version = -1;
  int32_t created = 0, matches = 0;
  ASSERT_EQ(oml_storage_delta_create_table(uri.c_str(), R"([
      {"name":"tenant_id","type":"string","nullable":false}, {"name":"seq","type":"long","nullable":false},
      {"name":"prev_hash","type":"string","nullable":false}, {"name":"event_hash","type":"string","nullable":false},
      {"name":"event_type","type":"string","nullable":false}, {"name":"key_id","type":"string","nullable":false},
      {"name":"principal","type":"string","nullable":true}, {"name":"occurred_at","type":"timestamp","nullable":false},
      {"name":"signed_bytes","type":"binary","nullable":false}, {"name":"signature","type":"binary","nullable":false},
      {"name":"outbox_seq","type":"long","nullable":false}])",
                                           nullptr, "bronze.events", &version, &created, &matches, &err),
            OML_STORAGE_OK)
      << (err.message ? err.message : "");
  Status st = EnsureBronzeEvents(root_.string());
  ASSERT_EQ(st.code(), Code::kFailedPrecondition) << st.ToString();
  EXPECT_EQ(st.type(), "lake-schema-mismatch");
  const std::string& m = st.message();
  EXPECT_NE(m.find("missing columns: artifact_id, version, workarea_id, path, provenance, simulation_id, "
                   "plaintext_sha256, ciphertext_sha256;"),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("signed_bytes (is binary not null at position 9; want binary not null at position 17)"),
            std::string::npos)
      << m;
  EXPECT_EQ(m.find("unknown columns"), std::string::npos) << m;
  EXPECT_NE(m.find("It holds no rows (version 0): remove " + uri + " and run `oml init` again"), std::string::npos) << m;
  auto v = TableVersion(uri);
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(*v, 0);
  auto t = DeltaTable::Open(uri);
  ASSERT_TRUE(t.ok());
  auto schema = t->Schema();
  ASSERT_TRUE(schema.ok()) << schema.status().ToString();
  EXPECT_EQ((*schema)["columns"].size(), 11u);
  EXPECT_EQ((*schema)["columns"][7], (nlohmann::json{{"name", "occurred_at"}, {"type", "timestamp"}, {"nullable", false}}));
  EXPECT_EQ((*schema)["partition_columns"], nlohmann::json::array());
}

TEST(DeltaStorageAbiTest, BadSchemaIsInvalidArgument) {
  OmlStorageError err{};
  int64_t version = -1;
  int32_t created = 0, matches = 0;
  int32_t rc = oml_storage_delta_create_table("/tmp/oml-never-created", R"([{"name":"x","type":"decimal"}])",
                                              nullptr, nullptr, &version, &created, &matches, &err);
  EXPECT_EQ(rc, OML_STORAGE_INVALID_ARGUMENT);
  EXPECT_EQ(err.code, OML_STORAGE_INVALID_ARGUMENT);
  ASSERT_NE(err.message, nullptr);
  oml_storage_free_string(err.message);
  EXPECT_FALSE(std::filesystem::exists("/tmp/oml-never-created"));
}

// ---- DeltaTable: the lake writer's operations -------------------------------------------

constexpr const char* kApp = "oml-lakewriter";

// A claims-like table: key (artifact_id, version); state and seq change on retracts.
constexpr const char* kTestSchema = R"([
  {"name":"artifact_id","type":"string","nullable":false},
  {"name":"version","type":"long","nullable":false},
  {"name":"state","type":"string","nullable":false},
  {"name":"path","type":"string","nullable":true},
  {"name":"seq","type":"long","nullable":false},
  {"name":"digest","type":"binary","nullable":true},
  {"name":"at","type":"timestamp","nullable":true}])";

std::string Row(const std::string& artifact, int64_t version, const std::string& state,
                const std::string& path, int64_t seq) {
  return nlohmann::json{{"artifact_id", artifact}, {"version", version}, {"state", state},
                        {"path", path},          {"seq", seq},         {"digest", "AP8Q"},
                        {"at", "2025-01-02T03:04:05.123456Z"}}
             .dump() +
         "\n";
}

TxnCommit Txn(int64_t start, int64_t end) {
  return TxnCommit{kApp, end,
                   {{"oml.batch_start", start}, {"oml.batch_end", end}, {"oml.stream", "main"}}};
}

// The actions of one commit file, in order.
std::vector<nlohmann::json> LogActions(const fs::path& table, int64_t version) {
  char name[32];
  std::snprintf(name, sizeof(name), "%020lld.json", static_cast<long long>(version));
  std::ifstream in(table / "_delta_log" / name);
  std::vector<nlohmann::json> out;
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty()) out.push_back(nlohmann::json::parse(line));
  }
  return out;
}

int CountActions(const std::vector<nlohmann::json>& actions, const char* kind) {
  return static_cast<int>(std::count_if(actions.begin(), actions.end(),
                                        [&](const nlohmann::json& a) { return a.contains(kind); }));
}

class DeltaAdapterTest : public ::testing::Test {
 protected:
  // Creates an empty table with kTestSchema at <tmp>/<name> and returns its path.
  fs::path MakeTable(const std::string& name, const fs::path& root = {}) {
    const fs::path dir = (root.empty() ? root_ : root) / name;
    OmlStorageError err{};
    int64_t version = -1;
    int32_t created = 0, matches = 0;
    EXPECT_EQ(oml_storage_delta_create_table(dir.c_str(), kTestSchema, nullptr, "test.claims",
                                             &version, &created, &matches, &err),
              OML_STORAGE_OK)
        << (err.message ? err.message : "");
    EXPECT_EQ(created, 1);
    return dir;
  }

  static DeltaTable OpenOrDie(const fs::path& dir) {
    auto t = DeltaTable::Open(dir.string());
    EXPECT_TRUE(t.ok()) << t.status().ToString();
    if (!t.ok()) std::abort();
    return std::move(t).value();
  }

  // Rows sorted by (artifact_id, version).
  static std::vector<nlohmann::json> Rows(const DeltaTable& t) {
    auto text = t.ReadRowsJsonl();
    EXPECT_TRUE(text.ok()) << text.status().ToString();
    std::vector<nlohmann::json> rows;
    if (!text.ok()) return rows;
    size_t pos = 0;
    while (pos < text->size()) {
      size_t nl = text->find('\n', pos);
      if (nl == std::string::npos) nl = text->size();
      if (nl > pos) rows.push_back(nlohmann::json::parse(text->substr(pos, nl - pos)));
      pos = nl + 1;
    }
    std::sort(rows.begin(), rows.end(), [](const nlohmann::json& a, const nlohmann::json& b) {
      return std::make_pair(a["artifact_id"].get<std::string>(), a["version"].get<int64_t>()) <
             std::make_pair(b["artifact_id"].get<std::string>(), b["version"].get<int64_t>());
    });
    return rows;
  }

  oml::testing::ScopedTempDir tmp_{"oml-lake-adapter"};
  const fs::path root_ = tmp_.path();
};

TEST_F(DeltaAdapterTest, AppendCommitsRowsTxnAndMetadataTogether) {
  const fs::path dir = MakeTable("t");
  DeltaTable t = OpenOrDie(dir);
  auto none = t.ReadLastTxn(kApp);
  ASSERT_TRUE(none.ok()) << none.status().ToString();
  EXPECT_EQ(none->version, -1);
  EXPECT_FALSE(none->commit_version.has_value());
  EXPECT_FALSE(none->metadata.has_value());

  auto v = t.Append(Row("a", 1, "promoted", "/x", 3) + Row("b", 1, "promoted", "/y", 5), Txn(0, 5));
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(*v, 1);
  EXPECT_EQ(*t.SnapshotVersion(), 1);

  // One commit file holds the rows (add), the txn and the metadata.
  const auto actions = LogActions(dir, 1);
  EXPECT_EQ(CountActions(actions, "txn"), 1);
  EXPECT_EQ(CountActions(actions, "commitInfo"), 1);
  EXPECT_GE(CountActions(actions, "add"), 1);
  for (const auto& a : actions) {
    if (a.contains("txn")) {
      EXPECT_EQ(a["txn"]["appId"], kApp);
      EXPECT_EQ(a["txn"]["version"], 5);
      EXPECT_FALSE(a["txn"].contains("lastUpdated")) << a.dump();
    }
    if (a.contains("commitInfo")) {
      EXPECT_EQ(a["commitInfo"]["oml.batch_start"], 0);
      EXPECT_EQ(a["commitInfo"]["oml.batch_end"], 5);
      EXPECT_EQ(a["commitInfo"]["oml.stream"], "main");
    }
  }

  // Read back through this handle and through a fresh one.
  for (int fresh = 0; fresh < 2; ++fresh) {
    DeltaTable other = OpenOrDie(dir);
    const DeltaTable& h = fresh ? other : t;
    auto last = h.ReadLastTxn(kApp);
    ASSERT_TRUE(last.ok()) << last.status().ToString();
    EXPECT_EQ(last->version, 5);
    EXPECT_EQ(last->commit_version, 1);
    ASSERT_TRUE(last->metadata.has_value());
    EXPECT_EQ(*last->metadata, Txn(0, 5).metadata);
    auto other_app = h.ReadLastTxn("oml-lakewriter-shard2");
    ASSERT_TRUE(other_app.ok());
    EXPECT_EQ(other_app->version, -1);
  }

  const auto rows = Rows(t);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0]["artifact_id"], "a");
  EXPECT_EQ(rows[0]["seq"], 3);
  EXPECT_EQ(rows[0]["digest"], "00ff10");  // binary round-trips as hex
  EXPECT_EQ(rows[1]["path"], "/y");

  // A second batch moves the txn; the metadata read is that batch's.
  auto v2 = t.Append(Row("c", 1, "promoted", "/z", 9), Txn(5, 9));
  ASSERT_TRUE(v2.ok()) << v2.status().ToString();
  EXPECT_EQ(*v2, 2);
  auto last = t.ReadLastTxn(kApp);
  ASSERT_TRUE(last.ok());
  EXPECT_EQ(last->version, 9);
  EXPECT_EQ(last->commit_version, 2);
  EXPECT_EQ((*last->metadata)["oml.batch_start"], 5);
  EXPECT_EQ(Rows(t).size(), 3u);
}

// Issue 20: the column scan `oml reconcile` reads bronze through: every row of the snapshot's
// files (or of the files named) in the columns and types asked for, with nulls, a file listing
// that says what the store holds, and a damaged or missing file named rather than skipped.
TEST_F(DeltaAdapterTest, ColumnScanReadsTheSnapshotOrTheNamedFilesAndNamesADamagedFile) {
  const fs::path dir = MakeTable("scan");
  DeltaTable t = OpenOrDie(dir);
  ASSERT_TRUE(t.Append(Row("a", 1, "promoted", "/x", 3) + Row("b", 2, "held", "/y", 5), Txn(0, 5)).ok());
  std::string nullpath = nlohmann::json{{"artifact_id", "c"}, {"version", 7}, {"state", "held"}, {"path", nullptr},
                                        {"seq", 9}, {"digest", nullptr}, {"at", nullptr}}.dump() + "\n";
  ASSERT_TRUE(t.Append(nullpath, Txn(5, 9)).ok());

  auto files = t.Files();
  ASSERT_TRUE(files.ok()) << files.status().ToString();
  ASSERT_EQ(files->size(), 2u);
  int64_t records = 0;
  for (const DataFile& f : *files) {
    EXPECT_EQ(f.stored_size, f.size) << f.path;
    EXPECT_TRUE(f.stored_modified_ms.has_value());
    ASSERT_TRUE(f.num_records.has_value());
    records += *f.num_records;
  }
  EXPECT_EQ(records, 3);

  using T = ArrowColumnType;
  const std::vector<ArrowColumnSpec> cols = {
      {"seq", T::kLong}, {"artifact_id", T::kString}, {"path", T::kString}, {"digest", T::kBinary}, {"at", T::kTimestamp}};
  auto read = [&](const std::vector<std::string>* only) {
    std::map<int64_t, std::tuple<std::string, std::string, std::string, int64_t, bool>> out;  // seq -> values
    auto scan = t.Scan(cols, only);
    EXPECT_TRUE(scan.ok()) << scan.status().ToString();
    if (!scan.ok()) return out;
    ArrowBatchView b;
    for (;;) {
      auto more = scan->Next(&b);
      EXPECT_TRUE(more.ok()) << more.status().ToString();
      if (!more.ok() || !*more) break;
      EXPECT_EQ(b.num_columns(), 5);
      for (int64_t i = 0; i < b.num_rows(); ++i)
        out[b.Int64(0, i)] = {std::string(b.Bytes(1, i)), b.IsNull(2, i) ? "<null>" : std::string(b.Bytes(2, i)),
                              std::string(b.Bytes(3, i)), b.Int64(4, i), b.IsNull(4, i)};
    }
    return out;
  };
  auto all = read(nullptr);
  ASSERT_EQ(all.size(), 3u);
  EXPECT_EQ(all[3], std::make_tuple(std::string("a"), std::string("/x"), std::string("\x00\xff\x10", 3),
                                    int64_t{1735787045123456}, false));
  EXPECT_EQ(all[5], std::make_tuple(std::string("b"), std::string("/y"), std::string("\x00\xff\x10", 3),
                                    int64_t{1735787045123456}, false));
  EXPECT_EQ(all[9], std::make_tuple(std::string("c"), std::string("<null>"), std::string(), int64_t{0}, true));

  // Only the second commit's file.
  std::string second;
  for (const DataFile& f : *files)
    if (f.num_records == 1) second = f.path;
  const std::vector<std::string> only = {second};
  auto one = read(&only);
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one.begin()->first, 9);

  // Refused: a file not in the snapshot, an unknown column, a column asked for with another type.
  const std::vector<std::string> stranger = {"part-nope.parquet"};
  EXPECT_EQ(t.Scan(cols, &stranger).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(t.Scan({{"nope", T::kString}}).status().code(), Code::kInvalidArgument);
  {
    auto scan = t.Scan({{"seq", T::kString}});
    ASSERT_TRUE(scan.ok()) << scan.status().ToString();
    ArrowBatchView b;
    EXPECT_EQ(scan->Next(&b).status().code(), Code::kInvalidArgument);  // "l" handed over, "u" expected
  }

  // A torn file: named, kDataLoss "lake-file-damaged"; the listing shows its size changed.
  {
    const fs::path victim = dir / second;
    const auto size = fs::file_size(victim);
    fs::resize_file(victim, size / 2);
    auto listed = t.Files();
    ASSERT_TRUE(listed.ok());
    for (const DataFile& f : *listed) {
      if (f.path == second) {
        EXPECT_EQ(f.stored_size, static_cast<int64_t>(size / 2));
      }
    }
    auto scan = t.Scan(cols, &only);
    ASSERT_TRUE(scan.ok()) << scan.status().ToString();
    ArrowBatchView b;
    auto r = scan->Next(&b);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), Code::kDataLoss);
    EXPECT_EQ(r.status().type(), "lake-file-damaged");
    EXPECT_NE(r.status().message().find("data file " + second + ":"), std::string::npos) << r.status().message();
    // Gone: kNotFound naming it.
    fs::remove(victim);
    auto gone = t.Scan(cols, &only);
    ASSERT_TRUE(gone.ok());
    auto g = gone->Next(&b);
    ASSERT_FALSE(g.ok());
    EXPECT_EQ(g.status().code(), Code::kNotFound);
    EXPECT_NE(g.status().message().find("data file " + second + " is missing"), std::string::npos)
        << g.status().message();
    auto after = t.Files();
    ASSERT_TRUE(after.ok());
    for (const DataFile& f : *after) {
      if (f.path == second) {
        EXPECT_FALSE(f.stored_size.has_value());
      }
    }
    // SnapshotFiles: the same paths, sizes and record counts from the log alone (no listing:
    // nothing about the store, the missing file included).
    auto logged = t.SnapshotFiles();
    ASSERT_TRUE(logged.ok());
    ASSERT_EQ(logged->size(), after->size());
    for (size_t i = 0; i < after->size(); ++i) {
      EXPECT_EQ((*logged)[i].path, (*after)[i].path);
      EXPECT_EQ((*logged)[i].size, (*after)[i].size);
      EXPECT_EQ((*logged)[i].num_records, (*after)[i].num_records);
      EXPECT_FALSE((*logged)[i].stored_size.has_value());
      EXPECT_FALSE((*logged)[i].stored_modified_ms.has_value());
    }
  }
}

// Issue 18: a local table's commit returns only after its data files and its commit file are on
// disk, with the directory entries that name them (rust/oml-storage/src/durable_local.rs): each
// file (its staging copy, before it is linked into place) and its directory, which exist already
// here: two fsyncs per data file, two for the commit.
TEST_F(DeltaAdapterTest, ALocalCommitIsFsyncedBeforeItReturns) {
  const fs::path dir = MakeTable("t");
  DeltaTable t = OpenOrDie(dir);
  const uint64_t before = oml_storage_durable_syncs();
  auto v = t.Append(Row("a", 1, "promoted", "/x", 3) + Row("b", 1, "promoted", "/y", 5), Txn(0, 5));
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  const int64_t adds = CountActions(LogActions(dir, *v), "add");
  ASSERT_GE(adds, 1);
  EXPECT_EQ(oml_storage_durable_syncs() - before, static_cast<uint64_t>(2 * adds + 2));
}

// A commit's cost must not grow with the log's length: delta-rs 1.1 ran its expired-log cleanup,
// which lists the whole `_delta_log`, after every commit (at a batch every 150 ms that log holds
// millions of files within its 30-day retention). Appends past a checkpoint and MERGEs list it
// never; an OPTIMIZE once (delta-rs's own cleanup: it takes only the app metadata from its
// commit properties); the VACUUM round cleans it (upkeep), even when it deletes nothing.
TEST_F(DeltaAdapterTest, BatchCommitsNeverListTheWholeLogAndVacuumStillCleansIt) {
  const fs::path dir = MakeTable("t");
  DeltaTable t = OpenOrDie(dir);
  const uint64_t before = oml_storage_durable_log_lists();
  int64_t seq = 0;
  for (int i = 0; i < 12; ++i) {  // past the checkpoint delta-rs writes at version 9
    auto v = t.Append(Row("a" + std::to_string(i), 1, "promoted", "/x", seq + 1), Txn(seq, seq + 1));
    ASSERT_TRUE(v.ok()) << v.status().ToString();
    ++seq;
  }
  EXPECT_TRUE(fs::exists(dir / "_delta_log" / "00000000000000000009.checkpoint.parquet"));
  const MergeSpec spec{{"artifact_id", "version"}, std::vector<std::string>{"state", "seq"}};
  for (int i = 0; i < 2; ++i) {
    auto v = t.Merge(Row("a1", 1, "demoted", "/y", seq + 1), spec, Txn(seq, seq + 1));
    ASSERT_TRUE(v.ok()) << v.status().ToString();
    ++seq;
  }
  EXPECT_EQ(oml_storage_durable_log_lists() - before, 0u);

  auto optimized = t.Optimize(uint64_t{64} << 20);
  ASSERT_TRUE(optimized.ok()) << optimized.status().ToString();
  EXPECT_GE(optimized->first, 2);  // it rewrote files: one commit
  EXPECT_EQ(oml_storage_durable_log_lists() - before, 1u);

  auto deleted = t.Vacuum(0);
  ASSERT_TRUE(deleted.ok()) << deleted.status().ToString();
  EXPECT_GE(*deleted, 2);  // the files the MERGEs and the OPTIMIZE replaced
  // VACUUM's two commits (START, END): delta-rs cleans after each; the adapter adds none.
  EXPECT_EQ(oml_storage_durable_log_lists() - before, 3u);
  // Nothing is older than the 30-day retention: every commit below the checkpoint stays.
  for (int v = 0; v <= 8; ++v) {
    char name[32];
    std::snprintf(name, sizeof name, "%020d.json", v);
    EXPECT_TRUE(fs::exists(dir / "_delta_log" / name)) << v;
  }

  // An append-only table gives VACUUM nothing to delete, so it commits nothing: the adapter's
  // cleanup still cleans its log, every round. Commits 0..8 are made older than the 30-day
  // log retention (a local store's last_modified is the file's mtime): they lie below the
  // checkpoint at 9 and go; the rest stays, and the table reads the same.
  const fs::path only_appends = MakeTable("appends");
  DeltaTable a = OpenOrDie(only_appends);
  for (int64_t i = 0; i < 12; ++i)
    ASSERT_TRUE(a.Append(Row("x" + std::to_string(i), 1, "promoted", "/x", i + 1), Txn(i, i + 1)).ok());
  const auto log_file = [&](int64_t v, const char* ext) {
    char name[64];
    std::snprintf(name, sizeof name, "%020lld.%s", static_cast<long long>(v), ext);
    return only_appends / "_delta_log" / name;
  };
  const auto age = [&](int64_t from, int64_t to) {
    for (int64_t v = from; v <= to; ++v)
      fs::last_write_time(log_file(v, "json"), fs::file_time_type::clock::now() - std::chrono::hours(24 * 40));
  };
  // Only 0..4 expired: the newest commit still within the retention is 5, and no checkpoint lies
  // at or below it, so nothing can go (a reader of version 5 replays 0..5).
  age(0, 4);
  const uint64_t before_vacuum = oml_storage_durable_log_lists();
  auto none = a.Vacuum(0);
  ASSERT_TRUE(none.ok()) << none.status().ToString();
  EXPECT_EQ(*none, 0);
  EXPECT_EQ(oml_storage_durable_log_lists() - before_vacuum, 1u);  // the adapter's cleanup
  for (int64_t v = 0; v <= 12; ++v) EXPECT_TRUE(fs::exists(log_file(v, "json"))) << v;
  // 0..8 expired: they lie below the checkpoint at 9 and go.
  age(5, 8);
  auto again = a.Vacuum(0);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(*again, 0);
  for (int64_t v = 0; v <= 8; ++v) EXPECT_FALSE(fs::exists(log_file(v, "json"))) << v;
  for (int64_t v = 9; v <= 12; ++v) EXPECT_TRUE(fs::exists(log_file(v, "json"))) << v;
  EXPECT_TRUE(fs::exists(log_file(9, "checkpoint.parquet")));
  DeltaTable reopened = OpenOrDie(only_appends);
  EXPECT_EQ(Rows(reopened).size(), 12u);
}

// Two cleanups of one log at once (production: the compactor's OPTIMIZE on its thread and the
// VACUUM round on the writer's, or a second writer process's upkeep): each may find a file the
// other already deleted. Both VACUUMs return OK, and the expired commits go exactly once.
TEST_F(DeltaAdapterTest, TwoVacuumsCleaningOneLogAtOnceBothSucceed) {
  for (int round = 0; round < 10; ++round) {
    const fs::path dir = MakeTable("race" + std::to_string(round));
    DeltaTable first = OpenOrDie(dir);
    for (int64_t i = 0; i < 12; ++i)
      ASSERT_TRUE(first.Append(Row("r" + std::to_string(i), 1, "promoted", "/r", i + 1), Txn(i, i + 1)).ok());
    for (int v = 0; v <= 8; ++v) {
      char name[32];
      std::snprintf(name, sizeof name, "%020d.json", v);
      fs::last_write_time(dir / "_delta_log" / name, fs::file_time_type::clock::now() - std::chrono::hours(24 * 40));
    }
    DeltaTable second = OpenOrDie(dir);
    std::optional<Result<int64_t>> b;
    std::thread other([&] { b = second.Vacuum(0); });
    Result<int64_t> a = first.Vacuum(0);
    other.join();
    ASSERT_TRUE(a.ok()) << round << ": " << a.status().ToString();
    ASSERT_TRUE(b->ok()) << round << ": " << b->status().ToString();
    for (int v = 0; v <= 12; ++v) {
      char name[32];
      std::snprintf(name, sizeof name, "%020d.json", v);
      EXPECT_EQ(fs::exists(dir / "_delta_log" / name), v >= 9) << round << ": " << v;
    }
    DeltaTable reopened = OpenOrDie(dir);
    EXPECT_EQ(Rows(reopened).size(), 12u) << round;
  }
}

// `oml lake rebuild` (lake/rebuild.h): one commit removes every file and moves the stream's txn
// back to 0, read back as 0 by a refreshed handle and a fresh one; it never lands over a commit
// it did not see.
TEST_F(DeltaAdapterTest, TruncateEmptiesTheTableAndMovesTheTxnBack) {
  const fs::path dir = MakeTable("t");
  DeltaTable t = OpenOrDie(dir);
  DeltaTable other = OpenOrDie(dir);
  ASSERT_TRUE(t.Append(Row("a", 1, "promoted", "/x", 3), Txn(0, 5)).ok());
  ASSERT_TRUE(t.Append(Row("b", 1, "promoted", "/y", 7), Txn(5, 9)).ok());
  // A stale handle cannot empty the table over commits it did not see.
  auto stale = other.Truncate(Txn(0, 0));
  ASSERT_FALSE(stale.ok());
  EXPECT_EQ(stale.status().type(), "lake-commit-conflict") << stale.status().ToString();
  ASSERT_TRUE(other.Refresh().ok());
  auto v = other.Truncate(Txn(0, 0));
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(*v, 3);
  EXPECT_TRUE(Rows(other).empty());
  EXPECT_EQ(CountActions(LogActions(dir, 3), "remove"), 2);
  for (int fresh = 0; fresh < 2; ++fresh) {
    DeltaTable reopened = OpenOrDie(dir);
    DeltaTable& h = fresh ? reopened : t;
    if (!fresh) {
      ASSERT_EQ(*h.Refresh(), 3);  // the incremental refresh reads the txn moved back too
    }
    auto last = h.ReadLastTxn(kApp);
    ASSERT_TRUE(last.ok()) << last.status().ToString();
    EXPECT_EQ(last->version, 0) << "fresh " << fresh;
    EXPECT_EQ(last->commit_version, 3) << "fresh " << fresh;
    EXPECT_TRUE(Rows(h).empty());
  }
  // An empty table commits too: the txn moves back even with no file to remove.
  DeltaTable e = OpenOrDie(MakeTable("empty"));
  ASSERT_TRUE(e.Append(Row("a", 1, "promoted", "/x", 3), Txn(0, 5)).ok());
  ASSERT_EQ(*e.Truncate(Txn(0, 0)), 2);
  ASSERT_EQ(*e.Truncate(Txn(0, 0)), 3);
  EXPECT_EQ(e.ReadLastTxn(kApp)->version, 0);
}

TEST_F(DeltaAdapterTest, StaleSnapshotCommitIsAConflictAndCommitsNothing) {
  const fs::path dir = MakeTable("t");
  DeltaTable first = OpenOrDie(dir);
  DeltaTable second = OpenOrDie(dir);  // same snapshot, version 0

  ASSERT_EQ(*first.Append(Row("a", 1, "promoted", "/x", 5), Txn(0, 5)), 1);

  // The second writer read version 0 (txn -1) and now tries the same batch: fenced.
  auto lost = second.Append(Row("a", 1, "promoted", "/x", 5), Txn(0, 5));
  ASSERT_FALSE(lost.ok());
  EXPECT_EQ(lost.status().code(), Code::kAborted) << lost.status().ToString();
  EXPECT_EQ(lost.status().type(), "lake-commit-conflict");
  EXPECT_EQ(*second.SnapshotVersion(), 0);  // left where it was
  auto lost_merge = second.Merge(Row("a", 1, "demoted", "/x", 6), {{"artifact_id", "version"}, std::nullopt},
                                 Txn(5, 6));
  ASSERT_FALSE(lost_merge.ok());
  EXPECT_EQ(lost_merge.status().type(), "lake-commit-conflict") << lost_merge.status().ToString();
  EXPECT_FALSE(fs::exists(dir / "_delta_log" / "00000000000000000002.json"));
  EXPECT_EQ(*TableVersion(dir.string()), 1);

  // Refresh, re-check: the batch is already applied (5 <= 5); the row is there once.
  ASSERT_EQ(*second.Refresh(), 1);
  EXPECT_EQ(second.ReadLastTxn(kApp)->version, 5);
  EXPECT_EQ(Rows(second).size(), 1u);
  // The next batch then commits from the refreshed snapshot.
  auto next = second.Append(Row("b", 1, "promoted", "/y", 8), Txn(5, 8));
  ASSERT_TRUE(next.ok()) << next.status().ToString();
  EXPECT_EQ(*next, 2);

  // Any newer commit fences, not only one with the same appId: delta-rs would otherwise check
  // two blind appends of different apps for conflicts, find none, and rebase.
  DeltaTable stale = OpenOrDie(dir);  // version 2
  auto other_app = second.Append(Row("x", 1, "promoted", "/o", 1),
                                 TxnCommit{"some-other-app", 1, nlohmann::json::object()});
  ASSERT_TRUE(other_app.ok()) << other_app.status().ToString();
  auto fenced = stale.Append(Row("c", 1, "promoted", "/z", 9), Txn(8, 9));
  ASSERT_FALSE(fenced.ok());
  EXPECT_EQ(fenced.status().type(), "lake-commit-conflict") << fenced.status().ToString();
  EXPECT_EQ(*TableVersion(dir.string()), 3);
}

TEST_F(DeltaAdapterTest, RacingWritersExactlyOneCommitsEachVersion) {
  const fs::path dir = MakeTable("t");
  constexpr int kRounds = 6;
  for (int round = 0; round < kRounds; ++round) {
    DeltaTable a = OpenOrDie(dir);
    DeltaTable b = OpenOrDie(dir);
    std::atomic<int> ready{0};
    Status sa, sb;
    auto run = [&](DeltaTable& t, Status& out, const std::string& who) {
      ready.fetch_add(1);
      while (ready.load() < 2) std::this_thread::yield();
      auto r = t.Append(Row(who + std::to_string(round), 1, "promoted", "/p", round + 1),
                        Txn(round, round + 1));
      out = r.status();
    };
    std::thread ta(run, std::ref(a), std::ref(sa), "a");
    std::thread tb(run, std::ref(b), std::ref(sb), "b");
    ta.join();
    tb.join();
    EXPECT_NE(sa.ok(), sb.ok()) << "round " << round << ": " << sa.ToString() << " / " << sb.ToString();
    const Status& loser = sa.ok() ? sb : sa;
    EXPECT_EQ(loser.type(), "lake-commit-conflict") << loser.ToString();
  }
  DeltaTable t = OpenOrDie(dir);
  EXPECT_EQ(*t.SnapshotVersion(), kRounds);
  EXPECT_EQ(Rows(t).size(), static_cast<size_t>(kRounds));
  EXPECT_EQ(t.ReadLastTxn(kApp)->version, kRounds);
}

TEST_F(DeltaAdapterTest, RowsOrMetadataThatDoNotFitCommitNothing) {
  const fs::path dir = MakeTable("t");
  DeltaTable t = OpenOrDie(dir);
  const std::string good = Row("a", 1, "promoted", "/x", 1);
  struct Case {
    const char* what;
    std::string rows;
    TxnCommit commit;
  } cases[] = {
      {"unknown column", R"({"artifact_id":"a","version":1,"state":"s","seq":1,"bogus":1})" "\n", Txn(0, 1)},
      {"missing non-null column", R"({"artifact_id":"a","version":1,"seq":1})" "\n", Txn(0, 1)},
      {"wrong type", R"({"artifact_id":"a","version":"one","state":"s","seq":1})" "\n", Txn(0, 1)},
      {"binary not base64", R"({"artifact_id":"a","version":1,"state":"s","seq":1,"digest":"zz"})" "\n", Txn(0, 1)},
      {"truncated JSON", good.substr(0, good.size() / 2), Txn(0, 1)},
      {"no rows", "", Txn(0, 1)},
      {"metadata key without oml.", good, TxnCommit{kApp, 1, {{"batch_end", 1}}}},
      {"metadata not an object", good, TxnCommit{kApp, 1, nlohmann::json::array({1})}},
      {"empty app id", good, TxnCommit{"", 1, nlohmann::json::object()}},
      {"negative txn version", good, TxnCommit{kApp, -2, nlohmann::json::object()}},
  };
  for (const auto& c : cases) {
    auto r = t.Append(c.rows, c.commit);
    ASSERT_FALSE(r.ok()) << c.what;
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument) << c.what << ": " << r.status().ToString();
  }
  auto bad_key = t.Merge(good, {{"nope"}, std::nullopt}, Txn(0, 1));
  EXPECT_EQ(bad_key.status().code(), Code::kInvalidArgument) << bad_key.status().ToString();
  auto key_as_update = t.Merge(good, {{"artifact_id"}, std::vector<std::string>{"artifact_id"}}, Txn(0, 1));
  EXPECT_EQ(key_as_update.status().code(), Code::kInvalidArgument) << key_as_update.status().ToString();
  EXPECT_EQ(*TableVersion(dir.string()), 0);
  EXPECT_EQ(t.ReadLastTxn(kApp)->version, -1);
}

TEST_F(DeltaAdapterTest, MergeAppliesRowsInGivenOrderAndFoldsDuplicateKeys) {
  const fs::path dir = MakeTable("t");
  DeltaTable t = OpenOrDie(dir);
  const MergeSpec spec{{"artifact_id", "version"}, std::vector<std::string>{"state", "seq"}};

  // One batch: a/1 promoted at 100, b/1 promoted at 120, a/1 demoted at 140 (path differs, but
  // path is not an update column: the insert at 100 wrote it), then a/1 erased at 150.
  const std::string batch1 = Row("a", 1, "promoted", "/first", 100) + Row("b", 1, "promoted", "/b", 120) +
                             Row("a", 1, "demoted", "/second", 140) + Row("a", 1, "erased", "/third", 150);
  auto v1 = t.Merge(batch1, spec, Txn(90, 150));
  ASSERT_TRUE(v1.ok()) << v1.status().ToString();
  auto rows = Rows(t);
  ASSERT_EQ(rows.size(), 2u);  // no duplicate a/1
  EXPECT_EQ(rows[0]["state"], "erased");
  EXPECT_EQ(rows[0]["seq"], 150);
  EXPECT_EQ(rows[0]["path"], "/first");
  EXPECT_EQ(rows[1]["state"], "promoted");

  // Next batch: matched rows only get the update columns; a new key is inserted whole; two
  // rows for b/1 in one call fold to the later one.
  const std::string batch2 = Row("b", 1, "demoted", "/elsewhere", 160) + Row("c", 2, "promoted", "/c", 170) +
                             Row("b", 1, "promoted", "/again", 180);
  auto v2 = t.Merge(batch2, spec, Txn(150, 180));
  ASSERT_TRUE(v2.ok()) << v2.status().ToString();
  EXPECT_EQ(*v2, *v1 + 1);
  rows = Rows(t);
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[1]["artifact_id"], "b");
  EXPECT_EQ(rows[1]["state"], "promoted");
  EXPECT_EQ(rows[1]["seq"], 180);
  EXPECT_EQ(rows[1]["path"], "/b");
  EXPECT_EQ(rows[2]["artifact_id"], "c");
  EXPECT_EQ(rows[2]["path"], "/c");

  // The MERGE commit carries the txn and the bounds too.
  auto last = t.ReadLastTxn(kApp);
  ASSERT_TRUE(last.ok());
  EXPECT_EQ(last->version, 180);
  EXPECT_EQ(last->commit_version, *v2);
  EXPECT_EQ((*last->metadata)["oml.batch_start"], 150);
  const auto actions = LogActions(dir, *v2);
  EXPECT_EQ(CountActions(actions, "txn"), 1);
  for (const auto& a : actions) {
    if (a.contains("commitInfo")) {
      EXPECT_EQ(a["commitInfo"]["operation"], "MERGE") << a.dump();
    }
  }

  // update_columns = nullopt: every non-key column, so path follows too.
  auto v3 = t.Merge(Row("c", 2, "demoted", "/moved", 190), {{"artifact_id", "version"}, std::nullopt},
                    Txn(180, 190));
  ASSERT_TRUE(v3.ok()) << v3.status().ToString();
  rows = Rows(t);
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[2]["path"], "/moved");
  EXPECT_EQ(rows[2]["state"], "demoted");
}

// MergeSpec::newer_column (silver's last_event_seq, issue 18): a matched row changes only when the
// source is newer; rows of one key fold to the newest, in whatever order they come; a key not in
// the table is inserted whatever its value; an unfit column is refused and commits nothing.
TEST_F(DeltaAdapterTest, MergeWithANewerColumnNeverPutsAnOlderRowBack) {
  const fs::path dir = MakeTable("t");
  DeltaTable t = OpenOrDie(dir);
  MergeSpec spec{{"artifact_id", "version"}, std::vector<std::string>{"state", "seq"}};
  spec.newer_column = "seq";
  // a/1 demoted at 140 arrives first (its promotion at 100 was set aside); b/1 in one batch
  // with its newest row (150) before an older one (120).
  auto v1 = t.Merge(Row("a", 1, "demoted", "/a", 140) + Row("b", 1, "erased", "/b", 150) +
                        Row("b", 1, "promoted", "/b-old", 120),
                    spec, Txn(0, 10));
  ASSERT_TRUE(v1.ok()) << v1.status().ToString();
  auto rows = Rows(t);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(std::make_pair(rows[0]["state"], rows[0]["seq"]), std::make_pair(nlohmann::json("demoted"), nlohmann::json(140)));
  EXPECT_EQ(std::make_pair(rows[1]["state"], rows[1]["seq"]), std::make_pair(nlohmann::json("erased"), nlohmann::json(150)));
  EXPECT_EQ(rows[1]["path"], "/b");  // the insert columns of the first row of the key
  // The requeued promotion of a/1 (100) and a replay of b/1 at 150: nothing changes. A newer a/1
  // row (160) does.
  auto v2 = t.Merge(Row("a", 1, "promoted", "/a", 100) + Row("b", 1, "promoted", "/b", 150), spec, Txn(10, 20));
  ASSERT_TRUE(v2.ok()) << v2.status().ToString();
  // The txn moves all the same (delta-rs commits nothing for such a MERGE; the adapter commits
  // the txn alone): a caller that records the batch as held finds it there.
  EXPECT_EQ(*v2, *v1 + 1);
  EXPECT_EQ(t.ReadLastTxn(kApp)->version, 20);
  std::vector<std::string> kinds;
  for (const auto& a : LogActions(dir, *v2)) kinds.push_back(a.begin().key());
  EXPECT_EQ(kinds, (std::vector<std::string>{"commitInfo", "txn"}));
  EXPECT_EQ(LogActions(dir, *v2)[0]["commitInfo"]["oml.batch_end"], 20);
  rows = Rows(t);
  EXPECT_EQ(std::make_pair(rows[0]["state"], rows[0]["seq"]), std::make_pair(nlohmann::json("demoted"), nlohmann::json(140)));
  EXPECT_EQ(std::make_pair(rows[1]["state"], rows[1]["seq"]), std::make_pair(nlohmann::json("erased"), nlohmann::json(150)));
  ASSERT_TRUE(t.Merge(Row("a", 1, "erased", "/a", 160), spec, Txn(20, 30)).ok());
  EXPECT_EQ(Rows(t)[0]["state"], "erased");
  // Without the newer column the same older row would win (the old behaviour).
  MergeSpec plain{{"artifact_id", "version"}, std::vector<std::string>{"state", "seq"}};
  ASSERT_TRUE(t.Merge(Row("a", 1, "promoted", "/a", 100), plain, Txn(30, 40)).ok());
  EXPECT_EQ(Rows(t)[0]["state"], "promoted");
  // A newer column that is a key, nullable or not a long: refused, nothing committed.
  const auto before = t.SnapshotVersion();
  for (const char* bad : {"version", "path", "state", "nope"}) {
    MergeSpec b = spec;
    b.newer_column = bad;
    auto r = t.Merge(Row("z", 1, "promoted", "/z", 1), b, Txn(40, 50));
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument) << bad;
  }
  EXPECT_EQ(*t.SnapshotVersion(), *before);
}

// The three calls the writer added for gold, poison rows and compaction: MERGE with add columns
// (target.c + source.c), CheckRows (the first row that does not fit), Optimize (bin-packing that
// keeps rows and the txn version).
TEST_F(DeltaAdapterTest, AddColumnsSumCheckRowsLocatesAndOptimizeCompacts) {
  const fs::path dir = MakeTable("t");
  DeltaTable t = OpenOrDie(dir);
  const MergeSpec add{{"artifact_id", "version"}, std::vector<std::string>{"state"}, {"seq"}};
  ASSERT_TRUE(t.Merge(Row("a", 1, "x", "/a", 5) + Row("b", 1, "x", "/b", 7), add, Txn(0, 1)).ok());
  auto v = t.Merge(Row("a", 1, "y", "/ignored", 3) + Row("c", 1, "x", "/c", 1), add, Txn(1, 2));
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  auto rows = Rows(t);
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[0]["seq"], 8);  // 5 + 3
  EXPECT_EQ(rows[0]["state"], "y");
  EXPECT_EQ(rows[0]["path"], "/a");
  EXPECT_EQ(rows[1]["seq"], 7);
  EXPECT_EQ(rows[2]["seq"], 1);
  // Equal keys with add columns would lose an increment: refused, nothing committed.
  auto dup = t.Merge(Row("a", 1, "z", "/a", 1) + Row("a", 1, "z", "/a", 1), add, Txn(2, 3));
  ASSERT_FALSE(dup.ok());
  EXPECT_EQ(dup.status().code(), Code::kInvalidArgument);
  EXPECT_NE(dup.status().message().find("aggregate them first"), std::string::npos) << dup.status().ToString();
  EXPECT_EQ(*t.SnapshotVersion(), *v);
  // Add columns must be non-nullable integers, and neither keys nor update columns.
  for (const MergeSpec& bad : {MergeSpec{{"artifact_id", "version"}, std::vector<std::string>{"state"}, {"path"}},
                               MergeSpec{{"artifact_id", "version"}, std::vector<std::string>{"seq"}, {"seq"}},
                               MergeSpec{{"artifact_id", "version"}, std::vector<std::string>{"state"}, {"version"}}}) {
    auto r = t.Merge(Row("d", 1, "x", "/d", 1), bad, Txn(2, 3));
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument) << r.status().ToString();
  }
  EXPECT_EQ(*t.SnapshotVersion(), *v);

  // CheckRows: -1 when every row fits; else the 0-based line of the first that does not.
  auto fine = t.CheckRows(Row("e", 1, "x", "/e", 1) + Row("f", 1, "x", "/f", 2));
  ASSERT_TRUE(fine.ok()) << fine.status().ToString();
  EXPECT_EQ(fine->bad_line, -1);
  auto located = t.CheckRows(Row("e", 1, "x", "/e", 1) + Row("f", 1, "x", "/f", 2) +
                             R"({"artifact_id": "g", "version": 1, "state": "x", "seq": "not a number"})" "\n" +
                             Row("h", 1, "x", "/h", 3));
  ASSERT_TRUE(located.ok()) << located.status().ToString();
  EXPECT_EQ(located->bad_line, 2);
  EXPECT_FALSE(located->error.empty());
  auto unknown = t.CheckRows(R"({"artifact_id": "g", "version": 1, "state": "x", "seq": 1, "extra": 1})" "\n");
  ASSERT_TRUE(unknown.ok());
  EXPECT_EQ(unknown->bad_line, 0);

  // Optimize: three small appends become one file; rows and the txn version stay.
  for (int i = 0; i < 3; ++i)
    ASSERT_TRUE(t.Append(Row("o" + std::to_string(i), 1, "x", "/o", 10 + i), Txn(3 + i, 4 + i)).ok());
  const size_t before = Rows(t).size();
  auto opt = t.Optimize(uint64_t{128} << 20);
  ASSERT_TRUE(opt.ok()) << opt.status().ToString();
  EXPECT_GE(opt->first, 3);
  EXPECT_EQ(opt->second, 1);
  EXPECT_EQ(Rows(t).size(), before);
  auto last = t.ReadLastTxn(kApp);
  ASSERT_TRUE(last.ok());
  EXPECT_EQ(last->version, 6);
  for (const auto& a : LogActions(dir, *t.SnapshotVersion()))
    if (a.contains("commitInfo")) {
      EXPECT_EQ(a["commitInfo"]["operation"], "OPTIMIZE") << a.dump();
    }
  // Nothing left to compact: no commit.
  const int64_t at = *t.SnapshotVersion();
  auto again = t.Optimize(uint64_t{128} << 20);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, std::make_pair(int64_t{0}, int64_t{0}));
  EXPECT_EQ(*t.Refresh(), at);
}

// The compactor runs beside the writer with its own handle (lake/compactor.h): an OPTIMIZE on a
// stale snapshot rebases over appends that landed since (their rows stay, its own files replace
// only the files it read), and is refused with a conflict when a newer commit removed a file it
// rewrote (a MERGE), committing nothing.
TEST_F(DeltaAdapterTest, OptimizeRebasesOverAppendsAndLosesToAMergeThatRemovedItsFiles) {
  const fs::path dir = MakeTable("t");
  DeltaTable writer = OpenOrDie(dir);
  for (int i = 0; i < 3; ++i)
    ASSERT_TRUE(writer.Append(Row("a" + std::to_string(i), 1, "x", "/a", i), Txn(i, i + 1)).ok());
  DeltaTable compactor = OpenOrDie(dir);  // snapshot: version 3, three files
  ASSERT_EQ(*compactor.SnapshotVersion(), 3);
  // Two appends land after the compactor's snapshot.
  ASSERT_TRUE(writer.Append(Row("b0", 1, "x", "/b", 10), Txn(3, 4)).ok());
  ASSERT_TRUE(writer.Append(Row("b1", 1, "x", "/b", 11), Txn(4, 5)).ok());
  auto opt = compactor.Optimize(uint64_t{128} << 20);
  ASSERT_TRUE(opt.ok()) << opt.status().ToString();
  EXPECT_EQ(*opt, std::make_pair(int64_t{3}, int64_t{1}));  // only the files of its snapshot
  EXPECT_EQ(*compactor.SnapshotVersion(), 6);                // committed after the two appends
  ASSERT_TRUE(writer.Refresh().ok());
  auto rows = Rows(writer);
  ASSERT_EQ(rows.size(), 5u);  // no row lost, none doubled
  std::set<std::string> ids;
  for (const auto& r : rows) ids.insert(r["artifact_id"].get<std::string>());
  EXPECT_EQ(ids, (std::set<std::string>{"a0", "a1", "a2", "b0", "b1"}));
  EXPECT_EQ(writer.ReadLastTxn(kApp)->version, 5);  // the OPTIMIZE carries no txn

  // A MERGE that rewrites the files a stale OPTIMIZE read wins; the OPTIMIZE commits nothing.
  DeltaTable stale = OpenOrDie(dir);  // version 6: the compacted file, b0's and b1's
  const MergeSpec spec{{"artifact_id", "version"}, std::vector<std::string>{"state"}};
  ASSERT_TRUE(writer.Merge(Row("a0", 1, "y", "/a", 0) + Row("b0", 1, "y", "/b", 10) + Row("b1", 1, "y", "/b", 11),
                           spec, Txn(5, 6))
                  .ok());
  const int64_t after_merge = *writer.SnapshotVersion();
  auto lost = stale.Optimize(uint64_t{128} << 20);
  ASSERT_FALSE(lost.ok());
  EXPECT_EQ(lost.status().code(), Code::kAborted) << lost.status().ToString();
  EXPECT_EQ(lost.status().type(), "lake-commit-conflict") << lost.status().ToString();
  EXPECT_EQ(*TableVersion(dir.string()), after_merge);
  ASSERT_TRUE(writer.Refresh().ok());
  EXPECT_EQ(Rows(writer).size(), 5u);
}

// Issue 18, "compaction doubles rows": two handles read the same three files; the other one
// compacts them first (its removes carry dataChange = false, which delta-rs's conflict checker
// lets through since PR 3982). Ours must not rebase over that commit: it would add a second
// file holding the same three rows. It is refused ("lake-rewrite-stale", naming the commit),
// commits nothing, and on a fresh snapshot compacts what is left. An append that landed in
// between is no reason to refuse (appends read nothing and remove nothing).
TEST_F(DeltaAdapterTest, OptimizeNeverLandsOverAnotherRewriteOfTheFilesItRead) {
  const fs::path dir = MakeTable("t");
  DeltaTable writer = OpenOrDie(dir);
  for (int i = 0; i < 3; ++i)
    ASSERT_TRUE(writer.Append(Row("a" + std::to_string(i), 1, "x", "/a", i), Txn(i, i + 1)).ok());
  DeltaTable ours = OpenOrDie(dir);   // snapshot: version 3, three files
  DeltaTable other = OpenOrDie(dir);  // a second, equally stale handle (an operator's tool)
  auto theirs = other.Optimize(uint64_t{128} << 20);
  ASSERT_TRUE(theirs.ok()) << theirs.status().ToString();
  EXPECT_EQ(*theirs, std::make_pair(int64_t{3}, int64_t{1}));  // version 4
  ASSERT_TRUE(writer.Refresh().ok());
  ASSERT_TRUE(writer.Append(Row("b0", 1, "x", "/b", 10), Txn(3, 4)).ok());  // version 5
  auto refused = ours.Optimize(uint64_t{128} << 20);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), Code::kAborted) << refused.status().ToString();
  EXPECT_EQ(refused.status().type(), "lake-rewrite-stale") << refused.status().ToString();
  EXPECT_NE(refused.status().message().find("commit 4 (OPTIMIZE) removed"), std::string::npos)
      << refused.status().message();
  EXPECT_EQ(*TableVersion(dir.string()), 5);  // nothing committed
  EXPECT_EQ(*ours.SnapshotVersion(), 3);      // the handle did not move
  ASSERT_TRUE(writer.Refresh().ok());
  std::vector<std::string> ids;
  for (const auto& r : Rows(writer)) ids.push_back(r["artifact_id"].get<std::string>());
  EXPECT_EQ(ids, (std::vector<std::string>{"a0", "a1", "a2", "b0"}));  // each row once

  // Fresh: the other handle's file and b0's are compacted into one.
  ASSERT_EQ(*ours.Refresh(), 5);
  auto again = ours.Optimize(uint64_t{128} << 20);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(*again, std::make_pair(int64_t{2}, int64_t{1}));
  ASSERT_TRUE(writer.Refresh().ok());
  EXPECT_EQ(Rows(writer).size(), 4u);
  EXPECT_EQ(writer.ReadLastTxn(kApp)->version, 4);
}

// The MERGE side of the same hole: a MERGE reads the files holding its keys, and an OPTIMIZE
// that lands after its snapshot removes them with dataChange = false. The adapter's MERGE never
// rebases (delta-rs's retries are off for it), so it loses with "lake-commit-conflict" and
// commits nothing; on a fresh snapshot it reads the compacted file and updates the row in place.
TEST_F(DeltaAdapterTest, MergeNeverLandsOverACompactionOfTheFilesItRead) {
  const fs::path dir = MakeTable("t");
  DeltaTable writer = OpenOrDie(dir);
  for (int i = 0; i < 3; ++i)
    ASSERT_TRUE(writer.Append(Row("a" + std::to_string(i), 1, "x", "/a", i), Txn(i, i + 1)).ok());
  DeltaTable compactor = OpenOrDie(dir);
  ASSERT_EQ(*compactor.Optimize(uint64_t{128} << 20), std::make_pair(int64_t{3}, int64_t{1}));  // version 4
  const MergeSpec spec{{"artifact_id", "version"}, std::vector<std::string>{"state"}};
  auto lost = writer.Merge(Row("a0", 1, "y", "/a", 0), spec, Txn(3, 4));  // its snapshot: version 3
  ASSERT_FALSE(lost.ok());
  EXPECT_EQ(lost.status().type(), "lake-commit-conflict") << lost.status().ToString();
  EXPECT_EQ(*TableVersion(dir.string()), 4);
  ASSERT_EQ(*writer.Refresh(), 4);
  auto merged = writer.Merge(Row("a0", 1, "y", "/a", 0), spec, Txn(3, 4));
  ASSERT_TRUE(merged.ok()) << merged.status().ToString();
  std::vector<std::pair<std::string, std::string>> rows;
  for (const auto& r : Rows(writer)) rows.emplace_back(r["artifact_id"].get<std::string>(), r["state"].get<std::string>());
  EXPECT_EQ(rows, (std::vector<std::pair<std::string, std::string>>{{"a0", "y"}, {"a1", "x"}, {"a2", "x"}}));
}

// The Compactor between its snapshot and its OPTIMIZE (the after_snapshot point): another
// handle compacts the same files. The attempt is refused and counted, the next attempt on a
// fresh snapshot finds one file and nothing to do; every row stays once. And a Compactor whose
// lease_check fails runs no OPTIMIZE at all.
TEST_F(DeltaAdapterTest, CompactorYieldsToAnotherRewriteAndNeverRunsWithoutTheLease) {
  const fs::path dir = MakeTable("t");
  DeltaTable writer = OpenOrDie(dir);
  for (int i = 0; i < 3; ++i)
    ASSERT_TRUE(writer.Append(Row("a" + std::to_string(i), 1, "x", "/a", i), Txn(i, i + 1)).ok());
  {
    Compactor c(Compactor::Options{root_.string(), "main", uint64_t{128} << 20, uint64_t{16} << 20, 1});
    oml::testing::HoldFirst hold("lakewriter.compaction.after_snapshot.t");
    c.Request("t");
    hold.WaitUntilHeld();  // its snapshot: version 3
    DeltaTable other = OpenOrDie(dir);
    ASSERT_EQ(*other.Optimize(uint64_t{128} << 20), std::make_pair(int64_t{3}, int64_t{1}));
    hold.Release();
    c.Drain();
    const Compactor::Stats st = c.stats();
    EXPECT_EQ(st.refused, 1);
    EXPECT_EQ(st.compactions, 0);  // the second attempt: one file, nothing to do
    EXPECT_EQ(st.failures, 0);
    EXPECT_EQ(*TableVersion(dir.string()), 4);  // only the other handle's OPTIMIZE
    ASSERT_TRUE(writer.Refresh().ok());
    EXPECT_EQ(Rows(writer).size(), 3u);
  }
  ASSERT_TRUE(writer.Append(Row("b0", 1, "x", "/b", 10), Txn(3, 4)).ok());  // version 5: two files
  int checks = 0;
  Compactor::Options o{root_.string(), "main", uint64_t{128} << 20, uint64_t{16} << 20, 1};
  o.lease_check = [&checks] {
    ++checks;
    return Status(Code::kAborted, "the lake writer lease was taken over (epoch 1)", "lease-lost");
  };
  Compactor c(o);
  c.Request("t");
  c.Drain();
  EXPECT_EQ(checks, 1);
  EXPECT_EQ(c.stats().no_lease, 1);
  EXPECT_EQ(c.stats().compactions, 0);
  EXPECT_EQ(*TableVersion(dir.string()), 5);  // no OPTIMIZE
}

// The Compactor (lake/compactor.h) runs requests on its own thread: a request made while one for
// the same table waits in the queue coalesces with it, Drain waits for the queue and the running
// compaction, a compaction commits beside appends made while it runs, and a request for a table
// that is not there is counted as a failure without stopping the thread.
TEST_F(DeltaAdapterTest, CompactorCoalescesQueuedRequestsAndRunsBesideAppends) {
  const fs::path dir = MakeTable("t");
  DeltaTable writer = OpenOrDie(dir);
  for (int i = 0; i < 3; ++i)
    ASSERT_TRUE(writer.Append(Row("a" + std::to_string(i), 1, "x", "/a", i), Txn(i, i + 1)).ok());
  // large_every 2 and a small target of one byte, so every file lies between the two targets:
  // the first run sees four (three, and the append made while it is held) and uses the large
  // target; the second sees one and uses the small one. A fresh Compactor: the tier comes from
  // the snapshot, not from runs it remembers.
  Compactor c(Compactor::Options{root_.string(), "main", uint64_t{128} << 20, 1, 2});
  {
    oml::testing::HoldFirst hold("lakewriter.compaction.before.t");
    c.Request("t");
    hold.WaitUntilHeld();  // the first request runs (held before its OPTIMIZE)
    c.Request("t");        // queued
    c.Request("t");        // coalesces with the queued one
    // An append lands while the compaction is held: its file is not in the OPTIMIZE's snapshot
    // only if the snapshot was taken before; either way it must survive.
    ASSERT_TRUE(writer.Append(Row("b0", 1, "x", "/b", 9), Txn(3, 4)).ok());
    hold.Release();
    c.Drain();
  }
  Compactor::Stats st = c.stats();
  EXPECT_EQ(st.requests, 3);
  EXPECT_EQ(st.failures, 0);
  EXPECT_EQ(st.large_runs, 1);
  // Two runs: the first compacts the four files (its snapshot is taken after the hold), the
  // second finds one file and nothing to do.
  EXPECT_EQ(st.compactions, 1);
  EXPECT_EQ(st.files_removed, 4);
  EXPECT_EQ(st.files_added, 1);
  ASSERT_TRUE(writer.Refresh().ok());
  EXPECT_EQ(Rows(writer).size(), 4u);
  EXPECT_EQ(writer.ReadLastTxn(kApp)->version, 4);

  // The OPTIMIZE ran on the compaction runtime, whose threads run at nice 10 (the adapter's
  // COMPACTION_NICE): /proc/self/task/<tid>/stat field 19 is the nice value.
  int compaction_threads = 0;
  for (const auto& task : fs::directory_iterator("/proc/self/task")) {
    std::ifstream comm(task.path() / "comm");
    std::string name;
    std::getline(comm, name);
    if (name.rfind("oml-compaction", 0) != 0) continue;
    ++compaction_threads;
    std::ifstream stat(task.path() / "stat");
    std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
    std::istringstream fields(text.substr(text.rfind(')') + 2));  // after "pid (comm) "
    std::vector<std::string> f{std::istream_iterator<std::string>(fields), {}};
    ASSERT_GE(f.size(), 17u);
    EXPECT_EQ(f[16], "10") << name;  // field 19 of stat; fields[0] is field 3
  }
  EXPECT_GE(compaction_threads, 1);

  c.Request("no/such/table");
  c.Drain();
  EXPECT_EQ(c.stats().failures, 1);
  // The thread goes on after a failure.
  ASSERT_TRUE(writer.Append(Row("c0", 1, "x", "/c", 10), Txn(4, 5)).ok());
  c.Request("t");
  c.Drain();
  EXPECT_EQ(c.stats().compactions, 2);
  ASSERT_TRUE(writer.Refresh().ok());
  EXPECT_EQ(Rows(writer).size(), 5u);

  // With a 16 MiB small target the same kind of files are all small: a run with large_every 1
  // still bin-packs with the small target (no file lies between the targets).
  for (int i = 1; i <= 2; ++i)
    ASSERT_TRUE(writer.Append(Row("c" + std::to_string(i), 1, "x", "/c", 10 + i), Txn(4 + i, 5 + i)).ok());
  Compactor small(Compactor::Options{root_.string(), "main", uint64_t{128} << 20, uint64_t{16} << 20, 1});
  small.Request("t");
  small.Drain();
  EXPECT_EQ(small.stats().compactions, 1);
  EXPECT_EQ(small.stats().files_removed, 3);
  EXPECT_EQ(small.stats().large_runs, 0);
  ASSERT_TRUE(writer.Refresh().ok());
  EXPECT_EQ(Rows(writer).size(), 7u);
}

TEST_F(DeltaAdapterTest, CheckpointAndVacuumKeepTheTxnVersion) {
  const fs::path dir = MakeTable("t");
  DeltaTable t = OpenOrDie(dir);
  const MergeSpec spec{{"artifact_id", "version"}, std::nullopt};
  ASSERT_TRUE(t.Append(Row("a", 1, "promoted", "/a", 5), Txn(0, 5)).ok());
  // A MERGE that matches rewrites the file: the old one becomes a tombstone vacuum can delete.
  auto merged = t.Merge(Row("a", 1, "demoted", "/a", 7), spec, Txn(5, 7));
  ASSERT_TRUE(merged.ok()) << merged.status().ToString();
  ASSERT_EQ(*merged, 2);

  auto cp = t.Checkpoint();
  ASSERT_TRUE(cp.ok()) << cp.status().ToString();
  EXPECT_EQ(*cp, 2);
  EXPECT_TRUE(fs::exists(dir / "_delta_log" / "00000000000000000002.checkpoint.parquet"));

  auto deleted = t.Vacuum(0);
  ASSERT_TRUE(deleted.ok()) << deleted.status().ToString();
  EXPECT_GE(*deleted, 1);
  const int64_t after_vacuum = *t.SnapshotVersion();
  EXPECT_GT(after_vacuum, 2);  // VACUUM START/END commits

  auto last = t.ReadLastTxn(kApp);
  ASSERT_TRUE(last.ok()) << last.status().ToString();
  EXPECT_EQ(last->version, 7);
  EXPECT_EQ(last->commit_version, 2);  // found behind the vacuum commits
  EXPECT_EQ((*last->metadata)["oml.batch_end"], 7);

  // Drop every commit file up to the checkpoint, as expired-log cleanup would: the txn now
  // comes from the checkpoint alone; its commit's metadata is no longer known.
  for (int v = 0; v <= 2; ++v) {
    char name[32];
    std::snprintf(name, sizeof(name), "%020d.json", v);
    ASSERT_TRUE(fs::remove(dir / "_delta_log" / name)) << name;
  }
  DeltaTable reopened = OpenOrDie(dir);
  EXPECT_EQ(*reopened.SnapshotVersion(), after_vacuum);
  auto from_checkpoint = reopened.ReadLastTxn(kApp);
  ASSERT_TRUE(from_checkpoint.ok()) << from_checkpoint.status().ToString();
  EXPECT_EQ(from_checkpoint->version, 7);
  EXPECT_FALSE(from_checkpoint->commit_version.has_value());
  EXPECT_FALSE(from_checkpoint->metadata.has_value());
  auto rows = Rows(reopened);
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0]["state"], "demoted");

  // No txn retention was ever configured.
  for (const auto& entry : fs::directory_iterator(dir / "_delta_log")) {
    if (entry.path().extension() != ".json") continue;
    std::ifstream in(entry.path());
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_EQ(text.find("setTransactionRetentionDuration"), std::string::npos) << entry.path();
  }
}

TEST_F(DeltaAdapterTest, OpenMissingTableIsNotFound) {
  auto t = DeltaTable::Open((root_ / "nothing").string());
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), Code::kNotFound) << t.status().ToString();
}

// Leaves a table for tests/test_lake_adapter.py (deltalake and pyarrow read it back) in
// $OML_LAKE_TEST_OUT/claims when that is set; otherwise in a temp dir, as a smoke test.
// Contents: version 1 = append of a/1 and b/1 (txn 5, bounds 0..5), version 2 = merge that
// demotes a/1 and inserts c/1 (txn 9, bounds 5..9).
TEST_F(DeltaAdapterTest, WritesTableForPythonReaders) {
  const char* out = std::getenv("OML_LAKE_TEST_OUT");
  const fs::path root = (out != nullptr && *out != '\0') ? fs::path(out) : root_;
  const fs::path dir = MakeTable("claims", root);
  DeltaTable t = OpenOrDie(dir);
  ASSERT_TRUE(t.Append(Row("a", 1, "promoted", "/a", 3) + Row("b", 1, "promoted", "/b", 5), Txn(0, 5)).ok());
  auto v = t.Merge(Row("a", 1, "demoted", "/a", 8) + Row("c", 1, "promoted", "/c", 9),
                   {{"artifact_id", "version"}, std::vector<std::string>{"state", "seq"}}, Txn(5, 9));
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(*v, 2);
  EXPECT_EQ(Rows(t).size(), 3u);
}

}  // namespace
}  // namespace oml::lake
