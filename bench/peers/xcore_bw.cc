// xcore-bw: what moving data between two cores costs on this machine, beside the same work
// within one core. The direct all-reduce of ranks on one host is made of these moves: a rank
// reads lines another core has just written (its peers' inputs and reduced slices) and writes
// lines another core has just read (its buffer, which the peers read in the round before), so
// these figures bound what it can reach at sizes that stay in the caches. The same lines read
// through the kernel (process_vm_readv, the single copy Open MPI's shared memory uses for large
// messages, "CMA") show what that peer pays for each byte it moves between ranks.
//
// usage: xcore-bw [bytes (K/M/G suffix)]...      (default: 128K 512K 2M)
// Two threads, bound to the first two CPUs this process may run on. For each size, repeated:
// the writer fills a buffer and the reader copies it (cross: lines in the writer's cache); the
// writer fills it again and the reader copies it with process_vm_readv (cma); the reader fills
// a buffer of its own and copies that (local). Each fill after the first rewrites lines the
// reader holds (write after peer read). One line per size, averages over the repetitions:
//   xcore-bw: bytes 524288 cpus 0,1 cross 14.31 GB/s local 41.54 GB/s write-after-peer-read 20.52
//   GB/s cma 10.43 GB/s
// "cma n/a" where the kernel refuses process_vm_readv (ENOSYS, EPERM).
// Exit status 1 where the process has fewer than two CPUs (nothing measured), 2 on bad usage.

#include <pthread.h>
#include <sched.h>
#include <sys/uio.h>
#include <unistd.h>

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
  double cross = 0, local = 0, write = 0, cma = 0;  // seconds over every repetition
  bool cmaFailed = false;
};

// bytes from src to dst through the kernel, as a peer process's single copy would read them.
bool cmaCopy(char* dst, const char* src, size_t bytes) {
  iovec local{dst, bytes};
  iovec remote{const_cast<char*>(src), bytes};
  return process_vm_readv(getpid(), &local, 1, &remote, 1, 0) == static_cast<ssize_t>(bytes);
}

Result measure(size_t bytes, int reps, int writerCpu, int readerCpu) {
  char* shared = alloc(bytes);
  char* own = alloc(bytes);
  char* dst = alloc(bytes);
  if (shared == nullptr || own == nullptr || dst == nullptr) {
    std::fprintf(stderr, "xcore-bw: cannot allocate 3 x %zu bytes\n", bytes);
    std::exit(1);
  }
  // turn: 2f+1 asks the writer for fill f, 2f+2 says it is done; repetition r takes fills 2r
  // (read with memcpy) and 2r+1 (read with process_vm_readv). Both threads spin: each has a
  // CPU of its own.
  std::atomic<int> turn{0};
  Result res;
  const int fills = 2 * (reps + 1);
  std::thread writer([&] {
    bindTo(writerCpu);
    for (int f = 0; f < fills; ++f) {
      while (turn.load(std::memory_order_acquire) != 2 * f + 1) {
      }
      const Clock::time_point t0 = Clock::now();
      std::memset(shared, f & 0x7f, bytes);
      if (f >= 2) res.write += seconds(t0, Clock::now());  // repetition 0 warms up
      turn.store(2 * f + 2, std::memory_order_release);
    }
  });
  bindTo(readerCpu);
  auto fill = [&](int f) {
    turn.store(2 * f + 1, std::memory_order_release);
    while (turn.load(std::memory_order_acquire) != 2 * f + 2) {
    }
  };
  for (int r = 0; r <= reps; ++r) {
    fill(2 * r);
    const Clock::time_point t0 = Clock::now();
    std::memcpy(dst, shared, bytes);
    const Clock::time_point t1 = Clock::now();
    fill(2 * r + 1);
    const Clock::time_point t2 = Clock::now();
    if (!res.cmaFailed && !cmaCopy(dst, shared, bytes)) res.cmaFailed = true;
    const Clock::time_point t3 = Clock::now();
    std::memset(own, r & 0x7f, bytes);
    const Clock::time_point t4 = Clock::now();
    std::memcpy(dst, own, bytes);
    const Clock::time_point t5 = Clock::now();
    if (r > 0) {  // repetition 0 warms up
      res.cross += seconds(t0, t1);
      res.cma += seconds(t2, t3);
      res.local += seconds(t4, t5);
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
    // Two fills a repetition: the writer's rate is over twice the bytes.
    std::printf(
        "xcore-bw: bytes %zu cpus %d,%d cross %.2f GB/s local %.2f GB/s "
        "write-after-peer-read %.2f GB/s ",
        bytes, cpus[0], cpus[1], total / r.cross, total / r.local, 2 * total / r.write);
    if (r.cmaFailed)
      std::printf("cma n/a\n");
    else
      std::printf("cma %.2f GB/s\n", total / r.cma);
  }
  return 0;
}
