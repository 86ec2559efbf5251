// The commit point against a real PostgreSQL cluster (db/test_cluster.h): fault points leave
// nothing behind, and group commit is forced deterministically with a sync point.
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <condition_variable>
#include <cstdio>
#include <optional>
#include <thread>

#include "blob/object_store.h"
#include "common/sync_point.h"
#include "common/sync_point_testing.h"
#include "crypto/crypto.h"
#include "db/conn.h"
#include "db/test_cluster.h"
#include "journal/journal.h"
#include "journal/merkle_edge.h"
#include "journal/provider.h"
#include "journal/test_journal.h"
#include "journal/tlog_store.h"
#include "tlog/checkpoint.h"
#include "tlog/note.h"
#include "tlog/witness.h"
#include "journal/verify.h"

namespace oml::journal {
namespace {

class JournalPgTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    static auto* tj = new testing::TestJournal(16);
    pool_ = &tj->pool;
    journal_ = &tj->journal;
  }
  void TearDown() override { SyncPoints::ClearAll(); }

  // Row counts seen by the superuser (RLS does not apply).
  static std::string Counts() {
    auto c = db::Conn::Connect(db::testing::SuperuserUrl());
    auto r = c->Query("SELECT (SELECT count(*) FROM oml.journal) || '/' || (SELECT count(*) FROM oml.outbox) || '/' || "
                      "(SELECT count(*) FROM oml.chain_heads) || '/' || (SELECT count(*) FROM oml.tenants)");
    return r->Get(0, 0);
  }
  static EventSpec Note(const std::string& text) {
    return EventSpec{"test.note", "tester", {{"text", text}}, nlohmann::json::object(), nullptr};
  }

  static db::Pool* pool_;
  static Journal* journal_;
};
db::Pool* JournalPgTest::pool_ = nullptr;
Journal* JournalPgTest::journal_ = nullptr;

TEST_F(JournalPgTest, FaultPointsLeaveNoRowAndNoSeqGap) {
  auto t = CreateTenant(*journal_, "faults");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  for (const char* point : {"journal.after_journal_insert", "journal.after_outbox_insert"}) {
    std::string before = Counts();
    SyncPoints::Set(point, [] { return Status(Code::kInternal, "boom", "injected-fault"); });
    auto r = journal_->Append(t->tenant_id, Note("doomed"));
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().type(), "injected-fault");
    EXPECT_EQ(Counts(), before) << point;
    SyncPoints::Clear(point);
  }
  auto ok = journal_->Append(t->tenant_id, Note("after"));
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(ok->seq, 2);  // genesis is 1; the faults consumed nothing
}

// Issue 23: the commit point keeps each chain's Merkle edge (sql/0029) in the append's
// transaction. Superuser helpers: the stored edge, and the tree the journal holds.
class MerkleEdgeTest : public JournalPgTest {
 protected:
  static db::Conn Su() { return std::move(db::Conn::Connect(db::testing::SuperuserUrl())).value(); }
  static std::optional<merkle::CompactRange> Stored(const std::string& t) {
    auto c = pool_->Acquire();
    auto r = StoredTree(**c, t);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? *r : std::nullopt;
  }
  static merkle::CompactRange FromJournal(const std::string& t, int64_t upto) {
    auto c = pool_->Acquire();
    auto r = TreeFromJournal(**c, t, upto);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? *r : merkle::CompactRange();
  }
  static int64_t Head(const std::string& t) {
    auto r = Su().Query("SELECT seq FROM oml.chain_heads WHERE tenant_id = $1", {db::Text(t)});
    return r.ok() && r->size() == 1 ? r->GetInt(0, 0) : -1;
  }
  void Append(const std::string& t, int n) {
    for (int i = 0; i < n; ++i) ASSERT_TRUE(journal_->Append(t, Note("n" + std::to_string(i))).ok());
  }
  void ExpectEdgeMatchesJournal(const std::string& t) {
    const int64_t head = Head(t);
    auto stored = Stored(t);
    ASSERT_TRUE(stored.has_value()) << "no edge for " << t;
    EXPECT_EQ(static_cast<int64_t>(stored->size()), head);
    EXPECT_EQ(stored->Encode(), FromJournal(t, head).Encode());
  }
};

TEST_F(MerkleEdgeTest, EveryAppendKeepsTheEdgeOfTheChainsTree) {
  auto t = CreateTenant(*journal_, "merkle-edge");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  ExpectEdgeMatchesJournal(t->tenant_id);
  for (int round = 0; round < 5; ++round) {
    Append(t->tenant_id, round + 1);
    ExpectEdgeMatchesJournal(t->tenant_id);
  }
  // The root is the RFC 9162 root of the events' signed_bytes in seq order.
  auto rows = Su().Query("SELECT signed_bytes FROM oml.journal WHERE tenant_id = $1 ORDER BY seq", {db::Text(t->tenant_id)});
  ASSERT_TRUE(rows.ok());
  merkle::MemoryTree mem;
  for (int i = 0; i < rows->size(); ++i) mem.Append(merkle::HashLeaf(rows->GetBytes(i, 0)));
  EXPECT_EQ(Stored(t->tenant_id)->Root(), merkle::RootAt(mem, mem.size()).value());
  EXPECT_EQ(mem.size(), 16u);  // tenant.created, api key..., and the 15 notes: whatever the chain holds
}

// A writer of the previous version appends without the edge (tree_size stays behind): the next
// append catches up from the journal. A chain from before 0029 (no edge) is left alone by
// appends until BuildMissingTrees builds it, reading without the lock up to the head it found
// and, under the lock, what an append added meanwhile (at the sync point).
TEST_F(MerkleEdgeTest, ALaggingEdgeCatchesUpAndAMissingOneIsBuiltFromTheJournal) {
  auto t = CreateTenant(*journal_, "merkle-lag");
  ASSERT_TRUE(t.ok());
  const std::string id = t->tenant_id;
  Append(id, 6);
  const int64_t head = Head(id);
  const merkle::CompactRange older = FromJournal(id, head - 3);
  ASSERT_TRUE(Su().Query("UPDATE oml.chain_heads SET tree_size = $2, tree_edge = $3 WHERE tenant_id = $1",
                         {db::Text(id), db::Int(head - 3), db::Bytes(older.Encode())}).ok());
  Append(id, 1);
  ExpectEdgeMatchesJournal(id);

  ASSERT_TRUE(Su().Query("UPDATE oml.chain_heads SET tree_size = NULL, tree_edge = NULL WHERE tenant_id = $1",
                         {db::Text(id)}).ok());
  Append(id, 2);
  EXPECT_FALSE(Stored(id).has_value());  // appends do not build a tree they do not have
  SyncPoints::Set("journal.tree_build.before_lock", [&] {
    SyncPoints::Clear("journal.tree_build.before_lock");
    EXPECT_TRUE(journal_->Append(id, Note("meanwhile")).ok());
    return Status::Ok();
  });
  auto built = BuildMissingTrees(*pool_);
  ASSERT_TRUE(built.ok()) << built.status().ToString();
  EXPECT_GE(built->chains, 1);
  ExpectEdgeMatchesJournal(id);  // the event appended meanwhile included
  Append(id, 3);
  ExpectEdgeMatchesJournal(id);
  auto again = BuildMissingTrees(*pool_);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->chains, 0);

  // An edge that does not fit its size is dropped by the next append and rebuilt.
  ASSERT_TRUE(Su().Query("UPDATE oml.chain_heads SET tree_edge = substr(tree_edge, 33) || tree_edge WHERE tenant_id = $1",
                         {db::Text(id)}).ok());
  Append(id, 1);
  EXPECT_FALSE(Stored(id).has_value());
  ASSERT_TRUE(BuildMissingTrees(*pool_).ok());
  ExpectEdgeMatchesJournal(id);
}

// One chain that cannot be built does not stop the others; a stop request stops the build.
TEST_F(MerkleEdgeTest, OneChainFailingLeavesTheOthersBuiltAndAStopStopsTheBuild) {
  auto a = CreateTenant(*journal_, "merkle-fail-a"), b = CreateTenant(*journal_, "merkle-fail-b");
  ASSERT_TRUE(a.ok() && b.ok());
  for (const auto& id : {a->tenant_id, b->tenant_id}) {
    Append(id, 2);
    ASSERT_TRUE(Su().Query("UPDATE oml.chain_heads SET tree_size = NULL, tree_edge = NULL WHERE tenant_id = $1",
                           {db::Text(id)}).ok());
  }
  std::atomic<bool> stop{true};
  auto stopped = BuildMissingTrees(*pool_, &stop);
  ASSERT_TRUE(stopped.ok()) << stopped.status().ToString();
  EXPECT_EQ(stopped->chains, 0);
  EXPECT_FALSE(Stored(a->tenant_id).has_value());

  SyncPoints::Set("journal.tree_build.before_lock", [] {
    SyncPoints::Clear("journal.tree_build.before_lock");  // the first chain built fails, once
    return Status(Code::kUnavailable, "the database went away", "database-unavailable");
  });
  auto failed = BuildMissingTrees(*pool_);
  SyncPoints::ClearAll();
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(failed.status().type(), "database-unavailable");
  EXPECT_NE(failed.status().message().find("1 chain(s) without an edge"), std::string::npos) << failed.status().message();
  EXPECT_EQ(Stored(a->tenant_id).has_value() + Stored(b->tenant_id).has_value(), 1);  // the other one was built
  ASSERT_TRUE(BuildMissingTrees(*pool_).ok());
  ExpectEdgeMatchesJournal(a->tenant_id);
  ExpectEdgeMatchesJournal(b->tenant_id);
}

