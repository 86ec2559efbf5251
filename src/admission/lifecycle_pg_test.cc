// Later acts of the admission lifecycle (admission/lifecycle.h; sql/0014_lifecycle.sql) against a
// real PostgreSQL cluster: reassignment and simulations, their events, guards, silver/claims
// outbox rows, races (a simulation's end against a submission under it, both orders, forced
// with sync points) and `oml verify --folds` (journal/folds.h) over the new fold rows.
#include "admission/lifecycle.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <thread>
#include <tuple>
#include <vector>

#include "common/sync_point_testing.h"
#include "common/temp_dir_testing.h"
#include "common/work_pool.h"
#include "db/test_cluster.h"
#include "journal/folds.h"
#include "journal/provider.h"
#include "journal/test_journal.h"

namespace oml::admission {
namespace {

using nlohmann::json;

class LifecycleTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    tj_ = new journal::testing::TestJournal(6);
    oml::testing::ScopedTempDir tmp("oml-lifecycle-test");
    const std::string kek_file = (tmp.path() / "kek.key").string();
    ASSERT_TRUE(crypto::FileKekProvider::Generate(kek_file).ok());
    kek_ = crypto::FileKekProvider::Load(kek_file).value().release();
    claims_ = new Claims(&tj_->journal, &tj_->pool, kek_, 1 << 20);
    lc_ = new Lifecycle(&tj_->journal, &tj_->pool, claims_);
    checks_ = new WorkPool(2);
  }
  void TearDown() override { SyncPoints::ClearAll(); }

  // A fresh tenant per test: alice and bob (writers), rita (reviewer), ada (admin): seqs 2-5.
  void SetUp() override {
    static int n = 0;
    name_ = "lifecycle-" + std::to_string(++n);
    auto t = journal::CreateTenant(tj_->journal, name_);
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    tenant_ = t->tenant_id;
    alice_ = Key("alice", "writer");
    bob_ = Key("bob", "writer");
    rita_ = Key("rita", "reviewer");
    ada_ = Key("ada", "admin");
    auto su = db::Conn::Connect(db::testing::SuperuserUrl());
    ASSERT_TRUE(su.ok());
    su_ = std::make_unique<db::Conn>(std::move(su).value());
  }

