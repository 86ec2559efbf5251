#include "admission/kek_rotation.h"

#include "admission/claims.h"
#include "common/log.h"
#include "common/sync_point.h"
#include "journal/provider.h"
#include "uploads/uploads.h"

namespace oml::admission {
namespace {

// Session advisory lock key of `oml kek rotate` ("omlkek" in ASCII).
constexpr int64_t kRotationLockKey = 0x6f6d6c6b656bLL;
const char kNilUuid[] = "00000000-0000-0000-0000-000000000000";

// The tables that hold wrapped DEKs. Each row's DEK is wrapped under aad(tenant, id); rows
// without a DEK (wrapped_dek and kek_id NULL) are never selected (NULL <> x is not true).
struct KeyTable {
  const char* table;  // in schema oml
  const char* id;     // the row's uuid id column
  std::string (*aad)(const std::string& tenant, const std::string& id);
};
const KeyTable kKeyTables[] = {
    {"artifact_keys", "artifact_id", &DekAad},
    // Upload sessions (sql/0011): active and complete sessions hold a DEK; final others none.
    {"upload_sessions", "upload_id", &uploads::UploadDekAad},
    // Attachments (sql/0013): the DEK moves here from its upload session when a claim attaches it.
    {"attachment_keys", "upload_id", &uploads::UploadDekAad},
};

// Rows of `tenant` not under `kek_id`, per kek_id, in every key table.
Result<std::map<std::string, int64_t>> CountOthers(db::Pool& pool, const std::string& tenant, const std::string& kek_id) {
  std::map<std::string, int64_t> out;
  for (const KeyTable& kt : kKeyTables) {
    OML_ASSIGN_OR_RETURN(db::Pool::Handle c, pool.Acquire());
    OML_ASSIGN_OR_RETURN(db::Rows r, c->Scoped(tenant, {std::string("SELECT kek_id, count(*) FROM oml.") + kt.table +
                                                            " WHERE tenant_id = $1 AND kek_id <> $2 GROUP BY kek_id",
                                                        {db::Text(tenant), db::Text(kek_id)}}));
    for (int i = 0; i < r.size(); ++i) out[r.Get(i, 0)] += r.GetInt(i, 1);
  }
  return out;
}

// The kek_id of the provider chain's latest kek.rotated event; "" if there is none.
Result<std::string> LastRotatedTo(db::Pool& pool) {
  OML_ASSIGN_OR_RETURN(db::Pool::Handle c, pool.Acquire());
  OML_ASSIGN_OR_RETURN(db::Rows r, c->Scoped(journal::kProviderTenant,
                                             {"SELECT signed_bytes FROM oml.journal WHERE tenant_id = $1 "
                                              "AND event_type = 'kek.rotated' ORDER BY seq DESC LIMIT 1",
                                              {db::Text(journal::kProviderTenant)}}));
  if (r.size() == 0) return std::string();
  OML_ASSIGN_OR_RETURN(journal::Envelope e, journal::Envelope::FromSignedBytes(r.GetBytes(0, 0)));
  const auto& id = e.payload.value("kek_id", nlohmann::json());
  return id.is_string() ? id.get<std::string>() : std::string();
}

// Rolls back an open transaction on every early return.
struct TxnGuard {
  db::Conn& c;
  bool open = true;
  ~TxnGuard() {
    if (open) (void)c.Exec("ROLLBACK");
  }
};

}  // namespace

Result<KekRotationReport> RotateKek(journal::Journal& journal, const crypto::KekProvider& target,
                                    const crypto::KekProvider& sources, const KekRotationOptions& opts) {
  if (opts.batch_size < 1) return InvalidArgument("batch size must be at least 1");
  db::Pool& pool = journal.pool();
  KekRotationReport rep;
  rep.kek_id = target.kek_id();

  // One run at a time, for the whole run (session lock on a connection kept to the end).
  OML_ASSIGN_OR_RETURN(db::Pool::Handle lock, pool.Acquire());
  OML_ASSIGN_OR_RETURN(db::Rows got, lock->Query("SELECT pg_try_advisory_lock($1)", {db::Int(kRotationLockKey)}));
  if (got.Get(0, 0) != "t") return FailedPrecondition("another `oml kek rotate` is running", "kek-rotation-running");
  struct Unlock {
    db::Conn& c;
    ~Unlock() { (void)c.Query("SELECT pg_advisory_unlock($1)", {db::Int(kRotationLockKey)}); }
  } unlock{*lock};

  std::map<std::string, int64_t> unknown;  // kek_id -> rows no loaded KEK unwraps
  OML_ASSIGN_OR_RETURN(auto tenants, journal::ListTenants(pool));
  for (const auto& t : tenants) {
    for (const KeyTable& kt : kKeyTables) {
      std::string cursor = kNilUuid;
      for (;;) {
        OML_ASSIGN_OR_RETURN(db::Pool::Handle c, pool.Acquire());
        TxnGuard txn{*c};  // declared after the handle: rolls back before the connection goes back
        OML_ASSIGN_OR_RETURN(auto rs, c->Pipeline({{"BEGIN", {}},
                                                   db::ScopeTo(t.tenant_id),
                                                   {std::string("SELECT ") + kt.id + ", kek_id, wrapped_dek FROM oml." + kt.table +
                                                        " WHERE tenant_id = $1 AND kek_id <> $2 AND " + kt.id +
                                                        " > $3::uuid ORDER BY " + kt.id + " LIMIT $4 FOR UPDATE",
                                                    {db::Text(t.tenant_id), db::Text(rep.kek_id), db::Text(cursor),
                                                     db::Int(opts.batch_size)}}}));
        const db::Rows& rows = rs[2];
        if (rows.size() == 0) break;  // TxnGuard rolls the empty transaction back
        cursor = rows.Get(rows.size() - 1, 0);
        std::vector<db::Stmt> updates;
        std::map<std::string, int64_t> batch_from;
        for (int i = 0; i < rows.size(); ++i) {
          const std::string artifact = rows.Get(i, 0), old_id = rows.Get(i, 1);
          const crypto::KekProvider* from = target.Holds(old_id) ? &target : sources.Holds(old_id) ? &sources : nullptr;
          if (from == nullptr) {
            ++unknown[old_id];
            continue;
          }
          const std::string aad = kt.aad(t.tenant_id, artifact);
          auto dek = from->UnwrapFrom(old_id, rows.GetBytes(i, 2), aad);
          if (!dek.ok())
            return Status(dek.status().code(),
                          "tenant " + t.name + " " + kt.table + " " + artifact + ": DEK recorded under " + old_id +
                              " does not unwrap: " + dek.status().message(),
                          dek.status().type());
          auto wrapped = target.Wrap(dek->view(), aad);
          dek->Wipe();
          if (!wrapped.ok()) return wrapped.status();
          // Guarded by the old id: the row is locked, so it still holds what was read.
          updates.push_back({std::string("WITH u AS (UPDATE oml.") + kt.table + " SET kek_id = $3, wrapped_dek = $4 "
                             "WHERE tenant_id = $1 AND " + kt.id + " = $2 AND kek_id = $5 RETURNING 1) "
                             "SELECT 1/count(*) FROM u",
                             {db::Text(t.tenant_id), db::Text(artifact), db::Text(rep.kek_id), db::Bytes(*wrapped),
                              db::Text(old_id)}});
          ++batch_from[old_id];
        }
        if (updates.empty()) continue;  // only rows under unknown KEKs: rolled back, next batch
        updates.push_back({"COMMIT", {}});
        auto done = c->Pipeline(updates);
        if (!done.ok()) return done.status();
        txn.open = false;
        OML_RETURN_IF_ERROR(c->CommitVerdict(done->back()));
        ++rep.batches;
        for (const auto& [id, n] : batch_from) {
          rep.rewrapped_from[id] += n;
          rep.rewrapped += n;
        }
        log::Info("kek rotation batch committed", {{"tenant", t.name}, {"rewrapped", static_cast<int64_t>(updates.size() - 1)},
                                                   {"total", rep.rewrapped}});
        OML_RETURN_IF_ERROR(OML_SYNC_POINT("kek.rotate.after_batch"));
      }
    }
  }

  if (!unknown.empty()) {
    std::string list;
    for (const auto& [id, n] : unknown) list += (list.empty() ? "" : ", ") + id + " (" + std::to_string(n) + ")";
    return FailedPrecondition("DEKs are wrapped under KEKs this run does not hold: " + list + "; " +
                                  std::to_string(rep.rewrapped) +
                                  " others were re-wrapped. Pass those KEK files with --old-kek-file and run again",
                              "kek-unavailable");
  }
  // Completion: nothing left under another KEK in any tenant (including tenants created meanwhile).
  int64_t left = 0;
  OML_ASSIGN_OR_RETURN(tenants, journal::ListTenants(pool));
  for (const auto& t : tenants) {
    OML_ASSIGN_OR_RETURN(auto others, CountOthers(pool, t.tenant_id, rep.kek_id));
    for (const auto& [id, n] : others) left += n;
    for (const KeyTable& kt : kKeyTables) {
      OML_ASSIGN_OR_RETURN(db::Pool::Handle c, pool.Acquire());
      OML_ASSIGN_OR_RETURN(db::Rows r, c->Scoped(t.tenant_id, {std::string("SELECT count(*) FROM oml.") + kt.table +
                                                                   " WHERE tenant_id = $1 AND kek_id = $2",
                                                               {db::Text(t.tenant_id), db::Text(rep.kek_id)}}));
      rep.keys += r.GetInt(0, 0);
    }
  }
  if (left > 0)
    return FailedPrecondition(std::to_string(left) +
                                  " DEKs were wrapped under another KEK while the rotation ran (is a server still "
                                  "configured with the old kek_file?); configure kek_file = the new KEK and run again",
                              "kek-rotation-incomplete");

  OML_ASSIGN_OR_RETURN(std::string last, LastRotatedTo(pool));
  if (rep.rewrapped == 0 && last == rep.kek_id) return rep;  // journalled by an earlier run
  nlohmann::json from = nlohmann::json::object();
  for (const auto& [id, n] : rep.rewrapped_from) from[id] = n;
  journal::EventSpec ev{"kek.rotated", "operator",
                        {{"kek_id", rep.kek_id}, {"rewrapped_from", from}, {"rewrapped", rep.rewrapped}, {"keys", rep.keys}},
                        nlohmann::json::object(), nullptr};
  OML_ASSIGN_OR_RETURN(journal::Receipt rc, journal.Append(journal::kProviderTenant, ev));
  rep.receipt = rc;
  return rep;
}

}  // namespace oml::admission
