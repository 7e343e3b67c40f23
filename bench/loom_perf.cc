// loom-perf: Loom's all-reduce bandwidth benchmark, in the shape of nccl-tests' all_reduce_perf.
//
// Without a launcher it starts -np ranks on this host: the parent picks a free loopback port and
// forks one child per rank; each child points LOOM_COMM_ID at that port before its first Loom
// call, and rank 0 hosts the rendezvous there. When a launcher started us (LOOM_RANK and
// LOOM_WORLD_SIZE, torchrun's RANK, mpirun's OMPI_COMM_WORLD_RANK or srun's SLURM_STEP_ID is set),
// the process runs as that one rank and loomCommInitFromEnv reads the rest (see loom.h).
//
// Buffers are host memory passed with a NULL stream, so every call is complete when it returns;
// -z is accepted for nccl-tests compatibility and changes nothing.
//
// Exit status: 0 on success, 1 when a Loom call failed or a result was wrong, 2 on bad usage.

#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "loom/loom.h"

namespace {

constexpr char kProg[] = "loom-perf";

// Encoding of the small float formats, coded here independently of Loom's kernels.
struct FloatFormat {
  int exp_bits;
  int man_bits;
  bool ieee;  // an all-ones exponent means inf/NaN (false for e4m3: only S.1111.111 is NaN)
};
constexpr FloatFormat kHalfFmt = {5, 10, true};
constexpr FloatFormat kBf16Fmt = {8, 7, true};
constexpr FloatFormat kE4m3Fmt = {4, 3, false};
constexpr FloatFormat kE5m2Fmt = {5, 2, true};

enum class Kind { kInt, kUint, kFloat, kDouble, kSmallFloat };

// Per-type limits that keep every check exact. `exact`: no partial result of the test pattern
// exceeds this magnitude, and every integer up to it is representable. `max_pow2`: the largest
// power of two a product may reach. Indexed by loomDataType_t.
struct TypeInfo {
  loomDataType_t type;
  const char* name;
  size_t size;
  Kind kind;
  const FloatFormat* fmt;
  int64_t exact;
  int max_pow2;
  bool is_signed() const { return kind != Kind::kUint; }
};

constexpr TypeInfo kTypes[] = {
    {loomInt8, "int8", 1, Kind::kInt, nullptr, 127, 6},
    {loomUint8, "uint8", 1, Kind::kUint, nullptr, 254, 7},
    {loomInt32, "int32", 4, Kind::kInt, nullptr, 1 << 20, 30},
    {loomUint32, "uint32", 4, Kind::kUint, nullptr, 1 << 20, 30},
    {loomInt64, "int64", 8, Kind::kInt, nullptr, 1 << 20, 30},
    {loomUint64, "uint64", 8, Kind::kUint, nullptr, 1 << 20, 30},
    {loomHalf, "half", 2, Kind::kSmallFloat, &kHalfFmt, 2048, 15},
    {loomFloat, "float", 4, Kind::kFloat, nullptr, 1 << 24, 30},
    {loomDouble, "double", 8, Kind::kDouble, nullptr, 1 << 24, 30},
    {loomBfloat16, "bfloat16", 2, Kind::kSmallFloat, &kBf16Fmt, 256, 30},
    {loomFloat8e4m3, "fp8_e4m3", 1, Kind::kSmallFloat, &kE4m3Fmt, 16, 8},
    {loomFloat8e5m2, "fp8_e5m2", 1, Kind::kSmallFloat, &kE5m2Fmt, 8, 15},
};

struct Alias {
  const char* name;
  loomDataType_t type;
};
constexpr Alias kTypeAliases[] = {
    {"char", loomInt8},       {"int", loomInt32},         {"fp16", loomHalf},
    {"float16", loomHalf},    {"float32", loomFloat},     {"float64", loomDouble},
    {"bf16", loomBfloat16},   {"f8e4m3", loomFloat8e4m3}, {"f8e5m2", loomFloat8e5m2},
    {"e4m3", loomFloat8e4m3}, {"e5m2", loomFloat8e5m2},
};

struct OpInfo {
  loomRedOp_t op;
  const char* name;
};
constexpr OpInfo kOps[] = {
    {loomSum, "sum"}, {loomProd, "prod"}, {loomMax, "max"}, {loomMin, "min"}, {loomAvg, "avg"}};

struct Options {
  size_t min_bytes = size_t{32} << 20;
  size_t max_bytes = size_t{32} << 20;
  size_t step_factor = 2;
  size_t step_bytes = size_t{1} << 20;
  int iters = 20;
  int warmup = 5;
  int check = 1;
  int nranks = 2;
  int timeout_s = 1800;  // the parent's deadline for its ranks; 0: none
  std::vector<const TypeInfo*> types;
  std::vector<const OpInfo*> ops;
  std::string json_path;
};

// ---------------------------------------------------------------------------------------------
// Element access. Elements are read and written as little-endian bit patterns of t.size bytes.

double Decode(uint32_t bits, const FloatFormat& f) {
  const int bias = (1 << (f.exp_bits - 1)) - 1;
  const uint32_t man_mask = (1u << f.man_bits) - 1, exp_max = (1u << f.exp_bits) - 1;
  const uint32_t man = bits & man_mask, exp = (bits >> f.man_bits) & exp_max;
  const bool neg = (bits >> (f.exp_bits + f.man_bits)) & 1;
  double v;
  if (f.ieee && exp == exp_max) {
    v = man == 0 ? HUGE_VAL : NAN;
  } else if (!f.ieee && exp == exp_max && man == man_mask) {
    v = NAN;
  } else if (exp == 0) {
    v = std::ldexp(man, 1 - bias - f.man_bits);
  } else {
    v = std::ldexp(man | (1u << f.man_bits), static_cast<int>(exp) - bias - f.man_bits);
  }
  return neg ? -v : v;
}

// Encodes x, which is zero or a normal number exactly representable in f (the patterns are).
uint32_t Encode(double x, const FloatFormat& f) {
  uint32_t bits = std::signbit(x) ? 1u << (f.exp_bits + f.man_bits) : 0;
  if (x == 0) return bits;
  int e;
  const double m = std::frexp(std::fabs(x), &e);  // |x| = m * 2^e, m in [0.5, 1)
  const uint32_t exp = static_cast<uint32_t>(e - 1 + (1 << (f.exp_bits - 1)) - 1);
  const uint32_t man = static_cast<uint32_t>(std::ldexp(m * 2 - 1, f.man_bits));
  return bits | exp << f.man_bits | man;
}

void Store(void* buf, size_t i, const TypeInfo& t, double v) {
  uint64_t bits = 0;
  if (t.kind == Kind::kInt || t.kind == Kind::kUint) {
    bits = static_cast<uint64_t>(static_cast<int64_t>(v));  // truncates to t.size below
  } else if (t.kind == Kind::kFloat) {
    const float f = static_cast<float>(v);
    std::memcpy(&bits, &f, sizeof(f));
  } else if (t.kind == Kind::kDouble) {
    std::memcpy(&bits, &v, sizeof(v));
  } else {
    bits = Encode(v, *t.fmt);
  }
  std::memcpy(static_cast<char*>(buf) + i * t.size, &bits, t.size);
}

double Load(const void* buf, size_t i, const TypeInfo& t) {
  uint64_t bits = 0;
  std::memcpy(&bits, static_cast<const char*>(buf) + i * t.size, t.size);
  const int unused = 64 - 8 * static_cast<int>(t.size);
  if (t.kind == Kind::kInt)
    return static_cast<double>(static_cast<int64_t>(bits << unused) >> unused);
  if (t.kind == Kind::kUint) return static_cast<double>(bits);
  if (t.kind == Kind::kFloat) {
    float f;
    std::memcpy(&f, &bits, sizeof(f));
    return f;
  }
  if (t.kind == Kind::kDouble) {
    double d;
    std::memcpy(&d, &bits, sizeof(d));
    return d;
  }
  return Decode(static_cast<uint32_t>(bits), *t.fmt);
}

// ---------------------------------------------------------------------------------------------
// The check pattern: small integers (for prod, +-1 and +-2) chosen so that every partial result,
// in any reduction order, is exact in the type; so the expected value is exact too.

uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// A draw in [-k, k] (signed types) or [0, k].
double Draw(uint64_t h, int64_t k, bool is_signed) {
  if (k <= 0) return 0;
  if (is_signed) return static_cast<double>(static_cast<int64_t>(h % (2 * k + 1)) - k);
  return static_cast<double>(h % (k + 1));
}

double Input(const TypeInfo& t, loomRedOp_t op, int nranks, int rank, size_t i) {
  const uint64_t h = Mix((uint64_t{i} << 12) ^ (uint64_t(rank) << 4) ^ uint64_t(op));
  switch (op) {
    case loomSum: {
      const int64_t k = t.exact / nranks;
      if (k > 0) return Draw(h, k, t.is_signed());
      // Too many ranks for a dense pattern: one rank per element contributes.
      return i % nranks == static_cast<size_t>(rank) ? Draw(h, t.exact, t.is_signed()) : 0;
    }
    case loomProd: {
      double v = rank < t.max_pow2 && (h & 1) ? 2 : 1;
      return t.is_signed() && (h & 2) ? -v : v;
    }
    case loomAvg: {
      // The same base on every rank, plus +1/-1 pairs that cancel: the sum is nranks * base, and
      // a partial sum over any subset of ranks stays within nranks * k + nranks / 2.
      const int64_t room = t.exact - (nranks + 1) / 2, k = room < 0 ? -1 : room / nranks;
      const uint64_t hb = Mix(uint64_t{i} * 0x2545f4914f6cdd1dull);
      const double base =
          t.is_signed() ? Draw(hb, k, true) : 1 + Draw(hb, std::max<int64_t>(k - 1, 0), false);
      const double delta = k < 0 ? 0 : rank % 2 == 1 ? -1 : rank + 1 < nranks ? 1 : 0;
      return base + delta;
    }
    default:  // max, min
      return Draw(h, t.exact, t.is_signed());
  }
}

double Expected(const TypeInfo& t, loomRedOp_t op, int nranks, size_t i) {
  double acc = Input(t, op, nranks, 0, i);
  for (int r = 1; r < nranks; ++r) {
    const double v = Input(t, op, nranks, r, i);
    if (op == loomProd) {
      acc *= v;
    } else if (op == loomMax) {
      acc = std::max(acc, v);
    } else if (op == loomMin) {
      acc = std::min(acc, v);
    } else {
      acc += v;
    }
  }
  return op == loomAvg ? acc / nranks : acc;
}

void Fill(void* buf, size_t count, const TypeInfo& t, loomRedOp_t op, int nranks, int rank) {
  for (size_t i = 0; i < count; ++i) Store(buf, i, t, Input(t, op, nranks, rank, i));
}

// Fills buf with a value no expected result takes: NaN, the unsigned maximum (above `exact`),
// or the signed minimum (below -exact).
void FillJunk(void* buf, size_t count, const TypeInfo& t) {
  const uint64_t bits = t.kind == Kind::kInt ? uint64_t{1} << (8 * t.size - 1) : ~uint64_t{0};
  for (size_t i = 0; i < count; ++i)
    std::memcpy(static_cast<char*>(buf) + i * t.size, &bits, t.size);
}

int64_t CountWrong(const void* buf, size_t count, const TypeInfo& t, loomRedOp_t op, int nranks) {
  int64_t wrong = 0;
  for (size_t i = 0; i < count; ++i)
    if (!(Load(buf, i, t) == Expected(t, op, nranks, i))) ++wrong;
  return wrong;
}

// ---------------------------------------------------------------------------------------------
// One rank.

loomComm_t g_comm = nullptr;
int g_rank = -1;

[[noreturn]] void Fail(const char* what, loomResult_t rc) {
  std::fprintf(stderr, "%s: rank %d: %s failed: %s: %s\n", kProg, g_rank, what,
               loomGetErrorString(rc), loomGetLastError(g_comm));
  std::fflush(nullptr);
  // Aborting lets the peers fail with loomRemoteError instead of waiting for a timeout.
  if (g_comm != nullptr) loomCommAbort(g_comm);
  _exit(1);
}

#define PERF_CHECK(call)                                \
  do {                                                  \
    loomResult_t perf_rc_ = (call);                     \
    if (perf_rc_ != loomSuccess) Fail(#call, perf_rc_); \
  } while (0)

struct Stats {
  double time_us = 0, algbw = 0, busbw = 0;
  int64_t wrong = -1;  // -1: not checked
};

struct Row {
  size_t size, count;
  const char* type;
  const char* op;
  Stats oop, ip;
};

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// One rank's communicator and buffers.
struct Rank {
  const Options& o;
  loomComm_t comm;
  int rank, nranks;
  void* send;
  void* recv;
};

// Times one size out-of-place or in-place (the average over ranks of each rank's time per op),
// then checks one reduction of the test pattern.
Stats TimeAndCheck(const Rank& k, const TypeInfo& t, loomRedOp_t op, size_t count, bool in_place) {
  void* send = in_place ? k.recv : k.send;
  PERF_CHECK(loomBarrier(k.comm, nullptr));
  const double start = Now();
  for (int i = 0; i < k.o.iters; ++i)
    PERF_CHECK(loomAllReduce(send, k.recv, count, t.type, op, k.comm, nullptr));
  double sec = (Now() - start) / k.o.iters, sum = 0;
  PERF_CHECK(loomAllReduce(&sec, &sum, 1, loomDouble, loomSum, k.comm, nullptr));
  sec = sum / k.nranks;
  Stats s;
  s.time_us = sec * 1e6;
  s.algbw = sec > 0 ? static_cast<double>(count * t.size) / sec / 1e9 : 0;
  s.busbw = s.algbw * 2 * (k.nranks - 1) / k.nranks;
  if (k.o.check) {
    Fill(send, count, t, op, k.nranks, k.rank);
    if (!in_place) FillJunk(k.recv, count, t);
    PERF_CHECK(loomAllReduce(send, k.recv, count, t.type, op, k.comm, nullptr));
    int64_t wrong = CountWrong(k.recv, count, t, op, k.nranks);
    PERF_CHECK(loomAllReduce(&wrong, &s.wrong, 1, loomInt64, loomSum, k.comm, nullptr));
  }
  return s;
}

void* AllocPrefaulted(size_t bytes) {
  const size_t page = 4096;
  bytes = std::max(page, (bytes + page - 1) / page * page);
  void* p = nullptr;
  if (posix_memalign(&p, page, bytes) != 0) return nullptr;
  std::memset(p, 0, bytes);  // touches every page before any timing
  return p;
}

std::string WrongText(const Stats& s, const char* unchecked) {
  return s.wrong >= 0 ? std::to_string(s.wrong) : unchecked;
}

void PrintStats(const Stats& s) {
  char time[32];
  const char* fmt = s.time_us >= 10000 ? "%7.0f" : s.time_us >= 100 ? "%7.1f" : "%7.2f";
  std::snprintf(time, sizeof(time), fmt, s.time_us);
  std::printf("  %7s  %6.2f  %6.2f", time, s.algbw, s.busbw);
  std::printf("  %5s", WrongText(s, "N/A").c_str());
}

void PrintHeader(const Options& o, int nranks, const std::vector<char>& infos, size_t slot) {
  const bool factor = o.step_factor > 1;
  std::printf(
      "# nThread 1 nGpus 1 minBytes %zu maxBytes %zu step: %zu(%s) warmup iters: %d iters: %d "
      "agg iters: 1 validation: %d graph: 0\n#\n# Using devices\n",
      o.min_bytes, o.max_bytes, factor ? o.step_factor : o.step_bytes, factor ? "factor" : "bytes",
      o.warmup, o.iters, o.check);
  for (int r = 0; r < nranks; ++r) {
    int32_t pid;
    std::memcpy(&pid, &infos[r * slot], sizeof(pid));
    std::printf("#  Rank %2d Group  0 Pid %6d on %10s device cpu\n", r, pid,
                &infos[r * slot + sizeof(pid)]);
  }
  std::printf(
      "#\n"
      "#                                                              out-of-place                "
      "       in-place\n"
      "#       size         count      type   redop    root     time   algbw   busbw #wrong     "
      "time   algbw   busbw #wrong\n"
      "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            "
      "(us)  (GB/s)  (GB/s)\n");
  std::fflush(stdout);
}

void JsonStats(FILE* f, const char* p, const Stats& s) {
  std::fprintf(f,
               ", \"%s_time_us\": %.3f, \"%s_algbw\": %.6f, \"%s_busbw\": %.6f, \"%s_wrong\": %s",
               p, s.time_us, p, s.algbw, p, s.busbw, p, WrongText(s, "null").c_str());
}

bool WriteJson(const std::string& path, const std::vector<Row>& rows) {
  FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) return false;
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    std::fprintf(
        f,
        "%s\n  {\"size\": %zu, \"count\": %zu, \"type\": \"%s\", \"redop\": \"%s\", \"root\": -1",
        i == 0 ? "[" : ",", r.size, r.count, r.type, r.op);
    JsonStats(f, "oop", r.oop);
    JsonStats(f, "ip", r.ip);
    std::fprintf(f, "}");
  }
  std::fprintf(f, "%s\n]\n", rows.empty() ? "[" : "");
  return std::fclose(f) == 0;
}