  Caller Key(const std::string& principal, const std::string& role) {
    auto k = journal::CreateApiKey(tj_->journal, tenant_, principal, role);
    EXPECT_TRUE(k.ok()) << k.status().ToString();
    return {tenant_, principal, role, k->key_id, crypto::Sha256(k->token)};
  }
  static SubmitRequest Req(const std::string& body, std::optional<std::string> sim = std::nullopt) {
    return {body, "wa-" + body, "notes/" + body + ".md", "agent", std::move(sim), "text/plain"};
  }
  ClaimMeta Submit(const Caller& c, const std::string& body, std::optional<std::string> sim = std::nullopt) {
    auto s = claims_->Submit(c, Req(body, std::move(sim)));
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    return s.ok() ? s->meta : ClaimMeta{};
  }
  journal::Receipt Act(const ClaimMeta& m, ReviewAct act) {
    auto r = claims_->Review(rita_, m.artifact_id, act, "");
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? r->second : journal::Receipt{};
  }
  int64_t Head() {
    auto r = su_->Query("SELECT seq FROM oml.chain_heads WHERE tenant_id = $1", {db::Text(tenant_)});
    EXPECT_TRUE(r.ok() && r->size() == 1);
    return r.ok() ? r->GetInt(0, 0) : -1;
  }
  std::string TimeAt(int64_t seq) {
    auto r = su_->Query("SELECT signed_bytes FROM oml.journal WHERE tenant_id = $1 AND seq = $2",
                        {db::Text(tenant_), db::Int(seq)});
    EXPECT_TRUE(r.ok() && r->size() == 1);
    auto e = journal::Envelope::FromSignedBytes(r->GetBytes(0, 0));
    return e.ok() ? e->time : "";
  }
  // (journal_seq, row_data) of the tenant's silver/claims outbox rows, in outbox order.
  std::vector<std::pair<int64_t, json>> Silver() {
    auto r = su_->Query("SELECT journal_seq, row_data::text FROM oml.outbox WHERE tenant_id = $1 "
                        "AND target_table = 'silver/claims' ORDER BY seq",
                        {db::Text(tenant_)});
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    std::vector<std::pair<int64_t, json>> out;
    for (int i = 0; r.ok() && i < r->size(); ++i) out.emplace_back(r->GetInt(i, 0), json::parse(r->Get(i, 1)));
    return out;
  }
  // state, retracted_seq (0 if NULL), workarea_id, path of a claim's version 1.
  std::tuple<std::string, int64_t, std::string, std::string> Row(const std::string& artifact_id) {
    auto r = su_->Query("SELECT state, coalesce(retracted_seq, 0), workarea_id, path FROM oml.artifacts "
                        "WHERE tenant_id = $1 AND artifact_id = $2 AND version = 1",
                        {db::Text(tenant_), db::Text(artifact_id)});
    EXPECT_TRUE(r.ok() && r->size() == 1) << (r.ok() ? "no row" : r.status().ToString());
    if (!r.ok() || r->size() != 1) return {};
    return {r->Get(0, 0), r->GetInt(0, 1), r->Get(0, 2), r->Get(0, 3)};
  }
  std::vector<std::string> Types() {
    auto r = su_->Query("SELECT event_type FROM oml.journal WHERE tenant_id = $1 ORDER BY seq", {db::Text(tenant_)});
    std::vector<std::string> out;
    for (int i = 0; r.ok() && i < r->size(); ++i) out.push_back(r->Get(i, 0));
    return out;
  }
  // This tenant's findings of `oml verify --folds`, formatted.
  std::vector<std::string> FoldFindings() {
    journal::FoldOptions o;
    o.only_tenant = name_;
    auto rep = journal::VerifyFolds(tj_->pool, *checks_, o);
    EXPECT_TRUE(rep.ok()) << rep.status().ToString();
    std::vector<std::string> out;
    if (rep.ok())
      for (const auto& d : rep->diffs) out.push_back(journal::FormatFoldDiff(d));
    return out;
  }
  static void Refused(const Status& s, Code code, const std::string& type) {
    EXPECT_EQ(s.code(), code) << s.ToString();
    EXPECT_EQ(s.type(), type) << s.ToString();
  }

  static journal::testing::TestJournal* tj_;
  static crypto::FileKekProvider* kek_;
  static Claims* claims_;
  static Lifecycle* lc_;
  static WorkPool* checks_;
  std::string tenant_, name_;
  Caller alice_, bob_, rita_, ada_;
  std::unique_ptr<db::Conn> su_;
};
journal::testing::TestJournal* LifecycleTest::tj_;
crypto::FileKekProvider* LifecycleTest::kek_;
Claims* LifecycleTest::claims_;
Lifecycle* LifecycleTest::lc_;
WorkPool* LifecycleTest::checks_;

