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
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "blob/object_store.h"
#include "common/periodic.h"
#include "common/status.h"
#include "crypto/crypto.h"
#include "db/conn.h"
#include "journal/heads.h"
#include "merkle/merkle.h"
#include "tlog/note.h"

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
  bool witnessed = false;  // `checkpoint` carries a quorum of witness cosignatures (sql/0031)
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

// --- Witnesses (C2SP tlog-witness, https://c2sp.org/tlog-witness; tlog/witness.h) -----------
//
// With witnesses configured (setting tlog_witnesses), each new checkpoint is sent to every
// witness with a consistency proof from the size that witness last cosigned for the chain, and
// it is published (and trusted by the fork checks) only once a quorum of them cosigned it. A
// witness that answers that it cosigned a larger tree of the chain than the database's newest
// checkpoint, another tree at the same size, or that the proof from its size does not verify,
// names a fork: the database lost its tail or was rewritten, even if the published objects were
// rolled back with it. The chain is then refused ("tlog-fork"), never cosigned or published.

struct TlogWitness {
  std::string url;   // "http://host[:port][/path]": requests go to <url>/add-checkpoint
  tlog::NoteKey key;  // its cosignature/v1 verifier key (name = the witness's name)
};

// Parses the setting tlog_witnesses: entries "<url> <verifier key>" separated by ",". "" gives
// none. kInvalidArgument "invalid-setting" naming the entry: not http://, a malformed or
// non-cosignature key, a witness named twice.
Result<std::vector<TlogWitness>> ParseTlogWitnesses(const std::string& setting);
// The number of cosignatures a checkpoint needs: `configured`, or a majority of `count` when 0.
// kInvalidArgument "invalid-setting" when configured > count.
Result<int> WitnessQuorum(int configured, size_t count);

struct WitnessReply {
  int status = 0;
  std::string content_type;
  std::string body;
};
// Sends one add-checkpoint request body to a witness; an error is "unreachable" (the witness may
// or may not have recorded it). Must be thread-safe if the policy is shared between threads.
using WitnessPost = std::function<Result<WitnessReply>(const TlogWitness&, const std::string& body)>;

struct WitnessPolicy {
  std::vector<TlogWitness> witnesses;  // none: checkpoints are published as signed
  int quorum = 0;                      // WitnessQuorum
  WitnessPost post;
  bool enabled() const { return !witnesses.empty(); }
};

// What each witness last cosigned per chain, learned from its answers: (witness name, tenant)
// -> size. Unknown starts at 0 (the witness's 409 then says its size). One per publisher thread.
using WitnessSizes = std::map<std::pair<std::string, std::string>, uint64_t>;

struct CosignReport {
  int cosignatures = 0;                // valid cosignatures gathered this call
  bool stored = false;                 // the cosigned note was stored (witnessed)
  std::vector<std::string> problems;  // per witness that did not cosign: why (not a fork)
  // Witnesses that did not cosign for a reason that is not theirs nor a fork: another publisher
  // moved them on meanwhile, or their size is past this checkpoint but within the chain.
  std::vector<std::string> deferred;
};

// Sends the chain's stored checkpoint to the witnesses of `policy` and, once `quorum` of them
// cosigned it (a cosignature that verifies under their key, over the checkpoint's text), stores
// the note with the new cosignature lines appended and `witnessed` set (unless a newer checkpoint
// was stored meanwhile). Cosignatures the stored note carries already by configured witnesses
// count (a note witnessed under another set of witnesses is cosigned again); a checkpoint with a
// quorum of them is left alone unless `recheck` (the startup check: ask every witness again, to
// learn whether one holds more of the chain than the database). kDataLoss "tlog-fork" naming the
// witness and the sizes when a witness's answer shows a fork (a size past the chain's events,
// another tree at a size, a consistency proof it refuses);
// kUnavailable "witness-quorum" (with every witness's problem) when fewer than `quorum` cosigned;
// kFailedPrecondition "no-checkpoint" when the chain has no checkpoint yet.
// `unreachable` (may be null): witnesses that did not answer earlier in the round, not asked
// again; one that does not answer now is added.
Result<CosignReport> CosignCheckpoint(db::Pool& pool, const std::string& tenant, const WitnessPolicy& policy,
                                      WitnessSizes* sizes, bool recheck = false,
                                      std::set<std::string>* unreachable = nullptr);

// Writes the tiles and entry bundles from published_size up to the checkpoint's size, then the
// checkpoint, then records published_size. With `require_witnessed`, a checkpoint not yet
// witnessed is not published at all (kFailedPrecondition "not-witnessed").
// The checkpoint is put only while it is still the newest (under the state row's lock), so a
// slower replica never puts an older checkpoint over a newer one. Reads the tiles 512 at a time;
// stops (kAborted "stopped") between reads once *stop is true. A bundle holding an entry over
// 65535 bytes (its uint16 length prefix) is not written, and logged; the rest is.
Status PublishTlogObjects(db::Pool& pool, blob::ObjectStore& store, const std::string& tenant,
                          const std::atomic<bool>* stop = nullptr, bool require_witnessed = false);

