// Cryptographic primitives for oml, all on OpenSSL 3. Binary values travel as std::string
// holding raw bytes. Every function here is thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

struct evp_pkey_st;  // OpenSSL's EVP_PKEY

namespace oml::crypto {

// Key material in use: every load of a signing key or KEK file and every DEK unwrap calls
// NoteKeyMaterialUse, which counts it and passes the sync point "crypto.key_material"
// (OML_FAULT=crypto.key_material:kill kills a process the moment it touches a key). `oml
// reconcile` (reconcile/reconcile.h) proves it runs key-less with both: it reports the count,
// which must be 0, and its tests run it under that fault.
void NoteKeyMaterialUse();
uint64_t KeyMaterialUses();


// SHA-256 of `data`: 32 raw bytes.
std::string Sha256(std::string_view data);
// Lowercase hex of raw bytes, and back (kInvalidArgument on odd length / non-hex).
std::string Hex(std::string_view raw);
Result<std::string> FromHex(std::string_view hex);
// Standard base64 with padding (RFC 4648 §4), and back (kInvalidArgument on bad input).
std::string Base64(std::string_view raw);
Result<std::string> FromBase64(std::string_view b64);
// n bytes from the OS CSPRNG (RAND_bytes). Aborts if the RNG fails.
std::string RandomBytes(size_t n);
// A random (version 4) UUID in canonical lowercase form, from the CSPRNG.
std::string NewUuidV4();
// Constant-time equality for digests and token hashes.
bool ConstantTimeEquals(std::string_view a, std::string_view b);

// HMAC-SHA-256 (RFC 2104; test vectors RFC 4231) of `data` under `key`: the full 32 raw bytes,
// never truncated (a caller that wants a shorter tag cuts it and says so). A key longer than
// SHA-256's 64-byte block is hashed first, as RFC 2104 says. Aborts if OpenSSL fails (as Sha256).
inline constexpr size_t kHmacSha256Size = 32;
std::string HmacSha256(std::string_view key, std::string_view data);

// ---------------------------------------------------------------------------------------------
// Secret bytes in memory: a KEK, an unwrapped DEK, a decrypted body.
//
// Wipe overwrites the bytes of *s with zeros (OPENSSL_cleanse: the compiler may not drop it)
// and empties it; the capacity is kept, so nothing is freed unwiped.
void Wipe(std::string* s);

// Owns secret bytes and wipes them (Wipe above) when destroyed, assigned over or moved from.
// Move-only. It never grows, so no reallocation leaves an unwiped copy behind.
//
// Taking a std::string in: a string whose bytes live on the heap hands its buffer over (no
// copy). A short string keeps its bytes inside the std::string object (the small-string
// buffer), where a move would copy them and leave them behind: those are copied and the
// source's bytes wiped. Either way the source is left empty and holds no secret byte.
// Not thread-safe (like std::string).
class SecureBytes {
 public:
  SecureBytes() = default;
  explicit SecureBytes(std::string&& bytes);
  SecureBytes(SecureBytes&& other) noexcept;
  SecureBytes& operator=(SecureBytes&& other) noexcept;
  SecureBytes(const SecureBytes&) = delete;
  SecureBytes& operator=(const SecureBytes&) = delete;
  ~SecureBytes() { Wipe(); }

  std::string_view view() const { return s_; }
  size_t size() const { return s_.size(); }
  bool empty() const { return s_.empty(); }
  // Wipes the bytes now and leaves this empty.
  void Wipe() { crypto::Wipe(&s_); }
  // Hands the bytes to a plain std::string (the caller takes over wiping them); leaves this empty.
  std::string Release() &&;