// `oml verify` checks the stored edge against the tree of the chain it walks: a lagging but true
// edge passes; a tampered one, or one longer than the chain, is named at its size.
TEST_F(MerkleEdgeTest, VerifyChecksTheStoredEdge) {
  auto t = CreateTenant(*journal_, "merkle-verify");
  ASSERT_TRUE(t.ok());
  const std::string id = t->tenant_id;
  Append(id, 5);
  auto verify = [&]() {
    VerifyOptions o;
    o.only_tenant = id;
    auto r = VerifyChains(*pool_, o);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? r->problems : std::vector<VerifyProblem>{{"", "", -1, "verify failed"}};
  };
  EXPECT_TRUE(verify().empty());
  const int64_t head = Head(id);
  auto set_edge = [&](int64_t size, const std::string& edge) {
    ASSERT_TRUE(Su().Query("UPDATE oml.chain_heads SET tree_size = $2, tree_edge = $3 WHERE tenant_id = $1",
                           {db::Text(id), db::Int(size), db::Bytes(edge)}).ok());
  };
  set_edge(head - 2, FromJournal(id, head - 2).Encode());  // left behind by a previous version
  EXPECT_TRUE(verify().empty());
  std::string bad = FromJournal(id, head).Encode();
  bad[5] ^= 1;
  set_edge(head, bad);
  auto problems = verify();
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_EQ(problems[0].seq, head);
  EXPECT_EQ(problems[0].what, "the stored Merkle edge at size " + std::to_string(head) +
                                  " is not the edge of the chain's tree (its root would not be the chain's)");
  set_edge(head + 1, FromJournal(id, head).Encode() + std::string(32, 'x'));
  problems = verify();
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_EQ(problems[0].what, "the stored Merkle edge covers " + std::to_string(head + 1) +
                                  " events, more than the chain's " + std::to_string(head));
  set_edge(head, FromJournal(id, head).Encode());
  EXPECT_TRUE(verify().empty());
}

// The tiles (sql/0030) give the journal's tree: every root, inclusion and consistency proof read
// from them equals the one from all leaf hashes in memory, after extensions of every step size
// (partial tiles rewritten, a level-0 tile completing a level-1 entry, 600+ leaves).
class TlogStoreTest : public MerkleEdgeTest {
 protected:
  static merkle::MemoryTree Memory(const std::string& t) {
    auto rows = Su().Query("SELECT signed_bytes FROM oml.journal WHERE tenant_id = $1 ORDER BY seq", {db::Text(t)});
    EXPECT_TRUE(rows.ok());
    merkle::MemoryTree mem;
    for (int i = 0; rows.ok() && i < rows->size(); ++i) mem.Append(merkle::HashLeaf(rows->GetBytes(i, 0)));
    return mem;
  }
  static int64_t Tiled(const std::string& t) {
    auto c = pool_->Acquire();
    auto s = ReadTlogState(**c, t);
    EXPECT_TRUE(s.ok());
    return s.ok() ? s->tiled_size : -1;
  }
  void AppendMany(const std::string& t, int n) {
    for (int i = 0; i < n; ++i) ASSERT_TRUE(journal_->Append(t, Note(std::to_string(i))).ok());
  }
};

TEST_F(TlogStoreTest, TilesGiveTheJournalsTreeAfterExtensionsOfEveryStep) {
  auto t = CreateTenant(*journal_, "tlog-tiles");
  ASSERT_TRUE(t.ok());
  const std::string id = t->tenant_id;
  AppendMany(id, 620);
  merkle::MemoryTree mem = Memory(id);
  const uint64_t n = mem.size();
  ASSERT_GT(n, 600u);
  uint64_t step = 1;
  for (int64_t from = 0; from < static_cast<int64_t>(n);) {
    auto e = ExtendTiles(*pool_, id, static_cast<int64_t>(step));
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    EXPECT_EQ(e->from, from);
    EXPECT_EQ(e->to, std::min<int64_t>(static_cast<int64_t>(n), from + static_cast<int64_t>(step)));
    from = e->to;
    EXPECT_EQ(e->verified, from == static_cast<int64_t>(n));  // the commit point's edge is at n
    EXPECT_EQ(Tiled(id), from);
    auto c = pool_->Acquire();
    TileReader tiles(&**c, id);
    const uint64_t size = static_cast<uint64_t>(from);
    for (uint64_t m : {uint64_t{1}, size / 3 + 1, size / 2 + 1, size - 1, size}) {
      if (m == 0 || m > size) continue;
      EXPECT_EQ(merkle::RootAt(tiles, m).value(), merkle::RootAt(mem, m).value()) << m;
      for (uint64_t i : {uint64_t{0}, m / 2, m - 1}) {
        auto got = merkle::InclusionProof(tiles, i, m);
        ASSERT_TRUE(got.ok()) << got.status().ToString();
        EXPECT_EQ(*got, merkle::InclusionProof(mem, i, m).value()) << i << " of " << m;
      }
      EXPECT_EQ(merkle::ConsistencyProof(tiles, m, size).value(), merkle::ConsistencyProof(mem, m, size).value());
    }
    // 0, 1, 8, 256, 512, 515, then 256 at a time: two starts at a nonzero multiple of 256 (the
    // last full level-0 tile read for the check), a level-1 entry completed by each full tile.
    step = step == 1 ? 7 : step == 7 ? 248 : step == 248 ? 256 : step == 256 && from == 512 ? 3 : 256;
  }
  // One prefetch reads every tile an inclusion proof needs (one statement per proof).
  for (uint64_t i : {uint64_t{0}, uint64_t{255}, uint64_t{256}, uint64_t{300}, uint64_t{511}, uint64_t{512}, n - 1}) {
    auto c = pool_->Acquire();
    TileReader tiles(&**c, id);
    ASSERT_TRUE(tiles.Prefetch(i, n).ok());
    EXPECT_EQ(merkle::InclusionProof(tiles, i, n).value(), merkle::InclusionProof(mem, i, n).value());
    EXPECT_EQ(tiles.tiles_read(), 1) << i;
    TileReader tiles2(&**c, id);
    ASSERT_TRUE(tiles2.Prefetch(i, n, i + 1).ok());
    EXPECT_EQ(merkle::ConsistencyProof(tiles2, i + 1, n).value(), merkle::ConsistencyProof(mem, i + 1, n).value());
    EXPECT_EQ(tiles2.tiles_read(), 1) << i;
  }
  // Nothing past the tiles: a node the tiles do not hold yet is "no-node".
  AppendMany(id, 1);
  auto c = pool_->Acquire();
  TileReader tiles(&**c, id);
  EXPECT_EQ(tiles.Node(0, n).status().type(), "no-node");
  auto again = ExtendTiles(*pool_, id);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->to, static_cast<int64_t>(n + 1));
  EXPECT_EQ(again->tiles_written, 1);  // the partial level-0 tile only
}

