// xcore-bw: what moving data between two cores costs on this machine, beside the same work
// within one core. The direct all-reduce of ranks on one host is made of these moves: a rank
// reads lines another core has just written (its peers' inputs and reduced slices) and writes
// lines another core has just read (its buffer, which the peers read in the round before), so
// these figures bound what it can reach at sizes that stay in the caches.
//
// usage: xcore-bw [bytes (K/M/G suffix)]...      (default: 128K 512K 2M)
// Two threads, bound to the first two CPUs this process may run on. For each size, repeated:
// the writer fills a buffer; the reader then copies it (cross: lines in the writer's cache),
// fills a buffer of its own and copies that (local). The writer's next fill rewrites lines the
// reader holds (write after peer read). One line per size, averages over the repetitions:
//   xcore-bw: bytes 524288 cpus 0,1 cross 14.31 GB/s local 41.54 GB/s write-after-peer-read 20.52 GB/s
// Exit status 1 where the process has fewer than two CPUs (nothing measured), 2 on bad usage.

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "perf/perf.h"

namespace {

using Clock = std::chrono::steady_clock;

double seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

bool bindTo(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  return pthread_setaffinity_np(pthread_self(), sizeof set, &set) == 0;
}

char* alloc(size_t bytes) {
  auto* p = static_cast<char*>(std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096));
  if (p != nullptr) std::memset(p, 1, bytes);  // every page touched before any timing
  return p;
}

struct Result {
  double cross = 0, local = 0, write = 0;  // seconds over every repetition
};

Result measure(size_t bytes, int reps, int writerCpu, int readerCpu) {
  char* shared = alloc(bytes);
  char* own = alloc(bytes);
  char* dst = alloc(bytes);
  if (shared == nullptr || own == nullptr || dst == nullptr) {
    std::fprintf(stderr, "xcore-bw: cannot allocate 3 x %zu bytes\n", bytes);
    std::exit(1);
  }
  // turn: 2r+1 asks the writer for repetition r's fill, 2r+2 says it is done. Both threads
  // spin: each has a CPU of its own.
  std::atomic<int> turn{0};
  Result res;
  std::thread writer([&] {
    bindTo(writerCpu);
    for (int r = 0; r <= reps; ++r) {
      while (turn.load(std::memory_order_acquire) != 2 * r + 1) {
      }
      const Clock::time_point t0 = Clock::now();
      std::memset(shared, r & 0x7f, bytes);
      if (r > 0) res.write += seconds(t0, Clock::now());  // the first fill finds no reader
      turn.store(2 * r + 2, std::memory_order_release);
    }
  });
  bindTo(readerCpu);
  for (int r = 0; r <= reps; ++r) {
    turn.store(2 * r + 1, std::memory_order_release);
    while (turn.load(std::memory_order_acquire) != 2 * r + 2) {
    }
    const Clock::time_point t0 = Clock::now();
    std::memcpy(dst, shared, bytes);
    const Clock::time_point t1 = Clock::now();
    std::memset(own, r & 0x7f, bytes);
    const Clock::time_point t2 = Clock::now();
    std::memcpy(dst, own, bytes);
    const Clock::time_point t3 = Clock::now();
    if (r > 0) {  // repetition 0 warms up
      res.cross += seconds(t0, t1);
      res.local += seconds(t2, t3);
    }
  }
  writer.join();
  std::free(shared);
  std::free(own);
  std::free(dst);
  return res;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<size_t> sizes;
  for (int i = 1; i < argc; ++i) {
    size_t b = 0;
    if (!perf::ParseSize(argv[i], &b) || b == 0) {
      std::fprintf(stderr, "usage: xcore-bw [bytes (K/M/G suffix)]...\n");
      return 2;
    }
    sizes.push_back(b);
  }
  if (sizes.empty()) sizes = {size_t{128} << 10, size_t{512} << 10, size_t{2} << 20};

  cpu_set_t allowed;
  std::vector<int> cpus;
  if (sched_getaffinity(0, sizeof allowed, &allowed) == 0)
    for (int c = 0; c < CPU_SETSIZE && cpus.size() < 2; ++c)
      if (CPU_ISSET(c, &allowed)) cpus.push_back(c);
  if (cpus.size() < 2) {
    std::fprintf(stderr, "xcore-bw: this process may run on fewer than 2 CPUs; nothing measured\n");
    return 1;
  }
  for (size_t bytes : sizes) {
    // About 1 GiB read by each timed copy in all, at least 20 repetitions.
    const int reps = static_cast<int>(std::max<size_t>(20, (size_t{1} << 30) / bytes));
    const Result r = measure(bytes, reps, cpus[0], cpus[1]);
    const double total = static_cast<double>(bytes) * reps / 1e9;
    std::printf("xcore-bw: bytes %zu cpus %d,%d cross %.2f GB/s local %.2f GB/s "
                "write-after-peer-read %.2f GB/s\n",
                bytes, cpus[0], cpus[1], total / r.cross, total / r.local, total / r.write);
  }
  return 0;
}
