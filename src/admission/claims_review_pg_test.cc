// Review acts (admission/claims.h, Review; sql/0009_review.sql) against a real PostgreSQL cluster:
// who may act, from which state, the digest-only events, the silver/claims outbox rows that
// promotion, demotion and erasure enqueue in the same transaction, and two acts racing on one
// claim (in one process's group commit, and from two journals as two servers would).
#include "admission/claims.h"

#include <gtest/gtest.h>

#include "admission/lifecycle.h"

#include <thread>
#include <vector>

#include "common/sync_point_testing.h"
#include "common/temp_dir_testing.h"
#include "db/test_cluster.h"
#include "journal/provider.h"
#include "journal/test_journal.h"

namespace oml::admission {
namespace {

using nlohmann::json;

class ReviewTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    tj_ = new journal::testing::TestJournal(6);
    oml::testing::ScopedTempDir tmp("oml-review-test");
    const std::string kek_file = (tmp.path() / "kek.key").string();
    ASSERT_TRUE(crypto::FileKekProvider::Generate(kek_file).ok());
    kek_ = crypto::FileKekProvider::Load(kek_file).value().release();
    claims_ = new Claims(&tj_->journal, &tj_->pool, kek_, 1 << 20);
  }

  // A fresh tenant per test: alice and bob (writers), rita (reviewer), ada (admin).
  void SetUp() override {
    static int n = 0;
    auto t = journal::CreateTenant(tj_->journal, "review-" + std::to_string(++n));
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
  ClaimMeta Submit(const Caller& c, const std::string& body, std::optional<std::string> sim = std::nullopt) {
    auto s = claims_->Submit(c, {body, "wa-" + body, "notes/" + body + ".md", "agent", std::move(sim), "text/markdown"});
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    return s.ok() ? s->meta : ClaimMeta{};
  }
  std::pair<ClaimMeta, journal::Receipt> Act(const Caller& c, const ClaimMeta& m, ReviewAct act,
                                             const std::string& reason = "") {
    auto r = claims_->Review(c, m.artifact_id, act, reason);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? *r : std::pair<ClaimMeta, journal::Receipt>{};
  }

  // The envelope time of the tenant's event at `seq`, from its signed bytes.
  std::string TimeAt(int64_t seq) {
    auto r = su_->Query("SELECT signed_bytes FROM oml.journal WHERE tenant_id = $1 AND seq = $2",
                        {db::Text(tenant_), db::Int(seq)});
    EXPECT_TRUE(r.ok() && r->size() == 1);
    auto e = journal::Envelope::FromSignedBytes(r->GetBytes(0, 0));
    EXPECT_TRUE(e.ok());
    return e.ok() ? e->time : "";
  }
  // The tenant's silver/claims outbox rows in outbox order: (journal_seq, row_data).
  std::vector<std::pair<int64_t, json>> Silver() {
    auto r = su_->Query("SELECT journal_seq, row_data::text FROM oml.outbox WHERE tenant_id = $1 "
                        "AND target_table = 'silver/claims' ORDER BY seq",
                        {db::Text(tenant_)});
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    std::vector<std::pair<int64_t, json>> out;
    for (int i = 0; r.ok() && i < r->size(); ++i) out.emplace_back(r->GetInt(i, 0), json::parse(r->Get(i, 1)));
    return out;
  }
  // Event types of the tenant's chain that name `artifact_id` in their payload, in seq order.
  std::vector<std::string> EventsOf(const std::string& artifact_id) {
    auto r = su_->Query("SELECT event_type FROM oml.journal WHERE tenant_id = $1 AND "
                        "convert_from(signed_bytes, 'UTF8')::jsonb -> 'payload' ->> 'artifact_id' = $2 ORDER BY seq",
                        {db::Text(tenant_), db::Text(artifact_id)});
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    std::vector<std::string> out;
    for (int i = 0; r.ok() && i < r->size(); ++i) out.push_back(r->Get(i, 0));
    return out;
  }
  // The silver row the contract expects for `m` as promoted at `promoted`, for the event at `seq`.
  json ExpectedRow(const ClaimMeta& m, int64_t promoted, const std::string& state, int64_t seq) {
    return {{"tenant_id", tenant_},
            {"artifact_id", m.artifact_id},
            {"version", 1},
            {"workarea_id", m.workarea_id},
            {"path", m.path},
            {"writer_key_id", m.writer_key_id},
            {"principal", m.principal},
            {"submitted_at", TimeAt(m.submitted_seq)},
            {"promoted_at", TimeAt(promoted)},
            // The provenance class: "simulation" under a simulation (sql/0014).
            {"provenance", m.simulation_id ? std::string("simulation") : m.provenance},
            {"simulation_id", m.simulation_id ? json(*m.simulation_id) : json(nullptr)},
            {"plaintext_sha256", crypto::Hex(m.plaintext_sha256)},
            {"ciphertext_sha256", crypto::Hex(m.ciphertext_sha256)},
            {"media_type", m.media_type},
            {"size_bytes", m.size},
            {"body_location", "postgres:oml.artifact_bodies"},
            {"state", state},
            {"state_changed_at", TimeAt(seq)},
            {"last_event_seq", seq}};
  }

  static journal::testing::TestJournal* tj_;
  static crypto::FileKekProvider* kek_;
  static Claims* claims_;
  std::string tenant_;
  Caller alice_, bob_, rita_, ada_;
  std::unique_ptr<db::Conn> su_;
};
journal::testing::TestJournal* ReviewTest::tj_;
crypto::FileKekProvider* ReviewTest::kek_;
Claims* ReviewTest::claims_;

TEST_F(ReviewTest, OnlyReviewersAndAdminsActAndOnlyFromTheActsState) {
  const ClaimMeta m = Submit(alice_, "draft");
  const std::string id = m.artifact_id;
  // Writers may not review, their own claims included; nothing is journalled.
  for (ReviewAct act : {ReviewAct::kAccept, ReviewAct::kReject, ReviewAct::kDemote}) {
    auto w = claims_->Review(alice_, id, act, "");
    EXPECT_EQ(w.status().code(), Code::kPermissionDenied);
    EXPECT_EQ(w.status().type(), "forbidden-role");
    EXPECT_EQ(w.status().message(), "role writer may not review claims");
  }
  // The reason follows CheckReason, checked first.
  EXPECT_EQ(claims_->Review(rita_, id, ReviewAct::kAccept, std::string(1025, 'r')).status().type(), "invalid-field");
  EXPECT_EQ(claims_->Review(rita_, id, ReviewAct::kAccept, "line\nbreak").status().type(), "invalid-field");
  // Unknown, malformed and other tenants' ids are 404.
  EXPECT_EQ(claims_->Review(rita_, "0b7e6a52-8f0c-4d7e-9a51-3f2c1d0e9b8a", ReviewAct::kAccept, "").status().type(),
            "claim-not-found");
  EXPECT_EQ(claims_->Review(rita_, "not-a-uuid", ReviewAct::kAccept, "").status().type(), "claim-not-found");
  Caller foreign = rita_;
  auto other = journal::CreateTenant(tj_->journal, "review-other-" + tenant_.substr(0, 8));
  ASSERT_TRUE(other.ok());
  foreign.tenant_id = other->tenant_id;
  foreign.api_key_hash.clear();
  EXPECT_EQ(claims_->Review(foreign, id, ReviewAct::kAccept, "").status().code(), Code::kNotFound);
  // Demote needs a promoted claim.
  auto d = claims_->Review(rita_, id, ReviewAct::kDemote, "");
  EXPECT_EQ(d.status().code(), Code::kFailedPrecondition);
  EXPECT_EQ(d.status().type(), "claim-not-promoted");
  EXPECT_EQ(d.status().message(), "claim " + id + " is held, not promoted");
  EXPECT_EQ(EventsOf(id), (std::vector<std::string>{"claim.submitted"}));

  // Accept: promoted, promoted_seq = the event's seq.
  auto [pm, prc] = Act(rita_, m, ReviewAct::kAccept, "looks right");
  EXPECT_EQ(pm.state, "promoted");
  EXPECT_EQ(pm.promoted_seq, std::optional<int64_t>(prc.seq));
  // A second verdict of either kind: 409 naming the state.
  for (ReviewAct act : {ReviewAct::kAccept, ReviewAct::kReject}) {
    auto again = claims_->Review(ada_, id, act, "");
    EXPECT_EQ(again.status().code(), Code::kFailedPrecondition);
    EXPECT_EQ(again.status().type(), "claim-not-held");
    EXPECT_EQ(again.status().message(), "claim " + id + " is promoted, not held");
  }
  // Demote (an admin may too); a second demotion is 409.
  auto [dm, drc] = Act(ada_, m, ReviewAct::kDemote, "superseded");
  EXPECT_EQ(dm.state, "demoted");
  EXPECT_EQ(dm.promoted_seq, std::optional<int64_t>(prc.seq));
  EXPECT_EQ(dm.demoted_seq, std::optional<int64_t>(drc.seq));
  auto d2 = claims_->Review(rita_, id, ReviewAct::kDemote, "");
  EXPECT_EQ(d2.status().type(), "claim-not-promoted");
  EXPECT_EQ(d2.status().message(), "claim " + id + " is demoted, not promoted");
  EXPECT_EQ(claims_->Review(rita_, id, ReviewAct::kAccept, "").status().message(), "claim " + id + " is demoted, not held");
  // Erased: 410 for every act, as Fetch answers.
  auto e = claims_->Erase(ada_, id, "");
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  for (ReviewAct act : {ReviewAct::kAccept, ReviewAct::kReject, ReviewAct::kDemote}) {
    auto g = claims_->Review(rita_, id, act, "");
    EXPECT_EQ(g.status().code(), Code::kGone);
    EXPECT_EQ(g.status().message(), "claim " + id + " was erased at seq " + std::to_string(e->second.seq));
  }
  EXPECT_EQ(EventsOf(id),
            (std::vector<std::string>{"claim.submitted", "claim.promoted", "claim.demoted", "artifact.erased"}));

  // The artifacts row records every act's seq.
  auto row = su_->Query("SELECT state, promoted_seq, rejected_seq IS NULL, demoted_seq, erased_seq FROM oml.artifacts "
                        "WHERE tenant_id = $1 AND artifact_id = $2",
                        {db::Text(tenant_), db::Text(id)});
  ASSERT_TRUE(row.ok() && row->size() == 1);
  EXPECT_EQ(row->Get(0, 0), "erased");
  EXPECT_EQ(row->GetInt(0, 1), prc.seq);
  EXPECT_EQ(row->Get(0, 2), "t");
  EXPECT_EQ(row->GetInt(0, 3), drc.seq);
  EXPECT_EQ(row->GetInt(0, 4), e->second.seq);
}

TEST_F(ReviewTest, EventsAreDigestOnly) {
  ASSERT_TRUE(Lifecycle(&tj_->journal, &tj_->pool, claims_).StartSimulation(ada_, "sim-9", "").ok());
  auto s = claims_->Submit(alice_, {"secret-body-text", "wa-9", "notes/9.md", "agent", std::string("sim-9"), "text/plain"});
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  const ClaimMeta m = s->meta;
  auto [pm, prc] = Act(rita_, m, ReviewAct::kAccept, "ok");
  auto env = journal::Envelope::FromSignedBytes(prc.signed_bytes);
  ASSERT_TRUE(env.ok());
  EXPECT_EQ(env->type, "claim.promoted");
  EXPECT_EQ(env->principal, "rita");
  EXPECT_EQ(env->payload, json({{"artifact_id", m.artifact_id},
                                {"version", 1},
                                {"workarea_id", "wa-9"},
                                {"plaintext_sha256", crypto::Hex(crypto::Sha256("secret-body-text"))},
                                {"ciphertext_sha256", crypto::Hex(m.ciphertext_sha256)},
                                {"reason", "ok"},
                                {"verdict", "accept"}}));
  EXPECT_EQ(prc.signed_bytes.find("secret-body-text"), std::string::npos) << "no body in the signed bytes";
  auto [dm, drc] = Act(ada_, m, ReviewAct::kDemote);
  auto denv = journal::Envelope::FromSignedBytes(drc.signed_bytes);
  ASSERT_TRUE(denv.ok());
  EXPECT_EQ(denv->type, "claim.demoted");
  EXPECT_EQ(denv->payload, json({{"artifact_id", m.artifact_id},
                                 {"version", 1},
                                 {"workarea_id", "wa-9"},
                                 {"plaintext_sha256", crypto::Hex(m.plaintext_sha256)},
                                 {"ciphertext_sha256", crypto::Hex(m.ciphertext_sha256)},
                                 {"reason", ""}}));
  const ClaimMeta r = Submit(bob_, "rejected-one");
  auto [rm, rrc] = Act(ada_, r, ReviewAct::kReject, "wrong");
  EXPECT_EQ(rm.state, "rejected");
  EXPECT_EQ(rm.rejected_seq, std::optional<int64_t>(rrc.seq));
  auto renv = journal::Envelope::FromSignedBytes(rrc.signed_bytes);
  ASSERT_TRUE(renv.ok());
  EXPECT_EQ(renv->type, "claim.rejected");
  EXPECT_EQ(renv->payload["verdict"], "reject");
  EXPECT_EQ(renv->payload["reason"], "wrong");
  // The bronze row of each review event carries the claim columns its payload names.
  auto b = su_->Query("SELECT row_data->>'event_type', row_data->>'artifact_id', row_data->>'version', "
                      "row_data->>'ciphertext_sha256', (row_data->'path')::text = 'null' FROM oml.outbox "
                      "WHERE tenant_id = $1 AND target_table = 'bronze/events' AND journal_seq = $2",
                      {db::Text(tenant_), db::Int(prc.seq)});
  ASSERT_TRUE(b.ok() && b->size() == 1);
  EXPECT_EQ(b->Get(0, 0), "claim.promoted");
  EXPECT_EQ(b->Get(0, 1), m.artifact_id);
  EXPECT_EQ(b->Get(0, 2), "1");
  EXPECT_EQ(b->Get(0, 3), crypto::Hex(m.ciphertext_sha256));
  EXPECT_EQ(b->Get(0, 4), "t");
}

TEST_F(ReviewTest, PromotionDemotionAndErasureEnqueueSilverRows) {
  ASSERT_TRUE(Lifecycle(&tj_->journal, &tj_->pool, claims_).StartSimulation(ada_, "sim-1", "").ok());
  const ClaimMeta m = Submit(alice_, "promote-me", std::string("sim-1"));
  EXPECT_TRUE(Silver().empty()) << "a held claim never reaches the silver stream";
  auto [pm, prc] = Act(rita_, m, ReviewAct::kAccept);
  auto rows = Silver();
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].first, prc.seq);
  EXPECT_EQ(rows[0].second, ExpectedRow(m, prc.seq, "promoted", prc.seq));
  EXPECT_EQ(rows[0].second["simulation_id"], "sim-1");
  EXPECT_EQ(rows[0].second["state_changed_at"], rows[0].second["promoted_at"]);
  EXPECT_EQ(rows[0].second["submitted_at"].get<std::string>().size(), 27u);

  auto [dm, drc] = Act(rita_, m, ReviewAct::kDemote, "retract");
  rows = Silver();
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[1].first, drc.seq);
  EXPECT_EQ(rows[1].second, ExpectedRow(m, prc.seq, "demoted", drc.seq));
  EXPECT_NE(rows[1].second["state_changed_at"], rows[1].second["promoted_at"]);

  auto e = claims_->Erase(alice_, m.artifact_id, "mine");  // the author erases
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  rows = Silver();
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[2].first, e->second.seq);
  EXPECT_EQ(rows[2].second, ExpectedRow(m, prc.seq, "erased", e->second.seq));

  // Every silver row sits in its event's transaction: its outbox seq lies between the outbox
  // rows of the events before and after it, next to its event's bronze row.
  auto order = su_->Query("SELECT string_agg(target_table || '@' || journal_seq, ' ' ORDER BY seq) FROM oml.outbox "
                          "WHERE tenant_id = $1 AND journal_seq >= $2",
                          {db::Text(tenant_), db::Int(prc.seq)});
  ASSERT_TRUE(order.ok());
  const std::string p = std::to_string(prc.seq), d = std::to_string(drc.seq), x = std::to_string(e->second.seq);
  EXPECT_EQ(order->Get(0, 0), "silver/claims@" + p + " bronze/events@" + p + " silver/claims@" + d + " bronze/events@" +
                                  d + " silver/claims@" + x + " bronze/events@" + x);
}

