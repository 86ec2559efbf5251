#include "review/clamd.h"

#include <arpa/inet.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>


namespace oml::review {
namespace {

constexpr size_t kMaxReplyBytes = 4096;

std::string Errno(const char* what) { return std::string(what) + ": " + std::strerror(errno); }

// Waits for `events` on fd; false on timeout or poll error (errno set; ETIMEDOUT on timeout).
bool WaitFor(int fd, short events, int timeout_ms) {
  pollfd p{fd, events, 0};
  for (;;) {
    int r = ::poll(&p, 1, timeout_ms);
    if (r > 0) return true;
    if (r == 0) {
      errno = ETIMEDOUT;
      return false;
    }
    if (errno != EINTR) return false;
  }
}

// Connects a non-blocking socket within timeout_ms.
Result<int> ConnectWithin(int family, const sockaddr* addr, socklen_t len, int timeout_ms) {
  int fd = ::socket(family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return Unavailable(Errno("clamd: socket"));
  if (::connect(fd, addr, len) != 0) {
    if (errno != EINPROGRESS && errno != EAGAIN) {
      std::string e = Errno("clamd: connect");
      ::close(fd);
      return Unavailable(e);
    }
    if (!WaitFor(fd, POLLOUT, timeout_ms)) {
      std::string e = Errno("clamd: connect");
      ::close(fd);
      return Unavailable(e);
    }
    int err = 0;
    socklen_t elen = sizeof err;
    ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &elen);
    if (err != 0) {
      errno = err;
      std::string e = Errno("clamd: connect");
      ::close(fd);
      return Unavailable(e);
    }
  }
  return fd;
}

}  // namespace

std::string ScanResult::ToString() const {
  switch (outcome) {
    case Outcome::kNotConfigured: return "not-configured";
    case Outcome::kClean: return "clean";
    case Outcome::kInfected: return "infected: " + detail;
    case Outcome::kError: return "error: " + detail;
  }
  return "error: unknown outcome";
}

ScanResult ParseClamdReply(std::string_view reply) {
  while (!reply.empty() && (reply.back() == '\n' || reply.back() == '\0')) reply.remove_suffix(1);
  if (reply.empty()) return {ScanResult::Outcome::kError, "clamd closed the connection without an answer"};
  constexpr std::string_view kPrefix = "stream: ";
  constexpr std::string_view kFound = " FOUND";
  if (reply.starts_with(kPrefix)) {
    std::string_view rest = reply.substr(kPrefix.size());
    if (rest == "OK") return {ScanResult::Outcome::kClean, ""};
    if (rest.size() > kFound.size() && rest.ends_with(kFound))
      return {ScanResult::Outcome::kInfected, std::string(rest.substr(0, rest.size() - kFound.size()))};
  }
  return {ScanResult::Outcome::kError, "clamd: " + std::string(reply)};
}

Result<ClamdAddress> ParseClamdAddress(std::string_view address) {
  const std::string quoted = "clamd_address '" + std::string(address) + "': ";
  std::string_view a = address;
  ClamdAddress out;
  if (a.starts_with("unix:") || a.starts_with("/")) {
    if (a.starts_with("unix:")) a.remove_prefix(5);
    if (a.empty() || a.size() >= sizeof(sockaddr_un::sun_path))
      return InvalidArgument(quoted + "unix socket path empty or too long");
    out.unix_socket = true;
    out.path = std::string(a);
    return out;
  }
  if (a.starts_with("tcp:")) a.remove_prefix(4);
  if (a.starts_with("[")) {
    auto close = a.find("]:");
    if (close == std::string_view::npos) return InvalidArgument(quoted + "expected [v6addr]:port");
    out.host = std::string(a.substr(1, close - 1));
    out.port = std::string(a.substr(close + 2));
  } else {
    auto colon = a.rfind(':');
    if (colon == std::string_view::npos || colon == 0)
      return InvalidArgument(quoted + "expected unix:/path, /path or host:port");
    out.host = std::string(a.substr(0, colon));
    out.port = std::string(a.substr(colon + 1));
  }
  if (out.host.empty() || out.port.empty() || out.port.size() > 5 ||
      out.port.find_first_not_of("0123456789") != std::string::npos || std::stoi(out.port) > 65535)
    return InvalidArgument(quoted + "the host is empty or the port is not 0..65535");
  return out;
}

Result<ClamdStream> ClamdStream::Open(const std::string& address, int timeout_ms) {
  OML_ASSIGN_OR_RETURN(ClamdAddress addr, ParseClamdAddress(address));
  Result<int> fd = Unavailable("clamd: no address for '" + addr.host + "'");
  if (addr.unix_socket) {
    sockaddr_un sun{};
    sun.sun_family = AF_UNIX;
    std::memcpy(sun.sun_path, addr.path.data(), addr.path.size());
    fd = ConnectWithin(AF_UNIX, reinterpret_cast<const sockaddr*>(&sun), sizeof sun, timeout_ms);
  } else {
    addrinfo hints{};
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    int gai = ::getaddrinfo(addr.host.c_str(), addr.port.c_str(), &hints, &res);
    if (gai != 0) return Unavailable("clamd: cannot resolve '" + addr.host + "': " + gai_strerror(gai));
    for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
      fd = ConnectWithin(ai->ai_family, ai->ai_addr, ai->ai_addrlen, timeout_ms);
      if (fd.ok()) break;
    }
    ::freeaddrinfo(res);
  }
  if (!fd.ok()) return fd.status();
  ClamdStream s(*fd, timeout_ms);
  static constexpr char kCommand[] = "zINSTREAM";  // with its NUL: sizeof includes it
  OML_RETURN_IF_ERROR(s.SendAll(kCommand, sizeof kCommand));
  return s;
}

