// Low-level waiting: futex on a 32-bit word in (possibly shared) memory,
// a CPU pause for spin loops, and a monotonic clock.
#pragma once

#include <atomic>
#include <cstdint>

namespace loom {

// Sleeps while *word == expected, up to timeoutUs. Works across processes
// when the word lives in shared memory. Returns early on wake or signal.
void futexWait(std::atomic<uint32_t>* word, uint32_t expected, int64_t timeoutUs);
void futexWakeAll(std::atomic<uint32_t>* word);

void futexWakeOne(std::atomic<uint32_t>* word);

// A mutex whose uncontended lock and unlock are one atomic instruction each, inline, with no
// call (the operation lock every call takes; docs/PERFORMANCE.md's per-call account). Its word:
// 0 free, 1 held, 2 held with a thread asleep on the word's futex (or about to be), which the
// unlock then wakes. Lockable: std::lock_guard and std::unique_lock take it.
class FutexMutex {
 public:
  FutexMutex() = default;
  FutexMutex(const FutexMutex&) = delete;
  FutexMutex& operator=(const FutexMutex&) = delete;
  void lock() {
    uint32_t c = 0;
    if (!word_.compare_exchange_strong(c, 1, std::memory_order_acquire, std::memory_order_relaxed))
      lockContended(c);
  }
  bool try_lock() {
    uint32_t c = 0;
    return word_.compare_exchange_strong(c, 1, std::memory_order_acquire,
                                         std::memory_order_relaxed);
  }
  void unlock() {
    if (word_.exchange(0, std::memory_order_release) == 2) futexWakeOne(&word_);
  }

 private:
  void lockContended(uint32_t seen);
  std::atomic<uint32_t> word_{0};
};

// What a wait for another party's verdict adds to its own timeout, so that the verdict (which
// names the rank that party waited for) comes first: a tenth, 0.5-5 s. A wait for an
// operation (loomCommWaitTicket with -1), and a rank's wait for the rendezvous root's reply.
inline int64_t waitGraceMs(int64_t timeoutMs) {
  return timeoutMs / 10 < 500 ? 500 : timeoutMs / 10 > 5000 ? 5000 : timeoutMs / 10;
}

inline void cpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

// Asks for the cache line at p in a state this core may write without first invalidating other
// cores' copies (PREFETCHW on x86, which CPUs without it run as a no-op), so that a later store
// there, and a peer's read of it, do not wait for that invalidation. A hint: no fault, no effect
// on what any core reads.
inline void prefetchForWrite(const void* p) {
#if defined(__x86_64__) || defined(__i386__)
  asm volatile("prefetchw %0" : : "m"(*static_cast<const char*>(p)));
#else
  __builtin_prefetch(p, 1, 3);
#endif
}

// CLOCK_MONOTONIC in nanoseconds. Where the CPU's time-stamp counter is invariant (x86, CPUID
// 0x80000007 EDX bit 8) it is read through that counter, without serialising the pipeline:
// on virtual machines each clock_gettime call costs more and slows shared-memory round trips
// (docs/journal/perf.md). Each thread maps ticks to CLOCK_MONOTONIC from pairs of readings of
// both, taken again every few milliseconds (the rate from pairs half a second to a second
// apart, so that it follows NTP's slewing), so that readings stay within tens of nanoseconds
// of clock_gettime's, in every thread and process of the machine; they never go back within
// a thread.
int64_t nowNs();
// clock_gettime(CLOCK_MONOTONIC) itself.
int64_t monotonicNs();
// Whether nowNs() reads the time-stamp counter here.
bool nowNsUsesTsc();
inline int64_t nowUs() { return nowNs() / 1000; }

}  // namespace loom
