// Chain integrity against a real PostgreSQL cluster, tampered with as its superuser would:
// a chain rewound or diverged under a running writer, the publisher facing a head the new
// chain does not extend, planted head documents, and what `oml verify` must catch (a deleted
// tenant, a cut tail, rows above the head, time running backwards), plus the database rules on
// the outbox. Key rotation has its own binary (key_rotation_pg_test.cc): it retires the key
// every test here signs with.
#include <gtest/gtest.h>

#include <ctime>
#include <filesystem>
#include <fstream>

#include "blob/object_store.h"
#include "common/temp_dir_testing.h"
#include "crypto/crypto.h"
#include "db/conn.h"
#include "db/test_cluster.h"
#include "journal/chain_guard.h"
#include "journal/heads.h"
#include "journal/journal.h"
#include "journal/provider.h"
#include "journal/test_journal.h"
#include "journal/verify.h"

namespace oml::journal {
namespace {

// "YYYY-MM-DDTHH:MM:SS.ffffffZ" one second earlier.
std::string OneSecondBefore(const std::string& t) {
  std::tm tm{};
  strptime(t.substr(0, 19).c_str(), "%Y-%m-%dT%H:%M:%S", &tm);
  std::time_t secs = timegm(&tm) - 1;
  gmtime_r(&secs, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
  return std::string(buf) + t.substr(19);
}

class ChainIntegrityTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { tj_ = new testing::TestJournal(8); }

  void SetUp() override {
    dir_ = std::make_unique<oml::testing::ScopedTempDir>("oml-heads");
    store_ = std::move(blob::OpenObjectStore("file://" + dir_->path().string())).value();
    guard_ = std::make_unique<ChainGuard>();
    journal_ = std::make_unique<Journal>(&tj_->pool, &tj_->key);  // a fresh writer process
    journal_->SetChainGuard(guard_.get());
    TrustedKeys keys = std::move(LoadTrustedKeys(tj_->pool, "")).value();
    publisher_ = std::make_unique<HeadPublisher>(store_.get(), &tj_->key, 1000000, &tj_->pool, guard_.get(), keys, "");
    journal_->SetCommitListener([p = publisher_.get()](const Receipt& r) { p->OnCommit(r); });
  }
  void TearDown() override {
    publisher_.reset();
    journal_.reset();
  }

  static EventSpec Note(const std::string& text) {
    return EventSpec{"test.note", "tester", {{"text", text}}, nlohmann::json::object(), nullptr};
  }
  std::string NewTenant(const std::string& name) {
    auto t = CreateTenant(*journal_, name);
    EXPECT_TRUE(t.ok()) << t.status().ToString();
    return t->tenant_id;
  }
  Receipt Append(const std::string& tenant, const std::string& text) {
    auto r = journal_->Append(tenant, Note(text));
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? *r : Receipt{};
  }
  // As the superuser: the guard trigger off, `sql` run, the trigger back on.
  static void Tamper(const std::string& sql, const std::vector<db::Param>& params = {}) {
    auto c = db::Conn::Connect(db::testing::SuperuserUrl());
    ASSERT_TRUE(c.ok());
    ASSERT_TRUE(c->Exec("ALTER TABLE oml.journal DISABLE TRIGGER USER").ok());
    auto r = c->Query(sql, params);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ASSERT_TRUE(c->Exec("ALTER TABLE oml.journal ENABLE TRIGGER USER").ok());
  }
  // Cuts the chain back to `seq`: deletes the rows above and rewinds chain_heads.
  static void CutTo(const std::string& tenant, int64_t seq) {
    Tamper("DELETE FROM oml.journal WHERE tenant_id = $1 AND seq > $2", {db::Text(tenant), db::Int(seq)});
    Tamper("UPDATE oml.chain_heads h SET tree_size = NULL, tree_edge = NULL, seq = j.seq, event_hash = j.event_hash FROM oml.journal j "
           "WHERE h.tenant_id = $1 AND j.tenant_id = $1 AND j.seq = $2",
           {db::Text(tenant), db::Int(seq)});
  }
  static int64_t Rows(const std::string& tenant) {
    auto c = db::Conn::Connect(db::testing::SuperuserUrl());
    return c->Query("SELECT count(*) FROM oml.journal WHERE tenant_id = $1", {db::Text(tenant)})->GetInt(0, 0);
  }
  Result<VerifyReport> Verify(const std::string& only = "", bool with_heads = true) {
    VerifyOptions vo;
    vo.only_tenant = only;
    vo.heads = with_heads ? store_.get() : nullptr;
    return VerifyChains(tj_->pool, vo);
  }
  static const VerifyProblem* ProblemOf(const VerifyReport& rep, const std::string& tenant) {
    for (const auto& p : rep.problems)
      if (p.tenant_id == tenant) return &p;
    return nullptr;
  }
  std::optional<SignedHead> PublishedHead(const std::string& tenant) {
    auto bytes = store_->Get(HeadKey(tenant));
    if (!bytes.ok() || !bytes->has_value()) return std::nullopt;
    auto h = DecodeSignedHead(**bytes, {{tj_->key.key_id(), tj_->key.public_key()}});
    if (!h.ok()) return std::nullopt;
    return *h;
  }

  static testing::TestJournal* tj_;
  std::unique_ptr<oml::testing::ScopedTempDir> dir_;
  std::unique_ptr<blob::ObjectStore> store_;
  std::unique_ptr<ChainGuard> guard_;
  std::unique_ptr<Journal> journal_;
  std::unique_ptr<HeadPublisher> publisher_;
};
testing::TestJournal* ChainIntegrityTest::tj_ = nullptr;

TEST_F(ChainIntegrityTest, WriteOntoARewoundChainIsRefusedAndTheGateCloses) {
  const std::string t = NewTenant("rewound");
  Append(t, "a");
  Append(t, "b");
  Receipt last = Append(t, "c");  // seq 4
  ASSERT_EQ(last.seq, 4);
  CutTo(t, 2);  // a restore from before seqs 3 and 4
  auto r = journal_->Append(t, Note("onto the fork"));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kUnavailable);
  EXPECT_EQ(r.status().type(), "chain-fork");
  EXPECT_NE(r.status().message().find("the stored chain head is at seq 2, behind seq 4"), std::string::npos)
      << r.status().message();
  EXPECT_EQ(Rows(t), 2);  // nothing signed, nothing written: seq 3 is not handed out twice
  ASSERT_TRUE(guard_->Closed(t).has_value());
  // The gate stays closed, even once the chain is long again.
  auto again = journal_->Append(t, Note("still refused"));
  EXPECT_EQ(again.status().type(), "chain-fork");
  EXPECT_EQ(Rows(t), 2);
  // Other tenants still write.
  const std::string other = NewTenant("rewound-neighbour");
  EXPECT_EQ(Append(other, "fine").seq, 2);
}

TEST_F(ChainIntegrityTest, WriteOntoADivergedChainIsRefused) {
  const std::string t = NewTenant("diverged");
  Receipt r2 = Append(t, "a");
  // Same length, another event at the acknowledged seq.
  Tamper("UPDATE oml.journal SET event_hash = sha256(event_hash) WHERE tenant_id = $1 AND seq = $2",
         {db::Text(t), db::Int(r2.seq)});
  Tamper("UPDATE oml.chain_heads SET event_hash = sha256(event_hash) WHERE tenant_id = $1", {db::Text(t)});
  auto r = journal_->Append(t, Note("b"));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().type(), "chain-fork");
  EXPECT_NE(r.status().message().find("the stored event at seq 2 differs"), std::string::npos) << r.status().message();
  EXPECT_EQ(Rows(t), 2);
}

