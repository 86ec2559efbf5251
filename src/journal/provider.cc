#include "journal/provider.h"

#include <regex>

#include "fields/fields.h"
#include "crypto/crypto.h"
#include "journal/canonical_json.h"

namespace oml::journal {

std::string ApiKeyId(const std::string& token_hash_raw) { return "ak_" + crypto::Hex(token_hash_raw).substr(0, 16); }

Result<IssuedKey> ParseKeyIssued(const Envelope& e) {
  const auto& p = e.payload;
  const Status malformed = DataLoss("key.issued payload has a malformed public key or key id");
  if (!p.is_object() || !p.value("public_key", nlohmann::json()).is_string() || !p.value("key_id", nlohmann::json()).is_string())
    return malformed;
  IssuedKey k;
  k.key_id = p["key_id"].get<std::string>();
  auto raw = crypto::FromBase64(p["public_key"].get<std::string>());
  if (!raw.ok() || raw->size() != 32 || crypto::KeyIdFor(*raw) != k.key_id) return malformed;
  auto key = crypto::PublicKey::FromRaw(*raw);
  if (!key.ok()) return DataLoss("key.issued payload has a malformed public key: " + key.status().message());
  k.raw = *raw;
  k.key = *key;
  const auto& sup = p.value("supersedes", nlohmann::json());
  if (sup.is_string()) k.supersedes = sup.get<std::string>();
  return k;
}

Result<std::string> RotationStatement(int64_t seq, const std::string& prev_hash, const nlohmann::json& payload) {
  nlohmann::json vouched = payload;
  vouched.erase("binding");
  OML_ASSIGN_OR_RETURN(std::string body, Canonicalize({{"tenant", kProviderTenant},
                                                       {"seq", seq},
                                                       {"prev", crypto::Hex(prev_hash)},
                                                       {"payload", std::move(vouched)}}));
  return std::string(kRotationStatementDomain) + body;
}

Result<IssuedKey> CheckKeyIssued(const Envelope& e, const std::string& in_force,
                                 const std::function<bool(const std::string&)>& issued_before) {
  OML_ASSIGN_OR_RETURN(IssuedKey k, ParseKeyIssued(e));
  if (in_force.empty()) {
    // The first key signs its own issue (and the genesis before it).
    if (e.key_id != k.key_id) return DataLoss("key.issued is not signed by the key it issues (" + k.key_id + ")");
    return k;
  }
  if (k.key_id == in_force || issued_before(k.key_id))
    return DataLoss("key.issued issues " + k.key_id + " again; a key is issued once and a retirement is final");
  if (k.supersedes != in_force) return DataLoss("key.issued does not name the key it supersedes (" + in_force + ")");
  if (e.key_id != in_force) return DataLoss("key.issued is not signed by the key it supersedes (" + in_force + ")");
  const auto& heads = e.payload.value("retired_heads", nlohmann::json());
  if (!heads.is_object()) return DataLoss("key.issued lacks retired_heads (each chain's head at the rotation)");
  for (const auto& [tenant, seq] : heads.items()) {
    if (!seq.is_number_integer()) return DataLoss("key.issued retired_heads has a non-integer seq");
    k.retired_heads[tenant] = seq.get<int64_t>();
  }
  // The retired key signed everything above; only the new key can have signed the binding.
  const auto& binding = e.payload.value("binding", nlohmann::json());
  auto sig = binding.is_string() ? crypto::FromBase64(binding.get<std::string>()) : Result<std::string>(DataLoss(""));
  if (!sig.ok() || sig->size() != 64)
    return DataLoss("key.issued lacks the binding of the key it issues (" + k.key_id +
                    "): its retired_heads rest on the retired key alone (a rotation journalled before bindings "
                    "existed is refused)");
  auto statement = RotationStatement(e.seq, e.prev_hash, e.payload);
  if (!statement.ok() || !k.key.Verify(*statement, *sig))
    return DataLoss("key.issued binding does not verify under the key it issues (" + k.key_id +
                    "): its supersedes, retired_heads or place on the provider chain are not what that key signed");
  return k;
}

Result<bool> InitProvider(Journal& journal) {
  // One transaction under the provider chain lock: two concurrent inits serialize, and the
  // second sees the first one's genesis and does nothing.
  OML_ASSIGN_OR_RETURN(Journal::Txn tx, journal.Begin());
  OML_ASSIGN_OR_RETURN(auto rs, tx.Run({db::ScopeTo(kProviderTenant),
                                        {"SELECT head_seq FROM oml.lock_head($1::uuid)", {db::Text(kProviderTenant)}}}));
  if (rs[1].GetInt(0, 0) > 0) return false;  // Txn rolls back on destruction
  OML_RETURN_IF_ERROR(tx.Run({{"INSERT INTO oml.tenants (tenant_id, name) VALUES ($1, 'provider') ON CONFLICT DO NOTHING",
                               {db::Text(kProviderTenant)}}})
                          .status());
  EventSpec genesis{"chain.genesis", "system", {{"deployment", "oml"}}, nlohmann::json::object(), nullptr};
  OML_RETURN_IF_ERROR(tx.Append(kProviderTenant, genesis).status());
  const auto& key = journal.key();
  EventSpec issued{"key.issued", "system",
                   {{"key_id", key.key_id()}, {"public_key", crypto::Base64(key.public_key())}, {"algorithm", "ed25519"}},
                   nlohmann::json::object(), nullptr};
  std::string pub = key.public_key(), kid = key.key_id();
  issued.fold = [pub, kid](int64_t seq) -> std::vector<db::Stmt> {
    return {{"INSERT INTO oml.signing_keys (key_id, public_key, issued_seq, issued_at) VALUES ($1, $2, $3, now())",
             {db::Text(kid), db::Bytes(pub), db::Int(seq)}}};
  };
  OML_RETURN_IF_ERROR(tx.Append(kProviderTenant, issued).status());
  OML_RETURN_IF_ERROR(tx.Commit());
  return true;
}

Result<Receipt> IssueKey(Journal& journal, const crypto::SigningKey& new_key) {
  const std::string pub = new_key.public_key(), kid = new_key.key_id();
  OML_ASSIGN_OR_RETURN(Journal::Txn tx, journal.Begin());
  // Exclusive rotation lock first: every append in flight commits before, every later append
  // waits and then sees the new key in force. The heads read under it are exactly the events the
  // retiring key signed on each chain.
  // The provider head read under it is where the key.issued goes: the binding signs that place.
  OML_ASSIGN_OR_RETURN(auto rs, tx.Run({db::ScopeTo(kProviderTenant),
                                        {"SELECT issued_seq FROM oml.signing_keys WHERE key_id = $1", {db::Text(kid)}},
                                        {"SELECT tenant_id, seq FROM oml.begin_key_rotation()", {}},
                                        {"SELECT seq, event_hash FROM oml.chain_heads WHERE tenant_id = $1",
                                         {db::Text(kProviderTenant)}}}));
  if (rs[1].size() > 0)
    return FailedPrecondition("signing key " + kid + " was issued before (provider seq " + rs[1].Get(0, 0) +
                                  "); a key is issued once, and a retired key is never reinstated",
                              "signing-key-reused");
  if (rs[3].size() != 1) return FailedPrecondition("no provider chain: run `oml init` first");
  const int64_t at_seq = rs[3].GetInt(0, 0) + 1;
  const std::string prev = rs[3].GetBytes(0, 1);
  nlohmann::json heads = nlohmann::json::object();
  for (int i = 0; i < rs[2].size(); ++i) heads[rs[2].Get(i, 0)] = rs[2].GetInt(i, 1);
  nlohmann::json payload = {{"key_id", kid}, {"public_key", crypto::Base64(pub)}, {"algorithm", "ed25519"},
                            {"supersedes", journal.key().key_id()}, {"retired_heads", heads}};
  OML_ASSIGN_OR_RETURN(std::string statement, RotationStatement(at_seq, prev, payload));
  payload["binding"] = crypto::Base64(new_key.Sign(statement));
  EventSpec issued{"key.issued", "system", std::move(payload), nlohmann::json::object(), nullptr};
  issued.fold = [pub, kid](int64_t seq) -> std::vector<db::Stmt> {
    return {{"UPDATE oml.signing_keys SET retired_at = now() WHERE retired_at IS NULL", {}},
            {"INSERT INTO oml.signing_keys (key_id, public_key, issued_seq, issued_at) VALUES ($1, $2, $3, now())",
             {db::Text(kid), db::Bytes(pub), db::Int(seq)}}};
  };
  OML_ASSIGN_OR_RETURN(Receipt rc, tx.Append(kProviderTenant, issued));
  // The rotation lock keeps every append out, so the event lands where the binding says; if it
  // did not, the binding would not verify: roll back rather than journal it.
  if (rc.seq != at_seq || rc.prev_hash != prev)
    return Internal("key.issued landed at provider seq " + std::to_string(rc.seq) + ", not at the seq " +
                    std::to_string(at_seq) + " its binding signs");
  OML_RETURN_IF_ERROR(tx.Commit());
  return rc;
}

Status CheckSigningKeyInForce(db::Pool& pool, const crypto::SigningKey& key) {
  OML_ASSIGN_OR_RETURN(db::Pool::Handle c, pool.Acquire());
  // oml.key_in_force() is the one definition (lock_head uses it too).
  OML_ASSIGN_OR_RETURN(db::Rows r, c->Query("SELECT coalesce(oml.key_in_force(), ''), "
                                            "EXISTS (SELECT 1 FROM oml.signing_keys WHERE key_id = $1)",
                                            {db::Text(key.key_id())}));
  if (r.Get(0, 0) == key.key_id()) return Status::Ok();
  if (r.Get(0, 1) != "t")
    return FailedPrecondition("signing key " + key.key_id() + " was never issued on the provider chain (wrong key file?)",
                              "signing-key-not-in-force");
  return FailedPrecondition("signing key " + key.key_id() + " was retired by a rotation; install the current key file",
                            "signing-key-not-in-force");
}

Result<TenantInfo> CreateTenant(Journal& journal, const std::string& name) {
  OML_RETURN_IF_ERROR(fields::CheckTenantName(name));
  const std::string id = crypto::NewUuidV4();

  OML_ASSIGN_OR_RETURN(Journal::Txn tx, journal.Begin());
  EventSpec created{"tenant.created", "system", {{"tenant_id", id}, {"name", name}}, nlohmann::json::object(), nullptr};
  created.fold = [id, name](int64_t seq) -> std::vector<db::Stmt> {
    // The registry row is inserted in the new tenant's scope (RLS WITH CHECK).
    return {db::ScopeTo(id),
            {"INSERT INTO oml.tenants (tenant_id, name, created_seq) VALUES ($1, $2, $3)",
             {db::Text(id), db::Text(name), db::Int(seq)}},
            db::ScopeTo(kProviderTenant)};
  };
  auto rc = tx.Append(kProviderTenant, created);
  if (!rc.ok()) {
    if (db::IsViolationOf(rc.status(), "tenants_name_key"))
      return FailedPrecondition("tenant '" + name + "' exists already", "tenant-exists");
    return rc.status();
  }
  EventSpec genesis{"chain.genesis", "system", {{"tenant_id", id}, {"name", name}},
                    {{"provider", {{"tenant", kProviderTenant}, {"seq", rc->seq}, {"event_hash", crypto::Hex(rc->event_hash)}}}},
                    nullptr};
  OML_RETURN_IF_ERROR(tx.Append(id, genesis).status());
  OML_RETURN_IF_ERROR(tx.Commit());
  return TenantInfo{id, name};
}

Result<std::vector<TenantInfo>> ListTenants(db::Pool& pool) {
  OML_ASSIGN_OR_RETURN(db::Pool::Handle c, pool.Acquire());
  OML_ASSIGN_OR_RETURN(db::Rows rows, c->Scoped(kProviderTenant, {"SELECT tenant_id, name FROM oml.tenants "
                                                                  "ORDER BY created_seq NULLS FIRST, name",
                                                                  {}}));
  std::vector<TenantInfo> out;
  for (int i = 0; i < rows.size(); ++i) out.push_back({rows.Get(i, 0), rows.Get(i, 1)});
  return out;
}

Result<TenantInfo> LookupTenant(db::Pool& pool, const std::string& name_or_id) {
  OML_ASSIGN_OR_RETURN(auto all, ListTenants(pool));
  for (auto& t : all)
    if (t.name == name_or_id || t.tenant_id == name_or_id) return t;
  return NotFound("no tenant '" + name_or_id + "'", "tenant-not-found");
}

Result<NewApiKey> CreateApiKey(Journal& journal, const std::string& tenant_id, const std::string& principal,
                               const std::string& role) {
  if (tenant_id == kProviderTenant)
    return PermissionDenied("the provider tenant cannot have API keys: its chain records deployment acts, which only "
                            "the operator's commands write; create a tenant (`oml tenant create`) for API clients",
                            "provider-tenant");
  if (role != "writer" && role != "reviewer" && role != "admin")
    return InvalidArgument("role must be writer, reviewer or admin: '" + role + "'");
  if (!principal.empty()) OML_RETURN_IF_ERROR(fields::CheckPrincipal(principal));
  std::string b64 = crypto::Base64(crypto::RandomBytes(32));
  for (auto& ch : b64) ch = ch == '+' ? '-' : ch == '/' ? '_' : ch;
  while (!b64.empty() && b64.back() == '=') b64.pop_back();
  NewApiKey out;
  out.token = "oml_" + b64;
  const std::string hash = crypto::Sha256(out.token);
  out.key_id = ApiKeyId(hash);
  // No principal given: the key is its own ("<role>:<key id>"), so two such keys never share
  // own work or a reviewer's served files (issue 19).
  out.principal = principal.empty() ? role + ":" + out.key_id : principal;
  EventSpec ev{"api_key.created", "operator", {{"key_id", out.key_id}, {"principal", out.principal}, {"role", role}},
               nlohmann::json::object(), nullptr};
  ev.fold = [&](int64_t seq) -> std::vector<db::Stmt> {
    return {{"INSERT INTO oml.api_keys (key_hash, tenant_id, principal, role, created_seq) VALUES ($1, $2, $3, $4, $5)",
             {db::Bytes(hash), db::Text(tenant_id), db::Text(out.principal), db::Text(role), db::Int(seq)}}};
  };
  OML_ASSIGN_OR_RETURN(out.receipt, journal.Append(tenant_id, ev));
  return out;
}

Result<Receipt> RevokeApiKey(Journal& journal, const std::string& tenant_id, const std::string& key_id,
                             const std::string& reason) {
  static const std::regex kKeyId("^ak_[0-9a-f]{16}$");
  if (!std::regex_match(key_id, kKeyId)) return InvalidArgument("an API key id is ak_ and 16 hex digits: '" + key_id + "'");
  OML_RETURN_IF_ERROR(fields::CheckReason(reason));
  OML_ASSIGN_OR_RETURN(std::string prefix, crypto::FromHex(key_id.substr(3)));
  db::Rows live;
  {
    OML_ASSIGN_OR_RETURN(db::Pool::Handle c, journal.pool().Acquire());
    OML_ASSIGN_OR_RETURN(live, c->Scoped(tenant_id, {"SELECT key_hash, principal, role FROM oml.api_keys "
                                                     "WHERE tenant_id = $1 AND substr(key_hash, 1, 8) = $2 "
                                                     "AND revoked_at IS NULL",
                                                     {db::Text(tenant_id), db::Bytes(prefix)}}));
  }  // the connection goes back before ListApiKeys takes one
  if (live.size() == 0) {
    OML_ASSIGN_OR_RETURN(auto keys, ListApiKeys(journal.pool(), tenant_id));
    for (const auto& k : keys)
      if (k.key_id == key_id)
        return FailedPrecondition("API key " + key_id + " is revoked already" +
                                      (k.revoked_seq ? " (seq " + std::to_string(k.revoked_seq) + ")" : std::string()),
                                  "api-key-revoked");
    return NotFound("no API key " + key_id + " in this tenant", "api-key-not-found");
  }
  // Two live keys sharing 64 bits of SHA-256 do not happen; refuse rather than guess.
  if (live.size() > 1) return FailedPrecondition("key id " + key_id + " names more than one key", "api-key-ambiguous");
  const std::string hash = live.GetBytes(0, 0), principal = live.Get(0, 1), role = live.Get(0, 2);
  EventSpec ev{"api_key.revoked", "operator",
               {{"key_id", key_id}, {"principal", principal}, {"role", role}, {"reason", reason}},
               nlohmann::json::object(), nullptr};
  ev.fold = [&](int64_t seq) -> std::vector<db::Stmt> {
    // Guarded: if a concurrent revoke won, no row matches and 1/0 aborts this one (22012).
    return {{"WITH u AS (UPDATE oml.api_keys SET revoked_at = now(), revoked_seq = $3 "
             "WHERE tenant_id = $1 AND key_hash = $2 AND revoked_at IS NULL RETURNING 1) SELECT 1/count(*) FROM u",
             {db::Text(tenant_id), db::Bytes(hash), db::Int(seq)}}};
  };
  auto rc = journal.Append(tenant_id, ev);
  if (!rc.ok() && rc.status().type() == db::kZeroRowsGuard)
    return FailedPrecondition("API key " + key_id + " was revoked concurrently", "api-key-revoked");
  return rc;
}

Result<std::vector<ApiKeyInfo>> ListApiKeys(db::Pool& pool, const std::string& tenant_id) {
  OML_ASSIGN_OR_RETURN(db::Pool::Handle c, pool.Acquire());
  OML_ASSIGN_OR_RETURN(
      db::Rows r,
      c->Scoped(tenant_id,
                {"SELECT key_hash, principal, role, to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"'), "
                 "coalesce(to_char(revoked_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"'), ''), "
                 "coalesce(created_seq, 0), coalesce(revoked_seq, 0) "
                 "FROM oml.api_keys WHERE tenant_id = $1 ORDER BY created_at, key_hash",
                 {db::Text(tenant_id)}}));
  std::vector<ApiKeyInfo> out;
  for (int i = 0; i < r.size(); ++i)
    out.push_back({ApiKeyId(r.GetBytes(i, 0)), r.Get(i, 1), r.Get(i, 2), r.Get(i, 3), r.Get(i, 4), r.GetInt(i, 5), r.GetInt(i, 6)});
  return out;
}

}  // namespace oml::journal
