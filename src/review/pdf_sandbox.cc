#include "review/pdf_sandbox.h"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <new>
#include <optional>
#include <vector>

#include <nlohmann/json.hpp>

#include "crypto/crypto.h"

namespace oml::review {
namespace {

using Clock = std::chrono::steady_clock;

// How long an extraction waits for a slot before the request is answered 503.
constexpr std::chrono::milliseconds kSlotWait{500};

// The largest frame either side writes or accepts (pdf_sandbox.h, "Protocol").
constexpr uint32_t kMaxFrame = 1 << 20;

// Exit codes of the child besides 0.
constexpr int kChildUsage = 2;
constexpr int kChildOutOfMemory = 3;

const char* OutcomeName(PdfOutcome o) {
  switch (o) {
    case PdfOutcome::kOk: return "ok";
    case PdfOutcome::kEncrypted: return "encrypted";
    case PdfOutcome::kUnreadable: return "unreadable";
    case PdfOutcome::kTooLarge: return "too-large";
    case PdfOutcome::kLimit: return "limit";
  }
  return "unreadable";
}

PdfOutcome OutcomeOf(const std::string& s) {
  if (s == "ok") return PdfOutcome::kOk;
  if (s == "encrypted") return PdfOutcome::kEncrypted;
  if (s == "too-large") return PdfOutcome::kTooLarge;
  if (s == "limit") return PdfOutcome::kLimit;
  return PdfOutcome::kUnreadable;
}

PdfText Limited(const std::string& which) {
  PdfText t;
  t.outcome = PdfOutcome::kLimit;
  t.notes.push_back("not-extracted: limit: " + which);
  return t;
}

bool WriteAll(int fd, const char* p, size_t n) {
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

// write() to a pipe whose reader is gone, without the process-wide SIGPIPE: the signal is blocked
// in this thread for the call, and one it raised is taken off the thread's pending set.
ssize_t WriteNoSigpipe(int fd, const char* p, size_t n) {
  sigset_t pipe_set, old;
  sigemptyset(&pipe_set);
  sigaddset(&pipe_set, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe_set, &old);
  ssize_t w = ::write(fd, p, n);
  const int saved = errno;
  if (w < 0 && saved == EPIPE) {
    const timespec zero{0, 0};
    sigtimedwait(&pipe_set, nullptr, &zero);
  }
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  errno = saved;
  return w;
}

// Closes a file descriptor once.
struct Fd {
  int fd = -1;
  ~Fd() { Close(); }
  void Close() {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
};

}  // namespace

bool PdfSandbox::Acquire(const std::string& tenant, Clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  const bool got = freed_.wait_until(lock, deadline, [&] {
    return running_ < opts_.max_concurrent && by_tenant_[tenant] < opts_.max_per_tenant;
  });
  if (!got) return false;
  ++running_;
  ++by_tenant_[tenant];
  return true;
}

void PdfSandbox::Release(const std::string& tenant) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    --running_;
    if (--by_tenant_[tenant] <= 0) by_tenant_.erase(tenant);
  }
  freed_.notify_all();
}

Result<PdfText> PdfSandbox::Extract(std::string_view bytes, TextSink* sink, const std::string& tenant) {
  bool given = false;
  return Extract(
      [&]() -> Result<std::string_view> {
        if (given) return std::string_view();
        given = true;
        return bytes;
      },
      bytes.size(), sink, tenant);
}

Result<PdfText> PdfSandbox::Extract(const std::function<Result<std::string_view>()>& next, uint64_t size,
                                    TextSink* sink, const std::string& tenant) {
  // The wall clock bounds the slot wait and the transfer of the file; once its last byte is sent
  // it starts again for the extraction itself, so a large file read from a slow store does not
  // eat the child's time.
  auto deadline = Clock::now() + opts_.wall;
  if (size > static_cast<uint64_t>(INT_MAX)) {
    PdfText t;
    t.outcome = PdfOutcome::kTooLarge;
    return t;
  }
  // A slot is waited for briefly only: a request thread never queues behind a tenant's other
  // extractions (the caller answers 503 and the client retries), and a transient lack of slots
  // is never signed into a review as a limit.
  if (!Acquire(tenant, std::min(deadline, Clock::now() + kSlotWait)))
    return Unavailable("this tenant's PDF extractions are all busy (" + std::to_string(opts_.max_per_tenant) +
                           " at once, " + std::to_string(opts_.max_concurrent) + " for all tenants); retry",
                       "pdf-extraction-busy");
  struct Slot {
    PdfSandbox* s;
    const std::string& t;
    ~Slot() { s->Release(t); }
  } slot{this, tenant};

  int in[2], out[2];
  if (::pipe2(in, O_CLOEXEC) != 0) return Internal(std::string("pipe: ") + std::strerror(errno));
  Fd in_r{in[0]}, in_w{in[1]};
  if (::pipe2(out, O_CLOEXEC) != 0) return Internal(std::string("pipe: ") + std::strerror(errno));
  Fd out_r{out[0]}, out_w{out[1]};
  // The child gets its two pipes and stderr, nothing else: every other descriptor of the server
  // (its listening socket, client connections: asio opens them without close-on-exec) is closed,
  // its signal mask emptied and signals set to default (the server blocks SIGTERM for its
  // waiter thread), and its environment empty.
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, in_r.fd, 0);
  posix_spawn_file_actions_adddup2(&fa, out_w.fd, 1);
  posix_spawn_file_actions_addclosefrom_np(&fa, 3);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none, all;
  sigemptyset(&none);
  sigfillset(&all);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &all);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  char* no_env[] = {nullptr};
  const std::string mem = std::to_string(opts_.memory_bytes);
  const std::string cpu = std::to_string(opts_.cpu_seconds);
  std::vector<char*> argv = {const_cast<char*>("oml"), const_cast<char*>("__extract-pdf"),
                             const_cast<char*>(mem.c_str()),
                             const_cast<char*>(cpu.c_str()), nullptr};
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, opts_.binary.c_str(), &fa, &attr, argv.data(), no_env);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) return Internal("cannot start the PDF extractor " + opts_.binary + ": " + std::strerror(rc));
  in_r.Close();
  out_w.Close();
  bool killed = false;
  auto kill_child = [&] {
    if (!killed) ::kill(pid, SIGKILL);
    killed = true;
  };
  // Whatever ends this call (an error, an exception), the child is killed and reaped.
  bool reaped = false;
  struct Reaper {
    pid_t pid;
    bool* reaped;
    ~Reaper() {
      if (*reaped) return;
      ::kill(pid, SIGKILL);
      while (::waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
      }
    }
  } reaper{pid, &reaped};
  // Write the PDF and read the answer in one poll loop (the child may answer early, e.g. on a
  // file it refuses, and a full pipe must never block either side). Text frames go to the sink
  // as they arrive; the header frame ends the answer.
  ::fcntl(in_w.fd, F_SETFL, O_NONBLOCK);
  std::string_view piece;  // what is left of the piece being written
  Status source_error;
  std::string frames;      // received, not yet parsed
  std::optional<nlohmann::json> head;
  bool bad_frame = false;
  bool timed_out = false;
  char buf[1 << 16];
  auto parse_frames = [&] {
    size_t at = 0;
    while (frames.size() - at >= 5) {
      const auto* p = reinterpret_cast<const unsigned char*>(frames.data() + at);
      const uint32_t n = uint32_t(p[1]) << 24 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 8 | p[4];
      if ((p[0] != 'T' && p[0] != 'H') || n > kMaxFrame || head) {
        bad_frame = true;  // not our child's protocol
        return;
      }
      if (frames.size() - at - 5 < n) break;
      const std::string_view body(frames.data() + at + 5, n);
      if (p[0] == 'T') {
        sink->AppendUtf8(body);
      } else {
        head = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
      }
      at += 5 + n;
    }
    frames.erase(0, at);
  };
  while (out_r.fd >= 0) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) {
      timed_out = true;
      kill_child();
      break;
    }
    pollfd fds[2];
    int n = 0;
    fds[n++] = {out_r.fd, POLLIN, 0};
    if (in_w.fd >= 0) fds[n++] = {in_w.fd, POLLOUT, 0};
    int ready = ::poll(fds, n, static_cast<int>(std::min<long long>(left, 1000)));
    if (ready < 0 && errno != EINTR) {
      kill_child();
      break;
    }
    if (in_w.fd >= 0 && n == 2 && (fds[1].revents & (POLLOUT | POLLERR | POLLHUP))) {
      if (piece.empty()) {
        Result<std::string_view> got = next();
        if (!got.ok()) {
          source_error = got.status();
          kill_child();
          break;
        }
        piece = *got;
        if (piece.empty()) {
          in_w.Close();
          deadline = Clock::now() + opts_.wall;
        }
      }
      if (!piece.empty()) {
        ssize_t w = WriteNoSigpipe(in_w.fd, piece.data(), std::min<size_t>(piece.size(), 1 << 16));
        if (w > 0) piece.remove_prefix(static_cast<size_t>(w));
        if (w < 0 && errno != EAGAIN && errno != EINTR) in_w.Close();  // the child stopped reading
      }
    }
    if (fds[0].revents & (POLLIN | POLLHUP | POLLERR)) {
      ssize_t r = ::read(out_r.fd, buf, sizeof buf);
      if (r > 0) {
        frames.append(buf, static_cast<size_t>(r));
        parse_frames();
        if (bad_frame) {
          kill_child();
          break;
        }
      } else if (r == 0 || (r < 0 && errno != EINTR && errno != EAGAIN)) {
        out_r.Close();
      }
    }
  }
  in_w.Close();
  out_r.Close();  // a child still writing gets EPIPE and ends
  crypto::Wipe(&frames);  // extracted text not yet parsed (an error or a limit)
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  reaped = true;
  if (!source_error.ok()) return source_error;
  if (timed_out) return Limited("time " + std::to_string(opts_.wall.count() / 1000) + " s");
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    if (sig == SIGXCPU) return Limited("cpu " + std::to_string(opts_.cpu_seconds) + " s");
    // poppler's allocator aborts when an allocation fails: under RLIMIT_AS, the memory limit.
    if (sig == SIGABRT) return Limited("memory " + std::to_string(opts_.memory_bytes >> 20) + " MiB (the extractor aborted)");
    if (sig == SIGKILL && !killed)
      return Limited("cpu " + std::to_string(opts_.cpu_seconds) + " s or memory (killed by the system)");
    if (killed) return Internal("the PDF extractor's answer is not in its protocol");
    PdfText t;
    t.outcome = PdfOutcome::kUnreadable;
    t.notes.push_back("the PDF extractor died of signal " + std::to_string(sig));
    return t;
  }
  const int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  if (code == kChildOutOfMemory) return Limited("memory " + std::to_string(opts_.memory_bytes >> 20) + " MiB");
  if (code != 0 || !head || !frames.empty())
    return Internal("the PDF extractor exited " + std::to_string(code) + " without an answer");
  if (!head->is_object()) return Internal("the PDF extractor's answer is not JSON");
  PdfText t;
  t.outcome = OutcomeOf(head->value("outcome", ""));
  t.pages = head->value("pages", 0);
  t.pages_extracted = head->value("pages_extracted", 0);
  if (head->contains("notes") && (*head)["notes"].is_array())
    for (const auto& note : (*head)["notes"]) t.notes.push_back(note.get<std::string>());
  if (head->value("incomplete", false)) sink->MarkIncomplete();
  sink->Finish();
  return t;
}