TEST_F(ChainIntegrityTest, AWriterWithoutAGuardIsWhatTheGuardPrevents) {
  // The same rewind without a guard: the writer hands out seq 3 a second time. This is the
  // behaviour the guard exists to stop (and shows the test above can fail).
  const std::string t = NewTenant("unguarded");
  Receipt first3 = Append(t, "a");
  Append(t, "b");
  CutTo(t, 2);
  Journal bare(&tj_->pool, &tj_->key);
  auto second3 = bare.Append(t, Note("again"));
  ASSERT_TRUE(second3.ok());
  EXPECT_EQ(second3->seq, 3);
  EXPECT_EQ(first3.seq, 2);
}

TEST_F(ChainIntegrityTest, AReplicaLearnsWhatAnotherAcknowledgedFromThePublishedHeads) {
  // Replica A acknowledges and publishes seqs 2..4; a failover loses 3 and 4; the next write
  // lands on replica B, which never wrote to this tenant. B reads A's published head before
  // signing and refuses, instead of handing out seq 3 a second time.
  const std::string t = NewTenant("two-replicas");
  Append(t, "a");
  Append(t, "b");
  Append(t, "c");
  ASSERT_TRUE(publisher_->Flush().ok());  // A's head: seq 4
  CutTo(t, 2);
  ChainGuard b_guard;
  Journal b(&tj_->pool, &tj_->key);
  b.SetChainGuard(&b_guard);
  HeadPublisher b_publisher(store_.get(), &tj_->key, 1000000, &tj_->pool, &b_guard,
                            {{tj_->key.key_id(), tj_->key.public_key()}}, "");
  b_guard.SetRefresher([&](const std::string& tenant) { b_publisher.RefreshGuard(tenant); }, std::chrono::milliseconds(0));
  auto r = b.Append(t, Note("on replica B"));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().type(), "chain-fork");
  EXPECT_NE(r.status().message().find("the stored chain head is at seq 2, behind seq 4"), std::string::npos)
      << r.status().message();
  EXPECT_EQ(Rows(t), 2);
}