TEST_F(LifecycleTest, ReassignWhoMayAndWhatItChanges) {
  const ClaimMeta held = Submit(alice_, "h");  // seq 6, wa-h
  const int64_t head = Head();
  // Checks in order; nothing is journalled by a refusal.
  Refused(lc_->Reassign(rita_, held.artifact_id, "wa-x", std::string(1025, 'r')).status(), Code::kInvalidArgument,
          "invalid-field");
  Refused(lc_->Reassign(rita_, held.artifact_id, "", "").status(), Code::kInvalidArgument, "invalid-field");
  Refused(lc_->Reassign(rita_, held.artifact_id, "wa\n", "").status(), Code::kInvalidArgument, "invalid-field");
  Refused(lc_->Reassign(rita_, "not-a-uuid", "wa-x", "").status(), Code::kNotFound, "claim-not-found");
  Refused(lc_->Reassign(bob_, held.artifact_id, "wa-x", "").status(), Code::kNotFound, "claim-not-found");  // hidden
  Refused(lc_->Reassign(rita_, held.artifact_id, "wa-h", "").status(), Code::kFailedPrecondition, "workarea-unchanged");
  EXPECT_EQ(Head(), head);

  // The author may move a held claim; the event names both workareas, the versions and the reason.
  auto a = lc_->Reassign(alice_, held.artifact_id, "wa-mine", "filed wrongly");
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(a->first.workarea_id, "wa-mine");
  EXPECT_EQ(a->first.path, "notes/h.md");
  auto env = journal::Envelope::FromSignedBytes(a->second.signed_bytes);
  ASSERT_TRUE(env.ok());
  EXPECT_EQ(env->type, "claim.reassigned");
  EXPECT_EQ(env->principal, "alice");
  EXPECT_EQ(env->payload, json({{"artifact_id", held.artifact_id},
                                {"versions", json::array({1})},
                                {"from_workarea_id", "wa-h"},
                                {"to_workarea_id", "wa-mine"},
                                {"reason", "filed wrongly"}}));
  EXPECT_EQ(Row(held.artifact_id), std::make_tuple(std::string("held"), int64_t{0}, std::string("wa-mine"),
                                                    std::string("notes/h.md")));
  EXPECT_TRUE(Silver().empty()) << "a never-promoted claim has no silver row to move";

  // Once reviewed, the author may not; a reviewer or an admin may, and the silver row follows.
  const journal::Receipt p = Act(held, ReviewAct::kAccept);
  auto denied = lc_->Reassign(alice_, held.artifact_id, "wa-later", "");
  Refused(denied.status(), Code::kPermissionDenied, "forbidden-role");
  EXPECT_EQ(denied.status().message(), "only reviewers, admins and the author of a held claim may reassign it");
  Refused(lc_->Reassign(bob_, held.artifact_id, "wa-later", "").status(), Code::kPermissionDenied, "forbidden-role");
  auto r = lc_->Reassign(ada_, held.artifact_id, "wa-final", "");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  auto rows = Silver();
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[1].first, r->second.seq);
  EXPECT_EQ(rows[1].second["workarea_id"], "wa-final");
  EXPECT_EQ(rows[0].second["workarea_id"], "wa-mine");
  EXPECT_EQ(rows[1].second["path"], "notes/h.md");
  EXPECT_EQ(rows[1].second["state"], "promoted");
  EXPECT_EQ(rows[1].second["last_event_seq"], r->second.seq);
  // The state did not change: state_changed_at stays the promotion's time.
  EXPECT_EQ(rows[1].second["state_changed_at"], TimeAt(p.seq));
  EXPECT_EQ(rows[1].second["promoted_at"], TimeAt(p.seq));
  EXPECT_EQ(rows[1].second["provenance"], "agent");

  // Erased: 410.
  ASSERT_TRUE(claims_->Erase(ada_, held.artifact_id, "").ok());
  Refused(lc_->Reassign(ada_, held.artifact_id, "wa-gone", "").status(), Code::kGone, "erased");
  EXPECT_TRUE(FoldFindings().empty());
}

// Two reassignments of one claim, the second queued behind the first's open transaction: the
// second's guard (the workarea it found) refuses it; exactly one is journalled.
TEST_F(LifecycleTest, RacingReassignmentsJournalExactlyOne) {
  const ClaimMeta m = Submit(alice_, "r");
  Result<std::pair<ClaimMeta, journal::Receipt>> first = Status(Code::kInternal, "unset");
  Result<std::pair<ClaimMeta, journal::Receipt>> second = Status(Code::kInternal, "unset");
  {
    oml::testing::HoldFirst hold("journal.after_outbox_insert");
    std::thread a([&] { first = lc_->Reassign(rita_, m.artifact_id, "wa-1", ""); });
    hold.WaitUntilHeld();
    std::thread b([&] { second = lc_->Reassign(ada_, m.artifact_id, "wa-1", ""); });
    oml::testing::WaitUntil([&] { return tj_->journal.QueueDepth(tenant_) >= 1; }, "second reassignment queued");
    hold.Release();
    a.join();
    b.join();
  }
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  Refused(second.status(), Code::kFailedPrecondition, "workarea-unchanged");
  auto types = Types();
  EXPECT_EQ(std::count(types.begin(), types.end(), "claim.reassigned"), 1);
}