TEST_F(ReviewTest, EraseAfterPromotionRetractsButHeldAndRejectedClaimsNeverReachSilver) {
  const ClaimMeta promoted = Submit(alice_, "p");
  auto [pm, prc] = Act(rita_, promoted, ReviewAct::kAccept);
  const ClaimMeta held = Submit(alice_, "h");
  const ClaimMeta rejected = Submit(bob_, "r");
  auto [rm, rrc] = Act(rita_, rejected, ReviewAct::kReject, "no");
  ASSERT_EQ(Silver().size(), 1u);  // the promotion only
  ASSERT_TRUE(claims_->Erase(ada_, held.artifact_id, "").ok());
  ASSERT_TRUE(claims_->Erase(bob_, rejected.artifact_id, "").ok());
  EXPECT_EQ(Silver().size(), 1u) << "erasing a never-promoted claim enqueues no silver row";
  auto e = claims_->Erase(ada_, promoted.artifact_id, "gdpr");
  ASSERT_TRUE(e.ok());
  auto rows = Silver();
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[1].first, e->second.seq);
  EXPECT_EQ(rows[1].second, ExpectedRow(promoted, prc.seq, "erased", e->second.seq));
  // No silver row names a claim that was never promoted.
  for (const auto& [seq, row] : rows) EXPECT_EQ(row["artifact_id"], promoted.artifact_id);
}

