#include "journal/journal.h"

#include <algorithm>
#include <chrono>
#include <optional>

#include "common/log.h"
#include "common/metrics.h"
#include "common/sync_point.h"
#include "journal/bronze_row.h"
#include "merkle/merkle.h"

namespace oml::journal {
namespace {

using Clock = std::chrono::steady_clock;
double Since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// How far ahead of this server's clock a chain head's time may be before writes are refused.
constexpr int64_t kMaxHeadAheadSeconds = 60;

}  // namespace

Result<Journal::Txn> Journal::Begin() {
  OML_ASSIGN_OR_RETURN(db::Pool::Handle h, pool_->Acquire());
  return Txn(this, std::move(h));
}

Result<Receipt> Journal::Append(const std::string& tenant, const EventSpec& ev) {
  Waiter w{&ev};
  std::unique_lock<std::mutex> l(mu_);
  queues_[tenant].waiting.push_back(&w);
  for (;;) {
    if (w.result) return std::move(*w.result);
    // w is still queued, so the tenant's entry exists.
    TenantQueue* tq = &queues_[tenant];
    if (!tq->busy && tq->waiting.front() == &w) {
      // Lead: take every queued event of this tenant (FIFO, up to kMaxGroup) into one transaction.
      tq->busy = true;
      std::vector<Waiter*> group;
      std::vector<const EventSpec*> evs;
      while (!tq->waiting.empty() && group.size() < kMaxGroup) {
        group.push_back(tq->waiting.front());
        evs.push_back(tq->waiting.front()->ev);
        tq->waiting.pop_front();
      }
      l.unlock();
      std::vector<Result<Receipt>> results = RunGroup(tenant, evs);
      l.lock();
      // Results are published and waiters woken under mu_: a waiter that sees its result may
      // return (destroying its Waiter) only after this loop releases the lock.
      for (size_t i = 0; i < group.size(); ++i) {
        group[i]->result = std::move(results[i]);
        if (group[i] != &w) group[i]->cv.notify_one();
      }
      tq = &queues_[tenant];
      tq->busy = false;
      if (!tq->waiting.empty()) {
        tq->waiting.front()->cv.notify_one();  // the next leader
      } else {
        queues_.erase(tenant);
      }
      continue;  // w was at the front, so it was in the group and has its result
    }
    w.cv.wait(l);
  }
}

size_t Journal::QueueDepth(const std::string& tenant) {
  std::lock_guard<std::mutex> l(mu_);
  auto it = queues_.find(tenant);
  return it == queues_.end() ? 0 : it->second.waiting.size();
}

std::vector<Result<Receipt>> Journal::RunGroup(const std::string& tenant, const std::vector<const EventSpec*>& evs) {
  auto run = [&](const std::vector<const EventSpec*>& batch) -> Result<std::vector<Receipt>> {
    try {
      OML_ASSIGN_OR_RETURN(Txn tx, Begin());
      return tx.AppendMany(tenant, batch, /*commit_now=*/true);
    } catch (const std::exception& e) {
      return Internal(std::string("exception in append: ") + e.what());
    }
  };
  std::vector<Result<Receipt>> out;
  auto rs = run(evs);
  if (rs.ok()) {
    for (auto& r : *rs) out.emplace_back(std::move(r));
    return out;
  }
  // Split the group only when a statement before COMMIT definitely failed (so nothing
  // committed) — one event's constraint can then not fail its neighbours. A lost connection
  // (kUnavailable) leaves the outcome unknown: never retry, report it to every member.
  if (evs.size() == 1 || rs.status().code() == Code::kUnavailable) {
    for (size_t i = 0; i < evs.size(); ++i) out.emplace_back(rs.status());
    return out;
  }
  for (const EventSpec* ev : evs) {
    auto one = run({ev});
    if (one.ok()) out.emplace_back(std::move(one->front()));
    else out.emplace_back(one.status());
  }
  return out;
}

void Journal::Notify(const std::vector<Receipt>& rs) {
  for (const auto& r : rs) {
    Metrics::Get().ChainAppend();  // no tenant label (common/metrics.h): the tenant is in the log line
    log::Debug("event appended", {{"tenant", r.tenant}, {"seq", r.seq}});
    if (guard_) guard_->Observe(r.tenant, r.seq, r.event_hash);
    if (listener_) listener_(r);
  }
}

Journal::Txn::~Txn() {
  if (open_ && !done_) (void)Rollback();
}

Status Journal::Txn::Rollback() {
  done_ = true;
  auto r = conn_->Exec("ROLLBACK");
  return r.status();
}

Result<Receipt> Journal::Txn::Append(const std::string& tenant, const EventSpec& ev, bool commit_now) {
  OML_ASSIGN_OR_RETURN(std::vector<Receipt> rs, AppendMany(tenant, {&ev}, commit_now));
  return std::move(rs.front());
}

Result<std::vector<Receipt>> Journal::Txn::AppendMany(const std::string& tenant, const std::vector<const EventSpec*>& evs,
                                                      bool commit_now) {
  if (done_) return Internal("transaction already finished");
  if (evs.empty()) return Internal("AppendMany needs at least one event");
  const auto t0 = Clock::now();
  ChainGuard* guard = j_->guard_;
  if (guard) {
    if (auto why = guard->Closed(tenant)) {
      if (open_) (void)Rollback();
      return Unavailable("writes to this chain are refused: " + *why + " (run `oml doctor`)", "chain-fork");
    }
  }
  if (guard) guard->MaybeRefresh(tenant);  // what other replicas published
  const ChainGuard::Head known = guard ? guard->Known(tenant) : ChainGuard::Head{};
  // Round trip 1: scope, lock, head.
  std::vector<db::Stmt> rt1;
  // READ COMMITTED is required: the head must be read with a snapshot taken after the lock.
  if (!open_) rt1.push_back({"BEGIN ISOLATION LEVEL READ COMMITTED", {}});
  rt1.push_back(db::ScopeTo(tenant));
  rt1.push_back({"SELECT head_seq, head_hash, head_time, key_in_force, known_hash FROM oml.lock_head($1::uuid, $2)",
                 {db::Text(tenant), db::Int(known.seq)}, "oml_lock_head"});
  // The Merkle tree's right edge (sql/0029), read under the lock like the head.
  rt1.push_back({"SELECT tree_size, tree_edge FROM oml.chain_heads WHERE tenant_id = $1", {db::Text(tenant)},
                 "oml_tree_edge"});
  open_ = true;
  auto r1 = conn_->Pipeline(rt1);
  if (!r1.ok()) {
    (void)Rollback();
    return r1.status();
  }
  Metrics::Get().LockWait(Since(t0));
  const db::Rows& head = (*r1)[r1->size() - 2];
  const db::Rows& edge_row = r1->back();
  if (!head.IsNull(0, 3) && head.Get(0, 3) != j_->key_->key_id()) {
    (void)Rollback();
    return Unavailable("this server signs with " + j_->key_->key_id() + " but the key in force is " + head.Get(0, 3) +
                           "; install the current signing key and restart",
                       "signing-key-not-in-force");
  }
  const int64_t head_seq = head.GetInt(0, 0);
  // Fork check under the chain lock, before anything is signed: the chain must still hold the
  // newest event this process acknowledged or read as published.
  if (known.seq > 0) {
    std::string what;
    if (head_seq < known.seq) {
      what = "the stored chain head is at seq " + std::to_string(head_seq) + ", behind seq " + std::to_string(known.seq) +
             " that was acknowledged or published (the database lost committed events)";
    } else if (head.IsNull(0, 4) || head.GetBytes(0, 4) != known.event_hash) {
      what = "the stored event at seq " + std::to_string(known.seq) +
             " differs from the one that was acknowledged or published (the chain diverged)";
    }
    if (!what.empty()) {
      (void)Rollback();
      Metrics::Get().ChainIntegrity("fork-refused");
      guard->Close(tenant, what);
      return Unavailable("writes to this chain are refused: " + what + " (run `oml doctor`)", "chain-fork");
    }
  }
  // The tree goes on from the stored edge (caught up from the journal if a writer of the previous
  // version appended without it); a new chain starts an empty one; a chain whose tree is not
  // built yet (NULL edge) is left to BuildMissingTrees.
  std::optional<merkle::CompactRange> tree;
  if (head_seq == 0) {
    tree.emplace();
  } else if (edge_row.size() == 1 && !edge_row.IsNull(0, 0)) {
    auto decoded = merkle::CompactRange::Decode(static_cast<uint64_t>(edge_row.GetInt(0, 0)), edge_row.GetBytes(0, 1));
    if (decoded.ok() && decoded->size() <= static_cast<uint64_t>(head_seq)) {
      tree.emplace(std::move(decoded).value());
      if (tree->size() < static_cast<uint64_t>(head_seq)) {
        auto lag = conn_->Query("SELECT signed_bytes FROM oml.journal WHERE tenant_id = $1 AND seq > $2 AND seq <= $3 "
                                "ORDER BY seq",
                                {db::Text(tenant), db::Int(static_cast<int64_t>(tree->size())), db::Int(head_seq)});
        if (!lag.ok()) {
          (void)Rollback();
          return lag.status();
        }
        if (static_cast<uint64_t>(lag->size()) != static_cast<uint64_t>(head_seq) - tree->size()) {
          tree.reset();  // the journal has a gap: leave the tree to be rebuilt (verify names the gap)
        } else {
          for (int i = 0; i < lag->size(); ++i) tree->Append(merkle::HashLeaf(lag->GetBytes(i, 0)));
        }
      }
    } else {
      log::Warn("the stored Merkle edge does not fit the chain head: it is rebuilt from the journal",
                {{"tenant", tenant}, {"head_seq", head_seq}});
    }
  }
  int64_t seq = head_seq;
  std::string prev = head.IsNull(0, 1) ? kZeroHash : head.GetBytes(0, 1);
  // `time` never decreases along a chain (verify requires it), even across replicas whose clocks
  // disagree slightly: an event is stamped no earlier than the head before it.
  std::string prev_time = head.IsNull(0, 2) ? std::string() : head.Get(0, 2);
  // ... but never far into the future: a head stamped more than kMaxHeadAheadSeconds ahead of
  // this clock means a replica's clock (or the unsigned chain_heads.event_time) is wrong, and
  // following it would sign future times into the chain for ever.
  if (!prev_time.empty() && prev_time > TimestampFromNow(kMaxHeadAheadSeconds)) {
    (void)Rollback();
    return Unavailable("the chain's head is stamped " + prev_time + ", more than " +
                           std::to_string(kMaxHeadAheadSeconds) + " s ahead of this server's clock; check NTP",
                       "clock-skew");
  }

  // Round trip 2: per event, in commit-point order: journal row, fold rows, outbox row, head.
  std::vector<db::Stmt> rt2;
  std::vector<Receipt> out;
  // A fault point fires before its statement is sent: execute what precedes it, then roll back.
  auto fail_at = [&](Status st) -> Status {
    auto partial = conn_->Pipeline(rt2);
    if (!partial.ok()) log::Warn("statements before the fault failed", {{"error", partial.status().ToString()}});
    (void)Rollback();
    Metrics::Get().Commit(false, Since(t0));
    return st;
  };
  for (const EventSpec* ev : evs) {
    Envelope e;
    e.tenant = tenant;
    e.seq = ++seq;
    e.prev_hash = prev;
    e.type = ev->type;
    e.time = std::max(NowTimestamp(), prev_time);  // fixed-width UTC: string order is time order
    prev_time = e.time;
    e.key_id = j_->key_->key_id();
    e.principal = ev->principal;
    e.payload = ev->payload;
    e.refs = ev->refs.is_null() ? nlohmann::json::object() : ev->refs;
    auto signed_rc = SignEnvelope(e, *j_->key_);
    if (!signed_rc.ok()) {
      (void)Rollback();
      return signed_rc.status();
    }
    Receipt rc = std::move(signed_rc).value();
    prev = rc.event_hash;
    if (tree) tree->Append(merkle::HashLeaf(rc.signed_bytes));

    rt2.push_back({"INSERT INTO oml.journal (tenant_id, seq, prev_hash, event_hash, event_type, key_id, signed_bytes, "
                   "signature) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
                   {db::Text(tenant), db::Int(e.seq), db::Bytes(e.prev_hash), db::Bytes(rc.event_hash),
                    db::Text(e.type), db::Text(e.key_id), db::Bytes(rc.signed_bytes), db::Bytes(rc.signature)},
                   "oml_journal_insert"});
    if (!ev->api_key_hash.empty())
      rt2.push_back({"SELECT oml.require_live_api_key($1)", {db::Bytes(ev->api_key_hash)}, "oml_require_live_key"});
    if (ev->fold) {
      for (auto& st : ev->fold(e.seq)) rt2.push_back(std::move(st));
    }
    if (Status st = OML_SYNC_POINT("journal.after_journal_insert"); !st.ok()) return fail_at(st);
    rt2.push_back({"SELECT oml.enqueue_outbox_json($1, 'bronze/events', $2, $3::json)",
                   {db::Text(tenant), db::Int(e.seq),
                    db::Text(BronzeRow(e, rc.event_hash, rc.signed_bytes, rc.signature).dump())},
                   "oml_enqueue_bronze"});
    if (Status st = OML_SYNC_POINT("journal.after_outbox_insert"); !st.ok()) return fail_at(st);
    out.push_back(std::move(rc));
  }
  // The head and, in the same UPDATE, the tree's edge at the new head (sql/0029); a NULL edge
  // leaves the tree columns as they are.
  rt2.push_back({"SELECT oml.advance_head($1, $2, $3, $4, $5, $6, $7)",
                 {db::Text(tenant), db::Int(head_seq), db::Int(seq), db::Bytes(prev), db::Text(prev_time),
                  tree ? db::Int(static_cast<int64_t>(tree->size())) : db::Null(),
                  tree ? db::Bytes(tree->Encode()) : db::Null()},
                 "oml_advance_head"});
  if (!tree && edge_row.size() == 1 && !edge_row.IsNull(0, 0)) {  // an edge that did not fit: dropped
    rt2.push_back({"UPDATE oml.chain_heads SET tree_size = NULL, tree_edge = NULL WHERE tenant_id = $1",
                   {db::Text(tenant)}, "oml_tree_edge_reset"});
  }
  if (commit_now) rt2.push_back({"COMMIT", {}});
  auto r2 = conn_->Pipeline(rt2);
  if (!r2.ok()) {
    (void)Rollback();
    Metrics::Get().Commit(false, Since(t0));
    return r2.status();
  }
  if (!commit_now) {
    pending_.insert(pending_.end(), out.begin(), out.end());  // notified at Commit()
    return out;
  }
  done_ = true;
  Status verdict = conn_->CommitVerdict(r2->back());
  Metrics::Get().Commit(verdict.ok(), Since(t0));
  if (!verdict.ok()) return verdict;
  pending_.insert(pending_.end(), out.begin(), out.end());
  j_->Notify(pending_);
  pending_.clear();
  return out;
}

Result<std::vector<db::Rows>> Journal::Txn::Run(std::vector<db::Stmt> stmts) {
  if (done_) return Internal("transaction already finished");
  const bool began = !open_;
  if (began) stmts.insert(stmts.begin(), db::Stmt{"BEGIN ISOLATION LEVEL READ COMMITTED", {}});
  open_ = true;
  auto r = conn_->Pipeline(stmts);
  if (!r.ok()) {
    (void)Rollback();
    return r.status();
  }
  if (began) r->erase(r->begin());
  return r;
}

Status Journal::Txn::Commit() {
  if (done_) return Internal("transaction already finished");
  const auto t0 = Clock::now();
  done_ = true;
  auto r = conn_->Exec("COMMIT");
  Status verdict = r.ok() ? conn_->CommitVerdict(*r) : r.status();
  Metrics::Get().Commit(verdict.ok(), Since(t0));
  if (!verdict.ok()) return verdict;
  j_->Notify(pending_);
  pending_.clear();
  return Status::Ok();
}

}  // namespace oml::journal