TEST_F(LifecycleTest, SimulationStartEndAndSubmissionsUnderIt) {
  // Start: reviewers and admins; fields first.
  Refused(lc_->StartSimulation(rita_, "", "").status(), Code::kInvalidArgument, "invalid-field");
  Refused(lc_->StartSimulation(rita_, "s1", "bad\ndescription").status(), Code::kInvalidArgument, "invalid-field");
  Refused(lc_->StartSimulation(alice_, "s1", "").status(), Code::kPermissionDenied, "forbidden-role");
  // A submission naming a simulation never started: 409, nothing written.
  int64_t head = Head();
  Refused(claims_->Submit(alice_, Req("early", "s1")).status(), Code::kFailedPrecondition, "simulation-not-running");
  EXPECT_EQ(Head(), head);

  auto s = lc_->StartSimulation(rita_, "s1", "what if");
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->first.state, "running");
  EXPECT_EQ(s->first.started_seq, s->second.seq);
  auto env = journal::Envelope::FromSignedBytes(s->second.signed_bytes);
  ASSERT_TRUE(env.ok());
  EXPECT_EQ(env->type, "simulation.started");
  EXPECT_EQ(env->payload, json({{"simulation_id", "s1"}, {"description", "what if"}}));
  Refused(lc_->StartSimulation(ada_, "s1", "").status(), Code::kFailedPrecondition, "simulation-exists");
  ASSERT_TRUE(lc_->StartSimulation(ada_, "s2", "").ok());

  // Claims under s1 in every state, one erased, one under s2, one under none.
  const ClaimMeta held = Submit(alice_, "held", "s1");
  const ClaimMeta promoted = Submit(alice_, "promoted", "s1");
  const journal::Receipt p = Act(promoted, ReviewAct::kAccept);
  const ClaimMeta demoted = Submit(bob_, "demoted", "s1");
  Act(demoted, ReviewAct::kAccept);
  const journal::Receipt dm = Act(demoted, ReviewAct::kDemote);
  const ClaimMeta rejected = Submit(bob_, "rejected", "s1");
  Act(rejected, ReviewAct::kReject);
  const ClaimMeta erased = Submit(alice_, "erased", "s1");
  ASSERT_TRUE(claims_->Erase(alice_, erased.artifact_id, "").ok());
  const ClaimMeta other = Submit(alice_, "other", "s2");
  const ClaimMeta plain = Submit(alice_, "plain");
  auto silver = Silver();
  ASSERT_EQ(silver.size(), 3u);  // promoted, demoted's promotion and demotion
  EXPECT_EQ(silver[0].second["provenance"], "simulation") << "a simulated claim's provenance class";
  EXPECT_EQ(silver[0].second["simulation_id"], "s1");

  // End: reviewers and admins; unknown ids 404.
  Refused(lc_->EndSimulation(alice_, "s1", "").status(), Code::kPermissionDenied, "forbidden-role");
  Refused(lc_->EndSimulation(rita_, "nope", "").status(), Code::kNotFound, "simulation-not-found");
  auto e = lc_->EndSimulation(ada_, "s1", "done");
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  const int64_t es = e->second.seq;
  EXPECT_EQ(e->first.state, "ended");
  EXPECT_EQ(e->first.ended_seq, std::optional<int64_t>(es));
  EXPECT_EQ(e->first.retracted, std::optional<int64_t>(4));
  auto eenv = journal::Envelope::FromSignedBytes(e->second.signed_bytes);
  ASSERT_TRUE(eenv.ok());
  EXPECT_EQ(eenv->type, "simulation.ended");
  EXPECT_EQ(eenv->payload, json({{"simulation_id", "s1"}, {"reason", "done"}}));
  for (const ClaimMeta* m : {&held, &promoted, &demoted, &rejected})
    EXPECT_EQ(std::get<0>(Row(m->artifact_id)) + "@" + std::to_string(std::get<1>(Row(m->artifact_id))),
              "retracted@" + std::to_string(es))
        << m->path;
  EXPECT_EQ(std::get<0>(Row(erased.artifact_id)), "erased");
  EXPECT_EQ(std::get<0>(Row(other.artifact_id)), "held");
  EXPECT_EQ(std::get<0>(Row(plain.artifact_id)), "held");
  // Silver retracts for the two ever-promoted claims, in the end's transaction, in submission order.
  silver = Silver();
  ASSERT_EQ(silver.size(), 5u);
  for (int i : {3, 4}) {
    EXPECT_EQ(silver[i].first, es);
    EXPECT_EQ(silver[i].second["state"], "retracted");
    EXPECT_EQ(silver[i].second["state_changed_at"], TimeAt(es));
    EXPECT_EQ(silver[i].second["provenance"], "simulation");
  }
  EXPECT_EQ(silver[3].second["artifact_id"], promoted.artifact_id);
  EXPECT_EQ(silver[3].second["promoted_at"], TimeAt(p.seq));
  EXPECT_EQ(silver[4].second["artifact_id"], demoted.artifact_id);
  EXPECT_EQ(silver[4].second["last_event_seq"], es);
  EXPECT_LT(dm.seq, es);

  // Retracted claims are private again (own-work rule), and no review act applies to them.
  EXPECT_EQ(claims_->Fetch(bob_, promoted.artifact_id).status().code(), Code::kNotFound);
  EXPECT_TRUE(claims_->Fetch(alice_, promoted.artifact_id).ok());
  auto again = claims_->Review(rita_, held.artifact_id, ReviewAct::kAccept, "");
  Refused(again.status(), Code::kFailedPrecondition, "claim-not-held");
  EXPECT_EQ(again.status().message(), "claim " + held.artifact_id + " is retracted, not held");
  // Ended: a second end and a submission are 409; nothing written.
  head = Head();
  auto e2 = lc_->EndSimulation(rita_, "s1", "");
  Refused(e2.status(), Code::kFailedPrecondition, "simulation-not-running");
  EXPECT_EQ(e2.status().message(), "the simulation ended at seq " + std::to_string(es));
  auto late = claims_->Submit(alice_, Req("late", "s1"));
  Refused(late.status(), Code::kFailedPrecondition, "simulation-not-running");
  EXPECT_EQ(late.status().message(), "the claim names a simulation that ended at seq " + std::to_string(es));
  EXPECT_EQ(Head(), head);
  // A retracted claim can still be erased (its silver row then says erased).
  auto x = claims_->Erase(ada_, promoted.artifact_id, "");
  ASSERT_TRUE(x.ok()) << x.status().ToString();
  EXPECT_EQ(Silver().back().second["state"], "erased");
  auto g = lc_->GetSimulation(bob_, "s1");
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(g->state, "ended");
  EXPECT_EQ(g->description, "what if");
  EXPECT_TRUE(FoldFindings().empty());
}

