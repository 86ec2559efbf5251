#include "tlog/note.h"

#include <algorithm>
#include <map>
#include <set>
#include <cctype>
#include <utility>

namespace oml::tlog {
namespace {

constexpr std::string_view kSigPrefix = "\xE2\x80\x94 ";  // "— "
constexpr std::string_view kCosigHeader = "cosignature/v1\n";

// Go's base64.StdEncoding.DecodeString, which (not strict) accepts padding bits that are not
// zero: the same bytes as the canonical form with those bits cleared.
Result<std::string> GoBase64(std::string_view b64) {
  auto strict = crypto::FromBase64(b64);
  if (strict.ok() || b64.size() % 4 != 0 || b64.empty()) return strict;
  std::string canon(b64);
  const size_t pad = canon.back() != '=' ? 0 : canon[canon.size() - 2] == '=' ? 2 : 1;
  if (pad == 0) return strict;
  static constexpr std::string_view kAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  char& last = canon[canon.size() - pad - 1];
  const size_t v = kAlphabet.find(last);
  if (v == std::string_view::npos) return strict;
  last = kAlphabet[v & (pad == 1 ? ~size_t{0x03} : ~size_t{0x0f})];
  return crypto::FromBase64(canon);
}

// formats' formatEd25519CosignatureV1: a cosigned text has at least three lines.
bool CosignableText(std::string_view text) { return std::count(text.begin(), text.end(), '\n') >= 2; }

Status Malformed(std::string why) { return InvalidArgument("malformed note: " + std::move(why), "malformed-note"); }

// Decodes one UTF-8 sequence at s[i] as Go's utf8.DecodeRune does for valid input; returns the
// code point and its length, or length 0 for an invalid sequence (overlong, surrogate, beyond
// U+10FFFF, truncated).
std::pair<uint32_t, size_t> DecodeRune(std::string_view s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<uint8_t>(s[i + k]); };
  const uint8_t c = b(0);
  if (c < 0x80) return {c, 1};
  const auto cont = [&](size_t k) { return i + k < s.size() && (b(k) & 0xC0) == 0x80; };
  if (c >= 0xC2 && c <= 0xDF) {
    if (!cont(1)) return {0, 0};
    return {((c & 0x1Fu) << 6) | (b(1) & 0x3Fu), 2};
  }
  if (c >= 0xE0 && c <= 0xEF) {
    if (!cont(1) || !cont(2)) return {0, 0};
    const uint32_t r = ((c & 0x0Fu) << 12) | ((b(1) & 0x3Fu) << 6) | (b(2) & 0x3Fu);
    if (r < 0x800 || (r >= 0xD800 && r <= 0xDFFF)) return {0, 0};
    return {r, 3};
  }
  if (c >= 0xF0 && c <= 0xF4) {
    if (!cont(1) || !cont(2) || !cont(3)) return {0, 0};
    const uint32_t r = ((c & 0x07u) << 18) | ((b(1) & 0x3Fu) << 12) | ((b(2) & 0x3Fu) << 6) | (b(3) & 0x3Fu);
    if (r < 0x10000 || r > 0x10FFFF) return {0, 0};
    return {r, 4};
  }
  return {0, 0};
}

// Go's unicode.IsSpace: the Latin-1 spaces and the Unicode White_Space property.
bool IsSpace(uint32_t r) {
  switch (r) {
    case '\t': case '\n': case '\v': case '\f': case '\r': case ' ': case 0x85: case 0xA0:
    case 0x1680: case 0x2028: case 0x2029: case 0x202F: case 0x205F: case 0x3000:
      return true;
    default:
      return r >= 0x2000 && r <= 0x200A;
  }
}

std::string HashBytes(uint32_t h) {
  std::string out(4, '\0');
  for (int k = 0; k < 4; ++k) out[static_cast<size_t>(k)] = static_cast<char>((h >> (24 - 8 * k)) & 0xFF);
  return out;
}

uint32_t ReadHash(std::string_view four) {
  uint32_t h = 0;
  for (char c : four) h = (h << 8) | static_cast<uint8_t>(c);
  return h;
}

std::string Hex8(uint32_t h) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out(8, '0');
  for (int k = 7; k >= 0; --k, h >>= 4) out[static_cast<size_t>(k)] = kDigits[h & 0xF];
  return out;
}

