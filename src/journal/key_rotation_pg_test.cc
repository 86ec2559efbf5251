// Signing-key rotation against a real PostgreSQL cluster: rotation is exclusive with appends and
// records each chain's head, so a retired key cannot sign a backdated event that verifies; the
// new key binds those heads, so the retired key cannot raise them by signing the rotation again
// (issue 17); a retired key is never reinstated. Its own binary (own cluster): it retires the key the other
// journal tests sign with. The tests run in order and share the key state.
#include <gtest/gtest.h>

#include <atomic>
#include <functional>
#include <thread>

#include "blob/object_store.h"
#include "common/sync_point_testing.h"
#include "common/temp_dir_testing.h"
#include "crypto/crypto.h"
#include "db/conn.h"
#include "db/test_cluster.h"
#include "journal/heads.h"
#include "journal/journal.h"
#include "journal/merkle_edge.h"
#include "journal/provider.h"
#include "journal/test_journal.h"
#include "journal/verify.h"

namespace oml::journal {
namespace {

EventSpec Note(const std::string& text) {
  return EventSpec{"test.note", "tester", {{"text", text}}, nlohmann::json::object(), nullptr};
}

// Every test starts from the key in force (whatever the tests before it in this process did:
// ctest runs each test in a process and cluster of its own, a plain run shares one) and rotates
// to a fresh key itself.
class KeyRotationTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { tj_ = new testing::TestJournal(8); }
  void SetUp() override {
    if (current_ == nullptr) {
      current_key_ = &tj_->key;
      current_ = &tj_->journal;
    }
  }
  static db::Conn Su() { return std::move(db::Conn::Connect(db::testing::SuperuserUrl())).value(); }
  static std::string Unique(const std::string& name) { return name + "-" + std::to_string(++counter_); }

  // Rotates from the key in force to a fresh one; returns the rotation's receipt.
  static Result<Receipt> Rotate() {
    auto next = new crypto::SigningKey(std::move(crypto::SigningKey::Generate()).value());
    OML_ASSIGN_OR_RETURN(Receipt rc, IssueKey(*current_, *next));
    old_key_ = current_key_;
    current_key_ = next;
    current_ = new Journal(&tj_->pool, next);
    return rc;
  }

  // As the database superuser, with the journal's guard trigger off.
  static void Tamper(const std::string& sql, const std::vector<db::Param>& params) {
    auto su = Su();
    ASSERT_TRUE(su.Exec("ALTER TABLE oml.journal DISABLE TRIGGER USER").ok());
    auto r = su.Query(sql, params);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ASSERT_TRUE(su.Exec("ALTER TABLE oml.journal ENABLE TRIGGER USER").ok());
  }