// The end commits while a submission under the simulation is between its check and its append:
// the submission's fold guard refuses it. Exactly one outcome: no claim, 409.
TEST_F(LifecycleTest, EndBeforeARacingSubmissionRefusesIt) {
  ASSERT_TRUE(lc_->StartSimulation(rita_, "race", "").ok());
  Result<SubmitResult> sub = Status(Code::kInternal, "unset");
  {
    oml::testing::HoldFirst hold("claims.submit.after_simulation_check");
    std::thread t([&] { sub = claims_->Submit(alice_, Req("racer", "race")); });
    hold.WaitUntilHeld();  // the check passed: the simulation was running
    auto e = lc_->EndSimulation(ada_, "race", "");
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    EXPECT_EQ(e->first.retracted, std::optional<int64_t>(0));
    hold.Release();
    t.join();
  }
  Refused(sub.status(), Code::kFailedPrecondition, "simulation-not-running");
  EXPECT_EQ(Types().back(), "simulation.ended");
  auto n = su_->Query("SELECT count(*) FROM oml.artifacts WHERE tenant_id = $1", {db::Text(tenant_)});
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(n->GetInt(0, 0), 0);
}

// The submission commits while the end is between its check and its append: the end's fold
// retracts the new claim in its own transaction. Exactly one outcome: the claim exists, retracted.
TEST_F(LifecycleTest, SubmissionBeforeARacingEndIsRetractedByIt) {
  ASSERT_TRUE(lc_->StartSimulation(rita_, "race", "").ok());
  Result<std::pair<Simulation, journal::Receipt>> end = Status(Code::kInternal, "unset");
  ClaimMeta m;
  {
    oml::testing::HoldFirst hold("lifecycle.simulation_end.before_append");
    std::thread t([&] { end = lc_->EndSimulation(ada_, "race", ""); });
    hold.WaitUntilHeld();  // the end found it running
    m = Submit(alice_, "racer", std::string("race"));
    hold.Release();
    t.join();
  }
  ASSERT_TRUE(end.ok()) << end.status().ToString();
  EXPECT_EQ(end->first.retracted, std::optional<int64_t>(1));
  EXPECT_EQ(std::get<0>(Row(m.artifact_id)), "retracted");
  EXPECT_EQ(std::get<1>(Row(m.artifact_id)), end->second.seq);
  EXPECT_GT(end->second.seq, m.submitted_seq);
}

