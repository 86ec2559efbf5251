// Exit codes of the `oml` command (docs/operations/deployment.md lists them).
#pragma once

#include "common/status.h"

namespace oml::cli {

inline constexpr int kExitOk = 0;
inline constexpr int kExitError = 1;           // anything not listed below
inline constexpr int kExitUsage = 2;           // bad flags or arguments (CLI11)
inline constexpr int kExitVerifyFailed = 3;    // verify / verify-receipt / doctor found a problem
inline constexpr int kExitPrecondition = 4;    // e.g. schema newer than the binary, tenant exists
inline constexpr int kExitUnavailable = 5;     // database or object store unreachable
inline constexpr int kExitNotFound = 6;        // named tenant / claim does not exist
inline constexpr int kExitForbidden = 7;       // not allowed for this target, e.g. API keys for the provider tenant;
                                               // or the server refused the API key (401) or its role (403)

inline int ExitCodeFor(const Status& s) {
  switch (s.code()) {
    case Code::kOk: return kExitOk;
    case Code::kInvalidArgument: return kExitUsage;
    case Code::kFailedPrecondition: return kExitPrecondition;
    case Code::kUnavailable: return kExitUnavailable;
    case Code::kNotFound: return kExitNotFound;
    case Code::kPermissionDenied: return kExitForbidden;
    case Code::kUnauthenticated: return kExitForbidden;  // `oml claim submit`: HTTP 401
    case Code::kDataLoss: return kExitVerifyFailed;
    default: return kExitError;
  }
}

}  // namespace oml::cli