std::vector<size_t> Sizes(const Options& o) {
  std::vector<size_t> sizes;
  for (size_t s = o.min_bytes; s <= o.max_bytes;) {
    sizes.push_back(s);
    const size_t next = o.step_factor > 1 ? s * o.step_factor : s + o.step_bytes;
    if (next <= s || (o.step_factor > 1 && next / o.step_factor != s)) break;  // 0 or overflow
    s = next;
  }
  return sizes;
}

// rank < 0: a launcher started this process, and its environment says which rank it is.
int RunRank(const Options& o, int rank, int nranks) {
  g_rank = rank;
  if (rank < 0) {
    PERF_CHECK(loomCommInitFromEnv(&g_comm, nullptr));
    PERF_CHECK(loomCommUserRank(g_comm, &rank));
    PERF_CHECK(loomCommCount(g_comm, &nranks));
    g_rank = rank;
  } else {
    loomUniqueId id;
    PERF_CHECK(loomGetUniqueId(&id));
    PERF_CHECK(loomCommInitRank(&g_comm, nranks, id, rank));
  }
  loomComm_t comm = g_comm;

  // Every rank's pid and host name, gathered with an all-reduce over zeroed slots.
  constexpr size_t kSlot = 64;
  std::vector<char> infos(kSlot * nranks, 0);
  const int32_t pid = getpid();
  std::memcpy(&infos[rank * kSlot], &pid, sizeof(pid));
  gethostname(&infos[rank * kSlot + sizeof(pid)], kSlot - sizeof(pid) - 1);
  infos[rank * kSlot + kSlot - 1] = '\0';
  PERF_CHECK(
      loomAllReduce(infos.data(), infos.data(), infos.size(), loomUint8, loomSum, comm, nullptr));
  if (rank == 0) PrintHeader(o, nranks, infos, kSlot);

  void* send = AllocPrefaulted(o.max_bytes);
  void* recv = AllocPrefaulted(o.max_bytes);
  if (send == nullptr || recv == nullptr) {
    std::fprintf(stderr, "%s: rank %d: cannot allocate 2 x %zu bytes\n", kProg, rank, o.max_bytes);
    loomCommAbort(comm);
    return 1;
  }

  const Rank k{o, comm, rank, nranks, send, recv};
  std::vector<Row> rows;
  int64_t total_wrong = 0;
  double bw_sum = 0;
  int bw_count = 0;
  for (const TypeInfo* t : o.types) {
    for (const OpInfo* op : o.ops) {
      // Timed runs reduce the check pattern rather than whatever the last type left behind.
      Fill(send, o.max_bytes / t->size, *t, op->op, nranks, rank);
      for (size_t size : Sizes(o)) {
        const size_t count = size / t->size;
        Row row{count * t->size, count, t->name, op->name, {}, {}};
        for (int i = 0; i < o.warmup; ++i)
          PERF_CHECK(loomAllReduce(send, recv, count, t->type, op->op, comm, nullptr));
        row.oop = TimeAndCheck(k, *t, op->op, count, false);
        row.ip = TimeAndCheck(k, *t, op->op, count, true);
        for (const Stats* s : {&row.oop, &row.ip}) {
          total_wrong += std::max<int64_t>(s->wrong, 0);
          bw_sum += s->busbw;
          ++bw_count;
        }
        if (rank == 0) {
          std::printf("%12zu  %12zu  %8s  %6s  %6d", row.size, row.count, row.type, row.op, -1);
          PrintStats(row.oop);
          PrintStats(row.ip);
          std::printf("\n");
          std::fflush(stdout);
        }
        rows.push_back(row);
      }
    }
  }

  PERF_CHECK(loomCommFinalize(comm));
  PERF_CHECK(loomCommDestroy(comm));
  g_comm = nullptr;
  std::free(send);
  std::free(recv);

  int rc = total_wrong > 0 ? 1 : 0;
  if (rank == 0) {
    std::printf("# Out of bounds values : %lld %s\n", static_cast<long long>(total_wrong),
                total_wrong > 0 ? "FAILED" : "OK");
    std::printf("# Avg bus bandwidth    : %g \n#\n", bw_count > 0 ? bw_sum / bw_count : 0.0);
    std::fflush(stdout);
    if (!o.json_path.empty() && !WriteJson(o.json_path, rows)) {
      std::fprintf(stderr, "%s: cannot write %s: %s\n", kProg, o.json_path.c_str(),
                   std::strerror(errno));
      rc = 1;
    }
  }
  return rc;
}

