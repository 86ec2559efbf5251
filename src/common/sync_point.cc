#include "common/sync_point.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>

namespace oml {
namespace {
std::mutex g_mu;
std::map<std::string, SyncPoints::Callback>& Table() {
  static auto* t = new std::map<std::string, SyncPoints::Callback>();
  return *t;
}
}  // namespace

void SyncPoints::Set(const std::string& name, Callback cb) {
  std::lock_guard<std::mutex> l(g_mu);
  Table()[name] = std::move(cb);
}
void SyncPoints::Clear(const std::string& name) {
  std::lock_guard<std::mutex> l(g_mu);
  Table().erase(name);
}
void SyncPoints::ClearAll() {
  std::lock_guard<std::mutex> l(g_mu);
  Table().clear();
}
namespace {
// OML_FAULT, parsed once: the armed point and what reaching it does.
struct EnvFault {
  enum class Action { kNone, kFail, kKill, kStop };
  std::string point;
  Action action = Action::kNone;
  mutable std::atomic<bool> fired{false};  // :kill and :stop act the first time only
};

const EnvFault& ArmedFromEnv() {
  static const EnvFault* f = [] {
    auto* out = new EnvFault();
    const char* env = std::getenv("OML_FAULT");
    if (env == nullptr || *env == '\0') return out;
    std::string v(env);
    out->point = v;
    out->action = EnvFault::Action::kFail;
    if (auto colon = v.rfind(':'); colon != std::string::npos) {
      const std::string action = v.substr(colon + 1);
      if (action == "kill" || action == "stop") {
        out->point = v.substr(0, colon);
        out->action = action == "kill" ? EnvFault::Action::kKill : EnvFault::Action::kStop;
      }
    }
    return out;
  }();
  return *f;
}

}  // namespace

Status SyncPoints::Process(const char* name) {
  const EnvFault& f = ArmedFromEnv();
  if (f.action != EnvFault::Action::kNone && f.point == name) {
    switch (f.action) {
      case EnvFault::Action::kFail:
        return Status(Code::kInternal, std::string("injected fault at ") + name, "injected-fault");
      case EnvFault::Action::kKill:
        if (!f.fired.exchange(true)) {
          std::fprintf(stderr, "OML_FAULT: SIGKILL at %s\n", name);
          std::fflush(stderr);
          ::kill(::getpid(), SIGKILL);
        }
        break;
      case EnvFault::Action::kStop:
        if (!f.fired.exchange(true)) {
          std::fprintf(stderr, "OML_FAULT: SIGSTOP at %s\n", name);
          std::fflush(stderr);
          // To this thread (raise: tgkill), which then stops before it runs another instruction
          // past the point; the stop then takes every thread. kill(getpid()) let the kernel hand
          // the signal to another thread while this one ran on (into the next commit, say).
          ::raise(SIGSTOP);
        }
        break;
      case EnvFault::Action::kNone:
        break;
    }
  }
  Callback cb;
  {
    std::lock_guard<std::mutex> l(g_mu);
    auto it = Table().find(name);
    if (it == Table().end()) return Status::Ok();
    cb = it->second;
  }
  return cb();
}

}  // namespace oml
