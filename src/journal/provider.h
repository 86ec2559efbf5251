// Deployment-level acts on the provider chain: genesis, signing keys, tenants.
//
// Provider chain (tenant kProviderTenant):
//   seq 1  chain.genesis   {"deployment": "oml"}
//   seq 2  key.issued      {"key_id", "public_key" (base64), "algorithm": "ed25519"}
//   ...    tenant.created  {"tenant_id", "name"}
//   ...    key.issued      (rotation; signed by the key it replaces)
// Customer tenant chain:
//   seq 1  chain.genesis   refs.provider = {tenant, seq, event_hash} of its tenant.created
#pragma once

#include <string>

#include "common/status.h"
#include "journal/journal.h"

namespace oml::journal {

struct TenantInfo {
  std::string tenant_id;
  std::string name;
};

// Creates the provider tenant, its genesis and key.issued for `journal.key()`. Idempotent:
// returns false (and does nothing) if the provider chain exists already.
Result<bool> InitProvider(Journal& journal);

// tenant.created on the provider chain + the tenant's genesis, in one transaction.
// kFailedPrecondition "tenant-exists" if the name is taken; kInvalidArgument on a bad name.
Result<TenantInfo> CreateTenant(Journal& journal, const std::string& name);

// Resolves a tenant name or uuid. kNotFound if unknown.
Result<TenantInfo> LookupTenant(db::Pool& pool, const std::string& name_or_id);
Result<std::vector<TenantInfo>> ListTenants(db::Pool& pool);  // provider first

// Journals key.issued for new_key on the provider chain, signed by journal.key() (the key in
// force), and retires the previous key at that event's time.
Result<Receipt> IssueKey(Journal& journal, const crypto::SigningKey& new_key);

// OK iff `key` is the signing key in force: journalled by key.issued and not retired since.
// kFailedPrecondition "signing-key-not-in-force" otherwise (a replica with a stale or
// never-issued key file would sign events that `oml verify` rejects).
Status CheckSigningKeyInForce(db::Pool& pool, const crypto::SigningKey& key);

// Creates an API key for (tenant, principal, role); returns the bearer token (shown once).
// The token is "oml_" + base64url(32 random bytes); only SHA-256(token) is stored.
Result<std::string> CreateApiKey(db::Pool& pool, const std::string& tenant_id, const std::string& principal,
                                 const std::string& role);

// Short id of an API key for journal payloads: "ak_" + first 16 hex of SHA-256(token).
std::string ApiKeyId(const std::string& token_hash_raw);

}  // namespace oml::journal
