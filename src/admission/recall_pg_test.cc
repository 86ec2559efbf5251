// Recall and search (admission/recall.h, sql/0012_recall.sql) against a real PostgreSQL cluster:
// exact keyset pages, stable while claims arrive, every filter against a model of the claims,
// the own-work rule per role, cursors bound to their query, the search index's lifecycle
// (promotion writes it, demotion and erasure remove it, in their events' transactions), tenants
// kept apart by RLS, and the plans: each filter one range scan of its index.
#include "admission/recall.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>

#include "admission/lifecycle.h"
#include "common/sync_point.h"
#include "common/temp_dir_testing.h"
#include "db/test_cluster.h"
#include "journal/provider.h"
#include "journal/test_journal.h"

namespace oml::admission {
namespace {

class RecallTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    tj_ = new journal::testing::TestJournal(6);
    oml::testing::ScopedTempDir tmp("oml-recall-test");
    const std::string kek_file = (tmp.path() / "kek.key").string();
    ASSERT_TRUE(crypto::FileKekProvider::Generate(kek_file).ok());
    kek_ = crypto::FileKekProvider::Load(kek_file).value().release();
    claims_ = new Claims(&tj_->journal, &tj_->pool, kek_, 1 << 20);
    keys_ = new crypto::HmacKeyRing(crypto::HmacKeyRing::Parse("t1 " + std::string(64, '7'), "test").value());
  }

  // A fresh tenant per test: alice and bob (writers), rita (reviewer), ada (admin).
  void SetUp() override {
    static int n = 0;
    tenant_ = NewTenant("recall-" + std::to_string(++n));
    alice_ = Key(tenant_, "alice", "writer");
    bob_ = Key(tenant_, "bob", "writer");
    rita_ = Key(tenant_, "rita", "reviewer");
    ada_ = Key(tenant_, "ada", "admin");
    auto su = db::Conn::Connect(db::testing::SuperuserUrl());
    ASSERT_TRUE(su.ok());
    su_ = std::make_unique<db::Conn>(std::move(su).value());
  }

  std::string NewTenant(const std::string& name) {
    auto t = journal::CreateTenant(tj_->journal, name);
    EXPECT_TRUE(t.ok()) << t.status().ToString();
    return t.ok() ? t->tenant_id : "";
  }
  Caller Key(const std::string& tenant, const std::string& principal, const std::string& role) {
    auto k = journal::CreateApiKey(tj_->journal, tenant, principal, role);
    EXPECT_TRUE(k.ok()) << k.status().ToString();
    return {tenant, principal, role, k->key_id, crypto::Sha256(k->token)};
  }
  ClaimMeta Submit(const Caller& c, const std::string& body, const std::string& workarea = "wa-1",
                   const std::string& provenance = "agent", std::optional<std::string> sim = std::nullopt) {
    auto s = claims_->Submit(c, {body, workarea, "notes/n.md", provenance, std::move(sim), "text/plain"});
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    return s.ok() ? s->meta : ClaimMeta{};
  }
  // A review act; an accept's text is then indexed as `oml serve`'s indexer would (sql/0028),
  // unless `index` is false.
  void Act(const ClaimMeta& m, ReviewAct act, bool index = true) {
    auto r = claims_->Review(rita_, m.artifact_id, act, "");
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    if (act == ReviewAct::kAccept && index) Index();
  }
  Claims::IndexReport Index() {
    auto r = claims_->IndexSearchQueue(1000);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? *r : Claims::IndexReport{};
  }
  int64_t Queued(const std::string& artifact_id) {
    auto r = su_->Query("SELECT count(*) FROM oml.search_queue WHERE artifact_id = $1", {db::Text(artifact_id)});
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? r->GetInt(0, 0) : -1;
  }
  void Erase(const ClaimMeta& m) {
    auto r = claims_->Erase(ada_, m.artifact_id, "");
    ASSERT_TRUE(r.ok()) << r.status().ToString();
  }

  static std::vector<std::string> Ids(const RecallPage& p) {
    std::vector<std::string> out;
    for (const auto& c : p.claims) out.push_back(c.meta.artifact_id);
    return out;
  }
  // Every page of a list (or search) from the first: the ids in order. Every page but the last
  // holds exactly `limit` claims; the last has no next cursor.
  std::vector<std::string> All(const Caller& c, const ClaimFilter* f, const std::string& q, int limit) {
    std::vector<std::string> out;
    std::string cursor;
    for (int page = 0; page < 1000; ++page) {
      auto p = f ? ListClaims(tj_->pool, *keys_, c, *f, limit, cursor)
                 : SearchClaims(tj_->pool, *keys_, c, q, limit, cursor);
      EXPECT_TRUE(p.ok()) << p.status().ToString();
      if (!p.ok()) return out;
      for (const auto& id : Ids(*p)) out.push_back(id);
      if (!p->next_cursor) {
        EXPECT_LE(p->claims.size(), static_cast<size_t>(limit));
        return out;
      }
      EXPECT_EQ(p->claims.size(), static_cast<size_t>(limit));
      cursor = *p->next_cursor;
    }
    ADD_FAILURE() << "more than 1000 pages";
    return out;
  }
  std::vector<std::string> List(const Caller& c, const ClaimFilter& f, int limit = 4) { return All(c, &f, "", limit); }
  std::vector<std::string> Search(const Caller& c, const std::string& q, int limit = 50) {
    return All(c, nullptr, q, limit);
  }
  // claim_text rows of an artifact (superuser: every tenant).
  int64_t TextRows(const std::string& artifact_id) {
    auto r = su_->Query("SELECT count(*) FROM oml.claim_text WHERE artifact_id = $1", {db::Text(artifact_id)});
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? r->GetInt(0, 0) : -1;
  }
  // The envelope time of the tenant's event at `seq`, from its signed bytes.
  std::string TimeAt(const std::string& tenant, int64_t seq) {
    auto r = su_->Query("SELECT signed_bytes FROM oml.journal WHERE tenant_id = $1 AND seq = $2",
                        {db::Text(tenant), db::Int(seq)});
    EXPECT_TRUE(r.ok() && r->size() == 1);
    auto e = journal::Envelope::FromSignedBytes(r->GetBytes(0, 0));
    EXPECT_TRUE(e.ok());
    return e.ok() ? e->time : "";
  }