  // The attacker of issue 17: keeps the key a rotation retired, holds the database superuser,
  // and rewrites the rotation's key.issued (provider seq `seq`): `edit` changes the signed
  // envelope, which is signed again with `retired` (the key that signed it) and stored with its
  // new event_hash, and chain_heads follows if the event is the provider chain's head. The row
  // as it was is put back when the test ends, so later tests of a plain run see a sound chain.
  Receipt ResignRotation(int64_t seq, const crypto::SigningKey& retired, const std::function<void(Envelope&)>& edit) {
    auto su = Su();
    auto row = su.Query("SELECT signed_bytes, event_hash, signature FROM oml.journal WHERE tenant_id = $1 AND seq = $2",
                        {db::Text(kProviderTenant), db::Int(seq)});
    EXPECT_TRUE(row.ok() && row->size() == 1);
    const std::string bytes = row->GetBytes(0, 0), hash = row->GetBytes(0, 1), sig = row->GetBytes(0, 2);
    undo_.push_back([seq, bytes, hash, sig] { StoreProviderRow(seq, bytes, hash, sig); });
    Envelope e = std::move(Envelope::FromSignedBytes(bytes)).value();
    edit(e);
    Receipt forged = std::move(SignEnvelope(e, retired)).value();
    StoreProviderRow(seq, forged.signed_bytes, forged.event_hash, forged.signature);
    return forged;
  }
  static void StoreProviderRow(int64_t seq, const std::string& bytes, const std::string& hash, const std::string& sig) {
    Tamper("UPDATE oml.journal SET signed_bytes = $3, event_hash = $4, signature = $5 WHERE tenant_id = $1 AND seq = $2",
           {db::Text(kProviderTenant), db::Int(seq), db::Bytes(bytes), db::Bytes(hash), db::Bytes(sig)});
    Tamper("UPDATE oml.chain_heads SET event_hash = $3 WHERE tenant_id = $1 AND seq = $2",
           {db::Text(kProviderTenant), db::Int(seq), db::Bytes(hash)});
    // The attacker holds the database: the chain's Merkle edge (sql/0029) is made to fit the
    // rewritten row too, or it alone would give the rewrite away.
    auto su = Su();
    auto head = su.Query("SELECT seq FROM oml.chain_heads WHERE tenant_id = $1", {db::Text(kProviderTenant)});
    ASSERT_TRUE(head.ok() && head->size() == 1);
    auto tree = TreeFromJournal(su, kProviderTenant, head->GetInt(0, 0));
    ASSERT_TRUE(tree.ok()) << tree.status().ToString();
    Tamper("UPDATE oml.chain_heads SET tree_size = $2, tree_edge = $3 WHERE tenant_id = $1",
           {db::Text(kProviderTenant), db::Int(static_cast<int64_t>(tree->size())), db::Bytes(tree->Encode())});
  }
  // The attacker's next step: `key` signs a note at `tenant`'s next seq, stored as the head. Cut
  // back when the test ends.
  Receipt PlantNote(const std::string& tenant, const crypto::SigningKey& key) {
    auto head = Su().Query("SELECT seq, event_hash, event_time FROM oml.chain_heads WHERE tenant_id = $1", {db::Text(tenant)});
    EXPECT_TRUE(head.ok() && head->size() == 1);
    Envelope e;
    e.tenant = tenant;
    e.seq = head->GetInt(0, 0) + 1;
    e.prev_hash = head->GetBytes(0, 1);
    e.type = "test.note";
    e.time = NowTimestamp();
    e.key_id = key.key_id();
    e.principal = "mallory";
    e.payload = {{"text", "signed by a retired key after its rotation"}};
    const int64_t seq = head->GetInt(0, 0);
    const std::string hash = head->GetBytes(0, 1);
    undo_.push_back([tenant, seq, hash] {
      Tamper("DELETE FROM oml.journal WHERE tenant_id = $1 AND seq > $2", {db::Text(tenant), db::Int(seq)});
      Tamper("UPDATE oml.chain_heads SET tree_size = NULL, tree_edge = NULL, seq = $2, event_hash = $3 WHERE tenant_id = $1",
             {db::Text(tenant), db::Int(seq), db::Bytes(hash)});
    });
    return testing::PlantEvent(e, key);
  }
  // Puts back what the attacker changed, last change first.
  void Undo() {
    for (auto it = undo_.rbegin(); it != undo_.rend(); ++it) (*it)();
    undo_.clear();
  }
  void TearDown() override {
    SyncPoints::ClearAll();
    Undo();
  }
  std::vector<std::function<void()>> undo_;  // the attacker's changes, undone last first

  // The provider chain's published head at its current head, and `tenant`'s, signed by `key`
  // (the key in force), as the head publisher puts them.
  static void PublishHeads(blob::ObjectStore& store, const std::vector<std::string>& tenants, const crypto::SigningKey& key) {
    for (const auto& t : tenants) {
      auto head = Su().Query("SELECT seq, event_hash FROM oml.chain_heads WHERE tenant_id = $1", {db::Text(t)});
      ASSERT_TRUE(head.ok() && head->size() == 1);
      auto doc = EncodeSignedHead({t, head->GetInt(0, 0), head->GetBytes(0, 1), key.key_id(), NowTimestamp()}, key);
      ASSERT_TRUE(doc.ok());
      ASSERT_TRUE(store.Put(HeadKey(t), *doc).ok());
    }
  }