TEST_F(ChainIntegrityTest, PublisherNeverOverwritesAHeadTheNewChainDoesNotExtend) {
  const std::string t = NewTenant("publish-fork");
  Append(t, "a");
  Append(t, "b");
  Receipt r4 = Append(t, "c");
  {
    // Replica A publishes seq 4.
    HeadPublisher a(store_.get(), &tj_->key, 1000000, &tj_->pool, nullptr, {{tj_->key.key_id(), tj_->key.public_key()}}, "");
    a.OnCommit(r4);
    ASSERT_TRUE(a.Flush().ok());
  }
  ASSERT_EQ(PublishedHead(t)->seq, 4);
  // The database loses seqs 3 and 4; replica B, which has not seen them (its writer is bare
  // here, to reach the publisher at all), then writes past the old length: seqs 3, 4, 5 with
  // other hashes, and its publisher is told of seq 5.
  CutTo(t, 2);
  Journal other(&tj_->pool, &tj_->key);
  Receipt r5;
  for (int i = 0; i < 3; ++i) r5 = std::move(other.Append(t, Note("new chain"))).value();
  ASSERT_EQ(r5.seq, 5);
  ChainGuard b_guard;
  HeadPublisher b(store_.get(), &tj_->key, 1000000, &tj_->pool, &b_guard, {{tj_->key.key_id(), tj_->key.public_key()}}, "");
  b.OnCommit(r5);
  ASSERT_TRUE(b.Flush().ok());
  auto still = PublishedHead(t);
  ASSERT_TRUE(still.has_value());
  EXPECT_EQ(still->seq, 4);
  EXPECT_EQ(still->event_hash, r4.event_hash);
  ASSERT_TRUE(b_guard.Closed(t).has_value());
  EXPECT_EQ(*b_guard.Closed(t), "the stored event at published seq 4 has another hash (the chain diverged)");
}

TEST_F(ChainIntegrityTest, PublisherExtendsItsOwnHeadAlongTheSameChain) {
  const std::string t = NewTenant("publish-extend");
  Append(t, "a");
  ASSERT_TRUE(publisher_->Flush().ok());
  Receipt r3 = Append(t, "b");
  ASSERT_TRUE(publisher_->Flush().ok());
  EXPECT_EQ(PublishedHead(t)->seq, r3.seq);
  EXPECT_FALSE(guard_->Closed(t).has_value());
}

