// The local profile's private PostgreSQL cluster (`oml dev`, `oml cluster`, test harnesses).
//
// Layout under `dir` (normally $OML_HOME/pg), every directory 0700 and every URL file 0600:
//   data/            the cluster (initdb --auth=trust; listens on a unix socket only)
//   sock/            the socket directory, when `dir`/sock/.s.PGSQL.<port> fits a unix socket
//                    path (sun_path: 107 bytes) and `dir` is spelled with [A-Za-z0-9/._-] only
//   postgres.log     server log
//   superuser.url    libpq URL of the cluster superuser, for operators and tests
//   app.url          libpq URL of the oml_app role
//   lakewriter.url   libpq URL of the oml_lakewriter role (`oml lakewriter`)
//   reconciler.url   libpq URL of the oml_reconciler role (`oml reconcile`, sql/0023_reconciler.sql)
// Otherwise the socket directory is a fresh private /tmp/oml-pg-XXXXXX (mkdtemp) per start.
// Either way it is given to the server on its command line (-k), is recorded by the server in
// data/postmaster.pid (where later commands find it) and in the URL files, and Stop() removes it
// (when empty).
//
// Trust auth makes whoever can reach the socket the superuser, and whoever owns the socket
// directory able to put a listener there in place of the server. So the socket directory must
// be a real directory (not a symlink), mode exactly 0700, owned by the user the server runs as:
// one that exists otherwise is refused (kFailedPrecondition, the server is not started), also
// when a running server's postmaster.pid names it.
//
// Directories this class creates get mode 0700 whatever the umask. Missing ancestors of `dir`
// (normally $OML_HOME) get 0700 too, except as root, where they become root:postgres 0710 so the
// postgres user can traverse (not list) them.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "common/status.h"

namespace oml::db {

class LocalCluster {
 public:
  explicit LocalCluster(std::string dir);

  // initdb (first time only), start if not running, wait until it accepts connections, and
  // create database "oml". Idempotent. Writes superuser.url, app.url, lakewriter.url and
  // reconciler.url (0600, atomically).
  // kFailedPrecondition, before anything is started, for a socket directory that fails the
  // checks above.
  Status Start();
  // Fast shutdown (pg_ctl -m fast), waiting for it to finish. OK if not running.
  Status Stop();
  bool Running() const;

  // The URLs and socket directory: valid after Start() (or when constructed while a server runs).
  std::string SuperuserUrl() const;
  std::string AppUrl() const;
  std::string LakewriterUrl() const;
  std::string ReconcilerUrl() const;
  const std::string& dir() const { return dir_; }
  const std::string& socket_dir() const { return socket_dir_; }

  // The socket directory used when `dir`'s own sock/ is too long or oddly spelled.
  static constexpr const char* kTmpSocketDirPrefix = "/tmp/oml-pg-";

 private:
  // Creates dir_ (and its missing ancestors) with the modes above; as root, hands it to postgres.
  Status PrepareDir();
  // Chooses, creates or checks the socket directory (sets socket_dir_).
  Status PrepareSocketDir();
  // The socket directory a running server recorded in data/postmaster.pid; empty if unknown.
  std::string RunningSocketDir() const;
  // OK iff `d` is a directory (not a symlink) owned by the server's user with mode 0700.
  Status CheckSocketDir(const std::string& d) const;
  uid_t ServerUid() const;
  Status Run(const std::vector<std::string>& argv, bool as_pg_user, std::string* output = nullptr) const;
  std::string Bin(const std::string& name) const;

  std::string dir_;
  std::string data_dir_;
  std::string socket_dir_;
  std::string home_socket_dir_;  // dir_ + "/sock" if usable, else empty (mkdtemp per start)
  std::string bindir_;
  bool as_root_;
  uid_t pg_uid_ = 0;  // the postgres system user, when as_root_
  gid_t pg_gid_ = 0;
};

// Runs argv (no shell), capturing stdout+stderr into *output if given. Non-zero exit is
// kInternal with the output in the message.
Status RunCommand(const std::vector<std::string>& argv, std::string* output = nullptr);

}  // namespace oml::db
