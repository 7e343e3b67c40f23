// memcpy-bw: one core's memcpy bandwidth, the yardstick compare.sh sets Loom's busbw against.
//
// usage: memcpy-bw [bytes (K/M/G suffix), default 64M] [repetitions, default 20]
// Copies `bytes` between two pre-faulted buffers, `repetitions` times after one warm-up copy, on
// the calling thread, and prints the bytes copied per second (each byte counted once, as a
// collective's algbw counts it), best and median:
//   memcpy-bw: bytes 67108864 reps 20 best 9.81 GB/s median 9.52 GB/s

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "perf/perf.h"

int main(int argc, char** argv) {
  size_t bytes = size_t{64} << 20;
  int reps = 20;
  if (argc > 1 && !perf::ParseSize(argv[1], &bytes)) bytes = 0;
  if (argc > 2) reps = std::atoi(argv[2]);
  if (bytes == 0 || reps <= 0 || argc > 3) {
    std::fprintf(stderr, "usage: memcpy-bw [bytes] [repetitions]\n");
    return 2;
  }
  char* src = static_cast<char*>(std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096));
  char* dst = static_cast<char*>(std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096));
  if (src == nullptr || dst == nullptr) {
    std::fprintf(stderr, "memcpy-bw: cannot allocate 2 x %zu bytes\n", bytes);
    return 1;
  }
  std::memset(src, 1, bytes);
  std::memset(dst, 2, bytes);
  std::memcpy(dst, src, bytes);  // warm-up
  std::vector<double> gbs;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    std::memcpy(dst, src, bytes);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    // Keeps the copy from being optimised away.
    src[(i * 4099) % bytes] = dst[(i * 7919) % bytes] + 1;
    gbs.push_back(static_cast<double>(bytes) / s / 1e9);
  }
  std::sort(gbs.begin(), gbs.end());
  std::printf("memcpy-bw: bytes %zu reps %d best %.2f GB/s median %.2f GB/s\n", bytes, reps,
              gbs.back(), gbs[gbs.size() / 2]);
  std::free(src);
  std::free(dst);
  return 0;
}
