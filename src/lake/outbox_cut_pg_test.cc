// Conformance: the stable-prefix race (issue 8; ARCHITECTURE.md "The outbox cut").
//
// Two real connections, stepped by hand, replay the counter-example: T_a takes an xid, T_b takes
// a larger xid and draws seq 5, T_a draws seq 6 and commits. The exact cut (lake/outbox_cut.h)
// must not reach 6 while 5 is in flight, and covers both once T_b commits. The naive rule ("rows
// whose xid is below the snapshot's xmin"), implemented here only, cuts at 6 and skips 5 for
// ever: weakening the rule in outbox_cut.cc to it makes TheExactCutWaitsForTheSmallerSeq fail.
// A long transaction holds the horizon back, loses nothing, and is named.
#include "lake/outbox_cut.h"

#include <gtest/gtest.h>
#include <libpq-fe.h>

#include <algorithm>
#include <thread>

#include "db/conn.h"
#include "db/test_cluster.h"
#include "journal/provider.h"
#include "journal/test_journal.h"

namespace oml::lake {
namespace {

using std::chrono::milliseconds;

// Long enough for any transaction of this binary's own setup to finish.
constexpr milliseconds kSettle{10000};
// How long a cut waits for an in-flight transaction that this test keeps open on purpose.
constexpr milliseconds kHeld{300};

std::vector<int64_t> Seqs(const std::vector<OutboxRow>& rows) {
  std::vector<int64_t> s;
  for (const auto& r : rows) s.push_back(r.seq);
  return s;
}
bool Has(const std::vector<OutboxRow>& rows, int64_t seq) {
  return std::any_of(rows.begin(), rows.end(), [&](const OutboxRow& r) { return r.seq == seq; });
}

// One hand-stepped session of the application role: the statements a commit-point transaction
// runs, one at a time.
class Session {
 public:
  explicit Session(const std::string& url) : c_(std::move(db::Conn::Connect(url)).value()) {}
  void Begin(const std::string& tenant) {
    ASSERT_TRUE(c_.Exec("BEGIN ISOLATION LEVEL READ COMMITTED").ok());
    ASSERT_TRUE(c_.Query("SELECT set_config('oml.tenant_id', $1, true)", {db::Text(tenant)}).ok());
    tenant_ = tenant;
  }
  // What the journal INSERT does first in every commit-point transaction: take an xid.
  uint64_t TakeXid() {
    auto r = c_.Query("SELECT pg_current_xact_id()::text");
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? std::stoull(r->Get(0, 0)) : 0;
  }
  // The commit point's own call: oml.enqueue_outbox in the tenant's scope. Returns the seq.
  int64_t Enqueue(const std::string& note) {
    auto r = c_.Query("SELECT oml.enqueue_outbox($1, 'bronze/events', 1, jsonb_build_object('note', $2::text))",
                      {db::Text(tenant_), db::Text(note)});
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? r->GetInt(0, 0) : -1;
  }
  void Commit() {
    auto r = c_.Exec("COMMIT");
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ASSERT_EQ(r->CommandTag(), "COMMIT");
  }
  void Rollback() { ASSERT_TRUE(c_.Exec("ROLLBACK").ok()); }
  int pid() const { return PQbackendPID(c_.raw()); }

 private:
  db::Conn c_;
  std::string tenant_;
};

class OutboxCutTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    tj_ = new journal::testing::TestJournal(4);
    tenant_a_ = std::move(journal::CreateTenant(tj_->journal, "cut-a")).value().tenant_id;
    tenant_b_ = std::move(journal::CreateTenant(tj_->journal, "cut-b")).value().tenant_id;
  }
  void SetUp() override {
    lw_ = std::make_unique<db::Conn>(std::move(db::Conn::Connect(db::testing::LakewriterUrl())).value());
    stream_ = std::move(ResolveStream(kDefaultStream)).value();
  }

