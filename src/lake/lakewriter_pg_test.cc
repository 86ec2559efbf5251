// The lake writer's protocol (lake/lakewriter.h) on the test cluster and a local lake.
//
// Each test starts from an empty bronze/events table and a frontier reset to 0 (the guard
// trigger off, as an operator rebuilding a lake does), so every outbox row of the cluster must
// end in bronze exactly once. The vocabulary: OutboxSeqs (what must be there), BronzeSeqs (what
// is there, read back through delta-rs), CommitBounds (each commit's recorded batch bounds, read
// from the JSON log itself).
#include "lake/lakewriter.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>
#include <thread>

#include "common/sync_point.h"
#include "common/sync_point_testing.h"
#include "common/temp_dir_testing.h"
#include "db/conn.h"
#include "db/test_cluster.h"
#include "journal/provider.h"
#include "journal/test_journal.h"

namespace oml::lake {
namespace {

namespace fs = std::filesystem;
constexpr char kBronze[] = "bronze/events";

struct Bounds {
  int64_t version, start, end;
  bool operator==(const Bounds& o) const { return version == o.version && start == o.start && end == o.end; }
};
std::ostream& operator<<(std::ostream& os, const Bounds& b) {
  return os << "v" << b.version << "(" << b.start << "," << b.end << "]";
}

class LakeWriterTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { tj_ = new journal::testing::TestJournal(4); }

  void SetUp() override {
    SyncPoints::ClearAll();
    lake_ = std::make_unique<oml::testing::ScopedTempDir>("oml-lakewriter");
    ASSERT_TRUE(EnsureLakeTables(lake_->path().string()).ok());
    su_ = std::make_unique<db::Conn>(std::move(db::Conn::Connect(db::testing::SuperuserUrl())).value());
    ASSERT_TRUE(su_->Exec("ALTER TABLE oml.lake_frontier DISABLE TRIGGER lake_frontier_guard; "
                          "UPDATE oml.lake_frontier SET frontier_seq = 0 WHERE stream = 'default'; "
                          "ALTER TABLE oml.lake_frontier ENABLE TRIGGER lake_frontier_guard")
                    .ok());
  }
  void TearDown() override { SyncPoints::ClearAll(); }

  LakeWriterOptions Opts(int64_t max_rows, const std::string& holder = "test") {
    LakeWriterOptions o;
    o.database_url = db::testing::LakewriterUrl();
    o.lake_root = lake_->path().string();
    o.max_rows = max_rows;
    o.once_horizon_wait = std::chrono::milliseconds(10000);
    o.standby_poll = std::chrono::milliseconds(50);
    o.holder = holder;
    return o;
  }

  // Two writers of one stream at once, the lease bypassed on purpose: writer A's RunOnce runs
  // until it is held at `point`, then `meanwhile` runs (the other writer's part), then A goes on.
  // Returns A's status. (A is released and joined even if `meanwhile` fails an ASSERT.)
  Status WhileHeldAt(LakeWriter& a, const std::string& point, const std::function<void()>& meanwhile) {
    Status sa;
    oml::testing::HoldFirst hold(point);
    std::thread ta([&] { sa = a.RunOnce(); });
    hold.WaitUntilHeld();
    meanwhile();
    hold.Release();
    ta.join();
    return sa;
  }
  LakeWriterOptions Racing(const std::string& holder) {
    LakeWriterOptions o = Opts(1000, holder);
    o.bypass_lease = true;
    return o;
  }

  // A tenant and two API keys: five events (tenant.created, genesis, 2 x api_key.created... ).
  void AddEvents(const std::string& tenant) {
    auto t = journal::CreateTenant(tj_->journal, tenant);
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    for (const char* p : {"p1", "p2"}) ASSERT_TRUE(journal::CreateApiKey(tj_->journal, t->tenant_id, p, "writer").ok());
  }

  std::vector<int64_t> OutboxSeqs() {
    auto r = su_->Exec("SELECT seq FROM oml.outbox WHERE target_table = 'bronze/events' ORDER BY seq");
    EXPECT_TRUE(r.ok());
    std::vector<int64_t> out;
    for (int i = 0; r.ok() && i < r->size(); ++i) out.push_back(r->GetInt(i, 0));
    return out;
  }
  int64_t LastOutboxSeq() { return (*su_->Exec("SELECT coalesce(max(seq), 0) FROM oml.outbox")).GetInt(0, 0); }
  int64_t PgFrontier() {
    return (*su_->Exec("SELECT frontier_seq FROM oml.lake_frontier WHERE stream = 'default'")).GetInt(0, 0);
  }

  // outbox_seq of every bronze row, sorted (duplicates kept), read back through delta-rs.
  std::vector<int64_t> BronzeSeqs() {
    auto t = DeltaTable::Open((lake_->path() / kBronze).string());
    EXPECT_TRUE(t.ok()) << t.status().ToString();
    std::vector<int64_t> out;
    if (!t.ok()) return out;
    auto text = t->ReadRowsJsonl();
    EXPECT_TRUE(text.ok()) << text.status().ToString();
    std::istringstream in(text.ok() ? *text : "");
    for (std::string line; std::getline(in, line);) {
      if (line.empty()) continue;
      auto j = nlohmann::json::parse(line);
      out.push_back(j.at("outbox_seq").get<int64_t>());
      // Binary columns arrive as bytes, not as the base64 text of row_data.
      EXPECT_EQ(j.at("signature").get<std::string>().size(), 128u) << line;  // 64 bytes, as hex
    }
    std::sort(out.begin(), out.end());
    return out;
  }