TEST_F(ReviewTest, OnlyPromotedClaimsAreReadableByOtherWriters) {
  const ClaimMeta a = Submit(alice_, "a");
  const ClaimMeta b = Submit(alice_, "b");
  EXPECT_EQ(claims_->Fetch(bob_, a.artifact_id).status().code(), Code::kNotFound);
  Act(rita_, a, ReviewAct::kAccept);
  Act(rita_, b, ReviewAct::kReject);
  auto f = claims_->Fetch(bob_, a.artifact_id);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(f->body, "a");
  EXPECT_EQ(f->meta.state, "promoted");
  EXPECT_EQ(claims_->Fetch(bob_, b.artifact_id).status().code(), Code::kNotFound) << "rejected stays private";
  EXPECT_TRUE(claims_->Fetch(alice_, b.artifact_id).ok()) << "the author still reads it";
  Act(rita_, a, ReviewAct::kDemote);
  EXPECT_EQ(claims_->Fetch(bob_, a.artifact_id).status().code(), Code::kNotFound) << "demoted is withdrawn";
  EXPECT_TRUE(claims_->Fetch(rita_, a.artifact_id).ok());
}

// Two verdicts on one claim, the second queued behind the first's open transaction (it passed
// its own state check while the claim was still held): the fold's guarded UPDATE refuses it.
TEST_F(ReviewTest, RacingVerdictsJournalExactlyOne) {
  const ClaimMeta m = Submit(alice_, "contested");
  Result<std::pair<ClaimMeta, journal::Receipt>> first = Status(Code::kInternal, "unset");
  Result<std::pair<ClaimMeta, journal::Receipt>> second = Status(Code::kInternal, "unset");
  {
    oml::testing::HoldFirst hold("journal.after_outbox_insert");  // the accept, before COMMIT
    std::thread a([&] { first = claims_->Review(rita_, m.artifact_id, ReviewAct::kAccept, ""); });
    hold.WaitUntilHeld();
    std::thread b([&] { second = claims_->Review(ada_, m.artifact_id, ReviewAct::kReject, ""); });
    oml::testing::WaitUntil([&] { return tj_->journal.QueueDepth(tenant_) >= 1; }, "reject queued");
    hold.Release();
    a.join();
    b.join();
  }
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), Code::kFailedPrecondition);
  EXPECT_EQ(second.status().type(), "claim-not-held");
  EXPECT_EQ(second.status().message(), "claim " + m.artifact_id + " is promoted, not held");
  EXPECT_EQ(EventsOf(m.artifact_id), (std::vector<std::string>{"claim.submitted", "claim.promoted"}));
  EXPECT_EQ(Silver().size(), 1u);
}

