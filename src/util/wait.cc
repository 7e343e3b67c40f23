#include "util/wait.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cmath>

#if defined(__x86_64__)
#include <cpuid.h>
#include <x86intrin.h>
#endif

namespace loom {

void futexWait(std::atomic<uint32_t>* word, uint32_t expected, int64_t timeoutUs) {
  if (timeoutUs <= 0) return;
  timespec ts;
  ts.tv_sec = timeoutUs / 1000000;
  ts.tv_nsec = (timeoutUs % 1000000) * 1000;
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void futexWakeAll(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

void futexWakeOne(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, 1, nullptr, nullptr, 0);
}

void FutexMutex::lockContended(uint32_t seen) {
  // A short spin first: the holder of an operation lock is often about to leave it.
  for (int i = 0; i < 100; ++i) {
    cpuRelax();
    seen = 0;
    if (word_.compare_exchange_weak(seen, 1, std::memory_order_acquire, std::memory_order_relaxed))
      return;
    if (seen == 2) break;
  }
  // Mark the word contended, then sleep while it stays so; whoever takes it from 0 here marks it
  // 2 too (a waiter may still sleep), so an unlock never misses a sleeper.
  if (seen != 2) seen = word_.exchange(2, std::memory_order_acquire);
  while (seen != 0) {
    futexWait(&word_, 2, 100000);  // woken by unlock(); the timeout only bounds a lost wake-up
    seen = word_.exchange(2, std::memory_order_acquire);
  }
}

int64_t monotonicNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

#if defined(__x86_64__)

namespace {

bool invariantTsc() {
  unsigned a, b, c, d;
  if (__get_cpuid(0x80000000u, &a, &b, &c, &d) == 0 || a < 0x80000007u) return false;
  __get_cpuid(0x80000007u, &a, &b, &c, &d);
  return (d & (1u << 8)) != 0;
}

// Cleared for good if the counter ever disagrees with CLOCK_MONOTONIC by more than a
// millisecond at a re-anchoring (a counter that stops, jumps or differs between CPUs).
std::atomic<bool> gUseTsc{invariantTsc()};

struct Anchor {
  uint64_t tick = 0;
  int64_t ns = 0;
};

// One thread's mapping: ns = base.ns + (tick - base.tick) * nsPerTick, re-anchored at nextTick.
struct TscClock {
  Anchor ref, mid, base;  // rate from ref (0.5-1 s back) to now; base: the latest pair
  double nsPerTick = 0;   // 0 until two pairs are a millisecond apart (clock_gettime then)
  uint64_t nextTick = 0;
  int64_t last = 0;  // the last reading handed out
};
thread_local TscClock tClock;

// A pair of readings taken together: the counter's midpoint around clock_gettime, from the
// tightest of a few tries (a try that the scheduler interrupted is far from tight).
Anchor readPair() {
  Anchor best;
  uint64_t bestSpan = ~uint64_t{0};
  for (int i = 0; i < 3; ++i) {
    const uint64_t a = __rdtsc();
    const int64_t ns = monotonicNs();
    const uint64_t b = __rdtsc();
    if (b - a < bestSpan) {
      bestSpan = b - a;
      best = Anchor{a + (b - a) / 2, ns};
    }
  }
  return best;
}

int64_t handOut(TscClock& c, int64_t v) {
  if (v < c.last) v = c.last;
  c.last = v;
  return v;
}

int64_t reanchor(TscClock& c) {
  const Anchor now = readPair();
  if (c.ref.tick == 0 || now.tick <= c.ref.tick) {
    c = TscClock{now, now, now, 0, now.tick + (uint64_t{1} << 21), c.last};
    return handOut(c, now.ns);
  }
  if (c.nsPerTick > 0) {
    const double predicted =
        static_cast<double>(c.base.ns) + static_cast<double>(now.tick - c.base.tick) * c.nsPerTick;
    if (std::abs(predicted - static_cast<double>(now.ns)) > 1e6) gUseTsc.store(false);
  }
  const double rate =
      static_cast<double>(now.ns - c.ref.ns) / static_cast<double>(now.tick - c.ref.tick);
  if (now.ns - c.ref.ns >= 1000000) {
    if (rate < 0.01 || rate > 100) gUseTsc.store(false);  // not a clock of 10 MHz to 100 GHz
    c.nsPerTick = rate;
  }
  if (now.ns - c.mid.ns >= 500000000) {
    c.ref = c.mid;
    c.mid = now;
  }
  c.base = now;
  // Again after 1/32 of the rate's baseline (its error then adds under a nanosecond), at
  // least every 2^24 ticks (8 ms at 2 GHz).
  const uint64_t span = (now.tick - c.ref.tick) / 32;
  c.nextTick = now.tick + std::min(std::max(span, uint64_t{1} << 18), uint64_t{1} << 24);
  return handOut(c, now.ns);
}

}  // namespace

int64_t nowNs() {
  if (!gUseTsc.load(std::memory_order_relaxed)) return monotonicNs();
  // The thread-local's address once (from a shared library each look-up is a call into the
  // dynamic linker, which the compiler would otherwise repeat on the last line).
  TscClock* cp = &tClock;
  asm("" : "+r"(cp));
  TscClock& c = *cp;
  const uint64_t t = __rdtsc();
  if (c.ref.tick == 0 || t >= c.nextTick || t < c.base.tick) return reanchor(c);
  if (c.nsPerTick == 0) return handOut(c, monotonicNs());  // the thread's first millisecond
  return handOut(
      c, c.base.ns + static_cast<int64_t>(static_cast<double>(t - c.base.tick) * c.nsPerTick));
}

bool nowNsUsesTsc() { return gUseTsc.load(std::memory_order_relaxed); }

#else

int64_t nowNs() { return monotonicNs(); }
bool nowNsUsesTsc() { return false; }

#endif

}  // namespace loom
