#include "common/sync_point.h"

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
Status SyncPoints::Process(const char* name) {
  static const char* env = std::getenv("OML_FAULT");
  if (env != nullptr && std::string(env) == name) {
    return Status(Code::kInternal, std::string("injected fault at ") + name, "injected-fault");
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