  // The bounds each writer commit recorded, from the JSON log (versions 1..).
  std::vector<Bounds> CommitBounds(const std::string& table = kBronze) {
    std::vector<Bounds> out;
    for (int64_t v = 1;; ++v) {
      char name[32];
      std::snprintf(name, sizeof(name), "%020lld.json", static_cast<long long>(v));
      std::ifstream in(lake_->path() / table / "_delta_log" / name);
      if (!in) break;
      int64_t txn = -1;
      Bounds b{v, -1, -1};
      for (std::string line; std::getline(in, line);) {
        if (line.empty()) continue;
        auto a = nlohmann::json::parse(line);
        if (a.contains("txn")) {
          EXPECT_EQ(a["txn"]["appId"], "oml-lakewriter");
          txn = a["txn"]["version"].get<int64_t>();
        }
        if (a.contains("commitInfo")) {
          b.start = a["commitInfo"].value("oml.batch_start", int64_t{-1});
          b.end = a["commitInfo"].value("oml.batch_end", int64_t{-1});
          if (a["commitInfo"].value("operation", std::string()) == "OPTIMIZE") b.end = -2;  // no batch
          else EXPECT_EQ(a["commitInfo"].value("oml.stream", std::string()), "default");
        }
      }
      if (b.end == -2) {
        EXPECT_EQ(txn, -1) << "a compaction carries no txn, version " << v;
        continue;
      }
      EXPECT_EQ(txn, b.end) << "the txn version is batch_end at version " << v;
      out.push_back(b);
    }
    return out;
  }

  // Every row exactly once, the batches contiguous from 0 with no batch committed twice, and
  // frontier == txn version == the last outbox seq.
  void ExpectDrainedExactlyOnce() {
    EXPECT_EQ(BronzeSeqs(), OutboxSeqs());
    auto bounds = CommitBounds();
    ASSERT_FALSE(bounds.empty());
    int64_t prev_end = 0;
    for (const auto& b : bounds) {
      EXPECT_EQ(b.start, prev_end) << b;
      EXPECT_LT(b.start, b.end) << b;
      prev_end = b.end;
    }
    EXPECT_EQ(prev_end, LastOutboxSeq());
    EXPECT_EQ(PgFrontier(), LastOutboxSeq());
    ExpectGoldCountsEveryBronzeRowOnce();
  }

  // gold/daily_activity equals the journal's counts per (tenant, UTC day, workarea, type), computed
  // by PostgreSQL from the outbox: an increment applied twice (or lost) shows as a wrong count.
  void ExpectGoldCountsEveryBronzeRowOnce() {
    auto want = su_->Exec(
        "SELECT k || '|' || count(*) || '|' || max(seq) FROM (SELECT seq, tenant_id::text || '|' || "
        "to_char((row_data->>'occurred_at')::timestamptz AT TIME ZONE 'UTC', 'YYYY-MM-DD') || '|' || "
        "coalesce(row_data->>'workarea_id', '') || '|' || (row_data->>'event_type') AS k FROM oml.outbox "
        "WHERE target_table = 'bronze/events') b GROUP BY k");
    ASSERT_TRUE(want.ok()) << want.status().ToString();
    std::vector<std::string> expected;
    for (int i = 0; i < want->size(); ++i) expected.push_back(want->Get(i, 0));
    auto t = DeltaTable::Open((lake_->path() / "gold/daily_activity").string());
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    auto text = t->ReadRowsJsonl();
    ASSERT_TRUE(text.ok());
    std::vector<std::string> got;
    std::istringstream in(*text);
    for (std::string line; std::getline(in, line);) {
      if (line.empty()) continue;
      auto j = nlohmann::json::parse(line);
      got.push_back(j.at("tenant_id").get<std::string>() + "|" + j.at("day").get<std::string>() + "|" +
                    j.at("workarea_id").get<std::string>() + "|" + j.at("event_type").get<std::string>() + "|" +
                    std::to_string(j.at("events").get<int64_t>()) + "|" +
                    std::to_string(j.at("last_outbox_seq").get<int64_t>()));
    }
    std::sort(got.begin(), got.end());
    std::sort(expected.begin(), expected.end());
    EXPECT_EQ(got, expected);
  }

