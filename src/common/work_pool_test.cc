#include "common/work_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>
#include <future>
#include <vector>

namespace oml {
namespace {

TEST(WorkPoolTest, EveryTaskRunsOnceBeforeWaitReturns) {
  WorkPool pool(3);
  std::vector<std::atomic<int>> runs(1000);
  WorkPool::Group g(pool);
  for (int i = 0; i < 1000; ++i) g.Add([&runs, i] { ++runs[i]; });
  g.Wait();
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(runs[i].load(), 1) << i;
  g.Wait();  // nothing pending: returns at once
}

TEST(WorkPoolTest, OneThreadRunsTasksInTheOrderAdded) {
  WorkPool pool(1);
  std::vector<int> order;  // only the pool thread writes it
  WorkPool::Group g(pool);
  for (int i = 0; i < 100; ++i) g.Add([&order, i] { order.push_back(i); });
  g.Wait();
  ASSERT_EQ(order.size(), 100u);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(order[i], i);
}

TEST(WorkPoolTest, AGroupWaitsOnlyForItsOwnTasks) {
  WorkPool pool(2);
  std::promise<void> release;
  std::shared_future<void> gate = release.get_future().share();
  std::atomic<bool> a_done{false};
  WorkPool::Group a(pool);
  a.Add([gate, &a_done] {
    gate.wait();  // holds one pool thread until released below
    a_done = true;
  });
  WorkPool::Group b(pool);
  std::atomic<int> b_runs{0};
  for (int i = 0; i < 10; ++i) b.Add([&b_runs] { ++b_runs; });
  b.Wait();  // the other thread runs b's tasks while a's task is blocked
  EXPECT_EQ(b_runs.load(), 10);
  EXPECT_FALSE(a_done.load());
  release.set_value();
  a.Wait();
  EXPECT_TRUE(a_done.load());
}

TEST(WorkPoolTest, WaitRethrowsTheFirstExceptionAfterEveryTaskRan) {
  WorkPool pool(1);  // one thread: tasks run in order, so "first" is task 3
  std::atomic<int> runs{0};
  WorkPool::Group g(pool);
  for (int i = 0; i < 10; ++i) {
    g.Add([&runs, i] {
      ++runs;
      if (i == 3 || i == 7) throw std::runtime_error("task " + std::to_string(i));
    });
  }
  try {
    g.Wait();
    FAIL() << "Wait() did not rethrow";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "task 3");
  }
  EXPECT_EQ(runs.load(), 10);
  g.Wait();  // rethrown once; nothing pending
  g.Add([&runs] { ++runs; });
  g.Wait();
  EXPECT_EQ(runs.load(), 11);
}

TEST(WorkPoolTest, DestroyingAGroupWaitsForItsTasks) {
  WorkPool pool(1);
  std::atomic<int> runs{0};
  for (int round = 1; round <= 3; ++round) {
    {
      WorkPool::Group g(pool);
      for (int i = 0; i < 5; ++i) {
        g.Add([&runs] {
          std::this_thread::sleep_for(std::chrono::milliseconds(10));  // still running when g goes
          ++runs;
        });
      }
    }  // the destructor waits: the tasks reference this frame
    EXPECT_EQ(runs.load(), 5 * round);
  }
}

}  // namespace
}  // namespace oml
