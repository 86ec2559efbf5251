#include "tlog/checkpoint.h"

#include <algorithm>
#include <charconv>

#include "crypto/crypto.h"
#include "merkle/merkle.h"
#include "tlog/note.h"

namespace oml::tlog {

std::optional<uint64_t> ParseDecimal(std::string_view s) {
  if (s.empty() || (s.size() > 1 && s[0] == '0')) return std::nullopt;
  uint64_t v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
  return v;
}

namespace {

// Splits `text` into lines; false unless it ends with "\n".
bool Lines(std::string_view text, std::vector<std::string_view>* out) {
  if (text.empty() || text.back() != '\n') return false;
  while (!text.empty()) {
    const size_t nl = text.find('\n');
    out->push_back(text.substr(0, nl));
    text.remove_prefix(nl + 1);
  }
  return true;
}

}  // namespace

std::string EncodeCheckpoint(const Checkpoint& c) {
  std::string out = c.origin + "\n" + std::to_string(c.size) + "\n" + crypto::Base64(c.root) + "\n";
  for (const auto& e : c.extensions) out.append(e).append(1, '\n');
  return out;
}

Result<Checkpoint> ParseCheckpoint(std::string_view text) {
  const auto bad = [](const std::string& why) {
    return InvalidArgument("malformed checkpoint: " + why, "malformed-checkpoint");
  };
  std::vector<std::string_view> lines;
  if (!Lines(text, &lines)) return bad("it does not end with a newline");
  if (lines.size() < 3) return bad("fewer than three lines (origin, size, root hash)");
  Checkpoint c;
  if (lines[0].empty()) return bad("the origin line is empty");
  c.origin = std::string(lines[0]);
  auto size = ParseDecimal(lines[1]);
  if (!size) return bad("the tree size \"" + std::string(lines[1].substr(0, 32)) + "\" is not a decimal integer");
  c.size = *size;
  auto root = crypto::FromBase64(lines[2]);
  if (!root.ok() || root->size() != 32) return bad("the root hash is not the base64 of 32 bytes");
  c.root = std::move(*root);
  for (size_t i = 3; i < lines.size(); ++i) {
    if (lines[i].empty()) return bad("extension line " + std::to_string(i - 2) + " is empty");
    c.extensions.emplace_back(lines[i]);
  }
  return c;
}

std::string_view NoteText(std::string_view note) {
  const size_t split = note.rfind("\n\n");
  return split == std::string_view::npos ? std::string_view() : note.substr(0, split + 1);
}

Result<Checkpoint> ParseCheckpointNote(std::string_view note) { return ParseCheckpoint(NoteText(note)); }

std::string EncodeTlogProof(const TlogProof& p) {
  std::string out(kTlogProofHeader);
  out.append(1, '\n');
  if (p.extra) out.append("extra ").append(crypto::Base64(*p.extra)).append(1, '\n');
  out.append("index ").append(std::to_string(p.index)).append(1, '\n');
  for (const auto& h : p.hashes) out.append(crypto::Base64(h)).append(1, '\n');
  out.append(1, '\n').append(p.checkpoint);
  return out;
}

Result<TlogProof> ParseTlogProof(std::string_view text) {
  const auto bad = [](const std::string& why) { return InvalidArgument("malformed tlog-proof: " + why, "malformed-proof"); };
  const auto next = [&](std::string_view* line) {
    const size_t nl = text.find('\n');
    if (nl == std::string_view::npos) return false;
    *line = text.substr(0, nl);
    text.remove_prefix(nl + 1);
    return true;
  };
  std::string_view line;
  if (!next(&line) || line != kTlogProofHeader) return bad("the first line is not " + std::string(kTlogProofHeader));
  TlogProof p;
  if (!next(&line)) return bad("no index line");
  if (line.substr(0, 6) == "extra ") {
    auto e = crypto::FromBase64(line.substr(6));
    if (!e.ok()) return bad("the extra data is not base64");
    p.extra = std::move(*e);
    if (!next(&line)) return bad("no index line");
  }
  if (line.substr(0, 6) != "index ") return bad("no index line");
  auto index = ParseDecimal(line.substr(6));
  if (!index) return bad("the index is not a decimal integer");
  p.index = *index;
  for (;;) {
    if (!next(&line)) return bad("no blank line before the checkpoint");
    if (line.empty()) break;
    if (p.hashes.size() == 64) return bad("more than 64 hashes (no tree of 2^64 leaves needs more)");
    auto h = crypto::FromBase64(line);
    if (!h.ok() || h->size() != 32) return bad("hash " + std::to_string(p.hashes.size()) + " is not the base64 of 32 bytes");
    p.hashes.push_back(std::move(*h));
  }
  if (text.empty()) return bad("no checkpoint");
  p.checkpoint = std::string(text);
  return p;
}

Result<Checkpoint> VerifyTlogProof(std::string_view proof_text, std::string_view entry, uint64_t index,
                                   const NoteKey& key, std::string_view origin) {
  OML_ASSIGN_OR_RETURN(TlogProof p, ParseTlogProof(proof_text));
  if (p.index != index)
    return InvalidArgument("the proof is for leaf " + std::to_string(p.index) + ", not " + std::to_string(index),
                           "wrong-index");
  OML_ASSIGN_OR_RETURN(Note note, OpenNote(p.checkpoint, {key}));
  OML_ASSIGN_OR_RETURN(Checkpoint c, ParseCheckpoint(note.text));
  if (c.origin != origin)
    return InvalidArgument("the checkpoint's origin is " + c.origin + ", not " + std::string(origin), "wrong-origin");
  OML_RETURN_IF_ERROR(merkle::VerifyInclusion(p.index, c.size, merkle::HashLeaf(entry), p.hashes, c.root));
  return c;
}

Result<Checkpoint> VerifyCheckpointConsistency(std::string_view old_note, std::string_view new_note,
                                               const std::vector<std::string>& proof, std::string_view public_key,
                                               const std::vector<NoteKey>& cosigners,
                                               std::string_view old_public_key) {
  // Each note under its own origin's key name: the origins are compared after both verified.
  const auto open = [&](std::string_view note, std::string_view pub,
                        const std::vector<NoteKey>& extra) -> Result<std::pair<Checkpoint, Note>> {
    OML_ASSIGN_OR_RETURN(Checkpoint unverified, ParseCheckpointNote(note));
    if (!IsValidKeyName(unverified.origin))
      return InvalidArgument("the checkpoint's origin " + unverified.origin + " is not a note key name", "wrong-origin");
    const NoteKey log_key = MakeNoteKey(unverified.origin, pub);
    std::vector<NoteKey> keys = extra;
    keys.push_back(log_key);
    OML_ASSIGN_OR_RETURN(Note n, OpenNote(note, keys));
    // The log's own key (name and key hash), not a cosigner's key that happens to share its name.
    if (std::none_of(n.verified.begin(), n.verified.end(),
                     [&](const NoteSignature& s) { return s.name == log_key.name && s.hash == log_key.hash; }))
      return InvalidArgument("the checkpoint is not signed by the log's key under " + unverified.origin, "unverified-note");
    OML_ASSIGN_OR_RETURN(Checkpoint c, ParseCheckpoint(n.text));
    return std::pair<Checkpoint, Note>{std::move(c), std::move(n)};
  };
  OML_ASSIGN_OR_RETURN(auto older, open(old_note, old_public_key.empty() ? public_key : old_public_key, {}));
  OML_ASSIGN_OR_RETURN(auto newer, open(new_note, public_key, cosigners));
  if (older.first.origin != newer.first.origin)
    return InvalidArgument("the new checkpoint's origin is " + newer.first.origin + ", not " + older.first.origin,
                           "wrong-origin");
  for (const NoteKey& k : cosigners) {
    const auto& v = newer.second.verified;
    if (std::none_of(v.begin(), v.end(), [&](const NoteSignature& s) { return s.name == k.name && s.hash == k.hash; }))
      return InvalidArgument("the new checkpoint has no cosignature by " + k.name, "missing-cosignature");
  }
  if (newer.first.size < older.first.size)
    return InvalidArgument("the new checkpoint's size " + std::to_string(newer.first.size) + " is below the old one's " +
                               std::to_string(older.first.size),
                           "size-went-back");
  OML_RETURN_IF_ERROR(merkle::VerifyConsistency(older.first.size, newer.first.size, proof, older.first.root, newer.first.root));
  return newer.first;
}

}  // namespace oml::tlog