 private:
  std::string s_;
};

// Secrets for HMAC-SHA-256, each under a key id an operator chose: the first one signs, every
// one verifies. A rotation puts a new secret first and keeps the old one below it until nothing
// signed under it is still in use (recall cursors: docs/operations/deployment.md).
//
// File format (cursor_secret_file), UTF-8 text, one key per line, the first key line signs:
//
//   # comment lines and blank lines are ignored
//   <key id> <secret>
//
//   key id  1..32 characters of A-Z a-z 0-9 . _ -, unique within the file
//   secret  64..128 hex digits (32..64 random bytes; 64 is SHA-256's block size)
//   the two separated by spaces or tabs; blanks around them and a trailing "\r" (CRLF files)
//   are ignored; a comment must be a line of its own
//
// Anything else (another field, a short or non-hex secret, a repeated id, no key line at all)
// makes the whole file kInvalidArgument, naming the file and the line number, never the secret.
// The secrets are wiped when the ring is destroyed. Move-only (a moved-from ring holds no key and
// may only be destroyed or assigned to); Sign and Verify are safe to call from many threads at once.
class HmacKeyRing {
 public:
  static constexpr size_t kMaxKeyIdSize = 32;
  static constexpr size_t kMinSecretSize = 32;
  static constexpr size_t kMaxSecretSize = 64;

  // Reads a file in the format above. kNotFound if it is missing; kFailedPrecondition for its
  // owner or mode as SigningKey::LoadFile (same override); kInvalidArgument if malformed.
  static Result<HmacKeyRing> LoadFile(const std::string& path, bool allow_insecure_file = false);
  // The same format from memory; `what` names the source in errors (a file name).
  static Result<HmacKeyRing> Parse(std::string_view text, const std::string& what);
  // Creates `path` with one fresh key "k" + 8 random hex digits (32 random bytes) under a comment
  // header, mode 0600 (parents 0700). Fails if the file exists, as FileKekProvider::Generate.
  static Status GenerateFile(const std::string& path);
  // One key line "<key id> <64 hex digits>\n" with 32 fresh random bytes, for a rotation.
  static std::string NewKeyLine(const std::string& key_id);

  HmacKeyRing(HmacKeyRing&&) noexcept = default;
  HmacKeyRing& operator=(HmacKeyRing&&) noexcept = default;
  HmacKeyRing(const HmacKeyRing&) = delete;
  HmacKeyRing& operator=(const HmacKeyRing&) = delete;

  // The id of the key that signs (the first line's).
  const std::string& signing_key_id() const { return keys_.front().id; }
  // Every key id, in file order (the signing key's first).
  std::vector<std::string> key_ids() const;
  // True iff the ring holds a key of this id.
  bool Holds(std::string_view key_id) const;
  // HMAC-SHA-256 of `data` under the signing key (32 bytes).
  std::string Sign(std::string_view data) const;
  // True iff `tag` is the full 32-byte HMAC-SHA-256 of `data` under the key `key_id` (compared in
  // constant time). False for an id the ring does not hold and for a tag of any other length.
  bool Verify(std::string_view key_id, std::string_view data, std::string_view tag) const;

 private:
  struct Key {
    std::string id;
    SecureBytes secret;
  };
  explicit HmacKeyRing(std::vector<Key> keys) : keys_(std::move(keys)) {}
  std::vector<Key> keys_;  // never empty
};

// Key id of an Ed25519 public key: "ed25519:" + first 16 hex chars of SHA-256(raw public key).
std::string KeyIdFor(std::string_view public_key_raw);

// An Ed25519 signing key. Move-only. Sign() is safe to call from many threads at once.
class SigningKey {
 public:
  static Result<SigningKey> Generate();
  // The key whose RFC 8032 private key (seed) is these 32 raw bytes (a C2SP note key's, a test
  // vector's). kInvalidArgument for another length.
  static Result<SigningKey> FromSeed(std::string_view seed);
  // Loads a PKCS#8 PEM private key. kNotFound if the file is missing, kInvalidArgument if it is
  // not an Ed25519 key. kFailedPrecondition if the file is not owned by the effective uid or
  // gives group/other any permission (oml::CheckKeyFilePermissions, common/secret_file.h);
  // `allow_insecure_file` (config allow_insecure_key_files) logs a warning instead.
  static Result<SigningKey> LoadFile(const std::string& path, bool allow_insecure_file = false);
  // Writes PKCS#8 PEM with mode 0600 (created with that mode; never world-readable even
  // briefly). Creates parent directories with mode 0700. Fails if the file exists.
  Status SaveFile(const std::string& path) const;

  SigningKey(SigningKey&&) noexcept;
  SigningKey& operator=(SigningKey&&) noexcept;
  SigningKey(const SigningKey&) = delete;
  SigningKey& operator=(const SigningKey&) = delete;
  ~SigningKey();