  static journal::testing::TestJournal* tj_;
  static crypto::FileKekProvider* kek_;
  static Claims* claims_;
  static crypto::HmacKeyRing* keys_;
  std::string tenant_;
  Caller alice_, bob_, rita_, ada_;
  std::unique_ptr<db::Conn> su_;
};
journal::testing::TestJournal* RecallTest::tj_;
crypto::FileKekProvider* RecallTest::kek_;
Claims* RecallTest::claims_;
crypto::HmacKeyRing* RecallTest::keys_;

ClaimFilter State(const std::string& s) {
  ClaimFilter f;
  f.state = s;
  return f;
}

TEST_F(RecallTest, PagesOf120ClaimsAre50_50_20InOrderAndStableWhileClaimsArrive) {
  std::vector<ClaimMeta> made;
  for (int i = 0; i < 120; ++i) made.push_back(Submit(i % 2 ? alice_ : bob_, "claim " + std::to_string(i)));
  std::vector<std::string> expected;  // newest first
  for (auto it = made.rbegin(); it != made.rend(); ++it) expected.push_back(it->artifact_id);

  auto p1 = ListClaims(tj_->pool, *keys_, ada_, {}, 50, "");
  ASSERT_TRUE(p1.ok()) << p1.status().ToString();
  ASSERT_TRUE(p1->next_cursor);
  EXPECT_EQ(Ids(*p1), std::vector<std::string>(expected.begin(), expected.begin() + 50));
  // Claims submitted between two pages land before the first page, never in a later one.
  std::vector<ClaimMeta> late;
  for (int i = 0; i < 3; ++i) late.push_back(Submit(alice_, "late " + std::to_string(i)));
  auto p2 = ListClaims(tj_->pool, *keys_, ada_, {}, 50, *p1->next_cursor);
  ASSERT_TRUE(p2.ok()) << p2.status().ToString();
  ASSERT_TRUE(p2->next_cursor);
  EXPECT_EQ(Ids(*p2), std::vector<std::string>(expected.begin() + 50, expected.begin() + 100));
  auto p3 = ListClaims(tj_->pool, *keys_, ada_, {}, 50, *p2->next_cursor);
  ASSERT_TRUE(p3.ok()) << p3.status().ToString();
  EXPECT_FALSE(p3->next_cursor);
  EXPECT_EQ(Ids(*p3), std::vector<std::string>(expected.begin() + 100, expected.end()));
  std::set<std::string> seen;
  for (const auto* p : {&*p1, &*p2, &*p3})
    for (const auto& id : Ids(*p)) EXPECT_TRUE(seen.insert(id).second) << "duplicate " << id;
  EXPECT_EQ(seen.size(), 120u);

  // A new first page starts with them.
  auto fresh = ListClaims(tj_->pool, *keys_, ada_, {}, 50, "");
  ASSERT_TRUE(fresh.ok());
  EXPECT_EQ(Ids(*fresh)[0], late[2].artifact_id);
  EXPECT_EQ(Ids(*fresh)[3], expected[0]);

  // Each listed claim carries the metadata and digests of its submission, and the signed time.
  const RecalledClaim& c = p3->claims.back();  // the oldest: made[0]
  EXPECT_EQ(c.meta.artifact_id, made[0].artifact_id);
  EXPECT_EQ(c.meta.plaintext_sha256, made[0].plaintext_sha256);
  EXPECT_EQ(c.meta.ciphertext_sha256, made[0].ciphertext_sha256);
  EXPECT_EQ(c.meta.submitted_seq, made[0].submitted_seq);
  EXPECT_EQ(c.meta.principal, "bob");
  EXPECT_EQ(c.meta.state, "held");
  EXPECT_EQ(c.submitted_at, TimeAt(tenant_, made[0].submitted_seq));
  EXPECT_EQ(c.submitted_at.size(), 27u);
}

// The claims of the filter test, as the test made them.
struct Model {
  std::string id, author, workarea, provenance, state, submitted_at;
  std::optional<std::string> sim;
  int64_t seq = 0;
};

