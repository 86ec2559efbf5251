// A SHA-256 whose intermediate state can be stored and picked up again, by another process,
// after a restart: a resumed upload (uploads.h) never re-hashes the bytes it already took.
//
// The state is OpenSSL's SHA256_CTX as bytes (kStateSize). OpenSSL 3 offers no way to export
// the state of an EVP digest, so this uses the low-level SHA256_Init/Update/Final API, which
// OpenSSL 3 deprecates but still ships (and which computes exactly the same function). The
// bytes are the struct of the OpenSSL this binary was built against: a state written by one
// build is read by another only if both have the same SHA256_CTX layout (every OpenSSL 1.1 and
// 3.x release so far). FromState checks what it can (size, digest length, buffered count) and
// refuses anything else as kDataLoss "integrity".
//
// The state of a hash over plaintext holds up to 63 bytes of that plaintext (the partial block)
// and the chaining values: treat it as plaintext (uploads.cc seals it before storing it).
// Not thread-safe; copyable.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

#include "common/status.h"

namespace oml::uploads {

class RunningSha256 {
 public:
  static constexpr size_t kStateSize = 112;  // sizeof(SHA256_CTX), checked in the .cc

  RunningSha256();  // the hash of nothing so far
  RunningSha256(const RunningSha256& o);
  RunningSha256& operator=(const RunningSha256& o);
  ~RunningSha256();  // wipes the state

  // A hash that goes on from State() bytes. kDataLoss "integrity" if they are not a state.
  static Result<RunningSha256> FromState(std::string_view state);

  void Update(std::string_view bytes);
  // The state so far (kStateSize bytes).
  std::string State() const;
  // The digest of everything fed so far (32 raw bytes); this hash can go on being updated.
  std::string Digest() const;
  // Bytes fed so far.
  uint64_t length() const;

 private:
  struct Ctx;
  std::unique_ptr<Ctx> ctx_;
};

}  // namespace oml::uploads