TEST_F(ChainIntegrityTest, PlantedHeadsAreRepairedAndNeverCrashOrStopPublication) {
  const std::string t = NewTenant("planted");
  const std::string deep = std::string(5000, '[') + std::string(5000, ']');  // under the size cap
  const std::string forged_huge =
      R"({"head":{"v":1,"tenant":")" + t + R"(","seq":9007199254740993,"event_hash":")" + std::string(64, 'a') +
      R"(","key_id":")" + tj_->key.key_id() + R"(","published_at":"x"},"signature":"AAAA"})";
  const std::string bad_sig =
      R"({"head":{"v":1,"tenant":")" + t + R"(","seq":999999,"event_hash":")" + std::string(64, 'a') +
      R"(","key_id":")" + tj_->key.key_id() + R"(","published_at":"x"},"signature":")" +
      crypto::Base64(std::string(64, 'x')) + R"("})";
  const std::string nested = R"({"head":{"v":1,"tenant":{"a":{"b":{"c":{"d":1}}}}},"signature":"x"})";
  int n = 0;
  for (const std::string& doc : {deep, forged_huge, bad_sig, nested, std::string("not json"), std::string(20000, ' ')}) {
    ++n;
    ASSERT_TRUE(store_->Put(HeadKey(t), doc).ok());
    auto fc = CheckForks(tj_->pool, *store_, {{tj_->key.key_id(), tj_->key.public_key()}}, {t});
    ASSERT_TRUE(fc.ok()) << fc.status().ToString();
    ASSERT_EQ(fc->findings.size(), 1u) << n;
    EXPECT_TRUE(fc->findings[0].invalid_head) << n;
    Receipt r = Append(t, "after plant " + std::to_string(n));
    ASSERT_TRUE(publisher_->Flush().ok());
    auto head = PublishedHead(t);
    ASSERT_TRUE(head.has_value()) << "not repaired: document " << n;
    EXPECT_EQ(head->seq, r.seq) << n;
  }
  EXPECT_FALSE(guard_->Closed(t).has_value());
}

TEST_F(ChainIntegrityTest, HeadsSignedByAKeyOutsideTheKeyChainAreInvalid) {
  // A head signed by a key planted in signing_keys (but never issued on the provider chain) is
  // not trusted: the heads are checked against the key chain, not the table.
  const std::string t = NewTenant("foreign-key-head");
  Receipt r = Append(t, "a");
  auto mallory = std::move(crypto::SigningKey::Generate()).value();
  auto su = db::Conn::Connect(db::testing::SuperuserUrl());
  ASSERT_TRUE(su->Query("INSERT INTO oml.signing_keys (key_id, public_key, issued_seq, issued_at) VALUES ($1, $2, 999, now())",
                        {db::Text(mallory.key_id()), db::Bytes(mallory.public_key())})
                  .ok());
  auto doc = EncodeSignedHead({t, r.seq + 100, r.event_hash, mallory.key_id(), NowTimestamp()}, mallory);
  ASSERT_TRUE(store_->Put(HeadKey(t), *doc).ok());
  auto keys = LoadTrustedKeys(tj_->pool, tj_->key.public_key());
  ASSERT_TRUE(keys.ok()) << keys.status().ToString();
  EXPECT_EQ(keys->count(mallory.key_id()), 0u);
  auto fc = CheckForks(tj_->pool, *store_, *keys, {t});
  ASSERT_TRUE(fc.ok());
  ASSERT_EQ(fc->findings.size(), 1u);
  EXPECT_TRUE(fc->findings[0].invalid_head);
  EXPECT_NE(fc->findings[0].what.find("which the key chain does not hold"), std::string::npos) << fc->findings[0].what;
  ASSERT_TRUE(su->Query("DELETE FROM oml.signing_keys WHERE key_id = $1", {db::Text(mallory.key_id())}).ok());
}

TEST_F(ChainIntegrityTest, LoadTrustedKeysRefusesAProviderChainNotAnchoredInTheRoot) {
  auto other = std::move(crypto::SigningKey::Generate()).value();
  auto keys = LoadTrustedKeys(tj_->pool, other.public_key());
  ASSERT_FALSE(keys.ok());
  EXPECT_EQ(keys.status().code(), Code::kDataLoss);
  EXPECT_NE(keys.status().message().find("is not the deployment's root key"), std::string::npos);
}

