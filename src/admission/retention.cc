#include "admission/retention.h"

#include <string>
#include <utility>
#include <vector>

#include "common/log.h"

namespace oml::admission {

RejectedRetention::RejectedRetention(db::Pool* pool, Claims* claims, std::chrono::seconds retention)
    : pool_(pool), claims_(claims), retention_(retention) {}

RejectedRetention::~RejectedRetention() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

Result<int64_t> RejectedRetention::SweepOnce() {
  std::vector<std::pair<std::string, std::string>> due;
  {
    OML_ASSIGN_OR_RETURN(db::Pool::Handle conn, pool_->Acquire());
    OML_ASSIGN_OR_RETURN(db::Rows r, conn->Query("SELECT tenant_id::text, artifact_id::text FROM "
                                                 "oml.rejected_retention_due(make_interval(secs => $1))",
                                                 {db::Int(retention_.count())}));
    for (int i = 0; i < r.size(); ++i) due.emplace_back(r.Get(i, 0), r.Get(i, 1));
  }
  int64_t erased = 0;
  for (const auto& [tenant, artifact] : due) {
    const Caller system{tenant, kRetentionPrincipal, "admin", "system", ""};
    auto meta = claims_->Erase(system, artifact,
                               "retention: rejected, kept " + std::to_string(retention_.count()) + " s");
    if (!meta.ok()) {
      if (meta.status().code() == Code::kGone) continue;  // erased meanwhile
      return meta.status();
    }
    ++erased;
    log::Info("rejected claim removed at the end of its retention",
              {{"tenant", tenant}, {"artifact_id", artifact}, {"erased_seq", meta->second.seq}});
  }
  return erased;
}

void RejectedRetention::Start(std::chrono::milliseconds interval) {
  thread_ = std::thread([this, interval] {
    std::unique_lock<std::mutex> l(mu_);
    while (!stop_) {
      l.unlock();
      auto n = SweepOnce();
      if (!n.ok()) log::Warn("rejected-claim retention pass failed", {{"error", n.status().ToString()}});
      l.lock();
      cv_.wait_for(l, interval, [this] { return stop_; });
    }
  });
}

}  // namespace oml::admission