  // The writer's exact cut: the newest stable horizon it can get within `wait`, then a batch.
  Cut ExactCut(int64_t frontier, int64_t previous_horizon, milliseconds wait) {
    auto h = StableHorizon(*lw_, stream_, previous_horizon, wait);
    EXPECT_TRUE(h.ok()) << h.status().ToString();
    auto cut = CutBatch(*lw_, stream_, frontier, h.ok() ? *h : previous_horizon, 100000);
    EXPECT_TRUE(cut.ok()) << cut.status().ToString();
    return cut.ok() ? std::move(*cut) : Cut{};
  }

  // The naive rule, implemented only here: every row after the frontier whose inserting
  // transaction is older than every running one (xid < the snapshot's xmin) is "stable", and the
  // batch ends at the largest such seq.
  Cut NaiveCut(int64_t frontier) {
    auto r = lw_->Query("SELECT coalesce(max(seq), $1) FROM oml.outbox "
                        "WHERE seq > $1 AND xid < pg_snapshot_xmin(pg_current_snapshot())",
                        {db::Int(frontier)});
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    Cut cut{frontier, r.ok() ? r->GetInt(0, 0) : frontier, {}};
    auto rows = ReadRange(*lw_, stream_, frontier, cut.batch_end);
    EXPECT_TRUE(rows.ok()) << rows.status().ToString();
    if (rows.ok()) cut.rows = std::move(*rows);
    return cut;
  }

  static journal::testing::TestJournal* tj_;
  static std::string tenant_a_, tenant_b_;
  std::unique_ptr<db::Conn> lw_;
  OutboxStream stream_;
};
journal::testing::TestJournal* OutboxCutTest::tj_ = nullptr;
std::string OutboxCutTest::tenant_a_, OutboxCutTest::tenant_b_;

TEST_F(OutboxCutTest, TheExactCutWaitsForTheSmallerSeq) {
  // Everything enqueued so far is final: the writer's frontier F is the stable horizon now.
  auto f = StableHorizon(*lw_, stream_, 0, kSettle);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  const int64_t F = *f;

  Session ta(db::testing::AppUrl()), tb(db::testing::AppUrl());
  ta.Begin(tenant_a_);
  const uint64_t xid_a = ta.TakeXid();  // T_a gets xid 99
  tb.Begin(tenant_b_);
  const int64_t seq5 = tb.Enqueue("T_b");  // T_b gets xid 100 and draws seq 5
  const uint64_t xid_b = tb.TakeXid();
  const int64_t seq6 = ta.Enqueue("T_a");  // T_a draws seq 6
  ta.Commit();                             // ... and commits; T_b is still in flight
  ASSERT_LT(xid_a, xid_b);
  ASSERT_LT(F, seq5);
  ASSERT_LT(seq5, seq6);

  // What the writer can see is incomplete: 6 is visible, 5 is not.
  auto visible = ReadRange(*lw_, stream_, F, seq6);
  ASSERT_TRUE(visible.ok()) << visible.status().ToString();
  EXPECT_TRUE(Has(*visible, seq6));
  EXPECT_FALSE(Has(*visible, seq5));

  // The naive rule cuts at 6 without 5 ...
  Cut naive = NaiveCut(F);
  EXPECT_EQ(naive.batch_end, seq6);
  EXPECT_TRUE(Has(naive.rows, seq6));
  EXPECT_FALSE(Has(naive.rows, seq5));

  // ... the exact rule does not cut past F while 5 is in flight: not with a bounded wait, not
  // with the tracker, and its probe names T_b as the holder (T_a has committed).
  Cut exact = ExactCut(F, F, kHeld);
  EXPECT_EQ(exact.batch_end, F);
  EXPECT_TRUE(exact.rows.empty()) << ::testing::PrintToString(Seqs(exact.rows));
  HorizonTracker tracker(stream_, F);
  ASSERT_EQ(*tracker.Poll(*lw_), F);
  ASSERT_TRUE(tracker.pending().has_value());
  EXPECT_GE(tracker.pending()->candidate, seq6);
  EXPECT_EQ(*tracker.Poll(*lw_), F);
  auto stable = IsStable(*lw_, *tracker.pending());
  ASSERT_TRUE(stable.ok());
  EXPECT_FALSE(*stable);
  auto holders = HorizonHolders(*lw_, *tracker.pending());
  ASSERT_TRUE(holders.ok()) << holders.status().ToString();
  ASSERT_EQ(holders->size(), 1u);
  EXPECT_EQ((*holders)[0].pid, tb.pid());
  EXPECT_EQ((*holders)[0].xid, xid_b);
  EXPECT_EQ((*holders)[0].state, "idle in transaction");

  tb.Commit();

  // Now the horizon covers both, and the batch holds 5 then 6.
  Cut after = ExactCut(F, F, kSettle);
  EXPECT_GE(after.batch_end, seq6);
  auto seqs = Seqs(after.rows);
  auto p5 = std::find(seqs.begin(), seqs.end(), seq5), p6 = std::find(seqs.begin(), seqs.end(), seq6);
  ASSERT_NE(p5, seqs.end());
  ASSERT_NE(p6, seqs.end());
  EXPECT_LT(p5, p6);
  EXPECT_TRUE(std::is_sorted(seqs.begin(), seqs.end()));
  EXPECT_EQ((*HorizonHolders(*lw_, *tracker.pending())).size(), 0u);
  auto polled = tracker.Poll(*lw_);
  ASSERT_TRUE(polled.ok());
  EXPECT_GE(*polled, seq6);  // the pending probe resolved

  // The naive writer advanced its frontier to 6 and moves on from there: 5 is never cut.
  Cut naive_next = NaiveCut(naive.batch_end);
  EXPECT_FALSE(Has(naive_next.rows, seq5));
  EXPECT_FALSE(Has(naive.rows, seq5) || Has(naive_next.rows, seq5)) << "the naive rule skipped seq " << seq5;
}

