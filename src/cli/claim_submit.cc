#include "cli/claim_submit.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <thread>
#include <utility>

#include "cli/exit_codes.h"
#include "cli/http_client.h"
#include "common/secret_file.h"
#include "crypto/crypto.h"

namespace oml::cli {
namespace fs = std::filesystem;
using json = nlohmann::json;
using Headers = std::vector<std::pair<std::string, std::string>>;
using Clock = std::chrono::steady_clock;

namespace {

constexpr char kTusVersion[] = "1.0.0";
constexpr char kUploadsPath[] = "/v1/uploads";
constexpr size_t kHashBlock = 1 << 20;

// SHA-256 over a stream of blocks (OpenSSL EVP).
class Sha256Stream {
 public:
  Sha256Stream() : ctx_(EVP_MD_CTX_new()) { EVP_DigestInit_ex(ctx_, EVP_sha256(), nullptr); }
  ~Sha256Stream() { EVP_MD_CTX_free(ctx_); }
  Sha256Stream(const Sha256Stream&) = delete;
  Sha256Stream& operator=(const Sha256Stream&) = delete;
  void Update(std::string_view b) { EVP_DigestUpdate(ctx_, b.data(), b.size()); }
  std::string Final() {
    unsigned char d[EVP_MAX_MD_SIZE];
    unsigned int n = 0;
    EVP_DigestFinal_ex(ctx_, d, &n);
    return std::string(reinterpret_cast<char*>(d), n);
  }

 private:
  EVP_MD_CTX* ctx_;
};

std::string HumanBytes(double b) {
  static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) {
    b /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.1f %s", b, kUnits[u]);
  return buf;
}

// Progress on stderr: a redrawn bar on a terminal, plain lines otherwise.
class Progress {
 public:
  explicit Progress(bool tty) : tty_(tty) {}

  // A new phase ("hashing", "uploading") of `name`, `total` bytes, starting at `at`.
  void Begin(const std::string& name, const char* verb, uint64_t total, uint64_t at) {
    name_ = name.size() > 28 ? "..." + name.substr(name.size() - 25) : name;
    verb_ = verb;
    total_ = total;
    start_at_ = at;
    t0_ = Clock::now();
    last_draw_ = {};
    next_pct_ = total ? (at * 100 / total) / 10 * 10 + 10 : 100;
    active_ = true;
    Update(at, true);
  }

  void Update(uint64_t done, bool force = false) {
    if (!active_) return;
    const auto now = Clock::now();
    const double secs = std::chrono::duration<double>(now - t0_).count();
    const double rate = secs > 0 ? static_cast<double>(done - std::min(done, start_at_)) / secs : 0;
    const int pct = total_ ? static_cast<int>(done * 100 / total_) : 100;
    if (tty_) {
      if (!force && done != total_ && now - last_draw_ < std::chrono::milliseconds(100)) return;
      last_draw_ = now;
      const int filled = pct * 24 / 100;
      std::fprintf(stderr, "\r\033[K%s %-28s [%.*s%*s] %3d%% %s/%s %s/s", verb_, name_.c_str(), filled,
                   "########################", 24 - filled, "", pct, HumanBytes(static_cast<double>(done)).c_str(),
                   HumanBytes(static_cast<double>(total_)).c_str(), HumanBytes(rate).c_str());
      std::fflush(stderr);
      return;
    }
    // Plain lines while uploading only: every 10 % (hashing is silent).
    if (std::strcmp(verb_, "uploading") != 0 || force || pct < next_pct_) return;
    next_pct_ = pct / 10 * 10 + 10;
    std::fprintf(stderr, "%s: %llu/%llu bytes (%d%%), %s/s\n", name_.c_str(), static_cast<unsigned long long>(done),
                 static_cast<unsigned long long>(total_), pct, HumanBytes(rate).c_str());
  }

  void End() {
    if (active_ && tty_) std::fprintf(stderr, "\r\033[K");
    active_ = false;
  }

  // A message line; the bar (if any) is redrawn at the next update.
  void Note(const std::string& line) {
    if (tty_ && active_) std::fprintf(stderr, "\r\033[K");
    std::fprintf(stderr, "%s\n", line.c_str());
    std::fflush(stderr);
    last_draw_ = {};
  }