// Two ends of one simulation: one is journalled.
TEST_F(LifecycleTest, RacingEndsJournalExactlyOne) {
  ASSERT_TRUE(lc_->StartSimulation(rita_, "twice", "").ok());
  Result<std::pair<Simulation, journal::Receipt>> a = Status(Code::kInternal, "unset");
  Result<std::pair<Simulation, journal::Receipt>> b = Status(Code::kInternal, "unset");
  {
    oml::testing::HoldFirst hold("lifecycle.simulation_end.before_append");
    std::thread t([&] { a = lc_->EndSimulation(ada_, "twice", ""); });
    hold.WaitUntilHeld();
    b = lc_->EndSimulation(rita_, "twice", "");  // passes its own check; commits first
    hold.Release();
    t.join();
  }
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  Refused(a.status(), Code::kFailedPrecondition, "simulation-not-running");
  auto types = Types();
  EXPECT_EQ(std::count(types.begin(), types.end(), "simulation.ended"), 1);
}

TEST_F(LifecycleTest, VerifyFoldsReplaysTheActsAndFindsHandEdits) {
  ASSERT_TRUE(lc_->StartSimulation(rita_, "sim", "d").ok());  // seq 6
  const ClaimMeta m = Submit(alice_, "m", "sim");              // seq 7
  const ClaimMeta k = Submit(alice_, "k");                     // seq 8
  auto r = lc_->Reassign(rita_, k.artifact_id, "wa-new", "");  // seq 9
  ASSERT_TRUE(r.ok());
  auto e = lc_->EndSimulation(ada_, "sim", "");                // seq 10
  ASSERT_TRUE(e.ok());
  ASSERT_EQ(e->second.seq, 10);
  EXPECT_EQ(FoldFindings(), std::vector<std::string>{});
  const std::string t = name_;
  ASSERT_TRUE(su_->Query("UPDATE oml.artifacts SET workarea_id = 'wa-k' WHERE artifact_id = $1", {db::Text(k.artifact_id)}).ok());
  EXPECT_EQ(FoldFindings(), std::vector<std::string>{"FOLD artifacts tenant " + t + " " + k.artifact_id +
                                                     " v1: workarea_id expected wa-new, found wa-k (seq 9)"});
  ASSERT_TRUE(su_->Query("UPDATE oml.artifacts SET workarea_id = 'wa-new' WHERE artifact_id = $1", {db::Text(k.artifact_id)}).ok());
  ASSERT_TRUE(su_->Query("UPDATE oml.artifacts SET state = 'held', retracted_seq = NULL WHERE artifact_id = $1",
                         {db::Text(m.artifact_id)}).ok());
  ASSERT_TRUE(su_->Query("UPDATE oml.simulations SET state = 'running', ended_seq = NULL WHERE tenant_id = $1",
                         {db::Text(tenant_)}).ok());
  EXPECT_EQ(FoldFindings(), (std::vector<std::string>{
                                "FOLD artifacts tenant " + t + " " + m.artifact_id + " v1: retracted_seq expected 10, found NULL (seq 10)",
                                "FOLD artifacts tenant " + t + " " + m.artifact_id + " v1: state expected retracted, found held (seq 10)",
                                "FOLD simulations tenant " + t + " sim: ended_seq expected 10, found NULL (seq 10)",
                                "FOLD simulations tenant " + t + " sim: state expected ended, found running (seq 10)",
                            }));
  ASSERT_TRUE(su_->Query("DELETE FROM oml.simulations WHERE tenant_id = $1", {db::Text(tenant_)}).ok());
  ASSERT_TRUE(su_->Query("UPDATE oml.artifacts SET state = 'retracted', retracted_seq = 10 WHERE artifact_id = $1",
                         {db::Text(m.artifact_id)}).ok());
  EXPECT_EQ(FoldFindings(), std::vector<std::string>{"FOLD simulations tenant " + t + " sim: missing row (seq 6)"});
}

}  // namespace
}  // namespace oml::admission
