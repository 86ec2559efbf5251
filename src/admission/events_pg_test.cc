// Who reads which events (admission/events.h), against a real PostgreSQL cluster: a writer pages
// only through the events that concern it, and nothing of another writer's held claim (artifact
// id, path, workarea, principal, digests) reaches it through the chain or through Fetch/Erase.
#include "admission/events.h"

#include <gtest/gtest.h>

#include <vector>

#include "common/temp_dir_testing.h"
#include "db/test_cluster.h"
#include "journal/provider.h"
#include "journal/test_journal.h"

namespace oml::admission {
namespace {

class EventsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    static auto* tj = new journal::testing::TestJournal(4);
    pool_ = &tj->pool;
    journal_ = &tj->journal;
    oml::testing::ScopedTempDir tmp("oml-events-test");
    const std::string kek_file = (tmp.path() / "kek.key").string();
    ASSERT_TRUE(crypto::FileKekProvider::Generate(kek_file).ok());
    kek_ = crypto::FileKekProvider::Load(kek_file).value().release();
    claims_ = new Claims(journal_, pool_, kek_, 1 << 20);
  }

  // A fresh tenant per test with this chain:
  //   1 chain.genesis
  //   2 api_key.created alice (writer)      3 api_key.created bob (writer)
  //   4 api_key.created rita (reviewer)     5 api_key.created ada (admin)
  //   6 api_key.created alice (writer, a second key: "alice-laptop")
  //   7 claim.submitted by alice (held)     8 claim.submitted by bob (held)
  //   9 claim.submitted by alice-laptop     10 artifact.erased of 9, by ada
  //   11 artifact.erased of 8, by bob
  void SetUp() override {
    static int n = 0;
    auto t = journal::CreateTenant(*journal_, "events-" + std::to_string(++n));
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    tenant_ = t->tenant_id;
    alice_ = Key("alice", "writer");
    bob_ = Key("bob", "writer");
    rita_ = Key("rita", "reviewer");
    ada_ = Key("ada", "admin");
    alice_laptop_ = Key("alice", "writer");
    // alice's claim names a simulation, which must be running (admission/lifecycle.h). Its row is
    // planted as the superuser so that the chain keeps the seqs above (folds are not verified here).
    {
      auto su = db::Conn::Connect(db::testing::SuperuserUrl());
      ASSERT_TRUE(su.ok());
      ASSERT_TRUE(su->Query("INSERT INTO oml.simulations (tenant_id, simulation_id, state, started_seq) "
                            "VALUES ($1, 'sim-alice-secret', 'running', 1)",
                            {db::Text(tenant_)})
                      .ok());
    }
    auto a1 = claims_->Submit(alice_, {"alice's private draft", "wa-alice-secret", "alice/secret-plan.md", "human",
                                       std::string("sim-alice-secret"), "text/markdown"});
    ASSERT_TRUE(a1.ok()) << a1.status().ToString();
    alice_claim_ = a1->meta;
    auto b1 = claims_->Submit(bob_, {"bob's note", "wa-bob", "bob/note.md", "human", std::nullopt, "text/plain"});
    ASSERT_TRUE(b1.ok()) << b1.status().ToString();
    bob_claim_ = b1->meta;
    auto a2 = claims_->Submit(alice_laptop_, {"alice second", "wa-alice-2", "alice/second.md", "agent", std::nullopt,
                                              "text/plain"});
    ASSERT_TRUE(a2.ok()) << a2.status().ToString();
    alice_erased_ = a2->meta;
    ASSERT_TRUE(claims_->Erase(ada_, alice_erased_.artifact_id, "asked by alice").ok());
    ASSERT_TRUE(claims_->Erase(bob_, bob_claim_.artifact_id, "mine to forget").ok());
    ASSERT_EQ(alice_claim_.submitted_seq, 7);
    ASSERT_EQ(alice_erased_.submitted_seq, 9);
  }