// `oml status` probes without taking an xid (issue 18): the same counter-example, where T_b's
// xid is at the snapshot's xmax (T_a, below it, committed), so only pg_locks shows it running.
TEST_F(OutboxCutTest, TheProbeWithoutAnXidWaitsForTheSmallerSeqAndTakesNoXid) {
  auto f = StableHorizon(*lw_, stream_, 0, kSettle);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  auto next_xid = [&]() {
    auto r = lw_->Query("SELECT pg_snapshot_xmax(pg_current_snapshot())::text");
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? std::stoull(r->Get(0, 0)) : 0;
  };
  Session ta(db::testing::AppUrl()), tb(db::testing::AppUrl());
  ta.Begin(tenant_a_);
  const uint64_t xid_a = ta.TakeXid();
  tb.Begin(tenant_b_);
  const int64_t seq5 = tb.Enqueue("T_b");
  const uint64_t xid_b = tb.TakeXid();
  const int64_t seq6 = ta.Enqueue("T_a");
  ta.Commit();
  ASSERT_LT(xid_a, xid_b);
  ASSERT_LT(seq5, seq6);
  const uint64_t xmax_before = next_xid();
  ASSERT_LE(xmax_before, xid_b) << "T_b is not above the xmax: the case is not the hard one";

  auto probe = ProbeHorizonWithoutXid(*lw_, stream_);
  ASSERT_TRUE(probe.ok()) << probe.status().ToString();
  EXPECT_GE(probe->candidate, seq6);
  EXPECT_EQ(probe->fence_xid, xid_b + 1);
  auto stable = IsStable(*lw_, *probe);
  ASSERT_TRUE(stable.ok());
  EXPECT_FALSE(*stable);
  auto holders = HorizonHolders(*lw_, *probe);
  ASSERT_TRUE(holders.ok()) << holders.status().ToString();
  ASSERT_EQ(holders->size(), 1u);
  EXPECT_EQ((*holders)[0].xid, xid_b);
  EXPECT_EQ((*holders)[0].pid, tb.pid());
  // No xid was taken: the next xid is where it was.
  EXPECT_EQ(next_xid(), xmax_before);

  tb.Commit();
  stable = IsStable(*lw_, *probe);
  ASSERT_TRUE(stable.ok());
  EXPECT_TRUE(*stable);
  EXPECT_EQ((*HorizonHolders(*lw_, *probe)).size(), 0u);
}

