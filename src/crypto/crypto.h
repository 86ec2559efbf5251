// Cryptographic primitives for oml, all on OpenSSL 3. Binary values travel as std::string
// holding raw bytes. Every function here is thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "common/status.h"

struct evp_pkey_st;  // OpenSSL's EVP_PKEY

namespace oml::crypto {

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

// Key id of an Ed25519 public key: "ed25519:" + first 16 hex chars of SHA-256(raw public key).
std::string KeyIdFor(std::string_view public_key_raw);

// An Ed25519 signing key. Move-only. Sign() is safe to call from many threads at once.
class SigningKey {
 public:
  static Result<SigningKey> Generate();
  // Loads a PKCS#8 PEM private key. kNotFound if the file is missing, kInvalidArgument if it is
  // not an Ed25519 key.
  static Result<SigningKey> LoadFile(const std::string& path);
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

// Encrypts a stream chunk by chunk. Feed any chunk sizes; output is the framing above.
class AeadStreamEncryptor {
 public:
  // dek: 32 bytes. kInvalidArgument otherwise.
  static Result<std::unique_ptr<AeadStreamEncryptor>> Create(std::string_view dek, std::string aad,
                                                              uint32_t segment_size = kDefaultSegmentSize);
  virtual ~AeadStreamEncryptor() = default;
  // Returns ciphertext bytes ready so far (the header first time, then complete segments).
  virtual Result<std::string> Update(std::string_view plaintext) = 0;
  // Returns the remaining ciphertext (the last segment). Call exactly once.
  virtual Result<std::string> Finish() = 0;
};

// Decrypts the framing above. Any tampering yields kDataLoss with type "integrity".
class AeadStreamDecryptor {
 public:
  static Result<std::unique_ptr<AeadStreamDecryptor>> Create(std::string_view dek, std::string aad);
  virtual ~AeadStreamDecryptor() = default;
  // Returns plaintext authenticated so far. Never returns bytes of a segment whose tag failed.
  virtual Result<std::string> Update(std::string_view ciphertext) = 0;
  // Verifies the stream ended with a last segment; returns any remaining plaintext.
  virtual Result<std::string> Finish() = 0;
};

// One-shot helpers over the stream classes.
Result<std::string> EncryptAll(std::string_view dek, const std::string& aad, std::string_view plaintext,
                               uint32_t segment_size = kDefaultSegmentSize);
Result<std::string> DecryptAll(std::string_view dek, const std::string& aad, std::string_view ciphertext);

// ---------------------------------------------------------------------------------------------
// Key encryption keys. A KekProvider wraps per-artifact DEKs; a KMS can replace the file one.
class KekProvider {
 public:
  virtual ~KekProvider() = default;
  // Stable identifier of the KEK, stored next to each wrapped DEK.
  virtual std::string kek_id() const = 0;
  // Wraps a 32-byte DEK; aad binds the wrap to its owner (tenant/artifact).
  virtual Result<std::string> Wrap(std::string_view dek, std::string_view aad) const = 0;
  // kDataLoss (type "integrity") if the wrapped bytes or aad were altered.
  virtual Result<std::string> Unwrap(std::string_view wrapped, std::string_view aad) const = 0;
};

// KEK from a file holding 32 random bytes (hex-encoded, one line). Wrap format:
//   nonce(12) || AES-256-GCM(dek) (32) || tag(16)  = 60 bytes.
// kek_id = "file:" + first 16 hex of SHA-256(kek).
class FileKekProvider : public KekProvider {
 public:
  // Loads the KEK; kNotFound if the file is missing.
  static Result<std::unique_ptr<FileKekProvider>> Load(const std::string& path);
  // Creates a new random KEK file with mode 0600 (parents 0700). Fails if it exists.
  static Status Generate(const std::string& path);

  std::string kek_id() const override { return kek_id_; }
  Result<std::string> Wrap(std::string_view dek, std::string_view aad) const override;
  Result<std::string> Unwrap(std::string_view wrapped, std::string_view aad) const override;

 private:
  FileKekProvider(std::string kek, std::string id) : kek_(std::move(kek)), kek_id_(std::move(id)) {}
  std::string kek_;
  std::string kek_id_;
};

}  // namespace oml::crypto