ClamdStream::ClamdStream(ClamdStream&& o) noexcept
    : fd_(o.fd_), timeout_ms_(o.timeout_ms_), write_failed_(o.write_failed_), write_error_(std::move(o.write_error_)) {
  o.fd_ = -1;
}

ClamdStream& ClamdStream::operator=(ClamdStream&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.fd_;
    timeout_ms_ = o.timeout_ms_;
    write_failed_ = o.write_failed_;
    write_error_ = std::move(o.write_error_);
    o.fd_ = -1;
  }
  return *this;
}

ClamdStream::~ClamdStream() {
  if (fd_ >= 0) ::close(fd_);
}

Status ClamdStream::SendAll(const char* p, size_t n) {
  if (write_failed_) return Unavailable(write_error_);
  while (n > 0) {
    ssize_t w = ::send(fd_, p, n, MSG_NOSIGNAL);
    if (w > 0) {
      p += w;
      n -= static_cast<size_t>(w);
      continue;
    }
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) && WaitFor(fd_, POLLOUT, timeout_ms_)) continue;
    write_failed_ = true;
    write_error_ = Errno("clamd: send");
    return Unavailable(write_error_);
  }
  return Status::Ok();
}

Status ClamdStream::Write(std::string_view bytes) {
  while (!bytes.empty()) {
    const size_t n = std::min(bytes.size(), kChunkBytes);
    const uint32_t len = htonl(static_cast<uint32_t>(n));
    OML_RETURN_IF_ERROR(SendAll(reinterpret_cast<const char*>(&len), sizeof len));
    OML_RETURN_IF_ERROR(SendAll(bytes.data(), n));
    bytes.remove_prefix(n);
  }
  return Status::Ok();
}

ScanResult ClamdStream::Finish() {
  if (fd_ < 0) return {ScanResult::Outcome::kError, "clamd: stream already finished"};
  if (!write_failed_) {
    const uint32_t end = 0;
    (void)SendAll(reinterpret_cast<const char*>(&end), sizeof end);  // a failure: read the answer anyway
  }
  std::string reply;
  char buf[512];
  std::string read_error;
  while (reply.size() < kMaxReplyBytes && reply.find('\0') == std::string::npos) {
    ssize_t r = ::recv(fd_, buf, sizeof buf, 0);
    if (r > 0) {
      reply.append(buf, static_cast<size_t>(r));
      continue;
    }
    if (r == 0) break;  // clamd closed the connection
    if (errno == EINTR) continue;
    if ((errno == EAGAIN || errno == EWOULDBLOCK) && WaitFor(fd_, POLLIN, timeout_ms_)) continue;
    read_error = Errno("clamd: waiting for the answer");
    break;
  }
  ::close(fd_);
  fd_ = -1;
  if (auto nul = reply.find('\0'); nul != std::string::npos) {
    reply.resize(nul);
  } else if (!read_error.empty()) {  // an answer cut short is no answer
    return {ScanResult::Outcome::kError, read_error};
  }
  if (reply.empty() && write_failed_) return {ScanResult::Outcome::kError, write_error_ + "; no answer"};
  return ParseClamdReply(reply);
}

ScanResult ClamdScan(const std::string& address, std::string_view bytes, int timeout_ms) {
  if (address.empty()) return {ScanResult::Outcome::kNotConfigured, ""};
  auto s = ClamdStream::Open(address, timeout_ms);
  if (!s.ok()) return {ScanResult::Outcome::kError, s.status().message()};
  (void)s->Write(bytes);  // on failure Finish reports clamd's answer or the send error
  return s->Finish();
}

}  // namespace oml::review
