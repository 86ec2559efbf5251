#include "common/periodic.h"

#include <gtest/gtest.h>

#include <atomic>

namespace oml {
namespace {

TEST(PeriodicThreadTest, RunsAtStartWhenAskedThenEveryIntervalAndStopsOnDestruction) {
  std::atomic<int> ticks{0};
  {
    PeriodicThread p(std::chrono::hours(1), [&] { ++ticks; }, /*run_at_start=*/true);
    for (int i = 0; i < 500 && ticks.load() == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    EXPECT_EQ(ticks.load(), 1);
  }  // destroyed long before the hour: joins at once
  EXPECT_EQ(ticks.load(), 1);
  std::atomic<int> later{0};
  {
    PeriodicThread p(std::chrono::milliseconds(20), [&] { ++later; }, /*run_at_start=*/false);
    for (int i = 0; i < 1000 && later.load() < 3; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    EXPECT_GE(later.load(), 3);
  }
  const int seen = later.load();
  std::this_thread::sleep_for(std::chrono::milliseconds(60));
  EXPECT_EQ(later.load(), seen);  // no tick after destruction
}

TEST(PeriodicThreadTest, WithoutRunAtStartNothingRunsBeforeTheFirstInterval) {
  std::atomic<int> ticks{0};
  {
    PeriodicThread p(std::chrono::hours(1), [&] { ++ticks; }, /*run_at_start=*/false);
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
  }
  EXPECT_EQ(ticks.load(), 0);
}

}  // namespace
}  // namespace oml
