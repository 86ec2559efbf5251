// Each chain as a transparency log (issue 23): the nodes of its Merkle tree (entries: the
// events' signed_bytes in seq order) in C2SP tlog-tiles form in PostgreSQL (sql/0030
// merkle_tiles), and the newest checkpoint signed over them (tlog_state), so that inclusion and
// consistency proofs read O(log n) tiles instead of the journal.
//
// Tile (level, idx) holds the hashes of tree level 8 * level, nodes [256 idx, 256 idx + width).
// A node of tree level L = 8 k + s is the perfect-subtree root of 2^s consecutive entries of a
// level-k tile, so any node is one tile read and at most 255 hashes.
//
// Extending (ExtendTiles) reads the journal after tiled_size, appends the leaf hashes, completes
// the tiles above, and writes the touched tiles and the new tiled_size in one transaction. It
// first checks that the journal still holds, at tiled_size, the leaf the tiles hold there, and
// on reaching the commit point's edge (chain_heads tree_size) that the root folded from the
// tiles is the edge's: only such a verified size is ever signed. A chain restored behind its
// tiles, rewritten, or whose tiles were changed is refused with kDataLoss "tlog-fork" and the
// tiles are left as they are, for the operator (the fork check refuses the chain's writes too).
//
// Thread safety: the functions take their own connections or the caller's; two extenders of one
// chain at once are serialized by the tlog_state row lock (the second finds the work done).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "blob/object_store.h"
#include "common/periodic.h"
#include "common/status.h"
#include "crypto/crypto.h"
#include "db/conn.h"
#include "merkle/merkle.h"

namespace oml::journal {

inline constexpr int kTileHeight = 8;
inline constexpr uint64_t kTileWidth = 256;

// Node hashes of one chain, read from its tiles (scoped to the tenant). Caches the tiles it read;
// use one per request. Node() of a node not (yet) in the tiles is kNotFound "no-node".
class TileReader : public merkle::NodeReader {
 public:
  // `in_transaction`: `conn` is in a transaction already scoped to `tenant` (ScopeTo), whose
  // snapshot the reads share; otherwise each read is its own scoped statement.
  TileReader(db::Conn* conn, std::string tenant, bool in_transaction = false)
      : conn_(conn), tenant_(std::move(tenant)), in_transaction_(in_transaction) {}
  Result<std::string> Node(int level, uint64_t index) override;
  // Reads, in one statement, the tiles a proof about leaf `index` (and, for a consistency proof,
  // the size `older`) in a tree of `size` leaves will mostly need: at each tile level the tile
  // holding the leaf's ancestor and the right edge's tile. Anything else is read on demand.
  Status Prefetch(uint64_t index, uint64_t size, std::optional<uint64_t> older = std::nullopt);
  int tiles_read() const { return tiles_read_; }

