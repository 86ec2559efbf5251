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
#include "db/conn.h"
#include "journal/journal.h"

namespace oml::api {

// Write gate, set by the startup fork check. Writes to a forked tenant are refused (503
// chain-fork); a forked provider chain refuses every write. Reads stay served. Read-only after
// startup.
struct ForkState {
  std::map<std::string, std::string> tenants;  // forked tenant id -> what is wrong
  bool provider_forked() const { return tenants.count(journal::kProviderTenant) > 0; }
};

struct ServerDeps {
  const Config* config;
  db::Pool* pool;
  journal::Journal* journal;
  admission::Claims* claims;
  ForkState* fork;
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
