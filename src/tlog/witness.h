// A C2SP tlog-witness (https://c2sp.org/tlog-witness): `oml witness` cosigns a log's checkpoint
// only if it is consistent with the last one it cosigned for that log (issue 23). A restore that
// lost the tail, or a split view, then fails at the witness (409), even if whoever rolled the
// database back also rolled back the published heads.
//
// add-checkpoint (POST <prefix>/add-checkpoint), answered as the spec says:
//   body    "old <size>\n", up to 63 base64 consistency-proof lines, "\n", the signed checkpoint
//   400     a malformed body, or an old size above the checkpoint's
//   404     a checkpoint of an origin this witness is not configured for
// A witness is configured with logs (an origin and its keys) and with deployments: a deployment
// origin D and its keys witness every log "D/<name>" (oml's per-tenant origins), each verified
// with the deployment key under the note key name "D/<name>", so tenants created later need no
// new configuration.
//   403     no signature by a key configured for that origin verifies
//   409     `old` is not the size last cosigned for that origin (body: that size and "\n",
//           Content-Type text/x.tlog.size), or the same size with another root
//   422     the consistency proof from the recorded checkpoint does not verify
//   200     one cosignature/v1 line (tlog/note.h) by the witness key, timestamped now; the new
//           checkpoint was recorded durably first
// The check of `old` and the record of the new checkpoint are one atomic step per origin (the
// spec's rollback race): serialized by a mutex in the process and an exclusive lock on the
// state directory across processes.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "crypto/crypto.h"
#include "tlog/note.h"

namespace oml::tlog {

// What the witness last cosigned for one log.
struct WitnessRecord {
  uint64_t size = 0;
  std::string root;        // 32 raw bytes
  std::string checkpoint;  // the note as submitted
};

// Durable state, one record per origin. Implementations must make Put durable before returning.
class WitnessState {
 public:
  virtual ~WitnessState() = default;
  virtual Result<std::optional<WitnessRecord>> Get(const std::string& origin) = 0;
  virtual Status Put(const std::string& origin, const WitnessRecord& record) = 0;
  // Held around each Get/Put pair (cross-process exclusion); the default does nothing.
  virtual Status Lock() { return Status::Ok(); }
  virtual void Unlock() {}
};

// Files in a directory: <dir>/<hex SHA-256 of the origin>, written to a temporary file, fsynced,
// renamed over the old one and the directory fsynced; <dir>/.lock is flock()ed while deciding.
class DirWitnessState : public WitnessState {
 public:
  // Creates the directory (0700) if missing.
  static Result<std::unique_ptr<DirWitnessState>> Open(const std::string& dir);
  ~DirWitnessState() override;
  Result<std::optional<WitnessRecord>> Get(const std::string& origin) override;
  Status Put(const std::string& origin, const WitnessRecord& record) override;
  Status Lock() override;
  void Unlock() override;

 private:
  explicit DirWitnessState(std::string dir, int lock_fd) : dir_(std::move(dir)), lock_fd_(lock_fd) {}
  std::string dir_;
  int lock_fd_;
};

struct WitnessAnswer {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
};

class Witness {
 public:
  // `logs`: origin -> the keys that sign its checkpoints. `name`: the witness's key name.
  // `deployments`: deployment origin -> the raw Ed25519 public keys that sign its logs'
  // checkpoints (see above; an exact entry in `logs` wins).
  Witness(std::map<std::string, std::vector<NoteKey>> logs, std::string name, const crypto::SigningKey* key,
          WitnessState* state, std::map<std::string, std::vector<std::string>> deployments = {});
  // Thread-safe. `now`: the cosignature's Unix time.
  WitnessAnswer AddCheckpoint(std::string_view body, uint64_t now);
  // The witness's verifier key for cosignature/v1 ("<name>+<hash>+<base64(0x04 || key)>").
  std::string VerifierKey() const;

 private:
  // The keys of the log `origin` (empty if this witness is not configured for it).
  std::vector<NoteKey> KeysOf(const std::string& origin) const;
  std::map<std::string, std::vector<NoteKey>> logs_;
  std::map<std::string, std::vector<std::string>> deployments_;
  std::string name_;
  const crypto::SigningKey* key_;
  WitnessState* state_;
  std::mutex mu_;
};

}  // namespace oml::tlog
