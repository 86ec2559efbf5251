#include "common/periodic.h"

#include <algorithm>

namespace oml {

PeriodicThread::PeriodicThread(std::chrono::milliseconds interval, std::function<void()> tick, bool run_at_start)
    : PeriodicThread(
          interval,
          std::function<std::chrono::milliseconds()>([t = std::move(tick), interval] {
            t();
            return interval;
          }),
          run_at_start) {}

PeriodicThread::PeriodicThread(std::chrono::milliseconds interval, std::function<std::chrono::milliseconds()> tick,
                               bool run_at_start)
    : interval_(interval), tick_(std::move(tick)), run_at_start_(run_at_start), thread_([this] { Run(); }) {}

PeriodicThread::~PeriodicThread() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void PeriodicThread::Run() {
  std::unique_lock<std::mutex> l(mu_);
  bool due = run_at_start_;
  std::chrono::milliseconds wait = interval_;
  while (!stop_) {
    if (due) {
      l.unlock();
      wait = std::max(interval_, tick_());
      l.lock();
    }
    due = !cv_.wait_for(l, wait, [this] { return stop_; });
  }
}

}  // namespace oml