TEST_F(ChainIntegrityTest, TheKeyChainIsReadFromSignedEnvelopesNotFromColumns) {
  NewTenant("keychain-neighbour");  // provider seq 3 exists after this
  auto su = db::Conn::Connect(db::testing::SuperuserUrl());
  auto row = su->Query("SELECT seq, event_hash, signed_bytes FROM oml.journal WHERE tenant_id = $1 AND seq = 2",
                       {db::Text(kProviderTenant)});
  ASSERT_TRUE(row.ok());
  const std::string hash = row->GetBytes(0, 1), bytes = row->GetBytes(0, 2);
  // Relabelling the key.issued row hides nothing: the key is found by its signed envelope.
  Tamper("UPDATE oml.journal SET event_type = 'test.note' WHERE tenant_id = $1 AND seq = 2", {db::Text(kProviderTenant)});
  auto keys = LoadTrustedKeys(tj_->pool, tj_->key.public_key());
  Tamper("UPDATE oml.journal SET event_type = 'key.issued' WHERE tenant_id = $1 AND seq = 2", {db::Text(kProviderTenant)});
  ASSERT_TRUE(keys.ok()) << keys.status().ToString();
  EXPECT_EQ(keys->count(tj_->key.key_id()), 1u);
  // A key.issued whose payload is not an object (rehashed, so only the links can tell): an
  // error naming the seq, never an exception.
  auto env = Envelope::FromSignedBytes(bytes);
  ASSERT_TRUE(env.ok());
  Envelope bad = *env;
  bad.payload = nlohmann::json::array();
  const std::string bad_bytes = *bad.SignedBytes();
  Tamper("UPDATE oml.journal SET signed_bytes = $2, event_hash = $3 WHERE tenant_id = $1 AND seq = 2",
         {db::Text(kProviderTenant), db::Bytes(bad_bytes), db::Bytes(crypto::Sha256(bad_bytes))});
  auto broken = LoadTrustedKeys(tj_->pool, tj_->key.public_key());
  Tamper("UPDATE oml.journal SET signed_bytes = $2, event_hash = $3 WHERE tenant_id = $1 AND seq = 2",
         {db::Text(kProviderTenant), db::Bytes(bytes), db::Bytes(hash)});
  ASSERT_FALSE(broken.ok());
  EXPECT_EQ(broken.status().code(), Code::kDataLoss);
  EXPECT_EQ(broken.status().message(), "key chain: provider seq 2 carries a malformed key (run `oml verify`)");
  // A row cut out of the provider chain: the key chain is refused, not cut short.
  Tamper("UPDATE oml.journal SET prev_hash = sha256(prev_hash) WHERE tenant_id = $1 AND seq = 3", {db::Text(kProviderTenant)});
  auto unlinked = LoadTrustedKeys(tj_->pool, tj_->key.public_key());
  Tamper("UPDATE oml.journal SET prev_hash = $2 WHERE tenant_id = $1 AND seq = 3", {db::Text(kProviderTenant), db::Bytes(hash)});
  ASSERT_FALSE(unlinked.ok());
  EXPECT_EQ(unlinked.status().message(), "key chain: provider seq 3 does not link to the previous event (run `oml verify`)");
  EXPECT_TRUE(LoadTrustedKeys(tj_->pool, tj_->key.public_key()).ok());
}

