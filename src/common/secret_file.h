// Private files and directories of a deployment: secrets written whole with their final mode,
// directories created without the umask's say, and key files checked before they are trusted.
//
// Every secret oml writes (keys/signing.key, keys/kek.key, pg/superuser.url, pg/app.url,
// dev-writer.token) goes through WriteSecretFile, so that:
//   * it is never readable by others, not even briefly (created with its final mode);
//   * a short write or a crash never leaves a truncated secret under the final name (written to
//     a temporary name in the same directory, fsynced, then renamed over the final name);
//   * an attacker's symlink at the temporary name is never followed (O_CREAT|O_EXCL|O_NOFOLLOW).
// Thread-safe: the functions keep no state.
#pragma once

#include <sys/types.h>

#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace oml {

enum class IfExists {
  kReplace,  // rename over an existing file (atomically: readers see the old or the new bytes)
  kRefuse,   // kFailedPrecondition "refusing to overwrite existing file <path>" if `path` exists
             // (any kind of entry, a dangling symlink included); the existing entry is untouched
};

// Writes `contents` to `path` with mode exactly `mode` (the umask does not apply), atomically
// and durably: temp file `<path>.tmp-<random>` in the same directory, write all, fsync, rename
// (kRefuse: link-without-replace), fsync of the directory. On failure the temp file is removed
// and the final name is untouched. REQUIRES: the parent directory exists. kInternal on I/O
// errors, naming the file and the OS reason.
Status WriteSecretFile(const std::string& path, std::string_view contents, mode_t mode = 0600,
                       IfExists if_exists = IfExists::kReplace);

// Creates `path` and each missing ancestor with mode exactly `mode` (the umask does not
// apply). Existing directories are left as they are. Returns the directories it created,
// outermost first (callers that must widen or chown them, e.g. for the postgres system user,
// know which ones are theirs). kFailedPrecondition if an existing component is not a directory,
// kInternal on other errors.
Result<std::vector<std::string>> CreatePrivateDirs(const std::string& path, mode_t mode = 0700);

// Checks a key or KEK file before it is loaded: it must be owned by the effective uid and give
// no permission to group or other (0600 or 0400). Follows symlinks (mounted secrets are often
// symlinks); checks the file they name. OK if `path` does not exist (the caller's read reports
// kNotFound). Otherwise kFailedPrecondition naming the file, its mode or owner and the fix.
// With `allow_insecure` (config allow_insecure_key_files, for container mounts that cannot set
// modes), a failed check logs a warning and returns OK instead.
Status CheckKeyFilePermissions(const std::string& path, bool allow_insecure);

}  // namespace oml