TEST_F(RecallTest, EveryFilterAndEveryRoleSelectsExactlyWhatTheModelSays) {
  const char* kProvenance[] = {"human", "agent", "tool", "import"};
  Lifecycle lifecycle(&tj_->journal, &tj_->pool, claims_);
  for (const char* s : {"sim-a", "sim-b"}) ASSERT_TRUE(lifecycle.StartSimulation(ada_, s, "").ok());  // lifecycle.h
  std::vector<Model> model;
  for (int i = 0; i < 30; ++i) {
    const Caller& author = (i / 7) % 2 ? alice_ : bob_;  // each author gets claims in every state
    std::optional<std::string> sim;
    if (i % 5 == 0) sim = "sim-a";
    if (i % 5 == 1) sim = "sim-b";
    ClaimMeta m = Submit(author, "body " + std::to_string(i), "wa-" + std::to_string(i % 3), kProvenance[i % 4], sim);
    // States by i % 6: held, promoted, rejected, demoted, erased after promotion, erased while held.
    std::string state = "held";
    switch (i % 6) {
      case 1: Act(m, ReviewAct::kAccept), state = "promoted"; break;
      case 2: Act(m, ReviewAct::kReject), state = "rejected"; break;
      case 3: Act(m, ReviewAct::kAccept), Act(m, ReviewAct::kDemote), state = "demoted"; break;
      case 4: Act(m, ReviewAct::kAccept), Erase(m), state = "erased"; break;
      case 5: Erase(m), state = "erased"; break;
    }
    model.push_back({m.artifact_id, author.principal, m.workarea_id, m.provenance, state,
                     TimeAt(tenant_, m.submitted_seq), sim, m.submitted_seq});
  }
  // submitted_at is the signed time of claim.submitted, to the microsecond.
  auto at = su_->Query("SELECT artifact_id::text, to_char(submitted_at AT TIME ZONE 'UTC', "
                       "'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"') FROM oml.artifacts WHERE tenant_id = $1",
                       {db::Text(tenant_)});
  ASSERT_TRUE(at.ok() && at->size() == 30);
  std::map<std::string, std::string> stored;
  for (int i = 0; i < at->size(); ++i) stored[at->Get(i, 0)] = at->Get(i, 1);
  for (const Model& m : model) EXPECT_EQ(stored[m.id], m.submitted_at) << m.id;

  const std::string t10 = model[10].submitted_at, t20 = model[20].submitted_at;
  std::vector<std::pair<std::string, ClaimFilter>> filters = {{"none", {}}};
  for (const char* w : {"wa-0", "wa-2", "wa-none"}) filters.push_back({w, {.workarea_id = w}});
  for (const char* s : {"held", "promoted", "rejected", "demoted", "erased"}) filters.push_back({s, State(s)});
  for (const char* p : kProvenance) filters.push_back({p, {.provenance = p}});
  for (const char* s : {"sim-a", "sim-b"}) filters.push_back({s, {.simulation_id = s}});
  filters.push_back({"after t10", {.submitted_after = t10}});
  filters.push_back({"before t20", {.submitted_before = t20}});
  filters.push_back({"t10..t20", {.submitted_after = t10, .submitted_before = t20}});
  filters.push_back({"before t10 after t20", {.submitted_after = t20, .submitted_before = t10}});
  filters.push_back({"offset form", {.submitted_after = "2000-01-01T00:00:00 01:00", .submitted_before = "9999-12-31T23:59:59.999999Z"}});
  filters.push_back({"wa-1 agent", {.workarea_id = "wa-1", .provenance = "agent"}});
  filters.push_back({"promoted wa-1", {.workarea_id = "wa-1", .state = "promoted"}});
  filters.push_back({"held sim-a", {.state = "held", .simulation_id = "sim-a"}});
  filters.push_back({"demoted human after t10", {.state = "demoted", .provenance = "human", .submitted_after = t10}});

  auto matches = [&](const Model& m, const ClaimFilter& f) {
    // String order of the fixed-width UTC times is time order.
    return (f.state ? m.state == *f.state : m.state != "erased") && (!f.workarea_id || m.workarea == *f.workarea_id) &&
           (!f.provenance || m.provenance == *f.provenance) && (!f.simulation_id || m.sim == f.simulation_id) &&
           (!f.submitted_after || f.submitted_after->find(' ') != std::string::npos || m.submitted_at > *f.submitted_after) &&
           (!f.submitted_before || m.submitted_at < *f.submitted_before);
  };
  auto visible = [](const Model& m, const Caller& c) {
    return m.state == "promoted" || m.author == c.principal || c.role == "reviewer" || c.role == "admin";
  };
  int nonempty = 0;
  for (const Caller* c : {&alice_, &bob_, &rita_, &ada_}) {
    for (const auto& [name, f] : filters) {
      std::vector<std::string> expected;
      for (auto it = model.rbegin(); it != model.rend(); ++it)
        if (visible(*it, *c) && matches(*it, f)) expected.push_back(it->id);
      nonempty += !expected.empty();
      EXPECT_EQ(List(*c, f), expected) << c->principal << " filter " << name;
    }
  }
  EXPECT_GE(nonempty, 75);  // the model is not trivially empty
  // Spelled out: 30 claims, 10 of them erased (i % 6 in {4, 5}): the admin and the reviewer list
  // 20; a writer lists fewer.
  EXPECT_EQ(List(ada_, {}).size(), 20u);
  EXPECT_EQ(List(rita_, {}).size(), 20u);
  EXPECT_LT(List(bob_, {}).size(), 20u);
  // bob never sees alice's held claim; the reviewer and alice do.
  const Model* a_held = nullptr;
  for (const Model& m : model)
    if (m.author == "alice" && m.state == "held") a_held = &m;
  ASSERT_NE(a_held, nullptr);
  auto has = [&](const Caller& c, const ClaimFilter& f, const std::string& id) {
    auto v = List(c, f, 50);
    return std::find(v.begin(), v.end(), id) != v.end();
  };
  EXPECT_FALSE(has(bob_, {}, a_held->id));
  EXPECT_FALSE(has(bob_, State("held"), a_held->id));
  EXPECT_TRUE(has(rita_, State("held"), a_held->id));
  EXPECT_TRUE(has(alice_, {}, a_held->id));
}

