// Implementation of src/crypto/crypto.h on OpenSSL 3 (EVP APIs only).
//
// Conventions used throughout this file:
//   * Every OpenSSL object is owned by a std::unique_ptr with a matching deleter, so early
//     returns never leak.
//   * OpenSSL reports failures through a thread-local error queue. Any path that observes a
//     failure drains that queue (DrainOpenSslErrors) so stale entries never leak into unrelated
//     later calls on the same thread.
//   * Calls that can only fail on memory exhaustion or a broken library, and whose public
//     signature has no error channel (Sha256, RandomBytes, Sign), abort the process via Die().
//     Continuing with a wrong digest, a non-random nonce or an empty signature would be worse.
//   * Secret bytes held in std::string (file contents, pending plaintext) are wiped with
//     OPENSSL_cleanse before release where this file owns them.
#include "crypto/crypto.h"

#include <atomic>

#include "common/sync_point.h"

#include "common/secret_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/bio.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <utility>

namespace oml::crypto {

namespace {
std::atomic<uint64_t> g_key_material_uses{0};
}  // namespace

void NoteKeyMaterialUse() {
  g_key_material_uses.fetch_add(1, std::memory_order_relaxed);
  (void)OML_SYNC_POINT("crypto.key_material");
}

uint64_t KeyMaterialUses() { return g_key_material_uses.load(std::memory_order_relaxed); }

namespace {

// ---------------------------------------------------------------------------------------------
// OpenSSL plumbing.

// Returns all queued OpenSSL errors of this thread as one "; "-joined string and clears the
// queue. Never empty: returns a placeholder when the queue held nothing.
std::string DrainOpenSslErrors() {
  std::string out;
  char buf[256];
  for (unsigned long e = ERR_get_error(); e != 0; e = ERR_get_error()) {
    ERR_error_string_n(e, buf, sizeof buf);
    if (!out.empty()) out += "; ";
    out += buf;
  }
  return out.empty() ? std::string("no OpenSSL error queued") : out;
}

// Aborts the process after reporting `what` and the OpenSSL error queue on stderr. Reserved for
// failures that cannot happen on a healthy system and cannot be reported through the API.
[[noreturn]] void Die(const char* what) {
  std::fprintf(stderr, "oml crypto: fatal: %s: %s\n", what, DrainOpenSslErrors().c_str());
  std::abort();
}

// Returns an internal error whose message names the failed operation and OpenSSL's reasons.
Status OpenSslFailure(const std::string& what) { return Internal(what + ": " + DrainOpenSslErrors()); }

struct PkeyDeleter {
  void operator()(EVP_PKEY* p) const { EVP_PKEY_free(p); }
};
struct PkeyCtxDeleter {
  void operator()(EVP_PKEY_CTX* p) const { EVP_PKEY_CTX_free(p); }
};
struct MdCtxDeleter {
  void operator()(EVP_MD_CTX* p) const { EVP_MD_CTX_free(p); }
};
struct CipherCtxDeleter {
  // EVP_CIPHER_CTX_free also cleanses the expanded key schedule.
  void operator()(EVP_CIPHER_CTX* p) const { EVP_CIPHER_CTX_free(p); }
};
struct BioDeleter {
  void operator()(BIO* p) const { BIO_free(p); }
};
using PkeyPtr = std::unique_ptr<EVP_PKEY, PkeyDeleter>;
using PkeyCtxPtr = std::unique_ptr<EVP_PKEY_CTX, PkeyCtxDeleter>;
using MdCtxPtr = std::unique_ptr<EVP_MD_CTX, MdCtxDeleter>;
using CipherCtxPtr = std::unique_ptr<EVP_CIPHER_CTX, CipherCtxDeleter>;
using BioPtr = std::unique_ptr<BIO, BioDeleter>;

// Views bytes as `const unsigned char*` for OpenSSL. Never returns nullptr (an empty
// std::string_view may carry a null data pointer, which some OpenSSL paths reject even for
// zero lengths).
const unsigned char* Bytes(std::string_view s) {
  static const unsigned char kEmpty = 0;
  return s.data() == nullptr ? &kEmpty : reinterpret_cast<const unsigned char*>(s.data());
}
unsigned char* MutableBytes(std::string& s) { return reinterpret_cast<unsigned char*>(s.data()); }

// Appends `v` to *out as 4 big-endian bytes.
void PutU32BE(uint32_t v, std::string* out) {
  out->push_back(static_cast<char>((v >> 24) & 0xff));
  out->push_back(static_cast<char>((v >> 16) & 0xff));
  out->push_back(static_cast<char>((v >> 8) & 0xff));
  out->push_back(static_cast<char>(v & 0xff));
}

// Reads 4 big-endian bytes at p.
uint32_t GetU32BE(const char* p) {
  const auto* u = reinterpret_cast<const unsigned char*>(p);
  return (uint32_t{u[0]} << 24) | (uint32_t{u[1]} << 16) | (uint32_t{u[2]} << 8) | uint32_t{u[3]};
}

// ---------------------------------------------------------------------------------------------
// Files.

std::string ErrnoText(int err) { return std::strerror(err); }

// Reads the whole file at `path`. kNotFound if it does not exist, kInternal on other I/O
// errors. The caller owns (and should Wipe) the returned bytes if they are secret.
Result<std::string> ReadWholeFile(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    if (err == ENOENT) return NotFound("no such file: " + path);
    return Internal("cannot open " + path + ": " + ErrnoText(err));
  }
  std::string data;
  struct stat st;
  // Reserve up front so the buffer holding secrets is not reallocated (leaving stale copies).
  if (::fstat(fd, &st) == 0 && st.st_size > 0) data.reserve(static_cast<size_t>(st.st_size) + 1);
  char buf[4096];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      ::close(fd);
      OPENSSL_cleanse(buf, sizeof buf);
      Wipe(&data);
      return Internal("cannot read " + path + ": " + ErrnoText(err));
    }
    if (n == 0) break;
    data.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  OPENSSL_cleanse(buf, sizeof buf);
  return data;
}

