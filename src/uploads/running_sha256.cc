#include "uploads/running_sha256.h"

// SHA256_Init/Update/Final and SHA256_CTX are deprecated in OpenSSL 3 but present; they are the
// only way to hold a SHA-256 state as bytes (see the header). Silenced for this file only.
#define OPENSSL_SUPPRESS_DEPRECATED
#include <openssl/crypto.h>
#include <openssl/sha.h>

#include <cstring>

namespace oml::uploads {

static_assert(sizeof(SHA256_CTX) == RunningSha256::kStateSize, "SHA256_CTX layout changed: review running_sha256.h");

struct RunningSha256::Ctx {
  SHA256_CTX c;
};

RunningSha256::RunningSha256() : ctx_(std::make_unique<Ctx>()) { SHA256_Init(&ctx_->c); }

RunningSha256::RunningSha256(const RunningSha256& o) : ctx_(std::make_unique<Ctx>(*o.ctx_)) {}

RunningSha256& RunningSha256::operator=(const RunningSha256& o) {
  if (this != &o) *ctx_ = *o.ctx_;
  return *this;
}

RunningSha256::~RunningSha256() {
  if (ctx_) OPENSSL_cleanse(&ctx_->c, sizeof ctx_->c);
}

Result<RunningSha256> RunningSha256::FromState(std::string_view state) {
  if (state.size() != kStateSize) return DataLoss("stored SHA-256 state has the wrong size", "integrity");
  RunningSha256 h;
  std::memcpy(&h.ctx_->c, state.data(), kStateSize);
  // What a state of SHA-256 (not SHA-224) over whole bytes always satisfies.
  const SHA256_CTX& c = h.ctx_->c;
  if (c.md_len != SHA256_DIGEST_LENGTH || c.num >= SHA256_CBLOCK || (c.Nl & 7) != 0 || ((c.Nl >> 3) & 63) != c.num)
    return DataLoss("stored SHA-256 state is inconsistent", "integrity");
  return h;
}

void RunningSha256::Update(std::string_view bytes) {
  if (!bytes.empty()) SHA256_Update(&ctx_->c, bytes.data(), bytes.size());
}

std::string RunningSha256::State() const {
  return std::string(reinterpret_cast<const char*>(&ctx_->c), kStateSize);
}

std::string RunningSha256::Digest() const {
  SHA256_CTX copy = ctx_->c;
  unsigned char md[SHA256_DIGEST_LENGTH];
  SHA256_Final(md, &copy);
  OPENSSL_cleanse(&copy, sizeof copy);
  return std::string(reinterpret_cast<const char*>(md), sizeof md);
}

uint64_t RunningSha256::length() const {
  return ((uint64_t{ctx_->c.Nh} << 32) | ctx_->c.Nl) >> 3;
}

}  // namespace oml::uploads