  const std::string& public_key() const { return public_key_; }  // 32 raw bytes
  const std::string& key_id() const { return key_id_; }
  // 64-byte Ed25519 signature over msg.
  std::string Sign(std::string_view msg) const;

 private:
  struct Impl;
  explicit SigningKey(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  std::string public_key_;
  std::string key_id_;
};

// An Ed25519 public key, parsed once, for verifying many signatures (`oml verify` checks every
// event of a chain under the same few keys; re-creating the OpenSSL key per signature costs
// ~5% of a verification). Copies share the key. Verify() is safe to call from many threads.
class PublicKey {
 public:
  // kInvalidArgument unless `raw` is 32 bytes that OpenSSL accepts as an Ed25519 public key.
  static Result<PublicKey> FromRaw(std::string_view raw);
  PublicKey() = default;  // verifies nothing
  // True iff `signature` (64 bytes) is a valid Ed25519 signature of msg under this key.
  bool Verify(std::string_view msg, std::string_view signature) const;
  const std::string& raw() const { return raw_; }

 private:
  std::shared_ptr<evp_pkey_st> pkey_;  // read-only once made
  std::string raw_;
};

// True iff `signature` (64 bytes) is a valid Ed25519 signature of msg under the raw 32-byte key.
bool Ed25519Verify(std::string_view public_key_raw, std::string_view msg, std::string_view signature);

// ---------------------------------------------------------------------------------------------
// Segmented AEAD (AES-256-GCM), streaming: bodies now, large attachments later, same code.
//
// Ciphertext framing:
//   +--------+---------+-------------------+--------------------+
//   | "OMLE" | ver=0x01| segment_size u32BE| nonce_prefix (7 B) |   header, 16 bytes
//   +--------+---------+-------------------+--------------------+
//   | segment 0: AES-256-GCM(plaintext[0 .. segment_size)) || tag(16)         |
//   | ...                                                                      |
//   | segment n-1 (last, 0..segment_size bytes of plaintext) || tag(16)        |
//   +-------------------------------------------------------------------------+
//   nonce(segment i) = nonce_prefix(7) || i as u32BE (4) || last_flag (1: 0x01 last, 0x00 not)
//   AAD(segment i)   = the caller's associated data (e.g. tenant/artifact id), same for all.
// Every segment but the last holds exactly segment_size plaintext bytes; the last holds
// 0..segment_size bytes, so an empty body is one empty, tagged segment. Truncation, reordering
// and extension are detected by the index and last flag in the nonce.
inline constexpr uint32_t kDefaultSegmentSize = 64 * 1024;
inline constexpr size_t kAeadHeaderSize = 16;
inline constexpr size_t kAeadTagSize = 16;
inline constexpr size_t kAeadNoncePrefixSize = 7;

// Where an encryptor stands between two Update calls: enough to go on with the same stream in
// another process (resumable uploads, src/uploads). Everything but `pending` may be stored in
// the clear; `pending` is plaintext (store it sealed).
struct AeadEncryptorState {
  uint32_t segment_size = kDefaultSegmentSize;
  std::string nonce_prefix;    // kAeadNoncePrefixSize bytes, fixed for the stream
  uint64_t next_segment = 0;   // segments sealed (and emitted) so far
  bool header_sent = false;    // the 16-byte header was emitted
  SecureBytes pending;         // plaintext not yet sealed: 0..segment_size bytes
};

// Encrypts a stream chunk by chunk. Feed any chunk sizes; output is the framing above.
class AeadStreamEncryptor {
 public:
  // dek: 32 bytes. kInvalidArgument otherwise.
  static Result<std::unique_ptr<AeadStreamEncryptor>> Create(std::string_view dek, std::string aad,
                                                              uint32_t segment_size = kDefaultSegmentSize);
  // Goes on with a stream from a state Suspend() returned (possibly in another process): the
  // ciphertext it emits continues the ciphertext emitted before the state was taken, byte for
  // byte as if one encryptor had seen the whole plaintext. kInvalidArgument for a dek that is
  // not 32 bytes, a segment size outside [1, 16 MiB], a nonce prefix of the wrong size, pending
  // longer than the segment size, pending or segments without the header, or a segment index
  // past 2^32.
  // REQUIRES: a state is continued with one plaintext only. Resuming the same state twice with
  // different plaintext seals two segments under one nonce (AES-GCM then leaks their XOR and
  // its authentication key): a caller that may retry a continuation (a failed upload chunk sent
  // again) must send the same bytes, or resume from a newer state.
  static Result<std::unique_ptr<AeadStreamEncryptor>> Resume(std::string_view dek, std::string aad,
                                                              AeadEncryptorState state);
  virtual ~AeadStreamEncryptor() = default;
  // Returns ciphertext bytes ready so far (the header first time, then complete segments).
  Result<std::string> Update(std::string_view plaintext) {
    std::string out;
    OML_RETURN_IF_ERROR(UpdateInto(plaintext, &out));
    return out;
  }
  // Update's bytes, replacing *out's. *out's memory is reused: a caller that passes one string
  // for pieces of one size allocates and zero-fills nothing after the first. On error *out is
  // empty (and the error sticky, as Update's).
  virtual Status UpdateInto(std::string_view plaintext, std::string* out) = 0;
  // Returns the remaining ciphertext (the last segment). Call exactly once.
  virtual Result<std::string> Finish() = 0;
  // A copy of the state after the last Update (the encryptor stays usable). kFailedPrecondition
  // after Finish; the sticky error after a failure.
  virtual Result<AeadEncryptorState> Suspend() const = 0;
};

// Decrypts the framing above. Any tampering yields kDataLoss with type "integrity".
class AeadStreamDecryptor {
 public:
  static Result<std::unique_ptr<AeadStreamDecryptor>> Create(std::string_view dek, std::string aad);
  // Random access: decrypts from segment `first_segment` on. `header` is the stream's first
  // kAeadHeaderSize bytes (kDataLoss "integrity" if malformed); Update then takes the ciphertext
  // from byte kAeadHeaderSize + first_segment * (segment_size + kAeadTagSize) on, and every
  // segment is authenticated under its own index as with Create (a segment fed at the wrong
  // place fails its tag). Finish still requires the stream's last segment. *segment_size (if
  // not null) receives the header's segment size.
  static Result<std::unique_ptr<AeadStreamDecryptor>> CreateAt(std::string_view dek, std::string aad,
                                                               std::string_view header, uint64_t first_segment,
                                                               uint32_t* segment_size = nullptr);
  virtual ~AeadStreamDecryptor() = default;
  // Returns plaintext authenticated so far. Never returns bytes of a segment whose tag failed.
  Result<std::string> Update(std::string_view ciphertext) {
    std::string out;
    OML_RETURN_IF_ERROR(UpdateInto(ciphertext, &out));
    return out;
  }
  // Update's bytes, replacing *out's; *out's memory is reused (a caller that passes one string for
  // pieces of one size allocates and zero-fills nothing after the first). On error *out is empty.
  virtual Status UpdateInto(std::string_view ciphertext, std::string* out) = 0;
  // Verifies the stream ended with a last segment; returns any remaining plaintext.
  virtual Result<std::string> Finish() = 0;
};

// One-shot helpers over the stream classes.
Result<std::string> EncryptAll(std::string_view dek, const std::string& aad, std::string_view plaintext,
                               uint32_t segment_size = kDefaultSegmentSize);
Result<std::string> DecryptAll(std::string_view dek, const std::string& aad, std::string_view ciphertext);

// ---------------------------------------------------------------------------------------------
// Key encryption keys. A KekProvider wraps per-artifact DEKs; a KMS can replace the file one.
// Every wrapped DEK is stored with the id of the KEK that wrapped it (oml.artifact_keys.kek_id),
// so a KEK rotation can re-wrap DEKs one by one while readers unwrap each under its own KEK.
// Implementations are thread-safe.
class KekProvider {
 public:
  virtual ~KekProvider() = default;
  // Stable identifier of the KEK that Wrap uses, stored next to each wrapped DEK. Derived from
  // the key (never the key itself) so it can be published in the journal and the database.
  virtual std::string kek_id() const = 0;
  // True iff this provider can unwrap DEKs recorded under `kek_id`.
  virtual bool Holds(std::string_view kek_id) const { return kek_id == this->kek_id(); }
  // Wraps a 32-byte DEK under kek_id(); aad binds the wrap to its owner (tenant/artifact).
  virtual Result<std::string> Wrap(std::string_view dek, std::string_view aad) const = 0;
  // Unwraps under kek_id(). kDataLoss (type "integrity") if the wrapped bytes or aad were
  // altered, or the DEK was wrapped under another KEK.
  virtual Result<SecureBytes> Unwrap(std::string_view wrapped, std::string_view aad) const = 0;
  // Unwraps a DEK recorded under `kek_id`: kUnavailable "kek-unavailable" if this provider holds
  // no KEK of that id (a configuration problem, e.g. a rotation in progress without the previous
  // KEK loaded); otherwise as Unwrap under that KEK.
  virtual Result<SecureBytes> UnwrapFrom(std::string_view kek_id, std::string_view wrapped,
                                         std::string_view aad) const;
};

// KEK from a file holding 32 random bytes (hex-encoded, one line). Wrap format:
//   nonce(12) || AES-256-GCM(dek) (32) || tag(16)  = 60 bytes.
// kek_id = "file:" + first 16 hex of SHA-256("oml-kek-id/v1" || 0x00 || kek): domain-separated,
// so the id is never a digest of the bare key that another use could share. DEKs wrapped before
// sql/0006 carry the legacy id "file:" + first 16 hex of SHA-256(kek); Holds() accepts it too,
// and `oml kek rotate` re-records them under the current id.
// The key bytes are wiped when the provider is destroyed.
class FileKekProvider : public KekProvider {
 public:
  // Loads the KEK; kNotFound if the file is missing, kInvalidArgument if malformed,
  // kFailedPrecondition for its owner or mode as SigningKey::LoadFile (same override).
  static Result<std::unique_ptr<FileKekProvider>> Load(const std::string& path, bool allow_insecure_file = false);
  // Creates a new random KEK file with mode 0600 (parents 0700). Fails if it exists.
  static Status Generate(const std::string& path);

