// Deployment-level acts on the provider chain: genesis, signing keys, tenants.
//
// Provider chain (tenant kProviderTenant):
//   seq 1  chain.genesis   {"deployment": "oml"}
//   seq 2  key.issued      {"key_id", "public_key" (base64), "algorithm": "ed25519"}
//   ...    tenant.created  {"tenant_id", "name"}
//   ...    key.issued      (rotation; signed by the key it replaces; + "supersedes" and
//                           "retired_heads": {tenant uuid: head seq at the rotation})
// Customer tenant chain:
//   seq 1  chain.genesis   refs.provider = {tenant, seq, event_hash} of its tenant.created
//   ...    api_key.created {"key_id", "principal", "role"}
//   ...    api_key.revoked {"key_id", "principal", "role", "reason"}
#pragma once

#include <string>

#include "common/status.h"
#include "journal/journal.h"

namespace oml::journal {

struct TenantInfo {
  std::string tenant_id;
  std::string name;
};

// The key a key.issued payload carries (the one parser of that payload: verify, the key chain
// behind published heads, and the folds pass all read it here). kDataLoss "key.issued payload
// has a malformed public key or key id" unless the payload is an object with string `key_id`
// and `public_key` (base64 of 32 bytes that form an Ed25519 key) and key_id == KeyIdFor(key).
struct IssuedKey {
  std::string key_id;
  std::string raw;         // 32 bytes
  crypto::PublicKey key;   // parsed once
  std::string supersedes;  // the key it retires; "" for the deployment's first key
};
Result<IssuedKey> ParseKeyIssued(const Envelope& e);

// Creates the provider tenant, its genesis and key.issued for `journal.key()`. Idempotent:
// returns false (and does nothing) if the provider chain exists already.
Result<bool> InitProvider(Journal& journal);

// tenant.created on the provider chain + the tenant's genesis, in one transaction.
// kFailedPrecondition "tenant-exists" if the name is taken; kInvalidArgument "invalid-field" on
// a bad name (admission::CheckTenantName).
Result<TenantInfo> CreateTenant(Journal& journal, const std::string& name);

// Resolves a tenant name or uuid. kNotFound if unknown.
Result<TenantInfo> LookupTenant(db::Pool& pool, const std::string& name_or_id);
Result<std::vector<TenantInfo>> ListTenants(db::Pool& pool);  // provider first

// Journals key.issued for new_key on the provider chain, signed by journal.key() (the key in
// force), and retires the previous key. Exclusive with every append (oml.begin_key_rotation):
// the payload's "retired_heads" records each chain's head seq at that moment, the last events
// the retiring key may have signed. kFailedPrecondition "signing-key-reused" if new_key was ever
// issued before (a retirement is final).
Result<Receipt> IssueKey(Journal& journal, const crypto::SigningKey& new_key);

// OK iff `key` is the signing key in force: journalled by key.issued and not retired since.
// kFailedPrecondition "signing-key-not-in-force" otherwise (a replica with a stale or
// never-issued key file would sign events that `oml verify` rejects).
Status CheckSigningKeyInForce(db::Pool& pool, const crypto::SigningKey& key);

// API keys. Creating and revoking one are acts on the tenant's chain: api_key.created and
// api_key.revoked are journalled by the operator ("operator" principal) in the same transaction
// as the api_keys row change, so no key exists, or stops working, without its fact.
struct NewApiKey {
  std::string token;   // "oml_" + base64url(32 random bytes): shown once; only SHA-256 is stored
  std::string key_id;  // ApiKeyId(): how events, logs and `oml key revoke` name the key
  Receipt receipt;     // of api_key.created
};
// kPermissionDenied "provider-tenant" for the provider tenant, which never has API keys (the
// database refuses them too, sql/0007). kInvalidArgument for a role other than writer/reviewer/admin, or "invalid-field" for a
// principal that breaks admission::CheckPrincipal (1..200 characters, UTF-8, no controls).
Result<NewApiKey> CreateApiKey(Journal& journal, const std::string& tenant_id, const std::string& principal,
                               const std::string& role);

// kInvalidArgument unless key_id is "ak_" + 16 hex, "invalid-field" for a reason that breaks
// admission::CheckReason (0..1024 characters, UTF-8, no controls); kNotFound
// "api-key-not-found" if the tenant has no such key; kFailedPrecondition "api-key-revoked" if it is revoked already (also when a
// concurrent revoke wins). Afterwards every write made with the token is refused (401) by its
// own transaction; reads are refused once the servers' 10 s key cache expires (at once on a
// server that refused a write with it).
Result<Receipt> RevokeApiKey(Journal& journal, const std::string& tenant_id, const std::string& key_id,
                             const std::string& reason);

struct ApiKeyInfo {
  std::string key_id, principal, role;
  std::string created_at, revoked_at;   // ISO 8601; revoked_at empty while the key works
  int64_t created_seq = 0, revoked_seq = 0;  // 0: none (created_seq 0 = made outside oml)
};
// The tenant's keys, oldest first.
Result<std::vector<ApiKeyInfo>> ListApiKeys(db::Pool& pool, const std::string& tenant_id);

// Short id of an API key for journal payloads: "ak_" + first 16 hex of SHA-256(token).
std::string ApiKeyId(const std::string& token_hash_raw);

}  // namespace oml::journal