  static journal::testing::TestJournal* tj_;
  std::unique_ptr<oml::testing::ScopedTempDir> lake_;
  std::unique_ptr<db::Conn> su_;
};
journal::testing::TestJournal* LakeWriterTest::tj_ = nullptr;

TEST(ToDeltaRowTest, ConvertsTheBinaryColumnsAddsOutboxSeqAndPassesTheRestThrough) {
  const TargetTable& bronze = TargetTables().at(0);
  ASSERT_EQ(bronze.name, kBronze);
  OutboxRow row;
  row.seq = 42;
  row.row_data = R"({"seq": 7, "signed_bytes": "AP8Q", "signature": "AQI=", "principal": null,
                     "a_new_column": {"kept": [1, "x"]}, "artifact_id": "art-1"})";
  auto line = ToDeltaRow(row, bronze);
  ASSERT_TRUE(line.ok()) << line.status().ToString();
  ASSERT_EQ(line->back(), '\n');
  auto j = nlohmann::json::parse(*line);
  EXPECT_EQ(j, nlohmann::json::parse(R"({"seq": 7, "signed_bytes": "AP8Q", "signature": "AQI=", "principal": null,
                                         "a_new_column": {"kept": [1, "x"]}, "artifact_id": "art-1",
                                         "outbox_seq": 42})"));

  // The fast path (a byte scan, for PostgreSQL's jsonb text) and the slow path (a JSON parse,
  // taken for anything unusual) give the same value: nested keys of a binary column's name are
  // not converted, strings with escaped quotes and braces do not confuse the scan, an empty
  // object gets outbox_seq alone, and compact JSON without spaces works too.
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"x": {"signed_bytes": "AQI="}, "signed_bytes": "AQI=", "s": "a \"}, \"signature\": \"AQI=\" {"})",
       R"({"x": {"signed_bytes": "AQI="}, "signed_bytes": "AQI=", "s": "a \"}, \"signature\": \"AQI=\" {",
           "outbox_seq": 42})"},
      {"{}", R"({"outbox_seq": 42})"},
      {R"({"signature":"AQI=","n":[1,{"signature":"x"}],"signed_bytes":null})",
       R"({"signature": "AQI=", "n": [1, {"signature": "x"}], "signed_bytes": null, "outbox_seq": 42})"},
      {"{\"seq\": 1,\n \"signature\": \"AQI=\"}  \n", R"({"seq": 1, "signature": "AQI=", "outbox_seq": 42})"},
      // Runs of backslashes before a quote: an even run (escaped backslashes) lets the quote
      // close the string, an odd run escapes it.
      {R"({"s": "a\\", "signature": "AQI=", "t": "b\\\"}\\"})",
       R"({"s": "a\\", "signature": "AQI=", "t": "b\\\"}\\", "outbox_seq": 42})"},
      {R"({"s": "\\\\\"", "signature": "AQI="})", R"({"s": "\\\\\"", "signature": "AQI=", "outbox_seq": 42})"},
      // An outbox_seq already present is overwritten (slow path), not duplicated.
      {R"({"outbox_seq": 1, "seq": 2})", R"({"outbox_seq": 42, "seq": 2})"},
  };
  for (const auto& [in, want] : cases) {
    row.row_data = in;
    auto got = ToDeltaRow(row, bronze);
    ASSERT_TRUE(got.ok()) << in << ": " << got.status().ToString();
    EXPECT_EQ(nlohmann::json::parse(*got), nlohmann::json::parse(want)) << in;
    EXPECT_EQ(std::count(got->begin(), got->end(), '\n'), 1) << in;  // one JSON line
  }

  row.row_data = R"({"signed_bytes": "not base64!", "signature": "AQI="})";
  auto bad = ToDeltaRow(row, bronze);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), Code::kInvalidArgument);
  EXPECT_EQ(bad.status().type(), "invalid-outbox-row");
  row.row_data = "[1]";
  EXPECT_EQ(ToDeltaRow(row, bronze).status().type(), "invalid-outbox-row");
  row.row_data = R"({"signature": 5})";
  EXPECT_EQ(ToDeltaRow(row, bronze).status().type(), "invalid-outbox-row");
}

// gold/daily_activity's rows for a batch: the byte-scan fast path and the JSON-parse fallback
// count alike; nested members of the same names are not the row's; a row without the members
// is refused naming its seq.
TEST(DailyActivityRowsTest, CountsBronzeRowsPerTenantDayWorkareaAndType) {
  auto row = [](int64_t seq, std::string data, std::string target = "bronze/events") {
    OutboxRow r;
    r.seq = seq;
    r.target_table = std::move(target);
    r.row_data = std::move(data);
    return r;
  };
  const std::vector<OutboxRow> rows = {
      row(1, R"({"tenant_id": "t1", "event_type": "claim.submitted", "occurred_at": "2026-11-30T23:59:59.999999Z", "workarea_id": "wa-1"})"),
      row(2, R"({"x": {"tenant_id": "t9", "workarea_id": "wa-9"}, "tenant_id": "t1", "event_type": "claim.submitted", "occurred_at": "2026-11-30T00:00:00.000000Z", "workarea_id": "wa-1"})"),
      // integer microseconds (2026-12-01T00:00:00Z), an escaped string (slow path), no workarea
      row(3, R"({"tenant_id": "t1", "event_type": "tenant.created", "occurred_at": 1796083200000000})"),
      row(4, R"({"tenant_id": "t\u0031", "event_type": "tenant.created", "occurred_at": "2026-12-01T10:00:00.000000Z", "workarea_id": null})"),
      row(5, R"({"tenant_id": "t2", "event_type": "x"})", "silver/claims"),  // not bronze: not counted
      row(6, "{\"tenant_id\": \"t1\",\n \"event_type\": \"claim.submitted\", \"occurred_at\": \"2026-11-30T12:00:00.000000Z\", \"workarea_id\": \"wa-2\"}"),
  };
  std::vector<const OutboxRow*> ptrs;
  for (const auto& r : rows) ptrs.push_back(&r);
  auto got = DailyActivityRows(ptrs, 0);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  std::vector<nlohmann::json> lines;
  std::istringstream in(*got);
  for (std::string l; std::getline(in, l);) lines.push_back(nlohmann::json::parse(l));
  const std::vector<nlohmann::json> want = {
      {{"tenant_id", "t1"}, {"day", "2026-11-30"}, {"workarea_id", "wa-1"}, {"event_type", "claim.submitted"}, {"events", 2}, {"last_outbox_seq", 2}},
      {{"tenant_id", "t1"}, {"day", "2026-11-30"}, {"workarea_id", "wa-2"}, {"event_type", "claim.submitted"}, {"events", 1}, {"last_outbox_seq", 6}},
      {{"tenant_id", "t1"}, {"day", "2026-12-01"}, {"workarea_id", ""}, {"event_type", "tenant.created"}, {"events", 2}, {"last_outbox_seq", 4}},
  };
  EXPECT_EQ(lines, want);
  // Rows at or below above_seq are in gold already.
  auto above = DailyActivityRows(ptrs, 4);
  ASSERT_TRUE(above.ok());
  EXPECT_EQ(std::count(above->begin(), above->end(), '\n'), 1);
  // A bronze row without occurred_at: refused, naming it.
  const OutboxRow bad = row(7, R"({"tenant_id": "t1", "event_type": "claim.submitted"})");
  ptrs.push_back(&bad);
  int64_t bad_seq = 0;
  auto refused = DailyActivityRows(ptrs, 0, &bad_seq);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().type(), "invalid-outbox-row");
  EXPECT_EQ(bad_seq, 7);
}

