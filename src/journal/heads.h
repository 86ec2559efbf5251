// Signed heads published outside the database, and the fork check that reads them back.
//
// Object "oml-heads/<tenant uuid>" in the object store holds:
//   {"head": {"v":1,"tenant":..,"seq":..,"event_hash":hex,"key_id":..,"published_at":..},
//    "signature": base64 Ed25519 over the canonical JSON of "head"}
//
// Publishing: the HeadPublisher is told of every committed event (Journal commit listener) and
// publishes the newest head of each touched tenant every `interval` (default 200 ms), so a head
// is published at most about one interval plus one put after its commit, and never before it
// (only committed receipts reach it). It never overwrites a published head with a lower seq.
//
// Fork check (before `oml serve` accepts writes): for every tenant with a published head, the
// stored chain must reach the published seq and hold the published hash there. A head that is
// behind, or a different hash at the published seq, is a fork.
#pragma once

#include <atomic>
#include <condition_variable>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "blob/object_store.h"
#include "common/status.h"
#include "crypto/crypto.h"
#include "db/conn.h"
#include "journal/event.h"

namespace oml::journal {

struct SignedHead {
  std::string tenant;
  int64_t seq = 0;
  std::string event_hash;  // raw
  std::string key_id;
  std::string published_at;
};

std::string HeadKey(const std::string& tenant);
Result<std::string> EncodeSignedHead(const SignedHead& h, const crypto::SigningKey& key);
// Parses and checks the signature with the public key for h.key_id from `keys` (key_id -> raw).
Result<SignedHead> DecodeSignedHead(const std::string& bytes, const std::map<std::string, std::string>& keys);

class HeadPublisher {
 public:
  HeadPublisher(blob::ObjectStore* store, const crypto::SigningKey* key, int interval_ms);
  ~HeadPublisher();  // flushes pending heads, then stops
  void Start();
  // Thread-safe. Records a committed event; cheap.
  void OnCommit(const Receipt& r);
  // Publishes every pending head now (also used at shutdown).
  Status Flush();

 private:
  void Loop();
  blob::ObjectStore* store_;
  const crypto::SigningKey* key_;
  const int interval_ms_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::pair<int64_t, std::string>> pending_;  // GUARDED_BY(mu_)
  std::map<std::string, int64_t> published_;                        // publisher thread only
  std::mutex flush_mu_;
  bool stop_ = false;
  std::thread thread_;
};

struct ForkFinding {
  std::string tenant;
  int64_t published_seq = 0;
  int64_t stored_seq = 0;
  std::string what;
};

// Compares published heads with the database. Returns the findings (empty = no fork).
// `only` empty: every published head (startup, doctor). Otherwise just those tenants' heads
// (a CLI write checks the chains it is about to extend, in O(1) rather than O(tenants)); the
// caller must have resolved them (they are taken to exist in the database).
Result<std::vector<ForkFinding>> CheckForks(db::Pool& pool, blob::ObjectStore& store,
                                            const std::vector<std::string>& only = {});

}  // namespace oml::journal
