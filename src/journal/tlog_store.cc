#include "journal/tlog_store.h"

#include <algorithm>
#include <memory>
#include <set>
#include <vector>

#include "common/log.h"
#include "common/sync_point.h"
#include "journal/merkle_edge.h"
#include "journal/provider.h"
#include "tlog/checkpoint.h"
#include "tlog/note.h"

namespace oml::journal {
namespace {

using merkle::kHashSize;

// The root of the perfect tree over `count` (a power of two) hashes at hashes[first...].
std::string PerfectRoot(std::string_view hashes, uint64_t first, uint64_t count) {
  std::vector<std::string> level;
  level.reserve(count);
  for (uint64_t i = 0; i < count; ++i) level.emplace_back(hashes.substr((first + i) * kHashSize, kHashSize));
  while (level.size() > 1) {
    std::vector<std::string> up;
    up.reserve(level.size() / 2);
    for (size_t i = 0; i + 1 < level.size(); i += 2) up.push_back(merkle::HashChildren(level[i], level[i + 1]));
    level = std::move(up);
  }
  return level.front();
}

Status Fork(const std::string& tenant, const std::string& what) {
  return Status(Code::kDataLoss, "chain " + tenant + ": " + what, "tlog-fork");
}

// Tiles being extended: the partial tile of each level as stored, and what is appended.
class TileBuilder {
 public:
  explicit TileBuilder(uint64_t size) {
    for (int k = 0; k < 8; ++k) count_[k] = size >> (kTileHeight * k);
  }
  // The tiles that must be loaded before appending: the partial tile of each level.
  std::vector<std::pair<int, uint64_t>> Partials() const {
    std::vector<std::pair<int, uint64_t>> out;
    for (int k = 0; k < 8; ++k)
      if (count_[k] % kTileWidth != 0) out.push_back({k, count_[k] / kTileWidth});
    return out;
  }
  void Load(int level, uint64_t idx, std::string hashes) { tiles_[{level, idx}] = std::move(hashes); }
  bool Loaded(int level, uint64_t idx) const { return tiles_.count({level, idx}) != 0; }
  const std::string* Find(int level, uint64_t idx) const {
    auto it = tiles_.find({level, idx});
    return it == tiles_.end() ? nullptr : &it->second;
  }
  void Add(int level, std::string hash) {
    const uint64_t idx = count_[level] / kTileWidth;
    std::string& tile = tiles_[{level, idx}];
    tile += hash;
    touched_[{level, idx}] = true;
    ++count_[level];
    if (count_[level] % kTileWidth == 0 && level + 1 < 8) Add(level + 1, PerfectRoot(tile, 0, kTileWidth));
  }
  const std::map<std::pair<int, uint64_t>, bool>& touched() const { return touched_; }
  uint64_t count(int level) const { return count_[level]; }

 private:
  uint64_t count_[8];
  std::map<std::pair<int, uint64_t>, std::string> tiles_;
  std::map<std::pair<int, uint64_t>, bool> touched_;
};

// Nodes from the tiles a TileBuilder holds (the partial tile of each level, loaded or built):
// enough for the root at the builder's size, which is folded from exactly those.
class BuilderNodes : public merkle::NodeReader {
 public:
  explicit BuilderNodes(const TileBuilder& b) : b_(b) {}
  Result<std::string> Node(int level, uint64_t index) override {
    const int k = level / kTileHeight, s = level % kTileHeight;
    const uint64_t first = index << s, count = uint64_t{1} << s;
    const std::string* tile = b_.Find(k, first / kTileWidth);
    if (tile == nullptr || (first % kTileWidth + count) * kHashSize > tile->size())
      return NotFound("node " + std::to_string(level) + "/" + std::to_string(index) + " is not held", "no-node");
    return PerfectRoot(*tile, first % kTileWidth, count);
  }

 private:
  const TileBuilder& b_;
};

// A transaction on the state row's chain: READ COMMITTED with lock_timeout 5 s (a replica
// holding the row, its checkpoint put to a slow object store, makes this chain fail for this
// round, not the whole round wait), rolled back on every early return unless committed, and
// committed only with the synchronous standbys' acknowledgement (Conn::CommitVerdict).
// `derived_only`: the transaction writes only what is rebuilt from the journal if lost (tiles,
// tiled/verified/published sizes), so its COMMIT does not wait for the WAL flush or the standbys
// (synchronous_commit off): a publisher with many chains to do must not queue behind the commit
// point's fsyncs. A checkpoint's own COMMIT waits (and flushes the WAL before it, these too).
class TlogTxn {
 public:
  static Result<std::unique_ptr<TlogTxn>> Begin(db::Conn& c, bool derived_only = false) {
    OML_RETURN_IF_ERROR(c.Exec(derived_only ? "BEGIN ISOLATION LEVEL READ COMMITTED; SET LOCAL lock_timeout = '5s'; "
                                              "SET LOCAL synchronous_commit = off"
                                            : "BEGIN ISOLATION LEVEL READ COMMITTED; SET LOCAL lock_timeout = '5s'")
                            .status());
    return std::unique_ptr<TlogTxn>(new TlogTxn(c));
  }
  ~TlogTxn() {
    if (!done_) (void)c_.Exec("ROLLBACK");
  }
  Status Commit() {
    OML_ASSIGN_OR_RETURN(db::Rows commit, c_.Exec("COMMIT"));
    done_ = true;
    return c_.CommitVerdict(commit);
  }

