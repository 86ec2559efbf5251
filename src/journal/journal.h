// The commit point (D1): appending signed events to a tenant's chain.
//
// One PostgreSQL transaction per write (or per group of queued writes to one tenant, see
// Append), two round trips:
//   round trip 1  BEGIN; set_config('oml.tenant_id', T, true); oml.lock_head(T, known seq)
//                 -> rotation lock (shared) and pg_advisory_xact_lock on T (both held to
//                 commit); the head (seq, hash, time), the key in force, and the stored hash at
//                 the seq the ChainGuard knows (fork check before signing)
//   (client)      envelope(seq = head+1, prev = head hash, time = max(now, head time)) ->
//                 canonical signed bytes, event_hash = SHA-256, Ed25519 signature
//   round trip 2  INSERT journal; fold rows; oml.enqueue_outbox(bronze row); oml.advance_head;
//                 COMMIT
// A write is durable iff that COMMIT returns; only then is a Receipt returned, and only then is
// the commit listener (the signed-head publisher) told. Because the advisory lock is held to
// commit, each tenant's commits become visible in seq order.
//
// Fault points (common/sync_point.h): "journal.after_journal_insert" and
// "journal.after_outbox_insert". When one fires, the statements before it are executed for real
// and the transaction is rolled back: no journal, fold or outbox row survives and the chain seq
// is not consumed.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "crypto/crypto.h"
#include "db/conn.h"
#include "journal/chain_guard.h"
#include "journal/event.h"

namespace oml::journal {

// One event to append. `fold` returns the fold-state statements for the assigned seq; they run
// in the same transaction, after the journal insert and before the outbox insert.
// `api_key_hash` (SHA-256 of the caller's token; empty for operator and system acts): the event
// is written only if that API key is still live, checked in the same transaction under the chain
// lock (oml.require_live_api_key, SQLSTATE OMKEY -> kUnauthenticated), so no event by a key can
// follow its api_key.revoked.
struct EventSpec {
  std::string type;
  std::string principal;
  nlohmann::json payload = nlohmann::json::object();
  nlohmann::json refs = nlohmann::json::object();
  std::function<std::vector<db::Stmt>(int64_t seq)> fold;
  std::string api_key_hash;
};

class Journal {
 public:
  // Neither pointer is owned; both must outlive the Journal.
  Journal(db::Pool* pool, const crypto::SigningKey* key) : pool_(pool), key_(key) {}
  db::Pool& pool() const { return *pool_; }

  // Called after every successful COMMIT, once per event, in commit order per tenant.
  void SetCommitListener(std::function<void(const Receipt&)> fn) { listener_ = std::move(fn); }

  // The fork guard (not owned; may be null, then nothing is checked). With a guard, every
  // append (1) is refused with kUnavailable "chain-fork" while the guard has the tenant (or the
  // provider chain) closed; (2) passes the guard's highest known (seq, hash) of the tenant to
  // oml.lock_head and refuses, closing the tenant, when the locked head is behind that seq or the
  // stored event at that seq has another hash — before anything is signed; (3) reports every
  // committed receipt to the guard. Set before the first Append.
  void SetChainGuard(ChainGuard* guard) { guard_ = guard; }
  ChainGuard* chain_guard() const { return guard_; }

  // Appends one event to `tenant`'s chain; returns once it is committed.
  //
  // Group commit: while a transaction for `tenant` is in flight, further Append calls for that
  // tenant queue up; the next leader takes all of them (FIFO, at most kMaxGroup) into ONE
  // transaction: one lock/head round trip, then every event's rows in one pipelined round trip.
  // Each event still gets its own seq, signature and receipt, and no caller returns before the
  // COMMIT that made its event durable. If the group's transaction fails, each event is retried
  // alone so one bad event cannot fail its neighbours. Thread-safe.
  Result<Receipt> Append(const std::string& tenant, const EventSpec& ev);
  static constexpr size_t kMaxGroup = 64;
  // Appends of `tenant` waiting for the next group (not counting a group in flight).
  size_t QueueDepth(const std::string& tenant);

  // A transaction that may append to several chains (tenant creation writes the provider chain
  // and the new tenant's genesis atomically). Lock order: chains in the order appended.
  // Move-only; rolls back on destruction unless committed.
  class Txn {
   public:
    Txn(Journal* j, db::Pool::Handle conn) : j_(j), conn_(std::move(conn)) {}
    Txn(Txn&& o) noexcept
        : j_(o.j_), conn_(std::move(o.conn_)), open_(o.open_), done_(o.done_), pending_(std::move(o.pending_)) {
      o.done_ = true;  // the moved-from Txn must not roll back
    }
    Txn& operator=(Txn&&) = delete;
    ~Txn();
    // REQUIRES: the previous Append returned OK. With commit_now the COMMIT rides in round trip 2.
    Result<Receipt> Append(const std::string& tenant, const EventSpec& ev, bool commit_now = false);
    // Appends several events to one chain under one lock acquisition (consecutive seqs).
    Result<std::vector<Receipt>> AppendMany(const std::string& tenant, const std::vector<const EventSpec*>& evs,
                                            bool commit_now = false);
    Status Commit();
    // Runs statements inside this transaction (BEGIN first if not yet open), one round trip.
    Result<std::vector<db::Rows>> Run(std::vector<db::Stmt> stmts);
    db::Conn& conn() { return *conn_; }

   private:
    Status Rollback();
    Journal* j_;
    db::Pool::Handle conn_;
    bool open_ = false;
    bool done_ = false;
    std::vector<Receipt> pending_;
  };
  Result<Txn> Begin();

  const crypto::SigningKey& key() const { return *key_; }

 private:
  struct Waiter {
    const EventSpec* ev;
    std::optional<Result<Receipt>> result;  // GUARDED_BY(mu_)
    std::condition_variable cv;
  };
  struct TenantQueue {
    std::deque<Waiter*> waiting;  // FIFO
    bool busy = false;            // a leader is running a group for this tenant
  };
  // Runs one group; one result per event, in order. Never throws.
  std::vector<Result<Receipt>> RunGroup(const std::string& tenant, const std::vector<const EventSpec*>& evs);
  void Notify(const std::vector<Receipt>& rs);

  std::mutex mu_;
  std::unordered_map<std::string, TenantQueue> queues_;  // GUARDED_BY(mu_)
  db::Pool* pool_;
  const crypto::SigningKey* key_;
  std::function<void(const Receipt&)> listener_;
  ChainGuard* guard_ = nullptr;
};

}  // namespace oml::journal
