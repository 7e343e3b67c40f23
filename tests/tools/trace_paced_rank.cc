// One rank of the straggler test across network namespaces (tests/netns/straggler.sh),
// started with LOOM_RANK, LOOM_WORLD_SIZE and LOOM_COMM_ID (loomCommInitFromEnv).
//
//   loom_trace_paced_rank OPS PERIOD_MS COUNT START_NS
//
// The callers are on time by construction: every rank enters all-reduce k (k = 0 .. OPS-1) of
// COUNT floats at START_NS + k * PERIOD_MS on CLOCK_REALTIME, which the network namespaces of
// one machine share (the script picks START_NS a few seconds ahead, past the set-up; a rank
// that is not ready by then fails). No collective is spent agreeing on the start, so every
// recorded operation is a paced one. Whatever lateness the flight recorders then show comes
// from the library (LOOM_INJECT_DELAY) or from the link, not from the program. Each result is
// checked against its closed form. The recorder is dumped into LOOM_TRACE_DIR when the communicator
// is destroyed. Prints "PASS rank R" and how many operations overran their period (an overrun makes
// the next entry late, which the test must know about).
#include <time.h>

#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "loom/loom.h"

namespace {

int64_t nowNs() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

void sleepUntil(int64_t ns) {
  timespec ts{};
  ts.tv_sec = ns / 1000000000;
  ts.tv_nsec = ns % 1000000000;
  while (clock_nanosleep(CLOCK_REALTIME, TIMER_ABSTIME, &ts, nullptr) == EINTR) {
  }
}

long argOf(const char* text, const char* name, long lo, long hi) {
  char* end = nullptr;
  const long v = std::strtol(text, &end, 10);
  if (end == text || *end != '\0' || v < lo || v > hi) {
    fprintf(stderr, "%s must be an integer in [%ld, %ld], got \"%s\"\n", name, lo, hi, text);
    std::exit(2);
  }
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 5) {
    fprintf(stderr, "usage: %s OPS PERIOD_MS COUNT START_NS\n", argv[0]);
    return 2;
  }
  const int ops = static_cast<int>(argOf(argv[1], "OPS", 1, 100000));
  const int64_t periodNs = argOf(argv[2], "PERIOD_MS", 1, 60000) * 1000000;
  const size_t count = static_cast<size_t>(argOf(argv[3], "COUNT", 1, 1 << 26));
  const int64_t t0 = argOf(argv[4], "START_NS (CLOCK_REALTIME, ns)", 1, LONG_MAX);

  loomComm_t comm = nullptr;
  if (loomCommInitFromEnv(&comm, nullptr) != loomSuccess) {
    fprintf(stderr, "init: %s\n", loomGetLastError(nullptr));
    return 3;
  }
  int rank = 0, nranks = 0;
  loomCommUserRank(comm, &rank);
  loomCommCount(comm, &nranks);

  if (nowNs() > t0) {
    fprintf(stderr, "rank %d: set-up ended %.3f s after START_NS; start later\n", rank,
            static_cast<double>(nowNs() - t0) * 1e-9);
    loomCommDestroy(comm);
    return 4;
  }

  // Rank r contributes (r + 1) * (i + 1 + k % 7) at element i of operation k, so the sum is
  // n (n + 1) / 2 * (i + 1 + k % 7): exact in fp32 for the sizes used here.
  std::vector<float> in(count), out(count);
  const double ranksSum = nranks * (nranks + 1) / 2.0;
  int overruns = 0, code = 0;
  for (int k = 0; k < ops && code == 0; ++k) {
    for (size_t i = 0; i < count; ++i)
      in[i] = static_cast<float>((rank + 1) * static_cast<double>(i % 1024 + 1 + k % 7));
    sleepUntil(t0 + k * periodNs);
    if (loomAllReduce(in.data(), out.data(), count, loomFloat32, loomSum, comm, nullptr) !=
        loomSuccess) {
      fprintf(stderr, "rank %d: all-reduce %d: %s\n", rank, k, loomGetLastError(comm));
      code = 5;
      break;
    }
    if (nowNs() > t0 + (k + 1) * periodNs) ++overruns;
    for (size_t i = 0; i < count; ++i) {
      const double want = ranksSum * static_cast<double>(i % 1024 + 1 + k % 7);
      if (std::fabs(out[i] - want) > 0) {
        fprintf(stderr, "rank %d: all-reduce %d: element %zu is %g, expected %g\n", rank, k, i,
                static_cast<double>(out[i]), want);
        code = 6;
        break;
      }
    }
  }
  printf("rank %d: %d operations, %d overran their %lld ms period\n", rank, ops, overruns,
         static_cast<long long>(periodNs / 1000000));
  if (loomCommDestroy(comm) != loomSuccess && code == 0) code = 7;
  if (code == 0) printf("PASS rank %d\n", rank);
  return code;
}