  std::string kek_id() const override { return kek_id_; }
  bool Holds(std::string_view kek_id) const override { return kek_id == kek_id_ || kek_id == legacy_id_; }
  Result<std::string> Wrap(std::string_view dek, std::string_view aad) const override;
  Result<SecureBytes> Unwrap(std::string_view wrapped, std::string_view aad) const override;

 private:
  FileKekProvider(SecureBytes kek, std::string id, std::string legacy_id)
      : kek_(std::move(kek)), kek_id_(std::move(id)), legacy_id_(std::move(legacy_id)) {}
  SecureBytes kek_;
  std::string kek_id_;
  std::string legacy_id_;
};

// The KEKs a process holds: one primary that wraps new DEKs, and previous ones that only
// unwrap (the KEKs a rotation in progress moves DEKs away from). UnwrapFrom picks the KEK by the
// DEK's recorded kek_id. Owns its providers.
class KekRing : public KekProvider {
 public:
  // REQUIRES: primary != nullptr; no entry of `previous` is null.
  KekRing(std::unique_ptr<KekProvider> primary, std::vector<std::unique_ptr<KekProvider>> previous)
      : primary_(std::move(primary)), previous_(std::move(previous)) {}

  std::string kek_id() const override { return primary_->kek_id(); }
  bool Holds(std::string_view kek_id) const override;
  Result<std::string> Wrap(std::string_view dek, std::string_view aad) const override { return primary_->Wrap(dek, aad); }
  Result<SecureBytes> Unwrap(std::string_view wrapped, std::string_view aad) const override {
    return primary_->Unwrap(wrapped, aad);
  }
  Result<SecureBytes> UnwrapFrom(std::string_view kek_id, std::string_view wrapped,
                                 std::string_view aad) const override;
  // Ids of the unwrap-only KEKs, in the order given.
  std::vector<std::string> previous_ids() const;

 private:
  std::unique_ptr<KekProvider> primary_;
  std::vector<std::unique_ptr<KekProvider>> previous_;
};

}  // namespace oml::crypto