  Caller Key(const std::string& principal, const std::string& role) {
    auto k = journal::CreateApiKey(*journal_, tenant_, principal, role);
    EXPECT_TRUE(k.ok()) << k.status().ToString();
    return {tenant_, principal, role, k->key_id, crypto::Sha256(k->token)};
  }

  static std::vector<int64_t> Seqs(const EventsPage& p) {
    std::vector<int64_t> out;
    for (const auto& e : p.events) out.push_back(e.seq);
    return out;
  }
  // Every event `c` may see, page by page (`limit` rows, `bytes` per page); checks that paging
  // ends at the head and that next_after only moves forward.
  std::vector<int64_t> All(const Caller& c, int limit = 100, size_t bytes = 1 << 20) {
    std::vector<int64_t> out;
    int64_t after = 0;
    for (int pages = 0; pages < 100; ++pages) {
      auto p = ListEvents(*pool_, c, after, limit, bytes);
      EXPECT_TRUE(p.ok()) << p.status().ToString();
      if (!p.ok()) break;
      for (int64_t s : Seqs(*p)) out.push_back(s);
      EXPECT_GE(p->next_after, after);
      if (p->events.empty()) {
        EXPECT_EQ(p->next_after, 11) << "an empty page ends at the chain head";
        break;
      }
      after = p->next_after;
    }
    return out;
  }

  static db::Pool* pool_;
  static journal::Journal* journal_;
  static crypto::FileKekProvider* kek_;
  static Claims* claims_;
  std::string tenant_;
  Caller alice_, bob_, rita_, ada_, alice_laptop_;
  ClaimMeta alice_claim_, bob_claim_, alice_erased_;
};
db::Pool* EventsTest::pool_;
journal::Journal* EventsTest::journal_;
crypto::FileKekProvider* EventsTest::kek_;
Claims* EventsTest::claims_;

TEST_F(EventsTest, ReviewersAndAdminsSeeTheWholeChain) {
  const std::vector<int64_t> all = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};
  EXPECT_EQ(All(rita_), all);
  EXPECT_EQ(All(ada_), all);
  auto p = ListEvents(*pool_, ada_, 0, 100, 1 << 20);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->next_after, 11);
  ASSERT_EQ(p->events.size(), 11u);
  // The rows are the journal's, byte-exact: each verifies on its own and links to the one before.
  std::string prev = journal::kZeroHash;
  for (const auto& e : p->events) {
    EXPECT_EQ(crypto::Sha256(e.signed_bytes), e.event_hash) << e.seq;
    EXPECT_EQ(e.prev_hash, prev) << e.seq;
    EXPECT_EQ(e.signature.size(), 64u);
    EXPECT_EQ(e.committed_at.size(), 27u) << e.committed_at;
    prev = e.event_hash;
  }
  EXPECT_EQ(p->events[0].type, "chain.genesis");
  EXPECT_EQ(p->events[6].type, "claim.submitted");
  EXPECT_EQ(p->events[9].type, "artifact.erased");
}

TEST_F(EventsTest, AWriterSeesOnlyTheEventsOfItsOwnClaimsAndKeys) {
  // alice: her two keys, her two claims, and the erasure of her claim by the admin. Both of her
  // keys see the same: own work is by principal, as in Fetch.
  EXPECT_EQ(All(alice_), (std::vector<int64_t>{2, 6, 7, 9, 10}));
  EXPECT_EQ(All(alice_laptop_), (std::vector<int64_t>{2, 6, 7, 9, 10}));
  // bob: his key, his claim and its erasure.
  EXPECT_EQ(All(bob_), (std::vector<int64_t>{3, 8, 11}));
  // A role that is neither reviewer nor admin gets the writer's view, never more.
  Caller odd = bob_;
  odd.role = "auditor";
  EXPECT_EQ(All(odd), (std::vector<int64_t>{3, 8, 11}));
}