// Gold parses occurred_at with bronze's parser (issue 18): every text bronze's timestamp column
// accepts (an offset instead of 'Z', a space for 'T') is counted on its UTC day, and what bronze
// refuses gold refuses, so no row can be in bronze and dead-lettered by gold.
TEST(DailyActivityRowsTest, AcceptsExactlyWhatBronzesTimestampParserAccepts) {
  auto bronze = [](int64_t seq, const std::string& time) {
    OutboxRow r;
    r.seq = seq;
    r.target_table = "bronze/events";
    r.row_data = R"({"tenant_id": "t1", "event_type": "e", "occurred_at": ")" + time + R"("})";
    return r;
  };
  const std::vector<std::pair<std::string, std::string>> ok = {
      {"2026-11-30T23:30:00-01:00", "2026-12-01"}, {"2026-12-01T00:30:00+01:00", "2026-11-30"},
      {"2026-11-30 15:37:13.123456789z", "2026-11-30"}, {"1969-12-31T23:59:59.5Z", "1969-12-31"}};
  for (const auto& [time, day] : ok) {
    ASSERT_TRUE(ParseRfc3339Micros(time).has_value()) << time;
    const OutboxRow r = bronze(1, time);
    auto got = DailyActivityRows({&r}, 0);
    ASSERT_TRUE(got.ok()) << time << ": " << got.status().ToString();
    EXPECT_EQ(nlohmann::json::parse(*got)["day"], day) << time;
  }
  for (const std::string bad : {"2026-13-01T00:00:00Z", "2026-11-30T15:37:13", "2026-11-30"}) {
    ASSERT_FALSE(ParseRfc3339Micros(bad).has_value()) << bad;
    const OutboxRow r = bronze(9, bad);
    int64_t bad_seq = 0;
    auto got = DailyActivityRows({&r}, 0, &bad_seq);
    EXPECT_EQ(got.status().type(), "invalid-outbox-row") << bad;
    EXPECT_EQ(bad_seq, 9) << bad;
  }
}

TEST(LeaseKeyTest, Fnv1a32IsTheReferenceHash) {
  EXPECT_EQ(static_cast<uint32_t>(Fnv1a32("")), 0x811c9dc5u);
  EXPECT_EQ(static_cast<uint32_t>(Fnv1a32("a")), 0xe40c292cu);
  EXPECT_NE(Fnv1a32(AppIdFor("default")), Fnv1a32(AppIdFor("shard-1")));
}

TEST_F(LakeWriterTest, DrainsEveryRowOnceInContiguousBatchesOfMaxRows) {
  AddEvents("drain-a");
  AddEvents("drain-b");
  const auto want = OutboxSeqs();
  ASSERT_GE(want.size(), 10u);

  auto w = std::make_unique<LakeWriter>(Opts(3));
  Status st = w->RunOnce();
  ASSERT_TRUE(st.ok()) << st.ToString();
  ExpectDrainedExactlyOnce();
  EXPECT_EQ(w->frontier(), LastOutboxSeq());
  EXPECT_EQ(w->stats().rows_by_table.at(kBronze), static_cast<int64_t>(want.size()));
  EXPECT_EQ(w->stats().recovered_batches, 0);
  EXPECT_EQ(w->stats().conflicts, 0);
  // Every batch but the last holds max_rows rows; each commits to bronze and to gold.
  const int64_t commits = w->stats().commits / 2;
  EXPECT_EQ(w->stats().commits, 2 * static_cast<int64_t>((want.size() + 2) / 3));
  // Every batch after the first was read while the one before it was applied.
  EXPECT_EQ(w->stats().prefetched_cuts, w->stats().batches - 1);
  auto t = DeltaTable::Open((lake_->path() / kBronze).string());
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->ReadLastTxn("oml-lakewriter")->version, LastOutboxSeq());
  w.reset();  // a finished writer still holds the lease until its session ends

  // Nothing new: a second run commits nothing.
  LakeWriter again(Opts(3));
  ASSERT_TRUE(again.RunOnce().ok());
  EXPECT_EQ(again.stats().commits, 0);
  EXPECT_EQ(CommitBounds().size(), static_cast<size_t>(commits));

  // New events are drained from the frontier on.
  AddEvents("drain-c");
  ASSERT_TRUE(again.RunOnce().ok());
  ExpectDrainedExactlyOnce();
}

