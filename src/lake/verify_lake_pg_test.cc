// `oml verify --from-lake` (lake/verify_lake.h) on a bronze table filled from a real journal.
//
// The table is written the way the lake writer writes it: the outbox rows' row_data with
// outbox_seq added (kept here with signed_bytes and signature as hex, so that a test can damage
// one byte, and turned back into base64 for the adapter), appended through
// lake::DeltaTable with the writer's txn. Each test then damages one thing in a copy of those
// rows and expects the exact finding (tenant, seq, message) that `oml verify` would give for the
// same damage in PostgreSQL, or the lake's own (duplicates, columns that disagree with the
// signed bytes).
#include "lake/verify_lake.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/temp_dir_testing.h"
#include "crypto/crypto.h"
#include "db/conn.h"
#include "db/test_cluster.h"
#include "journal/bronze_row.h"
#include "journal/provider.h"
#include "journal/test_journal.h"
#include "lake/delta_tables.h"

namespace oml::lake {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

json ClaimPayload(const std::string& artifact, const std::string& path, const nlohmann::json& simulation) {
  return {{"artifact_id", artifact}, {"version", 1}, {"workarea_id", "wa-1"}, {"path", path},
          {"writer_key_id", "ak_0123456789abcdef"}, {"principal", "alice"}, {"provenance", "agent"},
          {"simulation_id", simulation}, {"media_type", "text/plain"}, {"size", 5},
          {"plaintext_sha256", std::string(64, 'a')}, {"ciphertext_sha256", std::string(64, 'c')}};
}

class VerifyLakeTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    tj_ = new journal::testing::TestJournal(4);
    acme_ = std::move(journal::CreateTenant(tj_->journal, "acme")).value().tenant_id;
    auto& j = tj_->journal;
    // acme: 1 genesis, 2 claim, 3 claim (simulation), 4 erase of the first, 5 claim
    for (const journal::EventSpec& ev :
         {journal::EventSpec{"claim.submitted", "alice", ClaimPayload(kArtifact, "notes/a.md", nullptr)},
          journal::EventSpec{"claim.submitted", "alice", ClaimPayload(kArtifact2, "notes/b.md", "sim-7")},
          journal::EventSpec{"artifact.erased", "operator",
                             {{"artifact_id", kArtifact}, {"ciphertext_sha256", std::string(64, 'c')},
                              {"plaintext_sha256", std::string(64, 'a')}, {"reason", "gdpr"}}},
          journal::EventSpec{"claim.submitted", "bob", ClaimPayload(kArtifact3, "notes/c.md", nullptr)}}) {
      auto rc = j.Append(acme_, ev);
      ASSERT_TRUE(rc.ok()) << rc.status().ToString();
    }
    // beta is created last: its tenant.created is the provider chain's last event.
    beta_ = std::move(journal::CreateTenant(tj_->journal, "beta")).value().tenant_id;
    ASSERT_TRUE(j.Append(beta_, {"claim.submitted", "carol", ClaimPayload(kArtifact4, "x.md", nullptr)}).ok());
    // A key rotation (provider seq 5, retired_heads: acme 5, beta 2), then acme seq 6 under the new key.
    new_key_ = new crypto::SigningKey(std::move(crypto::SigningKey::Generate()).value());
    ASSERT_TRUE(journal::IssueKey(j, *new_key_).ok());
    rotated_ = new journal::Journal(&tj_->pool, new_key_);
    ASSERT_TRUE(rotated_->Append(acme_, {"claim.submitted", "alice", ClaimPayload(kArtifact5, "d.md", nullptr)}).ok());

