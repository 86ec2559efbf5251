// Signing-key rotation against a real PostgreSQL cluster: rotation is exclusive with appends and
// records each chain's head, so a retired key cannot sign a backdated event that verifies; a
// retired key is never reinstated. Its own binary (own cluster): it retires the key the other
// journal tests sign with. The tests run in order and share the key state.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "common/sync_point_testing.h"
#include "crypto/crypto.h"
#include "db/conn.h"
#include "db/test_cluster.h"
#include "journal/journal.h"
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
  void TearDown() override { SyncPoints::ClearAll(); }
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