struct TlogRound {
  int chains = 0;                                         // chains done (or with nothing to do)
  std::vector<std::pair<std::string, Status>> failures;  // chains that failed, and why
  std::vector<std::pair<std::string, Status>> forks;     // of those, the "tlog-fork" ones
  // RecheckWitnesses: chains checked with a quorum but not by every witness, and which did not
  // answer and why ("w2: unreachable: ...; w3: ...").
  std::vector<std::pair<std::string, std::string>> unchecked;
};

// One round over every chain with work (tlog_pending(signer, witnessed)): extend the tiles to
// the commit point's edge, sign a checkpoint over the verified size, have it cosigned when
// `witnesses` has any (CosignCheckpoint; `sizes` REQUIRED then), write the objects. A chain that
// fails is listed and the others still done. kFailedPrecondition "signing-key-not-in-force"
// (nothing done) when `key` is no longer the deployment's key. Stops between chains once *stop
// is true.
Result<TlogRound> PublishTlogs(db::Pool& pool, blob::ObjectStore* store, const std::string& deployment_origin,
                               const crypto::SigningKey& key, const std::atomic<bool>* stop = nullptr,
                               const WitnessPolicy* witnesses = nullptr, WitnessSizes* sizes = nullptr);

// Makes the publisher write the chain's whole log again (published_size = 0): the repair of a
// rolled-back object store (CheckPublishedCheckpoints names it).
Status RepublishTlog(db::Pool& pool, const std::string& tenant);

// The startup witness check (`oml serve` before it accepts writes, `oml doctor`): every chain's
// stored checkpoint is sent to the witnesses again (CosignCheckpoint with recheck), so that a
// database restored behind what the witnesses cosigned is refused even when the published
// objects were rolled back too. Returns the chains found forked (and those that could not be
// checked, as failures).
// `only`: just those chains (a CLI write checks the chains it extends); empty: every chain.
Result<TlogRound> RecheckWitnesses(db::Pool& pool, const WitnessPolicy& policy, WitnessSizes* sizes,
                                   const std::vector<std::string>& only = {});

// The fork check against each listed chain's published checkpoint (`oml-tlog/<tenant>/
// checkpoint`), beside the head documents' (CheckForks, journal/heads.h). A checkpoint counts
// only if it opens with a key of the anchored key chain (`keys`) under the chain's origin and,
// when `policy` has witnesses, carries `quorum` cosignatures by them (else it is skipped, and
// reported as an invalid head when it does not verify). The database must then hold the chain
// up to the checkpoint's size with the checkpoint's root at that size (from the tiles, or the
// journal when they do not reach it); otherwise a finding names the sizes. Each checkpoint that
// holds is returned as a head (seq = its size, the event hash there) for the ChainGuard. A
// checkpoint smaller than the size this deployment published (tlog_state.published_size) is
// named as an invalid checkpoint: the object store was rolled back (RepublishTlog repairs it).
Status CheckPublishedCheckpoints(db::Pool& pool, blob::ObjectStore& store, const TrustedKeys& keys,
                                 const std::string& deployment_origin, const WitnessPolicy& policy,
                                 const std::vector<std::string>& tenants, ForkCheck* out);

// Runs PublishTlogs every `interval` (`oml serve`). None of the pointers is owned.
class TlogPublisher {
 public:
  // `on_fork(tenant, what)` is called for each chain found forked (`oml serve`: the ChainGuard
  // closes it); `witnesses` may be empty; `sizes` carries what the startup check learned.
  TlogPublisher(db::Pool* pool, blob::ObjectStore* store, std::string deployment_origin, const crypto::SigningKey* key,
                std::chrono::milliseconds interval, WitnessPolicy witnesses = {}, WitnessSizes sizes = {},
                std::function<void(const std::string&, const std::string&)> on_fork = nullptr);
  ~TlogPublisher();

 private:
  void RunOnce();
  std::map<std::string, std::chrono::steady_clock::time_point> logged_;  // only RunOnce (one thread)
  db::Pool* pool_;
  blob::ObjectStore* store_;
  const std::string origin_;
  const crypto::SigningKey* key_;
  const WitnessPolicy witnesses_;
  WitnessSizes sizes_;  // only RunOnce
  const std::function<void(const std::string&, const std::string&)> on_fork_;
  std::atomic<bool> stop_{false};
  PeriodicThread thread_;  // last: runs RunOnce
};

}  // namespace oml::journal
