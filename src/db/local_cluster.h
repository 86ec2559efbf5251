// The local profile's private PostgreSQL cluster (`oml dev`, `oml cluster`, test harnesses).
//
// Layout under `dir` (normally $OML_HOME/pg):
//   data/            the cluster (initdb --auth=trust; listens on a unix socket only)
//   postgres.log     server log
//   superuser.url    libpq URL of the cluster superuser, for operators and tests
//   app.url          libpq URL of the oml_app role
// The socket lives in /tmp/oml-pg-<hash of dir> (unix socket paths are limited to 107 bytes),
// mode 0700; Stop() removes it again (when empty).
//
// PostgreSQL refuses to run as root. When the caller is root, every server-side command runs as
// the unprivileged `postgres` system user (Debian's package creates it) via runuser, and `dir`
// is chowned to it. A non-root caller runs the cluster as itself.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"

namespace oml::db {

class LocalCluster {
 public:
  explicit LocalCluster(std::string dir);

  // initdb (first time only), start if not running, wait until it accepts connections, and
  // create database "oml". Idempotent. Writes superuser.url.
  Status Start();
  // Fast shutdown (pg_ctl -m fast), waiting for it to finish. OK if not running.
  Status Stop();
  bool Running() const;

  std::string SuperuserUrl() const;
  std::string AppUrl() const;
  const std::string& dir() const { return dir_; }
  const std::string& socket_dir() const { return socket_dir_; }

 private:
  Status Run(const std::vector<std::string>& argv, bool as_pg_user, std::string* output = nullptr) const;
  std::string Bin(const std::string& name) const;

  std::string dir_;
  std::string data_dir_;
  std::string socket_dir_;
  std::string bindir_;
  bool as_root_;
};

// Runs argv (no shell), capturing stdout+stderr into *output if given. Non-zero exit is
// kInternal with the output in the message.
Status RunCommand(const std::vector<std::string>& argv, std::string* output = nullptr);

}  // namespace oml::db
