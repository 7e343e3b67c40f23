// nowNs(): read through the time-stamp counter where it is invariant, it must agree with
// clock_gettime(CLOCK_MONOTONIC) (read on either side of it), in every thread and across the
// re-anchorings of its first seconds, and never go back within a thread.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>

#include "util/wait.h"

namespace loom {
namespace {

// Beyond what the mapping allows (tens of nanoseconds), short of what a wrong rate or anchor
// would give over a second (milliseconds).
constexpr int64_t kToleranceNs = 2000;

struct Checked {
  int64_t samples = 0, outside = 0, backwards = 0, worstNs = 0;
};

// For `seconds`, a burst of readings every millisecond: each bracketed by CLOCK_MONOTONIC.
Checked checkFor(double seconds) {
  Checked c;
  int64_t last = nowNs();
  const int64_t end = monotonicNs() + static_cast<int64_t>(seconds * 1e9);
  while (monotonicNs() < end) {
    for (int i = 0; i < 200; ++i) {
      const int64_t before = monotonicNs();
      const int64_t v = nowNs();
      const int64_t after = monotonicNs();
      ++c.samples;
      const int64_t off = v < before ? before - v : v > after ? v - after : 0;
      c.worstNs = std::max(c.worstNs, off);
      c.outside += off > kToleranceNs;
      c.backwards += v < last;
      last = v;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return c;
}

void expectGood(const Checked& c, const char* who) {
  EXPECT_GT(c.samples, 1000) << who;
  EXPECT_EQ(c.outside, 0) << who << ": " << c.outside << " of " << c.samples << " readings beyond "
                          << kToleranceNs << " ns; worst " << c.worstNs;
  EXPECT_EQ(c.backwards, 0) << who;
}

TEST(Clock, AgreesWithClockMonotonicInEveryThreadAndNeverGoesBack) {
  std::printf("nowNs reads the time-stamp counter: %s\n", nowNsUsesTsc() ? "yes" : "no");
  Checked other;
  std::thread t([&] { other = checkFor(1.3); });  // past the rate's half-second rotation
  const Checked mine = checkFor(1.3);
  t.join();
  expectGood(mine, "main thread");
  expectGood(other, "second thread");
  std::printf("worst distance from CLOCK_MONOTONIC: %lld and %lld ns\n",
              static_cast<long long>(mine.worstNs), static_cast<long long>(other.worstNs));
}

// A forked child keeps its parent's mapping and the clock stays the machine's.
TEST(Clock, AgreesInAForkedChild) {
  (void)nowNs();
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    const Checked c = checkFor(0.2);
    _exit(c.samples > 100 && c.outside == 0 && c.backwards == 0 ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

}  // namespace
}  // namespace loom