// Nothing of alice's held claim appears in bob's pages: not its artifact id, path, workarea,
// simulation id, principal or digests, nor anything of the claim alice had erased.
TEST_F(EventsTest, WriterBLearnsNothingOfWriterAsHeldClaim) {
  auto p = ListEvents(*pool_, bob_, 0, 1000, 1 << 20);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  ASSERT_EQ(Seqs(*p), (std::vector<int64_t>{3, 8, 11}));
  const std::vector<std::string> secrets = {alice_claim_.artifact_id,
                                            alice_erased_.artifact_id,
                                            "wa-alice-secret",
                                            "alice/secret-plan.md",
                                            "sim-alice-secret",
                                            "alice",
                                            alice_.api_key_id,
                                            alice_laptop_.api_key_id,
                                            crypto::Hex(alice_claim_.plaintext_sha256),
                                            crypto::Hex(alice_claim_.ciphertext_sha256),
                                            crypto::Hex(alice_erased_.plaintext_sha256),
                                            alice_claim_.plaintext_sha256,
                                            alice_claim_.ciphertext_sha256};
  for (const auto& e : p->events) {
    EXPECT_NE(e.type, "chain.genesis");
    for (const auto& s : secrets) {
      EXPECT_EQ(e.signed_bytes.find(s), std::string::npos) << "seq " << e.seq << " carries " << s;
      EXPECT_EQ(e.type.find(s), std::string::npos);
    }
  }
  // Through the claim routes, alice's held claim and her erased one are exactly as absent as an
  // id that never existed: same code, same type, same message shape.
  const std::string unknown = "00000000-0000-4000-8000-000000000000";
  for (const ClaimMeta* m : {&alice_claim_, &alice_erased_}) {
    auto f = claims_->Fetch(bob_, m->artifact_id);
    auto f0 = claims_->Fetch(bob_, unknown);
    EXPECT_EQ(f.status().code(), Code::kNotFound);
    EXPECT_EQ(f.status().type(), f0.status().type());
    EXPECT_EQ(f.status().message(), "no claim " + m->artifact_id);
    EXPECT_EQ(f0.status().message(), "no claim " + unknown);
    auto e = claims_->Erase(bob_, m->artifact_id, "probe");
    auto e0 = claims_->Erase(bob_, unknown, "probe");
    EXPECT_EQ(e.status().code(), Code::kNotFound);
    EXPECT_EQ(e.status().type(), e0.status().type());
    EXPECT_EQ(e.status().message(), "no claim " + m->artifact_id);
  }
  // And the probes wrote nothing: bob's view and the chain are unchanged.
  EXPECT_EQ(All(ada_).back(), 11);
}

// The rule is the Fetch rule: a writer sees a claim.submitted exactly when Fetch of that claim
// does not answer 404. A claim that leaves the held state (here: promoted, by hand) becomes
// visible to everyone in both.
TEST_F(EventsTest, AWritersEventsFollowWhatFetchShowsIt) {
  auto check = [&](const std::vector<int64_t>& bobs_view) {
    const auto seen = All(bob_);
    EXPECT_EQ(seen, bobs_view);
    for (const ClaimMeta* m : {&alice_claim_, &bob_claim_, &alice_erased_}) {
      const bool listed = std::find(seen.begin(), seen.end(), m->submitted_seq) != seen.end();
      const bool fetchable = claims_->Fetch(bob_, m->artifact_id).status().code() != Code::kNotFound;
      EXPECT_EQ(listed, fetchable) << m->artifact_id;
    }
  };
  check({3, 8, 11});
  auto su = db::Conn::Connect(db::testing::SuperuserUrl());
  ASSERT_TRUE(su.ok());
  ASSERT_TRUE(su->Query("UPDATE oml.artifacts SET state = 'promoted' WHERE tenant_id = $1 AND artifact_id = $2",
                        {db::Text(tenant_), db::Text(alice_claim_.artifact_id)})
                  .ok());
  check({3, 7, 8, 11});
}