TEST_F(TlogStoreTest, CheckpointsAreSignedNotesOverTheTilesAndAForkIsRefused) {
  auto t = CreateTenant(*journal_, "tlog-checkpoint");
  ASSERT_TRUE(t.ok());
  const std::string id = t->tenant_id;
  auto key = crypto::SigningKey::Generate();
  ASSERT_TRUE(key.ok());
  AppendMany(id, 10);
  ASSERT_TRUE(ExtendTiles(*pool_, id).ok());
  auto note = SignCheckpoint(*pool_, id, "oml.test", *key);
  ASSERT_TRUE(note.ok()) << note.status().ToString();
  const std::string origin = "oml.test/" + id;
  auto opened = tlog::OpenNote(*note, {tlog::MakeNoteKey(origin, key->public_key())});
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  auto body = tlog::ParseCheckpoint(opened->text);
  ASSERT_TRUE(body.ok());
  merkle::MemoryTree mem = Memory(id);
  EXPECT_EQ(body->origin, origin);
  EXPECT_EQ(body->size, mem.size());
  EXPECT_EQ(body->root, merkle::RootAt(mem, mem.size()).value());
  EXPECT_EQ(SignCheckpoint(*pool_, id, "oml.test", *key).value(), *note);  // nothing new: the same note
  // Grown: a new checkpoint, consistent with the first by a proof from the tiles.
  AppendMany(id, 5);
  ASSERT_TRUE(ExtendTiles(*pool_, id).ok());
  auto second = SignCheckpoint(*pool_, id, "oml.test", *key);
  ASSERT_TRUE(second.ok());
  auto body2 = tlog::ParseCheckpoint(tlog::OpenNote(*second, {tlog::MakeNoteKey(origin, key->public_key())})->text);
  ASSERT_TRUE(body2.ok());
  EXPECT_EQ(body2->size, body->size + 5);
  {
    auto c = pool_->Acquire();
    TileReader tiles(&**c, id);
    auto proof = merkle::ConsistencyProof(tiles, body->size, body2->size);
    ASSERT_TRUE(proof.ok());
    EXPECT_TRUE(merkle::VerifyConsistency(body->size, body2->size, *proof, body->root, body2->root).ok());
  }
  // Another key (a rotation) at the same size: a note under the new key, not the old note.
  auto key2 = crypto::SigningKey::Generate();
  ASSERT_TRUE(key2.ok());
  auto rotated = SignCheckpoint(*pool_, id, "oml.test", *key2);
  ASSERT_TRUE(rotated.ok());
  EXPECT_TRUE(tlog::OpenNote(*rotated, {tlog::MakeNoteKey(origin, key2->public_key())}).ok());
  // Flips one bit of byte `at` (0-based) of the level-0 tile 0.
  auto flip = [&](int64_t at) {
    ASSERT_TRUE(Su().Query("UPDATE oml.merkle_tiles SET hashes = set_byte(hashes, $2::int, get_byte(hashes, $2::int) # 1) "
                           "WHERE tenant_id = $1 AND level = 0 AND idx = 0",
                           {db::Text(id), db::Int(at)}).ok());
  };
  // A tile changed under the checkpoint: signing is refused, and so is an extension (the
  // partial tile is folded into the root compared with the commit point's edge).
  flip(40);
  auto refused = SignCheckpoint(*pool_, id, "oml.test", *key2);
  EXPECT_EQ(refused.status().type(), "tlog-fork");
  EXPECT_EQ(refused.status().message(),
            "chain " + id + ": the tiles no longer give the root of the checkpoint at size " + std::to_string(body2->size));
  AppendMany(id, 1);
  auto ext = ExtendTiles(*pool_, id);
  EXPECT_EQ(ext.status().type(), "tlog-fork");
  EXPECT_EQ(ext.status().message(), "chain " + id + ": the tree at size " + std::to_string(body2->size + 1) +
                                        " folded from the tiles and the journal is not the commit point's (its root differs)");
  {
    auto c = pool_->Acquire();
    auto st = ReadTlogState(**c, id);
    ASSERT_TRUE(st.ok());
    EXPECT_EQ(st->checkpoint, *rotated);  // still the last good one
    EXPECT_EQ(st->tiled_size, static_cast<int64_t>(body2->size));
  }
  flip(40);  // repaired
  auto ok = ExtendTiles(*pool_, id);
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_TRUE(ok->verified);
  // The journal's last tiled leaf differs from the tiles' (a chain rewritten under them).
  const int64_t tiled = Tiled(id);
  flip((tiled - 1) * 32 + 3);
  AppendMany(id, 1);
  auto bad = ExtendTiles(*pool_, id);
  EXPECT_EQ(bad.status().type(), "tlog-fork");
  EXPECT_EQ(bad.status().message(),
            "chain " + id + ": the event at seq " + std::to_string(tiled) + " is not the leaf the tiles hold there");
  EXPECT_EQ(Tiled(id), tiled);
  EXPECT_EQ(ExtendTiles(*pool_, crypto::NewUuidV4()).status().type(), "unknown-chain");
  // A chain restored behind its tiles.
  ASSERT_TRUE(Su().Query("UPDATE oml.tlog_state SET tiled_size = tiled_size + 100 WHERE tenant_id = $1", {db::Text(id)}).ok());
  auto behind = ExtendTiles(*pool_, id);
  EXPECT_EQ(behind.status().type(), "tlog-fork");
  EXPECT_EQ(behind.status().message(), "chain " + id + ": the tiles cover " + std::to_string(tiled + 100) +
                                           " events, the chain holds " + std::to_string(Head(id)) +
                                           " (restored behind its published tree)");
}

TEST(TlogPathsTest, C2spTilesPaths) {
  EXPECT_EQ(TilePath(0, 0, 256), "tile/0/000");
  EXPECT_EQ(TilePath(0, 5, 7), "tile/0/005.p/7");
  EXPECT_EQ(TilePath(1, 999, 256), "tile/1/999");
  EXPECT_EQ(TilePath(1, 1000, 256), "tile/1/x001/000");
  EXPECT_EQ(TilePath(2, 1234067, 1), "tile/2/x001/x234/067.p/1");
  EXPECT_EQ(EntryBundlePath(1234067, 256), "tile/entries/x001/x234/067");
  EXPECT_EQ(EntryBundlePath(0, 255), "tile/entries/000.p/255");
  EXPECT_EQ(TlogPrefix("t"), "oml-tlog/t/");
}

// One round of the publisher: tiles to the edge, a checkpoint, and the objects (full tile,
// partial tiles, bundles, checkpoint) in the store; a failed put is written again next round.
TEST_F(TlogStoreTest, PublishTlogsWritesTilesBundlesAndTheCheckpointAndRetriesAFailedPut) {
  auto t = CreateTenant(*journal_, "tlog-publish");
  ASSERT_TRUE(t.ok());
  const std::string id = t->tenant_id;
  AppendMany(id, 300);
  const crypto::SigningKey* key = &journal_->key();  // the key in force (a key not in force signs nothing)
  auto dir = std::filesystem::temp_directory_path() / ("tlog-" + crypto::NewUuidV4());
  auto store = blob::OpenObjectStore("file://" + dir.string());
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  auto round = PublishTlogs(*pool_, store->get(), "oml.test", *key);
  ASSERT_TRUE(round.ok()) << round.status().ToString();
  EXPECT_GE(round->chains, 1);
  EXPECT_TRUE(round->failures.empty());
  const uint64_t n = Memory(id).size();
  auto get = [&](const std::string& k) { return (*store)->Get(TlogPrefix(id) + k).value(); };
  auto cp = get("checkpoint");
  ASSERT_TRUE(cp.has_value());
  auto opened = tlog::OpenNote(*cp, {tlog::MakeNoteKey("oml.test/" + id, key->public_key())});
  ASSERT_TRUE(opened.ok());
  EXPECT_EQ(tlog::ParseCheckpoint(opened->text)->size, n);
  merkle::MemoryTree mem = Memory(id);
  auto full = get(TilePath(0, 0, 256));
  ASSERT_TRUE(full.has_value());
  EXPECT_EQ(full->size(), 256u * 32);
  EXPECT_EQ(full->substr(0, 32), mem.Node(0, 0).value());
  auto partial = get(TilePath(0, 1, n - 256));
  ASSERT_TRUE(partial.has_value());
  EXPECT_EQ(partial->substr(partial->size() - 32), mem.Node(0, n - 1).value());
  auto level1 = get(TilePath(1, 0, 1));
  ASSERT_TRUE(level1.has_value());
  EXPECT_EQ(*level1, mem.Node(8, 0).value());
  auto bundle = get(EntryBundlePath(1, n - 256));
  ASSERT_TRUE(bundle.has_value());
  auto rows = Su().Query("SELECT signed_bytes FROM oml.journal WHERE tenant_id = $1 AND seq > 256 ORDER BY seq", {db::Text(id)});
  ASSERT_TRUE(rows.ok());
  std::string want;
  for (int i = 0; i < rows->size(); ++i) {
    const std::string e = rows->GetBytes(i, 0);
    want += static_cast<char>(e.size() >> 8);
    want += static_cast<char>(e.size() & 0xFF);
    want += e;
  }
  EXPECT_EQ(*bundle, want);
  // The published size is recorded, and the chain has no work left: a quiet chain costs nothing.
  auto pending = [&](const std::string& origin) {
    auto r = Su().Query("SELECT count(*) FROM oml.tlog_pending($1) t WHERE t = $2::uuid",
                        {db::Text(CheckpointSigner(*key, origin)), db::Text(id)});
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? r->GetInt(0, 0) : -1;
  };
  {
    auto c = pool_->Acquire();
    EXPECT_EQ(ReadTlogState(**c, id)->published_size, static_cast<int64_t>(n));
  }
  EXPECT_EQ(pending("oml.test"), 0);
  EXPECT_EQ(pending("oml.other"), 1);  // another origin (or key): re-signed though quiet
  // A round whose puts failed after the checkpoint was signed (published_size left behind, the
  // objects missing): the next round writes them all again.
  ASSERT_TRUE(Su().Query("UPDATE oml.tlog_state SET published_size = 0 WHERE tenant_id = $1", {db::Text(id)}).ok());
  std::filesystem::remove_all(dir / "oml-tlog");
  ASSERT_TRUE(PublishTlogs(*pool_, store->get(), "oml.test", *key).ok());
  EXPECT_EQ(get(TilePath(0, 0, 256)), full);
  EXPECT_EQ(get(EntryBundlePath(1, n - 256)), bundle);
  EXPECT_EQ(get("checkpoint"), cp);  // nothing new to sign: the same note
  // Growth: the partial tile and bundle under their new width, and a new checkpoint.
  AppendMany(id, 1);
  ASSERT_TRUE(PublishTlogs(*pool_, store->get(), "oml.test", *key).ok());
  EXPECT_TRUE(get(TilePath(0, 1, n + 1 - 256)).has_value());
  EXPECT_EQ(tlog::ParseCheckpoint(tlog::OpenNote(*get("checkpoint"), {tlog::MakeNoteKey("oml.test/" + id, key->public_key())})->text)->size,
            n + 1);
  std::filesystem::remove_all(dir);
}