  // Exactly one finding: on the provider chain, at `seq`, saying `what`.
  static void ExpectProviderProblem(const Result<VerifyReport>& rep, int64_t seq, const std::string& what) {
    ASSERT_TRUE(rep.ok()) << rep.status().ToString();
    ASSERT_EQ(rep->problems.size(), 1u) << (rep->problems.empty() ? "verify passed: no finding at all"
                                                                   : rep->problems[0].tenant_name + " seq " +
                                                                         std::to_string(rep->problems[0].seq) + ": " +
                                                                         rep->problems[0].what);
    EXPECT_EQ(rep->problems[0].tenant_id, kProviderTenant);
    EXPECT_EQ(rep->problems[0].seq, seq);
    EXPECT_EQ(rep->problems[0].what, what);
  }

  static testing::TestJournal* tj_;
  static const crypto::SigningKey* current_key_;  // the key in force
  static Journal* current_;                       // signs with it
  static const crypto::SigningKey* old_key_;      // the key the last Rotate() retired
  static int counter_;
};
testing::TestJournal* KeyRotationTest::tj_ = nullptr;
const crypto::SigningKey* KeyRotationTest::current_key_ = nullptr;
Journal* KeyRotationTest::current_ = nullptr;
const crypto::SigningKey* KeyRotationTest::old_key_ = nullptr;
int KeyRotationTest::counter_ = 0;

TEST_F(KeyRotationTest, RotationWaitsForAppendsInFlightAndRecordsEachChainsHead) {
  Journal* before = current_;
  auto a = CreateTenant(*before, Unique("a"));
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(before->Append(a->tenant_id, Note("one")).ok());
  auto quiet = CreateTenant(*before, Unique("quiet"));
  ASSERT_TRUE(quiet.ok());
  // Hold an append to A inside its transaction (locks taken, rows not yet sent).
  oml::testing::HoldFirst hold("journal.after_outbox_insert");
  Result<Receipt> held = Status(Code::kInternal, "unset");
  std::thread writer([&] { held = before->Append(a->tenant_id, Note("in flight")); });
  hold.WaitUntilHeld();
  std::atomic<bool> rotated{false};
  Result<Receipt> rot = Status(Code::kInternal, "unset");
  std::thread rotator([&] {
    rot = Rotate();
    rotated = true;
  });
  // The rotation waits for the append in flight (exclusive vs shared rotation lock).
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  EXPECT_FALSE(rotated.load()) << "rotation did not wait for the append in flight";
  hold.Release();
  writer.join();
  rotator.join();
  ASSERT_TRUE(held.ok()) << held.status().ToString();
  ASSERT_TRUE(rot.ok()) << rot.status().ToString();
  EXPECT_EQ(held->seq, 3);
  auto env = Envelope::FromSignedBytes(rot->signed_bytes);
  ASSERT_TRUE(env.ok());
  EXPECT_EQ(env->payload["supersedes"], old_key_->key_id());
  EXPECT_EQ(env->payload["retired_heads"][a->tenant_id], 3);  // includes the append that was in flight
  EXPECT_EQ(env->payload["retired_heads"][quiet->tenant_id], 1);
  // The retiring key stops signing at once; the new one signs.
  auto stale = before->Append(a->tenant_id, Note("stale"));
  EXPECT_EQ(stale.status().type(), "signing-key-not-in-force");
  auto fresh = current_->Append(a->tenant_id, Note("new key"));
  ASSERT_TRUE(fresh.ok()) << fresh.status().ToString();
  EXPECT_EQ(fresh->seq, 4);
  auto rep = VerifyChains(tj_->pool, VerifyOptions{});
  ASSERT_TRUE(rep.ok());
  EXPECT_TRUE(rep->problems.empty()) << rep->problems[0].what;
}

TEST_F(KeyRotationTest, ARotationAndANewTenantWhileVerifyRunsAreNotFindings) {
  // verify reads every chain in one snapshot: a rotation committed after the provider chain was
  // walked, and the events signed by the new key after it, are simply not seen.
  auto t = CreateTenant(*current_, Unique("busy"));
  ASSERT_TRUE(t.ok());
  bool fired = false;
  SyncPoints::Set("verify.after_provider", [&] {
    if (fired) return Status::Ok();
    fired = true;
    auto rot = Rotate();
    EXPECT_TRUE(rot.ok()) << rot.status().ToString();
    EXPECT_TRUE(current_->Append(t->tenant_id, Note("signed by the new key")).ok());
    EXPECT_TRUE(CreateTenant(*current_, Unique("born-during-verify")).ok());
    return Status::Ok();
  });
  auto rep = VerifyChains(tj_->pool, VerifyOptions{});
  SyncPoints::Clear("verify.after_provider");
  ASSERT_TRUE(fired);
  ASSERT_TRUE(rep.ok()) << rep.status().ToString();
  EXPECT_TRUE(rep->problems.empty()) << rep->problems[0].tenant_name << ": " << rep->problems[0].what;
  // The next verify sees all of it, and it is all fine.
  auto after = VerifyChains(tj_->pool, VerifyOptions{});
  ASSERT_TRUE(after.ok());
  EXPECT_TRUE(after->problems.empty()) << after->problems[0].what;
  EXPECT_EQ(after->tenants, rep->tenants + 1);
}

TEST_F(KeyRotationTest, ARetiredKeyCannotAppendABackdatedEventThatVerifies) {
  // Whoever kept the retired private key and can write the database appends to a chain that has
  // not moved since the rotation, with a time after that chain's last event and before the
  // rotation: neither the time window of the key nor time order along the chain can tell.
  const std::string name = Unique("quiet");
  auto quiet = CreateTenant(*current_, name);
  ASSERT_TRUE(quiet.ok());
  const std::string before_rotation = NowTimestamp();
  auto rot = Rotate();
  ASSERT_TRUE(rot.ok()) << rot.status().ToString();
  const crypto::SigningKey& retired = *old_key_;
  auto su = Su();
  auto head = su.Query("SELECT seq, event_hash FROM oml.chain_heads WHERE tenant_id = $1", {db::Text(quiet->tenant_id)});
  ASSERT_TRUE(head.ok());
  ASSERT_EQ(head->GetInt(0, 0), 1);
  Envelope e;
  e.tenant = quiet->tenant_id;
  e.seq = 2;
  e.prev_hash = head->GetBytes(0, 1);
  e.type = "test.note";
  e.time = before_rotation;
  e.key_id = retired.key_id();
  e.principal = "mallory";
  e.payload = {{"text", "backdated with the retired key"}};
  testing::PlantEvent(e, retired);
  VerifyOptions only;
  only.only_tenant = name;
  auto rep = VerifyChains(tj_->pool, only);
  ASSERT_TRUE(rep.ok()) << rep.status().ToString();
  ASSERT_EQ(rep->problems.size(), 1u);
  const auto& p = rep->problems[0];
  EXPECT_EQ(p.tenant_name, name);
  EXPECT_EQ(p.seq, 2);
  EXPECT_EQ(p.what, "signed by " + retired.key_id() + " after that key was retired: the rotation at provider seq " +
                        std::to_string(rot->seq) + " recorded this chain's head at seq 1");
}

// Issue 17. The rotation is the provider chain's head (no later provider event links to it), so
// whoever kept the retired key and holds the database superuser re-signs it with a higher
// retired_heads for a quiet chain, then signs an event there above the real rotation point.
// Every signature verifies under the key the old rules expect; only the new key's binding, which
// the retired key cannot make, tells. Without published heads, with heads published before the
// rotation, and with heads published at it (what `oml key rotate` flushes on exit), the finding
// is the same: the rotation, at its provider seq.
TEST_F(KeyRotationTest, RetiredHeadsInflatedAndReSignedByTheRetiredKeyAreRefused) {
  const std::string name = Unique("quiet");
  auto quiet = CreateTenant(*current_, name);
  ASSERT_TRUE(quiet.ok());
  oml::testing::ScopedTempDir dir("oml-heads");
  auto before = std::move(blob::OpenObjectStore("file://" + (dir.path() / "before").string())).value();
  PublishHeads(*before, {kProviderTenant, quiet->tenant_id}, *current_key_);
  auto rot = Rotate();
  ASSERT_TRUE(rot.ok()) << rot.status().ToString();
  auto at = std::move(blob::OpenObjectStore("file://" + (dir.path() / "at").string())).value();
  PublishHeads(*at, {kProviderTenant, quiet->tenant_id}, *old_key_);
  VerifyOptions only;
  only.only_tenant = name;
  only.root_public_key = tj_->key.public_key();
  auto genuine = VerifyChains(tj_->pool, only);
  ASSERT_TRUE(genuine.ok());
  ASSERT_TRUE(genuine->problems.empty()) << genuine->problems[0].what;

  const crypto::SigningKey& retired = *old_key_;
  const std::string new_id = current_key_->key_id();
  ResignRotation(rot->seq, retired, [&](Envelope& e) {
    ASSERT_EQ(e.payload["retired_heads"][quiet->tenant_id], 1);
    e.payload["retired_heads"][quiet->tenant_id] = 2;
  });
  Receipt planted = PlantNote(quiet->tenant_id, retired);
  ASSERT_EQ(planted.seq, 2);

  const std::string what = "key.issued binding does not verify under the key it issues (" + new_id +
                           "): its supersedes, retired_heads or place on the provider chain are not what that key signed";
  ExpectProviderProblem(VerifyChains(tj_->pool, only), rot->seq, what);
  VerifyOptions with_heads = only;
  with_heads.heads = before.get();
  ExpectProviderProblem(VerifyChains(tj_->pool, with_heads), rot->seq, what);
  with_heads.heads = at.get();
  ExpectProviderProblem(VerifyChains(tj_->pool, with_heads), rot->seq, what);
  // The key chain behind published heads (the fork check, the head publisher) refuses it too.
  auto keys = LoadTrustedKeys(tj_->pool, tj_->key.public_key());
  ASSERT_FALSE(keys.ok());
  EXPECT_EQ(keys.status().code(), Code::kDataLoss);
  EXPECT_EQ(keys.status().message(),
            "key chain: provider seq " + std::to_string(rot->seq) + ": " + what + " (run `oml verify`)");
}

// Once a provider event signed by the new key follows the rotation, a rewrite of the rotation
// breaks that event's link, which only the new key could sign again: here the attacker changes a
// field the binding does not cover (the principal), and the next provider event is the finding.
TEST_F(KeyRotationTest, ARotationFollowedByAProviderEventCannotBeReSigned) {
  auto rot = Rotate();
  ASSERT_TRUE(rot.ok()) << rot.status().ToString();
  auto later = CreateTenant(*current_, Unique("later"));  // provider seq rot + 1, signed by the new key
  ASSERT_TRUE(later.ok());
  ResignRotation(rot->seq, *old_key_, [](Envelope& e) { e.principal = "mallory"; });
  VerifyOptions provider;
  provider.only_tenant = kProviderTenant;
  ExpectProviderProblem(VerifyChains(tj_->pool, provider), rot->seq + 1,
                        "prev_hash does not link to the hash of seq " + std::to_string(rot->seq));
  auto keys = LoadTrustedKeys(tj_->pool, tj_->key.public_key());
  ASSERT_FALSE(keys.ok());
  EXPECT_EQ(keys.status().message(), "key chain: provider seq " + std::to_string(rot->seq + 1) +
                                         " does not link to the previous event (run `oml verify`)");
}

// A genuine rotation carries the new key's binding over exactly what it says and where it is on
// the provider chain; everything verifies, and the key chain behind published heads holds both
// keys.
TEST_F(KeyRotationTest, ARotationIsBoundByTheKeyItIssues) {
  const std::string name = Unique("bound");
  auto t = CreateTenant(*current_, name);
  ASSERT_TRUE(t.ok());
  auto rot = Rotate();
  ASSERT_TRUE(rot.ok()) << rot.status().ToString();
  auto env = Envelope::FromSignedBytes(rot->signed_bytes);
  ASSERT_TRUE(env.ok());
  EXPECT_EQ(env->key_id, old_key_->key_id());  // the event: signed by the key it retires
  ASSERT_TRUE(env->payload["binding"].is_string());
  auto binding = crypto::FromBase64(env->payload["binding"].get<std::string>());
  ASSERT_TRUE(binding.ok());
  ASSERT_EQ(binding->size(), 64u);
  auto statement = RotationStatement(rot->seq, rot->prev_hash, env->payload);
  ASSERT_TRUE(statement.ok());
  EXPECT_EQ(statement->rfind("oml/key.issued/binding/v1\n{\"payload\":{\"algorithm\":\"ed25519\",", 0), 0u) << *statement;
  EXPECT_NE(statement->find("\"retired_heads\":{"), std::string::npos);
  EXPECT_EQ(statement->find("\"binding\""), std::string::npos);
  EXPECT_NE(statement->find(",\"prev\":\"" + crypto::Hex(rot->prev_hash) + "\",\"seq\":" + std::to_string(rot->seq) +
                            ",\"tenant\":\"" + kProviderTenant + "\"}"),
            std::string::npos)
      << *statement;
  EXPECT_TRUE(crypto::Ed25519Verify(current_key_->public_key(), *statement, *binding));
  EXPECT_FALSE(crypto::Ed25519Verify(old_key_->public_key(), *statement, *binding));
  ASSERT_TRUE(current_->Append(t->tenant_id, Note("after")).ok());
  VerifyOptions only;  // the provider chain and this one (earlier tests of a plain run leave planted events)
  only.only_tenant = name;
  only.root_public_key = tj_->key.public_key();
  auto rep = VerifyChains(tj_->pool, only);
  ASSERT_TRUE(rep.ok()) << rep.status().ToString();
  EXPECT_TRUE(rep->problems.empty()) << rep->problems[0].tenant_name << ": " << rep->problems[0].what;
  auto keys = LoadTrustedKeys(tj_->pool, tj_->key.public_key());
  ASSERT_TRUE(keys.ok()) << keys.status().ToString();
  EXPECT_EQ(keys->count(old_key_->key_id()), 1u);
  EXPECT_EQ(keys->at(current_key_->key_id()), current_key_->public_key());
}

// The binding must be the new key's signature over this rotation: one by the retired key (which
// the attacker holds), one altered by a byte, one over another place on the provider chain, and
// none at all (the format before issue 17, which stripping the binding would bring back) are
// refused at the rotation's seq, by `oml verify` and by the key chain behind published heads.
// Each variant is the key.issued signed again by the retired key, as only its holder could.
TEST_F(KeyRotationTest, ABindingNotMadeByTheNewKeyOverThisRotationIsRefused) {
  auto rot = Rotate();
  ASSERT_TRUE(rot.ok()) << rot.status().ToString();
  const crypto::SigningKey& retired = *old_key_;
  const std::string new_id = current_key_->key_id();
  const std::string not_bound = "key.issued binding does not verify under the key it issues (" + new_id +
                                "): its supersedes, retired_heads or place on the provider chain are not what that key signed";
  const std::string unbound = "key.issued lacks the binding of the key it issues (" + new_id +
                              "): its retired_heads rest on the retired key alone (a rotation journalled before "
                              "bindings existed is refused)";
  struct Variant {
    const char* name;
    std::function<void(Envelope&)> edit;
    std::string what;
  };
  const std::vector<Variant> variants = {
      {"signed by the retired key",
       [&](Envelope& e) {
         e.payload["binding"] = crypto::Base64(retired.Sign(*RotationStatement(e.seq, e.prev_hash, e.payload)));
       },
       not_bound},
      {"one byte altered",
       [&](Envelope& e) {
         std::string sig = *crypto::FromBase64(e.payload["binding"].get<std::string>());
         sig[17] ^= 0x01;
         e.payload["binding"] = crypto::Base64(sig);
       },
       not_bound},
      {"the new key's, over the seq before",
       [&](Envelope& e) {
         // What the new key would have signed one provider seq earlier: the right key, the wrong place.
         e.payload["binding"] = crypto::Base64(current_key_->Sign(*RotationStatement(e.seq - 1, e.prev_hash, e.payload)));
       },
       not_bound},
      {"stripped", [](Envelope& e) { e.payload.erase("binding"); }, unbound},
  };
  VerifyOptions provider;
  provider.only_tenant = kProviderTenant;
  for (const auto& v : variants) {
    SCOPED_TRACE(v.name);
    ResignRotation(rot->seq, retired, v.edit);
    ExpectProviderProblem(VerifyChains(tj_->pool, provider), rot->seq, v.what);
    auto keys = LoadTrustedKeys(tj_->pool, tj_->key.public_key());
    ASSERT_FALSE(keys.ok());
    EXPECT_EQ(keys.status().code(), Code::kDataLoss);
    EXPECT_EQ(keys.status().message(),
              "key chain: provider seq " + std::to_string(rot->seq) + ": " + v.what + " (run `oml verify`)");
    Undo();
  }
  // Put back, the genuine rotation verifies again.
  auto rep = VerifyChains(tj_->pool, provider);
  ASSERT_TRUE(rep.ok());
  EXPECT_TRUE(rep->problems.empty()) << rep->problems[0].what;
  EXPECT_TRUE(LoadTrustedKeys(tj_->pool, tj_->key.public_key()).ok());
}

// What the binding leaves to the retired key's holder (docs/data/event-catalog.md, threat
// model): replacing a rotation that is the provider chain's head with one to a key of their own,
// bound by that key. It verifies on the provider chain, but the first event the real new key
// signed then names a key no key.issued issued.
TEST_F(KeyRotationTest, ARotationReplacedByOneToTheRetiredKeyHoldersOwnKeyIsExposedByTheNewKeysEvents) {
  const std::string name = Unique("busy");
  auto t = CreateTenant(*current_, name);
  ASSERT_TRUE(t.ok());
  auto rot = Rotate();
  ASSERT_TRUE(rot.ok()) << rot.status().ToString();
  auto signed_by_new = current_->Append(t->tenant_id, Note("the new key's first event"));
  ASSERT_TRUE(signed_by_new.ok());
  auto own = std::move(crypto::SigningKey::Generate()).value();
  ResignRotation(rot->seq, *old_key_, [&](Envelope& e) {
    e.payload["key_id"] = own.key_id();
    e.payload["public_key"] = crypto::Base64(own.public_key());
    e.payload["binding"] = crypto::Base64(own.Sign(*RotationStatement(e.seq, e.prev_hash, e.payload)));
  });
  VerifyOptions only;
  only.only_tenant = name;
  auto rep = VerifyChains(tj_->pool, only);
  ASSERT_TRUE(rep.ok()) << rep.status().ToString();
  ASSERT_EQ(rep->problems.size(), 1u);
  EXPECT_EQ(rep->problems[0].tenant_name, name);
  EXPECT_EQ(rep->problems[0].seq, signed_by_new->seq);
  EXPECT_EQ(rep->problems[0].what,
            "signed by " + current_key_->key_id() + ", which no key.issued on the provider chain issued");
}

TEST_F(KeyRotationTest, ARetiredKeyIsNeverReinstated) {
  auto rot = Rotate();
  ASSERT_TRUE(rot.ok()) << rot.status().ToString();
  const crypto::SigningKey& retired = *old_key_;
  auto again = IssueKey(*current_, retired);
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.status().type(), "signing-key-reused");
  auto su = Su();
  auto is_retired = su.Query("SELECT retired_at IS NOT NULL FROM oml.signing_keys WHERE key_id = $1", {db::Text(retired.key_id())});
  EXPECT_EQ(is_retired->Get(0, 0), "t");
  // The application role cannot clear a retirement, even in the provider scope ...
  auto h = tj_->pool.Acquire();
  auto app = (*h)->Scoped(kProviderTenant, {"UPDATE oml.signing_keys SET retired_at = NULL WHERE key_id = $1",
                                            {db::Text(retired.key_id())}});
  ASSERT_FALSE(app.ok());
  EXPECT_NE(app.status().log_detail().find("a retirement is final"), std::string::npos) << app.status().log_detail();
  // ... and neither can the superuser while the guard trigger is on.
  auto sup = su.Query("UPDATE oml.signing_keys SET retired_at = NULL WHERE key_id = $1", {db::Text(retired.key_id())});
  ASSERT_FALSE(sup.ok());
  EXPECT_NE(sup.status().log_detail().find("a retirement is final"), std::string::npos);
  EXPECT_EQ(CheckSigningKeyInForce(tj_->pool, retired).type(), "signing-key-not-in-force");
  EXPECT_TRUE(CheckSigningKeyInForce(tj_->pool, *current_key_).ok());
}

}  // namespace
}  // namespace oml::journal