TEST_F(ChainIntegrityTest, VerifyNamesATenantWhoseRowsWereAllDeleted) {
  const std::string t = NewTenant("vanished");
  Append(t, "a");
  // Every row of the tenant, in every table, as a superuser would: triggers (the journal guard and
  // the foreign keys) off for this session.
  auto su = db::Conn::Connect(db::testing::SuperuserUrl());
  ASSERT_TRUE(su->Exec("SET session_replication_role = replica").ok());
  auto tables = su->Query("SELECT table_name FROM information_schema.columns WHERE table_schema = 'oml' "
                          "AND column_name = 'tenant_id' AND table_name IN (SELECT tablename FROM pg_tables "
                          "WHERE schemaname = 'oml')");
  ASSERT_TRUE(tables.ok());
  for (int i = 0; i < tables->size(); ++i)
    ASSERT_TRUE(su->Query("DELETE FROM oml." + tables->Get(i, 0) + " WHERE tenant_id = $1", {db::Text(t)}).ok());
  auto rep = Verify("", /*with_heads=*/false);
  ASSERT_TRUE(rep.ok()) << rep.status().ToString();
  const VerifyProblem* p = ProblemOf(*rep, t);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p->tenant_name, "vanished");
  EXPECT_EQ(p->seq, 1);
  EXPECT_NE(p->what.find("its tenants row is missing: the tenant was deleted"), std::string::npos) << p->what;
  // And by name, although no tenants row has that name any more.
  auto one = Verify("vanished", false);
  ASSERT_TRUE(one.ok()) << one.status().ToString();
  ASSERT_NE(ProblemOf(*one, t), nullptr);
}

TEST_F(ChainIntegrityTest, VerifyComparesEachChainWithItsPublishedHead) {
  const std::string t = NewTenant("cut-tail");
  Append(t, "a");
  Append(t, "b");
  Append(t, "c");
  ASSERT_TRUE(publisher_->Flush().ok());  // published head: seq 4
  auto clean = Verify("cut-tail");
  ASSERT_TRUE(clean.ok());
  EXPECT_EQ(ProblemOf(*clean, t), nullptr);
  CutTo(t, 2);
  // Without the heads store the shorter chain is consistent: that is the hole.
  auto blind = Verify("cut-tail", false);
  ASSERT_TRUE(blind.ok());
  EXPECT_EQ(ProblemOf(*blind, t), nullptr);
  auto rep = Verify("cut-tail");
  ASSERT_TRUE(rep.ok());
  const VerifyProblem* p = ProblemOf(*rep, t);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p->seq, 3);
  EXPECT_EQ(p->what, "the chain ends at seq 2 but its published head is at seq 4: the database lost committed events");
}

TEST_F(ChainIntegrityTest, VerifyReportsADivergedEventAtThePublishedSeq) {
  const std::string t = NewTenant("diverged-published");
  Receipt r = Append(t, "a");
  ASSERT_TRUE(publisher_->Flush().ok());
  // Replace the chain from seq 2 with a validly signed other event (the key holder's rewrite).
  CutTo(t, 1);
  Journal other(&tj_->pool, &tj_->key);
  ASSERT_TRUE(other.Append(t, Note("other")).ok());
  auto rep = Verify("diverged-published");
  ASSERT_TRUE(rep.ok());
  const VerifyProblem* p = ProblemOf(*rep, t);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p->seq, r.seq);
  EXPECT_EQ(p->what, "the event at seq 2 differs from the published head (the chain diverged)");
}

TEST_F(ChainIntegrityTest, VerifyReportsJournalRowsAboveTheChainHead) {
  const std::string t = NewTenant("above-head");
  Append(t, "a");
  Append(t, "b");
  auto su = db::Conn::Connect(db::testing::SuperuserUrl());
  ASSERT_TRUE(su->Query("UPDATE oml.chain_heads h SET tree_size = NULL, tree_edge = NULL, seq = 2, event_hash = j.event_hash FROM oml.journal j "
                        "WHERE h.tenant_id = $1 AND j.tenant_id = $1 AND j.seq = 2",
                        {db::Text(t)})
                  .ok());
  auto rep = Verify("above-head", false);
  ASSERT_TRUE(rep.ok());
  const VerifyProblem* p = ProblemOf(*rep, t);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p->seq, 3);
  EXPECT_EQ(p->what, "journal row at seq 3 is above the chain head (seq 2)");
}

TEST_F(ChainIntegrityTest, VerifyRequiresTimeNeverToDecreaseAlongAChain) {
  const std::string t = NewTenant("time-backwards");
  Receipt r2 = Append(t, "a");
  // A validly signed event (this key) whose time is before its predecessor's.
  auto env = Envelope::FromSignedBytes(r2.signed_bytes);
  ASSERT_TRUE(env.ok());
  Envelope e = *env;
  e.seq = 3;
  e.prev_hash = r2.event_hash;
  e.time = OneSecondBefore(e.time);  // still within the key's validity: only time order is broken
  e.payload = {{"text", "backdated"}};
  testing::PlantEvent(e, tj_->key);
  auto rep = Verify("time-backwards", false);
  ASSERT_TRUE(rep.ok());
  const VerifyProblem* p = ProblemOf(*rep, t);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p->seq, 3);
  EXPECT_EQ(p->what, "time " + e.time + " is before the previous event's time " + env->time);
}

