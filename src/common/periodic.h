// PeriodicThread: one background thread that calls a function every `interval` until the object
// is destroyed. The upkeep loops of `oml serve` (upload sweep, staging sweep) share it.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>

namespace oml {

class PeriodicThread {
 public:
  // Calls `tick` every `interval` (first right away when `run_at_start`, else after one
  // interval), on its own thread, never two at once. `tick` must not throw.
  PeriodicThread(std::chrono::milliseconds interval, std::function<void()> tick, bool run_at_start);
  // The same, with a tick that returns how long to wait after it (at least `interval`): a loop
  // that spaces its rounds by what they cost (e.g. at most a share of the time busy).
  PeriodicThread(std::chrono::milliseconds interval, std::function<std::chrono::milliseconds()> tick,
                 bool run_at_start);
  // Wakes the thread and joins it: waits for a tick in progress to return.
  ~PeriodicThread();
  PeriodicThread(const PeriodicThread&) = delete;
  PeriodicThread& operator=(const PeriodicThread&) = delete;

 private:
  void Run();
  const std::chrono::milliseconds interval_;
  const std::function<std::chrono::milliseconds()> tick_;
  const bool run_at_start_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;  // GUARDED_BY(mu_)
  std::thread thread_;  // last: started once the members above exist
};

}  // namespace oml
