#include "perf.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "util/log.h"

namespace perf {

const CollInfo kColls[9] = {
    {Coll::kAllReduce, "all_reduce", true, false, true},
    {Coll::kAllGather, "all_gather", false, false, true},
    {Coll::kReduceScatter, "reduce_scatter", true, false, true},
    {Coll::kBroadcast, "broadcast", false, true, true},
    {Coll::kReduce, "reduce", true, true, true},
    {Coll::kAllToAll, "alltoall", false, false, false},
    {Coll::kSendRecv, "sendrecv", false, false, false},
    {Coll::kGather, "gather", false, true, true},
    {Coll::kScatter, "scatter", false, true, true},
};

const CollInfo& InfoOf(Coll c) { return kColls[static_cast<int>(c)]; }

double BusFactor(Coll c, int n) {
  switch (c) {
    case Coll::kAllReduce:
      return 2.0 * (n - 1) / n;
    case Coll::kAllGather:
    case Coll::kReduceScatter:
    case Coll::kAllToAll:
    case Coll::kGather:
    case Coll::kScatter:
      return static_cast<double>(n - 1) / n;
    default:
      return 1;
  }
}

namespace {
// Encodings of the small float formats, coded here independently of Loom's kernels.
constexpr FloatFormat kHalfFmt = {5, 10, true};
constexpr FloatFormat kBf16Fmt = {8, 7, true};
constexpr FloatFormat kE4m3Fmt = {4, 3, false};
constexpr FloatFormat kE5m2Fmt = {5, 2, true};
}  // namespace

const TypeInfo kTypes[12] = {
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

const TypeInfo& TypeOf(loomDataType_t t) { return kTypes[t]; }

const OpInfo kOps[5] = {
    {loomSum, "sum"}, {loomProd, "prod"}, {loomMax, "max"}, {loomMin, "min"}, {loomAvg, "avg"}};

namespace {

// ---------------------------------------------------------------------------------------------
// Element access: little-endian bit patterns of t.size bytes.

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
    bits = static_cast<uint64_t>(static_cast<int64_t>(v));  // truncated to t.size below
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
// in any reduction order, is exact in the type.

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

// Rank `rank`'s input element i for a reduction with `op`. Collectives that do not reduce use
// the max pattern (the full range of the type).
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
      const double v = rank < t.max_pow2 && (h & 1) ? 2 : 1;
      return t.is_signed() && (h & 2) ? -v : v;
    }
    case loomAvg: {
      // The same base on every rank plus +1/-1 pairs that cancel: the sum is nranks * base and
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

double Reduced(const TypeInfo& t, loomRedOp_t op, int nranks, size_t i) {
  double acc = Input(t, op, nranks, 0, i);
  for (int r = 1; r < nranks; ++r) {
    const double v = Input(t, op, nranks, r, i);
    acc = op == loomProd  ? acc * v
          : op == loomMax ? std::max(acc, v)
          : op == loomMin ? std::min(acc, v)
                          : acc + v;
  }
  return op == loomAvg ? acc / nranks : acc;
}

// Fills buf with a value no expected result takes: NaN, the unsigned maximum (above `exact`),
// or the signed minimum (below -exact).
void FillJunk(void* buf, size_t count, const TypeInfo& t) {
  const uint64_t bits = t.kind == Kind::kInt ? uint64_t{1} << (8 * t.size - 1) : ~uint64_t{0};
  for (size_t i = 0; i < count; ++i)
    std::memcpy(static_cast<char*>(buf) + i * t.size, &bits, t.size);
}

// One size of one collective on this rank: the buffers' element counts and the C call's count.
struct Shape {
  size_t call;   // the count argument
  size_t sends;  // elements of the send buffer
  size_t recvs;  // elements of the receive buffer
  size_t total;  // the row's count (elements of the larger buffer)
};

Shape ShapeOf(Coll c, size_t elems, int n) {
  const size_t un = static_cast<size_t>(n);
  switch (c) {
    case Coll::kAllGather:
    case Coll::kGather:
      return {elems / un, elems / un, elems / un * un, elems / un * un};
    case Coll::kReduceScatter:
    case Coll::kScatter:
      return {elems / un, elems / un * un, elems / un, elems / un * un};
    case Coll::kAllToAll:
      return {elems / un, elems / un * un, elems / un * un, elems / un * un};
    default:
      return {elems, elems, elems, elems};
  }
}

// The operands of one run: where the C call's buffers are for in-place and out-of-place.
struct Operands {
  char* send;
  char* recv;
};

Operands OperandsOf(Coll c, const Shape& s, size_t esize, int rank, bool in_place, char* send,
                    char* recv) {
  if (!in_place) return {send, recv};
  switch (c) {
    case Coll::kAllGather:
    case Coll::kGather:
      return {recv + rank * s.call * esize, recv};
    case Coll::kReduceScatter:
    case Coll::kScatter:
      return {send, send + rank * s.call * esize};
    default:
      return {recv, recv};
  }
}

loomRedOp_t PatternOp(Coll c, loomRedOp_t op) { return InfoOf(c).reduces ? op : loomMax; }

// Writes this rank's input into the send operand.
void FillInput(Coll c, const Shape& s, const TypeInfo& t, loomRedOp_t op, int n, int rank, int root,
               void* send) {
  if ((c == Coll::kBroadcast || c == Coll::kScatter) && rank != root) return;
  const loomRedOp_t pop = PatternOp(c, op);
  for (size_t i = 0; i < s.sends; ++i) Store(send, i, t, Input(t, pop, n, rank, i));
}

// Counts the elements of recv that differ from what the collective defines.
int64_t CountWrong(Coll c, const Shape& s, const TypeInfo& t, loomRedOp_t op, int n, int rank,
                   int root, const void* recv) {
  const loomRedOp_t pop = PatternOp(c, op);
  int64_t wrong = 0;
  auto expect = [&](size_t i, double v) { wrong += !(Load(recv, i, t) == v); };
  switch (c) {
    case Coll::kAllReduce:
      for (size_t i = 0; i < s.recvs; ++i) expect(i, Reduced(t, op, n, i));
      break;
    case Coll::kReduce:
      if (rank == root)
        for (size_t i = 0; i < s.recvs; ++i) expect(i, Reduced(t, op, n, i));
      break;
    case Coll::kReduceScatter:
      for (size_t i = 0; i < s.recvs; ++i) expect(i, Reduced(t, op, n, rank * s.call + i));
      break;
    case Coll::kAllGather:
      for (size_t i = 0; i < s.recvs; ++i)
        expect(i, Input(t, pop, n, static_cast<int>(i / s.call), i % s.call));
      break;
    case Coll::kBroadcast:
      for (size_t i = 0; i < s.recvs; ++i) expect(i, Input(t, pop, n, root, i));
      break;
    case Coll::kAllToAll:
      for (size_t i = 0; i < s.recvs; ++i)
        expect(i, Input(t, pop, n, static_cast<int>(i / s.call), rank * s.call + i % s.call));
      break;
    case Coll::kSendRecv:
      for (size_t i = 0; i < s.recvs; ++i) expect(i, Input(t, pop, n, (rank + n - 1) % n, i));
      break;
    case Coll::kGather:
      for (size_t i = 0; i < s.recvs && rank == root; ++i)
        expect(i, Input(t, pop, n, static_cast<int>(i / s.call), i % s.call));
      break;
    case Coll::kScatter:
      for (size_t i = 0; i < s.recvs; ++i) expect(i, Input(t, pop, n, root, rank * s.call + i));
      break;
  }
  return wrong;
}

struct Row {
  size_t size, count;
  const char* type;
  const char* op;
  int root;
  Stats oop, ip;
};

// What one rank runs: its backend, buffers and the sweep's options.
struct Ctx {
  Backend& b;
  const Options& o;
  int rank, nranks;
  char* send;
  char* recv;
  char* dsend;  // -G 1: the device buffers the calls use (send and recv hold the host copies)
  char* drecv;
  std::vector<double> arrivals;  // -I: nranks x iters entry times, zero but for this rank's row
};

double SumOver(Backend& b, double v, loomRedOp_t op) {
  double out = 0;
  b.Run(Coll::kAllReduce, &v, &out, 1, TypeOf(loomDouble), op, 0);
  return out;
}

void RunOnce(Backend& b, const Options& o, Coll c, const Operands& ops, const Shape& s,
             const TypeInfo& t, loomRedOp_t op, int root) {
  if (o.agg > 1) b.GroupStart();
  for (int a = 0; a < o.agg; ++a) b.Run(c, ops.send, ops.recv, s.call, t, op, root);
  if (o.agg > 1) b.GroupEnd();
}

// Times one size (each rank's time per operation, combined over ranks as -a says), then checks
// o.check runs of the test pattern.
Stats TimeAndCheck(Ctx& k, Coll c, const Shape& s, const TypeInfo& t, loomRedOp_t op, int root,
                   bool in_place) {
  Stats st;
  if ((in_place && !InfoOf(c).in_place) || !k.b.Supports(c, t, op)) return st;
  st.ran = true;
  const Options& o = k.o;
  const Operands ops = OperandsOf(c, s, t.size, k.rank, in_place, k.send, k.recv);
  const Operands run = o.gpu ? OperandsOf(c, s, t.size, k.rank, in_place, k.dsend, k.drecv) : ops;
  const bool skew = o.skew != 0 && k.nranks > 1;
  if (skew) std::fill(k.arrivals.begin(), k.arrivals.end(), 0.0);
  k.b.Sync();
  k.b.Barrier();
  const double start = Now();
  for (int i = 0; i < o.iters; ++i) {
    if (skew) k.arrivals[static_cast<size_t>(k.rank) * o.iters + i] = Now() - start;
    RunOnce(k.b, o, c, run, s, t, op, root);
  }
  k.b.Sync();
  const double sec = (Now() - start) / (o.iters * o.agg);
  double combined = sec;
  switch (o.average) {
    case Average::kRank0:
      combined = SumOver(k.b, k.rank == 0 ? sec : 0, loomSum);
      break;
    case Average::kMean:
      combined = SumOver(k.b, sec, loomSum) / k.nranks;
      break;
    case Average::kMin:
      combined = SumOver(k.b, sec, loomMin);
      break;
    case Average::kMax:
      combined = SumOver(k.b, sec, loomMax);
      break;
  }
  st.time_us = combined * 1e6;
  const double bytes = static_cast<double>(s.total * t.size);
  st.algbw = combined > 0 ? bytes / combined / 1e9 : 0;
  st.busbw = st.algbw * BusFactor(c, k.nranks);
  if (skew) {
    // Entry times are on each rank's steady clock from its own start after the barrier: skew
    // within one host, where that clock is shared, up to the barrier's own exit skew.
    k.b.Run(Coll::kAllReduce, k.arrivals.data(), k.arrivals.data(), k.arrivals.size(),
            TypeOf(loomDouble), loomSum, 0);
    std::vector<int> last(k.nranks, 0);
    st.skew_us = 0;
    for (int i = 0; i < o.iters; ++i) {
      double lo = HUGE_VAL, hi = -HUGE_VAL;
      int who = 0;
      for (int r = 0; r < k.nranks; ++r) {
        const double v = k.arrivals[static_cast<size_t>(r) * o.iters + i];
        lo = std::min(lo, v);
        if (v > hi) hi = v, who = r;
      }
      st.skew_us = std::max(st.skew_us, (hi - lo) * 1e6);
      ++last[who];
    }
    st.last = static_cast<int>(std::max_element(last.begin(), last.end()) - last.begin());
    st.last_share = static_cast<double>(last[st.last]) / o.iters;
  }
  if (o.check > 0) {
    int64_t wrong = 0;
    for (int i = 0; i < o.check; ++i) {
      // Junk first: a collective that leaves its output untouched is caught, in place too.
      FillJunk(ops.recv, s.recvs, t);
      FillInput(c, s, t, op, k.nranks, k.rank, root, ops.send);
      if (o.gpu) {  // the host buffers' contents to the device, run there, and back
        const size_t bytes = s.total * t.size;
        k.b.CopyToDevice(k.dsend, k.send, bytes);
        k.b.CopyToDevice(k.drecv, k.recv, bytes);
        k.b.Run(c, run.send, run.recv, s.call, t, op, root);
        k.b.Sync();
        k.b.CopyToHost(k.recv, k.drecv, bytes);
      } else {
        k.b.Run(c, ops.send, ops.recv, s.call, t, op, root);
      }
      wrong += CountWrong(c, s, t, op, k.nranks, k.rank, root, ops.recv);
    }
    k.b.Run(Coll::kAllReduce, &wrong, &st.wrong, 1, TypeOf(loomInt64), loomSum, 0);
  }
  return st;
}

std::string WrongText(const Stats& s, const char* unchecked) {
  return s.wrong >= 0 ? std::to_string(s.wrong) : unchecked;
}

void PrintStats(const Stats& s, bool skew) {
  if (!s.ran) {
    std::printf("  %7s  %6s  %6s  %5s", "N/A", "N/A", "N/A", "N/A");
    if (skew) std::printf("  %8s  %9s", "N/A", "N/A");
    return;
  }
  char time[32];
  const char* fmt = s.time_us >= 10000 ? "%7.0f" : s.time_us >= 100 ? "%7.1f" : "%7.2f";
  std::snprintf(time, sizeof(time), fmt, s.time_us);
  std::printf("  %7s  %6.2f  %6.2f  %5s", time, s.algbw, s.busbw, WrongText(s, "N/A").c_str());
  if (skew) {
    char last[32] = "-";
    if (s.last >= 0) std::snprintf(last, sizeof(last), "%d(%2.0f%%)", s.last, s.last_share * 100);
    std::printf("  %8.2f  %9s", std::max(s.skew_us, 0.0), last);
  }
}

void PrintHeader(const Options& o, const CollInfo& c, int nranks, const std::vector<char>& infos,
                 size_t slot, const std::string& title) {
  const bool factor = o.step_factor > 1;
  std::printf(
      "# %s: %s\n# nThread 1 nGpus 1 minBytes %zu maxBytes %zu step: %zu(%s) warmup iters: %d "
      "iters: %d agg iters: %d validation: %d graph: 0%s\n#\n# Using devices\n",
      title.c_str(), c.name, o.min_bytes, o.max_bytes, factor ? o.step_factor : o.step_bytes,
      factor ? "factor" : "bytes", o.warmup, o.iters, o.agg, o.check,
      o.reg ? " registered: 1" : "");
  for (int r = 0; r < nranks; ++r) {
    int32_t pid;
    std::memcpy(&pid, &infos[r * slot], sizeof(pid));
    std::printf("#  Rank %2d Group  0 Pid %6d on %10s device cpu\n", r, pid,
                &infos[r * slot + sizeof(pid)]);
  }
  std::printf("#\n");
  PrintColumns(o.skew != 0);
}

}  // namespace

void PrintColumns(bool skew) {
  const char* side = skew ? "                   " : "";
  std::printf(
      "# %10s  %12s  %8s  %6s  %6s           out-of-place%s                       "
      "in-place\n",
      "", "", "", "", "", side);
  std::printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s %6s", "size", "count", "type", "redop",
              "root", "time", "algbw", "busbw", "#wrong");
  if (skew) std::printf("  %8s  %9s", "maxskew", "last");
  std::printf("  %7s  %6s  %6s %6s", "time", "algbw", "busbw", "#wrong");
  if (skew) std::printf("  %8s  %9s", "maxskew", "last");
  std::printf("\n# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %5s", "(B)", "(elements)", "", "", "",
              "(us)", "(GB/s)", "(GB/s)", "");
  if (skew) std::printf("  %8s  %9s", "(us)", "rank");
  std::printf("  %7s  %6s  %6s  %5s", "(us)", "(GB/s)", "(GB/s)", "");
  if (skew) std::printf("  %8s  %9s", "(us)", "rank");
  std::printf("\n");
  std::fflush(stdout);
}

void PrintRow(size_t size, size_t count, const char* type, const char* op, int root,
              const Stats& oop, const Stats& ip, bool skew) {
  std::printf("%12zu  %12zu  %8s  %6s  %6d", size, count, type, op, root);
  PrintStats(oop, skew);
  PrintStats(ip, skew);
  std::printf("\n");
  std::fflush(stdout);
}

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

namespace {

void JsonStats(FILE* f, const char* p, const Stats& s) {
  if (!s.ran) {
    std::fprintf(f, ", \"%s_time_us\": null", p);
    return;
  }
  std::fprintf(f,
               ", \"%s_time_us\": %.3f, \"%s_algbw\": %.6f, \"%s_busbw\": %.6f, \"%s_wrong\": %s",
               p, s.time_us, p, s.algbw, p, s.busbw, p, WrongText(s, "null").c_str());
  if (s.skew_us >= 0)
    std::fprintf(f, ", \"%s_maxskew_us\": %.3f, \"%s_last_rank\": %d", p, s.skew_us, p, s.last);
}

bool WriteJson(const std::string& path, const std::vector<std::pair<const char*, Row>>& rows,
               const std::string& title, int nranks) {
  FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) return false;
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i].second;
    std::fprintf(f,
                 "%s\n  {\"library\": \"%s\", \"collective\": \"%s\", \"nranks\": %d, \"size\": "
                 "%zu, \"count\": %zu, \"type\": \"%s\", \"redop\": \"%s\", \"root\": %d",
                 i == 0 ? "[" : ",", title.c_str(), rows[i].first, nranks, r.size, r.count, r.type,
                 r.op, r.root);
    JsonStats(f, "oop", r.oop);
    JsonStats(f, "ip", r.ip);
    std::fprintf(f, "}");
  }
  std::fprintf(f, "%s\n]\n", rows.empty() ? "[" : "");
  return std::fclose(f) == 0;
}

}  // namespace

