// The HTTP/JSON API (docs/api/openapi.yaml). Errors are application/problem+json with a stable
// type per cause ("urn:oml:problem:<slug>"); bad input never writes anything.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "admission/claims.h"
#include "common/config.h"
#include "common/status.h"
#include "crypto/crypto.h"
#include "db/conn.h"
#include "db/durability.h"
#include "journal/journal.h"
#include "uploads/uploads.h"

namespace oml::api {

// The write gate is the journal's ChainGuard (journal/chain_guard.h): closed for a tenant by the
// startup fork check, by a write that found its chain rewound or diverged, or by the head
// publisher. Writes to a closed tenant are refused (503 chain-fork); a closed provider chain
// refuses every write. Reads stay served.
using ForkState = journal::ChainGuard;

struct ServerDeps {
  const Config* config;
  db::Pool* pool;
  journal::Journal* journal;
  admission::Claims* claims;
  ForkState* fork;
  // The cursor secret (config cursor_secret_file, admission/cursor.h): MACs the next_cursor of
  // GET /v1/claims and /v1/search and verifies the cursor they are given. Required.
  const crypto::HmacKeyRing* cursor_keys;
  // The production durability requirement (db/durability.h): writes are refused with 503
  // durability-reduced while it gates them. Null: no durability gate.
  db::DurabilityMonitor* durability = nullptr;
  // tus uploads under /v1/uploads (api/uploads_handlers.h). Null: those routes answer 404.
  uploads::Uploads* uploads = nullptr;
};

class Server {
 public:
  explicit Server(ServerDeps deps);
  ~Server();
  // Binds and serves until Stop(). kUnavailable if the address cannot be bound.
  Status Listen(const std::string& host, int port);
  // Makes a running Listen() return. Thread-safe.
  void Stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// HTTP status and problem slug of a Status (one-to-one with Code, refined by Status::type()).
int HttpStatus(const Status& s);
std::string ProblemSlug(const Status& s);
std::string ProblemJson(const Status& s, const std::string& instance);

}  // namespace oml::api
