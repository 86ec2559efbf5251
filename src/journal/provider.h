// Deployment-level acts on the provider chain: genesis, signing keys, tenants.
//
// Provider chain (tenant kProviderTenant):
//   seq 1  chain.genesis   {"deployment": "oml"}
//   seq 2  key.issued      {"key_id", "public_key" (base64), "algorithm": "ed25519"}
//   ...    tenant.created  {"tenant_id", "name"}
//   ...    key.issued      (rotation; signed by the key it replaces; + "supersedes",
//                           "retired_heads": {tenant uuid: head seq at the rotation} and
//                           "binding": the NEW key's signature over RotationStatement)
// Customer tenant chain:
//   seq 1  chain.genesis   refs.provider = {tenant, seq, event_hash} of its tenant.created
//   ...    api_key.created {"key_id", "principal", "role"}
//   ...    api_key.revoked {"key_id", "principal", "role", "reason"}
#pragma once

#include <functional>
#include <map>
#include <string>
#include <string_view>

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
  // A rotation's retired_heads (tenant uuid -> the last seq the retired key may have signed
  // there). Filled by CheckKeyIssued only, once the new key's binding verified.
  std::map<std::string, int64_t> retired_heads;
};
Result<IssuedKey> ParseKeyIssued(const Envelope& e);

// What a rotation's "binding" signs, with the NEW key: the retired key signs the key.issued
// event, but whoever keeps a retired key and can rewrite the database could re-sign that event
// with other retired_heads (say, a higher seq for a quiet chain, then sign events up to it) as
// long as nothing signed by the new key chains over it. The binding is the new key's word on the
// rotation, which the retired key cannot forge:
//
//   +------------------------------+------------------------------------------------------------+
//   | kRotationStatementDomain     | "oml/key.issued/binding/v1\n" (never the first byte of a   |
//   |                              | signed envelope or head document, which are JSON objects)  |
//   | RFC 8785 canonical JSON of   | {"prev": hex prev_hash of the key.issued,                  |
//   |                              |  "seq": its provider seq, "tenant": the provider tenant,   |
//   |                              |  "payload": the key.issued payload without "binding"}      |
//   +------------------------------+------------------------------------------------------------+
//
// The payload part covers key_id, public_key, algorithm, supersedes and retired_heads; seq and
// prev pin the rotation to its place on the provider chain (and so the provider history before
// it). payload["binding"] = base64(Ed25519 signature by the new key over these bytes).
inline constexpr std::string_view kRotationStatementDomain = "oml/key.issued/binding/v1\n";
Result<std::string> RotationStatement(int64_t seq, const std::string& prev_hash, const nlohmann::json& payload);

// The key-chain rule for one key.issued, defined once for every reader of the key chain:
// `oml verify` and `oml verify --from-lake` (journal/verify.cc), and the key chain behind
// published heads, the head publisher and the fork check (LoadTrustedKeys, journal/heads.h).
// `in_force`: the key in force before `e`, "" when e is the provider chain's first key.issued;
// `issued_before(id)`: an earlier key.issued issued key `id`.
// REQUIRES: the caller walks the provider chain in seq order, linked, and has verified e's
// Ed25519 signature under the key e.key_id names.
// Returns the key (with retired_heads for a rotation), or kDataLoss whose message is a sentence
// about the key.issued ("key.issued ..."), the caller adding where it is:
//   - the payload is malformed (ParseKeyIssued);
//   - the first key.issued is not signed by the key it issues;
//   - a rotation issues a key issued before, does not name in_force as the key it supersedes, is
//     not signed by in_force, lacks retired_heads or has a non-integer seq there, lacks the
//     binding (a rotation journalled before bindings existed: refused, as rotations before
//     retired_heads are), or its binding does not verify under the key it issues.
Result<IssuedKey> CheckKeyIssued(const Envelope& e, const std::string& in_force,
                                 const std::function<bool(const std::string&)>& issued_before);

// Creates the provider tenant, its genesis and key.issued for `journal.key()`. Idempotent:
// returns false (and does nothing) if the provider chain exists already.
Result<bool> InitProvider(Journal& journal);

// tenant.created on the provider chain + the tenant's genesis, in one transaction.
// kFailedPrecondition "tenant-exists" if the name is taken; kInvalidArgument "invalid-field" on
// a bad name (fields::CheckTenantName).
Result<TenantInfo> CreateTenant(Journal& journal, const std::string& name);

// Resolves a tenant name or uuid. kNotFound if unknown.
Result<TenantInfo> LookupTenant(db::Pool& pool, const std::string& name_or_id);
Result<std::vector<TenantInfo>> ListTenants(db::Pool& pool);  // provider first

// Journals key.issued for new_key on the provider chain, signed by journal.key() (the key in
// force), and retires the previous key. Exclusive with every append (oml.begin_key_rotation):
// the payload's "retired_heads" records each chain's head seq at that moment, the last events
// the retiring key may have signed, and "binding" signs them with new_key (RotationStatement,
// over the seq and prev the event gets: the provider head read under the rotation lock).
// kFailedPrecondition "signing-key-reused" if new_key was ever issued before (a retirement is
// final).
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
  std::string principal;  // as given, or "<role>:<key_id>" when none was: one principal per key
  Receipt receipt;     // of api_key.created
};
// kPermissionDenied "provider-tenant" for the provider tenant, which never has API keys (the
// database refuses them too, sql/0007). kInvalidArgument for a role other than writer/reviewer/admin, or "invalid-field" for a
// principal that breaks fields::CheckPrincipal (1..200 characters, UTF-8, no controls). An
// empty principal gives the key its own, "<role>:<key id>": the own-work rule and a reviewer's
// served files follow the principal, so keys never share them unless given one principal.
Result<NewApiKey> CreateApiKey(Journal& journal, const std::string& tenant_id, const std::string& principal,
                               const std::string& role);

// kInvalidArgument unless key_id is "ak_" + 16 hex, "invalid-field" for a reason that breaks
// fields::CheckReason (0..1024 characters, UTF-8, no controls); kNotFound
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