 private:
  explicit TlogTxn(db::Conn& c) : c_(c) {}
  db::Conn& c_;
  bool done_ = false;
};

}  // namespace

Result<const std::string*> TileReader::Tile(int level, uint64_t idx) {
  auto it = cache_.find({level, idx});
  if (it != cache_.end()) return &it->second;
  db::Stmt q{"SELECT hashes FROM oml.merkle_tiles WHERE tenant_id = $1 AND level = $2 AND idx = $3",
             {db::Text(tenant_), db::Int(level), db::Int(static_cast<int64_t>(idx))}, "oml_tile_read",
             /*binary_result=*/true};
  OML_ASSIGN_OR_RETURN(db::Rows r, in_transaction_ ? conn_->Query(q.sql, q.params) : conn_->Scoped(tenant_, q));
  ++tiles_read_;
  std::string hashes = r.size() == 1 ? r.GetBytes(0, 0) : std::string();
  if (hashes.size() % kHashSize != 0)
    return Status(Code::kDataLoss, "chain " + tenant_ + ": tile " + std::to_string(level) + "/" + std::to_string(idx) +
                                       " is malformed", "integrity");
  return &cache_.emplace(std::pair{level, idx}, std::move(hashes)).first->second;
}

Status TileReader::Prefetch(uint64_t index, uint64_t size, std::optional<uint64_t> older) {
  std::vector<std::string> levels, idxs;
  auto want = [&](int level, uint64_t entry) {
    const uint64_t idx = entry / kTileWidth;
    if (cache_.count({level, idx})) return;
    for (size_t i = 0; i < levels.size(); ++i)
      if (levels[i] == std::to_string(level) && idxs[i] == std::to_string(idx)) return;
    levels.push_back(std::to_string(level));
    idxs.push_back(std::to_string(idx));
  };
  for (int k = 0; k < 8; ++k) {
    const uint64_t count = size >> (kTileHeight * k);
    if (count == 0) break;
    want(k, std::min(index >> (kTileHeight * k), count - 1));
    want(k, count - 1);
    if (older && (*older >> (kTileHeight * k)) > 0) want(k, (*older >> (kTileHeight * k)) - 1);
  }
  if (levels.empty()) return Status::Ok();
  db::Stmt q{"SELECT t.level, t.idx, t.hashes FROM unnest($2::int[], $3::bigint[]) AS w(level, idx) JOIN oml.merkle_tiles t "
             "ON t.tenant_id = $1 AND t.level = w.level AND t.idx = w.idx",
             {db::Text(tenant_), db::TextArray(levels), db::TextArray(idxs)}, "oml_tile_prefetch", /*binary_result=*/true};
  OML_ASSIGN_OR_RETURN(db::Rows r, in_transaction_ ? conn_->Query(q.sql, q.params) : conn_->Scoped(tenant_, q));
  for (int i = 0; i < r.size(); ++i) {
    std::string hashes = r.GetBytes(i, 2);
    if (hashes.size() % kHashSize != 0)
      return Status(Code::kDataLoss, "chain " + tenant_ + ": a tile is malformed", "integrity");
    cache_.emplace(std::pair{static_cast<int>(r.GetInt(i, 0)), static_cast<uint64_t>(r.GetInt(i, 1))}, std::move(hashes));
  }
  ++tiles_read_;
  return Status::Ok();
}

Result<std::string> TileReader::Node(int level, uint64_t index) {
  const int k = level / kTileHeight, s = level % kTileHeight;
  const uint64_t first = index << s, count = uint64_t{1} << s;
  OML_ASSIGN_OR_RETURN(const std::string* tile, Tile(k, first / kTileWidth));
  const uint64_t offset = first % kTileWidth;
  if ((offset + count) * kHashSize > tile->size())
    return NotFound("node " + std::to_string(level) + "/" + std::to_string(index) + " is not in the tiles", "no-node");
  return PerfectRoot(*tile, offset, count);
}

Result<TlogState> ReadTlogState(db::Conn& conn, const std::string& tenant) {
  OML_ASSIGN_OR_RETURN(db::Rows r, conn.Scoped(tenant, {"SELECT tiled_size, checkpoint_size, checkpoint, verified_size, "
                                                        "published_size, witnessed FROM oml.tlog_state WHERE tenant_id = $1",
                                                        {db::Text(tenant)}}));
  TlogState s;
  if (r.size() == 1) {
    s.tiled_size = r.GetInt(0, 0);
    if (!r.IsNull(0, 1)) {
      s.checkpoint_size = r.GetInt(0, 1);
      s.checkpoint = r.Get(0, 2);
    }
    s.verified_size = r.GetInt(0, 3);
    s.published_size = r.GetInt(0, 4);
    s.witnessed = r.Get(0, 5) == "t";
  }
  return s;
}

Result<ExtendReport> ExtendTiles(db::Pool& pool, const std::string& tenant, int64_t max_leaves) {
  OML_ASSIGN_OR_RETURN(auto conn, pool.Acquire());
  db::Conn& c = *conn;
  OML_ASSIGN_OR_RETURN(auto txn, TlogTxn::Begin(c, /*derived_only=*/true));
  // The state row, created if missing and locked: extenders of one chain take turns. The head
  // and the commit point's edge are read in the same statement (one snapshot): the tiles are
  // extended up to the edge's size, and their root there must be the edge's.
  OML_ASSIGN_OR_RETURN(std::vector<db::Rows> st,
                       c.Pipeline({db::ScopeTo(tenant),
                                   {"INSERT INTO oml.tlog_state (tenant_id, tiled_size) SELECT $1, 0 WHERE EXISTS "
                                    "(SELECT 1 FROM oml.chain_heads WHERE tenant_id = $1) ON CONFLICT (tenant_id) DO NOTHING",
                                    {db::Text(tenant)}},
                                   {"SELECT s.tiled_size, h.seq, h.tree_size, h.tree_edge, s.verified_size FROM "
                                    "oml.tlog_state s JOIN "
                                    "oml.chain_heads h USING (tenant_id) WHERE s.tenant_id = $1 FOR UPDATE OF s",
                                    {db::Text(tenant)}}}));
  if (st[2].size() != 1) return NotFound("chain " + tenant + " has no head", "unknown-chain");
  const int64_t from = st[2].GetInt(0, 0), head = st[2].GetInt(0, 1);
  ExtendReport report{from, from, 0};
  if (head < from) return Fork(tenant, "the tiles cover " + std::to_string(from) + " events, the chain holds " +
                                          std::to_string(head) + " (restored behind its published tree)");
  // No edge yet (a chain from before 0029, until BuildMissingTrees): nothing to check against.
  if (st[2].IsNull(0, 2)) return report;
  const int64_t edge_size = st[2].GetInt(0, 2);
  auto edge = merkle::CompactRange::Decode(static_cast<uint64_t>(edge_size), st[2].GetBytes(0, 3));
  if (!edge.ok()) return Status(Code::kDataLoss, "chain " + tenant + ": the stored Merkle edge is malformed", "integrity");
  if (edge_size < from) return Fork(tenant, "the tiles cover " + std::to_string(from) + " events, the commit point's tree " +
                                               std::to_string(edge_size) + " (restored behind its published tree)");
  const int64_t to = edge_size - from > std::max<int64_t>(1, max_leaves) ? from + std::max<int64_t>(1, max_leaves) : edge_size;
  TileBuilder b(static_cast<uint64_t>(from));
  // The partial tiles, and the level-0 tile holding leaf `from` - 1 (checked against the journal).
  std::vector<std::pair<int, uint64_t>> want = b.Partials();
  if (from > 0 && (from % static_cast<int64_t>(kTileWidth)) == 0) want.push_back({0, static_cast<uint64_t>(from - 1) / kTileWidth});
  for (const auto& [level, idx] : want) {
    OML_ASSIGN_OR_RETURN(db::Rows t, c.Query("SELECT hashes FROM oml.merkle_tiles WHERE tenant_id = $1 AND level = $2 "
                                             "AND idx = $3",
                                             {db::Text(tenant), db::Int(level), db::Int(static_cast<int64_t>(idx))}));
    if (t.size() != 1) return Fork(tenant, "tile " + std::to_string(level) + "/" + std::to_string(idx) + " is missing");
    std::string hashes = t.GetBytes(0, 0);
    const uint64_t want_width = b.count(level) % kTileWidth == 0 ? kTileWidth : b.count(level) % kTileWidth;
    if (hashes.size() != want_width * kHashSize)
      return Fork(tenant, "tile " + std::to_string(level) + "/" + std::to_string(idx) + " holds " +
                              std::to_string(hashes.size() / kHashSize) + " hashes, not the " + std::to_string(want_width) +
                              " its size implies");
    b.Load(level, idx, std::move(hashes));
  }
  // The last tiled leaf must still be the journal's event there.
  const int64_t check_from = from > 0 ? from - 1 : 0;
  int64_t next = check_from;
  constexpr int64_t kBatch = 2000;
  while (next < to) {
    OML_ASSIGN_OR_RETURN(db::Rows r, c.Query("SELECT seq, signed_bytes FROM oml.journal WHERE tenant_id = $1 AND seq > $2 "
                                             "AND seq <= $3 ORDER BY seq LIMIT $4",
                                             {db::Text(tenant), db::Int(next), db::Int(to), db::Int(kBatch)}));
    if (r.size() == 0) return Status(Code::kDataLoss, "chain " + tenant + " has no event at seq " + std::to_string(next + 1), "integrity");
    for (int i = 0; i < r.size(); ++i) {
      const int64_t seq = r.GetInt(i, 0);
      if (seq != next + 1)
        return Status(Code::kDataLoss, "chain " + tenant + " has no event at seq " + std::to_string(next + 1), "integrity");
      std::string leaf = merkle::HashLeaf(r.GetBytes(i, 1));
      if (seq <= from) {  // the check of the last tiled leaf
        const uint64_t li = static_cast<uint64_t>(seq - 1);
        const std::string* tile = b.Find(0, li / kTileWidth);
        if (tile == nullptr || tile->size() < (li % kTileWidth + 1) * kHashSize ||
            tile->compare((li % kTileWidth) * kHashSize, kHashSize, leaf) != 0)
          return Fork(tenant, "the event at seq " + std::to_string(seq) + " is not the leaf the tiles hold there");
      } else {
        b.Add(0, std::move(leaf));
      }
      next = seq;
    }
  }
  // The root at the edge's size must be the commit point's: it covers every leaf and every
  // entry above (a partial tile changed since, a journal that differs), so only a verified size
  // is ever signed (SignCheckpoint).
  const bool verified = to == edge_size;
  // Nothing new, and the size already verified: no write (a quiet chain costs no transaction).
  if (to == from && (!verified || st[2].GetInt(0, 4) == to)) {
    report.verified = verified;
    return report;
  }
  if (verified) {
    BuilderNodes nodes(b);
    OML_ASSIGN_OR_RETURN(std::string root, merkle::RootAt(nodes, static_cast<uint64_t>(to)));
    if (root != edge->Root())
      return Fork(tenant, "the tree at size " + std::to_string(to) +
                              " folded from the tiles and the journal is not the commit point's (its root differs)");
  }
  for (const auto& [key, unused] : b.touched()) {
    const std::string* hashes = b.Find(key.first, key.second);
    OML_RETURN_IF_ERROR(c.Query("INSERT INTO oml.merkle_tiles (tenant_id, level, idx, hashes) VALUES ($1, $2, $3, $4) "
                                "ON CONFLICT (tenant_id, level, idx) DO UPDATE SET hashes = EXCLUDED.hashes",
                                {db::Text(tenant), db::Int(key.first), db::Int(static_cast<int64_t>(key.second)),
                                 db::Bytes(*hashes)})
                            .status());
    ++report.tiles_written;
  }
  OML_RETURN_IF_ERROR(c.Query("UPDATE oml.tlog_state SET tiled_size = $2, verified_size = CASE WHEN $3 THEN $2 ELSE "
                              "verified_size END, updated_at = now() WHERE tenant_id = $1",
                              {db::Text(tenant), db::Int(to), db::Text(verified ? "true" : "false")})
                          .status());
  OML_RETURN_IF_ERROR(txn->Commit());
  report.to = to;
  report.verified = verified;
  return report;
}

std::string CheckpointOrigin(const std::string& deployment_origin, const std::string& tenant) {
  return deployment_origin + "/" + tenant;
}

std::string CheckpointSigner(const crypto::SigningKey& key, const std::string& deployment_origin) {
  return key.key_id() + " " + deployment_origin;
}

Result<std::string> SignCheckpoint(db::Pool& pool, const std::string& tenant, const std::string& deployment_origin,
                                   const crypto::SigningKey& key) {
  OML_ASSIGN_OR_RETURN(auto conn, pool.Acquire());
  db::Conn& c = *conn;
  OML_ASSIGN_OR_RETURN(auto txn, TlogTxn::Begin(c));
  OML_ASSIGN_OR_RETURN(std::vector<db::Rows> st,
                       c.Pipeline({db::ScopeTo(tenant),
                                   {"SELECT verified_size, checkpoint_size, checkpoint, signed_by FROM oml.tlog_state "
                                    "WHERE tenant_id = $1 FOR UPDATE",
                                    {db::Text(tenant)}}}));
  if (st[1].size() != 1) return FailedPrecondition("chain " + tenant + " has no tiles yet", "no-tiles");
  const int64_t size = st[1].GetInt(0, 0);
  const std::string origin = CheckpointOrigin(deployment_origin, tenant);
  TileReader tiles(&c, tenant, /*in_transaction=*/true);
  if (!st[1].IsNull(0, 1)) {
    const int64_t prev_size = st[1].GetInt(0, 1);
    const std::string prev = st[1].Get(0, 2);
    // The previous checkpoint's root is the tiles' root at its size (the tiles only grow).
    auto body = tlog::ParseCheckpointNote(prev);
    if (!body.ok()) return Fork(tenant, "the stored checkpoint is malformed: " + body.status().message());
    OML_ASSIGN_OR_RETURN(std::string root_then, merkle::RootAt(tiles, static_cast<uint64_t>(prev_size)));
    if (body->size != static_cast<uint64_t>(prev_size) || body->root != root_then)
      return Fork(tenant, "the tiles no longer give the root of the checkpoint at size " + std::to_string(prev_size));
    // Nothing new to sign, and signed by this key under this origin: the same note.
    if (prev_size == size && body->origin == origin && tlog::OpenNote(prev, {tlog::MakeNoteKey(origin, key.public_key())}).ok()) {
      if (st[1].IsNull(0, 3) || st[1].Get(0, 3) != CheckpointSigner(key, deployment_origin)) {
        OML_RETURN_IF_ERROR(c.Query("UPDATE oml.tlog_state SET signed_by = $2 WHERE tenant_id = $1",
                                    {db::Text(tenant), db::Text(CheckpointSigner(key, deployment_origin))})
                                .status());
        OML_RETURN_IF_ERROR(txn->Commit());
      }
      return prev;
    }
  }
  OML_ASSIGN_OR_RETURN(std::string root, merkle::RootAt(tiles, static_cast<uint64_t>(size)));
  OML_ASSIGN_OR_RETURN(std::string note,
                       tlog::SignNote(tlog::EncodeCheckpoint({origin, static_cast<uint64_t>(size), root, {}}), origin, key));
  // A new note at a size already published (a new key or origin over a quiet chain): the
  // publisher writes it again, with the last tile of each level (published_size moved back to
  // the start of the last level-0 tile, never forward).
  const int64_t republish_from = size > 0 ? (size - 1) / static_cast<int64_t>(kTileWidth) * static_cast<int64_t>(kTileWidth) : 0;
  OML_RETURN_IF_ERROR(c.Query("UPDATE oml.tlog_state SET checkpoint_size = $2, checkpoint = $3, signed_by = $4, "
                              "published_size = least(published_size, $5), witnessed = false, updated_at = now() "
                              "WHERE tenant_id = $1",
                              {db::Text(tenant), db::Int(size), db::Text(note),
                               db::Text(CheckpointSigner(key, deployment_origin)), db::Int(republish_from)})
                          .status());
  OML_RETURN_IF_ERROR(txn->Commit());  // a checkpoint the standbys may not hold is not returned
  return note;
}

namespace {

std::string IndexPath(uint64_t n) {
  std::string digits = std::to_string(n);
  digits.insert(0, (3 - digits.size() % 3) % 3, '0');
  std::string out;
  for (size_t i = 0; i < digits.size(); i += 3) {
    if (i + 3 < digits.size()) out += "x";
    out += digits.substr(i, 3);
    if (i + 3 < digits.size()) out += "/";
  }
  return out;
}

std::string WidthSuffix(uint64_t width) { return width == kTileWidth ? "" : ".p/" + std::to_string(width); }

}  // namespace

std::string TlogPrefix(const std::string& tenant) { return "oml-tlog/" + tenant + "/"; }

std::string TilePath(int level, uint64_t index, uint64_t width) {
  return "tile/" + std::to_string(level) + "/" + IndexPath(index) + WidthSuffix(width);
}

std::string EntryBundlePath(uint64_t index, uint64_t width) {
  return "tile/entries/" + IndexPath(index) + WidthSuffix(width);
}

Status PublishTlogObjects(db::Pool& pool, blob::ObjectStore& store, const std::string& tenant,
                          const std::atomic<bool>* stop, bool require_witnessed) {
  const auto stopped = [&] { return stop != nullptr && stop->load(); };
  OML_ASSIGN_OR_RETURN(auto conn, pool.Acquire());
  db::Conn& c = *conn;
  OML_ASSIGN_OR_RETURN(TlogState st, ReadTlogState(c, tenant));
  if (!st.checkpoint_size || st.published_size == *st.checkpoint_size) return Status::Ok();
  if (require_witnessed && !st.witnessed)
    return FailedPrecondition("chain " + tenant + ": the checkpoint at size " + std::to_string(*st.checkpoint_size) +
                                  " has no quorum of witness cosignatures yet",
                              "not-witnessed");
  const uint64_t size = static_cast<uint64_t>(*st.checkpoint_size);
  // A checkpoint behind what was published (restored): everything from the start again.
  const uint64_t published = st.published_size <= *st.checkpoint_size ? static_cast<uint64_t>(st.published_size) : 0;
  const std::string prefix = TlogPrefix(tenant);
  constexpr uint64_t kTilesPerQuery = 512;  // 4 MiB of hashes per read
  for (int level = 0; level < 8; ++level) {
    const uint64_t count = size >> (kTileHeight * level), done = published >> (kTileHeight * level);
    if (count == 0) break;
    const uint64_t last = (count - 1) / kTileWidth;
    for (uint64_t first = done / kTileWidth; first <= last; first += kTilesPerQuery) {
      if (stopped()) return Status(Code::kAborted, "stopped", "stopped");
      const uint64_t upto = std::min(last, first + kTilesPerQuery - 1);
      OML_ASSIGN_OR_RETURN(db::Rows r, c.Scoped(tenant, {"SELECT idx, hashes FROM oml.merkle_tiles WHERE tenant_id = $1 "
                                                         "AND level = $2 AND idx BETWEEN $3 AND $4 ORDER BY idx",
                                                         {db::Text(tenant), db::Int(level), db::Int(static_cast<int64_t>(first)),
                                                          db::Int(static_cast<int64_t>(upto))}}));
      if (static_cast<uint64_t>(r.size()) != upto - first + 1)
        return Status(Code::kDataLoss, "chain " + tenant + ": tiles of level " + std::to_string(level) + " are missing",
                      "integrity");
      for (int i = 0; i < r.size(); ++i) {
        const uint64_t idx = static_cast<uint64_t>(r.GetInt(i, 0));
        const uint64_t width = std::min<uint64_t>(kTileWidth, count - idx * kTileWidth);
        std::string hashes = r.GetBytes(i, 1);
        if (hashes.size() < width * kHashSize)
          return Status(Code::kDataLoss, "chain " + tenant + ": tile " + std::to_string(level) + "/" + std::to_string(idx) +
                                             " is shorter than the checkpoint's tree", "integrity");
        hashes.resize(width * kHashSize);
        OML_RETURN_IF_ERROR(store.Put(prefix + TilePath(level, idx, width), hashes));
      }
    }
  }
  // Entry bundles: the leaves from the start of the first bundle not yet complete. A bundle
  // holding an entry longer than its uint16 length prefix allows is not written (logged): the
  // tiles and the checkpoint still are.
  uint64_t next = published / kTileWidth * kTileWidth;
  std::string bundle;
  bool bundle_ok = true;
  while (next < size) {
    if (stopped()) return Status(Code::kAborted, "stopped", "stopped");
    OML_ASSIGN_OR_RETURN(db::Rows r, c.Scoped(tenant, {"SELECT seq, signed_bytes FROM oml.journal WHERE tenant_id = $1 "
                                                       "AND seq > $2 AND seq <= $3 ORDER BY seq LIMIT 2048",
                                                       {db::Text(tenant), db::Int(static_cast<int64_t>(next)),
                                                        db::Int(static_cast<int64_t>(size))}}));
    if (r.size() == 0) return Status(Code::kDataLoss, "chain " + tenant + " has no event at seq " + std::to_string(next + 1), "integrity");
    for (int i = 0; i < r.size(); ++i) {
      if (static_cast<uint64_t>(r.GetInt(i, 0)) != next + 1)
        return Status(Code::kDataLoss, "chain " + tenant + " has no event at seq " + std::to_string(next + 1), "integrity");
      const std::string entry = r.GetBytes(i, 1);
      if (entry.size() > 0xFFFF) {
        if (bundle_ok)
          log::Warn("transparency log: an entry is longer than an entry bundle holds (65535 bytes); its bundle is not "
                    "published (the tiles and the checkpoint are)",
                    {{"tenant", tenant}, {"seq", static_cast<int64_t>(next + 1)}, {"bytes", static_cast<int64_t>(entry.size())}});
        bundle_ok = false;
      }
      bundle += static_cast<char>((entry.size() >> 8) & 0xFF);
      bundle += static_cast<char>(entry.size() & 0xFF);
      bundle += entry;
      ++next;
      if (next % kTileWidth == 0 || next == size) {
        const uint64_t width = (next - 1) % kTileWidth + 1;
        if (bundle_ok) OML_RETURN_IF_ERROR(store.Put(prefix + EntryBundlePath((next - 1) / kTileWidth, width), bundle));
        bundle.clear();
        bundle_ok = true;
      }
    }
  }
  OML_RETURN_IF_ERROR(OML_SYNC_POINT("tlog.publish.before_checkpoint"));  // tests: a newer one is published here
  // The checkpoint last, under the state row's lock: only if it is still the newest (another
  // replica may have signed and published a newer one meanwhile: never put an older one over it),
  // and published_size recorded in the same transaction (a failed put leaves it behind; a lost
  // one only makes the next round put the objects again).
  OML_ASSIGN_OR_RETURN(auto txn, TlogTxn::Begin(c, /*derived_only=*/true));
  OML_ASSIGN_OR_RETURN(std::vector<db::Rows> now,
                       c.Pipeline({db::ScopeTo(tenant),
                                   {"SELECT checkpoint_size, checkpoint FROM oml.tlog_state WHERE tenant_id = $1 FOR UPDATE",
                                    {db::Text(tenant)}}}));
  if (now[1].size() != 1 || now[1].IsNull(0, 0) || now[1].GetInt(0, 0) != *st.checkpoint_size ||
      now[1].Get(0, 1) != st.checkpoint)
    return Status::Ok();  // a newer checkpoint: its own round publishes it
  OML_RETURN_IF_ERROR(store.Put(prefix + "checkpoint", st.checkpoint));
  OML_RETURN_IF_ERROR(c.Query("UPDATE oml.tlog_state SET published_size = $2 WHERE tenant_id = $1",
                              {db::Text(tenant), db::Int(*st.checkpoint_size)})
                          .status());
  return txn->Commit();
}

Result<TlogRound> PublishTlogs(db::Pool& pool, blob::ObjectStore* store, const std::string& deployment_origin,
                               const crypto::SigningKey& key, const std::atomic<bool>* stop,
                               const WitnessPolicy* witnesses, WitnessSizes* sizes) {
  const bool witnessed = witnesses != nullptr && witnesses->enabled();
  // A key no longer in force (rotated by another process: this one still holds the old one)
  // signs nothing: the replica holding the new key publishes.
  OML_RETURN_IF_ERROR(CheckSigningKeyInForce(pool, key));
  std::vector<std::string> tenants;
  {
    OML_ASSIGN_OR_RETURN(auto conn, pool.Acquire());
    OML_ASSIGN_OR_RETURN(db::Rows r, conn->Query("SELECT t::text FROM oml.tlog_pending($1, $2) AS t ORDER BY 1",
                                                 {db::Text(CheckpointSigner(key, deployment_origin)),
                                                  db::Text(witnessed ? "true" : "false")}));
    for (int i = 0; i < r.size(); ++i) tenants.push_back(r.Get(i, 0));
  }
  TlogRound round;
  std::set<std::string> unreachable;  // witnesses that did not answer: not asked again this round
  for (const std::string& t : tenants) {
    if (stop != nullptr && stop->load()) break;
    Status st = [&]() -> Status {
      for (;;) {  // up to the commit point's edge, a bounded batch at a time
        if (stop != nullptr && stop->load()) return Status::Ok();
        OML_ASSIGN_OR_RETURN(ExtendReport e, ExtendTiles(pool, t));
        if (e.verified || e.to == e.from) break;
      }
      OML_ASSIGN_OR_RETURN(auto conn, pool.Acquire());
      OML_ASSIGN_OR_RETURN(TlogState s, ReadTlogState(*conn, t));
      if (s.verified_size == 0 && !s.checkpoint_size) return Status::Ok();  // nothing verified yet
      OML_RETURN_IF_ERROR(SignCheckpoint(pool, t, deployment_origin, key).status());
      if (witnessed) OML_RETURN_IF_ERROR(CosignCheckpoint(pool, t, *witnesses, sizes, false, &unreachable).status());
      if (store != nullptr) OML_RETURN_IF_ERROR(PublishTlogObjects(pool, *store, t, stop, witnessed));
      return Status::Ok();
    }();
    if (st.ok()) {
      ++round.chains;
    } else if (st.type() != "stopped") {
      if (st.type() == "tlog-fork") round.forks.emplace_back(t, st);
      round.failures.emplace_back(t, st);
    }
  }
  return round;
}

TlogPublisher::TlogPublisher(db::Pool* pool, blob::ObjectStore* store, std::string deployment_origin,
                             const crypto::SigningKey* key, std::chrono::milliseconds interval, WitnessPolicy witnesses,
                             WitnessSizes sizes, std::function<void(const std::string&, const std::string&)> on_fork)
    : pool_(pool),
      store_(store),
      origin_(std::move(deployment_origin)),
      key_(key),
      witnesses_(std::move(witnesses)),
      sizes_(std::move(sizes)),
      on_fork_(std::move(on_fork)),
      thread_(
          interval,
          std::function<std::chrono::milliseconds()>([this, interval] {
            // At most a quarter of the time busy: a round that took `busy` is followed by a pause
            // of 3 × busy (at least the interval), so the publisher's transactions, object puts
            // and fsyncs never crowd out the commit path when many chains are written at once.
            const auto t0 = std::chrono::steady_clock::now();
            RunOnce();
            // The pause is capped (10 s, or the interval if longer): a round slowed by waiting
            // on others (a witness's timeout, a slow object store) must not stretch the next.
            const auto busy = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0);
            return std::min<std::chrono::milliseconds>(3 * busy, std::max<std::chrono::milliseconds>(
                                                                     interval, std::chrono::seconds(10)));
          }),
          /*run_at_start=*/true) {}

