// loom-trace-overhead: what recording costs an all-reduce, measured so that a noisy machine
// can still show it.
//
// Pairs of ranks run side by side: some with the flight recorder off (LOOM_FLIGHT_RECORDER=0),
// as many with it on (the default, 2000 records). The parent makes them take turns: in each
// repetition a recording-off pair runs a short timed batch of all-reduces while every other
// pair sleeps in read(), then a recording pair does (the order flips every repetition). A drift
// in the machine's load therefore hits both modes alike. Each rank times every operation of a
// batch and answers with the median (an operation that lost the CPU to another process does
// not move it); the batch's time is the slower rank's. Each repetition gives one paired
// difference (on minus off, from batches milliseconds apart). Reported per size: the median
// of each mode's batch times, the median paired difference with a 95 % bootstrap confidence
// interval, and a verdict against the target: PASS when the whole interval is under it, FAIL
// when the whole interval is over it, UNSURE otherwise.
//
//   loom-trace-overhead [-t shm|tcp] [-r REPS] [-b BYTES[,BYTES...]] [-p PAIRS] [-n RECORDS]
//                       [-a]
//
// -n: LOOM_FLIGHT_RECORDER of the recording pairs (default 2000; 1 keeps the one record in
// the cache, which shows how much of the cost is the ring's memory).
// -p: pairs per mode (default 4), each repetition's two batches on the next pair of each mode,
// so that what sets one pair apart from another averages out.
// -a (a calibration): every pair runs with recording off, so the "cost" shows what the method
// reports for two pairs that differ in nothing but their processes and buffers.
//
// Targets: under 0.5 us per operation up to 4 KiB, under 2 % above. Each batch runs one
// untimed all-reduce first (both ranks wake and meet), then ITERS timed ones: 100 at 8 B, 10 at
// 1 MiB by default (scaled by size). Exit status: 0 when every run worked (whatever the
// verdicts), 1 when a Loom call failed, 2 on bad usage.
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "loom/loom.h"

namespace {

double nowUs() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) * 1e6 + static_cast<double>(ts.tv_nsec) * 1e-3;
}

// One batch: `bytes` per all-reduce (fp32 elements), `iters` timed; bytes 0 ends the rank.
struct Command {
  uint64_t bytes;
  uint64_t iters;
};