// Two publishers of one chain (two replicas): one read the state and wrote the tiles of size n,
// then a newer checkpoint was signed and published (at the sync point); the first must not put
// its older checkpoint over the newer one. A changed tlog_origin re-signs a quiet chain; a key
// not in force signs nothing; an entry too long for a bundle leaves that bundle out, not the log.
TEST_F(TlogStoreTest, AnOlderCheckpointIsNeverPutOverANewerOneAndQuietChainsAreReSigned) {
  auto t = CreateTenant(*journal_, "tlog-race");
  ASSERT_TRUE(t.ok());
  const std::string id = t->tenant_id;
  AppendMany(id, 5);
  const crypto::SigningKey& key = journal_->key();
  auto dir = std::filesystem::temp_directory_path() / ("tlog-" + crypto::NewUuidV4());
  auto store = blob::OpenObjectStore("file://" + dir.string());
  ASSERT_TRUE(store.ok());
  ASSERT_TRUE(ExtendTiles(*pool_, id).ok());
  auto older = SignCheckpoint(*pool_, id, "oml.test", key);
  ASSERT_TRUE(older.ok());
  std::string newer;
  SyncPoints::Set("tlog.publish.before_checkpoint", [&] {
    SyncPoints::Clear("tlog.publish.before_checkpoint");
    EXPECT_TRUE(journal_->Append(id, Note("meanwhile")).ok());
    EXPECT_TRUE(ExtendTiles(*pool_, id).ok());
    newer = SignCheckpoint(*pool_, id, "oml.test", key).value();
    EXPECT_TRUE(PublishTlogObjects(*pool_, **store, id).ok());  // the other replica, all the way
    return Status::Ok();
  });
  ASSERT_TRUE(PublishTlogObjects(*pool_, **store, id).ok());
  ASSERT_NE(newer, *older);
  auto get = [&](const std::string& k) { return (*store)->Get(TlogPrefix(id) + k).value(); };
  EXPECT_EQ(get("checkpoint"), newer);
  {
    auto c = pool_->Acquire();
    auto st = ReadTlogState(**c, id);
    EXPECT_EQ(st->published_size, *st->checkpoint_size);
    EXPECT_EQ(st->checkpoint, newer);
  }
  // A new tlog_origin: the quiet chain is signed again under it.
  auto round = PublishTlogs(*pool_, store->get(), "oml.other", key);
  ASSERT_TRUE(round.ok()) << round.status().ToString();
  EXPECT_TRUE(round->failures.empty());
  auto opened = tlog::OpenNote(*get("checkpoint"), {tlog::MakeNoteKey("oml.other/" + id, key.public_key())});
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  // A key that is not the deployment's signs nothing.
  auto stranger = crypto::SigningKey::Generate();
  ASSERT_TRUE(stranger.ok());
  AppendMany(id, 1);
  EXPECT_EQ(PublishTlogs(*pool_, store->get(), "oml.other", *stranger).status().type(), "signing-key-not-in-force");
  EXPECT_TRUE(tlog::OpenNote(*get("checkpoint"), {tlog::MakeNoteKey("oml.other/" + id, key.public_key())}).ok());
  // An entry longer than a bundle's uint16 length: its bundle is left out, the tiles and the
  // checkpoint are published.
  ASSERT_TRUE(journal_->Append(id, Note(std::string(70000, 'x'))).ok());
  round = PublishTlogs(*pool_, store->get(), "oml.other", key);
  ASSERT_TRUE(round.ok());
  EXPECT_TRUE(round->failures.empty());
  const uint64_t n = Memory(id).size();
  auto cp = tlog::OpenNote(*get("checkpoint"), {tlog::MakeNoteKey("oml.other/" + id, key.public_key())});
  ASSERT_TRUE(cp.ok());
  EXPECT_EQ(tlog::ParseCheckpoint(cp->text)->size, n);
  EXPECT_TRUE(get(TilePath(0, 0, n)).has_value());
  EXPECT_FALSE(get(EntryBundlePath(0, n)).has_value());
  EXPECT_TRUE(get(EntryBundlePath(0, n - 2)).has_value());  // an earlier round's, before it
  std::filesystem::remove_all(dir);
}

// In-memory witness state for in-process witnesses (tlog/witness.h).
class MemoryWitnessState : public tlog::WitnessState {
 public:
  Result<std::optional<tlog::WitnessRecord>> Get(const std::string& origin) override {
    auto it = records.find(origin);
    return it == records.end() ? std::optional<tlog::WitnessRecord>() : std::optional<tlog::WitnessRecord>(it->second);
  }
  Status Put(const std::string& origin, const tlog::WitnessRecord& r) override {
    records[origin] = r;
    return Status::Ok();
  }
  std::map<std::string, tlog::WitnessRecord> records;
};

// Three in-process `oml witness`es of the deployment "oml.test"; `down` ones are unreachable.
struct Witnesses {
  explicit Witnesses(const crypto::SigningKey& log_key) {
    for (int i = 0; i < 3; ++i) {
      keys.push_back(crypto::SigningKey::Generate().value());
      states.push_back(std::make_unique<MemoryWitnessState>());
    }
    for (int i = 0; i < 3; ++i) {
      const std::string name = "w" + std::to_string(i + 1);
      witnesses.push_back(std::make_unique<tlog::Witness>(std::map<std::string, std::vector<tlog::NoteKey>>{}, name,
                                                          &keys[i], states[i].get(),
                                                          std::map<std::string, std::vector<std::string>>{
                                                              {"oml.test", {log_key.public_key()}}}));
      policy.witnesses.push_back({"http://w" + std::to_string(i + 1), tlog::MakeNoteKey(name, keys[i].public_key(),
                                                                                        tlog::kAlgCosignatureV1)});
    }
    policy.quorum = 2;
    policy.post = [this](const TlogWitness& w, const std::string& body) -> Result<WitnessReply> {
      const int i = w.key.name[1] - '1';
      ++requests[i];
      if (down[i]) return Unavailable("down", "server-unreachable");
      if (forged[i]) {  // its own key hash, a signature that does not verify
        std::string line = tlog::CosignatureLine(tlog::NoteText(body.substr(body.find("\n\n") + 2)), w.key.name,
                                                 keys[i], 1700000000).value();
        const size_t b64 = line.rfind(' ') + 1;
        std::string raw = crypto::FromBase64(line.substr(b64, line.size() - b64 - 1)).value();
        raw[20] ^= 1;
        return WitnessReply{200, "text/plain", line.substr(0, b64) + crypto::Base64(raw) + "\n"};
      }
      if (bad_after[i]) {  // its cosignature, then a line by its key that does not verify
        tlog::WitnessAnswer a = witnesses[static_cast<size_t>(i)]->AddCheckpoint(body, 1700000000);
        if (a.status == 200) {
          std::string bad = a.body;
          const size_t b64 = bad.rfind(' ') + 1;
          std::string raw = crypto::FromBase64(bad.substr(b64, bad.size() - b64 - 1)).value();
          raw[30] ^= 1;
          a.body += bad.substr(0, b64) + crypto::Base64(raw) + "\n";
        }
        return WitnessReply{a.status, a.content_type, a.body};
      }
      if (extra_line[i]) {  // another algorithm's line first, then its cosignature: the latter counts
        tlog::WitnessAnswer a = witnesses[static_cast<size_t>(i)]->AddCheckpoint(body, 1700000000);
        if (a.status == 200) a.body = "\u2014 " + w.key.name + " AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA\n" + a.body;
        return WitnessReply{a.status, a.content_type, a.body};
      }
      tlog::WitnessAnswer a = witnesses[static_cast<size_t>(i)]->AddCheckpoint(body, 1700000000);
      return WitnessReply{a.status, a.content_type, a.body};
    };
  }
  std::vector<tlog::NoteKey> Keys() const {
    std::vector<tlog::NoteKey> out;
    for (const auto& w : policy.witnesses) out.push_back(w.key);
    return out;
  }
  std::vector<crypto::SigningKey> keys;
  std::vector<std::unique_ptr<MemoryWitnessState>> states;
  std::vector<std::unique_ptr<tlog::Witness>> witnesses;
  WitnessPolicy policy;
  bool down[3] = {false, false, false};
  bool forged[3] = {false, false, false};
  bool extra_line[3] = {false, false, false};
  bool bad_after[3] = {false, false, false};
  int requests[3] = {0, 0, 0};
};

