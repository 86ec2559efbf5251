// Test-only helpers for forcing an interleaving with a named sync point (common/sync_point.h).
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>

#include "common/sync_point.h"

namespace oml::testing {

// Spins until pred() holds. After 30 s the test fails and the binary aborts: threads the test
// started would otherwise block forever.
template <typename Pred>
void WaitUntil(Pred pred, const char* what) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!pred()) {
    if (std::chrono::steady_clock::now() > deadline) {
      ADD_FAILURE() << "interleaving not reached within 30 s: " << what;
      std::abort();
    }
    std::this_thread::yield();
  }
}

// Holds the first thread that reaches sync point `name` there until Release(); every later
// pass goes straight through. The destructor releases and clears the point.
class HoldFirst {
 public:
  explicit HoldFirst(std::string name) : name_(std::move(name)) {
    SyncPoints::Set(name_, [this] {
      if (calls_++ == 0) {
        std::unique_lock<std::mutex> l(mu_);
        cv_.wait(l, [this] { return released_; });
      }
      return Status::Ok();
    });
  }
  ~HoldFirst() {
    Release();
    SyncPoints::Clear(name_);
  }
  HoldFirst(const HoldFirst&) = delete;
  HoldFirst& operator=(const HoldFirst&) = delete;

  // Blocks until a thread is held at the point.
  void WaitUntilHeld() { WaitUntil([this] { return calls_.load() > 0; }, name_.c_str()); }
  void Release() {
    {
      std::lock_guard<std::mutex> l(mu_);
      released_ = true;
    }
    cv_.notify_all();
  }

 private:
  const std::string name_;
  std::atomic<int> calls_{0};
  std::mutex mu_;
  std::condition_variable cv_;
  bool released_ = false;  // GUARDED_BY(mu_)
};

}  // namespace oml::testing
