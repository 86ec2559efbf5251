#include "db/local_cluster.h"

#include <fcntl.h>
#include <pwd.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "common/log.h"
#include "common/secret_file.h"
#include "db/conn.h"

extern char** environ;

namespace oml::db {
namespace fs = std::filesystem;

Status RunCommand(const std::vector<std::string>& argv, std::string* output) {
  int pipefd[2];
  // O_CLOEXEC: only the dup2-ed copies (fds 1 and 2) reach the child. A daemon it starts
  // (pg_ctl start) must not inherit the write end, or reading until EOF would never end.
  if (pipe2(pipefd, O_CLOEXEC) != 0) return Internal("pipe failed");
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, pipefd[1], 1);
  posix_spawn_file_actions_adddup2(&fa, pipefd[1], 2);
  posix_spawn_file_actions_addclose(&fa, pipefd[0]);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  // Children start in their own session with no signals blocked: a terminal's Ctrl-C reaches
  // oml (which then stops PostgreSQL in order), not the cluster directly.
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSID | POSIX_SPAWN_SETSIGMASK);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid;
  int rc = posix_spawnp(&pid, args[0], &fa, &attr, args.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  close(pipefd[1]);
  std::string out;
  if (rc == 0) {
    std::array<char, 4096> buf;
    ssize_t n;
    while ((n = read(pipefd[0], buf.data(), buf.size())) > 0) out.append(buf.data(), n);
  }
  close(pipefd[0]);
  if (rc != 0) return Internal("cannot run " + argv[0] + ": " + std::strerror(rc));
  int status = 0;
  waitpid(pid, &status, 0);
  if (output) *output = out;
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::string cmd;
    for (const auto& a : argv) cmd += a + " ";
    return Internal("command failed (" + std::to_string(WEXITSTATUS(status)) + "): " + cmd + "\n" + out);
  }
  return Status::Ok();
}

namespace {

// A unix socket path holds at most sizeof(sun_path) - 1 = 107 bytes; the server's socket is
// <dir>/.s.PGSQL.<port>, the port up to 5 digits.
constexpr size_t kMaxSocketDirLength = sizeof(sockaddr_un::sun_path) - 1 - std::char_traits<char>::length("/.s.PGSQL.65535");

// Characters that survive the libpq URL (host=...), the pg_ctl -o shell line and the server's
// list parsing of unix_socket_directories without quoting.
bool PlainPath(const std::string& p) {
  return std::all_of(p.begin(), p.end(), [](char ch) {
    return std::isalnum(static_cast<unsigned char>(ch)) || ch == '/' || ch == '.' || ch == '_' || ch == '-';
  });
}

std::string Octal(mode_t mode) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%04o", static_cast<unsigned>(mode & 07777));
  return buf;
}

}  // namespace

LocalCluster::LocalCluster(std::string dir) : as_root_(geteuid() == 0) {
  dir_ = fs::absolute(dir).lexically_normal().string();
  while (dir_.size() > 1 && dir_.back() == '/') dir_.pop_back();
  data_dir_ = dir_ + "/data";
  const std::string own = dir_ + "/sock";
  if (own.size() <= kMaxSocketDirLength && PlainPath(own)) home_socket_dir_ = own;
  if (as_root_) {
    if (const passwd* pw = ::getpwnam("postgres")) {
      pg_uid_ = pw->pw_uid;
      pg_gid_ = pw->pw_gid;
    }
  }
  // Commands other than Start (`oml cluster stop`, a second Start) find a running server's
  // socket where it recorded it; before any server ran, the directory's own sock/ if usable.
  socket_dir_ = RunningSocketDir();
  if (socket_dir_.empty()) socket_dir_ = home_socket_dir_;
  const char* env = std::getenv("OML_PG_BINDIR");
  if (env && *env) {
    bindir_ = env;
  } else {
    for (int v : {17, 16, 15}) {
      std::string d = "/usr/lib/postgresql/" + std::to_string(v) + "/bin";
      if (fs::exists(d + "/initdb")) { bindir_ = d; break; }
    }
  }
}

uid_t LocalCluster::ServerUid() const { return as_root_ ? pg_uid_ : ::geteuid(); }

std::string LocalCluster::RunningSocketDir() const {
  // postmaster.pid, line 5: the server's first unix socket directory (PostgreSQL's
  // LOCK_FILE_LINE_SOCKET_DIR). Present while a server runs (or after it crashed).
  std::ifstream in(data_dir_ + "/postmaster.pid");
  std::string line;
  for (int i = 1; i <= 5 && std::getline(in, line); ++i) {
    if (i == 5) return line;
  }
  return {};
}

