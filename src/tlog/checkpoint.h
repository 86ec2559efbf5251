// C2SP tlog-checkpoint (https://c2sp.org/tlog-checkpoint) bodies and C2SP tlog-proof
// (https://c2sp.org/tlog-proof) documents: how each chain's tree head is published and how an
// inclusion proof travels with it (issue 23).
//
// A checkpoint body is the text of a signed note (tlog/note.h):
//
//   <origin>\n                       non-empty; oml writes "<deployment origin>/<tenant uuid>"
//   <tree size>\n                    ASCII decimal, no leading zero
//   <base64 of the 32-byte root>\n
//   [<extension line>\n ...]          each non-empty
//
// A tlog-proof is
//
//   c2sp.org/tlog-proof@v1\n
//   [extra <base64>\n]
//   index <leaf index>\n
//   <base64 hash>\n ...               the inclusion path, leaf side first
//   \n
//   <the signed checkpoint note>
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace oml::tlog {

// A size or index as the C2SP formats write it (checkpoint sizes, tlog-proof indexes, a
// witness's "old" line and 409 body): digits only, no sign, no leading zero (but "0"), fits 64
// bits; nullopt otherwise.
std::optional<uint64_t> ParseDecimal(std::string_view s);

struct Checkpoint {
  std::string origin;
  uint64_t size = 0;
  std::string root;  // 32 raw bytes
  std::vector<std::string> extensions;
};

// The body. REQUIRES: the origin and extensions hold no newline and are non-empty; root is 32 bytes.
std::string EncodeCheckpoint(const Checkpoint& c);
// Parses a body (a note's text). kInvalidArgument "malformed-checkpoint" saying which line.
Result<Checkpoint> ParseCheckpoint(std::string_view text);

// The text of a signed note (everything up to and including the newline before its last blank
// line), unverified; "" if it has no blank line.
std::string_view NoteText(std::string_view note);
// ParseCheckpoint(NoteText(note)): a checkpoint note's body, its signatures not checked.
Result<Checkpoint> ParseCheckpointNote(std::string_view note);

inline constexpr std::string_view kTlogProofHeader = "c2sp.org/tlog-proof@v1";

struct TlogProof {
  uint64_t index = 0;
  std::vector<std::string> hashes;  // 32 raw bytes each
  std::string checkpoint;           // the signed note, as published
  std::optional<std::string> extra;
};

std::string EncodeTlogProof(const TlogProof& p);
// kInvalidArgument "malformed-proof" saying which line.
Result<TlogProof> ParseTlogProof(std::string_view text);

struct NoteKey;
// (tlog/note.h)

// Checks a tlog-proof offline: it is for leaf `index`, its checkpoint opens with `key` (a
// signature by it verifies), its origin is `origin`, and the inclusion path leads from
// HashLeaf(entry) at `index` to the checkpoint's root. Returns the checkpoint. kInvalidArgument
// with the reason: "malformed-proof" / "wrong-index" / a note error (tlog/note.h) /
// "malformed-checkpoint" / "wrong-origin" / "invalid-proof" (merkle::VerifyInclusion's message,
// also for an index past the checkpoint's size).
Result<Checkpoint> VerifyTlogProof(std::string_view proof_text, std::string_view entry, uint64_t index,
                                   const NoteKey& key, std::string_view origin);

// Checks offline that the checkpoint `new_note` extends `old_note` (an auditor holding an older
// checkpoint, given GET /v1/proofs/consistency's answer): both open with `public_key` under the
// note key name = their origin, the origins are equal, `proof` is the RFC 9162 consistency proof
// from the old tree to the new one, and every key of `cosigners` (cosignature/v1 verifier keys
// of witnesses) cosigned the new checkpoint. O(log n): nothing is read but the proof. Returns
// the new checkpoint. kInvalidArgument with the reason: a note error (tlog/note.h),
// "malformed-checkpoint", "wrong-origin", "size-went-back", "missing-cosignature",
// "invalid-proof" (merkle::VerifyConsistency's message).
// `old_public_key` (empty: `public_key`): the key of the older checkpoint, across a rotation.
Result<Checkpoint> VerifyCheckpointConsistency(std::string_view old_note, std::string_view new_note,
                                               const std::vector<std::string>& proof, std::string_view public_key,
                                               const std::vector<NoteKey>& cosigners = {},
                                               std::string_view old_public_key = {});

}  // namespace oml::tlog
