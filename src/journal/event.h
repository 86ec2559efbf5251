// Journal events: the envelope, its canonical signed bytes, and receipts.
//
// Signed bytes = RFC 8785 canonical JSON of the envelope (members sorted, no whitespace):
//
//   +-----------+----------------------------------------------------------------+
//   | member    | value                                                          |
//   +-----------+----------------------------------------------------------------+
//   | key_id    | signing key id, "ed25519:<16 hex>" (key in force, provider chain)|
//   | payload   | event-type specific object; digests and metadata only, never   |
//   |           | body plaintext (docs/data/event-catalog.md)                    |
//   | prev      | hex SHA-256 event_hash of seq-1; 64 zeros at genesis (seq 1)   |
//   | principal | who acted ("system" for deployment acts)                       |
//   | refs      | object; genesis of a customer tenant: {"provider": {tenant,    |
//   |           | seq, event_hash}} of its tenant.created; {} otherwise          |
//   | seq       | integer, 1-based, contiguous per tenant                        |
//   | tenant    | tenant uuid                                                    |
//   | time      | UTC, "YYYY-MM-DDTHH:MM:SS.ffffffZ"                              |
//   | type      | event type, e.g. "claim.submitted"                             |
//   | v         | envelope version, 1                                            |
//   +-----------+----------------------------------------------------------------+
//   event_hash = SHA-256(signed bytes)          (32 bytes, hex in JSON)
//   signature  = Ed25519(signing key, signed bytes)  (64 bytes, base64 in JSON)
//
// The journal row stores signed bytes byte-exact; verification never re-serializes to check a
// hash, it hashes the stored bytes and then checks that they are canonical and agree with the
// row's columns.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "common/status.h"

namespace oml::crypto {
class SigningKey;
}

namespace oml::journal {

inline constexpr int kEnvelopeVersion = 1;
inline const std::string kProviderTenant = "00000000-0000-0000-0000-000000000000";
inline const std::string kZeroHash(32, '\0');

struct Envelope {
  std::string tenant;
  int64_t seq = 0;
  std::string prev_hash;  // raw 32 bytes
  std::string type;
  std::string time;
  std::string key_id;
  std::string principal;
  nlohmann::json payload = nlohmann::json::object();
  nlohmann::json refs = nlohmann::json::object();

  nlohmann::json ToJson() const;
  Result<std::string> SignedBytes() const;
  // Parses canonical signed bytes (kDataLoss if malformed or not canonical).
  static Result<Envelope> FromSignedBytes(const std::string& bytes);
  // The same without checking that the bytes are canonical (about half the cost): for readers
  // that take the chain as given because `oml verify` checks it (`oml reconcile`). Still
  // kDataLoss if the bytes are not JSON or not an envelope.
  static Result<Envelope> FromVerifiedSignedBytes(const std::string& bytes);
};

// `text` parsed as nlohmann::json::parse(text) parses it (the same value, the same number types),
// by simdjson (several times faster; `oml reconcile` parses every event), nlohmann reading what
// simdjson refuses. kDataLoss if it is not JSON.
Result<nlohmann::json> ParseJsonFast(const std::string& text);

// What every acknowledged write returns. Verifiable offline with the deployment public key:
// SHA-256(signed_bytes) == event_hash, the signature verifies, and the envelope's tenant, seq and
// prev match the receipt's fields.
struct Receipt {
  std::string tenant;
  int64_t seq = 0;
  std::string event_hash;  // raw
  std::string prev_hash;   // raw
  std::string signature;   // raw
  std::string key_id;
  std::string signed_bytes;

  nlohmann::json ToJson() const;
  static Result<Receipt> FromJson(const nlohmann::json& j);
};

// Signs `e` (its key_id names the key; `key` is what signs): canonical signed bytes, event_hash =
// SHA-256 of them, Ed25519 signature. The one place a receipt is made.
Result<Receipt> SignEnvelope(const Envelope& e, const crypto::SigningKey& key);

// Offline receipt check. kDataLoss naming what is wrong.
Status VerifyReceipt(const Receipt& r, const std::string& public_key_raw);

// UTC now as "YYYY-MM-DDTHH:MM:SS.ffffffZ".
std::string NowTimestamp();
// UTC now + `offset_seconds`, in the same format.
std::string TimestampFromNow(int64_t offset_seconds);

}  // namespace oml::journal