 private:
  bool tty_;
  bool active_ = false;
  std::string name_;
  const char* verb_ = "";
  uint64_t total_ = 0, start_at_ = 0;
  int next_pct_ = 10;
  Clock::time_point t0_, last_draw_;
};

std::optional<uint64_t> ParseOffset(const std::optional<std::string>& v) {
  if (!v || v->empty() || v->size() > 18) return std::nullopt;
  uint64_t x = 0;
  for (char ch : *v) {
    if (ch < '0' || ch > '9') return std::nullopt;
    x = x * 10 + static_cast<uint64_t>(ch - '0');
  }
  return x;
}

bool HasToken(const std::string& list, const std::string& token) {
  std::stringstream ss(list);
  for (std::string t; std::getline(ss, t, ',');) {
    t.erase(0, t.find_first_not_of(" \t"));
    t.erase(t.find_last_not_of(" \t") + 1);
    if (t == token) return true;
  }
  return false;
}

Result<std::string> ReadWholeFile(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound(std::string("cannot read the ") + what + " " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The API key: --api-key-file (first line), else $OML_API_KEY, else the local profile's
// $OML_HOME/dev-writer.token. Never from argv (the process table shows it to every local user).
Result<std::string> LoadToken(const Config& cfg, const ClaimSubmitOptions& o) {
  std::string token;
  if (!o.api_key_file.empty()) {
    OML_ASSIGN_OR_RETURN(std::string text, ReadWholeFile(o.api_key_file, "API key file"));
    token = text.substr(0, text.find('\n'));
    if (!token.empty() && token.back() == '\r') token.pop_back();
    if (token.empty()) return InvalidArgument("the API key file " + o.api_key_file + " is empty (its first line is the key)");
  } else if (const char* env = std::getenv("OML_API_KEY"); env && *env) {
    token = env;
  } else if (const std::string dev = cfg.home + "/dev-writer.token"; fs::exists(dev)) {
    OML_ASSIGN_OR_RETURN(std::string text, ReadWholeFile(dev, "API key file"));
    token = text.substr(0, text.find('\n'));
  }
  if (token.empty())
    return InvalidArgument("no API key: give --api-key-file FILE (its first line) or set OML_API_KEY");
  for (unsigned char ch : token)
    if (ch <= 0x20 || ch >= 0x7f) return InvalidArgument("the API key must be printable ASCII without spaces");
  return token;
}

struct Uploaded {
  std::string file;
  std::string filename;
  std::string upload_id;
  std::string location;  // "/v1/uploads/<id>"
  std::string sha256;    // raw
  uint64_t size = 0;
  std::string media_type;
  std::string state_file;
};

// Uploads files and submits the claim for one run of the command.
class Submitter {
 public:
  Submitter(const ClaimSubmitOptions& o, HttpClient* http, std::string token, Progress* progress, std::string state_dir)
      : o_(o), http_(http), token_(std::move(token)), progress_(progress), state_dir_(std::move(state_dir)),
        chunk_(o.chunk_size) {}

  // OPTIONS /v1/uploads: tus 1.0.0 with creation and sha256 checksums, and Tus-Max-Size.
  Status Discover() {
    OML_ASSIGN_OR_RETURN(HttpResponse r, SendWithRetry("OPTIONS", kUploadsPath, {}, ""));
    if (r.status == 404 || r.status == 405)
      return FailedPrecondition("the server at " + http_->server().base + " does not take uploads (OPTIONS " +
                                    kUploadsPath + ": HTTP " + std::to_string(r.status) + ")",
                                "uploads-unsupported");
    if (r.status != 204 && r.status != 200) return StatusOfProblem(r.status, r.body, "OPTIONS " + std::string(kUploadsPath));
    if (!HasToken(r.Header("Tus-Version").value_or(""), kTusVersion) ||
        !HasToken(r.Header("Tus-Extension").value_or(""), "creation") ||
        !HasToken(r.Header("Tus-Extension").value_or(""), "checksum") ||
        !HasToken(r.Header("Tus-Checksum-Algorithm").value_or(""), "sha256"))
      return FailedPrecondition("the server's uploads do not speak tus 1.0.0 with creation and sha256 checksums",
                                "uploads-unsupported");
    max_size_ = ParseOffset(r.Header("Tus-Max-Size"));
    return Status::Ok();
  }

  // Names, sizes and digests `file` (REQUIRES: Discover).
  Result<Uploaded> Prepare(const std::string& file) {
    OML_ASSIGN_OR_RETURN(OpenFile f, Open(file));
    const int fd = f.fd;
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) return InvalidArgument(file + " is not a regular file");
    Uploaded u;
    u.file = file;
    u.filename = fs::path(file).filename().string();
    u.size = static_cast<uint64_t>(st.st_size);
    u.media_type = o_.media_type.empty() ? GuessMediaType(u.filename) : o_.media_type;
    if (max_size_ && u.size > *max_size_)
      return Status(Code::kPayloadTooLarge,
                    file + " is " + std::to_string(u.size) + " bytes; the server takes at most " +
                        std::to_string(*max_size_) + " (Tus-Max-Size)",
                    "upload-too-large");

    // 1. The whole file's digest, declared at creation.
    {
      Sha256Stream sha;
      std::string block(kHashBlock, '\0');
      uint64_t done = 0;
      progress_->Begin(u.filename, "hashing", u.size, 0);
      for (;;) {
        const ssize_t n = ::read(fd, block.data(), block.size());
        if (n < 0) {
          if (errno == EINTR) continue;
          progress_->End();
          return FailedPrecondition("cannot read " + file + ": " + std::strerror(errno));
        }
        if (n == 0) break;
        sha.Update(std::string_view(block.data(), static_cast<size_t>(n)));
        done += static_cast<uint64_t>(n);
        progress_->Update(done);
      }
      progress_->End();
      if (done != u.size) return FailedPrecondition(file + " changed size while it was read");
      u.sha256 = sha.Final();
    }
    u.state_file = (fs::path(state_dir_) / StateFileName(http_->server().base, token_, u.sha256, u.size)).string();
    return u;
  }

  // Uploads a prepared file: continues its session, or starts one. Fills location and upload_id.
  Status Transfer(Uploaded& u) {
    const std::string& file = u.file;
    OML_ASSIGN_OR_RETURN(OpenFile f, Open(file));
    const int fd = f.fd;
    struct stat st {};
    if (::fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_size) != u.size)
      return FailedPrecondition(file + " changed size since it was hashed");

    // A session to continue, or a new one.
    uint64_t offset = 0;
    bool have = false;
    if (fs::exists(u.state_file)) {
      auto text = ReadWholeFile(u.state_file, "upload state file");
      json j = text.ok() ? json::parse(*text, nullptr, false) : json();
      const std::string loc = j.is_object() ? j.value("location", "") : "";
      if (loc.rfind(std::string(kUploadsPath) + "/", 0) == 0 && used_.count(loc)) {
        // Another --file of this run had the same bytes: this one gets a session of its own.
      } else if (loc.rfind(std::string(kUploadsPath) + "/", 0) == 0) {
        u.location = loc;
        u.upload_id = u.location.substr(u.location.rfind('/') + 1);
        auto h = Head(u.location);
        if (h.ok() && h->second == u.size) {
          offset = h->first;
          have = true;
          progress_->Note(offset == u.size ? u.filename + ": already uploaded (upload " + u.upload_id + ")"
                                           : "resuming " + u.filename + " at byte " + std::to_string(offset) + " of " +
                                                 std::to_string(u.size) + " (upload " + u.upload_id + ")");
        } else if (h.ok() || h.status().code() == Code::kNotFound || h.status().code() == Code::kGone) {
          progress_->Note(u.filename + ": upload " + u.upload_id + " cannot be continued, starting over: " +
                          (h.ok() ? std::string("its length differs") : h.status().message()));
        } else {
          return h.status();
        }
      } else {
        progress_->Note(u.filename + ": ignoring the unreadable state file " + u.state_file);
      }
      if (!have) {
        std::error_code ec;
        fs::remove(u.state_file, ec);
      }
    }

    // The chunks. A session that vanishes mid-way (expired, cancelled) is started over once.
    for (int restarts = 0;; ++restarts) {
      if (!have) {
        OML_RETURN_IF_ERROR(Create(&u, &offset));
        have = true;
      }
      Status s = SendChunks(fd, u, &offset);
      progress_->End();
      if (s.ok()) break;
      if (s.type() == "digest-mismatch" || s.type() == "upload-failed") {
        std::error_code ec;
        fs::remove(u.state_file, ec);
        return Status(s.code(), file + " changed while it was uploaded (its SHA-256 is no longer the one declared): " +
                                    s.message(), s.type());
      }
      if ((s.code() == Code::kNotFound || s.code() == Code::kGone) && restarts == 0) {
        progress_->Note(u.filename + ": upload " + u.upload_id + " is gone, starting over: " + s.message());
        std::error_code ec;
        fs::remove(u.state_file, ec);
        have = false;
        offset = 0;
        continue;
      }
      return s;
    }
    used_.insert(u.location);
    progress_->Note("uploaded " + u.filename + ": upload " + u.upload_id + ", " + std::to_string(u.size) +
                    " bytes, sha256 " + crypto::Hex(u.sha256));
    return Status::Ok();
  }

  // The claim's request without its attachments.
  json BaseRequest(const std::optional<std::string>& body) const {
    json req = {{"workarea_id", o_.workarea_id}, {"path", o_.path}, {"provenance", o_.provenance}};
    if (body) req["body"] = *body;
    if (!o_.body_media_type.empty()) req["media_type"] = o_.body_media_type;
    if (!o_.simulation_id.empty()) req["simulation_id"] = o_.simulation_id;
    return req;
  }

  // POST /v1/claims of `text` under Idempotency-Key `key`; returns the 201 body.
  Result<std::string> PostClaim(const std::string& text, const std::string& key) {
    OML_ASSIGN_OR_RETURN(HttpResponse r,
                         SendWithRetry("POST", "/v1/claims",
                                       {{"Content-Type", "application/json"}, {"Idempotency-Key", "\"" + key + "\""}},
                                       text));
    if (r.status != 201) return StatusOfProblem(r.status, r.body, "POST /v1/claims");
    if (r.Header("Idempotent-Replayed")) progress_->Note("the server replayed the receipt of this claim's earlier submission");
    return r.body;
  }

 private:
  Headers Auth(Headers h, bool tus) const {
    h.emplace_back("Authorization", "Bearer " + token_);
    if (tus) h.emplace_back("Tus-Resumable", kTusVersion);
    return h;
  }

  // A failure that may pass: waits the backoff and returns OK, or returns `why` once --retries
  // failures came in a row.
  Status WaitBeforeRetry(const Status& why, int retry_after_s = 0) {
    if (++failures_ > o_.retries) return why;
    const auto d = Backoff(failures_, retry_after_s);
    progress_->Note("retrying in " + std::to_string(d.count()) + " ms (" + std::to_string(failures_) + "/" +
                    std::to_string(o_.retries) + "): " + why.message());
    std::this_thread::sleep_for(d);
    return Status::Ok();
  }

  static int RetryAfter(const HttpResponse& r) {
    auto v = ParseOffset(r.Header("Retry-After"));
    return v ? static_cast<int>(std::min<uint64_t>(*v, 60)) : 0;
  }

  static bool Transient(int status) { return status == 502 || status == 503 || status == 504 || status == 429; }

  // One request, retried on connection errors and transient statuses. For requests whose
  // repetition is harmless: OPTIONS, HEAD, the claim (Idempotency-Key), and creation (a
  // duplicate session is never used and expires).
  Result<HttpResponse> SendWithRetry(const std::string& method, const std::string& target, Headers h,
                                     const std::string& body) {
    const bool tus = target.rfind(kUploadsPath, 0) == 0;
    const Headers all = Auth(std::move(h), tus);
    for (;;) {
      auto r = http_->Send(method, target, all, body);
      if (!r.ok()) {
        if (r.status().code() != Code::kUnavailable) return r.status();
        OML_RETURN_IF_ERROR(WaitBeforeRetry(r.status()));
        continue;
      }
      if (Transient(r->status)) {
        OML_RETURN_IF_ERROR(WaitBeforeRetry(StatusOfProblem(r->status, r->body, method + " " + target), RetryAfter(*r)));
        continue;
      }
      failures_ = 0;
      return r;
    }
  }

  // HEAD of a session: (offset, length). kNotFound / kGone when the session cannot go on.
  Result<std::pair<uint64_t, uint64_t>> Head(const std::string& location) {
    OML_ASSIGN_OR_RETURN(HttpResponse r, SendWithRetry("HEAD", location, {}, ""));
    if (r.status != 200) return StatusOfProblem(r.status, r.body, "HEAD " + location);
    auto off = ParseOffset(r.Header("Upload-Offset"));
    auto len = ParseOffset(r.Header("Upload-Length"));
    if (!off || !len) return InvalidArgument("HEAD " + location + ": no Upload-Offset or Upload-Length", "invalid-response");
    return std::make_pair(*off, *len);
  }

  Status Create(Uploaded* u, uint64_t* offset) {
    OML_ASSIGN_OR_RETURN(
        HttpResponse r,
        SendWithRetry("POST", kUploadsPath,
                      {{"Upload-Length", std::to_string(u->size)},
                       {"Upload-Metadata", UploadMetadata(u->sha256, u->filename, u->media_type)}},
                      ""));
    if (r.status != 201) return StatusOfProblem(r.status, r.body, "POST " + std::string(kUploadsPath));
    // A path, or an absolute URL (e.g. rewritten by a proxy): its path names the session.
    std::string loc = r.Header("Location").value_or("");
    if (const size_t scheme = loc.find("://"); scheme != std::string::npos && scheme < 8) {
      const size_t slash = loc.find('/', scheme + 3);
      loc = slash == std::string::npos ? std::string() : loc.substr(slash);
    }
    const std::string prefix = std::string(kUploadsPath) + "/";
    if (loc.rfind(prefix, 0) != 0 || loc.size() == prefix.size() || loc.find_first_of("/?#", prefix.size()) != std::string::npos)
      return InvalidArgument("POST /v1/uploads answered 201 without a Location under /v1/uploads/", "invalid-response");
    auto off = ParseOffset(r.Header("Upload-Offset"));
    u->location = loc;
    u->upload_id = loc.substr(prefix.size());
    *offset = off.value_or(0);
    json state = {{"server", http_->server().base}, {"location", loc}, {"file", u->file},
                  {"size", u->size}, {"sha256", crypto::Hex(u->sha256)}};
    if (Status s = WriteSecretFile(u->state_file, state.dump() + "\n", 0600); !s.ok())
      progress_->Note("warning: cannot write the state file (the upload is not resumable): " + s.message());
    progress_->Note("uploading " + u->filename + " (" + std::to_string(u->size) + " bytes) as upload " + u->upload_id);
    return Status::Ok();
  }

  // PATCHes from *offset to the end. Returns the problem that ends the session's use.
  Status SendChunks(int fd, const Uploaded& u, uint64_t* offset) {
    std::string buf;
    bool need_head = false;
    progress_->Begin(u.filename, "uploading", u.size, *offset);
    while (*offset < u.size || need_head) {
      if (need_head) {
        OML_ASSIGN_OR_RETURN(auto h, Head(u.location));
        if (h.first != *offset) progress_->Note(u.filename + ": the server is at byte " + std::to_string(h.first));
        *offset = h.first;
        need_head = false;
        progress_->Update(*offset);
        continue;
      }
      const uint64_t n = std::min<uint64_t>(chunk_, u.size - *offset);
      buf.resize(n);
      for (uint64_t got = 0; got < n;) {
        const ssize_t r = ::pread(fd, buf.data() + got, n - got, static_cast<off_t>(*offset + got));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return FailedPrecondition("cannot read " + u.file + " at byte " + std::to_string(*offset + got) +
                                              (r == 0 ? ": the file is shorter than before" : ": " + std::string(std::strerror(errno))));
        got += static_cast<uint64_t>(r);
      }
      const Headers h = Auth({{"Content-Type", "application/offset+octet-stream"},
                              {"Upload-Offset", std::to_string(*offset)},
                              {"Upload-Checksum", "sha256 " + crypto::Base64(crypto::Sha256(buf))}},
                             true);
      auto r = http_->Send("PATCH", u.location, h, buf);
      if (!r.ok()) {
        if (r.status().code() != Code::kUnavailable) return r.status();
        OML_RETURN_IF_ERROR(WaitBeforeRetry(r.status()));
        need_head = true;  // the chunk may have been taken
        continue;
      }
      const std::string what = "PATCH " + u.location + " at byte " + std::to_string(*offset);
      if (r->status == 204) {
        auto next = ParseOffset(r->Header("Upload-Offset"));
        if (!next || *next < *offset || *next > u.size)
          return InvalidArgument(what + ": answered 204 without a valid Upload-Offset", "invalid-response");
        failures_ = 0;
        *offset = *next;
        progress_->Update(*offset);
        if (o_.test_kill_after_chunks > 0 && ++chunks_sent_ == o_.test_kill_after_chunks) {
          progress_->Note("test: killing myself after " + std::to_string(chunks_sent_) + " chunks");
          ::raise(SIGKILL);
        }
        continue;
      }
      const Status st = StatusOfProblem(r->status, r->body, what);
      if (st.type() == "upload-offset-mismatch") {
        auto at = ParseOffset(r->Header("Upload-Offset"));
        if (++failures_ > o_.retries) return st;  // no wait: the answer says where to go on
        if (at) {
          progress_->Note(u.filename + ": the server is at byte " + std::to_string(*at));
          *offset = *at;
        } else {
          need_head = true;
        }
        continue;
      }
      if (st.type() == "upload-busy" || st.type() == "checksum-mismatch" || Transient(r->status)) {
        OML_RETURN_IF_ERROR(WaitBeforeRetry(st, RetryAfter(*r)));
        need_head = true;
        continue;
      }
      if (r->status == 413 && st.type() == "body-too-large" && n > kMinChunk) {
        chunk_ = std::max<uint64_t>(kMinChunk, n / 2);
        progress_->Note(u.filename + ": the server refused a " + std::to_string(n) + "-byte chunk (413 body-too-large): sending " +
                        std::to_string(chunk_) + "-byte chunks");
        continue;
      }
      return st;
    }
    return Status::Ok();
  }

  // A file descriptor, closed on destruction.
  struct OpenFile {
    int fd = -1;
    explicit OpenFile(int f) : fd(f) {}
    OpenFile(OpenFile&& o) noexcept : fd(std::exchange(o.fd, -1)) {}
    OpenFile& operator=(OpenFile&&) = delete;
    ~OpenFile() {
      if (fd >= 0) ::close(fd);
    }
  };
  static Result<OpenFile> Open(const std::string& file) {
    const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd >= 0) return OpenFile(fd);
    if (errno == ENOENT) return NotFound("file " + file + " does not exist");
    return FailedPrecondition("cannot open " + file + ": " + std::strerror(errno));
  }