TEST_F(TlogStoreTest, WitnessesCosignAQuorumAndNameEveryForkTheyHaveSeen) {
  auto t = CreateTenant(*journal_, "tlog-witness");
  ASSERT_TRUE(t.ok());
  const std::string id = t->tenant_id;
  const crypto::SigningKey& key = journal_->key();
  const std::string origin = "oml.test/" + id;
  const tlog::NoteKey log_key = tlog::MakeNoteKey(origin, key.public_key());
  Witnesses w(key);
  auto sign = [&](int n) {
    AppendMany(id, n);
    while (!ExtendTiles(*pool_, id).value().verified) {
    }
    return SignCheckpoint(*pool_, id, "oml.test", key).value();
  };
  auto state = [&] {
    auto c = pool_->Acquire();
    return ReadTlogState(**c, id).value();
  };
  const std::string first = sign(300);
  const uint64_t n1 = Memory(id).size();
  EXPECT_FALSE(state().witnessed);

  // Two of three cosign (w3 is down): a quorum; the note keeps its signature and gains theirs.
  w.down[2] = true;
  WitnessSizes sizes;
  auto r = CosignCheckpoint(*pool_, id, w.policy, &sizes);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->cosignatures, 2);
  EXPECT_TRUE(r->stored);
  EXPECT_EQ(r->problems, std::vector<std::string>{"w3: unreachable: down"});
  TlogState st = state();
  EXPECT_TRUE(st.witnessed);
  ASSERT_EQ(st.checkpoint.substr(0, first.size()), first);
  std::vector<tlog::NoteKey> all = w.Keys();
  all.push_back(log_key);
  auto opened = tlog::OpenNote(st.checkpoint, all);
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  EXPECT_EQ(opened->verified.size(), 3u);
  EXPECT_EQ(opened->cosigned_at.size(), 3u);
  // Witnessed: nothing is asked again (unless rechecked).
  EXPECT_EQ(CosignCheckpoint(*pool_, id, w.policy, &sizes)->cosignatures, 0);
  EXPECT_EQ(w.requests[0], 1);

  // Grown, and the publisher restarted (sizes forgotten): each witness's 409 says its size, and
  // the consistency proof from it (read from the tiles) is accepted.
  const std::string second = sign(20);
  EXPECT_FALSE(state().witnessed);
  w.down[2] = false;
  WitnessSizes fresh;
  r = CosignCheckpoint(*pool_, id, w.policy, &fresh);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->cosignatures, 3);
  EXPECT_EQ(w.requests[0], 3);  // 409 (size n1), then 200
  EXPECT_EQ(w.requests[2], 2);  // once while down; then first contact, old size 0: accepted at once
  const uint64_t n2 = Memory(id).size();
  EXPECT_EQ(w.states[0]->records[origin].size, n2);
  EXPECT_EQ((fresh[{"w1", id}]), n2);

  // Below the quorum: nothing stored, and every witness's problem said.
  sign(1);
  const uint64_t n3 = Memory(id).size();
  w.down[1] = w.down[2] = true;
  r = CosignCheckpoint(*pool_, id, w.policy, &fresh);
  EXPECT_EQ(r.status().type(), "witness-quorum");
  EXPECT_EQ(r.status().message(), "chain " + id + ": 1 of 3 witnesses cosigned the checkpoint at size " +
                                      std::to_string(n3) + " (quorum 2): w2: unreachable: down; w3: unreachable: down");
  EXPECT_FALSE(state().witnessed);
  // A cosignature that does not verify under the witness's key does not count.
  w.down[1] = false;
  w.forged[1] = true;
  r = CosignCheckpoint(*pool_, id, w.policy, &fresh);
  EXPECT_EQ(r.status().type(), "witness-quorum");
  EXPECT_NE(r.status().message().find("w2: its answer is not a cosignature that verifies: "), std::string::npos)
      << r.status().message();
  w.forged[1] = false;
  // An answer with a line of another key first: its cosignature line still counts.
  w.extra_line[0] = true;
  w.down[2] = false;
  // A checkpoint not yet witnessed is not published when witnesses are required.
  auto dir = std::filesystem::temp_directory_path() / ("tlog-" + crypto::NewUuidV4());
  auto store = blob::OpenObjectStore("file://" + dir.string());
  ASSERT_TRUE(store.ok());
  EXPECT_EQ(PublishTlogObjects(*pool_, **store, id, nullptr, /*require_witnessed=*/true).type(), "not-witnessed");
  EXPECT_FALSE((*store)->Get(TlogPrefix(id) + "checkpoint").value().has_value());
  auto cosigned = CosignCheckpoint(*pool_, id, w.policy, &fresh);
  ASSERT_TRUE(cosigned.ok()) << cosigned.status().ToString();
  EXPECT_EQ(cosigned->cosignatures, 3);
  w.extra_line[0] = false;
  ASSERT_TRUE(PublishTlogObjects(*pool_, **store, id, nullptr, true).ok());
  EXPECT_EQ((*store)->Get(TlogPrefix(id) + "checkpoint").value(), state().checkpoint);
  // A good cosignature followed by a bad line under the same key: that answer is refused.
  w.bad_after[1] = true;
  r = CosignCheckpoint(*pool_, id, w.policy, &fresh, /*recheck=*/true);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->cosignatures, 2);
  ASSERT_EQ(r->problems.size(), 1u);
  EXPECT_EQ(r->problems[0].rfind("w2: its answer is not a cosignature that verifies: ", 0), 0u) << r->problems[0];
  w.bad_after[1] = false;
  // The startup recheck with one witness down but a quorum: the chain is named as not checked by
  // every witness, and the down one is asked once in the round, not once per chain.
  {
    WitnessSizes rs;
    w.down[2] = true;
    const int asked = w.requests[2];
    auto round = RecheckWitnesses(*pool_, w.policy, &rs);
    ASSERT_TRUE(round.ok()) << round.status().ToString();
    EXPECT_EQ(w.requests[2], asked + 1);
    std::string why;
    for (const auto& [tenant, text] : round->unchecked)
      if (tenant == id) why = text;
    EXPECT_EQ(why, "w3: unreachable: down");
    for (const auto& [tenant, st] : round->forks) EXPECT_NE(tenant, id) << st.ToString();
    w.down[2] = false;
  }

  // A witness that lost its state (409 "0" below the size we knew): first contact again.
  w.states[2]->records.clear();
  EXPECT_TRUE(CosignCheckpoint(*pool_, id, w.policy, &fresh, /*recheck=*/true).ok());
  EXPECT_EQ(w.states[2]->records[origin].size, n3);
  // A new set of witnesses (w1 replaced by w4): the note carries one of its cosigners' lines
  // short of a quorum under it, so it is cosigned again, only by those not on it yet.
  {
    Witnesses other(key);
    WitnessPolicy changed = w.policy;
    changed.witnesses[0] = other.policy.witnesses[0];
    changed.witnesses[0].key = tlog::MakeNoteKey("w4", other.keys[0].public_key(), tlog::kAlgCosignatureV1);
    changed.witnesses[0].url = "http://w4";
    changed.quorum = 3;
    tlog::Witness w4({}, "w4", &other.keys[0], other.states[0].get(), {{"oml.test", {key.public_key()}}});
    changed.post = [&](const TlogWitness& x, const std::string& body) -> Result<WitnessReply> {
      if (x.key.name != "w4") return w.policy.post(x, body);
      tlog::WitnessAnswer a = w4.AddCheckpoint(body, 1700000000);
      return WitnessReply{a.status, a.content_type, a.body};
    };
    const int before = w.requests[1];
    WitnessSizes s4;
    auto again4 = CosignCheckpoint(*pool_, id, changed, &s4);
    ASSERT_TRUE(again4.ok()) << again4.status().ToString();
    EXPECT_TRUE(again4->stored);
    EXPECT_EQ(w.requests[1], before);  // w2 is on the note already: not asked
    std::vector<tlog::NoteKey> keys4 = {changed.witnesses[0].key, changed.witnesses[1].key, changed.witnesses[2].key};
    auto opened4 = tlog::OpenNote(state().checkpoint, keys4);
    ASSERT_TRUE(opened4.ok());
    EXPECT_EQ(opened4->verified.size(), 3u);
  }
  // What a witness has seen and the database has not: each a fork, named, nothing stored.
  const tlog::WitnessRecord kept = w.states[0]->records[origin];
  // (1) a larger tree: the database lost its tail.
  w.states[0]->records[origin] = {n3 + 50, merkle::HashLeaf("x"), "-"};
  WitnessSizes again;
  r = CosignCheckpoint(*pool_, id, w.policy, &again, /*recheck=*/true);
  EXPECT_EQ(r.status().type(), "tlog-fork");
  EXPECT_EQ(r.status().message(), "chain " + id + ": witness w1 has cosigned a tree of size " + std::to_string(n3 + 50) +
                                      " of this log, larger than the chain's " + std::to_string(n3) +
                                      " events (the database lost the chain's tail)");
  // Past the checkpoint but not past the chain (a checkpoint row older than the events, after a
  // failover): not a fork; the next checkpoint reaches the size and the witness decides then.
  w.states[0]->records[origin] = {n3 + 2, merkle::HashLeaf("x"), "-"};
  AppendMany(id, 2);
  r = CosignCheckpoint(*pool_, id, w.policy, &again, true);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->problems.empty());
  EXPECT_EQ(r->deferred, std::vector<std::string>{"w1: it has cosigned size " + std::to_string(n3 + 2) +
                                                  ", past this checkpoint (the next one reaches it)"});
  // (2) another tree of the same size.
  w.states[0]->records[origin] = {n3, merkle::HashLeaf("x"), "-"};
  r = CosignCheckpoint(*pool_, id, w.policy, &again, true);
  EXPECT_EQ(r.status().message(),
            "chain " + id + ": witness w1 has cosigned another tree of size " + std::to_string(n3) + " of this log");
  // (3) a smaller tree this one does not extend.
  w.states[0]->records[origin] = {5, merkle::HashLeaf("x"), "-"};
  WitnessSizes third;
  r = CosignCheckpoint(*pool_, id, w.policy, &third, true);
  EXPECT_EQ(r.status().type(), "tlog-fork");
  EXPECT_EQ(r.status().message().rfind("chain " + id + ": witness w1 refuses the consistency proof from the tree of size 5 "
                                       "it cosigned to " + std::to_string(n3) + ": ", 0), 0u)
      << r.status().message();
  // Restored: the recheck passes and stores nothing new (the note is witnessed already).
  w.states[0]->records[origin] = kept;
  const std::string witnessed = state().checkpoint;
  r = CosignCheckpoint(*pool_, id, w.policy, &third, true);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->cosignatures, 3);
  EXPECT_FALSE(r->stored);
  EXPECT_EQ(state().checkpoint, witnessed);
  // Two publishers (two replicas, each with its own learned sizes) cosign the same new
  // checkpoint at once: B runs whole while A is about to send its first request. Both gather a
  // quorum; only the first store appends lines, so the note carries each witness once.
  while (!ExtendTiles(*pool_, id).value().verified) {
  }
  const std::string newest = SignCheckpoint(*pool_, id, "oml.test", key).value();
  ASSERT_NE(newest, witnessed);
  WitnessSizes sizes_a, sizes_b;
  Result<CosignReport> b = Status(Code::kInternal, "B did not run");
  WitnessPolicy racing = w.policy;
  bool b_pending = true;
  racing.post = [&](const TlogWitness& x, const std::string& body) -> Result<WitnessReply> {
    if (b_pending) {
      b_pending = false;
      b = CosignCheckpoint(*pool_, id, w.policy, &sizes_b);
    }
    return w.policy.post(x, body);
  };
  auto a = CosignCheckpoint(*pool_, id, racing, &sizes_a);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_TRUE(b->stored);
  EXPECT_FALSE(a->stored);  // the stored note was no longer the one A read
  EXPECT_EQ(a->cosignatures, 3);
  const std::string both = state().checkpoint;
  EXPECT_TRUE(state().witnessed);
  EXPECT_EQ(both.substr(0, newest.size()), newest);
  for (const char* name : {"w1", "w2", "w3"}) {
    size_t count = 0;
    for (size_t at = both.find(std::string("\u2014 ") + name + " "); at != std::string::npos;
         at = both.find(std::string("\u2014 ") + name + " ", at + 1))
      ++count;
    EXPECT_EQ(count, 1u) << name;
  }
  (void)n1;
  (void)second;
  std::filesystem::remove_all(dir);
}