    // The outbox, converted as the lake writer converts it.
    auto su = db::Conn::Connect(db::testing::SuperuserUrl());
    ASSERT_TRUE(su.ok()) << su.status().ToString();
    auto r = su->Query("SELECT seq, row_data::text FROM oml.outbox WHERE target_table = 'bronze/events' ORDER BY seq");
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    rows_ = new std::vector<json>;
    for (int i = 0; i < r->size(); ++i) {
      json row = json::parse(r->Get(i, 1));
      for (const char* b : {"signed_bytes", "signature"})
        row[b] = crypto::Hex(std::move(crypto::FromBase64(row[b].get<std::string>())).value());
      row["outbox_seq"] = r->GetInt(i, 0);
      rows_->push_back(std::move(row));
    }
  }
  static void TearDownTestSuite() {
    delete rows_;
    delete rotated_;
    delete new_key_;
    delete tj_;
  }

  // A fresh lake holding `rows` in bronze/events (one commit, as one lake writer batch).
  std::string WriteLake(const std::vector<json>& rows) {
    const std::string root = (tmp_.path() / ("lake" + std::to_string(lakes_++))).string();
    Status st = EnsureBronzeEvents(root);
    EXPECT_TRUE(st.ok()) << st.ToString();
    auto t = DeltaTable::Open(root + "/bronze/events");
    EXPECT_TRUE(t.ok()) << t.status().ToString();
    std::string jsonl;
    int64_t end = 0;
    for (const auto& r : rows) {
      // The rows are kept with hex binaries (easy to damage one byte); the adapter takes base64.
      json w = r;
      for (const char* b : {"signed_bytes", "signature"})
        if (w[b].is_string()) w[b] = crypto::Base64(std::move(crypto::FromHex(w[b].get<std::string>())).value());
      jsonl += w.dump() + "\n";
      end = std::max(end, r["outbox_seq"].get<int64_t>());
    }
    auto v = t->Append(jsonl, TxnCommit{"oml-lakewriter", end, {{"oml.batch_start", 0}, {"oml.batch_end", end}}});
    EXPECT_TRUE(v.ok()) << v.status().ToString();
    return root;
  }

  journal::VerifyOptions Options() {
    journal::VerifyOptions o;
    o.root_public_key = tj_->key.public_key();
    o.threads = 2;
    return o;
  }

  Result<LakeVerifyReport> Verify(const std::vector<json>& rows) { return VerifyChainsFromLake(WriteLake(rows), Options()); }

  // The index in rows_ of (tenant, seq).
  static size_t At(const std::string& tenant, int64_t seq) {
    for (size_t i = 0; i < rows_->size(); ++i)
      if ((*rows_)[i]["tenant_id"] == tenant && (*rows_)[i]["seq"] == seq) return i;
    ADD_FAILURE() << "no row " << tenant << " " << seq;
    return 0;
  }

  // The bronze row of `e` signed by `key`, as the lake writer writes it (binaries kept as hex).
  static json SignedRow(const journal::Envelope& e, const crypto::SigningKey& key, int64_t outbox_seq) {
    auto rc = journal::SignEnvelope(e, key);
    EXPECT_TRUE(rc.ok()) << rc.status().ToString();
    json row = journal::BronzeRow(e, rc->event_hash, rc->signed_bytes, rc->signature);
    row["signed_bytes"] = crypto::Hex(rc->signed_bytes);
    row["signature"] = crypto::Hex(rc->signature);
    row["outbox_seq"] = outbox_seq;
    return row;
  }
  // A claim by "mallory" at `tenant`'s `seq`, linked to the row before it and signed by the key
  // the rotation retired, after every row of rows_.
  static json PlantedClaim(const std::string& tenant, int64_t seq, const char* artifact) {
    journal::Envelope e;
    e.tenant = tenant;
    e.seq = seq;
    e.prev_hash = std::move(crypto::FromHex((*rows_)[At(tenant, seq - 1)]["event_hash"].get<std::string>())).value();
    e.type = "claim.submitted";
    e.time = journal::NowTimestamp();
    e.key_id = tj_->key.key_id();  // retired at provider seq 5
    e.principal = "mallory";
    e.payload = ClaimPayload(artifact, "planted.md", nullptr);
    return SignedRow(e, tj_->key, rows_->back()["outbox_seq"].get<int64_t>() + 1);
  }

  // Exactly one finding, on `tenant`, at `seq`, saying `what`.
  static void ExpectOneProblem(const Result<LakeVerifyReport>& r, const std::string& tenant, int64_t seq,
                               const std::string& what) {
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ASSERT_EQ(r->chains.problems.size(), 1u) << (r->chains.problems.empty() ? "" : r->chains.problems[0].what);
    const auto& p = r->chains.problems[0];
    EXPECT_EQ(p.tenant_id, tenant);
    EXPECT_EQ(p.seq, seq);
    EXPECT_EQ(p.what, what);
  }

  static constexpr const char* kArtifact = "0b7e6a52-8f0c-4d7e-9a51-3f2c1d0e9b8a";
  static constexpr const char* kArtifact2 = "1b7e6a52-8f0c-4d7e-9a51-3f2c1d0e9b8a";
  static constexpr const char* kArtifact3 = "2b7e6a52-8f0c-4d7e-9a51-3f2c1d0e9b8a";
  static constexpr const char* kArtifact4 = "3b7e6a52-8f0c-4d7e-9a51-3f2c1d0e9b8a";
  static constexpr const char* kArtifact5 = "4b7e6a52-8f0c-4d7e-9a51-3f2c1d0e9b8a";
  static journal::testing::TestJournal* tj_;
  static crypto::SigningKey* new_key_;
  static journal::Journal* rotated_;
  static std::string acme_, beta_;
  static std::vector<json>* rows_;
  oml::testing::ScopedTempDir tmp_{"oml-verify-lake"};
  int lakes_ = 0;
};
journal::testing::TestJournal* VerifyLakeTest::tj_ = nullptr;
std::string VerifyLakeTest::acme_, VerifyLakeTest::beta_;
std::vector<json>* VerifyLakeTest::rows_ = nullptr;
crypto::SigningKey* VerifyLakeTest::new_key_ = nullptr;
journal::Journal* VerifyLakeTest::rotated_ = nullptr;