// Two verdicts on one claim in ONE group commit (both queued behind an unrelated write): the
// group's transaction fails on the second's guard, each is retried alone, one is journalled.
TEST_F(ReviewTest, TwoVerdictsInOneGroupJournalExactlyOne) {
  const ClaimMeta m = Submit(alice_, "grouped");
  Result<std::pair<ClaimMeta, journal::Receipt>> x = Status(Code::kInternal, "unset");
  Result<std::pair<ClaimMeta, journal::Receipt>> y = Status(Code::kInternal, "unset");
  {
    oml::testing::HoldFirst hold("journal.after_outbox_insert");
    std::thread w([&] { (void)claims_->Submit(bob_, {"other", "wa", "x.md", "human", std::nullopt, "text/plain"}); });
    hold.WaitUntilHeld();
    std::thread a([&] { x = claims_->Review(rita_, m.artifact_id, ReviewAct::kAccept, ""); });
    std::thread b([&] { y = claims_->Review(ada_, m.artifact_id, ReviewAct::kAccept, ""); });
    oml::testing::WaitUntil([&] { return tj_->journal.QueueDepth(tenant_) >= 2; }, "both verdicts queued");
    hold.Release();
    w.join();
    a.join();
    b.join();
  }
  ASSERT_NE(x.ok(), y.ok()) << x.status().ToString() << " / " << y.status().ToString();
  const Status& lost = x.ok() ? y.status() : x.status();
  EXPECT_EQ(lost.code(), Code::kFailedPrecondition);
  EXPECT_EQ(lost.type(), "claim-not-held");
  EXPECT_EQ(EventsOf(m.artifact_id), (std::vector<std::string>{"claim.submitted", "claim.promoted"}));
  EXPECT_EQ(Silver().size(), 1u);
}

