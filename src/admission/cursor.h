// Recall cursors (GET /v1/claims, GET /v1/search `cursor` / `next_cursor`, admission/recall.h):
// a page position, opaque to clients, authenticated with HMAC-SHA-256 under the deployment's
// cursor secret (config cursor_secret_file, crypto::HmacKeyRing). A cursor altered in any byte,
// made up by a client, issued for another query or tenant, or MACed under a secret the server no
// longer holds is refused: kInvalidArgument, type "invalid-cursor" (HTTP 400). A client that
// forges a position gets nothing a real one would not give either (every page is filtered by the
// caller's visibility), but the API promises that only cursors oml issued are accepted, and a
// keyed MAC is what makes that true: the v1 format's check was an unkeyed SHA-256 that anyone
// could recompute.
//
// Format (v2), base64url without padding (RFC 4648 section 5) of:
//
//   +------+---------+------------------+-----------------+-------------------+
//   | 0x02 | id_len  | key id           | doc             | tag               |
//   | 1 B  | 1 B     | id_len B (1..32) | JSON, see below | 32 B              |
//   +------+---------+------------------+-----------------+-------------------+
//   tag = HMAC-SHA-256(secret of `key id`, "oml-cursor/v2" || 0x00 || every byte before the tag)
//   doc = {"v":2,"q":"<binding>","s":<seq>,"a":"<artifact uuid>"[,"r":"<rank>"]}
//
// The key id names the secret that made the tag: the server signs with the first key of its
// ring and verifies with whichever key the cursor names, so after a rotation (a new key first,
// the old one kept below it) cursors issued before it still page until the old key is removed.
// `binding` is the caller's fingerprint of the query and tenant (recall.cc): a cursor answers
// only the query it was issued for. The tag is checked before the doc is parsed.
//
// Thread-safe: no state besides the (read-only) key ring.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "common/status.h"
#include "crypto/crypto.h"

namespace oml::admission {

inline constexpr uint8_t kCursorVersion = 2;
// Longest cursor accepted (characters); openapi.yaml's maxLength of `cursor`.
inline constexpr size_t kMaxCursorChars = 512;

// A page position: the last row's keys.
struct CursorPosition {
  int64_t seq = 0;
  std::string artifact_id;
  std::string rank;  // search only: the rank as PostgreSQL printed it (float8, shortest exact)
};

// The cursor after `p` for the query `binding`, MACed under keys.signing_key_id(). `search`: the
// position carries a rank. REQUIRES: binding and p.rank are short (the cursor stays within
// kMaxCursorChars: a 16-hex binding and a 40-character rank give about 250).
std::string EncodeCursor(const crypto::HmacKeyRing& keys, const std::string& binding, const CursorPosition& p,
                         bool search);

// The position of `cursor`; nullopt for "" (the first page). kInvalidArgument "invalid-cursor"
// for anything else that is not a cursor EncodeCursor made for `binding` (and `search`) under a
// key `keys` holds: too long, not base64url, another version, a key id the ring does not hold
// ("cursor was issued under a key this server does not hold"), a tag that does not verify
// ("cursor was altered"), a doc of another query ("cursor belongs to another query"), or a doc
// that verifies but is malformed (a seq below 1, an artifact id that is not a UUID, a rank that
// is not a finite number).
Result<std::optional<CursorPosition>> DecodeCursor(const crypto::HmacKeyRing& keys, const std::string& cursor,
                                                   const std::string& binding, bool search);

}  // namespace oml::admission
