#include "journal/journal.h"

#include <chrono>

#include "common/log.h"
#include "common/metrics.h"
#include "common/sync_point.h"

namespace oml::journal {
namespace {

using Clock = std::chrono::steady_clock;
double Since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

nlohmann::json BronzeRow(const Envelope& e, const std::string& hash, const std::string& signed_bytes,
                         const std::string& sig) {
  return {{"tenant_id", e.tenant},          {"seq", e.seq},
          {"prev_hash", crypto::Hex(e.prev_hash)}, {"event_hash", crypto::Hex(hash)},
          {"event_type", e.type},           {"key_id", e.key_id},
          {"principal", e.principal},       {"occurred_at", e.time},
          {"signed_bytes", crypto::Base64(signed_bytes)}, {"signature", crypto::Base64(sig)}};
}

}  // namespace

Result<Journal::Txn> Journal::Begin() {
  OML_ASSIGN_OR_RETURN(db::Pool::Handle h, pool_->Acquire());
  return Txn(this, std::move(h));
}

Result<Receipt> Journal::Append(const std::string& tenant, const EventSpec& ev) {
  OML_ASSIGN_OR_RETURN(Txn tx, Begin());
  return tx.Append(tenant, ev, /*commit_now=*/true);
}

void Journal::Notify(const std::vector<Receipt>& rs) {
  for (const auto& r : rs) {
    Metrics::Get().ChainAppend(r.tenant);
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
  if (done_) return Internal("transaction already finished");
  const auto t0 = Clock::now();
  // Round trip 1: scope, lock, head.
  std::vector<db::Stmt> rt1;
  if (!open_) rt1.push_back({"BEGIN", {}});
  rt1.push_back({"SELECT set_config('oml.tenant_id', $1, true)", {db::Text(tenant)}});
  rt1.push_back({"SELECT head_seq, head_hash FROM oml.lock_head($1::uuid)", {db::Text(tenant)}});
  open_ = true;
  auto r1 = conn_->Pipeline(rt1);
  if (!r1.ok()) {
    (void)Rollback();
    return r1.status();
  }
  Metrics::Get().LockWait(Since(t0));
  const db::Rows& head = r1->back();
  Envelope e;
  e.tenant = tenant;
  e.seq = head.GetInt(0, 0) + 1;
  e.prev_hash = head.IsNull(0, 1) ? kZeroHash : head.GetBytes(0, 1);
  e.type = ev.type;
  e.time = NowTimestamp();
  e.key_id = j_->key_->key_id();
  e.principal = ev.principal;
  e.payload = ev.payload;
  e.refs = ev.refs.is_null() ? nlohmann::json::object() : ev.refs;
  auto signed_bytes = e.SignedBytes();
  if (!signed_bytes.ok()) {
    (void)Rollback();
    return signed_bytes.status();
  }
  Receipt rc;
  rc.tenant = tenant;
  rc.seq = e.seq;
  rc.prev_hash = e.prev_hash;
  rc.signed_bytes = *signed_bytes;
  rc.event_hash = crypto::Sha256(rc.signed_bytes);
  rc.signature = j_->key_->Sign(rc.signed_bytes);
  rc.key_id = e.key_id;

  // Round trip 2, statement by statement in commit-point order.
  std::vector<db::Stmt> rt2;
  rt2.push_back({"INSERT INTO oml.journal (tenant_id, seq, prev_hash, event_hash, event_type, key_id, signed_bytes, "
                 "signature) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
                 {db::Text(tenant), db::Int(e.seq), db::Bytes(e.prev_hash), db::Bytes(rc.event_hash),
                  db::Text(e.type), db::Text(e.key_id), db::Bytes(rc.signed_bytes), db::Bytes(rc.signature)}});
  if (ev.fold) {
    for (auto& s : ev.fold(e.seq)) rt2.push_back(std::move(s));
  }
  // A fault point fires before its statement is sent: execute what precedes it, then roll back.
  auto fail_at = [&](Status st) -> Status {
    auto partial = conn_->Pipeline(rt2);
    if (!partial.ok()) log::Warn("statements before the fault failed", {{"error", partial.status().ToString()}});
    (void)Rollback();
    Metrics::Get().Commit(false, Since(t0));
    return st;
  };
  if (Status st = OML_SYNC_POINT("journal.after_journal_insert"); !st.ok()) return fail_at(st);
  rt2.push_back({"SELECT oml.enqueue_outbox($1, 'bronze/events', $2, $3::jsonb)",
                 {db::Text(tenant), db::Int(e.seq), db::Text(BronzeRow(e, rc.event_hash, rc.signed_bytes, rc.signature).dump())}});
  if (Status st = OML_SYNC_POINT("journal.after_outbox_insert"); !st.ok()) return fail_at(st);
  rt2.push_back({"SELECT oml.advance_head($1, $2, $3)", {db::Text(tenant), db::Int(e.seq), db::Bytes(rc.event_hash)}});
  if (commit_now) rt2.push_back({"COMMIT", {}});
  auto r2 = conn_->Pipeline(rt2);
  if (!r2.ok()) {
    (void)Rollback();
    Metrics::Get().Commit(false, Since(t0));
    return r2.status();
  }
  pending_.push_back(rc);
  if (commit_now) {
    done_ = true;
    Metrics::Get().Commit(true, Since(t0));
    j_->Notify(pending_);
    pending_.clear();
  }
  return rc;
}

Result<std::vector<db::Rows>> Journal::Txn::Run(std::vector<db::Stmt> stmts) {
  if (done_) return Internal("transaction already finished");
  const bool began = !open_;
  if (began) stmts.insert(stmts.begin(), db::Stmt{"BEGIN", {}});
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
  auto r = conn_->Exec("COMMIT");
  done_ = true;
  Metrics::Get().Commit(r.ok(), Since(t0));
  if (!r.ok()) return r.status();
  j_->Notify(pending_);
  pending_.clear();
  return Status::Ok();
}

}  // namespace oml::journal