TEST_F(RecallTest, BadParametersAndCursorsAreRefusedByName) {
  for (int i = 0; i < 5; ++i) Submit(alice_, "c" + std::to_string(i));
  auto p = ListClaims(tj_->pool, *keys_, ada_, {}, 2, "");
  ASSERT_TRUE(p.ok() && p->next_cursor);
  const std::string cursor = *p->next_cursor;
  auto refused = [&](const Result<RecallPage>& r, const std::string& type) {
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument) << r.status().ToString();
    EXPECT_EQ(r.status().type(), type) << r.status().ToString();
  };
  // Every single-character change of the cursor is refused.
  for (size_t i = 0; i < cursor.size(); ++i) {
    std::string t = cursor;
    t[i] = t[i] == 'A' ? 'B' : 'A';
    refused(ListClaims(tj_->pool, *keys_, ada_, {}, 2, t), "invalid-cursor");
  }
  refused(ListClaims(tj_->pool, *keys_, ada_, {}, 2, cursor.substr(0, cursor.size() - 1)), "invalid-cursor");
  refused(ListClaims(tj_->pool, *keys_, ada_, {}, 2, cursor + "A"), "invalid-cursor");
  refused(ListClaims(tj_->pool, *keys_, ada_, {}, 2, "!!!"), "invalid-cursor");
  refused(ListClaims(tj_->pool, *keys_, ada_, {}, 2, "e30"), "invalid-cursor");  // base64url of "{}"
  // Bound to its query: other filters, or the search endpoint.
  refused(ListClaims(tj_->pool, *keys_, ada_, {.workarea_id = "wa-1"}, 2, cursor), "invalid-cursor");
  refused(ListClaims(tj_->pool, *keys_, ada_, State("held"), 2, cursor), "invalid-cursor");
  refused(SearchClaims(tj_->pool, *keys_, ada_, "c1", 2, cursor), "invalid-cursor");
  // Bound to its tenant: a caller of another tenant cannot use it, whatever its role.
  const Caller stranger = Key(NewTenant("recall-stranger-" + tenant_), "ada", "admin");
  refused(ListClaims(tj_->pool, *keys_, stranger, {}, 2, cursor), "invalid-cursor");
  EXPECT_EQ(ListClaims(tj_->pool, *keys_, stranger, {}, 2, cursor).status().message(),
            "cursor belongs to another query (other filters, search text or endpoint)");
  // MACed under another secret (another deployment, or a key since removed): refused.
  const auto other = crypto::HmacKeyRing::Parse("t1 " + std::string(64, '8'), "other").value();
  refused(ListClaims(tj_->pool, other, ada_, {}, 2, cursor), "invalid-cursor");
  // The same cursor under another limit or caller of the tenant is a position, nothing more.
  auto again = ListClaims(tj_->pool, *keys_, alice_, {}, 10, cursor);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->claims.size(), 3u);

  refused(ListClaims(tj_->pool, *keys_, ada_, {}, 0, ""), "invalid-parameter");
  refused(ListClaims(tj_->pool, *keys_, ada_, {}, 501, ""), "invalid-parameter");
  EXPECT_TRUE(ListClaims(tj_->pool, *keys_, ada_, {}, 500, "").ok());
  refused(ListClaims(tj_->pool, *keys_, ada_, State("bogus"), 5, ""), "invalid-parameter");
  refused(ListClaims(tj_->pool, *keys_, ada_, {.provenance = "robot"}, 5, ""), "invalid-parameter");
  refused(ListClaims(tj_->pool, *keys_, ada_, {.workarea_id = ""}, 5, ""), "invalid-parameter");
  refused(ListClaims(tj_->pool, *keys_, ada_, {.simulation_id = std::string(201, 's')}, 5, ""), "invalid-parameter");
  for (const char* t : {"2025-02-29T00:00:00Z", "2025-01-01 00:00:00Z", "2025-01-01T00:00:00", "2025-01-01T24:00:00Z",
                        "2025-13-01T00:00:00Z", "2025-01-01T00:00:60Z", "2025-01-01T00:00:00.1234567Z",
                        "2025-01-01T00:00:00+24:00", "0000-01-01T00:00:00Z", "yesterday", ""})
    refused(ListClaims(tj_->pool, *keys_, ada_, {.submitted_after = t}, 5, ""), "invalid-parameter");
  EXPECT_TRUE(ListClaims(tj_->pool, *keys_, ada_, {.submitted_before = "2024-02-29T23:59:59.5-05:30"}, 5, "").ok());
  for (const std::string& q : {std::string(""), std::string(1001, 'q'), std::string("a\nb"), std::string("\xff")})
    refused(SearchClaims(tj_->pool, *keys_, ada_, q, 5, ""), "invalid-parameter");
}

