// Multi-process test harness: runs N ranks of Loom as real forked processes,
// and the collective cases that both the gtest suite (collectives_test.cc) and
// the multi-host worker (worker.cc) check.
//
// Process model. The parent never calls a Loom function before forking on the
// normal path: Loom caches every environment variable on first read, so each
// child sets its own LOOM_* variables first. The parent picks a free loopback
// port P; every child sets LOOM_COMM_ID=127.0.0.1:P (rank 0 hosts the
// rendezvous root there), calls loomGetUniqueId and loomCommInitRank, runs the
// rank function and _exit()s with its return value. With idFromParent, a
// launcher process (a child of the test, so the test process itself stays
// clean) calls loomGetUniqueId, which starts the root thread there, and forks
// the ranks, which inherit the id. Each rank's stdout and stderr go to an
// unlinked temp file that the parent reads back for failure messages.
#pragma once

#include <sys/types.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "loom/loom.h"

// In a rank function: returns 1 from it, after printing the call and Loom's last error, when
// the call does not succeed.
#define CHECK_LOOM(call)                                                                           \
  do {                                                                                             \
    loomResult_t r_ = (call);                                                                      \
    if (r_ != loomSuccess) {                                                                       \
      fprintf(stderr, "%s -> %s: %s\n", #call, loomGetErrorString(r_), loomGetLastError(nullptr)); \
      return 1;                                                                                    \
    }                                                                                              \
  } while (0)

namespace loomtest {

// Exit codes of a rank besides the rank function's own.
constexpr int kExitInitFailed = 90;
constexpr int kExitDestroyFailed = 91;
constexpr int kExitException = 92;

// A page shared by the parent and every rank (MAP_SHARED, zero-filled).
struct SharedPage {
  std::atomic<uint32_t> counter;  // barrier check
  std::atomic<uint32_t> flag;     // free for a test's own signalling
  std::atomic<uint32_t> words[16];
};

struct RankContext {
  int rank = 0;
  int nranks = 1;
  int port = 0;               // the loopback port of LOOM_COMM_ID
  loomComm_t comm = nullptr;  // set when LaunchOptions::initComm; fn may destroy it and null it
  loomUniqueId id{};          // the id the harness used (or got from the launcher)
  SharedPage* shared = nullptr;
};

using RankFn = std::function<int(RankContext&)>;

struct LaunchOptions {
  int nranks = 2;
  bool shm = true;            // false: LOOM_SHM_DISABLE=1
  int timeoutMs = 30000;      // LOOM_TIMEOUT_MS
  int deadlineMs = 120000;    // the parent SIGKILLs every rank still running after this
  int failGraceMs = 10000;    // once a rank fails, the others get this long to finish
  bool initComm = true;       // the harness inits ctx.comm before fn and destroys it after
  bool setCommId = true;      // set LOOM_COMM_ID (ignored with idFromParent)
  bool idFromParent = false;  // a launcher calls loomGetUniqueId before forking the ranks
  std::vector<std::pair<std::string, std::string>> env;  // more variables for every rank
  std::function<void(RankContext&)> beforeInit;          // in the child, before any Loom call
  std::function<void(int port, SharedPage* shared)> whileRunning;  // parent thread
};

struct RankOutcome {
  int rank = 0;
  pid_t pid = -1;
  bool exited = false;  // exited normally with exitCode
  int exitCode = -1;
  int signal = 0;       // the signal that ended it, if any
  bool killed = false;  // killed by the harness (deadline or fail grace)
  double seconds = 0;   // from fork to exit, as seen by the parent
  std::string output;   // its stdout and stderr (the tail)
};

struct LaunchResult {
  int port = 0;
  double seconds = 0;
  std::string error;  // a harness failure (fork, launcher), if any
  std::vector<RankOutcome> ranks;
  bool allPassed() const;
  // Every rank's status and, for ranks that failed (or all when verbose), its output.
  std::string report(bool verbose = false) const;
};

// Runs opts.nranks ranks of fn as processes; returns once all have ended. With
// LOOM_MP_VERBOSE set in the environment, prints every rank's output.
LaunchResult launch(const LaunchOptions& opts, const RankFn& fn);

// Starts a non-blocking communicator (the torch backend's kind) on ctx: loomInProgress while its
// initialisation (ticket 1) runs, else the error. initNonBlocking also waits for ticket 1.
loomResult_t startNonBlocking(RankContext& ctx);
loomResult_t initNonBlocking(RankContext& ctx);

// The communicator's newest ticket (0 when loomCommLastTicket fails).
uint64_t lastTicket(loomComm_t comm);

// The whole contents of a file ("" when it cannot be read).
std::string readFile(const std::string& path);

// The whole contents of a file, which is then removed ("" when it cannot be read).
std::string takeFile(const std::string& path);

// A TCP port on 127.0.0.1 that was free a moment ago.
int freeLoopbackPort();

// The CPUs this process may run on, in order.
std::vector<int> allowedCpus();
// Binds the calling process to that one CPU; exits with status 90 where it cannot (for a
// beforeInit hook, whose rank then fails).
void bindToCpu(int cpu);

double nowSeconds();

// ---- Collective cases shared by collectives_test.cc and worker.cc ----

enum class Coll {
  kAllReduce,
  kBroadcast,
  kReduce,
  kAllGather,
  kReduceScatter,
  kAllToAll,
  kSendRecv,
  kBarrier
};

// loomSum..loomAvg, kPreMulSum for an op made by loomRedOpCreatePreMulSum, or loomBand,
// loomBor, loomBxor (integer types only).
constexpr int kPreMulSum = 5;
constexpr size_t kLargeCount = (size_t{1} << 20) + 3;

enum class Pattern {
  kBytes,   // random bytes (data movement: compared bit for bit)
  kSmall,   // small integers, partial sums exact in the type
  kWrap,    // integers near the type's maximum: sums wrap
  kProd,    // values whose products stay exact (or wrap, for integers)
  kMinMax,  // any finite non-zero value of the type
};

struct Case {
  Coll coll = Coll::kAllReduce;
  loomDataType_t dtype = loomFloat32;
  int op = loomSum;
  size_t count = 0;
  bool inPlace = false;
  int root = 0;
  Pattern pattern = Pattern::kBytes;
  uint64_t seed = 0;
  bool misaligned = false;  // send and receive buffers start at odd addresses
  std::string name() const;
};

// kFull: every type, op, count and layout. kCompact: a sample of them. kTransport: the sample,
// and every collective at the large count, which is what a transport's own paths (chunks,
// pipelining, registration) depend on; the reduction kernels are the same over every transport.
enum class SuiteLevel { kFull, kCompact, kTransport };
// LOOM_MP_SUITE=transport or compact (for runs where the full list costs too much, such as
// tests/rdma's emulated machine), else dflt.
SuiteLevel suiteLevelFromEnv(SuiteLevel dflt);

// The same list on every rank for a given nranks and level.
std::vector<Case> buildCases(int nranks, SuiteLevel level);

struct SuiteStats {
  int cases = 0;
  int failedCases = 0;
  int apiErrors = 0;
  double seconds = 0;
};

// Runs every case on comm and checks this rank's results against the scalar
// reference; reports the first mismatches on stderr. An API error ends the
// run (the ranks would no longer match). shared may be NULL (no barrier
// check). Returns the stats; passed when failedCases == 0 and apiErrors == 0.
SuiteStats runSuite(loomComm_t comm, int rank, int nranks, const std::vector<Case>& cases,
                    SharedPage* shared);

// The test's own encoders (independent of the library's kernels): double to
// the type's bits with round-to-nearest-even, and back.
namespace codec {

// A small binary float format: expBits exponent bits, manBits mantissa bits.
// ieee: the top exponent is inf/NaN (fp16, bf16, e5m2); else only all-ones is
// NaN (e4m3 "fn", max 448). Overflow gives inf (ieee, not fp8) or saturates.
struct MiniFormat {
  int expBits, manBits;
  bool ieee, saturate;
};

constexpr MiniFormat kHalfFmt{5, 10, true, false};
constexpr MiniFormat kBf16Fmt{8, 7, true, false};
constexpr MiniFormat kE4m3Fmt{4, 3, false, true};
constexpr MiniFormat kE5m2Fmt{5, 2, true, true};

inline uint32_t encodeMini(double x, const MiniFormat& f) {
  const uint32_t sign = std::signbit(x) ? 1u << (f.expBits + f.manBits) : 0u;
  const uint32_t expAll = (1u << f.expBits) - 1, manAll = (1u << f.manBits) - 1;
  if (std::isnan(x)) return sign | (expAll << f.manBits) | manAll;
  const int bias = (1 << (f.expBits - 1)) - 1;
  const uint32_t maxField = f.ieee ? expAll - 1 : expAll;
  const uint32_t maxMant = f.ieee ? manAll : manAll - 1;
  const uint32_t maxFinite = (maxField << f.manBits) | maxMant;
  const uint32_t inf = f.saturate ? maxFinite : (expAll << f.manBits);
  double ax = std::fabs(x);
  if (ax == 0) return sign;
  if (std::isinf(ax)) return sign | inf;
  int e = 0;
  std::frexp(ax, &e);
  int exp = std::max(e - 1, 1 - bias);  // subnormals share the smallest exponent
  double r = std::nearbyint(std::ldexp(ax, f.manBits - exp));  // round to nearest even
  if (r >= std::ldexp(1.0, f.manBits + 1)) {
    r /= 2;
    ++exp;
  }
  uint32_t field = 0, mant = static_cast<uint32_t>(r);
  if (r >= std::ldexp(1.0, f.manBits)) {
    field = static_cast<uint32_t>(exp + bias);
    mant -= 1u << f.manBits;
  }
  if (field > maxField || (field == maxField && mant > maxMant)) return sign | inf;
  return sign | (field << f.manBits) | mant;
}

inline double decodeMini(uint32_t v, const MiniFormat& f) {
  const uint32_t expAll = (1u << f.expBits) - 1, manAll = (1u << f.manBits) - 1;
  const int bias = (1 << (f.expBits - 1)) - 1;
  bool neg = (v >> (f.expBits + f.manBits)) & 1;
  uint32_t field = (v >> f.manBits) & expAll, mant = v & manAll;
  double val;
  if (f.ieee && field == expAll)
    val = mant == 0 ? INFINITY : NAN;
  else if (!f.ieee && field == expAll && mant == manAll)
    val = NAN;
  else if (field == 0)
    val = std::ldexp(static_cast<double>(mant), 1 - bias - f.manBits);
  else
    val = std::ldexp(static_cast<double>(mant + (1u << f.manBits)),
                     static_cast<int>(field) - bias - f.manBits);
  return neg ? -val : val;
}

}  // namespace codec

inline uint16_t encodeHalf(double x) {
  return static_cast<uint16_t>(codec::encodeMini(x, codec::kHalfFmt));
}
inline uint16_t encodeBf16(double x) {
  return static_cast<uint16_t>(codec::encodeMini(x, codec::kBf16Fmt));
}
inline uint8_t encodeE4m3(double x) {
  return static_cast<uint8_t>(codec::encodeMini(x, codec::kE4m3Fmt));
}
inline uint8_t encodeE5m2(double x) {
  return static_cast<uint8_t>(codec::encodeMini(x, codec::kE5m2Fmt));
}
inline double decodeHalf(uint16_t v) { return codec::decodeMini(v, codec::kHalfFmt); }
inline double decodeBf16(uint16_t v) { return codec::decodeMini(v, codec::kBf16Fmt); }
inline double decodeE4m3(uint8_t v) { return codec::decodeMini(v, codec::kE4m3Fmt); }
inline double decodeE5m2(uint8_t v) { return codec::decodeMini(v, codec::kE5m2Fmt); }

size_t typeBytes(loomDataType_t dtype);
const char* typeName(loomDataType_t dtype);
const char* opName(int op);
const char* collName(Coll coll);

// Names a test parameterised by "over shared memory" (true) or TCP (false): pass to
// INSTANTIATE_TEST_SUITE_P.
template <typename ParamInfo>
std::string shmOrTcp(const ParamInfo& info) {
  return info.param ? "shm" : "tcp";
}

}  // namespace loomtest