// Two servers (two Journals, two pools, one signing key): the second verdict waits for the
// tenant's chain lock in PostgreSQL while the first holds it, then its guarded UPDATE refuses it.
TEST_F(ReviewTest, RacingVerdictsFromTwoServersJournalExactlyOne) {
  const ClaimMeta m = Submit(alice_, "two-servers");
  db::Pool pool2(db::testing::AppUrl(), 2);
  journal::Journal journal2(&pool2, &tj_->key);
  Claims claims2(&journal2, &pool2, kek_, 1 << 20);
  Result<std::pair<ClaimMeta, journal::Receipt>> first = Status(Code::kInternal, "unset");
  Result<std::pair<ClaimMeta, journal::Receipt>> second = Status(Code::kInternal, "unset");
  {
    oml::testing::HoldFirst hold("journal.after_outbox_insert");  // server 1's reject, before COMMIT
    std::thread a([&] { first = claims_->Review(rita_, m.artifact_id, ReviewAct::kReject, "no"); });
    hold.WaitUntilHeld();
    // Server 2 passes its check (still held) and blocks on the chain lock server 1 holds. Its
    // own pass through the sync point comes after lock_head, so the hold does not catch it.
    std::thread b([&] { second = claims2.Review(ada_, m.artifact_id, ReviewAct::kAccept, ""); });
    oml::testing::WaitUntil(
        [&] {
          auto w = su_->Query("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                              "AND wait_event = 'advisory'");
          return w.ok() && w->GetInt(0, 0) >= 1;
        },
        "server 2 waits for the chain lock");
    hold.Release();
    a.join();
    b.join();
  }
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().type(), "claim-not-held");
  EXPECT_EQ(second.status().message(), "claim " + m.artifact_id + " is rejected, not held");
  EXPECT_EQ(EventsOf(m.artifact_id), (std::vector<std::string>{"claim.submitted", "claim.rejected"}));
  EXPECT_TRUE(Silver().empty()) << "a rejection enqueues no silver row";
}