// Compaction bounds the files per table: with a batch per row and compact_every = 3, every third
// commit to a table asks for an OPTIMIZE. gold (a MERGE table) is compacted on the batch path,
// so exactly n / 3 times; bronze by the compactor thread, where requests that arrive while one
// is queued coalesce (between 1 and n / 3 OPTIMIZE commits), and RunOnce waits for it. Either
// way the last compaction saw every commit up to the last request, so at most 1 + n % 3 files
// are live, and rows, txn versions and the gold counts are unchanged.
TEST_F(LakeWriterTest, CompactionBoundsTheFilesPerTableAndKeepsEveryRowOnce) {
  AddEvents("compact-a");
  AddEvents("compact-b");
  const size_t n = OutboxSeqs().size();
  ASSERT_GE(n, 10u);
  LakeWriterOptions o = Opts(1);
  o.compact_every = 3;
  LakeWriter w(o);
  ASSERT_TRUE(w.RunOnce().ok());
  ExpectDrainedExactlyOnce();
  EXPECT_EQ(w.stats().batches, static_cast<int64_t>(n));
  int64_t all_optimizes = 0;
  for (const char* table : {"bronze/events", "gold/daily_activity"}) {
    // Live files: adds minus removes over the whole log.
    std::set<std::string> live;
    int64_t optimizes = 0;
    for (int64_t v = 1;; ++v) {
      char name[32];
      std::snprintf(name, sizeof(name), "%020lld.json", static_cast<long long>(v));
      std::ifstream in(lake_->path() / table / "_delta_log" / name);
      if (!in) break;
      for (std::string line; std::getline(in, line);) {
        if (line.empty()) continue;
        auto a = nlohmann::json::parse(line);
        if (a.contains("add")) live.insert(a["add"]["path"].get<std::string>());
        if (a.contains("remove")) live.erase(a["remove"]["path"].get<std::string>());
        if (a.contains("commitInfo") && a["commitInfo"].value("operation", "") == "OPTIMIZE") ++optimizes;
      }
    }
    if (std::string(table) == kBronze) {
      EXPECT_GE(optimizes, 1) << table;
      EXPECT_LE(optimizes, static_cast<int64_t>(n / 3)) << table;
    } else {
      EXPECT_EQ(optimizes, static_cast<int64_t>(n / 3)) << table;
    }
    all_optimizes += optimizes;
    EXPECT_LE(live.size(), 1u + n % 3) << table;  // the compacted file and the commits after it
    auto t = DeltaTable::Open((lake_->path() / table).string());
    ASSERT_TRUE(t.ok());
    EXPECT_EQ(t->ReadLastTxn("oml-lakewriter")->version, LastOutboxSeq()) << table;
  }
  EXPECT_EQ(w.stats().compactions, all_optimizes);
  // delta.checkpointInterval 10: delta-rs checkpoints the version v with (v + 1) % 10 == 0.
  EXPECT_TRUE(fs::exists(lake_->path() / kBronze / "_delta_log" / "00000000000000000009.checkpoint.parquet"));
  EXPECT_EQ(w.stats().retried_commits + w.stats().conflicts, 2 * w.stats().retried_commits);
}

// A writer counts towards compact_every the small files a predecessor left, not only its own
// commits: the first writer commits six one-row bronze files under compact_every = 7 and stops
// (as a kill would stop it) before compacting; the second starts its count from those files, so
// its one commit (the seventh small file) asks for the compaction. Counting from zero, the
// second writer would have left seven files (bench/soak, writers killed every few minutes: one
// file per batch).
TEST_F(LakeWriterTest, ARestartedWriterCountsTheSmallFilesItsPredecessorLeft) {
  AddEvents("restart-a");  // six events
  auto bronze_files = [&] {
    auto t = DeltaTable::Open((lake_->path() / kBronze).string());
    EXPECT_TRUE(t.ok());
    return t.ok() ? t->Files()->size() : size_t{0};
  };
  {
    LakeWriterOptions o = Opts(1);
    o.compact_every = 7;
    LakeWriter first(o);
    ASSERT_TRUE(first.RunOnce().ok());
    EXPECT_EQ(first.stats().batches, 6);
    EXPECT_EQ(first.stats().compactions, 0);
  }
  ASSERT_EQ(bronze_files(), 6u);
  AddEvents("restart-b");  // six more, one batch
  LakeWriterOptions o = Opts(1000);
  o.compact_every = 7;
  LakeWriter second(o);
  ASSERT_TRUE(second.RunOnce().ok());
  EXPECT_EQ(second.stats().batches, 1);
  ExpectDrainedExactlyOnce();
  EXPECT_EQ(bronze_files(), 1u);  // the seven compacted into one
}

