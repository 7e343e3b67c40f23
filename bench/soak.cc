// loom-soak: a long run of random collectives, every result checked, resources watched.
//
//   loom-soak [-np 8] [-n 100000] [-s seed] [-m max_bytes] [-c comms] [-A algos] [-e every]
//             [-b rss_bound_kib] [-T timeout_s]
//
// Forks -np ranks on this host (as loom-perf does). Every rank draws the same sequence of
// operations from the seed: the collective (all-reduce, broadcast, reduce, all-gather,
// reduce-scatter, all-to-all, send/recv ring, barrier), the type, the reduction, the root,
// in place or not, and the size, 0 B to -m (16 MiB) skewed towards small sizes (1% empty, 89%
// up to 64 KiB, 9.5% up to 1 MiB, 0.5% above), where the size is the larger buffer as
// nccl-tests counts it. Each rank fills its input from a hash of (operation, rank, element) and
// checks every element it receives against a reference computed here from all ranks' inputs:
// integers wrap, so any random bits reduce exactly in any order; floating-point inputs are
// integers small enough that every partial result is exact in the type.
//
// Every -e operations (10,000) each rank samples its resident memory (/proc/self/statm) and its
// open descriptors (/proc/self/fd); the first sample is the warm-up level, and a later one that
// exceeds it by more than -b KiB (8192), or any change in descriptors, fails the run.
//
// -c K: split K communicators from the world (colour by rank parity or all ranks, key
// reversed for every other one) and run the operations on them in turn; afterwards destroy
// them and check that no shared-memory segment of theirs remains in /dev/shm and that the
// descriptors and threads are back to what they were before the splits. -c lowers
// LOOM_SLOT_BYTES to 64 KiB and LOOM_DIRECT_BYTES to 256 KiB unless they are set.
//
// -A a,b,...: phases with LOOM_ALGO set to each entry in turn (LOOM_ALGO is read once per
// process, so each phase forks fresh ranks); "auto" leaves the tuner free. -n is per phase.
//
// Exit status: 0 when every check passed, 1 otherwise, 2 on bad usage.
#include <dirent.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cinttypes>
#include <climits>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "loom/loom.h"
#include "perf/perf.h"
#include "util/net.h"

namespace {

constexpr char kProg[] = "loom-soak";
constexpr int kMaxRanks = 64;
constexpr int kMaxSamples = 256;

struct Args {
  int np = 8;
  long ops = 100000;
  uint64_t seed = 1;
  size_t maxBytes = size_t{16} << 20;
  int comms = 0;
  std::vector<std::string> algos{"auto"};
  long every = 10000;
  long rssBoundKiB = 8192;
  int timeoutS = 3600;
};

[[noreturn]] void usage(const std::string& why) {
  fprintf(stderr,
          "%s: %s\nusage: %s [-np ranks] [-n ops] [-s seed] [-m max_bytes] [-c comms] "
          "[-A algo,algo] [-e sample_every] [-b rss_bound_kib] [-T timeout_s]\n",
          kProg, why.c_str(), kProg);
  exit(2);
}

long parseLong(const char* flag, const char* text, long lo, long hi) {
  char* end = nullptr;
  errno = 0;
  const long v = strtol(text, &end, 10);
  if (errno != 0 || end == text || *end != '\0' || v < lo || v > hi)
    usage(std::string(flag) + ": '" + text + "' is not an integer in [" + std::to_string(lo) +
          ", " + std::to_string(hi) + "]");
  return v;
}

Args parseArgs(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string f = argv[i];
    if (i + 1 >= argc) usage(f + ": needs a value");
    const char* v = argv[++i];
    if (f == "-np")
      a.np = static_cast<int>(parseLong("-np", v, 1, kMaxRanks));
    else if (f == "-n")
      a.ops = parseLong("-n", v, 1, 1000000000);
    else if (f == "-s")
      a.seed = static_cast<uint64_t>(parseLong("-s", v, 0, LONG_MAX));
    else if (f == "-m")
      a.maxBytes = static_cast<size_t>(parseLong("-m", v, 64, 1L << 30));
    else if (f == "-c")
      a.comms = static_cast<int>(parseLong("-c", v, 0, 1024));
    else if (f == "-e")
      a.every = parseLong("-e", v, 1, 1000000000);
    else if (f == "-b")
      a.rssBoundKiB = parseLong("-b", v, 0, 1L << 30);
    else if (f == "-T")
      a.timeoutS = static_cast<int>(parseLong("-T", v, 1, 1 << 30));
    else if (f == "-A") {
      a.algos.clear();
      std::stringstream in(v);
      for (std::string s; std::getline(in, s, ',');)
        if (!s.empty()) a.algos.push_back(s);
      if (a.algos.empty()) usage("-A: empty list");
    } else {
      usage("unknown flag " + f);
    }
  }
  return a;
}