  const ClaimSubmitOptions& o_;
  HttpClient* http_;
  const std::string token_;
  Progress* progress_;
  const std::string state_dir_;
  uint64_t chunk_;
  std::optional<uint64_t> max_size_;
  std::set<std::string> used_;  // sessions of this run's files
  int failures_ = 0;          // failed attempts in a row
  int64_t chunks_sent_ = 0;   // chunks the server took in this run
};

int Fail(const Status& s) {
  std::cerr << "oml: " << s.ToString() << "\n";
  return ExitCodeFor(s);
}

}  // namespace

std::string GuessMediaType(const std::string& filename) {
  static const std::map<std::string, std::string> kTypes = {
      {"txt", "text/plain"},          {"log", "text/plain"},         {"md", "text/markdown"},
      {"markdown", "text/markdown"},  {"csv", "text/csv"},           {"tsv", "text/tab-separated-values"},
      {"html", "text/html"},          {"htm", "text/html"},          {"css", "text/css"},
      {"json", "application/json"},   {"jsonl", "application/jsonl"}, {"ndjson", "application/x-ndjson"},
      {"xml", "application/xml"},     {"yaml", "application/yaml"},  {"yml", "application/yaml"},
      {"toml", "application/toml"},   {"pdf", "application/pdf"},    {"zip", "application/zip"},
      {"gz", "application/gzip"},     {"tgz", "application/gzip"},   {"tar", "application/x-tar"},
      {"zst", "application/zstd"},    {"png", "image/png"},          {"jpg", "image/jpeg"},
      {"jpeg", "image/jpeg"},         {"gif", "image/gif"},          {"webp", "image/webp"},
      {"svg", "image/svg+xml"},       {"mp3", "audio/mpeg"},         {"wav", "audio/wav"},
      {"mp4", "video/mp4"},           {"webm", "video/webm"},        {"parquet", "application/vnd.apache.parquet"},
      {"py", "text/x-python"},        {"c", "text/x-c"},             {"h", "text/x-c"},
      {"cc", "text/x-c++"},           {"cpp", "text/x-c++"},         {"rs", "text/x-rust"},
      {"go", "text/x-go"},            {"js", "text/javascript"},     {"ts", "text/x-typescript"},
      {"sh", "text/x-shellscript"},   {"sql", "application/sql"},
  };
  const size_t dot = filename.rfind('.');
  if (dot == std::string::npos || dot == 0 || filename.find('/', dot) != std::string::npos) return "application/octet-stream";
  std::string ext = filename.substr(dot + 1);
  for (char& ch : ext) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  auto it = kTypes.find(ext);
  return it == kTypes.end() ? "application/octet-stream" : it->second;
}