// Moves all n bytes through the pipe fd (read, or write when `out`); false on end or error.
bool moveAll(int fd, char* p, size_t n, bool out) {
  while (n > 0) {
    const ssize_t k = out ? write(fd, p, n) : read(fd, p, n);
    if (k <= 0) return false;
    p += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}
template <typename T>
bool readAll(int fd, T* v) {
  return moveAll(fd, reinterpret_cast<char*>(v), sizeof(T), false);
}
template <typename T>
bool writeAll(int fd, const T& v) {
  return moveAll(fd, const_cast<char*>(reinterpret_cast<const char*>(&v)), sizeof(T), true);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? 0 : n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// A rank: joins its pair's communicator, then runs batches as commanded; answers each with
// the batch's median time per operation in us (negative on failure).
int rankMain(int rank, const loomUniqueId& id, int cmdFd, int resultFd) {
  loomComm_t comm = nullptr;
  if (loomCommInitRank(&comm, 2, id, rank) != loomSuccess) {
    std::fprintf(stderr, "rank %d: init: %s\n", rank, loomGetLastError(nullptr));
    return 1;
  }
  std::vector<float> in, out;
  std::vector<double> times;
  Command c{};
  int code = 0;
  while (readAll(cmdFd, &c) && c.bytes > 0) {
    const size_t count = std::max<size_t>(1, c.bytes / sizeof(float));
    in.assign(count, 1.0f);
    out.assign(count, 0.0f);
    double perOp = -1;
    bool ok = loomAllReduce(in.data(), out.data(), count, loomFloat32, loomSum, comm, nullptr) ==
              loomSuccess;
    times.clear();
    for (uint64_t i = 0; ok && i < c.iters; ++i) {
      const double t0 = nowUs();
      ok = loomAllReduce(in.data(), out.data(), count, loomFloat32, loomSum, comm, nullptr) ==
           loomSuccess;
      times.push_back(nowUs() - t0);
    }
    // The batch's median operation: an operation that lost the CPU to another process does
    // not move it.
    if (ok && out[count - 1] == 2.0f) perOp = median(times);
    if (!ok) std::fprintf(stderr, "rank %d: all-reduce: %s\n", rank, loomGetLastError(comm));
    if (perOp < 0) code = 1;
    if (!writeAll(resultFd, perOp)) break;
  }
  loomCommDestroy(comm);
  return code;
}

struct Pair {
  pid_t leader = -1;
  int cmd[2] = {-1, -1};  // the parent's write ends, per rank
  int result = -1;        // the parent's read end (both ranks answer into it)
};

// The parent's ends of every pair's pipes: a pair started later closes them, so that each
// rank sees end-of-file when the parent goes.
std::vector<int> gParentFds;

// Starts a pair whose ranks see LOOM_FLIGHT_RECORDER=recorder. The leader (rank 0) sets the
// environment before its first Loom call, makes the id and forks rank 1.
bool startPair(const char* recorder, bool tcp, Pair* p) {
  int c0[2], c1[2], res[2];
  if (pipe(c0) != 0 || pipe(c1) != 0 || pipe(res) != 0) return false;
  const pid_t leader = fork();
  if (leader < 0) return false;
  if (leader == 0) {
    close(c0[1]);
    close(c1[1]);
    close(res[0]);
    for (int fd : gParentFds) close(fd);
    setenv("LOOM_FLIGHT_RECORDER", recorder, 1);
    setenv("LOOM_SOCKET_IFNAME", "lo", 0);
    if (tcp) setenv("LOOM_SHM_DISABLE", "1", 1);
    loomUniqueId id;
    if (loomGetUniqueId(&id) != loomSuccess) {
      std::fprintf(stderr, "loomGetUniqueId: %s\n", loomGetLastError(nullptr));
      _exit(1);
    }
    std::fflush(nullptr);
    const pid_t other = fork();
    if (other == 0) {
      close(c0[0]);
      _exit(rankMain(1, id, c1[0], res[1]));
    }
    close(c1[0]);
    int code = rankMain(0, id, c0[0], res[1]);
    int status = 0;
    if (other > 0 &&
        (waitpid(other, &status, 0) != other || !WIFEXITED(status) || WEXITSTATUS(status) != 0))
      code = 1;
    std::fflush(nullptr);
    _exit(code);
  }
  close(c0[0]);
  close(c1[0]);
  close(res[1]);
  p->leader = leader;
  p->cmd[0] = c0[1];
  p->cmd[1] = c1[1];
  p->result = res[0];
  gParentFds.insert(gParentFds.end(), {c0[1], c1[1], res[0]});
  return true;
}

// One batch on a pair: rank 0's time per operation (us), or a negative number on failure.
double runBatch(const Pair& p, uint64_t bytes, uint64_t iters) {
  const Command c{bytes, iters};
  if (!writeAll(p.cmd[0], c) || !writeAll(p.cmd[1], c)) return -1;
  double a = -1, b = -1;
  if (!readAll(p.result, &a) || !readAll(p.result, &b)) return -1;
  // Both ranks answered (so both are idle again); the slower rank's time is the operation's.
  return a < 0 || b < 0 ? -1 : std::max(a, b);
}

// 95 % percentile-bootstrap interval of the median of `v` (fixed seed: reproducible output).
void bootstrapMedian(const std::vector<double>& v, double* lo, double* hi) {
  constexpr int kResamples = 4000;
  std::mt19937_64 rng(12345);
  std::uniform_int_distribution<size_t> pick(0, v.size() - 1);
  std::vector<double> meds(kResamples), s(v.size());
  for (int i = 0; i < kResamples; ++i) {
    for (double& x : s) x = v[pick(rng)];
    meds[static_cast<size_t>(i)] = median(s);
  }
  std::sort(meds.begin(), meds.end());
  *lo = meds[kResamples * 25 / 1000];
  *hi = meds[kResamples * 975 / 1000 - 1];
}

const char* verdict(double lo, double hi, double target) {
  return hi < target ? "PASS" : lo > target ? "FAIL" : "UNSURE";
}

// optarg as a whole number in [lo, hi], else a message naming the option.
bool parseLong(const char* what, long lo, long hi, long* out) {
  char* end = nullptr;
  const long v = std::strtol(optarg, &end, 10);
  if (end == optarg || *end != '\0' || v < lo || v > hi) {
    std::fprintf(stderr, "%s must be %ld..%ld, got '%s'\n", what, lo, hi, optarg);
    return false;
  }
  *out = v;
  return true;
}

int usage(const char* prog) {
  std::fprintf(stderr,
               "usage: %s [-t shm|tcp] [-r REPS (400)] [-b BYTES[,BYTES...]] [-p PAIRS (4)] "
               "[-n RECORDS (2000)] [-a]\n",
               prog);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  bool tcp = false, calibrate = false;
  std::string records = "2000";
  long reps = 400, pairs = 4;
  std::vector<uint64_t> sizes = {8, 1 << 20};
  int opt;
  while ((opt = getopt(argc, argv, "t:r:b:p:n:a")) != -1) {
    if (opt == 't' && (std::strcmp(optarg, "shm") == 0 || std::strcmp(optarg, "tcp") == 0)) {
      tcp = std::strcmp(optarg, "tcp") == 0;
    } else if (opt == 'p') {
      if (!parseLong("-p: pairs per mode", 1, 16, &pairs)) return 2;
    } else if (opt == 'n') {
      long n = 0;
      if (!parseLong("-n: records", 1, 1000000, &n)) return 2;
      records = optarg;
    } else if (opt == 'a') {
      calibrate = true;
    } else if (opt == 'r') {
      if (!parseLong("-r: repetitions", 10, 100000, &reps)) return 2;
    } else if (opt == 'b') {
      sizes.clear();
      for (char* s = optarg; *s != '\0';) {
        char* end = nullptr;
        const unsigned long long b = std::strtoull(s, &end, 10);
        if (end == s || b < 4 || b > (1ull << 30) || (*end != ',' && *end != '\0')) {
          std::fprintf(stderr, "-b: sizes must be 4..1073741824 bytes, comma-separated\n");
          return 2;
        }
        sizes.push_back(b);
        s = *end == ',' ? end + 1 : end;
      }
    } else {
      return usage(argv[0]);
    }
  }
  if (optind != argc) return usage(argv[0]);
  signal(SIGPIPE, SIG_IGN);

  // Several pairs per mode, used in turn, so that what sets one pair apart from another (its
  // processes' placement, its buffers, its sockets) averages out instead of passing for cost.
  std::vector<Pair> off(static_cast<size_t>(pairs)), on(static_cast<size_t>(pairs));
  for (long i = 0; i < pairs; ++i)
    if (!startPair("0", tcp, &off[static_cast<size_t>(i)]) ||
        !startPair(calibrate ? "0" : records.c_str(), tcp, &on[static_cast<size_t>(i)])) {
      std::perror("starting the ranks");
      return 1;
    }
  double load[3] = {0, 0, 0};
  if (getloadavg(load, 3) < 0) load[0] = -1;
  std::printf(
      "# loom-trace-overhead: 2 ranks over %s, recorder off (LOOM_FLIGHT_RECORDER=0) "
      "and %s in alternating batches, %ld repetitions over %ld pairs per mode; %ld CPUs, "
      "load %.1f\n",
      tcp ? "TCP" : "shared memory",
      calibrate ? "off again (calibration: 'on' pairs with recording off too)"
                : ("on (" + records + " records)").c_str(),
      reps, pairs, sysconf(_SC_NPROCESSORS_ONLN), load[0]);
  int code = 0;
  for (const uint64_t bytes : sizes) {
    // About the same time per batch at every size: 100 operations at 8 B, 10 at 1 MiB.
    const uint64_t iters = bytes <= 4096 ? 100 : std::max<uint64_t>(2, (10u << 20) / bytes);
    std::vector<double> offT, onT, diff, rel;
    for (size_t i = 0; i < off.size(); ++i) {  // first touches, connections, caches
      runBatch(off[i], bytes, iters);
      runBatch(on[i], bytes, iters);
    }
    for (long r = 0; r < reps && code == 0; ++r) {
      const bool onFirst = r % 2 == 1;
      const size_t k = static_cast<size_t>((r / 2) % pairs);
      const double a = runBatch(onFirst ? on[k] : off[k], bytes, iters);
      const double b = runBatch(onFirst ? off[k] : on[k], bytes, iters);
      const double tOff = onFirst ? b : a, tOn = onFirst ? a : b;
      if (tOff <= 0 || tOn <= 0) {
        std::fprintf(stderr, "a batch failed (%llu B)\n", static_cast<unsigned long long>(bytes));
        code = 1;
        break;
      }
      offT.push_back(tOff);
      onT.push_back(tOn);
      diff.push_back(tOn - tOff);
      rel.push_back((tOn / tOff - 1) * 100);
    }
    if (code != 0) break;
    const bool small = bytes <= 4096;
    const std::vector<double>& d = small ? diff : rel;
    double lo, hi;
    bootstrapMedian(d, &lo, &hi);
    const double target = small ? 0.5 : 2.0;
    const char* unit = small ? "us" : "%";
    std::printf(
        "RESULT %-3s %9llu B  off %9.2f us  on %9.2f us  (medians of %zu batches of %llu)"
        "  cost %+.3f %s, 95%% CI [%+.3f, %+.3f] %s  target < %.1f %s: %s\n",
        tcp ? "tcp" : "shm", static_cast<unsigned long long>(bytes), median(offT), median(onT),
        offT.size(), static_cast<unsigned long long>(iters), median(d), unit, lo, hi, unit, target,
        unit, verdict(lo, hi, target));
    std::fflush(stdout);
  }
  std::vector<Pair*> all;
  for (size_t i = 0; i < off.size(); ++i) all.insert(all.end(), {&off[i], &on[i]});
  for (Pair* p : all) {
    const Command quit{0, 0};
    writeAll(p->cmd[0], quit);
    writeAll(p->cmd[1], quit);
    int status = 0;
    if (waitpid(p->leader, &status, 0) != p->leader || !WIFEXITED(status) ||
        WEXITSTATUS(status) != 0)
      code = 1;
  }
  return code;
}