// ---------------------------------------------------------------------------------------------
// The parent: starts -np ranks on this host and waits for them.

int PickLoopbackPort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  int port = -1;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0)
    port = ntohs(addr.sin_port);
  close(fd);
  return port;
}

int Launch(const Options& o) {
  const int port = PickLoopbackPort();
  if (port < 0) {
    std::fprintf(stderr, "%s: cannot find a free loopback port: %s\n", kProg, std::strerror(errno));
    return 1;
  }
  const std::string comm_id = "127.0.0.1:" + std::to_string(port);
  const pid_t parent = getpid();
  std::fflush(nullptr);
  std::vector<pid_t> pids(o.nranks, -1);
  for (int r = 0; r < o.nranks; ++r) {
    const pid_t pid = fork();
    if (pid < 0) {
      std::fprintf(stderr, "%s: fork: %s\n", kProg, std::strerror(errno));
      return 1;  // the ranks already started die with us (PR_SET_PDEATHSIG)
    }
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(1);
      // Loom reads its environment once, at its first call: set it before any.
      setenv("LOOM_COMM_ID", comm_id.c_str(), 1);
      setenv("LOOM_SOCKET_IFNAME", "lo", 0);
      const int rc = RunRank(o, r, o.nranks);
      std::fflush(nullptr);
      _exit(rc);
    }
    pids[r] = pid;
  }

  // Wait for every rank. Once one fails, the others get a grace period to fail on their own
  // (they see loomRemoteError), then are killed; so are all ranks at the deadline.
  constexpr double kGraceS = 15;
  const double start = Now();
  double kill_at = o.timeout_s > 0 ? start + o.timeout_s : HUGE_VAL;
  int running = o.nranks, rc = 0;
  bool killed = false;
  while (running > 0) {
    int status = 0;
    const pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid > 0) {
      const int r = static_cast<int>(std::find(pids.begin(), pids.end(), pid) - pids.begin());
      if (r >= o.nranks) continue;
      pids[r] = -1;
      --running;
      if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        if (!killed)
          std::fprintf(stderr, "%s: rank %d %s %d\n", kProg, r,
                       WIFEXITED(status) ? "exited with status" : "killed by signal",
                       WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
        rc = 1;
        kill_at = std::min(kill_at, Now() + kGraceS);
      }
      continue;
    }
    if (!killed && Now() >= kill_at) {
      std::fprintf(stderr, "%s: %s; killing the %d rank(s) still running\n", kProg,
                   rc != 0 ? "a rank failed" : "deadline (-T) reached", running);
      for (pid_t p : pids)
        if (p > 0) kill(p, SIGKILL);
      killed = true;
      rc = 1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return rc;
}