// The compactor's OPTIMIZE commits between the writer's txn check and its bronze commit (forced
// with the before_commit sync point, which compacts bronze through a second handle as the
// compactor thread would). The writer's commit loses, sees that its stream's txn did not move
// (no other writer), and commits again at once on the new snapshot: no failed attempt, no
// recovery, every row once. A writer that treated every conflict as another writer would fail
// the batch and recover instead (retried_commits 0).
TEST_F(LakeWriterTest, ACommitThatLosesToACompactionIsCommittedAgainAtOnce) {
  AddEvents("rebase-a");
  {
    LakeWriterOptions o = Opts(1);  // several small bronze files to compact
    o.compact_every = 0;
    LakeWriter first(o);
    ASSERT_TRUE(first.RunOnce().ok());
  }
  AddEvents("rebase-b");
  int compacted = 0;
  SyncPoints::Set("lakewriter.before_commit.bronze/events", [&]() -> Status {
    if (compacted++ > 0) return Status::Ok();
    auto t = DeltaTable::Open((lake_->path() / kBronze).string());
    if (!t.ok()) return t.status();
    auto done = t->Optimize(uint64_t{128} << 20);
    if (!done.ok()) return done.status();
    EXPECT_GE(done->first, 2);
    return Status::Ok();
  });
  LakeWriterOptions o = Opts(1000);
  o.compact_every = 0;
  LakeWriter w(o);
  ASSERT_TRUE(w.RunOnce().ok());
  EXPECT_EQ(compacted, 2);  // the first commit, and the one that went again
  EXPECT_EQ(w.stats().conflicts, 1);
  EXPECT_EQ(w.stats().retried_commits, 1);
  EXPECT_EQ(w.stats().recovered_batches, 0);
  EXPECT_EQ(w.stats().batches, 1);
  ExpectDrainedExactlyOnce();
  // bronze's log: the first writer's batches, the OPTIMIZE, then the batch committed again.
  std::vector<std::string> ops;
  for (int64_t v = 1;; ++v) {
    char name[32];
    std::snprintf(name, sizeof(name), "%020lld.json", static_cast<long long>(v));
    std::ifstream in(lake_->path() / kBronze / "_delta_log" / name);
    if (!in) break;
    for (std::string line; std::getline(in, line);) {
      if (line.empty()) continue;
      auto a = nlohmann::json::parse(line);
      if (a.contains("commitInfo")) ops.push_back(a["commitInfo"].value("operation", std::string()));
    }
  }
  ASSERT_GE(ops.size(), 3u);
  EXPECT_EQ(std::count(ops.begin(), ops.end(), "OPTIMIZE"), 1);
  EXPECT_EQ(ops[ops.size() - 2], "OPTIMIZE");
  EXPECT_NE(ops.back(), "OPTIMIZE");
}

// A failure at each step leaves the lake and frontier such that a new writer (a restarted
// process) ends with every row exactly once, and a batch that reached a table is finished from
// the bounds that table recorded, never re-cut and never committed twice. A batch's tables are
// committed at once: every before_commit point comes before any of them starts, every
// after_commit point after all of them ended, and lakewriter.commit.<table> fails one table's
// commit on its own thread while the other lands (so either table can be the one ahead).
TEST_F(LakeWriterTest, AFailureAtEveryStepIsRecoveredByTheNextWriter) {
  const std::string kGold = "gold/daily_activity";
  struct Step {
    std::string point;
    bool bronze, gold;  // the failing batch reached the table
  };
  const std::vector<Step> steps = {{"lakewriter.after_cut", false, false},
                                   {"lakewriter.before_commit.bronze/events", false, false},
                                   {"lakewriter.before_commit.gold/daily_activity", false, false},
                                   {"lakewriter.commit.bronze/events", false, true},
                                   {"lakewriter.commit.gold/daily_activity", true, false},
                                   {"lakewriter.after_commit.bronze/events", true, true},
                                   {"lakewriter.after_commit.gold/daily_activity", true, true},
                                   {"lakewriter.before_frontier_advance", true, true}};
  for (size_t i = 0; i < steps.size(); ++i) {
    const Step& step = steps[i];
    SCOPED_TRACE(step.point);
    SetUp();
    AddEvents("fault-" + std::to_string(i));
    // A first writer drains a batch, then fails at the point in the second batch for good.
    std::atomic<int> hits{0};
    SyncPoints::Set(step.point, [&] {
      return ++hits >= 2 ? Status(Code::kInternal, "injected", "injected-fault") : Status::Ok();
    });
    {
      LakeWriterOptions o = Opts(4);
      o.once_max_attempts = 1;
      LakeWriter first(o);
      Status st = first.RunOnce();
      ASSERT_FALSE(st.ok());
      EXPECT_EQ(st.type(), "injected-fault");
      EXPECT_EQ(first.stats().batches, 1);
    }
    SyncPoints::ClearAll();
    const auto before = CommitBounds();
    const auto gold_before = CommitBounds(kGold);
    ASSERT_EQ(before.size(), step.bronze ? 2u : 1u);
    ASSERT_EQ(gold_before.size(), step.gold ? 2u : 1u);
    EXPECT_EQ(PgFrontier(), before[0].end);
    if (step.bronze != step.gold) {  // the table ahead recorded the failed batch's bounds
      const auto& ahead = step.bronze ? before.back() : gold_before.back();
      EXPECT_EQ(ahead.start, before[0].end);
    }

    LakeWriter next(Opts(4));
    Status st = next.RunOnce();
    ASSERT_TRUE(st.ok()) << st.ToString();
    EXPECT_EQ(next.stats().recovered_batches, step.bronze || step.gold ? 1 : 0);
    ExpectDrainedExactlyOnce();
    // The commits of the first writer are untouched, and the failed batch was not written again:
    // the table behind got it from the bounds the other recorded.
    for (const auto& [table, was] : {std::pair{std::string(kBronze), before}, std::pair{kGold, gold_before}}) {
      SCOPED_TRACE(table);
      const auto after = CommitBounds(table);
      ASSERT_GE(after.size(), 2u);
      EXPECT_TRUE(std::equal(was.begin(), was.end(), after.begin()));
      EXPECT_EQ(after[1].start, before[0].end);
      if (step.bronze || step.gold) EXPECT_EQ(after[1].end, (step.bronze ? before : gold_before)[1].end);
    }
    TearDown();
  }
}