// Creates every missing ancestor directory of `path` with mode exactly 0700 (existing ones are
// left untouched, whatever their mode). Fails with kFailedPrecondition if an ancestor exists but
// is not a directory, kInternal on other errors.
Status CreateParentDirs(const std::string& path) {
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  std::filesystem::path cur;
  for (const auto& part : parent) {
    cur /= part;
    struct stat st;
    // Look before creating, so existing ancestors (e.g. on read-only mounts) never reach mkdir.
    if (::stat(cur.c_str(), &st) == 0) {
      if (!S_ISDIR(st.st_mode)) return FailedPrecondition("not a directory: " + cur.string());
      continue;
    }
    if (errno != ENOENT) return Internal("cannot stat " + cur.string() + ": " + ErrnoText(errno));
    if (::mkdir(cur.c_str(), 0700) != 0) {
      const int err = errno;
      // Lost a race with a concurrent creator: fine if it made a directory.
      if (err == EEXIST && ::stat(cur.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) continue;
      return Internal("cannot create directory " + cur.string() + ": " + ErrnoText(err));
    }
    // The umask may have narrowed the mode; pin it to exactly 0700.
    if (::chmod(cur.c_str(), 0700) != 0) {
      return Internal("cannot chmod directory " + cur.string() + ": " + ErrnoText(errno));
    }
  }
  return Status::Ok();
}

// Creates `path` (which must not exist) with mode exactly 0600 holding `contents`, atomically
// and durably (oml::WriteSecretFile, common/secret_file.h: temp file created 0600, fsync,
// rename without replace). Missing parent directories are created with mode 0700. An existing
// file or symlink at `path` is never followed or overwritten: kFailedPrecondition. Other
// failures leave nothing behind and return kInternal.
Status WriteNewPrivateFile(const std::string& path, std::string_view contents) {
  OML_RETURN_IF_ERROR(CreateParentDirs(path));
  return WriteSecretFile(path, contents, 0600, IfExists::kRefuse);
}

// ---------------------------------------------------------------------------------------------
// AES-256-GCM records.

constexpr size_t kGcmKeySize = 32;
constexpr size_t kGcmNonceSize = 12;
constexpr size_t kGcmTagSize = 16;
static_assert(kGcmTagSize == kAeadTagSize);

// An AES-256-GCM cipher context with its key installed once, sealing or opening independent
// records (nonce, aad, bytes, tag). Not thread-safe: use one instance per stream or per call.
class Gcm {
 public:
  // Creates a context for `key` (exactly 32 bytes, checked by the caller) that encrypts if
  // `encrypt`, else decrypts.
  static Result<Gcm> Create(std::string_view key, bool encrypt) {
    if (key.size() != kGcmKeySize) return InvalidArgument("AES-256-GCM key must be 32 bytes");
    CipherCtxPtr ctx(EVP_CIPHER_CTX_new());
    if (!ctx) return OpenSslFailure("EVP_CIPHER_CTX_new");
    if (EVP_CipherInit_ex(ctx.get(), EVP_aes_256_gcm(), nullptr, Bytes(key), nullptr, encrypt ? 1 : 0) != 1) {
      return OpenSslFailure("AES-256-GCM init");
    }
    return Gcm(std::move(ctx));
  }

  // Encrypts `plaintext` under `nonce` (12 bytes) and `aad`, appending ciphertext || tag(16)
  // to *out. Requires: created with encrypt = true; plaintext.size() <= INT_MAX.
  Status Seal(const unsigned char* nonce, std::string_view aad, std::string_view plaintext, std::string* out) {
    if (plaintext.size() > static_cast<size_t>(INT_MAX)) return InvalidArgument("AES-GCM record too large");
    const size_t base = out->size();
    out->resize(base + plaintext.size() + kGcmTagSize);
    Status s = SealTo(nonce, aad, plaintext, reinterpret_cast<unsigned char*>(out->data()) + base);
    if (!s.ok()) out->resize(base);
    return s;
  }

  // Seal's work, writing ciphertext || tag(16) at dst (plaintext.size() + 16 bytes).
  Status SealTo(const unsigned char* nonce, std::string_view aad, std::string_view plaintext, unsigned char* dst) {
    if (plaintext.size() > static_cast<size_t>(INT_MAX)) return InvalidArgument("AES-GCM record too large");
    OML_RETURN_IF_ERROR(Begin(nonce, aad));
    int len = 0;
    if (!plaintext.empty() &&
        (EVP_CipherUpdate(ctx_.get(), dst, &len, Bytes(plaintext), static_cast<int>(plaintext.size())) != 1 ||
         static_cast<size_t>(len) != plaintext.size()))
      return OpenSslFailure("AES-GCM encrypt");
    int tail = 0;
    if (EVP_CipherFinal_ex(ctx_.get(), dst + plaintext.size(), &tail) != 1 || tail != 0 ||
        EVP_CIPHER_CTX_ctrl(ctx_.get(), EVP_CTRL_AEAD_GET_TAG, static_cast<int>(kGcmTagSize),
                            dst + plaintext.size()) != 1)
      return OpenSslFailure("AES-GCM finish");
    return Status::Ok();
  }

  // Decrypts `ciphertext` with `tag` (16 bytes) under `nonce` and `aad`. On success appends
  // the plaintext to *out and returns true. If the tag does not verify, returns false and
  // leaves *out unchanged (unauthenticated plaintext is wiped, never exposed). Library
  // failures are returned as kInternal. Requires: created with encrypt = false.
  Result<bool> Open(const unsigned char* nonce, std::string_view aad, std::string_view ciphertext,
                    std::string_view tag, std::string* out) {
    if (ciphertext.size() > static_cast<size_t>(INT_MAX)) return InvalidArgument("AES-GCM record too large");
    const size_t base = out->size();
    out->resize(base + ciphertext.size());
    auto opened = OpenTo(nonce, aad, ciphertext, tag, reinterpret_cast<unsigned char*>(out->data()) + base);
    if (!opened.ok() || !*opened) out->resize(base);
    return opened;
  }

  // Open's work, writing the plaintext at dst (ciphertext.size() bytes), which is wiped unless
  // the tag verified.
  Result<bool> OpenTo(const unsigned char* nonce, std::string_view aad, std::string_view ciphertext,
                      std::string_view tag, unsigned char* dst) {
    if (ciphertext.size() > static_cast<size_t>(INT_MAX)) return InvalidArgument("AES-GCM record too large");
    if (tag.size() != kGcmTagSize) return false;
    OML_RETURN_IF_ERROR(Begin(nonce, aad));
    int len = 0;
    if (!ciphertext.empty() &&
        (EVP_CipherUpdate(ctx_.get(), dst, &len, Bytes(ciphertext), static_cast<int>(ciphertext.size())) != 1 ||
         static_cast<size_t>(len) != ciphertext.size())) {
      OPENSSL_cleanse(dst, ciphertext.size());
      return OpenSslFailure("AES-GCM decrypt");
    }
    unsigned char tag_copy[kGcmTagSize];  // the ctrl API wants a mutable buffer
    std::memcpy(tag_copy, tag.data(), kGcmTagSize);
    if (EVP_CIPHER_CTX_ctrl(ctx_.get(), EVP_CTRL_AEAD_SET_TAG, static_cast<int>(kGcmTagSize), tag_copy) != 1) {
      OPENSSL_cleanse(dst, ciphertext.size());
      return OpenSslFailure("AES-GCM set tag");
    }
    int tail = 0;
    if (EVP_CipherFinal_ex(ctx_.get(), dst + ciphertext.size(), &tail) <= 0) {
      // Tag mismatch: the only way decrypt-final fails once the tag is set.
      (void)DrainOpenSslErrors();
      OPENSSL_cleanse(dst, ciphertext.size());
      return false;
    }
    return true;
  }

 private:
  explicit Gcm(CipherCtxPtr ctx) : ctx_(std::move(ctx)) {}

  // Starts a new record: installs the 12-byte nonce (keeping the key and direction) and feeds
  // the AAD, in chunks so that any AAD length fits OpenSSL's int lengths.
  Status Begin(const unsigned char* nonce, std::string_view aad) {
    if (EVP_CipherInit_ex(ctx_.get(), nullptr, nullptr, nullptr, nonce, -1) != 1) {
      return OpenSslFailure("AES-GCM set nonce");
    }
    while (!aad.empty()) {
      const size_t n = std::min(aad.size(), static_cast<size_t>(1) << 30);
      int len = 0;
      if (EVP_CipherUpdate(ctx_.get(), nullptr, &len, Bytes(aad), static_cast<int>(n)) != 1) {
        return OpenSslFailure("AES-GCM aad");
      }
      aad.remove_prefix(n);
    }
    return Status::Ok();
  }

  CipherCtxPtr ctx_;
};

// ---------------------------------------------------------------------------------------------
// Segmented stream framing (see crypto.h).

constexpr char kAeadMagic[4] = {'O', 'M', 'L', 'E'};
constexpr unsigned char kAeadVersion = 0x01;
constexpr size_t kNoncePrefixSize = 7;
constexpr uint32_t kMaxSegmentSize = 16u * 1024 * 1024;
constexpr uint64_t kMaxSegments = uint64_t{1} << 32;  // indices are u32
static_assert(4 + 1 + 4 + kNoncePrefixSize == kAeadHeaderSize);
static_assert(kNoncePrefixSize + 4 + 1 == kGcmNonceSize);
static_assert(kNoncePrefixSize == kAeadNoncePrefixSize);

Status IntegrityError(const std::string& what) { return DataLoss("ciphertext integrity: " + what, "integrity"); }

// nonce(segment i) = prefix(7) || i as u32BE || last flag (0x01 last, 0x00 otherwise).
std::array<unsigned char, kGcmNonceSize> SegmentNonce(std::string_view prefix, uint32_t index, bool last) {
  std::array<unsigned char, kGcmNonceSize> n{};
  std::memcpy(n.data(), prefix.data(), kNoncePrefixSize);
  n[7] = static_cast<unsigned char>(index >> 24);
  n[8] = static_cast<unsigned char>(index >> 16);
  n[9] = static_cast<unsigned char>(index >> 8);
  n[10] = static_cast<unsigned char>(index);
  n[11] = last ? 0x01 : 0x00;
  return n;
}

// Encryptor. Invariant: pending_ holds at most segment_size_ plaintext bytes that are not yet
// sealed. A full pending_ is sealed as a non-last segment only once at least one more byte
// arrives, so the layout is canonical (independent of how the input was chunked): a stream of
// n bytes always has max(1, ceil(n / segment_size)) segments. Any error is sticky.
class SegmentedEncryptor final : public AeadStreamEncryptor {
 public:
  SegmentedEncryptor(Gcm gcm, std::string aad, uint32_t segment_size, std::string nonce_prefix)
      : gcm_(std::move(gcm)), aad_(std::move(aad)), segment_size_(segment_size), prefix_(std::move(nonce_prefix)) {
    pending_.reserve(segment_size_);
  }
  // Resumes a suspended stream. REQUIRES: the state was checked by AeadStreamEncryptor::Resume.
  SegmentedEncryptor(Gcm gcm, std::string aad, AeadEncryptorState st)
      : SegmentedEncryptor(std::move(gcm), std::move(aad), st.segment_size, std::move(st.nonce_prefix)) {
    pending_.append(st.pending.view());  // reserved above: no reallocation leaves a copy behind
    next_index_ = st.next_segment;
    header_sent_ = st.header_sent;
  }
  ~SegmentedEncryptor() override { Wipe(&pending_); }

  Status UpdateInto(std::string_view plaintext, std::string* out) override {
    if (Status s = CheckUsable(); !s.ok()) {
      out->clear();
      return s;
    }
    // The segments sealed now: every full one that more bytes follow (the class invariant).
    const size_t total = pending_.size() + plaintext.size();
    const size_t segments = total == 0 ? 0 : (total - 1) / segment_size_;
    std::string header;
    AppendHeaderOnce(&header);
    out->resize(header.size() + segments * (size_t{segment_size_} + kAeadTagSize));
    auto* dst = reinterpret_cast<unsigned char*>(out->data());
    std::memcpy(dst, header.data(), header.size());
    dst += header.size();
    auto seal = [&](std::string_view segment) {
      Status s = Fail(SealSegmentTo(segment, /*last=*/false, dst));
      dst += segment.size() + kGcmTagSize;
      if (!s.ok()) out->clear();
      return s;
    };
    while (pending_.size() + plaintext.size() > segment_size_) {
      if (pending_.empty()) {
        // Fast path: seal straight from the caller's buffer.
        OML_RETURN_IF_ERROR(seal(plaintext.substr(0, segment_size_)));
        plaintext.remove_prefix(segment_size_);
      } else {
        const size_t take = segment_size_ - pending_.size();
        pending_.append(plaintext.substr(0, take));
        plaintext.remove_prefix(take);
        OML_RETURN_IF_ERROR(seal(pending_));
        Wipe(&pending_);
      }
    }
    pending_.append(plaintext);
    return Status::Ok();
  }

  Result<AeadEncryptorState> Suspend() const override {
    OML_RETURN_IF_ERROR(CheckUsable());
    AeadEncryptorState st;
    st.segment_size = segment_size_;
    st.nonce_prefix = prefix_;
    st.next_segment = next_index_;
    st.header_sent = header_sent_;
    std::string copy;
    copy.reserve(segment_size_);  // on the heap: SecureBytes takes the buffer over, no stray copy
    copy.append(pending_);
    st.pending = SecureBytes(std::move(copy));
    return st;
  }

  Result<std::string> Finish() override {
    OML_RETURN_IF_ERROR(CheckUsable());
    finished_ = true;
    std::string out;
    out.reserve(kAeadHeaderSize + pending_.size() + kAeadTagSize);
    AppendHeaderOnce(&out);
    Status s = SealSegment(pending_, /*last=*/true, &out);
    Wipe(&pending_);
    OML_RETURN_IF_ERROR(Fail(std::move(s)));
    return out;
  }

 private:
  // kFailedPrecondition after Finish, the sticky error after a failure, else OK.
  Status CheckUsable() const {
    if (!error_.ok()) return error_;
    if (finished_) return FailedPrecondition("AEAD encryptor used after Finish");
    return Status::Ok();
  }
  // Records a non-OK `s` as the sticky error; returns `s`.
  Status Fail(Status s) {
    if (!s.ok()) error_ = s;
    return s;
  }

  void AppendHeaderOnce(std::string* out) {
    if (header_sent_) return;
    header_sent_ = true;
    out->append(kAeadMagic, sizeof kAeadMagic);
    out->push_back(static_cast<char>(kAeadVersion));
    PutU32BE(segment_size_, out);
    out->append(prefix_);
  }

  // Seals the next segment (index next_index_) and appends ciphertext || tag to *out.
  Status SealSegment(std::string_view plaintext, bool last, std::string* out) {
    if (next_index_ >= kMaxSegments) return InvalidArgument("AEAD stream too long: segment index overflow");
    const auto nonce = SegmentNonce(prefix_, static_cast<uint32_t>(next_index_), last);
    OML_RETURN_IF_ERROR(gcm_.Seal(nonce.data(), aad_, plaintext, out));
    ++next_index_;
    return Status::Ok();
  }
  // The same, writing ciphertext || tag at dst (plaintext.size() + 16 bytes).
  Status SealSegmentTo(std::string_view plaintext, bool last, unsigned char* dst) {
    if (next_index_ >= kMaxSegments) return InvalidArgument("AEAD stream too long: segment index overflow");
    const auto nonce = SegmentNonce(prefix_, static_cast<uint32_t>(next_index_), last);
    OML_RETURN_IF_ERROR(gcm_.SealTo(nonce.data(), aad_, plaintext, dst));
    ++next_index_;
    return Status::Ok();
  }

  Gcm gcm_;
  const std::string aad_;
  const uint32_t segment_size_;
  const std::string prefix_;  // 7 random bytes
  std::string pending_;
  uint64_t next_index_ = 0;
  bool header_sent_ = false;
  bool finished_ = false;
  Status error_;
};

// Decryptor. Buffers ciphertext until a segment can be classified: a full record
// (segment_size + 16 bytes) followed by at least one more byte is a non-last segment; whatever
// remains at Finish is the last segment. Plaintext is released only after its segment's tag
// verified. Any error is sticky.
class SegmentedDecryptor final : public AeadStreamDecryptor {
 public:
  SegmentedDecryptor(Gcm gcm, std::string aad) : gcm_(std::move(gcm)), aad_(std::move(aad)) {}

  // Random access (AeadStreamDecryptor::CreateAt): the header given apart, segments from
  // `first_segment` on.
  Status StartAt(std::string_view header, uint64_t first_segment) {
    if (header.size() != kAeadHeaderSize) return IntegrityError("truncated header");
    buffer_.assign(header);
    OML_RETURN_IF_ERROR(Fail(ParseHeader()));
    buffer_.clear();
    if (first_segment >= kMaxSegments) return Fail(IntegrityError("too many segments"));
    next_index_ = first_segment;
    return Status::Ok();
  }
  uint32_t segment_size() const { return segment_size_; }

  // Records are opened where they lie in `ciphertext`; only a record that straddles two calls is
  // put together in buffer_, and only what is left at the end (at most one record) stays there.
  Status UpdateInto(std::string_view ciphertext, std::string* out) override {
    if (Status s = CheckUsable(); !s.ok()) {
      out->clear();
      return s;
    }
    if (!have_header_) {
      const size_t take = std::min(kAeadHeaderSize - buffer_.size(), ciphertext.size());
      buffer_.append(ciphertext.substr(0, take));
      ciphertext.remove_prefix(take);
      if (buffer_.size() < kAeadHeaderSize) {
        out->clear();
        return Status::Ok();
      }
      if (Status s = Fail(ParseHeader()); !s.ok()) {
        out->clear();
        return s;
      }
      buffer_.clear();
    }
    const size_t record = size_t{segment_size_} + kAeadTagSize;
    // Every record that more bytes follow is a full, non-last one: segment_size_ bytes of plaintext.
    const size_t total = buffer_.size() + ciphertext.size();
    const size_t records = total > record ? (total - 1) / record : 0;
    out->resize(records * size_t{segment_size_});
    auto* dst = reinterpret_cast<unsigned char*>(out->data());
    auto open = [&](std::string_view r) {
      Status st = OpenSegmentTo(r, /*last=*/false, dst);
      dst += segment_size_;
      return st;
    };
    Status s;
    size_t opened = 0;
    if (records > 0 && !buffer_.empty()) {  // buffer_ holds at most one record: complete it
      const size_t take = record - buffer_.size();
      buffer_.append(ciphertext.substr(0, take));
      ciphertext.remove_prefix(take);
      s = open(buffer_);
      buffer_.clear();
      ++opened;
    }
    for (; s.ok() && opened < records; ++opened) {
      s = open(ciphertext.substr(0, record));
      ciphertext.remove_prefix(record);
    }
    if (!s.ok()) {
      Wipe(out);  // never hand out anything from a stream that failed
      out->clear();
      return Fail(std::move(s));
    }
    buffer_.append(ciphertext);
    return Status::Ok();
  }

  Result<std::string> Finish() override {
    OML_RETURN_IF_ERROR(CheckUsable());
    finished_ = true;
    if (!have_header_) return Fail(IntegrityError("truncated header"));
    if (buffer_.size() < kAeadTagSize) return Fail(IntegrityError("truncated: missing last segment"));
    std::string out;
    OML_RETURN_IF_ERROR(Fail(OpenSegment(buffer_, /*last=*/true, &out)));
    buffer_.clear();
    return out;
  }

 private:
  Status CheckUsable() const {
    if (!error_.ok()) return error_;
    if (finished_) return FailedPrecondition("AEAD decryptor used after Finish");
    return Status::Ok();
  }
  Status Fail(Status s) {
    if (!s.ok()) {
      error_ = s;
      buffer_.clear();
    }
    return s;
  }

  // Parses the 16-byte header at the front of buffer_. Malformed headers are integrity errors.
  //
  // The framing in crypto.h does not put the header in the AAD. The nonce prefix feeds every
  // nonce and the segment size fixes every record boundary, so an altered header can never
  // yield different plaintext. One edit does go undetected: in a single-segment stream, raising
  // the segment size to any value >= that segment's length (and <= 16 MiB) leaves every
  // boundary in place and decrypts to the same plaintext. (With two or more segments, any
  // change moves a boundary and fails a tag.) Detecting this needs a format change, e.g.
  // binding the header into each segment's AAD.
  Status ParseHeader() {
    if (std::memcmp(buffer_.data(), kAeadMagic, sizeof kAeadMagic) != 0) return IntegrityError("bad magic");
    if (static_cast<unsigned char>(buffer_[4]) != kAeadVersion) return IntegrityError("unsupported version");
    segment_size_ = GetU32BE(buffer_.data() + 5);
    if (segment_size_ == 0 || segment_size_ > kMaxSegmentSize) return IntegrityError("bad segment size");
    prefix_.assign(buffer_, 9, kNoncePrefixSize);
    have_header_ = true;
    return Status::Ok();
  }

  // Opens one record (ciphertext || tag) as segment next_index_, appending its plaintext to
  // *out. A record longer than a full segment or a failed tag is an integrity error.
  Status OpenSegment(std::string_view record, bool last, std::string* out) {
    if (record.size() < kAeadTagSize) return IntegrityError("bad segment length");
    const size_t base = out->size();
    out->resize(base + record.size() - kAeadTagSize);
    Status s = OpenSegmentTo(record, last, reinterpret_cast<unsigned char*>(out->data()) + base);
    if (!s.ok()) out->resize(base);
    return s;
  }

  // OpenSegment's work, writing the plaintext at dst (record.size() - 16 bytes).
  Status OpenSegmentTo(std::string_view record, bool last, unsigned char* dst) {
    if (record.size() < kAeadTagSize || record.size() > size_t{segment_size_} + kAeadTagSize) {
      return IntegrityError("bad segment length");
    }
    if (next_index_ >= kMaxSegments) return IntegrityError("too many segments");
    const auto nonce = SegmentNonce(prefix_, static_cast<uint32_t>(next_index_), last);
    const size_t n = record.size() - kAeadTagSize;
    OML_ASSIGN_OR_RETURN(bool ok, gcm_.OpenTo(nonce.data(), aad_, record.substr(0, n), record.substr(n), dst));
    if (!ok) return IntegrityError(std::string("authentication failed at segment ") + std::to_string(next_index_));
    ++next_index_;
    return Status::Ok();
  }

  Gcm gcm_;
  const std::string aad_;
  bool have_header_ = false;
  uint32_t segment_size_ = 0;
  std::string prefix_;
  std::string buffer_;  // ciphertext received and not yet opened
  uint64_t next_index_ = 0;
  bool finished_ = false;
  Status error_;
};

// ---------------------------------------------------------------------------------------------
// Base64 validation helpers.

// Value of a standard-alphabet base64 character, or -1.
constexpr int Base64Value(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Largest chunks handed to EVP_EncodeBlock / EVP_DecodeBlock (whose lengths are ints). Must be
// multiples of 3 and 4 respectively so chunks encode/decode independently.
constexpr size_t kEncodeChunk = 3u << 20;
constexpr size_t kDecodeChunk = 4u << 20;

constexpr size_t kEd25519PublicKeySize = 32;
constexpr size_t kEd25519SignatureSize = 64;

// PEM passphrase callback that refuses to supply one, so an encrypted key file fails to load
// instead of OpenSSL prompting on the terminal.
int NoPassphrase(char* /*buf*/, int /*size*/, int /*rwflag*/, void* /*u*/) { return -1; }

constexpr size_t kKekSize = 32;
// Domain prefix of the KEK id digest (crypto.h, FileKekProvider); sizeof includes the 0x00.
constexpr char kKekIdDomain[] = "oml-kek-id/v1";
constexpr size_t kDekSize = 32;
constexpr size_t kWrappedSize = kGcmNonceSize + kDekSize + kGcmTagSize;  // 60

}  // namespace

// =============================================================================================
// Secret bytes.

void Wipe(std::string* s) {
  if (!s->empty()) OPENSSL_cleanse(s->data(), s->size());
  s->clear();
}

namespace {
// True iff the bytes of `s` live inside the std::string object itself (the small-string buffer)
// rather than on the heap. Compared as integers: the pointers belong to unrelated objects.
bool BytesInline(const std::string& s) {
  const auto obj = reinterpret_cast<std::uintptr_t>(&s);
  const auto data = reinterpret_cast<std::uintptr_t>(s.data());
  return data >= obj && data < obj + sizeof(std::string);
}
// Moves the secret bytes of *from into *to (whose old bytes are wiped first) so that no copy is
// left behind in *from: a heap buffer is handed over; inline bytes are copied and wiped.
void MoveSecret(std::string* from, std::string* to) {
  Wipe(to);
  if (BytesInline(*from)) {
    to->assign(*from);
    Wipe(from);
  } else {
    *to = std::move(*from);
    Wipe(from);  // empty after the move; wipes anything an implementation left
  }
}
}  // namespace

SecureBytes::SecureBytes(std::string&& bytes) { MoveSecret(&bytes, &s_); }
SecureBytes::SecureBytes(SecureBytes&& other) noexcept { MoveSecret(&other.s_, &s_); }
SecureBytes& SecureBytes::operator=(SecureBytes&& other) noexcept {
  if (this != &other) MoveSecret(&other.s_, &s_);
  return *this;
}
std::string SecureBytes::Release() && {
  std::string out;
  MoveSecret(&s_, &out);
  return out;
}

// =============================================================================================
// Digests and encodings.

std::string Sha256(std::string_view data) {
  // Fetched once: EVP_sha256()'s implicit fetch on every call more than doubles the cost of
  // hashing a Merkle node (65 bytes: 290 ns against 125 ns here).
  static EVP_MD* const kSha256 = [] {
    EVP_MD* md = EVP_MD_fetch(nullptr, "SHA256", nullptr);
    if (md == nullptr) Die("EVP_MD_fetch SHA256");
    return md;
  }();
  std::string out(32, '\0');
  unsigned int len = 0;
  if (EVP_Digest(Bytes(data), data.size(), MutableBytes(out), &len, kSha256, nullptr) != 1 || len != 32) {
    Die("SHA-256");
  }
  return out;
}

std::string Hex(std::string_view raw) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.resize(raw.size() * 2);
  for (size_t i = 0; i < raw.size(); ++i) {
    const auto b = static_cast<unsigned char>(raw[i]);
    out[2 * i] = kDigits[b >> 4];
    out[2 * i + 1] = kDigits[b & 0x0f];
  }
  return out;
}