TEST_F(RecallTest, SearchFindsPromotedTextOnlyAndDemotionAndErasureTakeItOut) {
  const ClaimMeta a = Submit(alice_, "The Zebrafish swims upstream");
  const ClaimMeta held = Submit(alice_, "a zebrafish in quarantine");
  const ClaimMeta rejected = Submit(alice_, "zebrafish rejected");
  const ClaimMeta demoted = Submit(bob_, "zebrafish to be demoted");
  const ClaimMeta erased = Submit(bob_, "zebrafish to be erased");
  for (const ClaimMeta* m : {&a, &demoted, &erased}) Act(*m, ReviewAct::kAccept);
  Act(rejected, ReviewAct::kReject);
  // Ranked equal (one occurrence each): newest submission first.
  const std::vector<std::string> three = {erased.artifact_id, demoted.artifact_id, a.artifact_id};
  EXPECT_EQ(Search(bob_, "zebrafish"), three);
  EXPECT_EQ(Search(rita_, "ZEBRAFISH"), three);  // 'simple' folds case
  EXPECT_EQ(TextRows(held.artifact_id), 0);
  EXPECT_EQ(TextRows(rejected.artifact_id), 0);
  EXPECT_EQ(TextRows(a.artifact_id), 1);

  Act(demoted, ReviewAct::kDemote);
  EXPECT_EQ(TextRows(demoted.artifact_id), 0);  // removed in the claim.demoted transaction
  EXPECT_EQ(Search(bob_, "zebrafish"), (std::vector<std::string>{erased.artifact_id, a.artifact_id}));
  Erase(erased);
  EXPECT_EQ(TextRows(erased.artifact_id), 0);  // removed in the artifact.erased transaction
  EXPECT_EQ(Search(bob_, "zebrafish"), std::vector<std::string>{a.artifact_id});
  EXPECT_EQ(Search(ada_, "quarantine"), std::vector<std::string>{});
  // websearch syntax: phrases, exclusion, OR; a query without a word finds nothing.
  EXPECT_EQ(Search(bob_, "\"swims upstream\""), std::vector<std::string>{a.artifact_id});
  EXPECT_EQ(Search(bob_, "\"upstream swims\""), std::vector<std::string>{});
  EXPECT_EQ(Search(bob_, "zebrafish -upstream"), std::vector<std::string>{});
  EXPECT_EQ(Search(bob_, "nothing or swims"), std::vector<std::string>{a.artifact_id});
  EXPECT_EQ(Search(bob_, "!!! ..."), std::vector<std::string>{});
  // A hit carries the metadata of the claim, its rank, and no body.
  auto hit = SearchClaims(tj_->pool, *keys_, bob_, "zebrafish", 5, "");
  ASSERT_TRUE(hit.ok() && hit->claims.size() == 1);
  EXPECT_EQ(hit->claims[0].meta.state, "promoted");
  EXPECT_EQ(hit->claims[0].meta.plaintext_sha256, a.plaintext_sha256);
  EXPECT_GT(hit->claims[0].rank, 0.0);

  // Another tenant's promoted text is never a hit here, and ours never there.
  const std::string other = NewTenant("recall-other-" + tenant_.substr(0, 8));
  const Caller ow = Key(other, "olga", "writer"), orv = Key(other, "oscar", "reviewer");
  auto s = claims_->Submit(ow, {"zebrafish of the other tenant", "wa-1", "x.md", "human", std::nullopt, "text/plain"});
  ASSERT_TRUE(s.ok());
  ASSERT_TRUE(claims_->Review(orv, s->meta.artifact_id, ReviewAct::kAccept, "").ok());
  EXPECT_EQ(Index().indexed, 1);
  EXPECT_EQ(Search(bob_, "zebrafish"), std::vector<std::string>{a.artifact_id});
  EXPECT_EQ(Search(ow, "zebrafish"), std::vector<std::string>{s->meta.artifact_id});
  EXPECT_EQ(Search(ow, "upstream"), std::vector<std::string>{});
  // RLS: scoped to one tenant, the application role sees only that tenant's rows.
  auto conn = tj_->pool.Acquire();
  ASSERT_TRUE(conn.ok());
  auto mine = (*conn)->Scoped(tenant_, {"SELECT count(*), count(*) FILTER (WHERE tenant_id <> $1) FROM oml.claim_text",
                                         {db::Text(tenant_)}});
  ASSERT_TRUE(mine.ok()) << mine.status().ToString();
  EXPECT_EQ(mine->GetInt(0, 0), 1);
  EXPECT_EQ(mine->GetInt(0, 1), 0);
  auto all = su_->Query("SELECT count(*) FROM oml.claim_text WHERE tenant_id IN ($1, $2)", {db::Text(tenant_), db::Text(other)});
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->GetInt(0, 0), 2);
}

TEST_F(RecallTest, SearchPagesByRankAndStaysStableWhileClaimsArePromoted) {
  std::vector<ClaimMeta> made;
  for (int i = 0; i < 12; ++i) {
    std::string body = "report " + std::to_string(i) + ":";
    for (int k = 0; k <= i % 4; ++k) body += " kiwi";
    body += " and some other words";
    made.push_back(Submit(i % 2 ? alice_ : bob_, body));
    Act(made.back(), ReviewAct::kAccept);
  }
  auto full = SearchClaims(tj_->pool, *keys_, bob_, "kiwi", 500, "");
  ASSERT_TRUE(full.ok());
  ASSERT_EQ(full->claims.size(), 12u);
  EXPECT_FALSE(full->next_cursor);
  // Rank descending, then the newest submission first among equal ranks.
  for (size_t i = 1; i < full->claims.size(); ++i) {
    const auto &p = full->claims[i - 1], &c = full->claims[i];
    EXPECT_TRUE(p.rank > c.rank || (p.rank == c.rank && p.meta.submitted_seq > c.meta.submitted_seq)) << i;
  }
  EXPECT_GT(full->claims.front().rank, full->claims.back().rank);
  // Pages of 5: 5, 5, 2, equal to the full list, while more matching claims are promoted.
  auto p1 = SearchClaims(tj_->pool, *keys_, bob_, "kiwi", 5, "");
  ASSERT_TRUE(p1.ok() && p1->next_cursor);
  for (int i = 0; i < 2; ++i) {
    made.push_back(Submit(alice_, "late kiwi " + std::string(i ? "kiwi kiwi kiwi kiwi" : "")));
    Act(made.back(), ReviewAct::kAccept);
  }
  auto p2 = SearchClaims(tj_->pool, *keys_, bob_, "kiwi", 5, *p1->next_cursor);
  ASSERT_TRUE(p2.ok() && p2->next_cursor) << p2.status().ToString();
  auto p3 = SearchClaims(tj_->pool, *keys_, bob_, "kiwi", 5, *p2->next_cursor);
  ASSERT_TRUE(p3.ok()) << p3.status().ToString();
  EXPECT_FALSE(p3->next_cursor);
  std::vector<std::string> paged, before = Ids(*full);
  for (const auto* p : {&*p1, &*p2, &*p3}) {
    auto ids = Ids(*p);
    paged.insert(paged.end(), ids.begin(), ids.end());
  }
  // The late ones rank above or below; those below the cursor appear, none twice, none lost.
  std::set<std::string> late = {made[12].artifact_id, made[13].artifact_id};
  std::vector<std::string> old_only;
  for (const auto& id : paged)
    if (!late.count(id)) old_only.push_back(id);
  EXPECT_EQ(old_only, before);
  EXPECT_EQ(std::set<std::string>(paged.begin(), paged.end()).size(), paged.size());
}