TEST_F(OutboxCutTest, ALongTransactionHoldsTheHorizonLosesNothingAndIsNamed) {
  auto f = StableHorizon(*lw_, stream_, 0, kSettle);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  const int64_t F = *f;

  // An idle transaction of any role that holds an xid, here one that writes nothing at all.
  auto long_conn = db::Conn::Connect(db::testing::AppUrl() + "&application_name=oml-test-long-xact");
  ASSERT_TRUE(long_conn.ok());
  ASSERT_TRUE(long_conn->Exec("BEGIN").ok());
  auto xid = long_conn->Query("SELECT pg_current_xact_id()::text");
  ASSERT_TRUE(xid.ok());
  const uint64_t long_xid = std::stoull(xid->Get(0, 0));
  const int long_pid = PQbackendPID(long_conn->raw());

  // Real appends commit meanwhile (one outbox row each).
  std::vector<int64_t> journal_seqs;
  for (int i = 0; i < 3; ++i) {
    auto r = tj_->journal.Append(tenant_a_, journal::EventSpec{"test.note", "tester", {{"i", i}}, nlohmann::json::object(), nullptr});
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    journal_seqs.push_back(r->seq);
  }

  auto probe = ProbeHorizon(*lw_, stream_);
  ASSERT_TRUE(probe.ok()) << probe.status().ToString();
  Cut held = ExactCut(F, F, kHeld);
  EXPECT_EQ(held.batch_end, F);
  EXPECT_TRUE(held.rows.empty());

  auto holders = HorizonHolders(*lw_, *probe);
  ASSERT_TRUE(holders.ok()) << holders.status().ToString();
  ASSERT_EQ(holders->size(), 1u);
  const HorizonHolder& h = (*holders)[0];
  EXPECT_EQ(h.pid, long_pid);
  EXPECT_EQ(h.xid, long_xid);
  EXPECT_EQ(h.role, "oml_app");
  EXPECT_EQ(h.application_name, "oml-test-long-xact");
  EXPECT_EQ(h.state, "idle in transaction");
  EXPECT_TRUE(h.gid.empty());
  EXPECT_GE(h.xid_age, 3);  // three appends began after it
  ASSERT_TRUE(h.xact_age_s.has_value());
  EXPECT_GE(*h.xact_age_s, kHeld.count() / 1000.0);
  EXPECT_TRUE(h.xact_start.has_value());
  EXPECT_TRUE(h.query_start.has_value());

  // Without pg_read_all_stats the holder is still named, without its times.
  {
    auto su = db::Conn::Connect(db::testing::SuperuserUrl());
    ASSERT_TRUE(su.ok());
    ASSERT_TRUE(su->Exec("REVOKE pg_read_all_stats FROM oml_lakewriter").ok());
    auto plain = db::Conn::Connect(db::testing::LakewriterUrl());
    auto bare = plain.ok() ? HorizonHolders(*plain, *probe) : Result<std::vector<HorizonHolder>>(plain.status());
    ASSERT_TRUE(su->Exec("GRANT pg_read_all_stats TO oml_lakewriter").ok());
    ASSERT_TRUE(bare.ok()) << bare.status().ToString();
    ASSERT_EQ(bare->size(), 1u);
    EXPECT_EQ((*bare)[0].pid, long_pid);
    EXPECT_EQ((*bare)[0].xid, long_xid);
    EXPECT_FALSE((*bare)[0].xact_start.has_value());
    EXPECT_FALSE((*bare)[0].query_start.has_value());
    EXPECT_FALSE((*bare)[0].xact_age_s.has_value());
  }

  ASSERT_TRUE(long_conn->Exec("COMMIT").ok());
  Cut after = ExactCut(F, F, kSettle);
  EXPECT_GE(after.batch_end, probe->candidate);
  std::vector<int64_t> got;
  for (const auto& r : after.rows)
    if (r.tenant_id == tenant_a_ && r.target_table == "bronze/events") got.push_back(r.journal_seq);
  EXPECT_EQ(got, journal_seqs);  // nothing lost, nothing doubled, in seq order
}

