#include "common/work_pool.h"

#include <algorithm>
#include <utility>

namespace oml {

WorkPool::WorkPool(int threads) {
  for (int i = 0; i < std::max(1, threads); ++i) threads_.emplace_back([this] { Run(); });
}

WorkPool::~WorkPool() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stopping_ = true;
  }
  work_cv_.notify_all();
  for (auto& t : threads_) t.join();
}

void WorkPool::Run() {
  std::unique_lock<std::mutex> l(mu_);
  for (;;) {
    work_cv_.wait(l, [this] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping, and nothing left to run
    auto [group, fn] = std::move(queue_.front());
    queue_.pop_front();
    l.unlock();
    std::exception_ptr error;
    try {
      fn();
    } catch (...) {
      error = std::current_exception();
    }
    fn = nullptr;  // destroy captures outside the lock
    l.lock();
    if (error && !group->error_) group->error_ = error;
    if (--group->pending_ == 0) done_cv_.notify_all();
  }
}

void WorkPool::Group::Add(std::function<void()> fn) {
  {
    std::lock_guard<std::mutex> l(pool_.mu_);
    ++pending_;
    pool_.queue_.emplace_back(this, std::move(fn));
  }
  pool_.work_cv_.notify_one();
}

void WorkPool::Group::Wait() {
  std::unique_lock<std::mutex> l(pool_.mu_);
  pool_.done_cv_.wait(l, [this] { return pending_ == 0; });
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
}

WorkPool::Group::~Group() {
  std::unique_lock<std::mutex> l(pool_.mu_);
  pool_.done_cv_.wait(l, [this] { return pending_ == 0; });  // never throws from a destructor
}

}  // namespace oml