Status LocalCluster::CheckSocketDir(const std::string& d) const {
  struct stat st;
  if (::lstat(d.c_str(), &st) != 0)
    return FailedPrecondition("socket directory " + d + ": " + std::strerror(errno));
  const std::string refuse = "; refusing to use it for PostgreSQL (remove it and start again)";
  if (S_ISLNK(st.st_mode)) return FailedPrecondition("socket directory " + d + " is a symbolic link" + refuse);
  if (!S_ISDIR(st.st_mode)) return FailedPrecondition("socket directory " + d + " is not a directory" + refuse);
  if (st.st_uid != ServerUid())
    return FailedPrecondition("socket directory " + d + " is owned by uid " + std::to_string(st.st_uid) +
                              ", not by the uid PostgreSQL runs as (" + std::to_string(ServerUid()) + ")" + refuse);
  if ((st.st_mode & 07777) != 0700)
    return FailedPrecondition("socket directory " + d + " has mode " + Octal(st.st_mode) + ", not 0700" + refuse);
  return Status::Ok();
}

Status LocalCluster::PrepareDir() {
  if (as_root_ && pg_uid_ == 0) return FailedPrecondition("running as root, but there is no `postgres` system user to run PostgreSQL as");
  OML_ASSIGN_OR_RETURN(std::vector<std::string> made, CreatePrivateDirs(dir_, 0700));
  if (as_root_) {
    // Ancestors created here (normally $OML_HOME): the postgres user must traverse them to reach
    // dir_, nobody else needs to. dir_ itself is handed to postgres below.
    for (const auto& d : made) {
      if (d == dir_) continue;
      if (::chown(d.c_str(), 0, pg_gid_) != 0 || ::chmod(d.c_str(), 0710) != 0)
        return Internal("cannot give " + d + " to group postgres: " + std::strerror(errno));
    }
    // The postgres user must reach the directory: check traversal of every parent.
    std::string out;
    if (!RunCommand({"runuser", "-u", "postgres", "--", "test", "-x", dir_}, &out).ok()) {
      OML_RETURN_IF_ERROR(RunCommand({"chown", "postgres:postgres", dir_}));
      if (!RunCommand({"runuser", "-u", "postgres", "--", "test", "-x", dir_}, &out).ok()) {
        return FailedPrecondition("the postgres system user cannot reach " + dir_ +
                                  " (a parent directory is not traversable); set OML_HOME to a path under "
                                  "a world-traversable directory such as /var/lib or /tmp");
      }
    }
    OML_RETURN_IF_ERROR(RunCommand({"chown", "postgres:postgres", dir_}));
  }
  // dir_ holds the data directory, the log and the URL files: private, whatever made it.
  struct stat st;
  if (::stat(dir_.c_str(), &st) == 0 && st.st_uid == ServerUid() && (st.st_mode & 07777) != 0700 &&
      ::chmod(dir_.c_str(), 0700) != 0)
    return Internal("cannot chmod 700 " + dir_ + ": " + std::strerror(errno));
  return Status::Ok();
}