namespace {

// The child's side of the text frames: stdout, in 'T' frames.
class FrameTap : public TextTap {
 public:
  void Text(std::string_view piece) override {
    while (!piece.empty() && ok_) {
      const std::string_view part = piece.substr(0, kMaxFrame);
      ok_ = WriteFrame('T', part);
      piece.remove_prefix(part.size());
    }
  }
  bool ok() const { return ok_; }
  static bool WriteFrame(char type, std::string_view body) {
    const auto n = static_cast<uint32_t>(body.size());
    const char head[5] = {type, static_cast<char>(n >> 24), static_cast<char>(n >> 16), static_cast<char>(n >> 8),
                          static_cast<char>(n)};
    return WriteAll(1, head, 5) && WriteAll(1, body.data(), body.size());
  }

 private:
  bool ok_ = true;
};

}  // namespace

int RunPdfChild(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: oml __extract-pdf <memory_bytes> <cpu_seconds>\n");
    return kChildUsage;
  }
  const unsigned long long mem = std::strtoull(argv[2], nullptr, 10);
  const unsigned long cpu = std::strtoul(argv[3], nullptr, 10);
  // The limits first, before a byte of the file is read.
  rlimit as{static_cast<rlim_t>(mem), static_cast<rlim_t>(mem)};
  // Soft limit: SIGXCPU (the parent names the CPU limit); the hard one a second later: SIGKILL.
  rlimit cpu_limit{static_cast<rlim_t>(cpu), static_cast<rlim_t>(cpu + 1)};
  if (::setrlimit(RLIMIT_AS, &as) != 0 || ::setrlimit(RLIMIT_CPU, &cpu_limit) != 0) {
    std::perror("setrlimit");
    return kChildUsage;
  }
  try {
    std::string pdf;
    char buf[1 << 16];
    for (;;) {
      ssize_t r = ::read(0, buf, sizeof buf);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) break;
      pdf.append(buf, static_cast<size_t>(r));
    }
    // Nothing kept here: every byte of text goes to the parent as it is produced.
    FrameTap tap;
    TextSink sink(0, &tap);
    PdfText t = ExtractPdf(pdf, &sink);
    sink.Finish();
    nlohmann::json head = {{"outcome", OutcomeName(t.outcome)},
                           {"pages", t.pages},
                           {"pages_extracted", t.pages_extracted},
                           {"notes", t.notes},
                           {"incomplete", sink.incomplete()}};
    if (!tap.ok() || !FrameTap::WriteFrame('H', head.dump())) return 1;
    return 0;
  } catch (const std::bad_alloc&) {
    return kChildOutOfMemory;
  }
}

}  // namespace oml::review
