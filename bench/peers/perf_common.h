// The all_reduce_perf sweep shared by the peer benchmarks (Open MPI, Gloo) that compare.sh runs
// beside loom-perf. It prints the same header, table columns and footer as bench/loom_perf.cc,
// times each size the same way (the average over ranks of each rank's time per op, after a
// barrier) and checks results with the same exact test pattern, so the tables can be merged.
//
// A peer provides a PeerComm (all-reduce, barrier) and calls RunSweep on every rank.

#pragma once

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace peerperf {

enum class Type { kUint8, kInt32, kInt64, kFloat, kDouble };
// Numbered as loomRedOp_t, so the pattern equals loom-perf's.
enum class Op { kSum = 0, kProd = 1, kMax = 2, kMin = 3 };

// `exact`: no partial result of the pattern exceeds it and every integer up to it is
// representable; `max_pow2`: the largest power of two a product may reach (as in loom-perf).
struct TypeInfo {
  Type type;
  const char* name;
  size_t size;
  bool is_signed;
  int64_t exact;
  int max_pow2;
};
constexpr TypeInfo kTypes[] = {
    {Type::kUint8, "uint8", 1, false, 254, 7},       {Type::kInt32, "int32", 4, true, 1 << 20, 30},
    {Type::kInt64, "int64", 8, true, 1 << 20, 30},   {Type::kFloat, "float", 4, true, 1 << 24, 30},
    {Type::kDouble, "double", 8, true, 1 << 24, 30},
};
struct OpInfo {
  Op op;
  const char* name;
};
constexpr OpInfo kOps[] = {{Op::kSum, "sum"}, {Op::kProd, "prod"}, {Op::kMax, "max"}, {Op::kMin, "min"}};

struct Options {
  size_t min_bytes = size_t{32} << 20, max_bytes = size_t{32} << 20;
  size_t step_factor = 2, step_bytes = size_t{1} << 20;
  int iters = 20, warmup = 5, check = 1, nranks = 2, timeout_s = 1800;
  std::vector<const TypeInfo*> types;
  std::vector<const OpInfo*> ops;
};

// What a peer library provides. send == recv means in place.
class PeerComm {
 public:
  virtual ~PeerComm() = default;
  virtual void AllReduce(const void* send, void* recv, size_t count, const TypeInfo& t, Op op) = 0;
  virtual void Barrier() = 0;
};

// ---------------------------------------------------------------------------------------------
// The check pattern (loom-perf's, for these types and ops).

inline void Store(void* buf, size_t i, const TypeInfo& t, double v) {
  switch (t.type) {
    case Type::kUint8: static_cast<uint8_t*>(buf)[i] = static_cast<uint8_t>(v); break;
    case Type::kInt32: static_cast<int32_t*>(buf)[i] = static_cast<int32_t>(v); break;
    case Type::kInt64: static_cast<int64_t*>(buf)[i] = static_cast<int64_t>(v); break;
    case Type::kFloat: static_cast<float*>(buf)[i] = static_cast<float>(v); break;
    case Type::kDouble: static_cast<double*>(buf)[i] = v; break;
  }
}

inline double Load(const void* buf, size_t i, const TypeInfo& t) {
  switch (t.type) {
    case Type::kUint8: return static_cast<const uint8_t*>(buf)[i];
    case Type::kInt32: return static_cast<const int32_t*>(buf)[i];
    case Type::kInt64: return static_cast<double>(static_cast<const int64_t*>(buf)[i]);
    case Type::kFloat: return static_cast<const float*>(buf)[i];
    case Type::kDouble: return static_cast<const double*>(buf)[i];
  }
  return NAN;
}

inline uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

inline double Draw(uint64_t h, int64_t k, bool is_signed) {
  if (k <= 0) return 0;
  if (is_signed) return static_cast<double>(static_cast<int64_t>(h % (2 * k + 1)) - k);
  return static_cast<double>(h % (k + 1));
}

inline double Input(const TypeInfo& t, Op op, int nranks, int rank, size_t i) {
  const uint64_t h = Mix((uint64_t{i} << 12) ^ (uint64_t(rank) << 4) ^ uint64_t(op));
  if (op == Op::kSum) {
    const int64_t k = t.exact / nranks;
    if (k > 0) return Draw(h, k, t.is_signed);
    return i % nranks == static_cast<size_t>(rank) ? Draw(h, t.exact, t.is_signed) : 0;
  }
  if (op == Op::kProd) {
    const double v = rank < t.max_pow2 && (h & 1) ? 2 : 1;
    return t.is_signed && (h & 2) ? -v : v;
  }
  return Draw(h, t.exact, t.is_signed);
}

inline double Expected(const TypeInfo& t, Op op, int nranks, size_t i) {
  double acc = Input(t, op, nranks, 0, i);
  for (int r = 1; r < nranks; ++r) {
    const double v = Input(t, op, nranks, r, i);
    acc = op == Op::kProd ? acc * v : op == Op::kMax ? std::max(acc, v)
        : op == Op::kMin  ? std::min(acc, v) : acc + v;
  }
  return acc;
}

inline void Fill(void* buf, size_t count, const TypeInfo& t, Op op, int nranks, int rank) {
  for (size_t i = 0; i < count; ++i) Store(buf, i, t, Input(t, op, nranks, rank, i));
}

// A value no expected result takes: NaN, or the integer types' most negative / largest value.
inline void FillJunk(void* buf, size_t count, const TypeInfo& t) {
  if (t.type == Type::kFloat || t.type == Type::kDouble) {
    for (size_t i = 0; i < count; ++i) Store(buf, i, t, NAN);
  } else if (t.type == Type::kUint8) {
    std::memset(buf, 0xff, count);
  } else {
    for (size_t i = 0; i < count; ++i) Store(buf, i, t, -static_cast<double>(1u << 31));
  }
}

inline int64_t CountWrong(const void* buf, size_t count, const TypeInfo& t, Op op, int nranks) {
  int64_t wrong = 0;
  for (size_t i = 0; i < count; ++i)
    if (!(Load(buf, i, t) == Expected(t, op, nranks, i))) ++wrong;
  return wrong;
}

// ---------------------------------------------------------------------------------------------
// The sweep.

struct Stats {
  double time_us = 0, algbw = 0, busbw = 0;
  int64_t wrong = -1;  // -1: not checked
};

inline double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

inline const TypeInfo& TypeOf(Type ty) {
  for (const TypeInfo& t : kTypes)
    if (t.type == ty) return t;
  return kTypes[0];
}

inline Stats TimeAndCheck(PeerComm& c, const Options& o, int rank, int nranks, void* sendbuf,
                          void* recv, const TypeInfo& t, Op op, size_t count, bool in_place) {
  void* send = in_place ? recv : sendbuf;
  c.Barrier();
  const double start = Now();
  for (int i = 0; i < o.iters; ++i) c.AllReduce(send, recv, count, t, op);
  double sec = (Now() - start) / o.iters, sum = 0;
  c.AllReduce(&sec, &sum, 1, TypeOf(Type::kDouble), Op::kSum);
  sec = sum / nranks;
  Stats s;
  s.time_us = sec * 1e6;
  s.algbw = sec > 0 ? static_cast<double>(count * t.size) / sec / 1e9 : 0;
  s.busbw = s.algbw * 2 * (nranks - 1) / nranks;
  if (o.check) {
    Fill(send, count, t, op, nranks, rank);
    if (!in_place) FillJunk(recv, count, t);
    c.AllReduce(send, recv, count, t, op);
    int64_t wrong = CountWrong(recv, count, t, op, nranks);
    c.AllReduce(&wrong, &s.wrong, 1, TypeOf(Type::kInt64), Op::kSum);
  }
  return s;
}

inline void* AllocPrefaulted(size_t bytes) {
  const size_t page = 4096;
  bytes = std::max(page, (bytes + page - 1) / page * page);
  void* p = nullptr;
  if (posix_memalign(&p, page, bytes) != 0) return nullptr;
  std::memset(p, 0, bytes);  // touches every page before any timing
  return p;
}

inline void PrintStats(const Stats& s) {
  char time[32];
  const char* fmt = s.time_us >= 10000 ? "%7.0f" : s.time_us >= 100 ? "%7.1f" : "%7.2f";
  std::snprintf(time, sizeof(time), fmt, s.time_us);
  std::printf("  %7s  %6.2f  %6.2f", time, s.algbw, s.busbw);
  std::printf("  %5s", s.wrong >= 0 ? std::to_string(s.wrong).c_str() : "N/A");
}

inline std::vector<size_t> Sizes(const Options& o) {
  std::vector<size_t> sizes;
  for (size_t s = o.min_bytes; s <= o.max_bytes;) {
    sizes.push_back(s);
    const size_t next = o.step_factor > 1 ? s * o.step_factor : s + o.step_bytes;
    if (next <= s || (o.step_factor > 1 && next / o.step_factor != s)) break;
    s = next;
  }
  return sizes;
}

// Runs the sweep on one rank; rank 0 prints. `peer` names the library in the header. Returns the
// exit status (1 when a result was wrong). Errors of the peer library are its own (abort/throw).
inline int RunSweep(PeerComm& c, const Options& o, int rank, int nranks, const char* peer) {
  // Every rank's pid and host name, gathered with a byte-wise sum over zeroed slots.
  constexpr size_t kSlot = 64;
  std::vector<char> infos(kSlot * nranks, 0);
  const int32_t pid = getpid();
  std::memcpy(&infos[rank * kSlot], &pid, sizeof(pid));
  gethostname(&infos[rank * kSlot + sizeof(pid)], kSlot - sizeof(pid) - 1);
  infos[rank * kSlot + kSlot - 1] = '\0';
  c.AllReduce(infos.data(), infos.data(), infos.size(), TypeOf(Type::kUint8), Op::kSum);
  if (rank == 0) {
    const bool factor = o.step_factor > 1;
    std::printf(
        "# %s\n# nThread 1 nGpus 1 minBytes %zu maxBytes %zu step: %zu(%s) warmup iters: %d "
        "iters: %d agg iters: 1 validation: %d graph: 0\n#\n# Using devices\n",
        peer, o.min_bytes, o.max_bytes, factor ? o.step_factor : o.step_bytes,
        factor ? "factor" : "bytes", o.warmup, o.iters, o.check);
    for (int r = 0; r < nranks; ++r) {
      int32_t p;
      std::memcpy(&p, &infos[r * kSlot], sizeof(p));
      std::printf("#  Rank %2d Group  0 Pid %6d on %10s device cpu\n", r, p,
                  &infos[r * kSlot + sizeof(p)]);
    }
    std::printf(
        "#\n"
        "#                                                              out-of-place              "
        "         in-place\n"
        "#       size         count      type   redop    root     time   algbw   busbw #wrong     "
        "time   algbw   busbw #wrong\n"
        "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            "
        "(us)  (GB/s)  (GB/s)\n");
    std::fflush(stdout);
  }

  void* send = AllocPrefaulted(o.max_bytes);
  void* recv = AllocPrefaulted(o.max_bytes);
  if (send == nullptr || recv == nullptr) {
    std::fprintf(stderr, "rank %d: cannot allocate 2 x %zu bytes\n", rank, o.max_bytes);
    return 1;
  }
  int64_t total_wrong = 0;
  double bw_sum = 0;
  int bw_count = 0;
  for (const TypeInfo* t : o.types) {
    for (const OpInfo* op : o.ops) {
      Fill(send, o.max_bytes / t->size, *t, op->op, nranks, rank);
      for (size_t size : Sizes(o)) {
        const size_t count = size / t->size;
        for (int i = 0; i < o.warmup; ++i) c.AllReduce(send, recv, count, *t, op->op);
        const Stats oop = TimeAndCheck(c, o, rank, nranks, send, recv, *t, op->op, count, false);
        const Stats ip = TimeAndCheck(c, o, rank, nranks, send, recv, *t, op->op, count, true);
        for (const Stats* s : {&oop, &ip}) {
          total_wrong += std::max<int64_t>(s->wrong, 0);
          bw_sum += s->busbw;
          ++bw_count;
        }
        if (rank == 0) {
          std::printf("%12zu  %12zu  %8s  %6s  %6d", count * t->size, count, t->name, op->name, -1);
          PrintStats(oop);
          PrintStats(ip);
          std::printf("\n");
          std::fflush(stdout);
        }
      }
    }
  }
  std::free(send);
  std::free(recv);
  if (rank == 0) {
    std::printf("# Out of bounds values : %lld %s\n", static_cast<long long>(total_wrong),
                total_wrong > 0 ? "FAILED" : "OK");
    std::printf("# Avg bus bandwidth    : %g \n#\n", bw_count > 0 ? bw_sum / bw_count : 0.0);
    std::fflush(stdout);
  }
  return total_wrong > 0 ? 1 : 0;
}

// ---------------------------------------------------------------------------------------------
// Flags: -b -e -f -i -n -w -c -d -o (as loom-perf), plus -np and -T where the peer self-launches.

[[noreturn]] inline void Usage(const char* prog, const std::string& msg, bool launches) {
  std::fprintf(stderr,
               "%s: %s\nusage: %s %s[-b minbytes] [-e maxbytes] [-f stepfactor | -i stepbytes] "
               "[-n iters] [-w warmup_iters] [-c 0|1] [-d float|double|int32|int64|uint8|all] "
               "[-o sum|prod|max|min|all]\n",
               prog, msg.c_str(), prog, launches ? "[-np ranks] [-T timeout_s] " : "");
  std::exit(2);
}

// A non-negative integer with an optional K, M or G suffix (powers of 1024).
inline bool ParseSize(const char* s, size_t* out) {
  if (s == nullptr || *s == '\0' || *s == '-' || *s == '+') return false;
  char* end = nullptr;
  errno = 0;
  const unsigned long long v = std::strtoull(s, &end, 10);
  if (end == s || errno != 0) return false;
  int shift = 0;
  if (*end != '\0') {
    const char u = static_cast<char>(*end & ~0x20);
    shift = u == 'K' ? 10 : u == 'M' ? 20 : u == 'G' ? 30 : -1;
    if (shift < 0 || end[1] != '\0' || v > (~0ull >> shift)) return false;
  }
  *out = static_cast<size_t>(v << shift);
  return true;
}

inline Options ParseFlags(int argc, char** argv, const char* prog, bool launches) {
  Options o;
  std::string type_name = "float", op_name = "sum";
  bool factor_set = false, step_set = false;
  auto number = [&](const std::string& flag, const char* v, long lo, long hi) {
    char* end = nullptr;
    errno = 0;
    const long n = std::strtol(v, &end, 10);
    if (*v == '\0' || *end != '\0' || errno != 0 || n < lo || n > hi)
      Usage(prog, "invalid value for " + flag + ": '" + v + "'", launches);
    return static_cast<int>(n);
  };
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) Usage(prog, "flag " + flag + " needs a value", launches);
    const char* v = argv[++i];
    if (flag == "-b" || flag == "-e" || flag == "-i") {
      size_t* out = flag == "-b" ? &o.min_bytes : flag == "-e" ? &o.max_bytes : &o.step_bytes;
      if (!ParseSize(v, out) || (flag == "-i" && *out == 0))
        Usage(prog, "invalid value for " + flag + ": '" + v + "'", launches);
      step_set |= flag == "-i";
    } else if (flag == "-f") {
      o.step_factor = number(flag, v, 1, 1 << 20);
      factor_set = true;
    } else if (flag == "-n") {
      o.iters = number(flag, v, 1, 1 << 30);
    } else if (flag == "-w") {
      o.warmup = number(flag, v, 0, 1 << 30);
    } else if (flag == "-c") {
      o.check = number(flag, v, 0, 1);
    } else if (flag == "-d") {
      type_name = v;
    } else if (flag == "-o") {
      op_name = v;
    } else if (launches && flag == "-np") {
      o.nranks = number(flag, v, 1, 1024);
    } else if (launches && flag == "-T") {
      o.timeout_s = number(flag, v, 0, 1 << 30);
    } else {
      Usage(prog, "unknown flag " + flag, launches);
    }
  }
  if (step_set && !factor_set) o.step_factor = 1;
  if (o.min_bytes > o.max_bytes) Usage(prog, "-b is larger than -e", launches);
  if (type_name == "float32") type_name = "float";
  if (type_name == "float64") type_name = "double";
  if (type_name == "int") type_name = "int32";
  for (const TypeInfo& t : kTypes)
    if (type_name == "all" || type_name == t.name) o.types.push_back(&t);
  for (const OpInfo& op : kOps)
    if (op_name == "all" || op_name == op.name) o.ops.push_back(&op);
  if (o.types.empty()) Usage(prog, "invalid value for -d: '" + type_name + "'", launches);
  if (o.ops.empty()) Usage(prog, "invalid value for -o: '" + op_name + "'", launches);
  return o;
}

}  // namespace peerperf