// Accepts upper- and lowercase digits; Hex() always produces lowercase.
Result<std::string> FromHex(std::string_view hex) {
  if (hex.size() % 2 != 0) return InvalidArgument("hex: odd length " + std::to_string(hex.size()));
  std::string out(hex.size() / 2, '\0');
  for (size_t i = 0; i < out.size(); ++i) {
    const int hi = HexValue(hex[2 * i]);
    const int lo = HexValue(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) {
      return InvalidArgument("hex: invalid character at offset " + std::to_string(hi < 0 ? 2 * i : 2 * i + 1));
    }
    out[i] = static_cast<char>((hi << 4) | lo);
  }
  return out;
}

std::string Base64(std::string_view raw) {
  // EVP_EncodeBlock writes 4 chars per started 3-byte group plus a terminating NUL, which the
  // extra byte absorbs; every chunk but the last is a multiple of 3, so chunks concatenate.
  std::string out((raw.size() + 2) / 3 * 4 + 1, '\0');
  size_t written = 0;
  while (!raw.empty()) {
    const size_t n = std::min(raw.size(), kEncodeChunk);
    const int got = EVP_EncodeBlock(MutableBytes(out) + written, Bytes(raw), static_cast<int>(n));
    if (got < 0) Die("EVP_EncodeBlock");
    written += static_cast<size_t>(got);
    raw.remove_prefix(n);
  }
  out.resize(written);
  return out;
}

