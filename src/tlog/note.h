// C2SP signed notes (https://c2sp.org/signed-note), the form in which oml publishes each chain's
// checkpoint and in which witnesses co-sign it (issue 23), so that tools no one here wrote
// (golang.org/x/mod/sumdb/note, transparency-dev/formats) read and verify them.
//
// A note is UTF-8 text ending in "\n", a blank line, then one line per signature:
//
//   <text, every line ending "\n">
//   \n
//   — <key name> <base64(key hash, 4 bytes big-endian || signature)>\n    (U+2014, a space)
//
// A key is named by its name and its key hash: the first 4 bytes of
// SHA-256(name || "\n" || type byte || public key), big-endian. Type 0x01 is Ed25519 over the
// note text; type 0x04 is a C2SP tlog-cosignature (cosignature/v1): Ed25519 over
// "cosignature/v1\ntime <unix seconds>\n" || text, its signature bytes the 8-byte big-endian
// time followed by the 64-byte signature. A verifier key is written
// "<name>+<8 hex digits of the key hash>+<base64(type || public key)>".
//
// Opening a note follows x/mod's note.Open: a signature by a key the caller does not know is
// kept as unverified; one by a known key that does not verify fails the whole note; a note with
// no verified signature fails. Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "crypto/crypto.h"

namespace oml::tlog {

inline constexpr uint8_t kAlgEd25519 = 0x01;
inline constexpr uint8_t kAlgCosignatureV1 = 0x04;
// A note longer than this is refused unparsed (a checkpoint with cosignatures is < 4 KiB).
inline constexpr size_t kMaxNoteBytes = 64 * 1024;
// More signature lines than this make a note malformed (x/mod's limit).
inline constexpr size_t kMaxNoteSignatures = 100;

// Non-empty valid UTF-8 with no Unicode white space and no '+'.
bool IsValidKeyName(std::string_view name);
// SHA-256(name || "\n" || alg || public_key)[0:4], big-endian.
uint32_t KeyHash(std::string_view name, uint8_t alg, std::string_view public_key);

// A key that verifies note signatures.
struct NoteKey {
  std::string name;
  uint32_t hash = 0;
  uint8_t alg = kAlgEd25519;
  std::string public_key;  // 32 raw Ed25519 bytes
};
// The key `name` gives an Ed25519 public key under `alg`. REQUIRES: IsValidKeyName(name).
NoteKey MakeNoteKey(std::string_view name, std::string_view ed25519_public_key, uint8_t alg = kAlgEd25519);
// "<name>+<hash hex>+<base64(alg || key)>".
std::string EncodeVerifierKey(const NoteKey& key);
// Parses an encoded verifier key; kInvalidArgument "invalid-verifier-key" if it is malformed, of
// an unknown type, of the wrong length, or its hash does not match.
Result<NoteKey> ParseVerifierKey(std::string_view vkey);

struct NoteSignature {
  std::string name;
  uint32_t hash = 0;
  std::string base64;  // as written: base64(hash || signature)
};

struct Note {
  std::string text;                           // ends with "\n"
  std::vector<NoteSignature> verified;        // by the keys given, each (name, hash) once
  std::vector<NoteSignature> unverified;      // by other keys, each line once
  // For cosignature/v1 signatures among `verified`: the time each one signed, in the same order
  // (0 for a type 0x01 signature).
  std::vector<uint64_t> cosigned_at;
};

// The signature line "— <name> <base64(hash || signature)>\n".
std::string SignatureLine(std::string_view name, uint32_t hash, std::string_view signature);
// `text` signed by `key` under `name` (type 0x01): text, "\n", the signature line.
// kInvalidArgument unless text ends with "\n" and the name is valid.
Result<std::string> SignNote(std::string_view text, std::string_view name, const crypto::SigningKey& key);
// The signature line of a cosignature/v1 of `text` at `timestamp` by `key` under `name`.
Result<std::string> CosignatureLine(std::string_view text, std::string_view name, const crypto::SigningKey& key,
                                    uint64_t timestamp);
// What a cosignature/v1 signs: "cosignature/v1\ntime <t>\n" || text.
std::string CosignedMessage(std::string_view text, uint64_t timestamp);

// Opens `msg` as above. Errors, all kInvalidArgument, by type: "malformed-note" (syntax, control
// characters, invalid UTF-8, too long, too many signatures; base64 is read as Go reads it),
// "ambiguous-key" (two given keys with the name and hash of a signature), "invalid-signature" (a
// known key's signature does not verify; names the key), "unverified-note" (no signature by a
// known key).
Result<Note> OpenNote(std::string_view msg, const std::vector<NoteKey>& keys);

}  // namespace oml::tlog
