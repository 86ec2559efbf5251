// A fixed set of threads that run queued tasks in FIFO order, for CPU-bound work that many
// producers feed (`oml verify`: chain walkers fetch pages and queue their row checks here, so
// every core stays busy even when one chain holds most of the events).
//
// Tasks are grouped: Add() puts a task in a Group, and Group::Wait() returns once every task
// added to it so far has finished. An exception thrown by a task is kept, and Wait() rethrows
// the first one (the group's other tasks still run). Tasks must not wait on other groups
// (nothing here steals work, so a task waiting on the pool could wait forever). Thread-safe.
#pragma once

#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace oml {

class WorkPool {
 public:
  // Starts `threads` threads (at least one).
  explicit WorkPool(int threads);
  // Joins the threads once the queue is empty. Every Group must be gone (or waited on) first.
  ~WorkPool();
  WorkPool(const WorkPool&) = delete;
  WorkPool& operator=(const WorkPool&) = delete;

  class Group {
   public:
    explicit Group(WorkPool& pool) : pool_(pool) {}
    ~Group();  // waits: a group's tasks may reference the caller's stack
    Group(const Group&) = delete;
    Group& operator=(const Group&) = delete;
    // Queues fn on the pool as part of this group.
    void Add(std::function<void()> fn);
    // Blocks until every task added so far has run; then rethrows the first exception a task
    // threw, if any (once).
    void Wait();

   private:
    friend class WorkPool;
    WorkPool& pool_;
    int pending_ = 0;              // GUARDED_BY(pool_.mu_)
    std::exception_ptr error_;     // GUARDED_BY(pool_.mu_)
  };

 private:
  void Run();
  std::mutex mu_;
  std::condition_variable work_cv_;  // a task was queued, or stopping
  std::condition_variable done_cv_;  // some group's pending count reached zero
  std::deque<std::pair<Group*, std::function<void()>>> queue_;  // GUARDED_BY(mu_)
  bool stopping_ = false;                                       // GUARDED_BY(mu_)
  std::vector<std::thread> threads_;
};

}  // namespace oml