Status LocalCluster::PrepareSocketDir() {
  if (Running()) {
    // A server runs already: connect where it listens, checked like a directory we would use.
    std::string d = RunningSocketDir();
    if (d.empty()) return FailedPrecondition("PostgreSQL runs in " + data_dir_ + " but its postmaster.pid names no socket directory");
    OML_RETURN_IF_ERROR(CheckSocketDir(d));
    socket_dir_ = d;
    return Status::Ok();
  }
  if (!home_socket_dir_.empty()) {
    const std::string& d = home_socket_dir_;
    if (::mkdir(d.c_str(), 0700) == 0) {
      // Pin the mode (the umask may have narrowed it) and owner on what we just made, never
      // through a symlink swapped in since.
      int fd = ::open(d.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      if (fd < 0) return Internal("cannot open " + d + ": " + std::strerror(errno));
      int rc = ::fchmod(fd, 0700);
      if (rc == 0 && as_root_) rc = ::fchown(fd, pg_uid_, pg_gid_);
      const int err = errno;
      ::close(fd);
      if (rc != 0) return Internal("cannot prepare socket directory " + d + ": " + std::strerror(err));
    } else if (errno != EEXIST) {
      return Internal("cannot create socket directory " + d + ": " + std::strerror(errno));
    }
    OML_RETURN_IF_ERROR(CheckSocketDir(d));
    socket_dir_ = d;
    return Status::Ok();
  }
  // dir_ is too long (or oddly spelled) for a socket path: a fresh private directory in /tmp.
  // mkdtemp creates it 0700, owned by us, under a name nobody could have prepared.
  std::string tmpl = std::string(kTmpSocketDirPrefix) + "XXXXXX";
  if (::mkdtemp(tmpl.data()) == nullptr) return Internal("cannot create a socket directory in /tmp: " + std::string(std::strerror(errno)));
  if (as_root_ && ::chown(tmpl.c_str(), pg_uid_, pg_gid_) != 0) {
    const int err = errno;
    ::rmdir(tmpl.c_str());
    return Internal("cannot give socket directory " + tmpl + " to postgres: " + std::strerror(err));
  }
  OML_RETURN_IF_ERROR(CheckSocketDir(tmpl));
  socket_dir_ = tmpl;
  return Status::Ok();
}

std::string LocalCluster::Bin(const std::string& name) const {
  return bindir_.empty() ? name : bindir_ + "/" + name;
}

Status LocalCluster::Run(const std::vector<std::string>& argv, bool as_pg_user, std::string* output) const {
  if (as_pg_user && as_root_) {
    std::vector<std::string> full = {"runuser", "-u", "postgres", "--"};
    full.insert(full.end(), argv.begin(), argv.end());
    return RunCommand(full, output);
  }
  return RunCommand(argv, output);
}

std::string LocalCluster::SuperuserUrl() const {
  return "postgresql:///oml?host=" + socket_dir_ + "&user=postgres";
}
std::string LocalCluster::AppUrl() const {
  return "postgresql:///oml?host=" + socket_dir_ + "&user=oml_app";
}
std::string LocalCluster::LakewriterUrl() const {
  return "postgresql:///oml?host=" + socket_dir_ + "&user=oml_lakewriter";
}
std::string LocalCluster::ReconcilerUrl() const {
  return "postgresql:///oml?host=" + socket_dir_ + "&user=oml_reconciler";
}

bool LocalCluster::Running() const {
  std::string out;
  return Run({Bin("pg_ctl"), "-D", data_dir_, "status"}, true, &out).ok();
}

Status LocalCluster::Start() {
  OML_RETURN_IF_ERROR(PrepareDir());
  OML_RETURN_IF_ERROR(PrepareSocketDir());

  if (!fs::exists(data_dir_ + "/PG_VERSION")) {
    log::Info("initdb", {{"data_dir", data_dir_}});
    OML_RETURN_IF_ERROR(Run({Bin("initdb"), "-D", data_dir_, "-U", "postgres", "--auth=trust", "-E", "UTF8",
                             "--locale=C", "--no-instructions"},
                            true));
    std::ofstream conf(data_dir_ + "/postgresql.auto.conf", std::ios::app);
    conf << "listen_addresses = ''\n"
         << "unix_socket_permissions = 0700\n"
         << "max_connections = 300\n"
         << "shared_buffers = '256MB'\n"
         << "fsync = on\nsynchronous_commit = on\n";
  }
  if (!Running()) {
    // The socket directory on the command line: it overrides the configuration files (clusters
    // made by older versions name a /tmp/oml-pg-<hash> there). PlainPath/mkdtemp: no quoting needed.
    Status started = Run({Bin("pg_ctl"), "-D", data_dir_, "-l", dir_ + "/postgres.log", "-o", "-k " + socket_dir_,
                          "-w", "-t", "60", "start"},
                         true);
    if (!started.ok()) {
      if (home_socket_dir_.empty()) ::rmdir(socket_dir_.c_str());  // this start's mkdtemp directory
      return started;
    }
  }
  // Wait for connections, then create the database.
  std::string base = "postgresql:///postgres?host=" + socket_dir_ + "&user=postgres";
  Status last;
  for (int i = 0; i < 100; ++i) {
    auto c = Conn::Connect(base);
    if (c.ok()) {
      auto r = c->Query("SELECT 1 FROM pg_database WHERE datname = 'oml'");
      if (!r.ok()) return r.status();
      if (r->size() == 0) OML_RETURN_IF_ERROR(c->Exec("CREATE DATABASE oml").status());
      OML_RETURN_IF_ERROR(WriteSecretFile(dir_ + "/superuser.url", SuperuserUrl() + "\n"));
      OML_RETURN_IF_ERROR(WriteSecretFile(dir_ + "/app.url", AppUrl() + "\n"));
      OML_RETURN_IF_ERROR(WriteSecretFile(dir_ + "/lakewriter.url", LakewriterUrl() + "\n"));
      OML_RETURN_IF_ERROR(WriteSecretFile(dir_ + "/reconciler.url", ReconcilerUrl() + "\n"));
      return Status::Ok();
    }
    last = c.status();
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return last;
}

Status LocalCluster::Stop() {
  Status st;
  std::string sock = RunningSocketDir();
  if (sock.empty()) sock = socket_dir_;
  if (fs::exists(data_dir_ + "/PG_VERSION") && Running())
    st = Run({Bin("pg_ctl"), "-D", data_dir_, "-m", "fast", "-w", "-t", "60", "stop"}, true);
  // The socket directory is only needed while the server runs; left behind, one empty
  // /tmp/oml-pg-* per cluster ever started piles up. Only ours (checked) and only when empty.
  if (st.ok() && !sock.empty() && CheckSocketDir(sock).ok()) ::rmdir(sock.c_str());
  return st;
}

}  // namespace oml::db
