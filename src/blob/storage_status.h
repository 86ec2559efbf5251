// Maps a failed rust/oml-storage call (code + message) to a Status, freeing the message.
// Shared by every C++ wrapper of the adapter (blob, lake).
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"
#include "oml_storage.h"

namespace oml::blob {

// `what` prefixes the message. Codes: INVALID_ARGUMENT -> kInvalidArgument, NOT_FOUND ->
// kNotFound, ALREADY_EXISTS -> kAborted, CONFLICT (a Delta commit lost its race) -> kAborted
// "lake-commit-conflict", STALE_REWRITE (an OPTIMIZE refused over a commit that removed a file it
// read) -> kAborted "lake-rewrite-stale", PERMISSION_DENIED -> kUnavailable "storage-permission"
// (credentials are operator configuration, not the caller's role), UNAVAILABLE -> kUnavailable,
// anything else -> kInternal.
Status FromStorageError(int32_t rc, OmlStorageError& err, const std::string& what);

}  // namespace oml::blob