TlogPublisher::~TlogPublisher() { stop_ = true; }  // then thread_ joins

void TlogPublisher::RunOnce() {
  auto r = PublishTlogs(*pool_, store_, origin_, *key_, &stop_, &witnesses_, &sizes_);
  const auto now = std::chrono::steady_clock::now();
  // Each distinct problem is logged once every 10 minutes (a forked chain fails every round).
  auto report = [&](const std::string& tenant, const Status& st) {
    // Keyed without its numbers (digit runs not after a letter: sizes, counts), so a problem
    // whose sizes change every round is still one problem; names (w1, w2) stay apart.
    std::string key = tenant + "\n";
    const std::string text = st.ToString();
    const auto letter = [](char ch) { return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z'); };
    for (size_t i = 0; i < text.size(); ++i) {
      const bool digit = text[i] >= '0' && text[i] <= '9';
      if (digit && (i == 0 || !letter(text[i - 1]))) {
        while (i + 1 < text.size() && text[i + 1] >= '0' && text[i + 1] <= '9') ++i;
        key += '#';
      } else {
        key += text[i];
      }
    }
    auto& last = logged_[key];
    if (last.time_since_epoch().count() != 0 && now - last < std::chrono::minutes(10)) return;
    last = now;
    log::Error("transparency log: a chain's tiles or checkpoint could not be published",
               {{"tenant", tenant}, {"error", st.ToString()}});
  };
  if (!r.ok()) return report("", r.status());  // signing-key-not-in-force too: said once per 10 min
  for (const auto& [tenant, st] : r->failures) report(tenant, st);
  if (on_fork_)
    for (const auto& [tenant, st] : r->forks) on_fork_(tenant, st.message());
  if (logged_.size() > 10000) logged_.clear();
}

// --- Witnesses --------------------------------------------------------------------------------

Result<std::vector<TlogWitness>> ParseTlogWitnesses(const std::string& setting) {
  std::vector<TlogWitness> out;
  size_t at = 0;
  while (at < setting.size()) {
    size_t comma = setting.find(',', at);
    if (comma == std::string::npos) comma = setting.size();
    std::string entry = setting.substr(at, comma - at);
    at = comma + 1;
    const auto trim = [](std::string& x) {
      while (!x.empty() && (x.front() == ' ' || x.front() == '\t' || x.front() == '\n')) x.erase(0, 1);
      while (!x.empty() && (x.back() == ' ' || x.back() == '\t' || x.back() == '\n')) x.pop_back();
    };
    trim(entry);
    if (entry.empty()) continue;
    const auto bad = [&](const std::string& why) {
      return InvalidArgument("setting tlog_witnesses: entry '" + entry + "': " + why, "invalid-setting");
    };
    const size_t space = entry.find_first_of(" \t");
    if (space == std::string::npos) return bad("want \"<url> <verifier key>\"");
    TlogWitness w;
    w.url = entry.substr(0, space);
    std::string vkey = entry.substr(space + 1);
    trim(vkey);
    if (w.url.rfind("http://", 0) != 0 || w.url.size() == 7) return bad("the URL must be http://host[:port][/path]");
    while (!w.url.empty() && w.url.back() == '/') w.url.pop_back();
    auto key = tlog::ParseVerifierKey(vkey);
    if (!key.ok()) return bad(key.status().message());
    if (key->alg != tlog::kAlgCosignatureV1) return bad("not a cosignature/v1 verifier key (type 0x04)");
    for (const auto& o : out)
      if (o.key.name == key->name) return bad("a witness named " + key->name + " is configured twice");
    w.key = std::move(*key);
    out.push_back(std::move(w));
  }
  return out;
}

Result<int> WitnessQuorum(int configured, size_t count) {
  if (configured < 0 || static_cast<size_t>(configured) > count)
    return InvalidArgument("setting tlog_witness_quorum: " + std::to_string(configured) + " is more than the " +
                               std::to_string(count) + " witnesses configured",
                           "invalid-setting");
  if (count == 0) return 0;
  return configured > 0 ? configured : static_cast<int>(count / 2 + 1);
}

namespace {

// A witness's 409 body: the size and a newline (text/x.tlog.size).
std::optional<uint64_t> DecimalSize(std::string_view text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.remove_suffix(1);
  return tlog::ParseDecimal(text);
}

std::string Excerpt(std::string_view body) {
  std::string out(body.substr(0, 200));
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  for (char& ch : out)
    if (ch == '\n' || ch == '\r') ch = ' ';
  return out;
}

}  // namespace

Result<CosignReport> CosignCheckpoint(db::Pool& pool, const std::string& tenant, const WitnessPolicy& policy,
                                      WitnessSizes* sizes, bool recheck, std::set<std::string>* unreachable) {
  CosignReport report;
  OML_ASSIGN_OR_RETURN(auto conn, pool.Acquire());
  db::Conn& c = *conn;
  OML_ASSIGN_OR_RETURN(TlogState st, ReadTlogState(c, tenant));
  if (!st.checkpoint_size)
    return FailedPrecondition("chain " + tenant + " has no checkpoint to cosign yet", "no-checkpoint");
  const std::string note = st.checkpoint;
  const std::string text(tlog::NoteText(note));
  const uint64_t n = static_cast<uint64_t>(*st.checkpoint_size);
  // The configured witnesses whose cosignature the stored note carries already (a note
  // witnessed under another set of witnesses lacks the quorum under this one).
  std::set<std::string> present;
  {
    std::vector<tlog::NoteKey> keys;
    for (const auto& w : policy.witnesses) keys.push_back(w.key);
    auto opened = tlog::OpenNote(note, keys);
    if (opened.ok())
      for (const auto& sig : opened->verified) present.insert(sig.name);
  }
  const bool has_quorum = st.witnessed && static_cast<int>(present.size()) >= policy.quorum;
  if (has_quorum && !recheck) return report;
  TileReader tiles(&c, tenant);
  std::string lines;  // new cosignature lines, by witnesses not in `present`
  for (const TlogWitness& w : policy.witnesses) {
    if (!recheck && present.count(w.key.name)) {
      ++report.cosignatures;
      continue;
    }
    if (unreachable != nullptr && unreachable->count(w.key.name)) {
      report.problems.push_back(w.key.name + ": unreachable earlier in this round");
      continue;
    }
    uint64_t& known = (*sizes)[{w.key.name, tenant}];
    if (known > n) known = 0;  // learned before a newer round's answer: ask again
    std::string problem = "its recorded size kept changing (another publisher is cosigning this chain)";
    bool deferred = true;  // (that one is not a problem of the witness; each other is, unless said)
    for (int attempt = 0; attempt < 3; ++attempt) {
      std::string body = "old " + std::to_string(known) + "\n";
      if (known > 0 && known < n) {
        auto proof = merkle::ConsistencyProof(tiles, known, n);
        if (!proof.ok()) {
          problem = "no consistency proof from its size " + std::to_string(known) + ": " + proof.status().message();
          break;
        }
        for (const auto& h : *proof) body += crypto::Base64(h) + "\n";
      }
      body += "\n";
      body += note;
      deferred = false;
      auto reply = policy.post(w, body);
      if (!reply.ok()) {
        problem = "unreachable: " + reply.status().message();
        if (unreachable != nullptr) unreachable->insert(w.key.name);
        break;
      }
      if (reply->status == 200) {
        // One or more signature lines; one that verifies, alone over the checkpoint's text, under
        // this witness's cosignature key counts (lines of other keys or algorithms, or malformed
        // ones, are ignored); a line by its key that does not verify refuses the whole answer.
        std::string line;
        std::string refused;
        std::string_view rest = reply->body;
        while (!rest.empty()) {
          const size_t nl = rest.find('\n');
          const std::string candidate(rest.substr(0, nl == std::string_view::npos ? rest.size() : nl + 1));
          rest.remove_prefix(candidate.size());
          auto opened = tlog::OpenNote(text + "\n" + candidate, {w.key});
          if (opened.ok()) {
            if (line.empty()) line = candidate;
          } else if (opened.status().type() == "invalid-signature") {
            refused = opened.status().message();  // a line by its key that does not verify
          }
        }
        if (!refused.empty()) {
          problem = "its answer is not a cosignature that verifies: " + refused;
          break;
        }
        if (line.empty()) {
          problem = "its answer holds no cosignature by its key";
          break;
        }
        known = n;
        if (!present.count(w.key.name)) lines += line;
        ++report.cosignatures;
        problem.clear();
        break;
      }
      if (reply->status == 409 && reply->content_type.rfind("text/x.tlog.size", 0) == 0) {
        const auto theirs = DecimalSize(reply->body);
        if (!theirs) {
          problem = "answered 409 without a size";
          break;
        }
        if (*theirs > n) {
          // Past the newest checkpoint: a fork only if the chain does not reach it. A newer
          // checkpoint stored by another replica meanwhile, or one whose row a failover lost
          // while the events themselves survived, is not: the next checkpoint reaches that size
          // and the witness checks the consistency proof from it.
          OML_ASSIGN_OR_RETURN(db::Rows h, c.Scoped(tenant, {"SELECT coalesce((SELECT seq FROM oml.chain_heads "
                                                             "WHERE tenant_id = $1), 0)",
                                                             {db::Text(tenant)}}));
          const int64_t chain = h.GetInt(0, 0);
          if (chain >= 0 && static_cast<uint64_t>(chain) >= *theirs) {
            problem = "it has cosigned size " + std::to_string(*theirs) + ", past this checkpoint (the next one reaches it)";
            deferred = true;
            break;
          }
          return Fork(tenant, "witness " + w.key.name + " has cosigned a tree of size " + std::to_string(*theirs) +
                                  " of this log, larger than the chain's " + std::to_string(chain) +
                                  " events (the database lost the chain's tail)");
        }
        if (*theirs == known)
          return Fork(tenant, "witness " + w.key.name + " has cosigned another tree of size " + std::to_string(*theirs) +
                                  " of this log");
        known = *theirs;
        deferred = true;  // if this was the last attempt: "kept changing"
        continue;
      }
      if (reply->status == 422)
        return Fork(tenant, "witness " + w.key.name + " refuses the consistency proof from the tree of size " +
                                std::to_string(known) + " it cosigned to " + std::to_string(n) + ": " +
                                Excerpt(reply->body));
      problem = "answered " + std::to_string(reply->status) + ": " + Excerpt(reply->body);
      break;
    }
    if (!problem.empty()) (deferred ? report.deferred : report.problems).push_back(w.key.name + ": " + problem);
  }
  if (report.cosignatures < policy.quorum) {
    std::string why;
    for (const auto& p : report.problems) why += (why.empty() ? "" : "; ") + p;
    for (const auto& p : report.deferred) why += (why.empty() ? "" : "; ") + p;
    return Unavailable("chain " + tenant + ": " + std::to_string(report.cosignatures) + " of " +
                           std::to_string(policy.witnesses.size()) + " witnesses cosigned the checkpoint at size " +
                           std::to_string(n) + " (quorum " + std::to_string(policy.quorum) + "): " + why,
                       "witness-quorum");
  }
  if (has_quorum && lines.empty()) return report;  // nothing new to store
  // Stored with the new cosignatures only if it is still the newest checkpoint; published again
  // from the start of its last tile (a note at a size already published is put again).
  const int64_t republish_from = n > 0 ? static_cast<int64_t>((n - 1) / kTileWidth * kTileWidth) : 0;
  OML_ASSIGN_OR_RETURN(auto txn, TlogTxn::Begin(c));
  OML_ASSIGN_OR_RETURN(std::vector<db::Rows> upd,
                       c.Pipeline({db::ScopeTo(tenant),
                                   {"UPDATE oml.tlog_state SET checkpoint = $2 || $3, witnessed = true, "
                                    "published_size = least(published_size, $4), updated_at = now() "
                                    "WHERE tenant_id = $1 AND checkpoint = $2 RETURNING 1",
                                    {db::Text(tenant), db::Text(note), db::Text(lines), db::Int(republish_from)}}}));
  OML_RETURN_IF_ERROR(txn->Commit());
  report.stored = upd[1].size() == 1;
  return report;
}

Status RepublishTlog(db::Pool& pool, const std::string& tenant) {
  OML_ASSIGN_OR_RETURN(auto conn, pool.Acquire());
  return conn->Scoped(tenant, {"UPDATE oml.tlog_state SET published_size = 0 WHERE tenant_id = $1", {db::Text(tenant)}})
      .status();
}

Result<TlogRound> RecheckWitnesses(db::Pool& pool, const WitnessPolicy& policy, WitnessSizes* sizes,
                                   const std::vector<std::string>& only) {
  TlogRound round;
  if (!policy.enabled()) return round;
  std::vector<std::string> chains = only;
  if (chains.empty()) {
    OML_ASSIGN_OR_RETURN(std::vector<TenantInfo> tenants, ListTenants(pool));
    for (const auto& t : tenants) chains.push_back(t.tenant_id);
  }
  std::set<std::string> unreachable;  // asked once per round: a start waits one timeout per witness at most
  for (const std::string& tenant : chains) {
    auto r = CosignCheckpoint(pool, tenant, policy, sizes, /*recheck=*/true, &unreachable);
    if (r.ok() || r.status().type() == "no-checkpoint") {
      ++round.chains;
      if (r.ok() && !r->problems.empty()) {
        std::string why;
        for (const auto& p : r->problems) why += (why.empty() ? "" : "; ") + p;
        round.unchecked.emplace_back(tenant, why);
      }
      continue;
    }
    if (r.status().type() == "tlog-fork") round.forks.emplace_back(tenant, r.status());
    round.failures.emplace_back(tenant, r.status());
  }
  return round;
}

Status CheckPublishedCheckpoints(db::Pool& pool, blob::ObjectStore& store, const TrustedKeys& keys,
                                 const std::string& deployment_origin, const WitnessPolicy& policy,
                                 const std::vector<std::string>& tenants, ForkCheck* out) {
  OML_ASSIGN_OR_RETURN(auto conn, pool.Acquire());
  db::Conn& c = *conn;
  for (const std::string& t : tenants) {
    // What this deployment published, read before the object: a replica publishing a newer
    // checkpoint in between then never looks like a rollback.
    OML_ASSIGN_OR_RETURN(db::Rows pub, c.Scoped(t, {"SELECT coalesce((SELECT published_size FROM oml.tlog_state "
                                                    "WHERE tenant_id = $1), 0)",
                                                    {db::Text(t)}}));
    const int64_t published = pub.GetInt(0, 0);
    OML_ASSIGN_OR_RETURN(auto bytes, store.Get(TlogPrefix(t) + "checkpoint"));
    if (!bytes) continue;
    const std::string origin = CheckpointOrigin(deployment_origin, t);
    const auto invalid = [&](const std::string& what) {
      ForkFinding f{t, 0, 0, "published checkpoint: " + what, /*invalid_head=*/true};
      f.checkpoint = true;
      out->findings.push_back(std::move(f));
    };
    std::vector<tlog::NoteKey> note_keys;
    for (const auto& [id, pub] : keys) note_keys.push_back(tlog::MakeNoteKey(origin, pub));
    for (const auto& w : policy.witnesses) note_keys.push_back(w.key);
    auto opened = tlog::OpenNote(*bytes, note_keys);
    if (!opened.ok()) {
      invalid(opened.status().message());
      continue;
    }
    std::set<std::string> witnesses;
    bool by_log = false;
    for (const auto& sig : opened->verified) {
      // By a key of the key chain (name and key hash), or by a configured witness.
      const bool log_key = std::any_of(keys.begin(), keys.end(), [&](const auto& k) {
        return sig.name == origin && sig.hash == tlog::MakeNoteKey(origin, k.second).hash;
      });
      if (log_key) by_log = true;
      else witnesses.insert(sig.name);
    }
    if (!by_log) {
      invalid("not signed by a key of the anchored key chain under " + origin);
      continue;
    }
    auto cp = tlog::ParseCheckpoint(opened->text);
    if (!cp.ok() || cp->origin != origin) {
      invalid(cp.ok() ? "its origin is " + cp->origin + ", not " + origin : cp.status().message());
      continue;
    }
    if (static_cast<int>(witnesses.size()) < policy.quorum) {
      // Not trusted (a checkpoint of before the witnesses were configured, or planted): skipped.
      log::Warn("published checkpoint skipped by the fork check: too few witness cosignatures",
                {{"tenant", t}, {"size", static_cast<int64_t>(cp->size)},
                 {"cosignatures", static_cast<int64_t>(witnesses.size())}, {"quorum", policy.quorum}});
      continue;
    }
    const int64_t size = static_cast<int64_t>(cp->size);
    const std::string kind = policy.enabled() ? "witnessed checkpoint" : "published checkpoint";
    OML_ASSIGN_OR_RETURN(db::Rows r, c.Scoped(t, {"SELECT coalesce((SELECT seq FROM oml.chain_heads WHERE tenant_id = $1), 0), "
                                                  "coalesce((SELECT tiled_size FROM oml.tlog_state WHERE tenant_id = $1), 0), "
                                                  "(SELECT event_hash FROM oml.journal WHERE tenant_id = $1 AND seq = $2)",
                                                  {db::Text(t), db::Int(size)}}));
    if (published > size) {
      // This deployment published a larger tree than the store now holds: the store (or its
      // bucket) was rolled back. Not a fork of the chain (`oml serve` publishes it all again);
      // the chain is still held to the older checkpoint below.
      invalid("its size " + std::to_string(size) + " is behind the size " + std::to_string(published) +
              " this deployment published (the object store was rolled back)");
    }
    if (size == 0) continue;
    const int64_t stored = r.GetInt(0, 0);
    if (stored < size) {
      out->findings.push_back({t, size, stored,
                               "stored chain size " + std::to_string(stored) + " is behind the " + kind + " size " +
                                   std::to_string(size)});
      continue;
    }
    Result<std::string> root = InvalidArgument("");
    if (r.GetInt(0, 1) >= size) {
      TileReader tiles(&c, t);
      root = merkle::RootAt(tiles, cp->size);
    } else {
      auto tree = TreeFromJournal(c, t, size);
      root = tree.ok() ? Result<std::string>(tree->Root()) : Result<std::string>(tree.status());
    }
    if (!root.ok() || *root != cp->root) {
      out->findings.push_back({t, size, stored,
                               "the stored chain's tree of size " + std::to_string(size) + " has another root than the " +
                                   kind + (root.ok() ? "" : " (" + root.status().message() + ")")});
      continue;
    }
    out->heads.push_back(SignedHead{t, size, r.GetBytes(0, 2), "", ""});
  }
  return Status::Ok();
}

}  // namespace oml::journal