// Strict RFC 4648 §4 decoding: the length must be a multiple of 4, only the standard alphabet
// is allowed (no whitespace, no line breaks), '=' only as one or two final padding characters,
// and the bits that padding leaves unused must be zero (so every byte string has exactly one
// accepted encoding).
Result<std::string> FromBase64(std::string_view b64) {
  if (b64.size() % 4 != 0) return InvalidArgument("base64: length is not a multiple of 4");
  const size_t n = b64.size();
  size_t pad = 0;
  if (n > 0 && b64[n - 1] == '=') pad = (b64[n - 2] == '=') ? 2 : 1;
  // One table lookup per byte with no branch (the lake writer decodes every bronze row's signed
  // bytes here); the offending offset is looked for only when something is wrong.
  static constexpr auto kInvalid = [] {
    std::array<uint8_t, 256> t{};
    for (int c = 0; c < 256; ++c) t[static_cast<size_t>(c)] = Base64Value(static_cast<char>(c)) < 0 ? 1 : 0;
    return t;
  }();
  uint8_t invalid = 0;
  for (size_t i = 0; i < n - pad; ++i) invalid |= kInvalid[static_cast<unsigned char>(b64[i])];
  if (invalid != 0) {
    for (size_t i = 0; i < n - pad; ++i) {
      if (Base64Value(b64[i]) < 0) return InvalidArgument("base64: invalid character at offset " + std::to_string(i));
    }
  }
  if (pad == 1 && (Base64Value(b64[n - 2]) & 0x03) != 0) return InvalidArgument("base64: non-canonical padding bits");
  if (pad == 2 && (Base64Value(b64[n - 3]) & 0x0f) != 0) return InvalidArgument("base64: non-canonical padding bits");

  std::string out(n / 4 * 3, '\0');
  size_t written = 0;
  while (!b64.empty()) {
    const size_t chunk = std::min(b64.size(), kDecodeChunk);
    // EVP_DecodeBlock counts padding as zero bytes (trimmed below) and fails on bad input,
    // which the validation above already excluded.
    const int got = EVP_DecodeBlock(MutableBytes(out) + written, Bytes(b64), static_cast<int>(chunk));
    if (got < 0 || static_cast<size_t>(got) != chunk / 4 * 3) {
      (void)DrainOpenSslErrors();
      return InvalidArgument("base64: malformed input");
    }
    written += static_cast<size_t>(got);
    b64.remove_prefix(chunk);
  }
  out.resize(written - pad);
  return out;
}