// ---------------------------------------------------------------------------------------------
// Flags.

[[noreturn]] void Usage(const std::string& msg) {
  std::fprintf(
      stderr,
      "%s: %s\nusage: %s [-np ranks] [-b minbytes] [-e maxbytes] [-f stepfactor | -i stepbytes]"
      " [-n iters] [-w warmup_iters] [-c 0|1] [-d type|all] [-o sum|prod|max|min|avg|all]"
      " [-z 0|1] [-T timeout_s] [-J results.json]\n",
      kProg, msg.c_str(), kProg);
  std::exit(2);
}

// Parses a non-negative integer with an optional K, M or G suffix (powers of 1024).
bool ParseSize(const char* s, size_t* out) {
  if (s == nullptr || *s == '\0' || *s == '-' || *s == '+') return false;
  char* end = nullptr;
  errno = 0;
  unsigned long long v = std::strtoull(s, &end, 10);
  if (end == s || errno != 0) return false;
  int shift = 0;
  if (*end != '\0') {
    const char c = static_cast<char>(std::toupper(static_cast<unsigned char>(*end)));
    shift = c == 'K' ? 10 : c == 'M' ? 20 : c == 'G' ? 30 : -1;
    if (shift < 0 || end[1] != '\0') return false;
  }
  if (shift > 0 && v > (~0ull >> shift)) return false;
  *out = static_cast<size_t>(v << shift);
  return true;
}

