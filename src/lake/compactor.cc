#include "lake/compactor.h"

#include <algorithm>
#include <chrono>

#include "common/log.h"
#include "common/metrics.h"
#include "common/sync_point.h"

namespace oml::lake {
namespace {

using Clock = std::chrono::steady_clock;

bool IsConflict(const Status& s) { return s.code() == Code::kAborted && s.type() == "lake-commit-conflict"; }
bool IsStaleRewrite(const Status& s) { return s.code() == Code::kAborted && s.type() == "lake-rewrite-stale"; }

}  // namespace

Compactor::Compactor(Options o) : opts_(std::move(o)), thread_([this] { Loop(); }) {}

Compactor::~Compactor() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
    queue_.clear();
  }
  cv_.notify_all();
  thread_.join();
}

void Compactor::Request(const std::string& table) {
  {
    std::lock_guard<std::mutex> l(mu_);
    ++stats_.requests;
    if (stop_ || std::find(queue_.begin(), queue_.end(), table) != queue_.end()) return;
    queue_.push_back(table);
  }
  cv_.notify_one();
}

void Compactor::Drain() {
  std::unique_lock<std::mutex> l(mu_);
  idle_cv_.wait(l, [&] { return stop_ || (queue_.empty() && !running_); });
}

Compactor::Stats Compactor::stats() const {
  std::lock_guard<std::mutex> l(mu_);
  return stats_;
}

void Compactor::Loop() {
  std::unique_lock<std::mutex> l(mu_);
  for (;;) {
    cv_.wait(l, [&] { return stop_ || !queue_.empty(); });
    if (stop_) break;
    std::string table = std::move(queue_.front());
    queue_.pop_front();
    running_ = true;
    l.unlock();
    CompactOne(table);
    l.lock();
    running_ = false;
    if (queue_.empty()) idle_cv_.notify_all();
  }
  running_ = false;
  idle_cv_.notify_all();
}

void Compactor::CompactOne(const std::string& name) {
  const auto t0 = Clock::now();
  const uint64_t small_target = std::min(opts_.small_target_bytes, opts_.target_bytes);
  bool large = false;
  uint64_t target = small_target;
  Status last = Status::Ok();
  for (int attempt = 1; attempt <= kMaxAttempts; ++attempt) {
    {
      std::lock_guard<std::mutex> l(mu_);
      if (stop_) return;
    }
    last = OML_SYNC_POINT(("lakewriter.compaction.before." + name).c_str());
    if (!last.ok()) break;
    auto it = tables_.find(name);
    if (it == tables_.end()) {
      auto t = DeltaTable::Open(TableUri(opts_.lake_root, name));
      if (!t.ok()) {
        last = t.status();
        break;
      }
      it = tables_.emplace(name, std::move(*t)).first;
    }
    // A fresh snapshot each attempt: the writer has committed since the last one.
    auto refreshed = it->second.Refresh();
    if (!refreshed.ok()) {
      last = refreshed.status();
      tables_.erase(it);  // reopened next time
      break;
    }
    // The tier comes from the snapshot, not from this process's history: a writer restarted
    // every few minutes would otherwise never reach its large_every-th run, and the small
    // tier's outputs would pile up (bench/soak: one file per batch after 30 minutes of
    // restarts). Large when at least large_every files lie between the two targets.
    auto files = it->second.SnapshotFiles();
    if (!files.ok()) {
      last = files.status();
      break;
    }
    const auto between = std::count_if(files->begin(), files->end(), [&](const DataFile& f) {
      return static_cast<uint64_t>(f.size) >= small_target && static_cast<uint64_t>(f.size) < opts_.target_bytes;
    });
    large = between >= std::max(1, opts_.large_every);
    target = large ? opts_.target_bytes : small_target;
    last = OML_SYNC_POINT(("lakewriter.compaction.after_snapshot." + name).c_str());
    if (!last.ok()) break;
    if (opts_.lease_check) {
      if (Status lease = opts_.lease_check(); !lease.ok()) {
        {
          std::lock_guard<std::mutex> l(mu_);
          ++stats_.no_lease;
        }
        Metrics::Get().LakeCompaction(name, "no-lease", std::chrono::duration<double>(Clock::now() - t0).count());
        log::Warn("lake writer: compaction dropped, this process does not hold the lease",
                  {{"stream", opts_.stream}, {"table", name}, {"error", lease.ToString()}});
        return;
      }
    }
    const auto a0 = Clock::now();
    auto done = it->second.Optimize(target);
    if (done.ok()) {
      if (large) {
        std::lock_guard<std::mutex> l(mu_);
        ++stats_.large_runs;
      }
      const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
      Metrics::Get().LakeCompaction(name, done->first > 0 ? "compacted" : "nothing", secs);
      {
        std::lock_guard<std::mutex> l(mu_);
        if (done->first > 0) ++stats_.compactions;
        stats_.files_removed += done->first;
        stats_.files_added += done->second;
      }
      log::Info("lake writer: table compacted",
                {{"stream", opts_.stream}, {"table", name}, {"files_removed", done->first},
                 {"files_added", done->second}, {"attempt", attempt}, {"snapshot_version", *refreshed},
                 {"target_bytes", target}, {"tier", large ? "large" : "small"},
                 {"ms", secs * 1000.0}});
      return;
    }
    last = done.status();
    if (IsStaleRewrite(last)) {
      // Another rewrite (an operator's OPTIMIZE, say) removed files this one read: landing would
      // have kept both copies of their rows. Nothing committed; again on a fresh snapshot.
      {
        std::lock_guard<std::mutex> l(mu_);
        ++stats_.refused;
      }
      Metrics::Get().LakeCompaction(name, "refused", std::chrono::duration<double>(Clock::now() - a0).count());
      log::Warn("lake writer: compaction refused, a newer commit rewrote files it read; trying again",
                {{"stream", opts_.stream}, {"table", name}, {"attempt", attempt},
                 {"snapshot_version", *refreshed}, {"error", last.ToString()}});
      continue;
    }
    // Lost to a commit that removed a file this OPTIMIZE rewrote (a MERGE): again, on a newer
    // snapshot. Anything else is not retried here; the writer's next request tries again.
    if (!IsConflict(last)) break;
  }
  Metrics::Get().LakeCompaction(name, "failed", std::chrono::duration<double>(Clock::now() - t0).count());
  {
    std::lock_guard<std::mutex> l(mu_);
    ++stats_.failures;
  }
  log::Warn("lake writer: compaction failed; the next request tries again",
            {{"stream", opts_.stream}, {"table", name}, {"error", last.ToString()}});
}

}  // namespace oml::lake
