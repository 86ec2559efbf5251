// Test-only: a small real clamd stand-in. It listens on a TCP port of 127.0.0.1 (or a unix
// socket), accepts connections one after another on its own thread, speaks the server side of
// INSTREAM (clamd.h) and answers as told. There is no ClamAV virus database offline, so the
// client is tested against this server's wire protocol, not against ClamAV's verdicts.
#pragma once

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace oml::review::testing {

class FakeClamd {
 public:
  enum class Mode {
    kClean,           // reads the whole stream, answers "stream: OK"
    kFound,           // reads the whole stream, answers "stream: <signature> FOUND"
    kCloseNoAnswer,   // reads the whole stream, closes without a word
    kSizeLimit,       // after limit_bytes of data answers "INSTREAM size limit exceeded. ERROR",
                      // stops reading the stream (discards the rest until the client closes)
    kSilent,          // reads the whole stream, then never answers (until the test ends)
  };

  // TCP on 127.0.0.1, an ephemeral port.
  explicit FakeClamd(Mode mode) : mode_(mode) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    Check(::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0, "bind");
    socklen_t len = sizeof a;
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    address_ = "127.0.0.1:" + std::to_string(ntohs(a.sin_port));
    Start();
  }
  // A unix socket at `path`.
  FakeClamd(Mode mode, const std::string& path) : mode_(mode) {
    fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::strncpy(a.sun_path, path.c_str(), sizeof a.sun_path - 1);
    Check(::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0, "bind unix");
    address_ = "unix:" + path;
    Start();
  }
  ~FakeClamd() {
    stop_ = true;
    ::shutdown(fd_, SHUT_RDWR);
    if (thread_.joinable()) thread_.join();
    ::close(fd_);
  }
  FakeClamd(const FakeClamd&) = delete;
  FakeClamd& operator=(const FakeClamd&) = delete;

  const std::string& address() const { return address_; }
  std::string signature = "Eicar-Test-Signature";
  size_t limit_bytes = 1024;

  // What the last connection sent.
  struct Session {
    std::string command;              // up to and including the first NUL
    std::string data;                 // the chunks' payload, concatenated
    std::vector<uint32_t> chunk_sizes;
    bool ended = false;               // the zero-length terminator arrived
  };
  std::vector<Session> sessions() {
    std::lock_guard<std::mutex> l(mu_);
    return sessions_;
  }

 private:
  static void Check(bool ok, const char* what) {
    if (!ok) {
      ADD_FAILURE() << "FakeClamd: " << what << ": " << std::strerror(errno);
      std::abort();
    }
  }
  void Start() {
    Check(::listen(fd_, 8) == 0, "listen");
    thread_ = std::thread([this] { Serve(); });
  }
  // Reads exactly n bytes; false on EOF or error.
  bool ReadN(int c, char* p, size_t n) {
    while (n > 0) {
      ssize_t r = ::recv(c, p, n, 0);
      if (r <= 0) return false;
      p += r;
      n -= static_cast<size_t>(r);
    }
    return true;
  }
  static void SendAll(int c, std::string_view s) {
    while (!s.empty()) {
      ssize_t w = ::send(c, s.data(), s.size(), MSG_NOSIGNAL);
      if (w <= 0) return;
      s.remove_prefix(static_cast<size_t>(w));
    }
  }
  void Serve() {
    while (!stop_) {
      int c = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (c < 0) return;
      Session s;
      char ch;
      while (ReadN(c, &ch, 1)) {
        s.command += ch;
        if (ch == '\0' || s.command.size() > 64) break;
      }
      bool answered = false;
      for (;;) {
        uint32_t len_be;
        if (!ReadN(c, reinterpret_cast<char*>(&len_be), 4)) break;
        const uint32_t len = ntohl(len_be);
        if (len == 0) {
          s.ended = true;
          break;
        }
        s.chunk_sizes.push_back(len);
        std::string chunk(len, '\0');
        if (!ReadN(c, chunk.data(), len)) break;
        s.data += chunk;
        if (mode_ == Mode::kSizeLimit && s.data.size() >= limit_bytes) {
          SendAll(c, std::string_view("INSTREAM size limit exceeded. ERROR\0", 36));
          answered = true;
          // Drain without recording, so the close below sends no RST over unread data.
          ::shutdown(c, SHUT_WR);
          char sink[65536];
          while (::recv(c, sink, sizeof sink, 0) > 0) {
          }
          break;
        }
      }
      {
        std::lock_guard<std::mutex> l(mu_);
        sessions_.push_back(s);
      }
      if (!answered) {
        if (mode_ == Mode::kClean) SendAll(c, std::string_view("stream: OK\0", 11));
        if (mode_ == Mode::kFound) {
          std::string a = "stream: " + signature + " FOUND";
          SendAll(c, std::string_view(a.c_str(), a.size() + 1));
        }
        if (mode_ == Mode::kSilent) {
          while (!stop_) {
            pollfd p{c, POLLIN, 0};
            ::poll(&p, 1, 20);
            if (p.revents != 0) {
              char b;
              if (::recv(c, &b, 1, 0) <= 0) break;
            }
          }
        }
      }
      ::close(c);
    }
  }

  Mode mode_;
  int fd_ = -1;
  std::string address_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::vector<Session> sessions_;
};

}  // namespace oml::review::testing
