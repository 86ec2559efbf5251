#include "db/test_cluster.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>

#include "db/local_cluster.h"
#include "db/migrate.h"

namespace oml::db::testing {
namespace {

struct Holder {
  std::unique_ptr<LocalCluster> cluster;
  std::string dir;
  ~Holder() {
    if (cluster) (void)cluster->Stop();
    std::filesystem::remove_all(dir);
  }
};

// Function-local static: destroyed (cluster stopped, directory removed) at normal exit.
Holder& Get() {
  static Holder h;
  static bool started = [] {
    h.dir = "/tmp/oml-ctest-" + std::to_string(::getpid());
    h.cluster = std::make_unique<LocalCluster>(h.dir + "/pg");
    Status s = h.cluster->Start();
    if (s.ok()) {
      auto admin = Conn::Connect(h.cluster->SuperuserUrl());
      s = admin.ok() ? Migrate(*admin, {}).status() : admin.status();
    }
    if (!s.ok()) {
      std::fprintf(stderr, "test cluster: %s\n", s.ToString().c_str());
      std::abort();
    }
    return true;
  }();
  (void)started;
  return h;
}

}  // namespace

const std::string& SuperuserUrl() {
  static const std::string url = Get().cluster->SuperuserUrl();
  return url;
}
const std::string& AppUrl() {
  static const std::string url = Get().cluster->AppUrl();
  return url;
}
const std::string& LakewriterUrl() {
  static const std::string url = Get().cluster->LakewriterUrl();
  return url;
}
const std::string& ReconcilerUrl() {
  static const std::string url = Get().cluster->ReconcilerUrl();
  return url;
}

}  // namespace oml::db::testing