// UtcMicros parses the times envelopes carry and arrow-json writes; cross-checked against timegm
// (what it replaced) for valid inputs, and refusing everything else.
TEST(UtcMicrosTest, AgreesWithTimegmAndRefusesWhatIsNotAUtcTime) {
  auto timegm_us = [](int y, int mo, int d, int h, int mi, int s, int64_t frac) {
    std::tm tm{};
    tm.tm_year = y - 1900;
    tm.tm_mon = mo - 1;
    tm.tm_mday = d;
    tm.tm_hour = h;
    tm.tm_min = mi;
    tm.tm_sec = s;
    return static_cast<int64_t>(timegm(&tm)) * 1000000 + frac;
  };
  EXPECT_EQ(UtcMicros(json("2026-12-02T14:28:27.728138Z")), timegm_us(2026, 12, 2, 14, 28, 27, 728138));
  EXPECT_EQ(UtcMicros(json("1970-01-01T00:00:00Z")), 0);
  EXPECT_EQ(UtcMicros(json("1969-12-31T23:59:59.5Z")), -500000);
  EXPECT_EQ(UtcMicros(json("2024-02-29T23:59:59+00:00")), timegm_us(2024, 2, 29, 23, 59, 59, 0));
  EXPECT_EQ(UtcMicros(json("2025-01-02T03:04:05.123456789Z")), timegm_us(2025, 1, 2, 3, 4, 5, 123456));
  EXPECT_EQ(UtcMicros(json("2025-01-02T03:04:05.1Z")), timegm_us(2025, 1, 2, 3, 4, 5, 100000));
  EXPECT_EQ(UtcMicros(json("2016-12-31T23:59:60Z")), timegm_us(2016, 12, 31, 23, 59, 60, 0));  // leap second
  EXPECT_EQ(UtcMicros(json("2023-02-30T00:00:00Z")), timegm_us(2023, 2, 30, 0, 0, 0, 0));      // carries over
  EXPECT_EQ(UtcMicros(json(int64_t{1735787045123456})), 1735787045123456);
  for (const char* bad : {"", "2025-01-02", "2025-01-02T03:04:05", "2025-01-02T03:04:05+01:00", "2025-01-02 03:04:05Z",
                          "2025-1-02T03:04:05Z", "2025-01-02T03:04:05.Z", "2025-13-02T03:04:05Z", "2025-00-02T03:04:05Z",
                          "2025-01-32T03:04:05Z", "2025-01-02T24:00:00Z", "2025-01-02T03:60:05Z", "+025-01-02T03:04:05Z",
                          "2025-01-02T03:04:05Zjunk", "2025-01-02T03:04: 5Z"})
    EXPECT_EQ(UtcMicros(json(bad)), std::nullopt) << bad;
  EXPECT_EQ(UtcMicros(json(1.5)), std::nullopt);
  EXPECT_EQ(UtcMicros(json(nullptr)), std::nullopt);
}