std::string RandomBytes(size_t n) {
  std::string out(n, '\0');
  size_t done = 0;
  while (done < n) {
    const size_t chunk = std::min(n - done, static_cast<size_t>(INT_MAX));
    if (RAND_bytes(MutableBytes(out) + done, static_cast<int>(chunk)) != 1) Die("RAND_bytes");
    done += chunk;
  }
  return out;
}

// Lengths are not secret; only the contents are compared in constant time.
bool ConstantTimeEquals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  if (a.empty()) return true;
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

std::string HmacSha256(std::string_view key, std::string_view data) {
  std::string out(kHmacSha256Size, '\0');
  size_t len = 0;
  // EVP_Q_mac: OpenSSL 3's one-shot EVP_MAC ("HMAC" with digest "SHA256"); it keeps no state.
  if (EVP_Q_mac(nullptr, "HMAC", nullptr, "SHA256", nullptr, Bytes(key), key.size(), Bytes(data), data.size(),
                MutableBytes(out), out.size(), &len) == nullptr ||
      len != kHmacSha256Size) {
    Die("HMAC-SHA-256");
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// HMAC key rings.

namespace {

bool IsKeyIdChar(char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
}

}  // namespace

Result<HmacKeyRing> HmacKeyRing::Parse(std::string_view text, const std::string& what) {
  std::vector<Key> keys;
  int line_no = 0;
  while (!text.empty()) {
    const size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text.remove_prefix(nl == std::string_view::npos ? text.size() : nl + 1);
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    auto is_blank = [](char c) { return c == ' ' || c == '\t'; };
    while (!line.empty() && is_blank(line.front())) line.remove_prefix(1);
    while (!line.empty() && is_blank(line.back())) line.remove_suffix(1);
    if (line.empty() || line.front() == '#') continue;
    // Never quote the line: it holds a secret.
    const std::string where = what + " line " + std::to_string(line_no) + ": ";
    size_t id_end = 0;
    while (id_end < line.size() && !is_blank(line[id_end])) ++id_end;
    const std::string_view id = line.substr(0, id_end);
    std::string_view secret = line.substr(id_end);
    while (!secret.empty() && is_blank(secret.front())) secret.remove_prefix(1);
    if (id.size() > kMaxKeyIdSize || !std::all_of(id.begin(), id.end(), IsKeyIdChar))
      return InvalidArgument(where + "the key id must be 1.." + std::to_string(kMaxKeyIdSize) +
                             " characters of A-Z a-z 0-9 . _ - (expected \"<key id> <hex secret>\")");
    if (secret.empty()) return InvalidArgument(where + "expected \"<key id> <hex secret>\", found only a key id");
    if (std::any_of(secret.begin(), secret.end(), is_blank))
      return InvalidArgument(where + "expected \"<key id> <hex secret>\", found more than two fields");
    if (secret.size() < 2 * kMinSecretSize || secret.size() > 2 * kMaxSecretSize)
      return InvalidArgument(where + "the secret of key " + std::string(id) + " must be " +
                             std::to_string(2 * kMinSecretSize) + ".." + std::to_string(2 * kMaxSecretSize) +
                             " hex digits (" + std::to_string(kMinSecretSize) + ".." + std::to_string(kMaxSecretSize) +
                             " random bytes), found " + std::to_string(secret.size()) + " characters");
    for (const Key& k : keys)
      if (k.id == id) return InvalidArgument(where + "key id " + std::string(id) + " is given twice");
    auto raw = FromHex(secret);
    if (!raw.ok())
      return InvalidArgument(where + "the secret of key " + std::string(id) + " must be hex digits, an even number of them");
    keys.push_back(Key{std::string(id), SecureBytes(std::move(*raw))});
  }
  if (keys.empty()) return InvalidArgument(what + " holds no key (expected lines \"<key id> <hex secret>\")");
  return HmacKeyRing(std::move(keys));
}

Result<HmacKeyRing> HmacKeyRing::LoadFile(const std::string& path, bool allow_insecure_file) {
  OML_RETURN_IF_ERROR(CheckKeyFilePermissions(path, allow_insecure_file));
  OML_ASSIGN_OR_RETURN(std::string text, ReadWholeFile(path));
  auto ring = Parse(text, path);
  Wipe(&text);
  return ring;
}

std::string HmacKeyRing::NewKeyLine(const std::string& key_id) {
  std::string secret = RandomBytes(kMinSecretSize);
  std::string line = key_id + " " + Hex(secret) + "\n";
  Wipe(&secret);
  return line;
}

Status HmacKeyRing::GenerateFile(const std::string& path) {
  std::string contents =
      "# oml HMAC secrets: \"<key id> <64..128 hex digits>\" per line. The first line signs; every line\n"
      "# verifies. Every replica needs the same file (docs/operations/deployment.md).\n" +
      NewKeyLine("k" + Hex(RandomBytes(4)));
  Status s = WriteNewPrivateFile(path, contents);
  Wipe(&contents);
  return s;
}

std::vector<std::string> HmacKeyRing::key_ids() const {
  std::vector<std::string> ids;
  for (const Key& k : keys_) ids.push_back(k.id);
  return ids;
}

bool HmacKeyRing::Holds(std::string_view key_id) const {
  return std::any_of(keys_.begin(), keys_.end(), [&](const Key& k) { return k.id == key_id; });
}

std::string HmacKeyRing::Sign(std::string_view data) const { return HmacSha256(keys_.front().secret.view(), data); }

bool HmacKeyRing::Verify(std::string_view key_id, std::string_view data, std::string_view tag) const {
  if (tag.size() != kHmacSha256Size) return false;
  for (const Key& k : keys_)
    if (k.id == key_id) return ConstantTimeEquals(HmacSha256(k.secret.view(), data), tag);
  return false;
}

std::string KeyIdFor(std::string_view public_key_raw) {
  return "ed25519:" + Hex(Sha256(public_key_raw)).substr(0, 16);
}

// =============================================================================================
// Ed25519.

// The key pair. EVP_PKEY is safe to share between threads for signing: OpenSSL only mutates
// its internal caches under the key's own lock.
struct SigningKey::Impl {
  PkeyPtr pkey;

  // Wraps an Ed25519 `pkey` into a SigningKey, filling in the public key and key id.
  // kInvalidArgument if `pkey` is not an Ed25519 key.
  static Result<SigningKey> Make(PkeyPtr pkey) {
    if (EVP_PKEY_get_id(pkey.get()) != EVP_PKEY_ED25519) return InvalidArgument("not an Ed25519 private key");
    std::string pub(kEd25519PublicKeySize, '\0');
    size_t len = pub.size();
    if (EVP_PKEY_get_raw_public_key(pkey.get(), MutableBytes(pub), &len) != 1 || len != kEd25519PublicKeySize) {
      return OpenSslFailure("Ed25519 public key");
    }
    auto impl = std::make_unique<Impl>();
    impl->pkey = std::move(pkey);
    SigningKey key(std::move(impl));
    key.key_id_ = KeyIdFor(pub);
    key.public_key_ = std::move(pub);
    return key;
  }
};

SigningKey::SigningKey(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
SigningKey::SigningKey(SigningKey&&) noexcept = default;
SigningKey& SigningKey::operator=(SigningKey&&) noexcept = default;
SigningKey::~SigningKey() = default;

Result<SigningKey> SigningKey::Generate() {
  PkeyCtxPtr ctx(EVP_PKEY_CTX_new_id(EVP_PKEY_ED25519, nullptr));
  if (!ctx || EVP_PKEY_keygen_init(ctx.get()) != 1) return OpenSslFailure("Ed25519 keygen init");
  EVP_PKEY* raw = nullptr;
  if (EVP_PKEY_keygen(ctx.get(), &raw) != 1) return OpenSslFailure("Ed25519 keygen");
  return Impl::Make(PkeyPtr(raw));
}

Result<SigningKey> SigningKey::FromSeed(std::string_view seed) {
  if (seed.size() != 32) return InvalidArgument("an Ed25519 seed is 32 bytes, not " + std::to_string(seed.size()));
  NoteKeyMaterialUse();
  PkeyPtr pkey(EVP_PKEY_new_raw_private_key(EVP_PKEY_ED25519, nullptr, reinterpret_cast<const unsigned char*>(seed.data()),
                                            seed.size()));
  if (!pkey) return OpenSslFailure("EVP_PKEY_new_raw_private_key");
  return Impl::Make(std::move(pkey));
}

Result<SigningKey> SigningKey::LoadFile(const std::string& path, bool allow_insecure_file) {
  NoteKeyMaterialUse();
  OML_RETURN_IF_ERROR(CheckKeyFilePermissions(path, allow_insecure_file));
  OML_ASSIGN_OR_RETURN(std::string pem, ReadWholeFile(path));
  if (pem.size() > static_cast<size_t>(INT_MAX)) {
    Wipe(&pem);
    return InvalidArgument("signing key file too large: " + path);
  }
  BioPtr bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  if (!bio) {
    Wipe(&pem);
    return OpenSslFailure("BIO_new_mem_buf");
  }
  PkeyPtr pkey(PEM_read_bio_PrivateKey(bio.get(), nullptr, NoPassphrase, nullptr));
  bio.reset();
  Wipe(&pem);
  if (!pkey) {
    return InvalidArgument("not a readable unencrypted PEM private key: " + path + " (" + DrainOpenSslErrors() + ")");
  }
  auto key = Impl::Make(std::move(pkey));
  if (!key.ok()) return Status(key.status().code(), key.status().message() + ": " + path);
  return key;
}

Status SigningKey::SaveFile(const std::string& path) const {
  if (!impl_) return FailedPrecondition("SaveFile on a moved-from SigningKey");
  // Secure-memory BIO: its buffer is cleansed when freed.
  BioPtr bio(BIO_new(BIO_s_secmem()));
  if (!bio) return OpenSslFailure("BIO_new");
  if (PEM_write_bio_PrivateKey(bio.get(), impl_->pkey.get(), nullptr, nullptr, 0, nullptr, nullptr) != 1) {
    return OpenSslFailure("PEM_write_bio_PrivateKey");
  }
  char* data = nullptr;
  const long len = BIO_get_mem_data(bio.get(), &data);
  if (len <= 0 || data == nullptr) return OpenSslFailure("BIO_get_mem_data");
  return WriteNewPrivateFile(path, std::string_view(data, static_cast<size_t>(len)));
}

std::string SigningKey::Sign(std::string_view msg) const {
  if (!impl_) Die("Sign on a moved-from SigningKey");
  // A fresh context per call keeps concurrent Sign() calls independent.
  MdCtxPtr ctx(EVP_MD_CTX_new());
  if (!ctx) Die("EVP_MD_CTX_new");
  // Ed25519 hashes internally: the digest must be NULL and signing is one-shot.
  if (EVP_DigestSignInit(ctx.get(), nullptr, nullptr, nullptr, impl_->pkey.get()) != 1) Die("Ed25519 sign init");
  std::string sig(kEd25519SignatureSize, '\0');
  size_t len = sig.size();
  if (EVP_DigestSign(ctx.get(), MutableBytes(sig), &len, Bytes(msg), msg.size()) != 1 ||
      len != kEd25519SignatureSize) {
    Die("Ed25519 sign");
  }
  return sig;
}

Result<PublicKey> PublicKey::FromRaw(std::string_view raw) {
  if (raw.size() != kEd25519PublicKeySize)
    return InvalidArgument("an Ed25519 public key is 32 bytes, got " + std::to_string(raw.size()));
  EVP_PKEY* pkey = EVP_PKEY_new_raw_public_key(EVP_PKEY_ED25519, nullptr, Bytes(raw), raw.size());
  if (pkey == nullptr) return InvalidArgument("not an Ed25519 public key: " + DrainOpenSslErrors());
  PublicKey k;
  k.pkey_ = std::shared_ptr<EVP_PKEY>(pkey, EVP_PKEY_free);
  k.raw_ = std::string(raw);
  return k;
}

bool PublicKey::Verify(std::string_view msg, std::string_view signature) const {
  if (!pkey_ || signature.size() != kEd25519SignatureSize) return false;
  // OpenSSL only reads the key here; EVP_PKEY is safe to share between threads for that.
  MdCtxPtr ctx(EVP_MD_CTX_new());
  bool ok = ctx && EVP_DigestVerifyInit(ctx.get(), nullptr, nullptr, nullptr, pkey_.get()) == 1 &&
            EVP_DigestVerify(ctx.get(), Bytes(signature), signature.size(), Bytes(msg), msg.size()) == 1;
  if (!ok) (void)DrainOpenSslErrors();
  return ok;
}

bool Ed25519Verify(std::string_view public_key_raw, std::string_view msg, std::string_view signature) {
  auto key = PublicKey::FromRaw(public_key_raw);
  if (!key.ok()) return false;
  return key->Verify(msg, signature);
}

// =============================================================================================
// Segmented AEAD.

Result<std::unique_ptr<AeadStreamEncryptor>> AeadStreamEncryptor::Create(std::string_view dek, std::string aad,
                                                                         uint32_t segment_size) {
  if (dek.size() != kGcmKeySize) return InvalidArgument("DEK must be 32 bytes, got " + std::to_string(dek.size()));
  if (segment_size == 0 || segment_size > kMaxSegmentSize) {
    return InvalidArgument("segment size must be in [1, 16 MiB], got " + std::to_string(segment_size));
  }
  OML_ASSIGN_OR_RETURN(Gcm gcm, Gcm::Create(dek, /*encrypt=*/true));
  return std::unique_ptr<AeadStreamEncryptor>(
      new SegmentedEncryptor(std::move(gcm), std::move(aad), segment_size, RandomBytes(kNoncePrefixSize)));
}

Result<std::unique_ptr<AeadStreamEncryptor>> AeadStreamEncryptor::Resume(std::string_view dek, std::string aad,
                                                                         AeadEncryptorState state) {
  if (dek.size() != kGcmKeySize) return InvalidArgument("DEK must be 32 bytes, got " + std::to_string(dek.size()));
  if (state.segment_size == 0 || state.segment_size > kMaxSegmentSize) {
    return InvalidArgument("segment size must be in [1, 16 MiB], got " + std::to_string(state.segment_size));
  }
  if (state.nonce_prefix.size() != kNoncePrefixSize) return InvalidArgument("nonce prefix must be 7 bytes");
  if (state.pending.size() > state.segment_size) return InvalidArgument("pending plaintext exceeds one segment");
  if (!state.header_sent && (state.next_segment > 0 || !state.pending.empty()))
    return InvalidArgument("a stream with segments or pending plaintext has sent its header");
  if (state.next_segment >= kMaxSegments) return InvalidArgument("segment index overflow");
  OML_ASSIGN_OR_RETURN(Gcm gcm, Gcm::Create(dek, /*encrypt=*/true));
  return std::unique_ptr<AeadStreamEncryptor>(new SegmentedEncryptor(std::move(gcm), std::move(aad), std::move(state)));
}

Result<std::unique_ptr<AeadStreamDecryptor>> AeadStreamDecryptor::Create(std::string_view dek, std::string aad) {
  if (dek.size() != kGcmKeySize) return InvalidArgument("DEK must be 32 bytes, got " + std::to_string(dek.size()));
  OML_ASSIGN_OR_RETURN(Gcm gcm, Gcm::Create(dek, /*encrypt=*/false));
  return std::unique_ptr<AeadStreamDecryptor>(new SegmentedDecryptor(std::move(gcm), std::move(aad)));
}

Result<std::unique_ptr<AeadStreamDecryptor>> AeadStreamDecryptor::CreateAt(std::string_view dek, std::string aad,
                                                                          std::string_view header,
                                                                          uint64_t first_segment, uint32_t* segment_size) {
  if (dek.size() != kGcmKeySize) return InvalidArgument("DEK must be 32 bytes, got " + std::to_string(dek.size()));
  OML_ASSIGN_OR_RETURN(Gcm gcm, Gcm::Create(dek, /*encrypt=*/false));
  auto d = std::make_unique<SegmentedDecryptor>(std::move(gcm), std::move(aad));
  OML_RETURN_IF_ERROR(d->StartAt(header, first_segment));
  if (segment_size != nullptr) *segment_size = d->segment_size();
  return std::unique_ptr<AeadStreamDecryptor>(std::move(d));
}

Result<std::string> EncryptAll(std::string_view dek, const std::string& aad, std::string_view plaintext,
                               uint32_t segment_size) {
  OML_ASSIGN_OR_RETURN(auto enc, AeadStreamEncryptor::Create(dek, aad, segment_size));
  OML_ASSIGN_OR_RETURN(std::string out, enc->Update(plaintext));
  OML_ASSIGN_OR_RETURN(std::string tail, enc->Finish());
  out += tail;
  return out;
}

Result<std::string> DecryptAll(std::string_view dek, const std::string& aad, std::string_view ciphertext) {
  OML_ASSIGN_OR_RETURN(auto dec, AeadStreamDecryptor::Create(dek, aad));
  OML_ASSIGN_OR_RETURN(std::string out, dec->Update(ciphertext));
  auto tail = dec->Finish();
  if (!tail.ok()) {
    Wipe(&out);
    return tail.status();
  }
  // Appending must not reallocate `out`: the old buffer would be freed holding plaintext.
  if (out.capacity() < out.size() + tail->size()) {
    std::string all;
    all.reserve(out.size() + tail->size());
    all += out;
    Wipe(&out);
    out = std::move(all);
  }
  out += *tail;
  Wipe(&*tail);
  return out;
}

// =============================================================================================
// File KEK.

Result<std::unique_ptr<FileKekProvider>> FileKekProvider::Load(const std::string& path, bool allow_insecure_file) {
  NoteKeyMaterialUse();
  OML_RETURN_IF_ERROR(CheckKeyFilePermissions(path, allow_insecure_file));
  OML_ASSIGN_OR_RETURN(std::string text, ReadWholeFile(path));
  // One line: 64 hex characters, optionally terminated by "\n" or "\r\n".
  std::string_view line(text);
  if (!line.empty() && line.back() == '\n') line.remove_suffix(1);
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  if (line.size() != 2 * kKekSize) {
    Wipe(&text);
    return InvalidArgument("KEK file must hold one line of 64 hex characters: " + path);
  }
  auto hex = FromHex(line);
  Wipe(&text);
  if (!hex.ok()) return InvalidArgument("KEK file must hold one line of 64 hex characters: " + path);
  SecureBytes kek(std::move(*hex));
  // The id hashes a domain-separated copy of the key; the copy is wiped.
  std::string tagged(kKekIdDomain, sizeof kKekIdDomain);  // includes the terminating 0x00
  tagged.reserve(tagged.size() + kek.size());
  tagged.append(kek.view());
  std::string id = "file:" + Hex(Sha256(tagged)).substr(0, 16);
  Wipe(&tagged);
  std::string legacy = "file:" + Hex(Sha256(kek.view())).substr(0, 16);
  return std::unique_ptr<FileKekProvider>(new FileKekProvider(std::move(kek), std::move(id), std::move(legacy)));
}

Status FileKekProvider::Generate(const std::string& path) {
  std::string kek = RandomBytes(kKekSize);
  std::string line = Hex(kek) + "\n";
  Status s = WriteNewPrivateFile(path, line);
  Wipe(&kek);
  Wipe(&line);
  return s;
}

Result<std::string> FileKekProvider::Wrap(std::string_view dek, std::string_view aad) const {
  if (dek.size() != kDekSize) return InvalidArgument("DEK must be 32 bytes, got " + std::to_string(dek.size()));
  // A fresh context per call: Wrap may run on many threads at once.
  OML_ASSIGN_OR_RETURN(Gcm gcm, Gcm::Create(kek_.view(), /*encrypt=*/true));
  const std::string nonce = RandomBytes(kGcmNonceSize);
  std::string out;
  out.reserve(kWrappedSize);
  out += nonce;
  OML_RETURN_IF_ERROR(gcm.Seal(Bytes(nonce), aad, dek, &out));
  return out;
}

Result<SecureBytes> FileKekProvider::Unwrap(std::string_view wrapped, std::string_view aad) const {
  NoteKeyMaterialUse();
  if (wrapped.size() != kWrappedSize) return IntegrityError("wrapped DEK must be 60 bytes");
  OML_ASSIGN_OR_RETURN(Gcm gcm, Gcm::Create(kek_.view(), /*encrypt=*/false));
  std::string dek;
  dek.reserve(kDekSize);  // one allocation: Open never reallocates it
  OML_ASSIGN_OR_RETURN(bool ok, gcm.Open(Bytes(wrapped), aad, wrapped.substr(kGcmNonceSize, kDekSize),
                                         wrapped.substr(kGcmNonceSize + kDekSize), &dek));
  if (!ok) return IntegrityError("wrapped DEK failed authentication (wrong KEK, altered bytes or aad)");
  return SecureBytes(std::move(dek));
}

Result<SecureBytes> KekProvider::UnwrapFrom(std::string_view kek_id, std::string_view wrapped,
                                            std::string_view aad) const {
  if (!Holds(kek_id))
    return Unavailable("the DEK is wrapped under KEK " + std::string(kek_id) + ", which is not loaded (KEK in use: " +
                           this->kek_id() + ")",
                       "kek-unavailable");
  return Unwrap(wrapped, aad);
}

bool KekRing::Holds(std::string_view kek_id) const {
  if (primary_->Holds(kek_id)) return true;
  for (const auto& p : previous_)
    if (p->Holds(kek_id)) return true;
  return false;
}

Result<SecureBytes> KekRing::UnwrapFrom(std::string_view kek_id, std::string_view wrapped, std::string_view aad) const {
  if (primary_->Holds(kek_id)) return primary_->UnwrapFrom(kek_id, wrapped, aad);
  for (const auto& p : previous_)
    if (p->Holds(kek_id)) return p->UnwrapFrom(kek_id, wrapped, aad);
  return KekProvider::UnwrapFrom(kek_id, wrapped, aad);  // kek-unavailable
}

std::vector<std::string> KekRing::previous_ids() const {
  std::vector<std::string> ids;
  for (const auto& p : previous_) ids.push_back(p->kek_id());
  return ids;
}

std::string NewUuidV4() {
  std::string raw = RandomBytes(16);
  raw[6] = static_cast<char>((raw[6] & 0x0f) | 0x40);  // version 4
  raw[8] = static_cast<char>((raw[8] & 0x3f) | 0x80);  // RFC 4122 variant
  std::string h = Hex(raw);
  return h.substr(0, 8) + "-" + h.substr(8, 4) + "-" + h.substr(12, 4) + "-" + h.substr(16, 4) + "-" + h.substr(20);
}

}  // namespace oml::crypto
