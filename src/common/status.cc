#include "common/status.h"

namespace oml {

const char* CodeName(Code c) {
  switch (c) {
    case Code::kOk: return "ok";
    case Code::kInvalidArgument: return "invalid-argument";
    case Code::kUnauthenticated: return "unauthenticated";
    case Code::kPermissionDenied: return "permission-denied";
    case Code::kNotFound: return "not-found";
    case Code::kGone: return "gone";
    case Code::kPayloadTooLarge: return "payload-too-large";
    case Code::kFailedPrecondition: return "failed-precondition";
    case Code::kAborted: return "aborted";
    case Code::kUnavailable: return "unavailable";
    case Code::kDataLoss: return "data-loss";
    case Code::kInternal: return "internal";
  }
  return "unknown";
}

std::string Status::ToString() const {
  if (ok()) return "ok";
  std::string s = CodeName(code_);
  if (!type_.empty()) s += "(" + type_ + ")";
  s += ": " + message_;
  if (!log_detail_.empty()) s += " [" + log_detail_ + "]";
  return s;
}

}  // namespace oml