TEST_F(VerifyLakeTest, OutboxRowsCarryThePayloadColumns) {
  // provider: genesis, key.issued, tenant.created acme, tenant.created beta, key.issued; acme 6; beta 2.
  ASSERT_EQ(rows_->size(), 13u);
  const json& claim = (*rows_)[At(acme_, 3)];
  EXPECT_EQ(claim["artifact_id"], kArtifact2);
  EXPECT_EQ(claim["version"], 1);
  EXPECT_EQ(claim["workarea_id"], "wa-1");
  EXPECT_EQ(claim["path"], "notes/b.md");
  EXPECT_EQ(claim["provenance"], "agent");
  EXPECT_EQ(claim["simulation_id"], "sim-7");
  EXPECT_EQ(claim["plaintext_sha256"], std::string(64, 'a'));
  EXPECT_EQ(claim["ciphertext_sha256"], std::string(64, 'c'));
  EXPECT_TRUE((*rows_)[At(acme_, 2)]["simulation_id"].is_null());
  const json& erased = (*rows_)[At(acme_, 4)];
  EXPECT_EQ(erased["artifact_id"], kArtifact);
  EXPECT_TRUE(erased["version"].is_null());
  EXPECT_TRUE(erased["path"].is_null());
  EXPECT_EQ(erased["ciphertext_sha256"], std::string(64, 'c'));
  const json& genesis = (*rows_)[At(acme_, 1)];
  for (const char* c : {"artifact_id", "version", "workarea_id", "path", "provenance", "simulation_id",
                        "plaintext_sha256", "ciphertext_sha256"})
    EXPECT_TRUE(genesis.contains(c) && genesis[c].is_null()) << c;
}

TEST_F(VerifyLakeTest, IntactLakeVerifiesLikeTheDatabase) {
  const std::string root = WriteLake(*rows_);
  auto r = VerifyChainsFromLake(root, Options());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  for (const auto& p : r->chains.problems) ADD_FAILURE() << p.tenant_name << " seq " << p.seq << ": " << p.what;
  EXPECT_EQ(r->chains.tenants, 3);
  EXPECT_EQ(r->chains.events, 13);
  EXPECT_EQ(r->rows, 13);
  EXPECT_EQ(r->table_version, 1);
  auto pg = journal::VerifyChains(tj_->pool, Options());
  ASSERT_TRUE(pg.ok()) << pg.status().ToString();
  EXPECT_TRUE(pg->problems.empty());
  EXPECT_EQ(pg->tenants, r->chains.tenants);
  EXPECT_EQ(pg->events, r->chains.events);

  // Read back: the payload columns are typed columns of the table (version a long).
  auto t = DeltaTable::Open(root + "/bronze/events");
  ASSERT_TRUE(t.ok());
  auto text = t->ReadRowsJsonl();
  ASSERT_TRUE(text.ok());
  std::istringstream in(*text);
  int claims = 0;
  for (std::string line; std::getline(in, line);) {
    json row = json::parse(line);
    if (row["event_type"] == "claim.submitted") {
      ++claims;
      EXPECT_TRUE(row["version"].is_number_integer()) << line;
      EXPECT_TRUE(row["artifact_id"].is_string()) << line;
    }
  }
  EXPECT_EQ(claims, 5);

  // File statistics are on: the commit's add action carries numRecords and min/max values.
  std::ifstream log(fs::path(root) / "bronze" / "events" / "_delta_log" / "00000000000000000001.json");
  bool saw_add = false;
  for (std::string line; std::getline(log, line);) {
    json a = json::parse(line);
    if (!a.contains("add")) continue;
    saw_add = true;
    json stats = json::parse(a["add"]["stats"].get<std::string>());
    EXPECT_EQ(stats["numRecords"], 13);
    EXPECT_EQ(stats["minValues"]["seq"], 1);
    EXPECT_EQ(stats["maxValues"]["outbox_seq"], rows_->back()["outbox_seq"]);
    EXPECT_TRUE(stats["minValues"].contains("occurred_at")) << stats.dump();
    EXPECT_TRUE(stats["minValues"].contains("artifact_id")) << stats.dump();
    EXPECT_EQ(stats["nullCount"]["simulation_id"], 12) << stats.dump();  // only acme seq 3 has one
    // delta-rs keeps no statistics for binary columns (nothing to skip on in signed bytes).
    EXPECT_FALSE(stats["minValues"].contains("signed_bytes")) << stats.dump();
  }
  EXPECT_TRUE(saw_add);
}

TEST_F(VerifyLakeTest, FlippedSignedByteFailsAtItsSeq) {
  auto rows = *rows_;
  std::string hex = rows[At(acme_, 3)]["signed_bytes"];
  hex[20] = hex[20] == '0' ? '1' : '0';
  rows[At(acme_, 3)]["signed_bytes"] = hex;
  ExpectOneProblem(Verify(rows), acme_, 3, "event_hash is not SHA-256 of the signed bytes");
}

