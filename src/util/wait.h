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

inline void cpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

int64_t nowNs();  // CLOCK_MONOTONIC
inline int64_t nowUs() { return nowNs() / 1000; }

}  // namespace loom