TEST_F(OutboxCutTest, SizeChoosesBatchEndInsideTheStablePrefixAndGapsAreCrossed) {
  auto f = StableHorizon(*lw_, stream_, 0, kSettle);
  ASSERT_TRUE(f.ok());
  const int64_t F = *f;
  Session s(db::testing::AppUrl());
  std::vector<int64_t> seqs;
  for (int i = 0; i < 5; ++i) {
    s.Begin(tenant_b_);
    seqs.push_back(s.Enqueue("row " + std::to_string(i)));
    s.Commit();
  }
  s.Begin(tenant_b_);
  const int64_t rolled_back = s.Enqueue("never");
  s.Rollback();
  auto h = StableHorizon(*lw_, stream_, F, kSettle);
  ASSERT_TRUE(h.ok());
  ASSERT_GE(*h, rolled_back);

  // Two rows per batch: batch_end is each batch's last row; the rows are ReadRange's.
  auto c1 = CutBatch(*lw_, stream_, F, *h, 2);
  ASSERT_TRUE(c1.ok());
  EXPECT_EQ(Seqs(c1->rows), (std::vector<int64_t>{seqs[0], seqs[1]}));
  EXPECT_EQ(c1->batch_end, seqs[1]);
  auto again = ReadRange(*lw_, stream_, c1->frontier, c1->batch_end);  // a recovery's rebuild
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(Seqs(*again), Seqs(c1->rows));
  auto c2 = CutBatch(*lw_, stream_, c1->batch_end, *h, 2);
  ASSERT_TRUE(c2.ok());
  EXPECT_EQ(Seqs(c2->rows), (std::vector<int64_t>{seqs[2], seqs[3]}));
  // The short last batch takes the whole stable prefix, across the rolled-back seq.
  auto c3 = CutBatch(*lw_, stream_, c2->batch_end, *h, 2);
  ASSERT_TRUE(c3.ok());
  EXPECT_EQ(Seqs(c3->rows), (std::vector<int64_t>{seqs[4]}));
  EXPECT_EQ(c3->batch_end, *h);
  EXPECT_FALSE(Has(c3->rows, rolled_back));
  // At the horizon there is nothing to cut.
  auto c4 = CutBatch(*lw_, stream_, *h, *h, 2);
  ASSERT_TRUE(c4.ok());
  EXPECT_EQ(c4->batch_end, *h);
  EXPECT_TRUE(c4->rows.empty());
  EXPECT_EQ(CutBatch(*lw_, stream_, F, *h, 0).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(ReadRange(*lw_, stream_, 5, 4).status().code(), Code::kInvalidArgument);
}

TEST_F(OutboxCutTest, TheProbeRefusesAnOpenTransaction) {
  ASSERT_TRUE(lw_->Exec("BEGIN").ok());
  auto p = ProbeHorizon(*lw_, stream_);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), Code::kFailedPrecondition);
  EXPECT_EQ(p.status().type(), "transaction-open");
  ASSERT_TRUE(lw_->Exec("ROLLBACK").ok());
}

TEST_F(OutboxCutTest, StreamsAndAppIds) {
  auto d = ResolveStream("default");
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->table, "oml.outbox");
  EXPECT_EQ(d->sequence, "oml.outbox_seq");
  EXPECT_EQ(AppIdFor("default"), "oml-lakewriter");
  EXPECT_EQ(AppIdFor("shard-7"), "oml-lakewriter-shard-7");
  EXPECT_EQ(ResolveStream("shard-7").status().type(), "unknown-stream");
  EXPECT_EQ(ResolveStream("Bad Name").status().type(), "invalid-field");
  EXPECT_EQ(ResolveStream("").status().type(), "invalid-field");
  auto frontier = ReadFrontier(*lw_, *d);
  ASSERT_TRUE(frontier.ok()) << frontier.status().ToString();
  EXPECT_EQ(*frontier, 0);
  OutboxStream ghost{"ghost", "oml.outbox", "oml.outbox_seq"};
  EXPECT_EQ(ReadFrontier(*lw_, ghost).status().type(), "unknown-stream");
}

}  // namespace
}  // namespace oml::lake