TEST_F(VerifyLakeTest, DroppedSeqFailsAtTheGap) {
  auto rows = *rows_;
  rows.erase(rows.begin() + static_cast<long>(At(acme_, 2)));
  ExpectOneProblem(Verify(rows), acme_, 2, "seq 2 is missing (next stored seq is 3)");
}

TEST_F(VerifyLakeTest, SwappedPrevHashFailsAtTheLink) {
  auto rows = *rows_;
  rows[At(acme_, 3)]["prev_hash"] = (*rows_)[At(acme_, 2)]["prev_hash"];
  ExpectOneProblem(Verify(rows), acme_, 3, "prev_hash does not link to the hash of seq 2");
}

TEST_F(VerifyLakeTest, FlippedSignatureFailsUnderTheKeyInForce) {
  auto rows = *rows_;
  std::string hex = rows[At(acme_, 5)]["signature"];
  hex[0] = hex[0] == 'f' ? 'e' : 'f';
  rows[At(acme_, 5)]["signature"] = hex;
  ExpectOneProblem(Verify(rows), acme_, 5, "signature does not verify under key " + tj_->key.key_id());
  rows = *rows_;  // under the rotated key too
  hex = rows[At(acme_, 6)]["signature"].get<std::string>();
  hex[0] = hex[0] == 'f' ? 'e' : 'f';
  rows[At(acme_, 6)]["signature"] = hex;
  ExpectOneProblem(Verify(rows), acme_, 6, "signature does not verify under key " + new_key_->key_id());
}

// Whoever kept the retired key signs an event after acme's head at the rotation: a valid
// signature, a valid link, and still refused by the key.issued rules, from the lake alone.
TEST_F(VerifyLakeTest, EventOfTheRetiredKeyAfterTheRotationFails) {
  auto rows = *rows_;
  rows.push_back(PlantedClaim(acme_, 7, kArtifact));
  ExpectOneProblem(Verify(rows), acme_, 7,
                   "signed by " + tj_->key.key_id() +
                       " after that key was retired: the rotation at provider seq 5 recorded this chain's head at seq 5");
}

// Issue 17 from the lake alone: the rotation (provider seq 5) is the provider chain's last
// event, so whoever kept the retired key re-signs it with beta's retired head raised from 2 to 3
// and signs beta seq 3 with the retired key. The new key's binding refuses the rotation.
TEST_F(VerifyLakeTest, RetiredHeadsReSignedByTheRetiredKeyFailAtTheRotation) {
  auto rows = *rows_;
  json& rot = rows[At(journal::kProviderTenant, 5)];
  journal::Envelope e = std::move(journal::Envelope::FromSignedBytes(
                                      std::move(crypto::FromHex(rot["signed_bytes"].get<std::string>())).value()))
                            .value();
  ASSERT_EQ(e.type, "key.issued");
  ASSERT_EQ(e.payload["retired_heads"][beta_], 2);
  e.payload["retired_heads"][beta_] = 3;
  rot = SignedRow(e, tj_->key, rot["outbox_seq"].get<int64_t>());
  rows.push_back(PlantedClaim(beta_, 3, kArtifact4));
  auto o = Options();
  o.only_tenant = "beta";  // acme holds an event of the new key, which the refused rotation does not issue
  ExpectOneProblem(VerifyChainsFromLake(WriteLake(rows), o), journal::kProviderTenant, 5,
                   "key.issued binding does not verify under the key it issues (" + new_key_->key_id() +
                       "): its supersedes, retired_heads or place on the provider chain are not what that key signed");
}

TEST_F(VerifyLakeTest, RowStoredTwiceIsAFinding) {
  auto rows = *rows_;
  json twice = (*rows_)[At(acme_, 3)];
  twice["outbox_seq"] = rows_->back()["outbox_seq"].get<int64_t>() + 1;
  rows.push_back(twice);
  ExpectOneProblem(Verify(rows), acme_, 3, "seq 3 is stored more than once");
}

TEST_F(VerifyLakeTest, DuplicatesOnAPageBoundaryAreSeen) {
  auto rows = *rows_;
  json twice = (*rows_)[At(acme_, 2)];
  twice["outbox_seq"] = rows_->back()["outbox_seq"].get<int64_t>() + 1;
  rows.push_back(twice);
  auto o = Options();
  o.page_rows = 2;  // pages of acme: {1, 2, 2}, {3, 4}, {5}
  auto r = VerifyChainsFromLake(WriteLake(rows), o);
  ExpectOneProblem(r, acme_, 2, "seq 2 is stored more than once");
}