TEST_F(RecallTest, LongBodiesAreIndexedWholeInChunksAndOddBytesDoNotStopAPromotion) {
  std::string body = "alpha";
  while (body.size() < 65536 - 5) body += " filler";
  body.resize(65536 - 5, 'x');
  body += " boundaryword";  // spans characters 65532..65543: cut by the first chunk's end
  while (body.size() < 140000) body += " filler";
  body += " omega";
  const ClaimMeta big = Submit(alice_, body);
  Act(big, ReviewAct::kAccept);
  EXPECT_EQ(TextRows(big.artifact_id), 3);  // ceil(140006 / 65536)
  for (const char* w : {"alpha", "boundaryword", "omega"})
    EXPECT_EQ(Search(bob_, w), std::vector<std::string>{big.artifact_id}) << w;

  const ClaimMeta nul = Submit(alice_, std::string("first\0second", 12));
  Act(nul, ReviewAct::kAccept);
  EXPECT_EQ(Search(bob_, "second"), std::vector<std::string>{nul.artifact_id});
  const ClaimMeta empty = Submit(alice_, "");
  Act(empty, ReviewAct::kAccept);
  EXPECT_EQ(TextRows(empty.artifact_id), 1);
}

TEST_F(RecallTest, SearchTextFoldRefusesAVersionThatIsNotPromoted) {
  const ClaimMeta m = Submit(alice_, "never promoted");
  auto conn = tj_->pool.Acquire();
  ASSERT_TRUE(conn.ok());
  auto r = (*conn)->Pipeline({{"BEGIN", {}},
                              db::ScopeTo(tenant_),
                              SearchTextFold(tenant_, m.artifact_id, 1, "attachment words", "attachment:u1")});
  EXPECT_EQ(r.status().type(), db::kZeroRowsGuard) << r.status().ToString();
  (void)(*conn)->Exec("ROLLBACK");
  EXPECT_EQ(TextRows(m.artifact_id), 0);
  // Once promoted, another part is indexed beside the body, and both are found.
  Act(m, ReviewAct::kAccept);
  auto ok = (*conn)->Pipeline({{"BEGIN", {}},
                               db::ScopeTo(tenant_),
                               SearchTextFold(tenant_, m.artifact_id, 1, "attachment words", "attachment:u1"),
                               {"COMMIT", {}}});
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(TextRows(m.artifact_id), 2);
  EXPECT_EQ(Search(bob_, "attachment"), std::vector<std::string>{m.artifact_id});
  EXPECT_EQ(Search(bob_, "never"), std::vector<std::string>{m.artifact_id});
  // The same part twice is a bug of the caller: 23505, the transaction fails.
  auto twice = (*conn)->Pipeline({{"BEGIN", {}},
                                  db::ScopeTo(tenant_),
                                  SearchTextFold(tenant_, m.artifact_id, 1, "again", "attachment:u1")});
  EXPECT_EQ(twice.status().type(), "conflict") << twice.status().ToString();
  (void)(*conn)->Exec("ROLLBACK");
}

// Issue 22: an accept queues its version and commits without building the index (2.4 s of
// to_tsvector for 24 MiB of text were inside the accept's transaction); the indexer builds it
// afterwards, in the order of the promotions, and only while the version is still promoted.
TEST_F(RecallTest, AnAcceptQueuesItsTextAndTheIndexerBuildsItAfterTheCommit) {
  const ClaimMeta m = Submit(alice_, "queued quokka text");
  Act(m, ReviewAct::kAccept, /*index=*/false);
  EXPECT_EQ(TextRows(m.artifact_id), 0);
  EXPECT_EQ(Queued(m.artifact_id), 1);
  EXPECT_TRUE(Search(bob_, "quokka").empty());
  const Claims::IndexReport rep = Index();
  EXPECT_EQ(rep.indexed, 1);
  EXPECT_EQ(rep.dropped + rep.failed, 0);
  EXPECT_EQ(TextRows(m.artifact_id), 1);
  EXPECT_EQ(Queued(m.artifact_id), 0);
  EXPECT_EQ(Search(bob_, "quokka"), std::vector<std::string>{m.artifact_id});
  EXPECT_EQ(Index().indexed, 0);  // nothing left: indexed once

  // Demoted (or erased) before the indexer came: taken off the queue, never indexed.
  const ClaimMeta d = Submit(alice_, "demoted dugong text"), e = Submit(alice_, "erased emu text");
  Act(d, ReviewAct::kAccept, false);
  Act(e, ReviewAct::kAccept, false);
  Act(d, ReviewAct::kDemote);
  Erase(e);
  const Claims::IndexReport gone = Index();
  EXPECT_EQ(gone.dropped, 2);
  EXPECT_EQ(gone.indexed, 0);
  EXPECT_EQ(TextRows(d.artifact_id) + TextRows(e.artifact_id), 0);
  EXPECT_EQ(Queued(d.artifact_id) + Queued(e.artifact_id), 0);
}