std::string UploadMetadata(const std::string& sha256_raw, const std::string& filename, const std::string& media_type) {
  std::string out = "sha256 " + crypto::Base64(sha256_raw);
  if (!filename.empty()) out += ",filename " + crypto::Base64(filename);
  if (!media_type.empty()) out += ",content-type " + crypto::Base64(media_type);
  return out;
}

std::string StateDir() {
  if (const char* h = std::getenv("OML_HOME"); h && *h) return (fs::absolute(h) / "uploads").string();
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return (fs::path(x) / "oml" / "uploads").string();
  if (const char* home = std::getenv("HOME"); home && *home) return (fs::path(home) / ".cache" / "oml" / "uploads").string();
  return (fs::temp_directory_path() / ("oml-uploads-" + std::to_string(::getuid()))).string();
}

std::string StateFileName(const std::string& server_base, const std::string& token, const std::string& sha256_raw,
                          uint64_t size) {
  const std::string id = "oml-upload-state\n" + server_base + "\n" + crypto::Hex(crypto::Sha256(token)) + "\n" +
                         crypto::Hex(sha256_raw) + "\n" + std::to_string(size);
  return crypto::Hex(crypto::Sha256(id)) + ".json";
}

namespace {
Code CodeOfHttp(int http_status, const std::string& slug) {
  switch (http_status) {
    case 400: case 422: case 460: return Code::kInvalidArgument;
    case 401: return Code::kUnauthenticated;
    case 403: return Code::kPermissionDenied;
    case 404: return Code::kNotFound;
    case 409: return Code::kFailedPrecondition;
    case 410: return Code::kGone;
    case 413: return Code::kPayloadTooLarge;
    case 500: return slug == "integrity" ? Code::kDataLoss : Code::kInternal;
    default: return http_status >= 500 ? Code::kUnavailable : Code::kInvalidArgument;
  }
}
}  // namespace