 private:
  Result<const std::string*> Tile(int level, uint64_t idx);
  db::Conn* conn_;
  std::string tenant_;
  bool in_transaction_;
  std::map<std::pair<int, uint64_t>, std::string> cache_;
  int tiles_read_ = 0;
};

struct TlogState {
  int64_t tiled_size = 0;
  int64_t verified_size = 0;
  std::optional<int64_t> checkpoint_size;
  std::string checkpoint;  // the signed note ("" if none)
  int64_t published_size = 0;
};

// The chain's tlog_state (zeros if it has none yet).
Result<TlogState> ReadTlogState(db::Conn& conn, const std::string& tenant);

struct ExtendReport {
  int64_t from = 0, to = 0;  // tiled_size before and after
  int tiles_written = 0;
  bool verified = false;     // `to` is the commit point's tree size and the roots are equal
};

// Extends the tiles of `tenant` up to the size of the commit point's edge (chain_heads
// tree_size, read with the head in one snapshot), at most `max_leaves` leaves per call. On
// reaching it, the root folded from the tiles must be the edge's root (else kDataLoss
// "tlog-fork", nothing written) and verified_size becomes that size. A chain with no edge yet
// is left as it is. kNotFound "unknown-chain" for a chain with no head.
Result<ExtendReport> ExtendTiles(db::Pool& pool, const std::string& tenant, int64_t max_leaves = 1 << 20);

// The checkpoint origin of a chain: "<deployment origin>/<tenant uuid>"; also the note key name.
std::string CheckpointOrigin(const std::string& deployment_origin, const std::string& tenant);
// tlog_state.signed_by of a checkpoint signed by `key` for `deployment_origin`.
std::string CheckpointSigner(const crypto::SigningKey& key, const std::string& deployment_origin);

// Signs a checkpoint over the chain's tiles at verified_size (RootAt from the tiles) with `key`
// under the note key name = origin, after checking that the tiles at the previous checkpoint's
// size still give its root (else kDataLoss "tlog-fork", nothing signed), and stores it in
// tlog_state. Returns the note. Signs nothing new (returns the stored note) when the checkpoint
// already covers verified_size under this key and origin. The COMMIT's verdict is checked: a
// checkpoint the synchronous standbys may not hold is never returned (kUnavailable).
Result<std::string> SignCheckpoint(db::Pool& pool, const std::string& tenant, const std::string& deployment_origin,
                                   const crypto::SigningKey& key);

// --- Publication (C2SP tlog-tiles, https://c2sp.org/tlog-tiles) -------------------------------
//
// Each chain's log is written to the object store under TlogPrefix(tenant) as static files a
// mirror or an auditor fetches with no access to oml:
//   checkpoint                       the newest signed checkpoint (written last)
//   tile/<L>/<N>[.p/<W>]             tile L/N of the checkpoint's tree; a partial one is .p/<W>
//   tile/entries/<N>[.p/<W>]         the entries (signed_bytes) of leaves [256 N, 256 N + W), each
//                                    as a big-endian uint16 length and the bytes
// <N> is the index in 3-digit groups, all but the last prefixed "x" (1234067: x001/x234/067).
// Full tiles and bundles never change; a partial one's path names its width, so nothing published
// is ever overwritten with other bytes except `checkpoint`.

std::string TlogPrefix(const std::string& tenant);
std::string TilePath(int level, uint64_t index, uint64_t width);
std::string EntryBundlePath(uint64_t index, uint64_t width);

// Writes the tiles and entry bundles from published_size up to the checkpoint's size, then the
// checkpoint, then records published_size. kFailedPrecondition "entry-too-large" for an entry
// over 65535 bytes (a bundle cannot hold it).
// The checkpoint is put only while it is still the newest (under the state row's lock), so a
// slower replica never puts an older checkpoint over a newer one. Reads the tiles 512 at a time;
// stops (kAborted "stopped") between reads once *stop is true. A bundle holding an entry over
// 65535 bytes (its uint16 length prefix) is not written, and logged; the rest is.
Status PublishTlogObjects(db::Pool& pool, blob::ObjectStore& store, const std::string& tenant,
                          const std::atomic<bool>* stop = nullptr);

struct TlogRound {
  int chains = 0;                                         // chains done (or with nothing to do)
  std::vector<std::pair<std::string, Status>> failures;  // chains that failed, and why
};

// One round over every chain with work (tlog_pending(signer)): extend the tiles to the commit
// point's edge, sign a checkpoint over the verified size, write the objects. A chain that
// fails is listed and the others still done. kFailedPrecondition "signing-key-not-in-force"
// (nothing done) when `key` is no longer the deployment's key. Stops between chains once *stop
// is true.
Result<TlogRound> PublishTlogs(db::Pool& pool, blob::ObjectStore* store, const std::string& deployment_origin,
                               const crypto::SigningKey& key, const std::atomic<bool>* stop = nullptr);

// Runs PublishTlogs every `interval` (`oml serve`). None of the pointers is owned.
class TlogPublisher {
 public:
  TlogPublisher(db::Pool* pool, blob::ObjectStore* store, std::string deployment_origin, const crypto::SigningKey* key,
                std::chrono::milliseconds interval);
  ~TlogPublisher();

 private:
  void RunOnce();
  std::map<std::string, std::chrono::steady_clock::time_point> logged_;  // only RunOnce (one thread)
  db::Pool* pool_;
  blob::ObjectStore* store_;
  const std::string origin_;
  const crypto::SigningKey* key_;
  std::atomic<bool> stop_{false};
  PeriodicThread thread_;  // last: runs RunOnce
};

}  // namespace oml::journal