TEST(TlogWitnessSettingsTest, ParsedWithPreciseErrors) {
  auto k = crypto::SigningKey::Generate().value();
  const std::string vkey = tlog::EncodeVerifierKey(tlog::MakeNoteKey("w.example/1", k.public_key(), tlog::kAlgCosignatureV1));
  const std::string vkey2 = tlog::EncodeVerifierKey(tlog::MakeNoteKey("w.example/2", k.public_key(), tlog::kAlgCosignatureV1));
  auto w = ParseTlogWitnesses(" http://127.0.0.1:8473/ " + vkey + " ,http://w2:80/base " + vkey2 + ",");
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  ASSERT_EQ(w->size(), 2u);
  EXPECT_EQ((*w)[0].url, "http://127.0.0.1:8473");
  EXPECT_EQ((*w)[1].url, "http://w2:80/base");
  EXPECT_EQ((*w)[1].key.name, "w.example/2");
  EXPECT_TRUE(ParseTlogWitnesses("").value().empty());
  EXPECT_EQ(ParseTlogWitnesses("http://a " + vkey + ",http://b " + vkey).status().message(),
            "setting tlog_witnesses: entry 'http://b " + vkey + "': a witness named w.example/1 is configured twice");
  EXPECT_EQ(ParseTlogWitnesses("https://a " + vkey).status().message(),
            "setting tlog_witnesses: entry 'https://a " + vkey + "': the URL must be http://host[:port][/path]");
  EXPECT_EQ(ParseTlogWitnesses("http://a").status().message(),
            "setting tlog_witnesses: entry 'http://a': want \"<url> <verifier key>\"");
  const std::string ed = tlog::EncodeVerifierKey(tlog::MakeNoteKey("w.example/1", k.public_key()));
  EXPECT_EQ(ParseTlogWitnesses("http://a " + ed).status().message(),
            "setting tlog_witnesses: entry 'http://a " + ed + "': not a cosignature/v1 verifier key (type 0x04)");
  EXPECT_EQ(ParseTlogWitnesses("http://a w+1+2").status().type(), "invalid-setting");
  EXPECT_EQ(WitnessQuorum(0, 3).value(), 2);
  EXPECT_EQ(WitnessQuorum(0, 2).value(), 2);
  EXPECT_EQ(WitnessQuorum(0, 1).value(), 1);
  EXPECT_EQ(WitnessQuorum(1, 3).value(), 1);
  EXPECT_EQ(WitnessQuorum(0, 0).value(), 0);
  EXPECT_EQ(WitnessQuorum(3, 2).status().message(), "setting tlog_witness_quorum: 3 is more than the 2 witnesses configured");
}

TEST_F(JournalPgTest, QueuedWritesCommitAsOneGroup) {
  auto t = CreateTenant(*journal_, "group");
  ASSERT_TRUE(t.ok());
  const std::string tenant = t->tenant_id;
  // Hold the first transaction open (after its rows, before COMMIT) until 7 more appends queue.
  oml::testing::HoldFirst hold("journal.after_outbox_insert");
  std::vector<Result<Receipt>> results(8, Status(Code::kInternal, "unset"));
  std::vector<std::thread> threads;
  threads.emplace_back([&] { results[0] = journal_->Append(tenant, Note("first")); });
  hold.WaitUntilHeld();
  for (int i = 1; i < 8; ++i) threads.emplace_back([&, i] { results[i] = journal_->Append(tenant, Note("queued")); });
  oml::testing::WaitUntil([&] { return journal_->QueueDepth(tenant) >= 7; }, "7 appends queued");
  hold.Release();
  for (auto& th : threads) th.join();
  std::vector<int64_t> seqs;
  for (auto& r : results) {
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    seqs.push_back(r->seq);
  }
  std::sort(seqs.begin(), seqs.end());
  EXPECT_EQ(seqs, (std::vector<int64_t>{2, 3, 4, 5, 6, 7, 8, 9}));
  EXPECT_EQ(results[0]->seq, 2);
  // The 7 queued events shared one transaction: one xid in the outbox for seqs 3..9.
  auto c = db::Conn::Connect(db::testing::SuperuserUrl());
  auto r = c->Query("SELECT count(DISTINCT xid), count(*) FROM oml.outbox WHERE tenant_id = $1 AND journal_seq BETWEEN 3 AND 9",
                    {db::Text(tenant)});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->Get(0, 0), "1");
  EXPECT_EQ(r->Get(0, 1), "7");
  VerifyOptions vo;
  vo.only_tenant = tenant;
  auto rep = VerifyChains(*pool_, vo);
  ASSERT_TRUE(rep.ok());
  EXPECT_TRUE(rep->problems.empty());
  auto provider = c->Query("SELECT seq FROM oml.chain_heads WHERE tenant_id = $1", {db::Text(kProviderTenant)});
  ASSERT_TRUE(provider.ok());
  EXPECT_EQ(rep->events, 9 + provider->GetInt(0, 0));  // the tenant's 9 + the provider chain, always walked
}