std::string ClaimStateFileName(const std::string& server_base, const std::string& token, const std::string& request,
                               const std::vector<std::pair<std::string, uint64_t>>& files) {
  std::string id = "oml-claim-state\n" + server_base + "\n" + crypto::Hex(crypto::Sha256(token)) + "\n" +
                   crypto::Hex(crypto::Sha256(request));
  for (const auto& [sha, size] : files) id += "\n" + crypto::Hex(sha) + " " + std::to_string(size);
  return crypto::Hex(crypto::Sha256(id)) + ".claim.json";
}

Status StatusOfProblem(int http_status, const std::string& body, const std::string& what) {
  std::string slug, detail;
  json j = json::parse(body, nullptr, false);
  if (j.is_object()) {
    slug = j.value("type", "");
    if (slug.rfind("urn:oml:problem:", 0) == 0) slug = slug.substr(16);
    if (j.contains("detail") && j["detail"].is_string()) detail = j["detail"].get<std::string>();
  }
  if (detail.empty()) detail = body.size() > 200 ? body.substr(0, 200) + "..." : body;
  if (detail.empty()) return Status(CodeOfHttp(http_status, slug), "HTTP " + std::to_string(http_status) + " (" + what + ")", slug);
  return Status(CodeOfHttp(http_status, slug), detail + " (HTTP " + std::to_string(http_status) + ", " + what + ")", slug);
}


