// Signed heads published outside the database, and the fork check that reads them back.
//
// Object "oml-heads/<tenant uuid>" in the object store holds (at most kMaxHeadBytes):
//   {"head": {"v":1,"tenant":..,"seq":..,"event_hash":hex,"key_id":..,"published_at":..},
//    "signature": base64 Ed25519 over the RFC 8785 canonical JSON of "head"}
//
// Trust root. A head document is accepted only if it is signed by a key of the key chain
// anchored in the deployment's root public key (LoadTrustedKeys): the provider chain's first
// key.issued must carry the root key and be signed by it, and every later key.issued must be
// signed by the key it supersedes and pass the key-chain rule every reader applies
// (CheckKeyIssued, journal/provider.h: among others, retired_heads bound by the key it issues).
// The `signing_keys` table is never consulted: the heads must stay independent of the store
// they witness.
//
// Publishing: the HeadPublisher is told of every committed event (Journal commit listener) and
// publishes the newest head of each touched tenant every `interval` (default 200 ms), so a head
// is published at most about one interval plus one put after its commit, and never before it.
// It replaces a published head only when the new head extends it: the journal row at the
// published seq still has the published hash (when the published document is still the one
// this process put last, its own commit path proved that already: see PublishOne). A published head the database does not extend
// (it lost its tail, or diverged) is never overwritten: publication for that tenant is refused,
// the ChainGuard closes the tenant, and a log line and a metric say so. A published document
// that does not verify (bad signature, unknown key, malformed, huge, deeply nested) is
// reported and repaired by publishing the current head over it.
//
// Fork check (before `oml serve` accepts writes, and in `oml doctor`): for every published
// head, the stored chain must reach the published seq and hold the published hash there.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "blob/object_store.h"
#include "common/status.h"
#include "crypto/crypto.h"
#include "db/conn.h"
#include "journal/chain_guard.h"
#include "journal/event.h"

namespace oml::journal {

// A head document larger than this, or nested deeper than kMaxHeadDepth, is refused unparsed.
inline constexpr size_t kMaxHeadBytes = 16 * 1024;
inline constexpr int kMaxHeadDepth = 4;

struct SignedHead {
  std::string tenant;
  int64_t seq = 0;
  std::string event_hash;  // raw
  std::string key_id;
  std::string published_at;
};

// key_id -> raw Ed25519 public key, for every key of the anchored key chain.
using TrustedKeys = std::map<std::string, std::string>;

// Walks the provider chain from genesis: every row must be in place and hash-linked to the one
// before, and each key.issued must be signed by the key it supersedes (the first: by itself, and
// carry root_public_key) and pass CheckKeyIssued. root_public_key empty: anchor on the first
// key.issued as stored (weaker; callers warn). Any break is kDataLoss: nothing after it could be
// trusted, and callers must not serve or repair heads on a partial key chain. An empty provider
// chain gives no keys.
Result<TrustedKeys> LoadTrustedKeys(db::Pool& pool, const std::string& root_public_key);

std::string HeadKey(const std::string& tenant);
// Where a head document that did not verify is kept when it is replaced: reported by `oml verify`
// and `oml doctor` until an operator inspects and deletes it.
std::string InvalidHeadKey(const std::string& tenant, const std::string& at);
inline const std::string kInvalidHeadsPrefix = "oml-heads-invalid/";
Result<std::string> EncodeSignedHead(const SignedHead& h, const crypto::SigningKey& key);
// Parses and checks the signature with the public key for h.key_id from `keys`. kDataLoss naming
// what is wrong; never throws, whatever the bytes.
Result<SignedHead> DecodeSignedHead(const std::string& bytes, const TrustedKeys& keys);
// The same with the signature check supplied (e.g. with keys parsed once): check(key_id, signed
// message, signature).
enum class HeadKeyVerdict { kValid, kUnknownKey, kBadSignature };
using HeadSignatureCheck = std::function<HeadKeyVerdict(const std::string&, const std::string&, const std::string&)>;
Result<SignedHead> DecodeSignedHeadWith(const std::string& bytes, const HeadSignatureCheck& check);

class HeadPublisher {
 public:
  // None of the pointers is owned; all must outlive the publisher. `guard` may be null.
  HeadPublisher(blob::ObjectStore* store, const crypto::SigningKey* key, int interval_ms, db::Pool* pool,
                ChainGuard* guard, TrustedKeys keys, std::string root_public_key);
  ~HeadPublisher();  // flushes pending heads, then stops
  void Start();
  // Thread-safe. Records a committed event; cheap.
  void OnCommit(const Receipt& r);
  // Publishes every pending head now (also used at shutdown). Returns the first error.
  Status Flush();
  // Reads `tenant`'s published head and records it in the guard (ChainGuard refresher). A head
  // that is missing, unreadable or does not verify is left to the publisher. Thread-safe.
  void RefreshGuard(const std::string& tenant);
  // Asks the publisher thread to RefreshGuard(tenant) at its next tick (every `interval`), so a
  // write does not wait for the object store. Cheap; thread-safe.
  void RequestRefresh(const std::string& tenant);
  // Publishes `head` over an invalid published document of its tenant (startup repair); the
  // invalid document is kept under kInvalidHeadsPrefix.
  Status Repair(const std::string& tenant, int64_t seq, const std::string& event_hash);