[[noreturn]] void Invalid(const std::string& flag, const std::string& value) {
  Usage("invalid value for " + flag + ": '" + value + "'");
}

int FlagInt(const std::string& flag, const char* arg, long lo, long hi) {
  char* end = nullptr;
  errno = 0;
  const long v = std::strtol(arg, &end, 10);
  if (*arg == '\0' || *end != '\0' || errno != 0 || v < lo || v > hi) Invalid(flag, arg);
  return static_cast<int>(v);
}

// Every flag takes a value: "-b 8", "-b8", "--minbytes 8" or "--minbytes=8".
Options ParseFlags(int argc, char** argv) {
  static const char* const kFlags[][2] = {
      {"-np", "--np"},        {"-b", "--minbytes"}, {"-e", "--maxbytes"},     {"-i", "--stepbytes"},
      {"-f", "--stepfactor"}, {"-n", "--iters"},    {"-w", "--warmup_iters"}, {"-c", "--check"},
      {"-d", "--datatype"},   {"-o", "--op"},       {"-z", "--blocking"},     {"-T", "--timeout"},
      {"-J", "--json"}};
  Options o;
  std::string type_name = "float", op_name = "sum";
  bool factor_set = false, step_set = false;
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i], value, key, name;
    bool has_value = false;
    if (flag.rfind("--", 0) == 0 && flag.find('=') != std::string::npos) {
      value = flag.substr(flag.find('=') + 1);
      flag.resize(flag.find('='));
      has_value = true;
    }
    for (const auto& f : kFlags)
      if (flag == f[0] || flag == f[1]) key = f[0], name = std::string(f[0]) + "/" + f[1];
    if (key.empty() && flag.size() > 2 && flag[0] == '-' && flag[1] != '-') {
      for (const auto& f : kFlags)  // a short flag with its value attached
        if (flag.compare(0, 2, f[0]) == 0 && f[0][2] == '\0')
          key = f[0], name = std::string(f[0]) + "/" + f[1], value = flag.substr(2),
          has_value = true;
    }
    if (key.empty())
      Usage(flag[0] == '-' ? "unknown flag " + flag : "unexpected argument '" + flag + "'");
    if (!has_value) {
      if (i + 1 >= argc) Usage("flag " + flag + " needs a value");
      value = argv[++i];
    }
    const char* v = value.c_str();
    if (key == "-np") {
      o.nranks = FlagInt(name, v, 1, 1024);
    } else if (key == "-b" || key == "-e" || key == "-i") {
      size_t* out = key == "-b" ? &o.min_bytes : key == "-e" ? &o.max_bytes : &o.step_bytes;
      if (!ParseSize(v, out) || (key == "-i" && *out == 0)) Invalid(name, value);
      step_set |= key == "-i";
    } else if (key == "-f") {
      o.step_factor = FlagInt(name, v, 1, 1 << 20);
      factor_set = true;
    } else if (key == "-n") {
      o.iters = FlagInt(name, v, 1, 1 << 30);
    } else if (key == "-w") {
      o.warmup = FlagInt(name, v, 0, 1 << 30);
    } else if (key == "-c") {
      o.check = FlagInt(name, v, 0, 1);
    } else if (key == "-z") {
      FlagInt(name, v, 0, 1);  // host buffers: every call already blocks
    } else if (key == "-T") {
      o.timeout_s = FlagInt(name, v, 0, 1 << 30);
    } else if (key == "-d") {
      type_name = value;
    } else if (key == "-o") {
      op_name = value;
    } else if (value.empty()) {
      Invalid(name, value);
    } else {
      o.json_path = value;
    }
  }
  // -i alone selects an additive step; with -f, a factor above 1 wins (as in nccl-tests).
  if (step_set && !factor_set) o.step_factor = 1;
  if (o.min_bytes > o.max_bytes) Usage("-b/--minbytes is larger than -e/--maxbytes");
  for (const TypeInfo& t : kTypes)
    if (type_name == "all" || type_name == t.name) o.types.push_back(&t);
  for (const Alias& a : kTypeAliases)
    if (type_name == a.name) o.types.push_back(&kTypes[a.type]);
  if (o.types.empty()) Invalid("-d/--datatype", type_name);
  for (const OpInfo& op : kOps)
    if (op_name == "all" || op_name == op.name) o.ops.push_back(&op);
  if (o.ops.empty()) Invalid("-o/--op", op_name);
  return o;
}

// Whether a launcher started this process: one of the variables loomCommInitFromEnv starts from.
bool UnderLauncher() {
  for (const char* name : {"LOOM_RANK", "LOOM_WORLD_SIZE", "RANK", "WORLD_SIZE",
                           "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "SLURM_STEP_ID"}) {
    const char* v = std::getenv(name);
    if (v != nullptr && *v != '\0') return true;
  }
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  Options o = ParseFlags(argc, argv);
  // Fail on an unwritable -J path now rather than after the run.
  if (!o.json_path.empty()) {
    FILE* f = std::fopen(o.json_path.c_str(), "a");
    if (f == nullptr) {
      std::fprintf(stderr, "%s: cannot write %s: %s\n", kProg, o.json_path.c_str(),
                   std::strerror(errno));
      return 2;
    }
    std::fclose(f);
  }
  if (UnderLauncher()) return RunRank(o, -1, 0);
  return Launch(o);
}