TEST_F(VerifyLakeTest, PayloadColumnThatDisagreesWithTheSignedBytesFails) {
  auto rows = *rows_;
  rows[At(acme_, 2)]["artifact_id"] = kArtifact3;
  ExpectOneProblem(Verify(rows), acme_, 2,
                   std::string("the bronze column artifact_id (\"") + kArtifact3 +
                       "\") differs from the signed event (\"" + kArtifact + "\")");
  rows = *rows_;
  rows[At(acme_, 4)]["version"] = 1;  // artifact.erased carries no version
  ExpectOneProblem(Verify(rows), acme_, 4, "the bronze column version (1) differs from the signed event (null)");
}

TEST_F(VerifyLakeTest, OccurredAtThatDisagreesWithTheSignedTimeFails) {
  auto rows = *rows_;
  rows[At(beta_, 2)]["occurred_at"] = "2001-01-01T00:00:00.000001Z";
  auto r = Verify(rows);
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->chains.problems.size(), 1u);
  EXPECT_EQ(r->chains.problems[0].tenant_id, beta_);
  EXPECT_EQ(r->chains.problems[0].seq, 2);
  EXPECT_EQ(r->chains.problems[0].what.rfind("the bronze column occurred_at (\"2001-01-01T00:00:00.000001", 0), 0u)
      << r->chains.problems[0].what;
}

TEST_F(VerifyLakeTest, ALaggingLakeIsNotAFinding) {
  // The lake is a prefix of the outbox: cut after beta's tenant.created, before its genesis.
  std::vector<json> rows;
  for (const auto& r : *rows_) {
    if (r["tenant_id"] == beta_) break;
    rows.push_back(r);
  }
  ASSERT_EQ(rows.back()["event_type"], "tenant.created");
  auto r = Verify(rows);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  for (const auto& p : r->chains.problems) ADD_FAILURE() << p.tenant_name << " seq " << p.seq << ": " << p.what;
}

TEST_F(VerifyLakeTest, ALostChainIsAFinding) {
  // acme's tenant.created is followed by beta's: acme's genesis committed before it.
  std::vector<json> rows;
  for (const auto& r : *rows_)
    if (r["tenant_id"] != acme_) rows.push_back(r);
  auto r = Verify(rows);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->chains.problems.size(), 1u);
  EXPECT_EQ(r->chains.problems[0].tenant_id, acme_);
  EXPECT_EQ(r->chains.problems[0].tenant_name, "acme");
  EXPECT_EQ(r->chains.problems[0].seq, 1);
  EXPECT_EQ(r->chains.problems[0].what,
            "chain has no rows in bronze/events, but its tenant.created is followed by later provider events there");
}

TEST_F(VerifyLakeTest, AnotherRootKeyFailsTheProviderChain) {
  auto o = Options();
  o.root_public_key = std::move(crypto::SigningKey::Generate()).value().public_key();
  auto r = VerifyChainsFromLake(WriteLake(*rows_), o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->chains.problems.size(), 3u);  // provider, and every chain that hangs on its keys
  bool provider = false;
  for (const auto& p : r->chains.problems)
    if (p.tenant_id == journal::kProviderTenant) {
      provider = true;
      EXPECT_EQ(p.seq, 2);
      EXPECT_EQ(p.what, "the first key.issued is not the deployment's root key");
    }
  EXPECT_TRUE(provider);
}

TEST_F(VerifyLakeTest, NoTableIsAPrecondition) {
  auto r = VerifyChainsFromLake((tmp_.path() / "nothing").string(), Options());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kFailedPrecondition) << r.status().ToString();
  EXPECT_EQ(r.status().type(), "lake-table-missing");
}

TEST_F(VerifyLakeTest, AnEmptyTableIsAPrecondition) {
  const std::string root = (tmp_.path() / "empty").string();
  ASSERT_TRUE(EnsureBronzeEvents(root).ok());
  auto r = VerifyChainsFromLake(root, Options());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kFailedPrecondition) << r.status().ToString();
  EXPECT_EQ(r.status().type(), "lake-empty");
}

}  // namespace
}  // namespace oml::lake
