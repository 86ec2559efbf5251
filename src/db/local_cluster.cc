#include "db/local_cluster.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <thread>

#include "common/log.h"
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

LocalCluster::LocalCluster(std::string dir) : as_root_(geteuid() == 0) {
  dir_ = fs::absolute(dir).lexically_normal().string();
  data_dir_ = dir_ + "/data";
  char hash[32];
  std::snprintf(hash, sizeof hash, "%016zx", std::hash<std::string>{}(dir_));
  socket_dir_ = "/tmp/oml-pg-" + std::string(hash).substr(0, 12);
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

bool LocalCluster::Running() const {
  std::string out;
  return Run({Bin("pg_ctl"), "-D", data_dir_, "status"}, true, &out).ok();
}

Status LocalCluster::Start() {
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec) return Internal("cannot create " + dir_ + ": " + ec.message());
  if (as_root_) {
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
  fs::create_directories(socket_dir_, ec);
  ::chmod(socket_dir_.c_str(), 0700);
  if (as_root_) OML_RETURN_IF_ERROR(RunCommand({"chown", "postgres:postgres", socket_dir_}));

  if (!fs::exists(data_dir_ + "/PG_VERSION")) {
    log::Info("initdb", {{"data_dir", data_dir_}});
    OML_RETURN_IF_ERROR(Run({Bin("initdb"), "-D", data_dir_, "-U", "postgres", "--auth=trust", "-E", "UTF8",
                             "--locale=C", "--no-instructions"},
                            true));
    std::ofstream conf(data_dir_ + "/postgresql.auto.conf", std::ios::app);
    conf << "listen_addresses = ''\n"
         << "unix_socket_directories = '" << socket_dir_ << "'\n"
         << "unix_socket_permissions = 0700\n"
         << "max_connections = 300\n"
         << "shared_buffers = '256MB'\n"
         << "fsync = on\nsynchronous_commit = on\n";
  }
  if (!Running()) {
    OML_RETURN_IF_ERROR(
        Run({Bin("pg_ctl"), "-D", data_dir_, "-l", dir_ + "/postgres.log", "-w", "-t", "60", "start"}, true));
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
      std::ofstream(dir_ + "/superuser.url") << SuperuserUrl() << "\n";
      std::ofstream(dir_ + "/app.url") << AppUrl() << "\n";
      ::chmod((dir_ + "/superuser.url").c_str(), 0600);
      return Status::Ok();
    }
    last = c.status();
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return last;
}

Status LocalCluster::Stop() {
  Status st;
  if (fs::exists(data_dir_ + "/PG_VERSION") && Running())
    st = Run({Bin("pg_ctl"), "-D", data_dir_, "-m", "fast", "-w", "-t", "60", "stop"}, true);
  // The socket directory is only needed while the server runs; left behind, one empty
  // /tmp/oml-pg-* per cluster ever started piles up. rmdir only removes it when empty.
  if (st.ok()) ::rmdir(socket_dir_.c_str());
  return st;
}

}  // namespace oml::db