std::string U64Bytes(uint64_t v) {
  std::string out(8, '\0');
  for (int k = 7; k >= 0; --k, v >>= 8) out[static_cast<size_t>(k)] = static_cast<char>(v & 0xFF);
  return out;
}

// Verifies one signature (the bytes after the key hash) of `text` by `key`; for cosignature/v1
// also returns the time it carries.
bool VerifyBy(const NoteKey& key, std::string_view text, std::string_view sig, uint64_t* cosigned_at) {
  if (key.alg == kAlgEd25519) return sig.size() == 64 && crypto::Ed25519Verify(key.public_key, text, sig);
  if (key.alg == kAlgCosignatureV1) {
    if (sig.size() != 8 + 64 || !CosignableText(text)) return false;
    uint64_t t = 0;
    for (size_t k = 0; k < 8; ++k) t = (t << 8) | static_cast<uint8_t>(sig[k]);
    if (!crypto::Ed25519Verify(key.public_key, CosignedMessage(text, t), sig.substr(8))) return false;
    *cosigned_at = t;
    return true;
  }
  return false;
}

}  // namespace

bool IsValidKeyName(std::string_view name) {
  if (name.empty()) return false;
  for (size_t i = 0; i < name.size();) {
    auto [r, n] = DecodeRune(name, i);
    if (n == 0 || IsSpace(r) || r == '+') return false;
    i += n;
  }
  return true;
}

uint32_t KeyHash(std::string_view name, uint8_t alg, std::string_view public_key) {
  std::string m;
  m.reserve(name.size() + 2 + public_key.size());
  m.append(name).append(1, '\n').append(1, static_cast<char>(alg)).append(public_key);
  return ReadHash(std::string_view(crypto::Sha256(m)).substr(0, 4));
}

NoteKey MakeNoteKey(std::string_view name, std::string_view ed25519_public_key, uint8_t alg) {
  return NoteKey{std::string(name), KeyHash(name, alg, ed25519_public_key), alg, std::string(ed25519_public_key)};
}

std::string EncodeVerifierKey(const NoteKey& key) {
  return key.name + "+" + Hex8(key.hash) + "+" + crypto::Base64(std::string(1, static_cast<char>(key.alg)) + key.public_key);
}

Result<NoteKey> ParseVerifierKey(std::string_view vkey) {
  const auto bad = [&](const std::string& why) {
    return InvalidArgument("invalid verifier key: " + why, "invalid-verifier-key");
  };
  const size_t p1 = vkey.find('+');
  if (p1 == std::string_view::npos) return bad("want <name>+<hash>+<key>");
  const size_t p2 = vkey.find('+', p1 + 1);
  if (p2 == std::string_view::npos) return bad("want <name>+<hash>+<key>");
  const std::string_view name = vkey.substr(0, p1), hash16 = vkey.substr(p1 + 1, p2 - p1 - 1), key64 = vkey.substr(p2 + 1);
  if (!IsValidKeyName(name)) return bad("the name is empty, holds white space or '+', or is not UTF-8");
  if (hash16.size() != 8 || hash16.find_first_not_of("0123456789abcdefABCDEF") != std::string_view::npos)
    return bad("the key hash is not 8 hex digits");
  auto raw = GoBase64(key64);
  if (!raw.ok() || raw->empty()) return bad("the key is not base64");
  const auto alg = static_cast<uint8_t>((*raw)[0]);
  if (alg != kAlgEd25519 && alg != kAlgCosignatureV1) return bad("unknown key type " + std::to_string(alg));
  if (raw->size() != 33) return bad("an Ed25519 key is 32 bytes");
  NoteKey k = MakeNoteKey(name, std::string_view(*raw).substr(1), alg);
  std::string lower(hash16);
  for (char& ch : lower) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  if (Hex8(k.hash) != lower) return bad("the key hash " + std::string(hash16) + " is not the key's (" + Hex8(k.hash) + ")");
  return k;
}

std::string SignatureLine(std::string_view name, uint32_t hash, std::string_view signature) {
  std::string line(kSigPrefix);
  line.append(name).append(1, ' ').append(crypto::Base64(HashBytes(hash) + std::string(signature))).append(1, '\n');
  return line;
}

Result<std::string> SignNote(std::string_view text, std::string_view name, const crypto::SigningKey& key) {
  if (text.empty() || text.back() != '\n') return Malformed("the text does not end with a newline");
  if (!IsValidKeyName(name)) return InvalidArgument("invalid key name", "invalid-key-name");
  std::string out(text);
  out.append(1, '\n').append(SignatureLine(name, KeyHash(name, kAlgEd25519, key.public_key()), key.Sign(text)));
  return out;
}