std::chrono::milliseconds Backoff(int attempt, int retry_after_s) {
  int64_t ms = 500;
  for (int i = 1; i < attempt && ms < 15000; ++i) ms *= 2;
  ms = std::min<int64_t>(ms, 15000);
  return std::chrono::milliseconds(std::max<int64_t>(ms, int64_t{retry_after_s} * 1000));
}

CLI::App* AddClaimSubmit(CLI::App& app, ClaimSubmitOptions* o) {
  auto* claim = app.add_subcommand(
      "claim", "claims through a running server's HTTP API: `claim submit` uploads files (resumable) and submits a "
               "claim attaching them");
  claim->require_subcommand(1);
  auto* s = claim->add_subcommand(
      "submit",
      "upload files to a running server (tus 1.0, resumable: a re-run continues where an interrupted one stopped), "
      "then submit a claim attaching them; prints the 201 answer (claim and receipt) on stdout. The API key comes "
      "from --api-key-file or $OML_API_KEY (else $OML_HOME/dev-writer.token), never from the command line");
  s->add_option("--file", o->files, "a file to attach (repeatable)");
  s->add_option("--workarea", o->workarea_id, "workarea_id of the claim (required unless --upload-only)");
  s->add_option("--path", o->path, "path of the claim in the workarea (required unless --upload-only)");
  auto* body = s->add_option("--body", o->body, "the claim's text body");
  auto* body_file = s->add_option("--body-file", o->body_file, "read the claim's text body from this file");
  body->excludes(body_file);
  s->add_option("--provenance", o->provenance, "human | agent | tool | import (default human)");
  s->add_option("--media-type", o->media_type,
                "content type of every --file (default: guessed from each file's extension, else "
                "application/octet-stream)");
  s->add_option("--body-media-type", o->body_media_type, "media_type of the claim's body (default: the server's)");
  s->add_option("--simulation-id", o->simulation_id, "submit under this simulation");
  s->add_option("--server", o->server, "http://host:port of the server (default: http://<listen> from the config)");
  s->add_option("--api-key-file", o->api_key_file, "file whose first line is the API key (else $OML_API_KEY)");
  s->add_option("--state-dir", o->state_dir,
                "where resumable uploads are remembered (default $OML_HOME/uploads, else $XDG_CACHE_HOME/oml/uploads, "
                "else ~/.cache/oml/uploads)");
  s->add_option("--chunk-size", o->chunk_size, "bytes per PATCH, e.g. 4MiB (default 4 MiB; 64 KiB .. 1 GiB)")
      ->transform(CLI::AsSizeValue(false))
      ->check(CLI::Range(kMinChunk, kMaxChunk));
  s->add_option("--retries", o->retries,
                "failed attempts in a row before giving up: connection errors, 503, busy (default 8; backoff 0.5 s "
                "doubling to 15 s)")
      ->check(CLI::Range(0, 100));
  s->add_option("--timeout", o->timeout_s, "seconds for each connect, send or receive (default 60)")->check(CLI::Range(1, 3600));
  s->add_flag("--upload-only", o->upload_only,
              "upload the files and print them as JSON, without a claim (a later submit of the same files reuses "
              "the completed uploads)");
  // TEST ONLY (tests/test_cli_submit.py): SIGKILL this process after N chunks were taken, to test
  // resumption. Hidden from --help.
  s->add_option("--test-kill-after-chunks", o->test_kill_after_chunks)->group("");
  // TEST ONLY: SIGKILL this process once the claim was answered 201, before anything is printed
  // or forgotten (a lost answer). Hidden from --help.
  s->add_flag("--test-kill-after-claim", o->test_kill_after_claim)->group("");
  return s;
}

