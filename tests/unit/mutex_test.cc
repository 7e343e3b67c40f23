// FutexMutex (util/wait.h), the operation lock: mutual exclusion when more threads than cores
// contend for it (so holders are preempted and waiters sleep on the futex), try_lock, and a
// sleeping waiter woken by the unlock.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

#include "util/wait.h"

namespace loom {
namespace {

TEST(FutexMutex, ExcludesWhenThreadsOutnumberCores) {
  FutexMutex m;
  constexpr int kThreads = 6, kRounds = 100000;
  // A plain counter and a running-holders count: a lost exclusion shows in either.
  long long counter = 0;
  int holders = 0, overlaps = 0;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&] {
      for (int i = 0; i < kRounds; ++i) {
        std::lock_guard<FutexMutex> lock(m);
        if (++holders != 1) ++overlaps;
        counter += 1;
        if (i % 1000 == 0) std::this_thread::yield();  // a holder descheduled: waiters sleep
        --holders;
      }
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(counter, static_cast<long long>(kThreads) * kRounds);
  EXPECT_EQ(overlaps, 0);
}

TEST(FutexMutex, TryLockFailsWhileHeldAndSucceedsAfter) {
  FutexMutex m;
  ASSERT_TRUE(m.try_lock());
  bool other = true;
  std::thread([&] { other = m.try_lock(); }).join();
  EXPECT_FALSE(other);
  m.unlock();
  std::thread([&] {
    other = m.try_lock();
    if (other) m.unlock();
  }).join();
  EXPECT_TRUE(other);
}

TEST(FutexMutex, AWaiterTakesTheLockOnceItIsReleased) {
  FutexMutex m;
  m.lock();
  std::atomic<int> stage{0};
  std::thread waiter([&] {
    stage = 1;
    m.lock();  // sleeps: the main thread holds it
    stage = 2;
    m.unlock();
  });
  while (stage.load() != 1) std::this_thread::yield();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // let it reach the futex
  EXPECT_EQ(stage.load(), 1);
  m.unlock();
  waiter.join();
  EXPECT_EQ(stage.load(), 2);
  EXPECT_TRUE(m.try_lock());  // left free
  m.unlock();
}

}  // namespace
}  // namespace loom