// ---- Resources ----

int countEntries(const char* dir) {
  DIR* d = opendir(dir);
  if (d == nullptr) return -1;
  int n = 0;
  while (dirent* e = readdir(d)) n += e->d_name[0] != '.';
  closedir(d);
  return n;
}

long residentKiB() {
  long pages = 0, resident = 0;
  FILE* f = fopen("/proc/self/statm", "r");
  if (f == nullptr) return -1;
  if (fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = -1;
  fclose(f);
  return resident < 0 ? -1 : resident * (sysconf(_SC_PAGESIZE) / 1024);
}

// A communicator's segments are /dev/shm/loom-<hash>-<rank>; its recorder dump names the hash.
uint64_t hashOf(loomComm_t comm, int rank, int k) {
  char path[128];
  snprintf(path, sizeof(path), "/tmp/loom-soak-%d-%d-%d.json", static_cast<int>(getpid()), rank, k);
  if (loomCommDumpTrace(comm, path) != loomSuccess) return 0;
  std::ifstream in(path);
  std::string json((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  unlink(path);
  const char key[] = "\"commHash\":\"";
  const size_t at = json.find(key);
  return at == std::string::npos ? 0 : strtoull(json.c_str() + at + sizeof(key) - 1, nullptr, 16);
}

int segmentsLeft(uint64_t hash, int nranks) {
  int left = 0;
  for (int r = 0; r < nranks; ++r) {
    char path[96];
    snprintf(path, sizeof(path), "/dev/shm/loom-%016" PRIx64 "-%d", hash, r);
    left += access(path, F_OK) == 0;
  }
  return left;
}

// ---- The reference ----

enum Coll {
  kAllReduce,
  kBroadcast,
  kReduce,
  kAllGather,
  kReduceScatter,
  kAllToAll,
  kSendRecv,
  kBarrier,
  kNumColls
};
const char* const kCollNames[] = {"allreduce",     "broadcast", "reduce",   "allgather",
                                  "reducescatter", "alltoall",  "sendrecv", "barrier"};
const char* const kOpNames[] = {"sum", "prod", "max", "min", "avg"};

uint64_t mix(uint64_t x) {
  x ^= x >> 31;
  x *= 0x7fb5d329728ea185ull;
  x ^= x >> 27;
  x *= 0x81dadef4bc2dd44dull;
  return x ^ (x >> 33);
}

// How the values of one operation are drawn and combined.
struct Values {
  const perf::TypeInfo* t;
  loomRedOp_t op;
  bool reduces;
  int n;
  int64_t span = 0;   // floating point: integers in [-span, span] (times n for avg)
  bool twos = false;  // floating point prod: factors +-1 and +-2
  bool isFloat() const { return t->kind != perf::Kind::kInt && t->kind != perf::Kind::kUint; }
};

// Largest integer below which every integer is exact, and the largest finite value.
void floatLimits(const perf::TypeInfo& t, double* exact, double* maxFinite) {
  if (t.kind == perf::Kind::kFloat)
    *exact = std::ldexp(1, 24), *maxFinite = 3e38;
  else if (t.kind == perf::Kind::kDouble)
    *exact = std::ldexp(1, 53), *maxFinite = 1e300;
  else {
    const perf::FloatFormat& f = *t.fmt;
    const int bias = (1 << (f.exp_bits - 1)) - 1;
    *exact = std::ldexp(1, f.man_bits + 1);
    *maxFinite =
        f.ieee ? (2 - std::ldexp(1, -f.man_bits)) * std::ldexp(1, bias)
               : (2 - std::ldexp(1, 1 - f.man_bits)) * std::ldexp(1, (1 << f.exp_bits) - 1 - bias);
  }
}

// Chooses the value range; may turn avg into sum where the type cannot average exactly.
Values makeValues(loomDataType_t type, loomRedOp_t op, bool reduces, int n) {
  Values v{&perf::TypeOf(type), op, reduces, n};
  if (!reduces || !v.isFloat()) return v;
  double exact = 0, maxFinite = 0;
  floatLimits(*v.t, &exact, &maxFinite);
  if (op == loomAvg && std::floor(exact / (double(n) * n)) < 1) v.op = op = loomSum;
  switch (op) {
    case loomSum:
      v.span = static_cast<int64_t>(std::floor(exact / n));
      break;
    case loomAvg:
      v.span = static_cast<int64_t>(std::floor(exact / (double(n) * n)));
      break;
    case loomProd:
      v.twos = std::ldexp(1, n) <= maxFinite;
      break;
    default:
      v.span = static_cast<int64_t>(exact);
      break;
  }
  v.span = std::min<int64_t>(v.span, int64_t{1} << 40);
  return v;
}

// Rank r's input element i: raw bits for integers and data movement, else an exact integer.
inline uint64_t rawOf(uint64_t seed, int r, size_t i) {
  return mix(seed + 0x9e3779b97f4a7c15ull * (i * 67 + r + 1));
}

int64_t floatValueOf(const Values& v, uint64_t raw) {
  if (v.op == loomProd) {
    int64_t m = v.twos && (raw & 2) ? 2 : 1;
    return (raw & 1) ? -m : m;
  }
  int64_t k = static_cast<int64_t>(raw % static_cast<uint64_t>(2 * v.span + 1)) - v.span;
  return v.op == loomAvg ? k * v.n : k;
}

// Encodes an exact integer in a small float format.
uint64_t encodeSmall(int64_t x, const perf::FloatFormat& f) {
  const int total = f.exp_bits + f.man_bits;
  if (x == 0) return 0;
  uint64_t sign = x < 0 ? uint64_t{1} << total : 0;
  uint64_t a = static_cast<uint64_t>(x < 0 ? -x : x);
  int e = 63 - __builtin_clzll(a);
  const int bias = (1 << (f.exp_bits - 1)) - 1;
  uint64_t frac = a - (uint64_t{1} << e);
  frac = e >= f.man_bits ? frac >> (e - f.man_bits) : frac << (f.man_bits - e);
  return sign | (static_cast<uint64_t>(e + bias) << f.man_bits) | frac;
}

void encodeExact(const perf::TypeInfo& t, int64_t x, unsigned char* out) {
  uint64_t bits = 0;
  if (t.kind == perf::Kind::kFloat) {
    float f = static_cast<float>(x);
    memcpy(&bits, &f, 4);
  } else if (t.kind == perf::Kind::kDouble) {
    double d = static_cast<double>(x);
    memcpy(&bits, &d, 8);
  } else {
    bits = encodeSmall(x, *t.fmt);
  }
  memcpy(out, &bits, t.size);
}

// Sign-extends (or zero-extends) the low `bytes` bytes of v.
int64_t asSigned(uint64_t v, size_t bytes) {
  if (bytes == 8) return static_cast<int64_t>(v);
  const int shift = 64 - 8 * static_cast<int>(bytes);
  return static_cast<int64_t>(v << shift) >> shift;
}

void inputElement(const Values& v, uint64_t seed, int r, size_t i, unsigned char* out) {
  const uint64_t raw = rawOf(seed, r, i);
  if (!v.reduces || !v.isFloat())
    memcpy(out, &raw, v.t->size);
  else
    encodeExact(*v.t, floatValueOf(v, raw), out);
}

// The reduction over all ranks of input element i.
void reducedElement(const Values& v, uint64_t seed, size_t i, unsigned char* out) {
  const size_t sz = v.t->size;
  if (v.isFloat()) {
    int64_t acc = floatValueOf(v, rawOf(seed, 0, i));
    for (int r = 1; r < v.n; ++r) {
      const int64_t x = floatValueOf(v, rawOf(seed, r, i));
      switch (v.op) {
        case loomProd:
          acc *= x;
          break;
        case loomMax:
          acc = std::max(acc, x);
          break;
        case loomMin:
          acc = std::min(acc, x);
          break;
        default:
          acc += x;
          break;
      }
    }
    encodeExact(*v.t, v.op == loomAvg ? acc / v.n : acc, out);
    return;
  }
  const bool sgn = v.t->kind == perf::Kind::kInt;
  const uint64_t mask = sz == 8 ? ~uint64_t{0} : (uint64_t{1} << (8 * sz)) - 1;
  uint64_t acc = rawOf(seed, 0, i) & mask;
  for (int r = 1; r < v.n; ++r) {
    const uint64_t x = rawOf(seed, r, i) & mask;
    const bool greater = sgn ? asSigned(x, sz) > asSigned(acc, sz) : x > acc;
    switch (v.op) {
      case loomProd:
        acc = (acc * x) & mask;
        break;
      case loomMax:
        acc = greater ? x : acc;
        break;
      case loomMin:
        acc = greater || x == acc ? acc : x;
        break;
      default:
        acc = (acc + x) & mask;
        break;
    }
  }
  if (v.op == loomAvg)
    acc = sgn ? static_cast<uint64_t>(asSigned(acc, sz) / v.n) : acc / static_cast<uint64_t>(v.n);
  memcpy(out, &acc, sz);
}

// ---- One operation, drawn alike on every rank ----

struct Draw {
  Coll coll;
  loomDataType_t type;
  loomRedOp_t op;
  size_t bytes;  // the larger buffer
  int rootDraw;
  bool inPlace;
  uint64_t seed;
};

Draw drawOp(uint64_t seed, long i, size_t maxBytes) {
  uint64_t h = mix(seed * 0x2545f4914f6cdd1dull + static_cast<uint64_t>(i));
  auto next = [&h](uint64_t n) {
    h = mix(h + 0x632be59bd9b4e019ull);
    return h % n;
  };
  auto uniform = [&next] { return static_cast<double>(next(1u << 30)) / (1u << 30); };
  Draw d;
  d.coll = static_cast<Coll>(next(kNumColls));
  d.type = static_cast<loomDataType_t>(next(loomNumTypes));
  d.op = static_cast<loomRedOp_t>(next(loomNumOps));
  const uint64_t band = next(1000);
  auto logUniform = [&](double lo, double hi) {
    return static_cast<size_t>(
        std::exp2(std::log2(lo) + uniform() * (std::log2(hi) - std::log2(lo))));
  };
  const double mx = static_cast<double>(maxBytes);
  if (band < 10)
    d.bytes = 0;
  else if (band < 900)
    d.bytes = logUniform(1, std::min(mx, 65536.0));
  else if (band < 995)
    d.bytes = logUniform(std::min(mx, 65536.0), std::min(mx, 1048576.0));
  else
    d.bytes = logUniform(std::min(mx, 1048576.0), mx);
  d.rootDraw = static_cast<int>(next(1u << 20));
  d.inPlace = next(2) == 1;
  d.seed = mix(h);
  return d;
}

struct Rank {
  loomComm_t comm = nullptr;
  int rank = 0, n = 1;
};

struct Tally {
  long ops[kNumColls] = {};
  double bytes = 0;
  long wrongOps = 0;
  long wrongElems = 0;
};

// Runs one drawn operation on c and checks this rank's result; false on an API error.
bool runOp(const Draw& d, long index, const Rank& c, unsigned char* send, unsigned char* recv,
           Tally* tally) {
  const int n = c.n, me = c.rank;
  const bool multi = d.coll == kAllGather || d.coll == kReduceScatter || d.coll == kAllToAll;
  const bool reduces = d.coll == kAllReduce || d.coll == kReduce || d.coll == kReduceScatter;
  const Values v = makeValues(d.type, d.op, reduces, n);
  const size_t sz = v.t->size;
  const size_t count = d.bytes / sz / (multi ? n : 1);
  const int root = d.rootDraw % n;
  const size_t inElems = d.coll == kReduceScatter || d.coll == kAllToAll ? n * count : count;
  const size_t outElems = d.coll == kAllGather || d.coll == kAllToAll ? n * count : count;
  bool inPlace = d.inPlace && d.coll != kAllToAll && d.coll != kSendRecv;
  // Where the input goes and where the output comes back.
  unsigned char* in = send;
  unsigned char* out = recv;
  memset(recv, 0xa5, std::max(outElems, inElems) * sz);
  if (inPlace) {
    in = recv;
    if (d.coll == kAllGather) in = recv + me * count * sz;
    if (d.coll == kReduceScatter) out = recv + me * count * sz;
  }
  for (size_t i = 0; i < inElems; ++i) inputElement(v, d.seed, me, i, in + i * sz);
  loomResult_t r = loomSuccess;
  const loomDataType_t t = d.type;
  switch (d.coll) {
    case kAllReduce:
      r = loomAllReduce(in, out, count, t, v.op, c.comm, nullptr);
      break;
    case kBroadcast:
      r = loomBroadcast(in, out, count, t, root, c.comm, nullptr);
      break;
    case kReduce:
      r = loomReduce(in, out, count, t, v.op, root, c.comm, nullptr);
      break;
    case kAllGather:
      r = loomAllGather(in, out, count, t, c.comm, nullptr);
      break;
    case kReduceScatter:
      r = loomReduceScatter(in, out, count, t, v.op, c.comm, nullptr);
      break;
    case kAllToAll:
      r = loomAllToAll(in, out, count, t, c.comm, nullptr);
      break;
    case kSendRecv:
      r = loomGroupStart();
      if (r == loomSuccess) r = loomSend(in, count, t, (me + 1) % n, c.comm, nullptr);
      if (r == loomSuccess) r = loomRecv(out, count, t, (me + n - 1) % n, c.comm, nullptr);
      if (r == loomSuccess) r = loomGroupEnd();
      break;
    case kBarrier:
      r = loomBarrier(c.comm, nullptr);
      break;
    default:
      break;
  }
  if (r != loomSuccess) {
    fprintf(stderr, "%s: rank %d: op %ld (%s %s count %zu): %s: %s\n", kProg, me, index,
            kCollNames[d.coll], v.t->name, count, loomGetErrorString(r), loomGetLastError(c.comm));
    return false;
  }
  ++tally->ops[d.coll];
  tally->bytes += static_cast<double>(d.bytes);
  if (d.coll == kBarrier || (d.coll == kReduce && me != root)) return true;
  // Expected element j of this rank's output.
  unsigned char want[8];
  long wrong = 0;
  for (size_t j = 0; j < outElems; ++j) {
    switch (d.coll) {
      case kAllReduce:
      case kReduce:
        reducedElement(v, d.seed, j, want);
        break;
      case kReduceScatter:
        reducedElement(v, d.seed, me * count + j, want);
        break;
      case kBroadcast:
        inputElement(v, d.seed, root, j, want);
        break;
      case kAllGather:
        inputElement(v, d.seed, static_cast<int>(j / count), j % count, want);
        break;
      case kAllToAll:
        inputElement(v, d.seed, static_cast<int>(j / count), me * count + j % count, want);
        break;
      case kSendRecv:
        inputElement(v, d.seed, (me + n - 1) % n, j, want);
        break;
      default:
        break;
    }
    if (memcmp(want, out + j * sz, sz) == 0) continue;
    if (++wrong <= 3) {
      uint64_t got = 0, exp = 0;
      memcpy(&got, out + j * sz, sz);
      memcpy(&exp, want, sz);
      fprintf(stderr,
              "%s: rank %d of %d: WRONG op %ld %s %s %s count %zu root %d %s: element %zu: "
              "got 0x%" PRIx64 ", expected 0x%" PRIx64 "\n",
              kProg, me, n, index, kCollNames[d.coll], v.t->name, kOpNames[v.op], count, root,
              inPlace ? "in-place" : "out-of-place", j, got, exp);
    }
  }
  if (wrong > 0) {
    ++tally->wrongOps;
    tally->wrongElems += wrong;
  }
  return true;
}

// ---- A phase: the ranks and what they share with the parent ----

struct Sample {
  long op;
  long rssKiB;
  int fds;
};

struct RankReport {
  std::atomic<int> samples;
  Sample s[kMaxSamples];
  Tally tally;
  double seconds;
  int failures;
};

struct Shared {
  RankReport ranks[kMaxRanks];
};

double now() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + ts.tv_nsec * 1e-9;
}

int g_rank = -1, g_failures = 0;

__attribute__((format(printf, 1, 2))) void fail(const char* fmt, ...) {
  char line[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof(line), fmt, ap);
  va_end(ap);
  fprintf(stderr, "%s: rank %d: FAIL %s\n", kProg, g_rank, line);
  ++g_failures;
}

int runRank(const Args& a, const std::string& algo, int rank, Shared* shared) {
  RankReport& rep = shared->ranks[rank];
  g_rank = rank;
  const int fdsBefore = countEntries("/proc/self/fd");
  Rank world;
  world.rank = rank;
  world.n = a.np;
  loomUniqueId id;
  loomResult_t r = loomGetUniqueId(&id);
  if (r == loomSuccess) r = loomCommInitRank(&world.comm, a.np, id, rank);
  if (r != loomSuccess) {
    fprintf(stderr, "%s: rank %d: init: %s: %s\n", kProg, rank, loomGetErrorString(r),
            loomGetLastError(nullptr));
    return 1;
  }
  const uint64_t worldHash = hashOf(world.comm, rank, -1);
  // -c: the communicators split from the world.
  const int fdsBeforeSplit = countEntries("/proc/self/fd");
  const int threadsBeforeSplit = countEntries("/proc/self/task");
  std::vector<Rank> comms;
  std::vector<uint64_t> hashes;
  for (int k = 0; k < a.comms; ++k) {
    const int color = k % 3 == 0 ? 0 : (rank + k) % 2;
    Rank c;
    r = loomCommSplit(world.comm, color, k % 2 ? -rank : rank, &c.comm, nullptr);
    if (r == loomSuccess) r = loomCommUserRank(c.comm, &c.rank);
    if (r == loomSuccess) r = loomCommCount(c.comm, &c.n);
    if (r != loomSuccess) {
      fprintf(stderr, "%s: rank %d: split %d: %s: %s\n", kProg, rank, k, loomGetErrorString(r),
              loomGetLastError(nullptr));
      return 1;
    }
    comms.push_back(c);
    hashes.push_back(hashOf(c.comm, rank, k));
  }
  const size_t bufBytes = a.maxBytes + 64;
  auto* send = static_cast<unsigned char*>(perf::AllocPrefaulted(bufBytes));
  auto* recv = static_cast<unsigned char*>(perf::AllocPrefaulted(bufBytes));
  if (send == nullptr || recv == nullptr) {
    fprintf(stderr, "%s: rank %d: cannot allocate 2 x %zu bytes\n", kProg, rank, bufBytes);
    return 1;
  }
  const uint64_t seed = a.seed * 1000003 + std::hash<std::string>()(algo) % 1000;
  const double t0 = now();
  Sample warm{0, 0, 0};
  for (long i = 0; i < a.ops; ++i) {
    const Rank& c = comms.empty() ? world : comms[static_cast<size_t>(i) % comms.size()];
    if (!runOp(drawOp(seed, i, a.maxBytes), i, c, send, recv, &rep.tally)) {
      ++g_failures;
      break;
    }
    if ((i + 1) % a.every != 0 && i + 1 != a.ops) continue;
    const Sample s{i + 1, residentKiB(), countEntries("/proc/self/fd")};
    if (rank == 0) {
      fprintf(stderr, "%s: op %ld of %ld: rss %ld KiB, %d fds, %.1f s\n", kProg, s.op, a.ops,
              s.rssKiB, s.fds, now() - t0);
      fflush(stderr);
    }
    const int k = rep.samples.load();
    if (k < kMaxSamples) {
      rep.s[k] = s;
      rep.samples.store(k + 1);
    }
    if (warm.op == 0 && (i + 1) >= a.every) {
      warm = s;  // the warm-up level
    } else if (warm.op != 0) {
      if (s.rssKiB > warm.rssKiB + a.rssBoundKiB)
        fail("resident memory grew from %ld KiB (op %ld) to %ld KiB (op %ld)", warm.rssKiB, warm.op,
             s.rssKiB, s.op);
      if (s.fds != warm.fds)
        fail("open descriptors went from %d (op %ld) to %d (op %ld)", warm.fds, warm.op, s.fds,
             s.op);
    }
  }
  rep.seconds = now() - t0;
  if (rep.tally.wrongOps > 0)
    fail("%ld operations gave wrong results (%ld elements)", rep.tally.wrongOps,
         rep.tally.wrongElems);
  free(send);
  free(recv);
  // Destroy the split communicators, then look for what they left.
  for (Rank& c : comms)
    if (loomCommDestroy(c.comm) != loomSuccess)
      fail("loomCommDestroy of a split communicator: %s", loomGetLastError(nullptr));
  if (!comms.empty()) {
    int fds = 0, threads = 0;
    for (int i = 0; i < 200; ++i) {  // a split's rendezvous thread ends once its ranks joined
      fds = countEntries("/proc/self/fd");
      threads = countEntries("/proc/self/task");
      if (fds == fdsBeforeSplit && threads == threadsBeforeSplit) break;
      usleep(10000);
    }
    int segments = 0, unknown = 0;
    for (uint64_t h : hashes) {
      unknown += h == 0;
      segments += segmentsLeft(h, a.np);
    }
    if (fds != fdsBeforeSplit || threads != threadsBeforeSplit || segments != 0 || unknown != 0)
      fail(
          "after destroying %zu communicators: %d fds (%d before), %d threads (%d before), %d "
          "segments left in /dev/shm, %d hashes unknown",
          comms.size(), fds, fdsBeforeSplit, threads, threadsBeforeSplit, segments, unknown);
    else if (rank == 0)
      printf("%s: %zu split communicators destroyed: fds %d, threads %d, no segment left\n", kProg,
             comms.size(), fds, threads);
  }
  r = loomCommDestroy(world.comm);
  if (r != loomSuccess) fail("loomCommDestroy: %s", loomGetLastError(nullptr));
  const int fdsAfter = countEntries("/proc/self/fd");
  if (fdsAfter != fdsBefore) fail("%d fds after destroy, %d before init", fdsAfter, fdsBefore);
  if (worldHash == 0 || segmentsLeft(worldHash, a.np) != 0)
    fail("the world communicator's segments: hash %" PRIx64 ", %d left", worldHash,
         segmentsLeft(worldHash, a.np));
  rep.failures = g_failures;
  return g_failures == 0 ? 0 : 1;
}

// Prints the phase's counts and the resource samples of every rank.
void printPhase(const Args& a, const std::string& algo, const Shared& sh) {
  Tally all;
  double maxRankS = 0;
  for (int r = 0; r < a.np; ++r) {
    const Tally& t = sh.ranks[r].tally;
    for (int c = 0; c < kNumColls; ++c) all.ops[c] = std::max(all.ops[c], t.ops[c]);
    all.bytes = std::max(all.bytes, t.bytes);
    all.wrongOps += t.wrongOps;
    maxRankS = std::max(maxRankS, sh.ranks[r].seconds);
  }
  long total = 0;
  for (int c = 0; c < kNumColls; ++c) total += all.ops[c];
  printf(
      "%s: LOOM_ALGO=%s: %ld operations on %d ranks%s in %.1f s (%.0f ops/s, %.2f GiB moved "
      "per rank), %ld wrong\n",
      kProg, algo.c_str(), total, a.np,
      a.comms > 0 ? (" over " + std::to_string(a.comms) + " split communicators").c_str() : "",
      maxRankS, total / std::max(maxRankS, 1e-9), all.bytes / (1 << 30), all.wrongOps);
  printf("%s:  ", kProg);
  for (int c = 0; c < kNumColls; ++c) printf(" %s %ld", kCollNames[c], all.ops[c]);
  printf("\n%s:   op       rss KiB per rank (min..max)   fds per rank (min..max)\n", kProg);
  const int samples = sh.ranks[0].samples.load();
  for (int k = 0; k < samples; ++k) {
    long lo = LONG_MAX, hi = 0;
    int flo = 1 << 30, fhi = 0;
    for (int r = 0; r < a.np; ++r) {
      if (sh.ranks[r].samples.load() <= k) continue;
      const Sample& s = sh.ranks[r].s[k];
      lo = std::min(lo, s.rssKiB), hi = std::max(hi, s.rssKiB);
      flo = std::min(flo, s.fds), fhi = std::max(fhi, s.fds);
    }
    printf("%s:   %-8ld %8ld .. %-8ld            %d .. %d\n", kProg, sh.ranks[0].s[k].op, lo, hi,
           flo, fhi);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parseArgs(argc, argv);
  if (a.comms > 0) {
    setenv("LOOM_SLOT_BYTES", "65536", 0);
    setenv("LOOM_DIRECT_BYTES", "262144", 0);
  }
  int status = 0;
  for (const std::string& algo : a.algos) {
    void* mem =
        mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED) {
      perror("mmap");
      return 1;
    }
    auto* sh = new (mem) Shared();
    const int port = loom::net::freeLoopbackPort();
    const std::string commId = "127.0.0.1:" + std::to_string(port);
    const int rc = perf::Launch(kProg, a.np, a.timeoutS, [&](int rank) {
      setenv("LOOM_COMM_ID", commId.c_str(), 1);
      setenv("LOOM_SOCKET_IFNAME", "lo", 0);
      if (algo != "auto") setenv("LOOM_ALGO", algo.c_str(), 1);
      return runRank(a, algo, rank, sh);
    });
    printPhase(a, algo, *sh);
    if (rc != 0) status = 1;
    munmap(mem, sizeof(Shared));
  }
  printf("%s: %s\n", kProg, status == 0 ? "PASS" : "FAIL");
  return status;
}
