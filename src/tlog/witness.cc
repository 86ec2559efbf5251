#include "tlog/witness.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "merkle/merkle.h"
#include "tlog/checkpoint.h"

namespace oml::tlog {
namespace {

WitnessAnswer Answer(int status, std::string body) {
  WitnessAnswer a;
  a.status = status;
  a.body = std::move(body);
  if (!a.body.empty() && a.body.back() != '\n') a.body += '\n';
  return a;
}

Status Errno(const std::string& what) { return Internal(what + ": " + std::strerror(errno), "witness-state"); }

Status WriteAll(int fd, std::string_view data) {
  while (!data.empty()) {
    const ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return Errno("write");
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
  return Status::Ok();
}

}  // namespace

Result<std::unique_ptr<DirWitnessState>> DirWitnessState::Open(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return Internal("cannot create " + dir + ": " + ec.message(), "witness-state");
  ::chmod(dir.c_str(), 0700);
  const int fd = ::open((dir + "/.lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) return Errno("open " + dir + "/.lock");
  return std::unique_ptr<DirWitnessState>(new DirWitnessState(dir, fd));
}

DirWitnessState::~DirWitnessState() { ::close(lock_fd_); }

Status DirWitnessState::Lock() {
  while (::flock(lock_fd_, LOCK_EX) != 0) {
    if (errno != EINTR) return Errno("flock");
  }
  return Status::Ok();
}

void DirWitnessState::Unlock() { (void)::flock(lock_fd_, LOCK_UN); }

Result<std::optional<WitnessRecord>> DirWitnessState::Get(const std::string& origin) {
  const std::string path = dir_ + "/" + crypto::Hex(crypto::Sha256(origin));
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return std::optional<WitnessRecord>();
    return Errno("open " + path);
  }
  std::string text;
  char buf[8192];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    text.append(buf, static_cast<size_t>(n));
    if (text.size() > kMaxNoteBytes + 1024) break;
  }
  ::close(fd);
  // "<size>\n<base64 root>\n" then the checkpoint note.
  const size_t a = text.find('\n'), b = a == std::string::npos ? a : text.find('\n', a + 1);
  auto size = a == std::string::npos ? std::nullopt : ParseDecimal(std::string_view(text).substr(0, a));
  auto root = b == std::string::npos ? Result<std::string>(InvalidArgument("")) : crypto::FromBase64(text.substr(a + 1, b - a - 1));
  if (!size || !root.ok() || root->size() != 32)
    return Status(Code::kDataLoss, "witness state " + path + " is malformed", "witness-state");
  return std::optional<WitnessRecord>(WitnessRecord{*size, std::move(*root), text.substr(b + 1)});
}

Status DirWitnessState::Put(const std::string& origin, const WitnessRecord& r) {
  const std::string path = dir_ + "/" + crypto::Hex(crypto::Sha256(origin));
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return Errno("open " + tmp);
  Status st = WriteAll(fd, std::to_string(r.size) + "\n" + crypto::Base64(r.root) + "\n" + r.checkpoint);
  if (st.ok() && ::fsync(fd) != 0) st = Errno("fsync " + tmp);
  ::close(fd);
  if (!st.ok()) return st;
  if (::rename(tmp.c_str(), path.c_str()) != 0) return Errno("rename " + tmp);
  const int dfd = ::open(dir_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) return Errno("open " + dir_);
  const int rc = ::fsync(dfd);
  ::close(dfd);
  if (rc != 0) return Errno("fsync " + dir_);
  return Status::Ok();
}

Witness::Witness(std::map<std::string, std::vector<NoteKey>> logs, std::string name, const crypto::SigningKey* key,
                 WitnessState* state, std::map<std::string, std::vector<std::string>> deployments)
    : logs_(std::move(logs)), deployments_(std::move(deployments)), name_(std::move(name)), key_(key), state_(state) {}

std::vector<NoteKey> Witness::KeysOf(const std::string& origin) const {
  if (auto it = logs_.find(origin); it != logs_.end()) return it->second;
  const size_t slash = origin.rfind('/');
  if (slash == std::string::npos || slash + 1 == origin.size() || !IsValidKeyName(origin)) return {};
  auto it = deployments_.find(origin.substr(0, slash));
  if (it == deployments_.end()) return {};
  std::vector<NoteKey> keys;
  for (const auto& pk : it->second) keys.push_back(MakeNoteKey(origin, pk));
  return keys;
}

std::string Witness::VerifierKey() const {
  return EncodeVerifierKey(MakeNoteKey(name_, key_->public_key(), kAlgCosignatureV1));
}

WitnessAnswer Witness::AddCheckpoint(std::string_view body, uint64_t now) {
  // The request: "old N", proof lines, a blank line, the checkpoint.
  const auto line = [&](std::string_view* out) {
    const size_t nl = body.find('\n');
    if (nl == std::string_view::npos) return false;
    *out = body.substr(0, nl);
    body.remove_prefix(nl + 1);
    return true;
  };
  std::string_view l;
  if (!line(&l) || l.substr(0, 4) != "old ") return Answer(400, "the first line must be \"old <size>\"");
  auto old = ParseDecimal(l.substr(4));
  if (!old) return Answer(400, "the old size is not a decimal integer without leading zeros");
  std::vector<std::string> proof;
  for (;;) {
    if (!line(&l)) return Answer(400, "no blank line before the checkpoint");
    if (l.empty()) break;
    if (proof.size() == 63) return Answer(400, "more than 63 consistency proof lines");
    auto h = crypto::FromBase64(l);
    if (!h.ok() || h->size() != 32) return Answer(400, "consistency proof line " + std::to_string(proof.size() + 1) + " is not the base64 of 32 bytes");
    proof.push_back(std::move(*h));
  }
  const std::string note(body);
  const std::string_view text = NoteText(note);
  if (text.empty()) return Answer(400, "the checkpoint is not a signed note");
  auto cp = ParseCheckpoint(text);
  if (!cp.ok()) return Answer(400, cp.status().message());
  if (cp->size == 0 && cp->root != merkle::EmptyRoot()) return Answer(400, "a checkpoint of size 0 has the empty tree's root");
  const std::vector<NoteKey> log_keys = KeysOf(cp->origin);
  if (log_keys.empty()) return Answer(404, "unknown log origin " + cp->origin);
  if (auto opened = OpenNote(note, log_keys); !opened.ok()) return Answer(403, opened.status().message());
  if (*old > cp->size) return Answer(400, "the old size " + std::to_string(*old) + " is above the checkpoint's " + std::to_string(cp->size));

  std::lock_guard<std::mutex> guard(mu_);
  if (Status s = state_->Lock(); !s.ok()) return Answer(500, "the witness state cannot be locked");
  struct Unlock {
    WitnessState* s;
    ~Unlock() { s->Unlock(); }
  } unlock{state_};
  auto rec = state_->Get(cp->origin);
  if (!rec.ok()) return Answer(500, "the witness state cannot be read");
  const uint64_t latest = *rec ? (*rec)->size : 0;
  const auto conflict = [&] {
    WitnessAnswer a = Answer(409, std::to_string(latest));
    a.content_type = "text/x.tlog.size";
    return a;
  };
  if (*old != latest) return conflict();
  if (*old == cp->size) {
    // The same size: the same tree, or a fork.
    if (*rec && (*rec)->root != cp->root) return conflict();
    if (!proof.empty()) return Answer(422, "the consistency proof between equal sizes must be empty");
  } else if (*old == 0) {
    if (!proof.empty()) return Answer(422, "the consistency proof from size 0 must be empty");
  } else if (Status v = merkle::VerifyConsistency(*old, cp->size, proof, (*rec)->root, cp->root); !v.ok()) {
    return Answer(422, v.message());
  }
  auto cosig = CosignatureLine(text, name_, *key_, now);
  if (!cosig.ok()) return Answer(400, cosig.status().message());
  if (Status s = state_->Put(cp->origin, {cp->size, cp->root, note}); !s.ok())
    return Answer(500, "the witness state cannot be written");
  WitnessAnswer a;
  a.body = *cosig;
  return a;
}

}  // namespace oml::tlog