// Idempotency-Key: a retried verdict answers its first response and journals nothing more.
TEST_F(ReviewTest, ReviewOnceReplaysTheFirstAnswer) {
  const ClaimMeta m = Submit(alice_, "idem");
  IdempotencyKey idem{"verdict-1", crypto::Sha256("POST /v1/claims/x/verdict accept"), 60};
  auto render = [](const ClaimMeta& at) { return std::make_pair(200, json{{"state", at.state}, {"promoted_seq", *at.promoted_seq}}); };
  auto one = claims_->ReviewOnce(rita_, m.artifact_id, ReviewAct::kAccept, "", idem, render);
  ASSERT_TRUE(one.ok()) << one.status().ToString();
  EXPECT_FALSE(one->replayed);
  auto two = claims_->ReviewOnce(rita_, m.artifact_id, ReviewAct::kAccept, "", idem, render);
  ASSERT_TRUE(two.ok()) << two.status().ToString();
  EXPECT_TRUE(two->replayed);
  EXPECT_EQ(two->body, one->body);
  EXPECT_EQ(two->receipt.seq, one->receipt.seq);
  EXPECT_EQ(one->body["promoted_seq"], one->receipt.seq);
  EXPECT_EQ(EventsOf(m.artifact_id), (std::vector<std::string>{"claim.submitted", "claim.promoted"}));
  EXPECT_EQ(Silver().size(), 1u);
  IdempotencyKey other = idem;
  other.request_sha256 = crypto::Sha256("something else");
  EXPECT_EQ(claims_->ReviewOnce(rita_, m.artifact_id, ReviewAct::kReject, "", other, render).status().type(),
            "idempotency-key-reused");
}

TEST(ParseVerdict, AcceptsExactlyTwoWords) {
  EXPECT_EQ(ParseVerdict("accept").value(), ReviewAct::kAccept);
  EXPECT_EQ(ParseVerdict("reject").value(), ReviewAct::kReject);
  for (const char* bad : {"", "Accept", "promote", "demote", "accept "}) {
    EXPECT_EQ(ParseVerdict(bad).status().type(), "invalid-field") << bad;
  }
}

}  // namespace
}  // namespace oml::admission