std::string CosignedMessage(std::string_view text, uint64_t timestamp) {
  std::string m(kCosigHeader);
  m.append("time ").append(std::to_string(timestamp)).append(1, '\n').append(text);
  return m;
}

Result<std::string> CosignatureLine(std::string_view text, std::string_view name, const crypto::SigningKey& key,
                                    uint64_t timestamp) {
  if (text.empty() || text.back() != '\n') return Malformed("the text does not end with a newline");
  if (!CosignableText(text)) return Malformed("a cosigned text has at least three lines (origin, size, root)");
  if (!IsValidKeyName(name)) return InvalidArgument("invalid key name", "invalid-key-name");
  const std::string sig = U64Bytes(timestamp) + key.Sign(CosignedMessage(text, timestamp));
  return SignatureLine(name, KeyHash(name, kAlgCosignatureV1, key.public_key()), sig);
}

Result<Note> OpenNote(std::string_view msg, const std::vector<NoteKey>& keys) {
  if (msg.size() > kMaxNoteBytes) return Malformed("longer than " + std::to_string(kMaxNoteBytes) + " bytes");
  for (size_t i = 0; i < msg.size();) {
    auto [r, n] = DecodeRune(msg, i);
    if (n == 0) return Malformed("not UTF-8 at byte " + std::to_string(i));
    if (r < 0x20 && r != '\n') return Malformed("control character at byte " + std::to_string(i));
    i += n;
  }
  const size_t split = msg.rfind("\n\n");
  if (split == std::string_view::npos) return Malformed("no blank line before the signatures");
  Note note;
  note.text = std::string(msg.substr(0, split + 1));
  std::string_view sigs = msg.substr(split + 2);
  if (sigs.empty() || sigs.back() != '\n') return Malformed("no signature line, or the last one has no newline");

  std::map<std::pair<std::string, uint32_t>, const NoteKey*> known;
  std::set<std::pair<std::string, uint32_t>> ambiguous;
  for (const NoteKey& k : keys) {
    if (!known.emplace(std::pair{k.name, k.hash}, &k).second) ambiguous.insert({k.name, k.hash});
  }
  std::set<std::pair<std::string, uint32_t>> seen;
  std::set<std::string> seen_unverified;
  size_t count = 0;
  while (!sigs.empty()) {
    const size_t nl = sigs.find('\n');
    std::string_view line = sigs.substr(0, nl);
    sigs.remove_prefix(nl + 1);
    if (line.substr(0, kSigPrefix.size()) != kSigPrefix) return Malformed("a signature line does not start with \"— \"");
    const std::string_view body = line.substr(kSigPrefix.size());
    const size_t sp = body.find(' ');
    const std::string_view name = body.substr(0, sp);
    const std::string_view b64 = sp == std::string_view::npos ? std::string_view() : body.substr(sp + 1);
    auto raw = GoBase64(b64);
    if (!IsValidKeyName(name) || b64.empty() || !raw.ok() || raw->size() < 5)
      return Malformed("a signature line is not \"— <name> <base64>\"");
    if (++count > kMaxNoteSignatures) return Malformed("more than " + std::to_string(kMaxNoteSignatures) + " signatures");
    const uint32_t hash = ReadHash(std::string_view(*raw).substr(0, 4));
    const std::pair<std::string, uint32_t> id{std::string(name), hash};
    auto it = known.find(id);
    if (it == known.end()) {
      if (seen_unverified.insert(std::string(body)).second) note.unverified.push_back({id.first, hash, std::string(b64)});
      continue;
    }
    const std::string key_name = id.first + "+" + Hex8(hash);
    if (ambiguous.count(id)) return InvalidArgument("ambiguous key " + key_name, "ambiguous-key");
    if (!seen.insert(id).second) continue;
    uint64_t at = 0;
    if (!VerifyBy(*it->second, note.text, std::string_view(*raw).substr(4), &at))
      return InvalidArgument("invalid signature for key " + key_name, "invalid-signature");
    note.verified.push_back({id.first, hash, std::string(b64)});
    note.cosigned_at.push_back(at);
  }
  if (note.verified.empty()) return InvalidArgument("note has no verifiable signatures", "unverified-note");
  return note;
}

}  // namespace oml::tlog