// Two revokes of one key race: both find it live, the first commits, and the second (queued on
// the tenant's lock meanwhile) finds no live row in its guarded UPDATE. It fails as
// "api-key-revoked" and journals nothing: one api_key.revoked, no seq gap.
TEST_F(JournalPgTest, ConcurrentRevokesJournalOneRevocation) {
  auto t = CreateTenant(*journal_, "revokes");
  ASSERT_TRUE(t.ok());
  const std::string tenant = t->tenant_id;
  auto key = CreateApiKey(*journal_, tenant, "carol", "writer");
  ASSERT_TRUE(key.ok()) << key.status().ToString();
  EXPECT_EQ(key->receipt.seq, 2);
  EXPECT_EQ(key->key_id, ApiKeyId(crypto::Sha256(key->token)));

  oml::testing::HoldFirst hold("journal.after_outbox_insert");  // the first revoke, before COMMIT
  Result<Receipt> first = Status(Code::kInternal, "unset"), second = Status(Code::kInternal, "unset");
  std::thread a([&] { first = RevokeApiKey(*journal_, tenant, key->key_id, "a"); });
  hold.WaitUntilHeld();
  std::thread b([&] { second = RevokeApiKey(*journal_, tenant, key->key_id, "b"); });  // still sees it live
  oml::testing::WaitUntil([&] { return journal_->QueueDepth(tenant) >= 1; }, "second revoke queued");
  hold.Release();
  a.join();
  b.join();
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_EQ(first->seq, 3);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), Code::kFailedPrecondition);
  EXPECT_EQ(second.status().type(), "api-key-revoked");

  auto keys = ListApiKeys(*pool_, tenant);
  ASSERT_TRUE(keys.ok());
  ASSERT_EQ(keys->size(), 1u);
  EXPECT_EQ((*keys)[0].created_seq, 2);
  EXPECT_EQ((*keys)[0].revoked_seq, 3);
  EXPECT_FALSE((*keys)[0].revoked_at.empty());
  auto su = db::Conn::Connect(db::testing::SuperuserUrl());
  auto n = su->Query("SELECT count(*), max(seq) FROM oml.journal WHERE tenant_id = $1", {db::Text(tenant)});
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(n->Get(0, 0), "3");  // genesis, api_key.created, one api_key.revoked
  EXPECT_EQ(n->Get(0, 1), "3");
  // Refusals after the fact: revoked already (naming its seq), unknown, malformed.
  auto again = RevokeApiKey(*journal_, tenant, key->key_id, "c");
  EXPECT_EQ(again.status().type(), "api-key-revoked");
  EXPECT_NE(again.status().message().find("(seq 3)"), std::string::npos) << again.status().message();
  EXPECT_EQ(RevokeApiKey(*journal_, tenant, "ak_0000000000000000", "").status().code(), Code::kNotFound);
  EXPECT_EQ(RevokeApiKey(*journal_, tenant, "ak_XYZ", "").status().code(), Code::kInvalidArgument);
  EXPECT_EQ(CreateApiKey(*journal_, tenant, "carol", "owner").status().code(), Code::kInvalidArgument);
}

// Verification reads a chain page by page while the rows of the page before are checked on
// the pool. Small pages put page boundaries at known seqs: 49 events are exactly 7 pages of 7.
TEST_F(JournalPgTest, VerifyAcrossPagesFindsTheFirstBadSeqAtAndAroundPageBoundaries) {
  auto tenant = CreateTenant(*journal_, "paged");
  ASSERT_TRUE(tenant.ok()) << tenant.status().ToString();
  for (int i = 2; i <= 49; ++i) ASSERT_TRUE(journal_->Append(tenant->tenant_id, Note("n" + std::to_string(i))).ok());
  VerifyOptions vo;
  vo.only_tenant = tenant->tenant_id;
  vo.page_rows = 7;
  vo.threads = 2;
  auto verify = [&]() -> std::vector<VerifyProblem> {
    auto rep = VerifyChains(*pool_, vo);
    EXPECT_TRUE(rep.ok()) << rep.status().ToString();
    return rep.ok() ? rep->problems : std::vector<VerifyProblem>{};
  };
  auto ok = VerifyChains(*pool_, vo);
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_TRUE(ok->problems.empty());
  auto provider_events = ok->events - 49;
  vo.page_rows = 1;  // one row per fetch, the provider chain's too
  auto tiny = VerifyChains(*pool_, vo);
  ASSERT_TRUE(tiny.ok()) << tiny.status().ToString();
  EXPECT_TRUE(tiny->problems.empty());
  EXPECT_EQ(tiny->events, ok->events);
  vo.page_rows = 7;

  // As the superuser with the guard trigger off: remove a row, or flip a byte, then put it back.
  auto su = db::Conn::Connect(db::testing::SuperuserUrl());
  ASSERT_TRUE(su.ok());
  const std::string id = tenant->tenant_id;
  auto exec = [&](const std::string& sql) {
    auto q = su->Exec("ALTER TABLE oml.journal DISABLE TRIGGER USER; " + sql + "; ALTER TABLE oml.journal ENABLE TRIGGER USER");
    ASSERT_TRUE(q.ok()) << q.status().ToString();
  };
  ASSERT_TRUE(su->Exec("CREATE TABLE saved AS SELECT * FROM oml.journal WHERE tenant_id = '" + id + "'").ok());
  for (int64_t seq : {7, 8, 15, 49}) {  // last of page 1, first of page 2, first of page 3, the head
    ASSERT_NO_FATAL_FAILURE(exec("DELETE FROM oml.journal WHERE tenant_id = '" + id + "' AND seq = " + std::to_string(seq)));
    auto p = verify();
    ASSERT_EQ(p.size(), 1u) << "deleted seq " << seq;
    EXPECT_EQ(p[0].seq, seq);
    EXPECT_NE(p[0].what.find("is missing"), std::string::npos) << p[0].what;
    ASSERT_NO_FATAL_FAILURE(exec("INSERT INTO oml.journal SELECT * FROM saved WHERE seq = " + std::to_string(seq)));
  }
  for (int64_t seq : {14, 22, 36}) {
    ASSERT_NO_FATAL_FAILURE(exec("UPDATE oml.journal SET signed_bytes = overlay(signed_bytes placing '\\x20'::bytea from 40 for 1) "
                                 "WHERE tenant_id = '" + id + "' AND seq = " + std::to_string(seq)));
    auto p = verify();
    ASSERT_EQ(p.size(), 1u) << "flipped seq " << seq;
    EXPECT_EQ(p[0].seq, seq);
    EXPECT_EQ(p[0].what, "event_hash is not SHA-256 of the signed bytes");
    ASSERT_NO_FATAL_FAILURE(exec("UPDATE oml.journal j SET signed_bytes = s.signed_bytes FROM saved s "
                                 "WHERE j.tenant_id = s.tenant_id AND j.seq = s.seq AND j.seq = " + std::to_string(seq)));
  }
  ASSERT_TRUE(su->Exec("DROP TABLE saved").ok());
  auto again = VerifyChains(*pool_, vo);
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(again->problems.empty());
  EXPECT_EQ(again->events, 49 + provider_events);
}

}  // namespace
}  // namespace oml::journal

namespace oml::journal {
namespace {

// Makes every COMMIT of the test cluster wait for synchronous standbys that do not exist
// (synchronous_standby_names = `names`, reloaded) for as long as it lives; resets on destruction.
class AbsentSyncStandbys {
 public:
  AbsentSyncStandbys(db::Conn* su, const std::string& names) : su_(su) {
    ok_ = su_->Exec("ALTER SYSTEM SET synchronous_standby_names = '" + names + "'").ok() &&
          su_->Exec("SELECT pg_reload_conf()").ok();
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // every backend has reloaded
  }
  ~AbsentSyncStandbys() {
    (void)su_->Exec("ALTER SYSTEM RESET synchronous_standby_names");
    (void)su_->Exec("SELECT pg_reload_conf()");
  }
  AbsentSyncStandbys(const AbsentSyncStandbys&) = delete;
  AbsentSyncStandbys& operator=(const AbsentSyncStandbys&) = delete;
  bool ok() const { return ok_; }

 private:
  db::Conn* su_;
  bool ok_ = false;
};

// A COMMIT whose wait for synchronous replication is cancelled succeeds locally with only a
// WARNING. That write is not acknowledged: no receipt.
TEST_F(JournalPgTest, CommitNotConfirmedByStandbysIsNotAcknowledged) {
  auto t = CreateTenant(*journal_, "syncrep");
  ASSERT_TRUE(t.ok());
  auto su = db::Conn::Connect(db::testing::SuperuserUrl());
  ASSERT_TRUE(su.ok());
  Result<Receipt> r = Status(Code::kInternal, "unset");
  {
    AbsentSyncStandbys absent(&*su, "no_such_standby");
    ASSERT_TRUE(absent.ok());
    std::thread writer([&] { r = journal_->Append(t->tenant_id, Note("unreplicated")); });
    // Wait until the writer's COMMIT waits for the (absent) standby, then cancel that wait.
    for (int i = 0; i < 500; ++i) {
      auto w = su->Query("SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE wait_event = 'SyncRep'");
      ASSERT_TRUE(w.ok());
      if (w->size() > 0) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    writer.join();
  }
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kUnavailable);
  EXPECT_EQ(r.status().type(), "commit-not-replicated");
}

// With a commit wait bound (`oml serve`'s commit_replication_timeout_ms), nobody has to cancel
// the wait: the watchdog does after the bound, for a pipelined COMMIT (the journal's append) and
// for one sent alone (Exec), and the write is refused as not replicated, never acknowledged.
TEST_F(JournalPgTest, CommitWaitBoundCancelsTheWaitForAbsentStandbys) {
  auto t = CreateTenant(*journal_, "syncrep-bound");
  ASSERT_TRUE(t.ok());
  auto su = db::Conn::Connect(db::testing::SuperuserUrl());
  ASSERT_TRUE(su.ok());
  auto c = db::Conn::Connect(db::testing::SuperuserUrl());
  ASSERT_TRUE(c.ok());
  Result<Receipt> r = Status(Code::kInternal, "unset");
  Result<db::Rows> commit = Status(Code::kInternal, "unset");
  std::chrono::steady_clock::duration took{};
  {
    AbsentSyncStandbys absent(&*su, "ANY 1 (no_such_standby)");
    ASSERT_TRUE(absent.ok());
    db::SetCommitWaitBound(std::chrono::milliseconds(400));
    const auto t0 = std::chrono::steady_clock::now();
    r = journal_->Append(t->tenant_id, Note("bounded"));
    took = std::chrono::steady_clock::now() - t0;
    // Exec("COMMIT") on a connection of its own.
    ASSERT_TRUE(c->Exec("BEGIN").ok());
    ASSERT_TRUE(c->Exec("CREATE TEMP TABLE bound_probe (x int)").ok());
    commit = c->Exec("COMMIT");
    db::SetCommitWaitBound(std::chrono::milliseconds(0));
  }
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kUnavailable);
  EXPECT_EQ(r.status().type(), "commit-not-replicated");
  EXPECT_GE(took, std::chrono::milliseconds(400));
  EXPECT_LT(took, std::chrono::milliseconds(5000));
  ASSERT_TRUE(commit.ok()) << commit.status().ToString();
  Status verdict = c->CommitVerdict(*commit);
  EXPECT_EQ(verdict.type(), "commit-not-replicated") << verdict.ToString();
}

}  // namespace
}  // namespace oml::journal

