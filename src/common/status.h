// Status and Result<T>: the error currency at every module boundary.
//
// Codes map one-to-one onto HTTP problem types (api/problem.cc) and CLI exit codes
// (cli/exit_codes.h). Pick the code by what the caller must do next:
//   kInvalidArgument    the input is malformed; fix the request (400).
//   kUnauthenticated    missing or unknown credentials (401).
//   kPermissionDenied   the principal's role forbids this (403).
//   kNotFound           no such object *in the caller's tenant* (404). Foreign ids are
//                       reported as kNotFound so ids cannot be probed.
//   kGone               the object existed but was erased (410).
//   kPayloadTooLarge    the body exceeds a configured limit (413).
//   kFailedPrecondition fix the state first (e.g. schema newer than binary) (409).
//   kAborted            retry the whole transaction (serialization failure).
//   kUnavailable        retry the call later (database down, chain fork: writes refused) (503).
//   kDataLoss           stored bytes do not match their digest or signature (500).
//   kInternal           a bug or an unexpected library failure (500).
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <variant>

namespace oml {

enum class Code {
  kOk = 0,
  kInvalidArgument,
  kUnauthenticated,
  kPermissionDenied,
  kNotFound,
  kGone,
  kPayloadTooLarge,
  kFailedPrecondition,
  kAborted,
  kUnavailable,
  kDataLoss,
  kInternal,
};

const char* CodeName(Code c);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(Code code, std::string message, std::string type = {})
      : code_(code), message_(std::move(message)), type_(std::move(type)) {}

  static Status Ok() { return Status(); }

  bool ok() const { return code_ == Code::kOk; }
  Code code() const { return code_; }
  const std::string& message() const { return message_; }
  // A stable, more specific problem type (e.g. "chain-fork", "integrity"). Empty means the
  // default type for the code.
  const std::string& type() const { return type_; }
  // Diagnostics for the server log and the operator's terminal only, never for an API client:
  // e.g. a database error's SQLSTATE, PostgreSQL's own message, DETAIL and constraint name
  // (db/conn.h). message() stays our own short text. Empty when there is nothing more to say.
  const std::string& log_detail() const { return log_detail_; }
  Status WithLogDetail(std::string d) const& {
    Status s = *this;
    s.log_detail_ = std::move(d);
    return s;
  }
  Status WithLogDetail(std::string d) && {
    log_detail_ = std::move(d);
    return std::move(*this);
  }
  // "code(type): message", then " [log_detail]" if any. For logs and the CLI, not for clients.
  std::string ToString() const;

 private:
  Code code_ = Code::kOk;
  std::string message_;
  std::string type_;
  std::string log_detail_;
};

inline Status InvalidArgument(std::string m, std::string t = {}) { return {Code::kInvalidArgument, std::move(m), std::move(t)}; }
inline Status NotFound(std::string m, std::string t = {}) { return {Code::kNotFound, std::move(m), std::move(t)}; }
inline Status Internal(std::string m, std::string t = {}) { return {Code::kInternal, std::move(m), std::move(t)}; }
inline Status DataLoss(std::string m, std::string t = {}) { return {Code::kDataLoss, std::move(m), std::move(t)}; }
inline Status Unavailable(std::string m, std::string t = {}) { return {Code::kUnavailable, std::move(m), std::move(t)}; }
inline Status FailedPrecondition(std::string m, std::string t = {}) { return {Code::kFailedPrecondition, std::move(m), std::move(t)}; }
inline Status PermissionDenied(std::string m, std::string t = {}) { return {Code::kPermissionDenied, std::move(m), std::move(t)}; }
inline Status Unauthenticated(std::string m, std::string t = {}) { return {Code::kUnauthenticated, std::move(m), std::move(t)}; }

// Result<T> holds either a value or a non-OK Status.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}  // NOLINT(google-explicit-constructor)
  Result(Status s) : v_(std::move(s)) {}     // NOLINT(google-explicit-constructor)

  bool ok() const { return std::holds_alternative<T>(v_); }
  const Status& status() const {
    static const Status kOkStatus;
    return ok() ? kOkStatus : std::get<Status>(v_);
  }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace oml

#define OML_CONCAT_INNER(a, b) a##b
#define OML_CONCAT(a, b) OML_CONCAT_INNER(a, b)

// Returns from the enclosing function if `expr` (a Status) is not OK.
#define OML_RETURN_IF_ERROR(expr)            \
  do {                                       \
    ::oml::Status _oml_st = (expr);          \
    if (!_oml_st.ok()) return _oml_st;       \
  } while (0)

// OML_ASSIGN_OR_RETURN(auto x, ResultExpr()) — binds the value or returns the error.
#define OML_ASSIGN_OR_RETURN(lhs, rexpr) \
  OML_ASSIGN_OR_RETURN_IMPL(OML_CONCAT(_oml_r_, __LINE__), lhs, rexpr)
#define OML_ASSIGN_OR_RETURN_IMPL(tmp, lhs, rexpr) \
  auto tmp = (rexpr);                              \
  if (!tmp.ok()) return tmp.status();              \
  lhs = std::move(tmp).value()