TEST_F(EventsTest, NextAfterPagesPastEventsTheWriterMayNotSee) {
  // alice, two events per page: 2 6 | 7 9 | 10, then an empty page at the head.
  auto p1 = ListEvents(*pool_, alice_, 0, 2, 1 << 20);
  ASSERT_TRUE(p1.ok()) << p1.status().ToString();
  EXPECT_EQ(Seqs(*p1), (std::vector<int64_t>{2, 6}));
  EXPECT_EQ(p1->next_after, 6);
  auto p2 = ListEvents(*pool_, alice_, 6, 2, 1 << 20);
  EXPECT_EQ(Seqs(*p2), (std::vector<int64_t>{7, 9}));
  EXPECT_EQ(p2->next_after, 9);
  auto p3 = ListEvents(*pool_, alice_, 9, 2, 1 << 20);
  EXPECT_EQ(Seqs(*p3), (std::vector<int64_t>{10}));
  EXPECT_EQ(p3->next_after, 11) << "the page was not full: everything up to the head was covered";
  auto p4 = ListEvents(*pool_, alice_, 11, 2, 1 << 20);
  EXPECT_TRUE(p4->events.empty());
  EXPECT_EQ(p4->next_after, 11);
  // bob after his last event: nothing, and the cursor moves to the head, not back.
  auto b = ListEvents(*pool_, bob_, 8, 100, 1 << 20);
  EXPECT_EQ(Seqs(*b), (std::vector<int64_t>{11}));
  EXPECT_EQ(b->next_after, 11);
  // A cursor beyond the head stays where it is.
  auto beyond = ListEvents(*pool_, bob_, 500, 100, 1 << 20);
  EXPECT_TRUE(beyond->events.empty());
  EXPECT_EQ(beyond->next_after, 500);
  // Page by page with limit 1 gives the same as one page.
  EXPECT_EQ(All(alice_, 1), (std::vector<int64_t>{2, 6, 7, 9, 10}));
  EXPECT_EQ(All(rita_, 1).size(), 11u);
  EXPECT_EQ(ListEvents(*pool_, bob_, -1, 1, 1).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(ListEvents(*pool_, bob_, 0, 0, 1).status().code(), Code::kInvalidArgument);
}

TEST_F(EventsTest, APageStaysWithinItsByteBoundButHoldsAtLeastOneEvent) {
  auto all = ListEvents(*pool_, ada_, 0, 100, 1 << 20);
  ASSERT_TRUE(all.ok());
  auto size = [&](int i) { return all->events[i].signed_bytes.size() + all->events[i].signature.size(); };
  // Exactly the first two fit.
  auto two = ListEvents(*pool_, ada_, 0, 100, size(0) + size(1));
  ASSERT_TRUE(two.ok()) << two.status().ToString();
  EXPECT_EQ(Seqs(*two), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(two->next_after, 2);
  // One byte less: only the first.
  auto one = ListEvents(*pool_, ada_, 0, 100, size(0) + size(1) - 1);
  EXPECT_EQ(Seqs(*one), (std::vector<int64_t>{1}));
  EXPECT_EQ(one->next_after, 1);
  // A bound below any event still returns one event, so paging always progresses.
  auto tiny = ListEvents(*pool_, ada_, 6, 100, 1);
  EXPECT_EQ(Seqs(*tiny), (std::vector<int64_t>{7}));
  EXPECT_EQ(tiny->next_after, 7);
  // Paging the whole chain under a bound: every page within it unless it holds a single event.
  const size_t bound = size(6) + size(7);
  int64_t after = 0;
  std::vector<int64_t> seen;
  for (int pages = 0; pages < 20; ++pages) {
    auto p = ListEvents(*pool_, ada_, after, 100, bound);
    ASSERT_TRUE(p.ok());
    if (p->events.empty()) break;
    size_t bytes = 0;
    for (const auto& e : p->events) bytes += e.signed_bytes.size() + e.signature.size();
    if (p->events.size() > 1) EXPECT_LE(bytes, bound) << "page after " << after;
    for (int64_t s : Seqs(*p)) seen.push_back(s);
    after = p->next_after;
  }
  EXPECT_EQ(seen, (std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}));
  // The writer's view under the same bound.
  EXPECT_EQ(All(alice_, 100, size(6)), (std::vector<int64_t>{2, 6, 7, 9, 10}));
}

}  // namespace
}  // namespace oml::admission