 private:
  void Loop();
  // Decides for one tenant; see the header comment.
  Status PublishOne(const std::string& tenant, int64_t seq, const std::string& hash);
  Result<SignedHead> Decode(const std::string& bytes);
  // The stored event hash at `seq` ("" if there is none).
  Result<std::string> StoredHash(const std::string& tenant, int64_t seq);
  Status Put(const std::string& tenant, int64_t seq, const std::string& hash);
  Status Quarantine(const std::string& tenant, const std::string& bytes);

  blob::ObjectStore* store_;
  const crypto::SigningKey* key_;
  const int interval_ms_;
  db::Pool* pool_;
  ChainGuard* guard_;
  std::mutex keys_mu_;  // keys_ is read by writers (RefreshGuard) and replaced by Flush
  TrustedKeys keys_;    // GUARDED_BY(keys_mu_)
  std::map<std::string, std::string> refreshed_docs_;  // GUARDED_BY(keys_mu_): last head verified per tenant
  const std::string root_;
  bool reloaded_this_flush_ = false;  // GUARDED_BY(flush_mu_)
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::pair<int64_t, std::string>> pending_;  // GUARDED_BY(mu_)
  std::map<std::string, int64_t> published_;                        // GUARDED_BY(flush_mu_)
  std::map<std::string, std::pair<std::string, int64_t>> own_docs_;  // GUARDED_BY(flush_mu_): last Put, seq
  std::vector<std::string> refresh_wanted_;                         // GUARDED_BY(mu_)
  std::mutex flush_mu_;
  bool stop_ = false;
  std::thread thread_;
};

struct ForkFinding {
  std::string tenant;
  int64_t published_seq = 0;
  int64_t stored_seq = 0;
  std::string what;
  // The published document itself does not verify (not a fork of the chain: the witness is
  // damaged or planted). `oml serve` repairs it; doctor reports it.
  bool invalid_head = false;
  // The finding is about the published checkpoint (journal/tlog_store.h
  // CheckPublishedCheckpoints), not the head document: an invalid one is not repaired by
  // publishing a head over it (the tlog publisher replaces it with its next checkpoint).
  bool checkpoint = false;
};

struct ForkCheck {
  std::vector<ForkFinding> findings;  // empty = no fork, no invalid head
  std::vector<SignedHead> heads;      // every published head that verified
};

// Compares published heads with the database. `only` empty: every published head (startup,
// doctor). Otherwise just those tenants' heads (a CLI write checks the chains it is about to
// extend, in O(1) rather than O(tenants)); the caller must have resolved them.
Result<ForkCheck> CheckForks(db::Pool& pool, blob::ObjectStore& store, const TrustedKeys& keys,
                             const std::vector<std::string>& only = {});

}  // namespace oml::journal