// Two writers at once, the lease bypassed on purpose: A is held after its txn check, B drains
// everything, then A's commit loses to B's on the Delta log and A recovers without writing.
TEST_F(LakeWriterTest, TwoWritersAtOnceTheDeltaConflictFencesTheSecond) {
  AddEvents("race-a");
  LakeWriter a(Racing("writer-a")), b(Racing("writer-b"));
  Status sa = WhileHeldAt(a, "lakewriter.before_commit.bronze/events", [&] {
    Status sb = b.RunOnce();
    ASSERT_TRUE(sb.ok()) << sb.ToString();
    EXPECT_EQ(b.stats().commits, 2);  // bronze and gold
  });
  ASSERT_TRUE(sa.ok()) << sa.ToString();
  EXPECT_EQ(a.stats().conflicts, 2);  // bronze's and gold's commits, made at once, both lost
  EXPECT_EQ(a.stats().commits, 0);
  ExpectDrainedExactlyOnce();
  EXPECT_EQ(CommitBounds().size(), 1u);
}

// The same race with the tables committed at once, split between the writers: A's bronze commit
// lands while its gold commit is held on its own thread; B finds bronze holding the batch, skips
// it, commits gold and advances the frontier; A's gold commit then loses to B's, A is fenced
// (the txn moved) and recovers without writing. Each table holds the batch once: bronze A's
// commit, gold B's.
TEST_F(LakeWriterTest, TwoWritersSplitABatchsTablesAndEachTableHoldsItOnce) {
  AddEvents("race-split");
  LakeWriter a(Racing("writer-a")), b(Racing("writer-b"));
  Status sa = WhileHeldAt(a, "lakewriter.commit.gold/daily_activity", [&] {
    // A's bronze commit runs beside the held gold commit; wait for it to land.
    oml::testing::WaitUntil([&] { return CommitBounds().size() == 1; }, "A's bronze commit");
    Status sb = b.RunOnce();
    ASSERT_TRUE(sb.ok()) << sb.ToString();
    EXPECT_EQ(b.stats().commits, 1);         // gold only
    EXPECT_EQ(b.stats().skipped_tables, 1);  // bronze held the batch already
    EXPECT_EQ(PgFrontier(), LastOutboxSeq());
  });
  ASSERT_TRUE(sa.ok()) << sa.ToString();
  EXPECT_EQ(a.stats().commits, 1);          // bronze
  EXPECT_EQ(a.stats().conflicts, 1);        // gold, lost to B's
  EXPECT_EQ(a.stats().retried_commits, 0);  // fenced, not committed again
  ExpectDrainedExactlyOnce();
  const auto bronze = CommitBounds(), gold = CommitBounds("gold/daily_activity");
  ASSERT_EQ(bronze.size(), 1u);
  ASSERT_EQ(gold.size(), 1u);
  EXPECT_EQ(bronze[0].start, gold[0].start);
  EXPECT_EQ(bronze[0].end, gold[0].end);
}

// Conformance, the stable-prefix race at the writer's level (ARCHITECTURE.md "The outbox cut"):
// tenant B's transaction draws seq s and stays open, tenant A's event draws s+1 and commits. The
// running writer must not cut past s-1 while B is open, and takes both once B commits.
TEST_F(LakeWriterTest, TheRunningWriterNeverCutsPastARowStillInFlight) {
  AddEvents("race-prefix-a");
  AddEvents("race-prefix-b");
  auto ta = journal::LookupTenant(tj_->pool, "race-prefix-a");
  auto tb = journal::LookupTenant(tj_->pool, "race-prefix-b");
  ASSERT_TRUE(ta.ok() && tb.ok());
  LakeWriter w(Opts(1000));
  std::atomic<bool> stop{false};
  Status st;
  std::thread run([&] { st = w.Run(&stop); });
  oml::testing::WaitUntil([&] { return PgFrontier() == LastOutboxSeq(); }, "the backlog drained");

  auto txn = tj_->journal.Begin();
  ASSERT_TRUE(txn.ok());
  journal::EventSpec ev{"test.in_flight", "tester"};
  auto held = txn->Append(tb->tenant_id, ev);  // seq s drawn, transaction left open
  ASSERT_TRUE(held.ok()) << held.status().ToString();
  // The seq it drew: the sequence's last value (its row is invisible to every other session).
  auto last_value = [&] {
    return (*su_->Exec("SELECT pg_sequence_last_value('oml.outbox_seq')")).GetInt(0, 0);
  };
  const int64_t s_held = last_value();
  ASSERT_EQ(LastOutboxSeq(), s_held - 1);
  auto later = tj_->journal.Append(ta->tenant_id, journal::EventSpec{"test.committed", "tester"});
  ASSERT_TRUE(later.ok()) << later.status().ToString();
  const int64_t s_later = last_value();
  ASSERT_EQ(LastOutboxSeq(), s_later);
  ASSERT_GT(s_later, s_held);
  std::this_thread::sleep_for(std::chrono::milliseconds(1000));  // five polls
  EXPECT_LT(PgFrontier(), s_held) << "the writer cut past a row still in flight";
  EXPECT_LT(BronzeSeqs().back(), s_held);

  ASSERT_TRUE(txn->Commit().ok());
  oml::testing::WaitUntil([&] { return PgFrontier() == s_later; }, "both rows drained");
  stop = true;
  run.join();
  ASSERT_TRUE(st.ok()) << st.ToString();
  ExpectDrainedExactlyOnce();
}