void* AllocPrefaulted(size_t bytes) {
  const size_t page = 4096;
  bytes = std::max(page, (bytes + page - 1) / page * page);
  void* p = nullptr;
  if (posix_memalign(&p, page, bytes) != 0) return nullptr;
  std::memset(p, 0, bytes);  // touches every page before any timing
  return p;
}

int RunSweep(Backend& b, const Options& o, int rank, int nranks, const std::string& title) {
  // Checked here: a launcher's rank count is known only now. A run of unrooted collectives
  // ignores the root, as nccl-tests does.
  const bool rooted =
      std::any_of(o.colls.begin(), o.colls.end(), [](const CollInfo* ci) { return ci->rooted; });
  if (rooted && o.root >= nranks) {
    if (rank == 0)
      std::fprintf(stderr, "-r/--root: %d is not a rank of this run (ranks 0 to %d)\n", o.root,
                   nranks - 1);
    return 2;
  }
  // Every rank's pid and host name, gathered with a byte-wise sum over zeroed slots.
  constexpr size_t kSlot = 64;
  std::vector<char> infos(kSlot * nranks, 0);
  const int32_t pid = getpid();
  std::memcpy(&infos[rank * kSlot], &pid, sizeof(pid));
  gethostname(&infos[rank * kSlot + sizeof(pid)], kSlot - sizeof(pid) - 1);
  infos[rank * kSlot + kSlot - 1] = '\0';
  b.Run(Coll::kAllReduce, infos.data(), infos.data(), infos.size(), TypeOf(loomUint8), loomSum, 0);

  auto alloc = [&](size_t bytes) {
    return static_cast<char*>(o.reg ? b.Alloc(bytes) : AllocPrefaulted(bytes));
  };
  char* send = alloc(o.max_bytes);
  char* recv = alloc(o.max_bytes);
  if (send == nullptr || recv == nullptr) {
    std::fprintf(stderr, "rank %d: cannot allocate 2 x %zu bytes%s\n", rank, o.max_bytes,
                 o.reg ? " with the library's allocator (-R 1)" : "");
    return 1;
  }
  char* dsend = nullptr;
  char* drecv = nullptr;
  if (o.gpu) {
    dsend = static_cast<char*>(b.DeviceAlloc(o.max_bytes));
    drecv = static_cast<char*>(b.DeviceAlloc(o.max_bytes));
    if (dsend == nullptr || drecv == nullptr) {
      std::fprintf(stderr, "rank %d: cannot allocate 2 x %zu bytes of device memory (-G 1)\n", rank,
                   o.max_bytes);
      return 1;
    }
  }
  Ctx k{b, o, rank, nranks, send, recv, dsend, drecv, {}};
  if (o.skew) k.arrivals.assign(static_cast<size_t>(nranks) * o.iters, 0.0);

  std::vector<std::pair<const char*, Row>> rows;
  int64_t total_wrong = 0;
  double bw_sum = 0;
  int bw_count = 0;
  for (const CollInfo* ci : o.colls) {
    const Coll c = ci->coll;
    if (rank == 0) PrintHeader(o, *ci, nranks, infos, kSlot, title);
    std::vector<int> roots;
    if (!ci->rooted)
      roots.push_back(-1);
    else if (o.root >= 0)
      roots.push_back(o.root);
    else
      for (int r = 0; r < nranks; ++r) roots.push_back(r);
    static const OpInfo kNoOp = {loomSum, "none"};
    std::vector<const OpInfo*> ops = ci->reduces ? o.ops : std::vector<const OpInfo*>{&kNoOp};
    for (const TypeInfo* t : o.types) {
      for (const OpInfo* op : ops) {
        for (int root : roots) {
          // Timed runs move the check pattern rather than whatever the last type left behind.
          const Shape full = ShapeOf(c, o.max_bytes / t->size, nranks);
          FillInput(c, full, *t, op->op, nranks, rank, std::max(root, 0), send);
          if (o.gpu) b.CopyToDevice(dsend, send, full.total * t->size);
          for (size_t size : Sizes(o)) {
            const Shape s = ShapeOf(c, size / t->size, nranks);
            const Operands w =
                OperandsOf(c, s, t->size, rank, false, o.gpu ? dsend : send, o.gpu ? drecv : recv);
            if (b.Supports(c, *t, op->op))
              for (int i = 0; i < o.warmup; ++i)
                RunOnce(b, o, c, w, s, *t, op->op, std::max(root, 0));
            Row row{s.total * t->size, s.total, t->name, op->name, root, {}, {}};
            row.oop = TimeAndCheck(k, c, s, *t, op->op, std::max(root, 0), false);
            row.ip = TimeAndCheck(k, c, s, *t, op->op, std::max(root, 0), true);
            for (const Stats* st : {&row.oop, &row.ip}) {
              if (!st->ran) continue;
              total_wrong += std::max<int64_t>(st->wrong, 0);
              bw_sum += st->busbw;
              ++bw_count;
            }
            if (rank == 0)
              PrintRow(row.size, row.count, row.type, row.op, root, row.oop, row.ip, o.skew != 0);
            rows.emplace_back(ci->name, row);
          }
        }
      }
    }
    if (rank == 0 && o.colls.size() > 1) std::printf("#\n");
  }
  if (o.gpu) {
    b.DeviceFree(dsend);
    b.DeviceFree(drecv);
  }
  if (o.reg) {
    b.Free(send);
    b.Free(recv);
  } else {
    std::free(send);
    std::free(recv);
  }

  int rc = total_wrong > 0 ? 1 : 0;
  if (rank == 0) {
    std::printf("# Out of bounds values : %lld %s\n", static_cast<long long>(total_wrong),
                total_wrong > 0 ? "FAILED" : "OK");
    std::printf("# Avg bus bandwidth    : %g \n#\n", bw_count > 0 ? bw_sum / bw_count : 0.0);
    std::fflush(stdout);
    if (!o.json_path.empty() && !WriteJson(o.json_path, rows, title, nranks)) {
      std::fprintf(stderr, "cannot write %s: %s\n", o.json_path.c_str(), std::strerror(errno));
      rc = 1;
    }
  }
  return rc;
}