TEST_F(ChainIntegrityTest, TheWriterKeepsTimeNonDecreasingAgainstAClockBehindTheChain) {
  // A head stamped a little ahead (a replica whose clock runs 30 s fast): the next event is
  // stamped no earlier than it.
  const std::string t = NewTenant("clamp");
  Append(t, "a");
  auto su = db::Conn::Connect(db::testing::SuperuserUrl());
  const std::string ahead = TimestampFromNow(30);
  ASSERT_TRUE(su->Query("UPDATE oml.chain_heads SET event_time = $2 WHERE tenant_id = $1", {db::Text(t), db::Text(ahead)})
                  .ok());
  Receipt r = Append(t, "b");
  EXPECT_EQ(Envelope::FromSignedBytes(r.signed_bytes)->time, ahead);
  // Far ahead (a broken clock, or a tampered chain_heads.event_time): refused, nothing signed.
  ASSERT_TRUE(su->Query("UPDATE oml.chain_heads SET event_time = '2999-01-01T00:00:00.000000Z' WHERE tenant_id = $1",
                        {db::Text(t)})
                  .ok());
  auto far = journal_->Append(t, Note("c"));
  ASSERT_FALSE(far.ok());
  EXPECT_EQ(far.status().type(), "clock-skew");
  EXPECT_EQ(Rows(t), 3);
}

TEST_F(ChainIntegrityTest, TheOutboxIsWrittenOnlyThroughEnqueueOutbox) {
  const std::string t = NewTenant("outbox-rule");
  // A fresh pooled connection per statement: a refused statement leaves its transaction aborted.
  auto run = [&](const std::string& scope, db::Stmt st) -> Result<db::Rows> {
    OML_ASSIGN_OR_RETURN(db::Pool::Handle h, tj_->pool.Acquire());
    return h->Scoped(scope, std::move(st));
  };
  auto direct = run(t, {"INSERT INTO oml.outbox (seq, tenant_id, xid, target_table, journal_seq, row_data) "
                                 "VALUES (999999, $1, pg_current_xact_id(), 'bronze/events', 1, '{}')",
                                 {db::Text(t)}});
  ASSERT_FALSE(direct.ok());
  EXPECT_EQ(direct.status().type(), "database-permission-denied");
  EXPECT_NE(direct.status().log_detail().find("[42501]"), std::string::npos) << direct.status().log_detail();
  auto seq = run(t, {"SELECT nextval('oml.outbox_seq')", {}});
  ASSERT_FALSE(seq.ok());
  EXPECT_EQ(seq.status().type(), "database-permission-denied");
  // Through the function, but for another tenant than the transaction's scope: refused.
  const std::string other = NewTenant("outbox-rule-other");
  // Both forms: enqueue_outbox_json (the commit point's, sql/0016) and the jsonb one.
  for (const char* fn : {"oml.enqueue_outbox_json($1, 'bronze/events', 1, '{}'::json)",
                         "oml.enqueue_outbox($1, 'bronze/events', 1, '{}')"}) {
    SCOPED_TRACE(fn);
    auto foreign = run(t, {std::string("SELECT ") + fn, {db::Text(other)}});
    ASSERT_FALSE(foreign.ok());
    EXPECT_EQ(foreign.status().type(), "database-permission-denied");
    EXPECT_NE(foreign.status().log_detail().find("in their own tenant's scope"), std::string::npos)
        << foreign.status().log_detail();
    // In its own scope it works (that is how every event's outbox row is written).
    auto own = run(t, {std::string("SELECT ") + fn, {db::Text(t)}});
    EXPECT_TRUE(own.ok()) << own.status().ToString();
  }
}

}  // namespace
}  // namespace oml::journal