int RunClaimSubmit(const Config& cfg, const ClaimSubmitOptions& o) {
  if (!o.upload_only && (o.workarea_id.empty() || o.path.empty()))
    return Fail(InvalidArgument("--workarea and --path are required (unless --upload-only)"));
  if (o.upload_only && o.files.empty()) return Fail(InvalidArgument("--upload-only needs at least one --file"));
  if (!o.upload_only && o.files.empty() && o.body.empty() && o.body_file.empty())
    return Fail(InvalidArgument("nothing to submit: give --file, --body or --body-file"));
  std::optional<std::string> body;
  if (!o.body.empty()) body = o.body;
  if (!o.body_file.empty()) {
    auto b = ReadWholeFile(o.body_file, "body file");
    if (!b.ok()) return Fail(b.status());
    body = std::move(b).value();
  }
  auto server = ParseServerUrl(o.server.empty() ? ServerUrlOfListen(cfg.listen) : o.server);
  if (!server.ok()) return Fail(server.status());
  auto token = LoadToken(cfg, o);
  if (!token.ok()) return Fail(token.status());
  const std::string state_dir = o.state_dir.empty() ? StateDir() : o.state_dir;
  if (auto made = CreatePrivateDirs(state_dir, 0700); !made.ok()) return Fail(made.status());

  HttpClient http(*server, std::chrono::seconds(o.timeout_s));
  Progress progress(isatty(2) == 1);
  Submitter sub(o, &http, *token, &progress, state_dir);
  std::vector<Uploaded> ups;
  if (!o.files.empty()) {
    if (Status s = sub.Discover(); !s.ok()) return Fail(s);
    for (const auto& f : o.files) {
      auto u = sub.Prepare(f);
      if (!u.ok()) return Fail(u.status());
      ups.push_back(std::move(u).value());
    }
  }
  // Prints the 201 body; the claim's state and its uploads' are not needed any more.
  std::string claim_state;
  auto done = [&](const std::string& answer) {
    std::error_code ec;
    for (const auto& u : ups) fs::remove(u.state_file, ec);
    fs::remove(claim_state, ec);
    std::cout << answer;
    if (answer.empty() || answer.back() != '\n') std::cout << "\n";
    std::cout.flush();
    return kExitOk;
  };
  json request = sub.BaseRequest(body);
  if (!o.upload_only) {
    // The same claim asked for by an earlier run whose answer never came: ask again with its
    // Idempotency-Key and upload ids. A committed claim is replayed; one that was not is
    // committed now, or refused (its uploads are gone) and submitted anew below.
    std::vector<std::pair<std::string, uint64_t>> digests;
    for (const auto& u : ups) digests.emplace_back(u.sha256, u.size);
    claim_state = (fs::path(state_dir) / ClaimStateFileName(server->base, *token, request.dump(), digests)).string();
    if (fs::exists(claim_state)) {
      auto text = ReadWholeFile(claim_state, "claim state file");
      json st = text.ok() ? json::parse(*text, nullptr, false) : json();
      if (st.is_object() && st.value("idempotency_key", "").rfind("oml-claim-", 0) == 0 && st.contains("attachments") &&
          st["attachments"].is_array() && st["attachments"].size() == ups.size()) {
        json again = request;
        if (!ups.empty()) again["attachments"] = st["attachments"];
        progress.Note("an earlier run submitted this claim without getting its answer: asking again");
        auto r = sub.PostClaim(again.dump(), st["idempotency_key"].get<std::string>());
        if (r.ok()) return done(*r);
        const Code c = r.status().code();
        if (c == Code::kUnauthenticated || c == Code::kPermissionDenied || c == Code::kUnavailable) return Fail(r.status());
        progress.Note("the earlier claim cannot be asked for again (" + r.status().message() + "): submitting anew");
      }
      std::error_code ec;
      fs::remove(claim_state, ec);
    }
  }
  for (auto& u : ups)
    if (Status s = sub.Transfer(u); !s.ok()) return Fail(s);
  if (o.upload_only) {
    json out = json::array();
    for (const auto& u : ups)
      out.push_back({{"file", u.file}, {"upload_id", u.upload_id}, {"location", u.location}, {"size", u.size},
                     {"sha256", crypto::Hex(u.sha256)}, {"media_type", u.media_type}, {"filename", u.filename}});
    std::cout << json{{"uploads", out}}.dump() << "\n";
    return kExitOk;
  }
  json ids = json::array();
  for (const auto& u : ups) ids.push_back(u.upload_id);
  if (!ups.empty()) request["attachments"] = ids;
  // Remembered before it is sent: if the answer is lost, a re-run asks with the same key (and the
  // same upload ids) and gets this claim's receipt instead of committing a second claim.
  const std::string key = "oml-claim-" + crypto::Hex(crypto::RandomBytes(16));
  if (Status s = WriteSecretFile(claim_state, json{{"idempotency_key", key}, {"attachments", ids}}.dump() + "\n", 0600);
      !s.ok())
    progress.Note("warning: cannot write the claim state file (a re-run after a lost answer submits anew): " + s.message());
  auto r = sub.PostClaim(request.dump(), key);
  if (!r.ok()) {
    // Refused: nothing was committed. Unreachable or 503: it may have been; the state stays.
    if (r.status().code() != Code::kUnavailable) {
      std::error_code ec;
      fs::remove(claim_state, ec);
    }
    return Fail(r.status());
  }
  if (o.test_kill_after_claim) ::raise(SIGKILL);  // TEST ONLY: the answer is "lost"
  return done(*r);
}

}  // namespace oml::cli