// The bad interleavings, every time: the indexer has read a promoted version's text, then (at
// its sync point) a demotion commits, or another indexer indexes the same version whole.
TEST_F(RecallTest, ADemotionOrAnotherIndexerBetweenTheReadAndTheCommitLeavesNoWrongText) {
  const ClaimMeta m = Submit(alice_, "racing raven text");
  Act(m, ReviewAct::kAccept, false);
  SyncPoints::Set("search_index.before_commit", [&] {
    SyncPoints::Clear("search_index.before_commit");
    auto r = claims_->Review(rita_, m.artifact_id, ReviewAct::kDemote, "");
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return Status::Ok();
  });
  const Claims::IndexReport rep = Index();
  SyncPoints::ClearAll();
  EXPECT_EQ(rep.dropped, 1);
  EXPECT_EQ(rep.indexed, 0);
  EXPECT_EQ(TextRows(m.artifact_id), 0);
  EXPECT_EQ(Queued(m.artifact_id), 0);
  EXPECT_TRUE(Search(bob_, "raven").empty());

  // Another server finds the version leased by this one and skips it; one that finds the lease
  // expired (this server stalled past it) indexes it, and this one then finds the row taken.
  const ClaimMeta n = Submit(alice_, "twice indexed ibis text");
  Act(n, ReviewAct::kAccept, false);
  Claims::IndexReport leased, expired;
  SyncPoints::Set("search_index.before_commit", [&] {
    SyncPoints::Clear("search_index.before_commit");
    leased = Index();
    EXPECT_TRUE(su_->Query("UPDATE oml.search_queue SET not_before = now() WHERE artifact_id = $1",
                           {db::Text(n.artifact_id)}).ok());
    expired = Index();  // reads, takes the row, commits
    return Status::Ok();
  });
  const Claims::IndexReport outer = Index();
  SyncPoints::ClearAll();
  EXPECT_EQ(leased.indexed + leased.dropped + leased.failed, 0);
  EXPECT_EQ(expired.indexed, 1);
  EXPECT_EQ(outer.indexed + outer.dropped + outer.failed, 0);  // found the row taken: did nothing
  EXPECT_EQ(TextRows(n.artifact_id), 1);
  EXPECT_EQ(Search(bob_, "ibis"), std::vector<std::string>{n.artifact_id});

  // A demotion that commits after the text was inserted (uncommitted) and before the indexer
  // locks the artifact row: the indexer sees it there and rolls its text back.
  const ClaimMeta late = Submit(alice_, "late lemur text");
  Act(late, ReviewAct::kAccept, false);
  SyncPoints::Set("search_index.before_state_lock", [&] {
    SyncPoints::Clear("search_index.before_state_lock");
    auto r = claims_->Review(rita_, late.artifact_id, ReviewAct::kDemote, "");
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return Status::Ok();
  });
  const Claims::IndexReport rolled = Index();
  SyncPoints::ClearAll();
  EXPECT_EQ(rolled.dropped, 1);
  EXPECT_EQ(rolled.indexed, 0);
  EXPECT_EQ(TextRows(late.artifact_id), 0);
  EXPECT_EQ(Queued(late.artifact_id), 0);

  // A demotion after the index was built removes it in its own transaction (sql/0012 trigger).
  Act(n, ReviewAct::kDemote);
  EXPECT_EQ(TextRows(n.artifact_id), 0);
}

// A version whose text cannot be read stays queued with its error and a backoff, and is indexed
// once it can be read.
TEST_F(RecallTest, AVersionWhoseTextCannotBeReadStaysQueuedAndIsRetried) {
  const ClaimMeta m = Submit(alice_, "stubborn stoat text");
  Act(m, ReviewAct::kAccept, false);
  SyncPoints::Set("search_index.before_commit", [] {
    return Status(Code::kUnavailable, "the KEK is away", "kek-unavailable");
  });
  const Claims::IndexReport failed = Index();
  SyncPoints::ClearAll();
  EXPECT_EQ(failed.failed, 1);
  auto row = su_->Query("SELECT attempts, last_error, not_before > now() FROM oml.search_queue WHERE artifact_id = $1",
                        {db::Text(m.artifact_id)});
  ASSERT_TRUE(row.ok() && row->size() == 1);
  EXPECT_EQ(row->GetInt(0, 0), 1);
  EXPECT_NE(row->Get(0, 1).find("the KEK is away"), std::string::npos) << row->Get(0, 1);
  EXPECT_EQ(row->Get(0, 2), "t");
  EXPECT_EQ(Index().failed + Index().indexed, 0);  // not due yet: the backoff
  ASSERT_TRUE(su_->Query("UPDATE oml.search_queue SET not_before = now() WHERE artifact_id = $1",
                         {db::Text(m.artifact_id)}).ok());
  EXPECT_EQ(Index().indexed, 1);
  EXPECT_EQ(Search(bob_, "stoat"), std::vector<std::string>{m.artifact_id});
}