// ---------------------------------------------------------------------------------------------
// Launching ranks on this host.

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

int Launch(const char* prog, int nranks, int timeout_s, const std::function<int(int)>& body) {
  const pid_t parent = getpid();
  std::fflush(nullptr);
  std::vector<pid_t> pids(nranks, -1);
  for (int r = 0; r < nranks; ++r) {
    const pid_t pid = fork();
    if (pid < 0) {
      std::fprintf(stderr, "%s: fork: %s\n", prog, std::strerror(errno));
      return 1;  // the ranks already started die with us (PR_SET_PDEATHSIG)
    }
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(1);
      const int rc = body(r);
      const bool written = loom::log::flushStdout(prog);
      std::fflush(nullptr);
      _exit(rc != 0 ? rc : written ? 0 : 1);
    }
    pids[r] = pid;
  }
  // Once one rank fails, the others get a grace period to fail on their own (a library that
  // detects dead peers reports it), then are killed; so are all ranks at the deadline.
  constexpr double kGraceS = 15;
  double kill_at = timeout_s > 0 ? Now() + timeout_s : HUGE_VAL;
  int running = nranks, rc = 0;
  bool killed = false;
  while (running > 0) {
    int status = 0;
    const pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid > 0) {
      const int r = static_cast<int>(std::find(pids.begin(), pids.end(), pid) - pids.begin());
      if (r >= nranks) continue;
      pids[r] = -1;
      --running;
      if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        if (!killed)
          std::fprintf(stderr, "%s: rank %d %s %d\n", prog, r,
                       WIFEXITED(status) ? "exited with status" : "killed by signal",
                       WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
        rc = 1;
        kill_at = std::min(kill_at, Now() + kGraceS);
      }
      continue;
    }
    if (!killed && Now() >= kill_at) {
      std::fprintf(stderr, "%s: %s; killing the %d rank(s) still running\n", prog,
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

bool ParseSize(const char* s, size_t* out) {
  if (s == nullptr || *s == '\0' || *s == '-' || *s == '+') return false;
  char* end = nullptr;
  errno = 0;
  const unsigned long long v = std::strtoull(s, &end, 10);
  if (end == s || errno != 0) return false;
  int shift = 0;
  if (*end != '\0') {
    const char c = static_cast<char>(std::toupper(static_cast<unsigned char>(*end)));
    shift = c == 'K' ? 10 : c == 'M' ? 20 : c == 'G' ? 30 : -1;
    if (shift < 0 || end[1] != '\0' || v > (~0ull >> shift)) return false;
  }
  constexpr unsigned long long kMaxBytes = 1ull << 48;  // larger than any host's memory
  if ((v << shift) > kMaxBytes) return false;
  *out = static_cast<size_t>(v << shift);
  return true;
}

namespace {

struct Flag {
  const char* short_name;
  const char* long_name;
  const char* help;
};
constexpr Flag kFlags[] = {
    {"-np", "--np", "ranks to start on this host"},
    {"-b", "--minbytes", "smallest size (K, M, G suffixes)"},
    {"-e", "--maxbytes", "largest size"},
    {"-i", "--stepbytes", "additive step between sizes"},
    {"-f", "--stepfactor", "factor between sizes"},
    {"-n", "--iters", "timed iterations per size"},
    {"-w", "--warmup_iters", "untimed iterations per size"},
    {"-m", "--agg_iters", "operations per iteration, issued as one group"},
    {"-c", "--check", "checked runs per size (0: none)"},
    {"-a", "--average", "time over ranks: 0 rank 0, 1 mean, 2 min, 3 max"},
    {"-d", "--datatype", "type, or all"},
    {"-o", "--op", "sum, prod, max, min, avg, or all"},
    {"-r", "--root", "root of broadcast, reduce, gather and scatter, or all"},
    {"-C", "--collective",
     "all_reduce, all_gather, reduce_scatter, broadcast, reduce, alltoall, "
     "sendrecv, gather, scatter, a comma list, or all"},
    {"-I", "--skew", "1: arrival-skew columns (largest skew, rank most often last)"},
    {"-R", "--local_register", "1: buffers from the library's allocator (Loom: loomMemAlloc)"},
    {"-G", "--device", "1: CUDA device buffers on a stream (checked after copying back)"},
    {"-z", "--blocking", "accepted for nccl-tests compatibility (host calls always block)"},
    {"-T", "--timeout", "seconds before the ranks are killed"},
    {"-J", "--json", "write every row as JSON to this file"},
};

// The flags' list, after msg (to stderr, exit 2), or alone for -h/--help (to stdout, exit 0).
[[noreturn]] void Usage(const FlagSet& fs, const std::string& msg) {
  FILE* out = msg.empty() ? stdout : stderr;
  if (!msg.empty()) std::fprintf(out, "%s: %s\n", fs.prog, msg.c_str());
  std::fprintf(out, "usage: %s [flag value]...\n", fs.prog);
  for (const Flag& f : kFlags) {
    if (!fs.launches &&
        (std::strcmp(f.short_name, "-np") == 0 || std::strcmp(f.short_name, "-T") == 0))
      continue;
    std::fprintf(out, "  %-4s %-15s %s\n", f.short_name, f.long_name, f.help);
  }
  std::exit(msg.empty() ? 0 : 2);
}

[[noreturn]] void Invalid(const FlagSet& fs, const std::string& flag, const std::string& value) {
  Usage(fs, "invalid value for " + flag + ": '" + value + "'");
}

int FlagInt(const FlagSet& fs, const std::string& flag, const char* arg, long lo, long hi) {
  char* end = nullptr;
  errno = 0;
  const long v = std::strtol(arg, &end, 10);
  if (*arg == '\0' || *end != '\0' || errno != 0 || v < lo || v > hi) Invalid(fs, flag, arg);
  return static_cast<int>(v);
}

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

bool PeerType(loomDataType_t t) {
  return t == loomUint8 || t == loomInt32 || t == loomInt64 || t == loomFloat || t == loomDouble;
}

}  // namespace

// Every flag takes a value: "-b 8", "-b8", "--minbytes 8" or "--minbytes=8".
Options ParseFlags(int argc, char** argv, const FlagSet& fs) {
  Options o;
  std::string type_name = "float", op_name = "sum", coll_names;
  bool factor_set = false, step_set = false;
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i], value, key, name;
    bool has_value = false;
    if (flag == "-h" || flag == "--help") Usage(fs, "");
    if (flag.rfind("--", 0) == 0 && flag.find('=') != std::string::npos) {
      value = flag.substr(flag.find('=') + 1);
      flag.resize(flag.find('='));
      has_value = true;
    }
    for (const Flag& f : kFlags)
      if (flag == f.short_name || flag == f.long_name)
        key = f.short_name, name = std::string(f.short_name) + "/" + f.long_name;
    if (key.empty() && flag.size() > 2 && flag[0] == '-' && flag[1] != '-') {
      for (const Flag& f : kFlags)  // a short flag with its value attached
        if (flag.compare(0, 2, f.short_name) == 0 && f.short_name[2] == '\0')
          key = f.short_name, name = std::string(f.short_name) + "/" + f.long_name,
          value = flag.substr(2), has_value = true;
    }
    if (!fs.launches && (key == "-np" || key == "-T")) key.clear();
    if (key.empty())
      Usage(fs, flag[0] == '-' ? "unknown flag " + flag : "unexpected argument '" + flag + "'");
    if (!has_value) {
      if (i + 1 >= argc) Usage(fs, "flag " + flag + " needs a value");
      value = argv[++i];
    }
    const char* v = value.c_str();
    if (key == "-np") {
      o.nranks = FlagInt(fs, name, v, 1, 1024);
    } else if (key == "-b" || key == "-e" || key == "-i") {
      size_t* out = key == "-b" ? &o.min_bytes : key == "-e" ? &o.max_bytes : &o.step_bytes;
      if (!ParseSize(v, out) || (key == "-i" && *out == 0)) Invalid(fs, name, value);
      step_set |= key == "-i";
    } else if (key == "-f") {
      o.step_factor = FlagInt(fs, name, v, 1, 1 << 20);
      factor_set = true;
    } else if (key == "-n") {
      o.iters = FlagInt(fs, name, v, 1, 1 << 30);
    } else if (key == "-w") {
      o.warmup = FlagInt(fs, name, v, 0, 1 << 30);
    } else if (key == "-m") {
      o.agg = FlagInt(fs, name, v, 1, 1 << 20);
    } else if (key == "-c") {
      o.check = FlagInt(fs, name, v, 0, 1 << 20);
    } else if (key == "-a") {
      o.average = static_cast<Average>(FlagInt(fs, name, v, 0, 3));
    } else if (key == "-r") {
      o.root = value == "all" ? -1 : FlagInt(fs, name, v, 0, 1 << 20);
    } else if (key == "-I") {
      o.skew = FlagInt(fs, name, v, 0, 1);
    } else if (key == "-R") {
      o.reg = FlagInt(fs, name, v, 0, 1);
    } else if (key == "-G") {
      o.gpu = FlagInt(fs, name, v, 0, 1);
    } else if (key == "-z") {
      FlagInt(fs, name, v, 0, 1);
    } else if (key == "-T") {
      o.timeout_s = FlagInt(fs, name, v, 0, 1 << 30);
    } else if (key == "-d") {
      type_name = value;
    } else if (key == "-o") {
      op_name = value;
    } else if (key == "-C") {
      if (value.empty()) Invalid(fs, "-C/--collective", value);
      coll_names = value;
    } else if (value.empty()) {
      Invalid(fs, name, value);
    } else {
      o.json_path = value;
    }
  }
  // -i alone selects an additive step; with -f, a factor above 1 wins (as in nccl-tests).
  if (step_set && !factor_set) o.step_factor = 1;
  if (o.min_bytes > o.max_bytes) Usage(fs, "-b/--minbytes is larger than -e/--maxbytes");
  if (o.min_bytes == 0 && o.max_bytes > 0 && o.step_factor > 1)
    Usage(fs, "-b/--minbytes 0 with a factor (-f) never grows; give -b 8 or a step (-i)");
  // -I keeps every rank's arrival time of every timed call (8 bytes each, per rank).
  constexpr int kMaxSkewIters = 1 << 22;
  if (o.skew != 0 && o.iters > kMaxSkewIters)
    Usage(fs, "-n/--iters above " + std::to_string(kMaxSkewIters) +
                  " with -I/--skew 1 (which keeps every call's arrival times)");
  auto allowed_type = [&](const TypeInfo& t) { return fs.all_types || PeerType(t.type); };
  for (const TypeInfo& t : kTypes)
    if ((type_name == "all" && allowed_type(t)) || type_name == t.name) o.types.push_back(&t);
  for (const Alias& a : kTypeAliases)
    if (type_name == a.name) o.types.push_back(&kTypes[a.type]);
  for (const TypeInfo* t : o.types)
    if (!allowed_type(*t)) Invalid(fs, "-d/--datatype", type_name);
  if (o.types.empty()) Invalid(fs, "-d/--datatype", type_name);
  for (const OpInfo& op : kOps)
    if (op_name == "all" || op_name == op.name) o.ops.push_back(&op);
  if (o.ops.empty()) Invalid(fs, "-o/--op", op_name);
  auto runs = [&](Coll c) {
    return fs.colls.empty() || std::find(fs.colls.begin(), fs.colls.end(), c) != fs.colls.end();
  };
  if (coll_names.empty())
    coll_names = InfoOf(runs(Coll::kAllReduce) ? Coll::kAllReduce : fs.colls.front()).name;
  size_t pos = 0;
  while (pos <= coll_names.size()) {
    const size_t comma = std::min(coll_names.find(',', pos), coll_names.size());
    const std::string one = coll_names.substr(pos, comma - pos);
    bool found = false;
    for (const CollInfo& ci : kColls) {
      if ((one == "all" || one == ci.name) && runs(ci.coll)) {
        if (std::find(o.colls.begin(), o.colls.end(), &ci) == o.colls.end()) o.colls.push_back(&ci);
        found = true;
      }
    }
    if (!found) Invalid(fs, "-C/--collective", one);
    pos = comma + 1;
  }
  return o;
}

}  // namespace perf