namespace oml::journal {
namespace {

// The cluster's default lc_messages set to a non-English language for the lifetime of the
// object (ALTER SYSTEM + reload), so server messages are translated unless a session overrides
// them. `skip` says why that is impossible here (no OS locale, no PostgreSQL translation).
class TranslatedServer {
 public:
  TranslatedServer() {
    auto su = db::Conn::Connect(db::testing::SuperuserUrl());
    if (!su.ok()) {
      skip = su.status().ToString();
      return;
    }
    for (const char* candidate : {"de_DE.UTF-8", "de_DE.utf8", "fr_FR.UTF-8", "es_ES.UTF-8", "it_IT.UTF-8"}) {
      if (!su->Exec(std::string("ALTER SYSTEM SET lc_messages = '") + candidate + "'").ok()) continue;  // no OS locale
      Reload(*su);
      const std::string m = RawError("SELECT 1/0");
      if (m.find("division by zero") == std::string::npos && !m.empty()) {
        locale = candidate;
        translated_division_by_zero = m;
        return;
      }
    }
    (void)su->Exec("ALTER SYSTEM RESET lc_messages");
    Reload(*su);
    skip = "no non-English locale with PostgreSQL translations is usable on this machine (`locale -a` must list one "
           "of de_DE/fr_FR/es_ES/it_IT UTF-8: run scripts/install-deps.sh, which generates de_DE.UTF-8)";
  }
  ~TranslatedServer() {
    if (locale.empty()) return;
    auto su = db::Conn::Connect(db::testing::SuperuserUrl());
    if (su.ok() && su->Exec("ALTER SYSTEM RESET lc_messages").ok()) Reload(*su);
  }

  // A libpq connection of the superuser opened without oml's db::Conn (no SET, and no role
  // default: only oml_app has one): it speaks the cluster's default language.
  static std::string RawError(const std::string& sql) {
    PGconn* c = PQconnectdb(db::testing::SuperuserUrl().c_str());
    PGresult* r = PQexec(c, sql.c_str());
    const char* m = PQresultErrorField(r, PG_DIAG_MESSAGE_PRIMARY);
    std::string out = m ? m : "";
    PQclear(r);
    PQfinish(c);
    return out;
  }
  static std::string RawShow(const std::string& url) {
    PGconn* c = PQconnectdb(url.c_str());
    PGresult* r = PQexec(c, "SHOW lc_messages");
    std::string out = PQresultStatus(r) == PGRES_TUPLES_OK ? PQgetvalue(r, 0, 0) : "";
    PQclear(r);
    PQfinish(c);
    return out;
  }

  std::string skip;
  std::string locale;
  std::string translated_division_by_zero;

 private:
  static void Reload(db::Conn& su) {
    (void)su.Exec("SELECT pg_reload_conf()");
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
  }
};

#define SKIP_UNLESS_TRANSLATED(ts)                                                      \
  if (!(ts).skip.empty()) {                                                             \
    std::fprintf(stderr, "\n*** SKIPPED: translated server messages: %s ***\n\n", (ts).skip.c_str()); \
    GTEST_SKIP() << (ts).skip;                                                          \
  }

// Appends one event while its COMMIT waits for a standby that does not exist, and cancels that
// wait: the commit is then local only, and PostgreSQL says so with a WARNING.
Result<Receipt> AppendWithCancelledSyncRepWait(Journal& j, const std::string& tenant) {
  auto su = db::Conn::Connect(db::testing::SuperuserUrl());
  if (!su.ok()) return su.status();
  AbsentSyncStandbys absent(&*su, "no_such_standby");
  if (!absent.ok()) return Internal("cannot configure synchronous replication");
  Result<Receipt> r = Status(Code::kInternal, "unset");
  std::thread writer([&] {
    r = j.Append(tenant,
                 EventSpec{"test.note", "tester", {{"text", "unreplicated"}}, nlohmann::json::object(), nullptr});
  });
  bool cancelled = false;
  for (int i = 0; i < 500 && !cancelled; ++i) {
    auto w = su->Query("SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE wait_event = 'SyncRep'");
    cancelled = w.ok() && w->size() > 0;
    if (!cancelled) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  writer.join();
  if (!cancelled) return Internal("the commit never waited for synchronous replication");
  return r;
}

// Issue 6 section 5: the same cancelled wait as CommitNotConfirmedByStandbysIsNotAcknowledged,
// with the server's messages in another language.
TEST_F(JournalPgTest, TranslatedServerCommitNotConfirmedByStandbysIsNotAcknowledged) {
  TranslatedServer ts;
  SKIP_UNLESS_TRANSLATED(ts);
  auto t = CreateTenant(*journal_, "syncrep-translated");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  auto r = AppendWithCancelledSyncRepWait(*journal_, t->tenant_id);
  ASSERT_FALSE(r.ok()) << "acknowledged a commit the standbys never confirmed (server language " << ts.locale << ")";
  EXPECT_EQ(r.status().code(), Code::kUnavailable);
  EXPECT_EQ(r.status().type(), "commit-not-replicated");
}

// The structural rule alone, on the real cancelled wait: the journal's only connection is
// switched to the translated language on purpose (oml_app may SET lc_messages), so the WARNING
// really arrives translated, and it is still recognised.
TEST_F(JournalPgTest, TranslatedWarningOnOmlsOwnConnectionStillRefusesTheAcknowledgement) {
  TranslatedServer ts;
  SKIP_UNLESS_TRANSLATED(ts);
  db::Pool one(db::testing::AppUrl(), 1);
  Journal j(&one, &journal_->key());
  auto t = CreateTenant(j, "syncrep-translated-conn");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  {
    auto h = one.Acquire();
    ASSERT_TRUE(h.ok());
    ASSERT_TRUE((*h)->Exec("SET lc_messages = '" + ts.locale + "'").ok());
    auto m = (*h)->Exec("SELECT 1/0");
    ASSERT_FALSE(m.ok());
    ASSERT_EQ(m.status().log_detail().find("division by zero"), std::string::npos) << m.status().log_detail();
  }
  auto r = AppendWithCancelledSyncRepWait(j, t->tenant_id);
  ASSERT_FALSE(r.ok()) << "acknowledged a commit the standbys never confirmed (connection language " << ts.locale
                       << ")";
  EXPECT_EQ(r.status().code(), Code::kUnavailable);
  EXPECT_EQ(r.status().type(), "commit-not-replicated");
}

// Every connection oml opens speaks 'C', whatever the cluster's default.
TEST_F(JournalPgTest, TranslatedServerOmlConnectionsRunWithLcMessagesC) {
  TranslatedServer ts;
  SKIP_UNLESS_TRANSLATED(ts);
  // The cluster default really is translated: a connection oml did not open says so.
  EXPECT_EQ(TranslatedServer::RawShow(db::testing::SuperuserUrl()), ts.locale)
      << "the default speaks: " << ts.translated_division_by_zero;
  for (const std::string& url : {db::testing::AppUrl(), db::testing::SuperuserUrl()}) {
    auto c = db::Conn::Connect(url);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    auto show = c->Query("SHOW lc_messages");
    ASSERT_TRUE(show.ok());
    EXPECT_EQ(show->Get(0, 0), "C") << url;
    auto err = c->Exec("SELECT 1/0");
    EXPECT_EQ(err.status().log_detail(), "[22012] ERROR:  division by zero") << url;
  }
  // A pooled connection opened before the default changed (a reload must not translate it).
  auto h = pool_->Acquire();
  ASSERT_TRUE(h.ok());
  auto show = (*h)->Query("SHOW lc_messages");
  ASSERT_TRUE(show.ok());
  EXPECT_EQ(show->Get(0, 0), "C");
  // oml_app's role default, for clients that are not oml (`oml migrate` sets it).
  EXPECT_EQ(TranslatedServer::RawShow(db::testing::AppUrl()), "C");
}

}  // namespace
}  // namespace oml::journal
