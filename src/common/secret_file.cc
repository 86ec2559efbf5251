#include "common/secret_file.h"

#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>

#include "common/log.h"

namespace oml {
namespace {

std::string ErrnoText(int err) { return std::strerror(err); }

std::string Octal(mode_t mode) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%04o", static_cast<unsigned>(mode & 07777));
  return buf;
}

std::string ParentOf(const std::string& path) {
  std::string dir = std::filesystem::path(path).parent_path().string();
  return dir.empty() ? "." : dir;
}

// Best effort: makes a directory entry change durable. The file itself was fsynced already.
void FsyncDir(const std::string& dir) {
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    (void)::fsync(dfd);
    ::close(dfd);
  }
}

// Moves `from` to `to` unless `to` exists (any entry, a dangling symlink included): EEXIST then.
int RenameNoReplace(const std::string& from, const std::string& to) {
  if (::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), RENAME_NOREPLACE) == 0) return 0;
  if (errno != EINVAL && errno != ENOSYS) return -1;
  // The filesystem cannot rename without replacing: link() never replaces either.
  if (::link(from.c_str(), to.c_str()) != 0) return -1;
  ::unlink(from.c_str());
  return 0;
}

}  // namespace

Status WriteSecretFile(const std::string& path, std::string_view contents, mode_t mode, IfExists if_exists) {
  if (if_exists == IfExists::kRefuse) {
    struct stat st;
    if (::lstat(path.c_str(), &st) == 0) return FailedPrecondition("refusing to overwrite existing file " + path);
  }
  std::random_device rd;
  std::string tmp;
  int fd = -1;
  for (int attempt = 0; attempt < 16 && fd < 0; ++attempt) {
    char suffix[32];
    std::snprintf(suffix, sizeof suffix, ".tmp-%08x%08x", rd(), rd());
    tmp = path + suffix;
    // O_EXCL|O_NOFOLLOW: never write through an entry someone else put at the temp name.
    fd = ::open(tmp.c_str(), O_CREAT | O_EXCL | O_NOFOLLOW | O_WRONLY | O_CLOEXEC, mode);
    if (fd < 0 && errno != EEXIST) return Internal("cannot create " + tmp + ": " + ErrnoText(errno));
  }
  if (fd < 0) return Internal("cannot create a temporary file beside " + path);
  auto fail = [&](const std::string& what, int err) {
    if (fd >= 0) ::close(fd);
    ::unlink(tmp.c_str());
    return Internal(what + " " + path + ": " + ErrnoText(err));
  };
  // The umask can only have narrowed `mode`; make it exact.
  if (::fchmod(fd, mode) != 0) return fail("cannot chmod", errno);
  size_t done = 0;
  while (done < contents.size()) {
    ssize_t n = ::write(fd, contents.data() + done, contents.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return fail("cannot write", errno);
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) return fail("cannot fsync", errno);
  const int closed = ::close(fd);
  fd = -1;
  if (closed != 0) return fail("cannot close", errno);
  if (if_exists == IfExists::kReplace) {
    if (::rename(tmp.c_str(), path.c_str()) != 0) return fail("cannot rename into place", errno);
  } else if (RenameNoReplace(tmp, path) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    if (err == EEXIST) return FailedPrecondition("refusing to overwrite existing file " + path);
    return Internal("cannot rename into place " + path + ": " + ErrnoText(err));
  }
  FsyncDir(ParentOf(path));
  return Status::Ok();
}

Result<std::vector<std::string>> CreatePrivateDirs(const std::string& path, mode_t mode) {
  std::vector<std::string> created;
  std::filesystem::path cur;
  for (const auto& part : std::filesystem::path(path)) {
    cur /= part;
    if (part.empty()) continue;
    struct stat st;
    // Look before creating, so existing ancestors (e.g. on read-only mounts) never reach mkdir.
    if (::stat(cur.c_str(), &st) == 0) {
      if (!S_ISDIR(st.st_mode)) return FailedPrecondition("not a directory: " + cur.string());
      continue;
    }
    if (errno != ENOENT) return Internal("cannot stat " + cur.string() + ": " + ErrnoText(errno));
    if (::mkdir(cur.c_str(), mode) != 0) {
      const int err = errno;
      // Lost a race with a concurrent creator: fine if it made a directory (not ours to report).
      if (err == EEXIST && ::stat(cur.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) continue;
      return Internal("cannot create directory " + cur.string() + ": " + ErrnoText(err));
    }
    // The umask may have narrowed the mode; pin it. O_NOFOLLOW: the entry we just made, not a
    // symlink swapped in since.
    int dfd = ::open(cur.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (dfd < 0) return Internal("cannot open directory " + cur.string() + ": " + ErrnoText(errno));
    const int rc = ::fchmod(dfd, mode);
    const int err = errno;
    ::close(dfd);
    if (rc != 0) return Internal("cannot chmod directory " + cur.string() + ": " + ErrnoText(err));
    created.push_back(cur.string());
  }
  return created;
}

Status CheckKeyFilePermissions(const std::string& path, bool allow_insecure) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return Status::Ok();
    return Internal("cannot stat " + path + ": " + ErrnoText(errno));
  }
  const std::string override_hint =
      " (where a container mount cannot set modes, set allow_insecure_key_files = true in oml.toml or "
      "OML_ALLOW_INSECURE_KEY_FILES=1)";
  std::string problem;
  const uid_t euid = ::geteuid();
  if (st.st_uid != euid) {
    problem = "key file " + path + " is owned by uid " + std::to_string(st.st_uid) + ", not by this process (uid " +
              std::to_string(euid) + "); run `chown " + std::to_string(euid) + " " + path + "`" + override_hint;
  } else if ((st.st_mode & 077) != 0) {
    problem = "key file " + path + " has mode " + Octal(st.st_mode) + " (group or others may use it); run `chmod 600 " +
              path + "`" + override_hint;
  }
  if (problem.empty()) return Status::Ok();
  if (!allow_insecure) return FailedPrecondition(problem, "insecure-key-file");
  log::Warn("insecure key file accepted (allow_insecure_key_files)",
            {{"file", path}, {"mode", Octal(st.st_mode)}, {"uid", st.st_uid}});
  return Status::Ok();
}

}  // namespace oml