// Each filter is one backward range scan of its own index, cut at the page (no Seq Scan, no
// Sort); a writer's two branches are merged. 20000 synthetic rows (inserted as the superuser
// with the submitted_at trigger off), each filter value selecting 2% or less of them, so that
// the planner's choice is the one a large tenant gets.
TEST_F(RecallTest, EachFilterIsOneRangeScanOfItsIndex) {
  const std::string t = NewTenant("recall-plans");
  const Caller admin = Key(t, "pat", "admin"), writer = Key(t, "u7", "writer");
  auto ins = su_->Exec(
      "SET session_replication_role = replica; "
      "INSERT INTO oml.artifacts (tenant_id, artifact_id, version, workarea_id, path, principal, writer_key_id, "
      "provenance, simulation_id, media_type, size_bytes, plaintext_sha256, ciphertext_sha256, state, submitted_seq, "
      "submitted_at) SELECT '" + t + "', gen_random_uuid(), 1, 'wa-' || (i % 100), 'p', 'u' || (i % 53), "
      "'ak_0000000000000000', CASE WHEN i % 50 = 3 THEN 'tool' ELSE 'agent' END, "
      "CASE WHEN i % 10 = 0 THEN 'sim-' || (i % 7) END, 'text/plain', 1, sha256('x'), sha256('y'), "
      "CASE i % 50 WHEN 0 THEN 'held' WHEN 1 THEN 'rejected' WHEN 2 THEN 'demoted' ELSE 'promoted' END, 1000 + i, "
      "timestamptz '2025-01-01' + i * interval '1 second' FROM generate_series(1, 20000) i; "
      // Text for every synthetic row (the search joins promoted ones only).
      "INSERT INTO oml.claim_text (tenant_id, artifact_id, version, part, chunk, tsv) "
      "SELECT tenant_id, artifact_id, 1, 'body', 1, "
      "to_tsvector('simple', 'word' || (submitted_seq % 997) || ' common text here and there') "
      "FROM oml.artifacts WHERE tenant_id = '" + t + "'; "
      "RESET session_replication_role; ANALYZE oml.artifacts; ANALYZE oml.claim_text");
  ASSERT_TRUE(ins.ok()) << ins.status().ToString();
  auto page = ListClaims(tj_->pool, *keys_, admin, {}, 50, "");
  ASSERT_TRUE(page.ok() && page->next_cursor);
  const std::string cursor = *page->next_cursor;

  struct Case {
    std::string name;
    const Caller* caller;
    ClaimFilter filter;
    std::vector<std::string> indexes;  // each as "Index Scan Backward using <name>" or an InitPlan probe
    bool with_cursor = false;
    bool in_order = true;  // read in page order (no Sort): cut at the page, whatever the tenant's size
  };
  const std::vector<Case> cases = {
      {"none", &admin, {}, {"Index Scan Backward using artifacts_recall_all "}},
      {"cursor", &admin, {}, {"Index Scan Backward using artifacts_recall_all "}, true},
      {"workarea", &admin, {.workarea_id = "wa-5"}, {"Index Scan Backward using artifacts_recall_workarea "}},
      {"state", &admin, State("held"), {"Index Scan Backward using artifacts_recall_state "}},
      {"provenance", &admin, {.provenance = "tool"}, {"Index Scan Backward using artifacts_recall_provenance "}},
      {"simulation", &admin, {.simulation_id = "sim-3"}, {"Index Scan Backward using artifacts_recall_simulation "}},
      // The bounds query (two probes), then the page: a seq range of the base index.
      {"time",
       &admin,
       {.submitted_after = "2025-01-01T01:00:00Z", .submitted_before = "2025-01-01T02:00:00Z"},
       {"Index Only Scan Backward using artifacts_recall_time ", "Index Only Scan using artifacts_recall_time ",
        "Index Scan Backward using artifacts_recall_all "}},
      {"time and workarea",
       &admin,
       {.workarea_id = "wa-5", .submitted_after = "2025-01-01T01:00:00Z"},
       {"Index Scan Backward using artifacts_recall_workarea "}},
      // Promoted claims (most of the tenant) by the state index or the base one, the writer's own
      // by the principal index, merged.
      {"writer", &writer, {}, {"Merge Append", "Index Scan Backward using artifacts_recall_principal "}},
      // Its own held claims: a handful here (u7 AND held), which the planner may read by a bitmap
      // scan of the principal's (or the held) rows and sort; never the whole tenant.
      {"writer held", &writer, State("held"), {"artifacts_recall_"}, false, false},
  };
  for (const Case& c : cases) {
    ClaimFilter f = c.filter;
    auto plan = ExplainListClaims(tj_->pool, *keys_, *c.caller, f, 50, c.with_cursor ? cursor : "");
    ASSERT_TRUE(plan.ok()) << c.name << ": " << plan.status().ToString();
    for (const auto& ix : c.indexes) EXPECT_NE(plan->find(ix), std::string::npos) << c.name << " wants " << ix << "\n" << *plan;
    EXPECT_EQ(plan->find("Seq Scan"), std::string::npos) << c.name << "\n" << *plan;
    if (c.in_order) EXPECT_EQ(plan->find("Sort\n"), std::string::npos) << c.name << "\n" << *plan;
    if (c.with_cursor) {
      EXPECT_NE(plan->find("ROW(submitted_seq, artifact_id) < ROW("), std::string::npos) << *plan;
    }
    if (c.name == "writer") std::cout << "EXPLAIN of a writer's first page, no filter:\n" << *plan;
  }
  // A search: the page joins search_claim_text's matches to artifacts by primary key...
  auto search = ExplainSearchClaims(tj_->pool, *keys_, admin, "word5", 50, "");
  ASSERT_TRUE(search.ok()) << search.status().ToString();
  EXPECT_NE(search->find("Function Scan on search_claim_text h"), std::string::npos) << *search;
  EXPECT_EQ(search->find("Seq Scan"), std::string::npos) << *search;
  // ... and the function's own query (its text from the catalog, planned generically as a SQL
  // function's statement is) finds them through the GIN index.
  ASSERT_TRUE(su_->Exec("SELECT set_config('oml.tenant_id', '" + t + "', false); "
                        "SET plan_cache_mode = force_generic_plan").ok());
  auto src = su_->Query("SELECT prosrc FROM pg_proc WHERE proname = 'search_claim_text'");
  ASSERT_TRUE(src.ok() && src->size() == 1);
  std::string body = src->Get(0, 0);
  for (size_t at; (at = body.find("p_query")) != std::string::npos;) body.replace(at, 7, "$1");
  ASSERT_TRUE(su_->Exec("PREPARE search_body(text) AS " + body).ok()) << body;
  auto inner = su_->Query("EXPLAIN (COSTS OFF) EXECUTE search_body('word5')");
  ASSERT_TRUE(inner.ok()) << inner.status().ToString();
  std::string inner_plan;
  for (int i = 0; i < inner->size(); ++i) inner_plan += inner->Get(i, 0) + "\n";
  EXPECT_NE(inner_plan.find("Bitmap Index Scan on claim_text_tsv"), std::string::npos) << inner_plan;
  EXPECT_EQ(inner_plan.find("Seq Scan"), std::string::npos) << inner_plan;
  std::cout << "EXPLAIN of search_claim_text's query:\n" << inner_plan;
  // The synthetic rows answer too: i in 1..20000 is held when i % 50 == 0.
  EXPECT_EQ(List(admin, State("held"), 500).size(), 400u);
  std::cout << "EXPLAIN of a search:\n" << *search;
}

}  // namespace
}  // namespace oml::admission