TEST_F(LakeWriterTest, TheLeaseIsASingletonAndPassesOnWhenItsSessionEnds) {
  auto a = std::make_unique<LakeWriter>(Opts(10, "writer-a"));
  auto got_a = a->TryAcquireLease();
  ASSERT_TRUE(got_a.ok()) << got_a.status().ToString();
  ASSERT_TRUE(*got_a);
  const int64_t epoch_a = a->lease_epoch();
  EXPECT_EQ((*su_->Exec("SELECT lease_holder, lease_epoch FROM oml.lake_frontier WHERE stream = 'default'")).Get(0, 0),
            "writer-a");

  LakeWriter b(Opts(10, "writer-b"));
  auto got_b = b.TryAcquireLease();
  ASSERT_TRUE(got_b.ok()) << got_b.status().ToString();
  EXPECT_FALSE(*got_b);

  // B waits as standby in Run; A's session ends (as with kill -9: PostgreSQL drops the lock).
  std::atomic<bool> stop{false};
  AddEvents("lease-a");
  Status sb;
  std::thread tb([&] { sb = b.Run(&stop); });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_FALSE(b.lease_held());
  const auto t0 = std::chrono::steady_clock::now();
  a.reset();
  oml::testing::WaitUntil([&] { return PgFrontier() == LastOutboxSeq(); }, "the standby takes over and drains");
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  // Gold, which trails the frontier while batches come (LakeWriterOptions::gold_every), is
  // brought to it once the writer is idle: one commit, and one xid to record it.
  oml::testing::WaitUntil(
      [&] {
        auto r = su_->Exec("SELECT txn_version FROM oml.lake_table_txn WHERE table_name = 'gold/daily_activity'");
        return r.ok() && r->size() == 1 && r->GetInt(0, 0) == LastOutboxSeq();
      },
      "gold catches up with the frontier");
  // Idle, the writer polls every 200 ms without taking an xid (a horizon probe takes one only
  // once a new seq was drawn): ours are the only xids assigned meanwhile.
  auto xid = [&] { return std::stoll((*su_->Exec("SELECT pg_current_xact_id()::text")).Get(0, 0)); };
  const int64_t x0 = xid();
  std::this_thread::sleep_for(std::chrono::milliseconds(1000));
  EXPECT_EQ(xid(), x0 + 1);
  stop = true;
  tb.join();
  ASSERT_TRUE(sb.ok()) << sb.ToString();
  EXPECT_EQ(b.lease_epoch(), epoch_a + 1);
  EXPECT_EQ((*su_->Exec("SELECT lease_holder FROM oml.lake_frontier WHERE stream = 'default'")).Get(0, 0), "writer-b");
  ExpectDrainedExactlyOnce();
}

// Only the lease holder's process compacts (issue 18). A writer with the lease bypassed (tests
// only) never compacts, whatever compact_every says. And a writer whose lease another process
// took over (a new epoch) while its compactor was between the snapshot and the OPTIMIZE drops
// that request: no OPTIMIZE is written by a process without the lease.
TEST_F(LakeWriterTest, OnlyTheLeaseHolderCompacts) {
  AddEvents("nolease-a");
  auto optimizes = [&](const char* table) {
    int64_t n = 0;
    for (const auto& f : fs::directory_iterator(lake_->path() / table / "_delta_log")) {
      if (f.path().extension() != ".json") continue;
      std::ifstream in(f.path());
      for (std::string line; std::getline(in, line);)
        if (line.find("\"commitInfo\"") != std::string::npos && line.find("\"operation\":\"OPTIMIZE\"") != std::string::npos) ++n;
    }
    return n;
  };
  {
    LakeWriterOptions o = Opts(1);
    o.bypass_lease = true;
    o.compact_every = 1;
    LakeWriter w(o);
    ASSERT_TRUE(w.RunOnce().ok());
    EXPECT_EQ(w.stats().batches, static_cast<int64_t>(OutboxSeqs().size()));  // a batch per row
    EXPECT_EQ(w.stats().compactions, 0);
  }
  for (const char* table : {"bronze/events", "silver/claims", "gold/daily_activity"}) EXPECT_EQ(optimizes(table), 0) << table;
  ExpectDrainedExactlyOnce();

  AddEvents("nolease-b");
  LakeWriterOptions o = Opts(1000);  // one batch
  o.compact_every = 1;
  LakeWriter w(o);
  oml::testing::HoldFirst hold("lakewriter.compaction.after_snapshot.bronze/events");
  Status st;
  std::thread t([&] { st = w.RunOnce(); });  // RunOnce waits for the compactor before it returns
  hold.WaitUntilHeld();
  // Another process takes the lease over: a new epoch (its advisory lock is not needed here).
  ASSERT_TRUE(su_->Exec("UPDATE oml.lake_frontier SET lease_epoch = lease_epoch + 1 WHERE stream = 'default'").ok());
  hold.Release();
  t.join();
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(w.stats().compactions_without_lease, 1);
  EXPECT_EQ(optimizes("bronze/events"), 0);  // bronze has bronze files to compact, none was
  ExpectDrainedExactlyOnce();
}

}  // namespace
}  // namespace oml::lake
