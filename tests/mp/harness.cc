#include "harness.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <memory>
#include <sstream>
#include <thread>

#include "util/cpus.h"
#include "util/net.h"

namespace loomtest {

// ---- Processes ----

double nowSeconds() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int freeLoopbackPort() { return loom::net::freeLoopbackPort(); }

std::vector<int> allowedCpus() {
  const cpu_set_t mask = loom::cpus::allowed();
  std::vector<int> out;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &mask)) out.push_back(c);
  return out;
}

void bindToCpu(int cpu) {
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(cpu, &one);
  if (sched_setaffinity(0, sizeof(one), &one) != 0) _exit(90);
}

namespace {

constexpr size_t kOutputTail = 12000;

// How a rank ended, in shared memory so that a launcher process can report it too.
struct Slot {
  pid_t pid;
  bool exited, killed;
  int exitCode, signal;
  double seconds;
  bool running() const { return pid > 0 && !exited && signal == 0; }
};

int makeOutputFile() {
  char path[] = "/tmp/loom_mp_XXXXXX";
  int fd = mkstemp(path);
  if (fd >= 0) unlink(path);
  return fd;
}

std::string readTail(int fd) {
  struct stat st;
  if (fd < 0 || fstat(fd, &st) != 0) return "";
  size_t size = static_cast<size_t>(st.st_size);
  size_t start = size > kOutputTail ? size - kOutputTail : 0;
  std::string out(size - start, '\0');
  ssize_t got = pread(fd, out.data(), out.size(), static_cast<off_t>(start));
  out.resize(got > 0 ? static_cast<size_t>(got) : 0);
  return start > 0 ? "...\n" + out : out;
}

void setEnv(const char* name, const std::string& value) { setenv(name, value.c_str(), 1); }

// Sets the variables every rank (and a launcher) needs before its first Loom call.
void setRankEnv(const LaunchOptions& opts, int port, bool commId) {
  setEnv("LOOM_SOCKET_IFNAME", "lo");
  setEnv("LOOM_SHM_DISABLE", opts.shm ? "0" : "1");
  setEnv("LOOM_TIMEOUT_MS", std::to_string(opts.timeoutMs));
  if (commId)
    setEnv("LOOM_COMM_ID", "127.0.0.1:" + std::to_string(port));
  else
    unsetenv("LOOM_COMM_ID");
  for (const auto& kv : opts.env) setEnv(kv.first.c_str(), kv.second);
}

// The write ends of the ranks' id pipes (the launcher's), which a rank closes at once.
std::vector<int> gIdWriteEnds;

[[noreturn]] void runChild(const LaunchOptions& opts, const RankFn& fn, RankContext ctx, int outFd,
                           const loomUniqueId* parentId, int idPipe) {
  dup2(outFd, STDOUT_FILENO);
  dup2(outFd, STDERR_FILENO);
  // The parent's id, written once every rank is forked (a closed pipe: it could not make one).
  loomUniqueId piped;
  for (int fd : gIdWriteEnds) close(fd);  // so that a launcher's close is an end of file here
  if (idPipe >= 0) {
    size_t got = 0;
    while (got < sizeof(piped)) {
      const ssize_t n = read(idPipe, reinterpret_cast<char*>(&piped) + got, sizeof(piped) - got);
      if (n <= 0) {
        fprintf(stderr, "rank %d: no unique id from the launcher\n", ctx.rank);
        _exit(kExitInitFailed);
      }
      got += static_cast<size_t>(n);
    }
    close(idPipe);
    parentId = &piped;
  }
  if (parentId == nullptr) setRankEnv(opts, ctx.port, opts.setCommId);
  int code = 0;
  try {
    if (opts.beforeInit) opts.beforeInit(ctx);
    if (parentId != nullptr) ctx.id = *parentId;
    if (opts.initComm) {
      loomResult_t r = parentId != nullptr ? loomSuccess : loomGetUniqueId(&ctx.id);
      if (r == loomSuccess) r = loomCommInitRank(&ctx.comm, ctx.nranks, ctx.id, ctx.rank);
      if (r != loomSuccess) {
        fprintf(stderr, "rank %d: init failed: %s: %s\n", ctx.rank, loomGetErrorString(r),
                loomGetLastError(nullptr));
        fflush(stdout);
        _exit(kExitInitFailed);
      }
    }
    code = fn(ctx);
    if (ctx.comm != nullptr) {
      loomResult_t r = loomCommDestroy(ctx.comm);
      if (r != loomSuccess) {
        fprintf(stderr, "rank %d: loomCommDestroy: %s: %s\n", ctx.rank, loomGetErrorString(r),
                loomGetLastError(nullptr));
        if (code == 0) code = kExitDestroyFailed;
      }
    }
  } catch (const std::exception& e) {
    fprintf(stderr, "rank %d: exception: %s\n", ctx.rank, e.what());
    code = kExitException;
  }
  fflush(stdout);
  _exit(code);
}

// Forks the ranks and waits for them under the deadline and the fail grace.
// With idPipes, each rank reads the id from its pipe, and afterFork (run once every rank is
// forked) writes it: no rank is forked beside the thread loomGetUniqueId starts, which could
// hold a lock (malloc's) that the child would then wait on for ever.
void spawnAndWait(const LaunchOptions& opts, const RankFn& fn, int port, SharedPage* shared,
                  const std::vector<int>& files, const loomUniqueId* parentId, Slot* slots,
                  const std::vector<int>* idPipes = nullptr,
                  const std::function<void()>& afterFork = nullptr) {
  const int n = opts.nranks;
  const double start = nowSeconds();
  fflush(stdout);
  fflush(stderr);
  for (int r = 0; r < n; ++r) {
    RankContext ctx;
    ctx.rank = r;
    ctx.nranks = n;
    ctx.port = port;
    ctx.shared = shared;
    pid_t pid = fork();
    if (pid == 0)
      runChild(opts, fn, ctx, files[r], parentId,
               idPipes != nullptr ? (*idPipes)[static_cast<size_t>(r)] : -1);
    slots[r].pid = pid;
  }
  if (afterFork) afterFork();
  // The hook thread starts only after every fork, so no child inherits a second thread.
  std::thread hook;
  if (opts.whileRunning && parentId == nullptr && idPipes == nullptr)
    hook = std::thread([&opts, port, shared] { opts.whileRunning(port, shared); });
  double failedAt = -1;
  for (;;) {
    bool running = false, progressed = false;
    for (Slot* o = slots; o < slots + n; ++o) {
      int status = 0;
      if (!o->running()) continue;
      running = true;
      if (waitpid(o->pid, &status, WNOHANG) != o->pid) continue;
      progressed = true;
      o->seconds = nowSeconds() - start;
      o->exited = WIFEXITED(status);
      o->exitCode = o->exited ? WEXITSTATUS(status) : -1;
      o->signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
      if ((!o->exited || o->exitCode != 0) && failedAt < 0) failedAt = nowSeconds();
    }
    if (!running) break;
    if (progressed) continue;
    const double now = nowSeconds();
    if ((now - start) * 1000 > opts.deadlineMs ||
        (failedAt >= 0 && (now - failedAt) * 1000 > opts.failGraceMs)) {
      for (Slot* o = slots; o < slots + n; ++o) {
        if (!o->running()) continue;
        kill(o->pid, SIGKILL);
        waitpid(o->pid, nullptr, 0);
        o->killed = true;
        o->signal = SIGKILL;
        o->seconds = nowSeconds() - start;
      }
      break;
    }
    usleep(2000);
  }
  if (hook.joinable()) hook.join();
}

}  // namespace

bool LaunchResult::allPassed() const {
  if (!error.empty() || ranks.empty()) return false;
  for (const RankOutcome& o : ranks)
    if (!o.exited || o.exitCode != 0) return false;
  return true;
}

std::string LaunchResult::report(bool verbose) const {
  std::string s;
  char line[256];
  snprintf(line, sizeof(line), "%zu ranks, port %d, %.2f s\n", ranks.size(), port, seconds);
  s += line;
  if (!error.empty()) s += "harness error: " + error + "\n";
  for (const RankOutcome& o : ranks) {
    if (o.pid <= 0)
      snprintf(line, sizeof(line), "rank %d: not started\n", o.rank);
    else if (o.exited)
      snprintf(line, sizeof(line), "rank %d: exit %d after %.2f s\n", o.rank, o.exitCode,
               o.seconds);
    else
      snprintf(line, sizeof(line), "rank %d: %s by signal %d after %.2f s\n", o.rank,
               o.killed ? "still running (hung?), killed by the harness" : "killed", o.signal,
               o.seconds);
    s += line;
  }
  for (const RankOutcome& o : ranks) {
    bool failed = !o.exited || o.exitCode != 0;
    if ((failed || verbose) && !o.output.empty())
      s += "---- rank " + std::to_string(o.rank) + " output ----\n" + o.output;
  }
  return s;
}

LaunchResult launch(const LaunchOptions& opts, const RankFn& fn) {
  LaunchResult result;
  const double start = nowSeconds();
  const int n = opts.nranks;
  result.port = freeLoopbackPort();
  const size_t mapBytes = sizeof(SharedPage) + n * sizeof(Slot);
  void* mem = mmap(nullptr, mapBytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) {
    result.error = "mmap failed";
    return result;
  }
  auto* shared = new (mem) SharedPage();
  auto* slots = reinterpret_cast<Slot*>(static_cast<char*>(mem) + sizeof(SharedPage));
  std::vector<int> files(n);
  for (int& fd : files) fd = makeOutputFile();
  if (!opts.idFromParent) {
    spawnAndWait(opts, fn, result.port, shared, files, nullptr, slots);
  } else {
    // The launcher stands in for the parent, so that this process makes no Loom call.
    fflush(stdout);
    fflush(stderr);
    pid_t launcher = fork();
    if (launcher == 0) {
      setRankEnv(opts, result.port, false);
      std::vector<int> readEnds(static_cast<size_t>(n)), writeEnds(static_cast<size_t>(n));
      for (int r = 0; r < n; ++r) {
        int fds[2];
        if (pipe(fds) != 0) _exit(3);
        readEnds[static_cast<size_t>(r)] = fds[0];
        writeEnds[static_cast<size_t>(r)] = fds[1];
      }
      gIdWriteEnds = writeEnds;
      bool made = true;
      spawnAndWait(opts, fn, result.port, shared, files, nullptr, slots, &readEnds, [&] {
        loomUniqueId id;
        made = loomGetUniqueId(&id) == loomSuccess;
        for (int fd : writeEnds) {
          if (made && write(fd, &id, sizeof(id)) != static_cast<ssize_t>(sizeof(id))) made = false;
          close(fd);
        }
      });
      _exit(made ? 0 : 3);
    }
    int status = 0;
    while (waitpid(launcher, &status, WNOHANG) != launcher) {
      if ((nowSeconds() - start) * 1000 > opts.deadlineMs + 15000) {
        for (int r = 0; r < n; ++r)
          if (slots[r].pid > 0) kill(slots[r].pid, SIGKILL);
        kill(launcher, SIGKILL);
        waitpid(launcher, &status, 0);
        result.error = "launcher hung";
        break;
      }
      usleep(5000);
    }
    if (result.error.empty() && !(WIFEXITED(status) && WEXITSTATUS(status) == 0))
      result.error = "launcher failed (loomGetUniqueId?), status " + std::to_string(status);
  }
  for (int r = 0; r < n; ++r) {
    const Slot& o = slots[r];
    result.ranks.push_back(RankOutcome{r, o.pid, o.exited, o.exitCode, o.signal, o.killed,
                                       o.seconds, readTail(files[r])});
    if (files[r] >= 0) close(files[r]);
  }
  munmap(mem, mapBytes);
  result.seconds = nowSeconds() - start;
  if (getenv("LOOM_MP_VERBOSE") != nullptr) printf("%s", result.report(true).c_str());
  return result;
}

// ---- Types ----

namespace {

bool isFloat(loomDataType_t t) {
  return t == loomFloat16 || t == loomFloat32 || t == loomFloat64 || t == loomBfloat16 ||
         t == loomFloat8e4m3 || t == loomFloat8e5m2;
}
bool isSigned(loomDataType_t t) { return t == loomInt8 || t == loomInt32 || t == loomInt64; }

// Largest integer N such that every integer in [-N, N] is exact in the type.
double exactLimit(loomDataType_t t) {
  int bits = t == loomFloat16      ? 11
             : t == loomBfloat16   ? 8
             : t == loomFloat8e4m3 ? 4
             : t == loomFloat8e5m2 ? 3
             : t == loomFloat32    ? 24
                                   : 53;
  return std::ldexp(1.0, bits);
}

// An element in the test's arithmetic: integers as 64-bit two's complement
// (normalized to the type: truncated, sign-extended), floats as double.
struct Num {
  uint64_t u = 0;
  double f = 0;
};

uint64_t normalize(uint64_t v, loomDataType_t t) {
  int bits = static_cast<int>(typeBytes(t)) * 8;
  if (bits == 64) return v;
  v &= (uint64_t{1} << bits) - 1;
  if (isSigned(t) && (v >> (bits - 1)) != 0) v |= ~uint64_t{0} << bits;
  return v;
}

template <typename T>
T load(const unsigned char* p) {
  T x;
  memcpy(&x, p, sizeof(T));
  return x;
}

void encode(loomDataType_t t, Num v, unsigned char* out) {
  uint64_t bits = v.u;
  float f = static_cast<float>(v.f);
  if (t == loomFloat32) bits = load<uint32_t>(reinterpret_cast<unsigned char*>(&f));
  if (t == loomFloat64) bits = load<uint64_t>(reinterpret_cast<unsigned char*>(&v.f));
  if (t == loomFloat16) bits = encodeHalf(v.f);
  if (t == loomBfloat16) bits = encodeBf16(v.f);
  if (t == loomFloat8e4m3) bits = encodeE4m3(v.f);
  if (t == loomFloat8e5m2) bits = encodeE5m2(v.f);
  memcpy(out, &bits, typeBytes(t));  // little endian
}

double decodeFloat(loomDataType_t t, const unsigned char* p) {
  if (t == loomFloat32) return load<float>(p);
  if (t == loomFloat64) return load<double>(p);
  if (t == loomFloat16) return decodeHalf(load<uint16_t>(p));
  if (t == loomBfloat16) return decodeBf16(load<uint16_t>(p));
  return t == loomFloat8e4m3 ? decodeE4m3(*p) : decodeE5m2(*p);
}

std::string show(loomDataType_t t, const unsigned char* p) {
  char buf[96];
  uint64_t bits = 0;
  memcpy(&bits, p, typeBytes(t));
  const auto v = static_cast<unsigned long long>(isFloat(t) ? bits : normalize(bits, t));
  if (isFloat(t))
    snprintf(buf, sizeof(buf), "%.9g (0x%llx)", decodeFloat(t, p), v);
  else
    snprintf(buf, sizeof(buf), isSigned(t) ? "%lld" : "%llu", v);
  return buf;
}

}  // namespace

size_t typeBytes(loomDataType_t t) {
  static const size_t kBytes[] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};
  return t >= 0 && t < loomNumTypes ? kBytes[t] : 0;
}

const char* typeName(loomDataType_t t) {
  static const char* const kNames[] = {"int8", "uint8", "int32", "uint32", "int64", "uint64",
                                       "fp16", "fp32",  "fp64",  "bf16",   "e4m3",  "e5m2"};
  return t >= 0 && t < loomNumTypes ? kNames[t] : "?";
}

const char* opName(int op) {
  static const char* const kNames[] = {"sum", "prod", "max", "min", "avg", "premulsum"};
  static const char* const kBitwise[] = {"band", "bor", "bxor"};
  if (op >= loomBand && op <= loomBxor) return kBitwise[op - loomBand];
  return op >= 0 && op <= kPreMulSum ? kNames[op] : "?";
}

const char* collName(Coll c) {
  static const char* const kNames[] = {"AllReduce",     "Broadcast", "Reduce",   "AllGather",
                                       "ReduceScatter", "AllToAll",  "SendRecv", "Barrier"};
  return kNames[static_cast<int>(c)];
}

// ---- Cases ----

std::string Case::name() const {
  static const char* const kPatterns[] = {"bytes", "small", "wrap", "prod", "minmax"};
  char buf[160];
  const bool rooted = coll == Coll::kBroadcast || coll == Coll::kReduce;
  snprintf(buf, sizeof(buf), "%s %s%s%s count=%zu %s%s%s values=%s", collName(coll),
           typeName(dtype), pattern == Pattern::kBytes ? "" : " ",
           pattern == Pattern::kBytes ? "" : opName(op), count,
           inPlace ? "in-place" : "out-of-place", misaligned ? " misaligned" : "",
           rooted ? (" root=" + std::to_string(root)).c_str() : "",
           kPatterns[static_cast<int>(pattern)]);
  return buf;
}

namespace {

constexpr loomDataType_t kAllTypes[] = {loomInt8,    loomUint8,    loomInt32,      loomUint32,
                                        loomInt64,   loomUint64,   loomFloat16,    loomFloat32,
                                        loomFloat64, loomBfloat16, loomFloat8e4m3, loomFloat8e5m2};
constexpr loomDataType_t kMoveTypes[] = {loomInt8,    loomFloat16, loomBfloat16, loomInt32,
                                         loomFloat32, loomUint64,  loomFloat64,  loomFloat8e5m2};
constexpr loomDataType_t kReduceTypes[] = {loomInt8,     loomUint32,     loomInt64,
                                           loomFloat16,  loomFloat32,    loomFloat64,
                                           loomBfloat16, loomFloat8e4m3, loomFloat8e5m2};
constexpr size_t kSmallCounts[] = {0, 1, 7, 1023};

Pattern patternFor(int op) {
  if (op == loomProd) return Pattern::kProd;
  const bool bitwise = op >= loomBand && op <= loomBxor;  // every bit pattern, as min and max
  return op == loomMax || op == loomMin || bitwise ? Pattern::kMinMax : Pattern::kSmall;
}

bool isReduction(Coll c) {
  return c == Coll::kAllReduce || c == Coll::kReduce || c == Coll::kReduceScatter;
}

struct CaseList {
  std::vector<Case> cases;
  void add(Coll coll, loomDataType_t t, int op, size_t count, bool inPlace, int root = 0,
           Pattern pattern = Pattern::kBytes) {
    if (isReduction(coll) && pattern == Pattern::kBytes) pattern = patternFor(op);
    cases.push_back(Case{coll, t, op, count, inPlace, root, pattern,
                         0x51ed270b0b5f1e3dull * (cases.size() + 1), false});
  }
};

}  // namespace

SuiteLevel suiteLevelFromEnv(SuiteLevel dflt) {
  const char* v = getenv("LOOM_MP_SUITE");
  if (v == nullptr || *v == '\0') return dflt;
  if (strcmp(v, "transport") == 0) return SuiteLevel::kTransport;
  if (strcmp(v, "compact") == 0) return SuiteLevel::kCompact;
  if (strcmp(v, "full") == 0) return SuiteLevel::kFull;
  fprintf(stderr, "LOOM_MP_SUITE=%s: not full, transport or compact; running the full list\n", v);
  return SuiteLevel::kFull;
}

std::vector<Case> buildCases(int n, SuiteLevel level) {
  CaseList l;
  const bool full = level == SuiteLevel::kFull;
  // 2^20+3 elements: every collective (kTransport's one each), every kind of reduction (kFull);
  // on 8 ranks only a few
  const bool big = n <= 4 && (full || level == SuiteLevel::kTransport);
  int k = 0;  // rotates roots and in-place where not every combination runs
  for (loomDataType_t t : kAllTypes)
    for (int op = 0; op <= kPreMulSum; ++op)
      for (size_t count : kSmallCounts) {
        if (!full && count != 7 && !(count == 1023 && t == loomBfloat16)) continue;
        for (int ip = 0; ip < 2; ++ip)
          if (full || (op + ip + count) % 2 == 0) l.add(Coll::kAllReduce, t, op, count, ip != 0);
      }
  // The low-latency all-reduce's line boundaries (src/exec/memory_steps.cc: 48 bytes in the first
  // line, 56 in each further one, 384 in all): one line exactly, one element past it, two full
  // lines, every line, one element past them; every op in turn, in place every other case.
  if (full)
    for (loomDataType_t t : kAllTypes) {
      const size_t es = typeBytes(t);
      for (size_t bytes : {size_t{48}, 48 + es, size_t{104}, size_t{384}, 384 + es}) {
        const int op = k % (kPreMulSum + 1);
        l.add(Coll::kAllReduce, t, op, bytes / es, ++k % 2 == 0);
      }
    }
  for (loomDataType_t t : kAllTypes) {
    if (isFloat(t)) continue;
    for (int op : {static_cast<int>(loomSum), static_cast<int>(loomAvg)})
      for (size_t count : {size_t{7}, size_t{1023}})
        if (full || (t == loomInt8 && count == 7))
          l.add(Coll::kAllReduce, t, op, count, ++k % 2 == 0, 0, Pattern::kWrap);
  }
  // The bitwise operations on the integer types.
  for (loomDataType_t t : kAllTypes) {
    if (isFloat(t)) continue;
    for (int op :
         {static_cast<int>(loomBand), static_cast<int>(loomBor), static_cast<int>(loomBxor)})
      for (size_t count : {size_t{7}, size_t{1023}})
        if (full || (count == 7 && (op + static_cast<int>(t)) % 3 == 0))
          l.add(Coll::kAllReduce, t, op, count, ++k % 2 == 0);
  }
  for (int op :
       {static_cast<int>(loomBand), static_cast<int>(loomBor), static_cast<int>(loomBxor)}) {
    ++k;
    l.add(Coll::kReduce, loomUint8, op, 1023, k % 2 == 0, (k / 2) % n);
    l.add(Coll::kReduceScatter, loomInt32, op, 7, ++k % 2 == 0);
  }
  l.add(Coll::kAllReduce, loomFloat32, loomSum, kLargeCount, false);
  if (full) l.add(Coll::kAllReduce, loomFloat16, loomSum, kLargeCount, true);
  if (big && full) {
    l.add(Coll::kAllReduce, loomInt8, loomSum, kLargeCount, false, 0, Pattern::kWrap);
    l.add(Coll::kAllReduce, loomBfloat16, loomAvg, kLargeCount, true);
    l.add(Coll::kAllReduce, loomFloat8e4m3, kPreMulSum, kLargeCount, false);
    l.add(Coll::kAllReduce, loomInt64, loomMax, kLargeCount, true);
    l.add(Coll::kAllReduce, loomFloat64, loomProd, kLargeCount, false);
    l.add(Coll::kAllReduce, loomUint32, loomBxor, kLargeCount, true);
  }
  // Reduce and ReduceScatter: every op on several types, in place and not.
  for (Coll coll : {Coll::kReduce, Coll::kReduceScatter})
    for (loomDataType_t t : kReduceTypes)
      for (int op = 0; op <= kPreMulSum; ++op)
        for (size_t count : kSmallCounts) {
          ++k;
          if (!full && (count != 7 || (op + static_cast<int>(t)) % 3 != 0)) continue;
          l.add(coll, t, op, count, k % 2 == 0, (k / 2) % n);
        }
  // Data movement: every count on several types.
  for (Coll coll : {Coll::kBroadcast, Coll::kAllGather, Coll::kAllToAll, Coll::kSendRecv})
    for (loomDataType_t t : kMoveTypes)
      for (size_t count : kSmallCounts) {
        if (!full && (count == 0 || count == 1023) && t != loomFloat16) continue;
        bool canInPlace = coll == Coll::kBroadcast || coll == Coll::kAllGather;
        for (int ip = 0; ip < (canInPlace && full ? 2 : 1); ++ip) {
          bool inPlace = canInPlace && (full ? ip != 0 : ++k % 2 == 0);
          l.add(coll, t, 0, count, inPlace, ++k % n);
        }
      }
  l.add(Coll::kAllGather, loomUint8, 0, kLargeCount, false);
  if (big) {
    l.add(Coll::kBroadcast, loomFloat32, 0, kLargeCount, true, n - 1);
    l.add(Coll::kReduce, loomFloat32, loomSum, kLargeCount, false, n - 1);
    l.add(Coll::kAllGather, loomFloat32, 0, kLargeCount, true);
    l.add(Coll::kReduceScatter, loomFloat32, loomSum, kLargeCount, false);
    l.add(Coll::kReduceScatter, loomBfloat16, loomMin, kLargeCount, true);
    l.add(Coll::kAllToAll, loomInt8, 0, kLargeCount, false);
    l.add(Coll::kSendRecv, loomFloat32, 0, kLargeCount, false);
  }
  // Buffers at odd addresses.
  l.add(Coll::kAllReduce, loomFloat32, loomSum, 1023, false);
  l.add(Coll::kAllReduce, loomFloat64, loomAvg, 1023, true);
  l.add(Coll::kAllReduce, loomBfloat16, loomProd, big && full ? kLargeCount : 1023, false);
  l.add(Coll::kReduce, loomInt32, loomMax, 1023, false, n - 1);
  l.add(Coll::kReduceScatter, loomFloat32, loomSum, 1023, false);
  l.add(Coll::kBroadcast, loomInt32, 0, 1023, false, n / 2);
  l.add(Coll::kAllGather, loomFloat16, 0, 1023, true);
  l.add(Coll::kAllToAll, loomFloat64, 0, 7, false);
  l.add(Coll::kSendRecv, loomFloat32, 0, 1023, false);
  for (size_t i = l.cases.size() - 9; i < l.cases.size(); ++i) l.cases[i].misaligned = true;
  l.add(Coll::kBarrier, loomInt8, 0, 0, false);
  l.add(Coll::kBarrier, loomInt8, 0, 0, false);
  return l.cases;
}

// ---- Values, the scalar reference, and the check ----

namespace {

uint64_t mix(uint64_t x) {  // splitmix64
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

struct Gen {
  const Case& c;
  int n;
  int small;  // kSmall values lie in [-small, small] ([0, small] unsigned)

  Gen(const Case& cs, int nranks) : c(cs), n(nranks) {
    small = 3;
    while (small > 1 && small * n > exactLimit(c.dtype)) --small;
  }
  uint64_t hash(int rank, size_t j) const {
    return mix(c.seed ^ (static_cast<uint64_t>(rank) << 48) ^ j);
  }
  // Rank `rank`'s input element j.
  Num value(int rank, size_t j) const {
    uint64_t h = hash(rank, j);
    Num v;
    const bool fl = isFloat(c.dtype), sg = fl || isSigned(c.dtype);
    switch (c.pattern) {
      case Pattern::kSmall: {
        int64_t x = sg ? static_cast<int64_t>(h % (2 * small + 1)) - small
                       : static_cast<int64_t>(h % (small + 1));
        v.f = static_cast<double>(x);
        v.u = static_cast<uint64_t>(x);
        break;
      }
      case Pattern::kWrap: {
        int bits = static_cast<int>(typeBytes(c.dtype)) * 8 - (sg ? 1 : 0);
        uint64_t max = bits == 64 ? ~uint64_t{0} : (uint64_t{1} << bits) - 1;
        v.u = max - h % 4;
        break;
      }
      case Pattern::kProd:
        if (fl) {  // at most two 2s per element over 8 ranks: |product| <= 4
          v.f = (j + rank + (c.seed & 7)) % 5 == 0 ? 2.0 : 1.0;
          if ((j * 3 + rank) % 7 == 0) v.f = -v.f;
        } else {
          int64_t x = static_cast<int64_t>(h % 3) + 1;
          v.u = static_cast<uint64_t>(sg && (h >> 8) % 2 ? -x : x);
        }
        break;
      case Pattern::kMinMax:
        if (fl) {
          unsigned char bytes[8];
          memcpy(bytes, &h, 8);
          v.f = decodeFloat(c.dtype, bytes);
          if (!std::isfinite(v.f) || v.f == 0) v.f = 1.5;
        } else {
          v.u = h;
        }
        break;
      case Pattern::kBytes:
        break;
    }
    v.u = normalize(v.u, c.dtype);
    return v;
  }
  void element(int rank, size_t j, unsigned char* out) const {
    if (c.pattern == Pattern::kBytes) {
      uint64_t h = hash(rank, j);
      memcpy(out, &h, typeBytes(c.dtype));
    } else {
      encode(c.dtype, value(rank, j), out);
    }
  }
  // What `rank` must hold at output index k (Reduce: on the root).
  void expected(int rank, size_t k, unsigned char* out) const {
    const size_t cnt = c.count, i = cnt == 0 ? 0 : k % cnt;
    const int src = static_cast<int>(cnt == 0 ? 0 : k / cnt);
    if (c.coll == Coll::kAllReduce || c.coll == Coll::kReduce) return reduced(k, out);
    if (c.coll == Coll::kReduceScatter) return reduced(rank * cnt + k, out);
    if (c.coll == Coll::kBroadcast) return element(c.root, k, out);
    if (c.coll == Coll::kAllGather) return element(src, i, out);
    if (c.coll == Coll::kAllToAll) return element(src, rank * cnt + i, out);
    element((rank + n - 1) % n, k, out);  // SendRecv: from the previous rank
  }
  // The reduction over all ranks of element j, encoded.
  void reduced(size_t j, unsigned char* out) const {
    const loomDataType_t t = c.dtype;
    const bool fl = isFloat(t);
    const int base = c.op == kPreMulSum ? loomSum : c.op == loomAvg ? loomSum : c.op;
    Num acc;
    for (int r = 0; r < n; ++r) {
      Num v = value(r, j);
      if (c.op == kPreMulSum) {
        v.f *= 0.5;
        v.u = normalize(v.u * 3, t);
      }
      if (r == 0) {
        acc = v;
        continue;
      }
      bool gt = fl ? v.f > acc.f
                   : (isSigned(t) ? static_cast<int64_t>(v.u) > static_cast<int64_t>(acc.u)
                                  : v.u > acc.u);
      switch (base) {
        case loomSum:
          acc.f += v.f;
          acc.u += v.u;
          break;
        case loomProd:
          acc.f *= v.f;
          acc.u *= v.u;
          break;
        case loomMax:
          if (gt) acc = v;
          break;
        case loomMin:
          if (!gt) acc = v;
          break;
        case loomBand:
          acc.u &= v.u;
          break;
        case loomBor:
          acc.u |= v.u;
          break;
        case loomBxor:
          acc.u ^= v.u;
          break;
      }
      acc.u = normalize(acc.u, t);
    }
    if (c.op == loomAvg) {
      if (t == loomFloat64)
        acc.f /= n;
      else if (fl)
        acc.f = static_cast<float>(acc.f) / static_cast<float>(n);
      else if (isSigned(t))
        acc.u = normalize(static_cast<uint64_t>(static_cast<int64_t>(acc.u) / n), t);
      else
        acc.u /= static_cast<uint64_t>(n);
    }
    encode(t, acc, out);
  }
};

constexpr size_t kGuardBytes = 64;
constexpr unsigned char kFill = 0xa5;

size_t inElems(const Case& c, int n) {
  return c.coll == Coll::kReduceScatter || c.coll == Coll::kAllToAll ? n * c.count : c.count;
}
size_t outElems(const Case& c, int n) {
  return c.coll == Coll::kAllGather || c.coll == Coll::kAllToAll ? n * c.count : c.count;
}

struct AlignedFree {
  void operator()(unsigned char* p) const { free(p); }
};
using Buffer = std::unique_ptr<unsigned char, AlignedFree>;

Buffer allocBuffer(size_t bytes) {
  void* p = nullptr;
  if (posix_memalign(&p, 4096, bytes) != 0) return nullptr;
  return Buffer(static_cast<unsigned char*>(p));
}

loomResult_t issue(const Case& c, const void* sb, void* rb, loomRedOp_t op, loomComm_t comm,
                   int rank, int n) {
  switch (c.coll) {
    case Coll::kAllReduce:
      return loomAllReduce(sb, rb, c.count, c.dtype, op, comm, nullptr);
    case Coll::kBroadcast:
      return loomBroadcast(sb, rb, c.count, c.dtype, c.root, comm, nullptr);
    case Coll::kReduce:
      return loomReduce(sb, rb, c.count, c.dtype, op, c.root, comm, nullptr);
    case Coll::kAllGather:
      return loomAllGather(sb, rb, c.count, c.dtype, comm, nullptr);
    case Coll::kReduceScatter:
      return loomReduceScatter(sb, rb, c.count, c.dtype, op, comm, nullptr);
    case Coll::kAllToAll:
      return loomAllToAll(sb, rb, c.count, c.dtype, comm, nullptr);
    case Coll::kSendRecv: {
      loomResult_t r0 = loomGroupStart();
      loomResult_t r1 = loomSend(sb, c.count, c.dtype, (rank + 1) % n, comm, nullptr);
      loomResult_t r2 = loomRecv(rb, c.count, c.dtype, (rank + n - 1) % n, comm, nullptr);
      loomResult_t r3 = loomGroupEnd();
      for (loomResult_t r : {r0, r1, r2, r3})
        if (r != loomSuccess) return r;
      return loomSuccess;
    }
    case Coll::kBarrier:
      return loomBarrier(comm, nullptr);
  }
  return loomInvalidUsage;
}

}  // namespace

namespace {

// Three barriers; each rank counts itself in before entering, so after the
// i-th barrier the shared counter must have reached n * i.
bool runBarriers(loomComm_t comm, int rank, int n, SharedPage* shared, uint32_t* rounds,
                 std::vector<std::string>* problems) {
  for (int i = 0; i < 3; ++i) {
    if (shared != nullptr) shared->counter.fetch_add(1);
    ++*rounds;
    loomResult_t r = loomBarrier(comm, nullptr);
    if (r != loomSuccess) {
      fprintf(stderr, "rank %d: Barrier: %s: %s\n", rank, loomGetErrorString(r),
              loomGetLastError(comm));
      return false;
    }
    uint32_t seen = shared != nullptr ? shared->counter.load() : n * *rounds;
    if (seen < n * *rounds)
      problems->push_back("left the barrier before every rank entered it: counter " +
                          std::to_string(seen) + " < " + std::to_string(n * *rounds));
  }
  return true;
}

struct Buffers {
  Buffer send, recv, ref;
  double inCalls[8] = {};  // seconds inside Loom per collective
  double large = 0;        // of which for the large counts
};

// Runs one case; false on an API error (reported), else problems holds any mismatch.
bool runCase(const Case& c, loomComm_t comm, int rank, int n, Buffers* b,
             std::vector<std::string>* problems) {
  const Gen gen(c, n);
  const size_t sz = typeBytes(c.dtype), cnt = c.count;
  const size_t inBytes = inElems(c, n) * sz, outBytes = outElems(c, n) * sz;
  unsigned char* send = b->send.get() + (c.misaligned ? 1 : 0);
  unsigned char* recv = b->recv.get() + (c.misaligned ? 3 : 0);
  for (size_t j = 0; j < inElems(c, n); ++j) gen.element(rank, j, b->ref.get() + j * sz);
  const bool wholeSpan = c.coll == Coll::kAllGather || c.coll == Coll::kReduceScatter;
  const size_t span = c.inPlace && wholeSpan ? n * cnt * sz : outBytes;
  memset(recv, kFill, span + kGuardBytes);
  unsigned char *sb = send, *rb = recv, *out = recv;
  if (!c.inPlace) {
    memcpy(send, b->ref.get(), inBytes);
  } else if (c.coll == Coll::kAllGather) {
    sb = recv + rank * cnt * sz;
    memcpy(sb, b->ref.get(), inBytes);
  } else {
    memcpy(recv, b->ref.get(), inBytes);
    sb = recv;
    if (c.coll == Coll::kReduceScatter) rb = out = recv + rank * cnt * sz;
  }
  loomRedOp_t op = static_cast<loomRedOp_t>(c.op);
  loomResult_t r = loomSuccess;
  if (c.op == kPreMulSum) {
    unsigned char scalar[8] = {};
    Num s;
    s.f = 0.5;
    s.u = 3;
    encode(c.dtype, s, scalar);
    r = loomRedOpCreatePreMulSum(&op, scalar, c.dtype, loomScalarHostImmediate, comm);
    memset(scalar, 0x7e, sizeof(scalar));  // host-immediate: the value was taken at creation
  }
  const double t0 = nowSeconds();
  if (r == loomSuccess) r = issue(c, sb, rb, op, comm, rank, n);
  b->inCalls[static_cast<int>(c.coll)] += nowSeconds() - t0;
  if (cnt == kLargeCount) b->large += nowSeconds() - t0;
  if (c.op == kPreMulSum && r == loomSuccess) r = loomRedOpDestroy(op, comm);
  if (r != loomSuccess) {
    fprintf(stderr, "rank %d: %s: %s: %s\n", rank, c.name().c_str(), loomGetErrorString(r),
            loomGetLastError(comm));
    return false;
  }
  unsigned char want[8];
  const bool checkOut = c.coll != Coll::kReduce || rank == c.root;
  for (size_t k = 0; checkOut && k < outElems(c, n) && problems->size() < 4; ++k) {
    gen.expected(rank, k, want);
    if (memcmp(out + k * sz, want, sz) != 0)
      problems->push_back("index " + std::to_string(k) + ": got " + show(c.dtype, out + k * sz) +
                          ", expected " + show(c.dtype, want));
  }
  if (!c.inPlace && memcmp(send, b->ref.get(), inBytes) != 0)
    problems->push_back("the send buffer changed");
  for (size_t g = 0; g < kGuardBytes; ++g)
    if (recv[span + g] != kFill) {
      problems->push_back("wrote past the end of the output, at byte " + std::to_string(span + g));
      break;
    }
  return true;
}

}  // namespace

SuiteStats runSuite(loomComm_t comm, int rank, int n, const std::vector<Case>& cases,
                    SharedPage* shared) {
  SuiteStats st;
  const double start = nowSeconds();
  size_t maxBytes = 0;
  for (const Case& c : cases) maxBytes = std::max(maxBytes, n * c.count * typeBytes(c.dtype));
  maxBytes += kGuardBytes + 8;
  Buffers b{allocBuffer(maxBytes), allocBuffer(maxBytes), allocBuffer(maxBytes)};
  uint32_t barrierRounds = 0;
  for (const Case& c : cases) {
    ++st.cases;
    std::vector<std::string> problems;
    bool ok = c.coll == Coll::kBarrier
                  ? runBarriers(comm, rank, n, shared, &barrierRounds, &problems)
                  : runCase(c, comm, rank, n, &b, &problems);
    if (!ok || !problems.empty()) ++st.failedCases;
    if (!problems.empty() && st.failedCases <= 20)
      for (const std::string& p : problems)
        fprintf(stderr, "rank %d: MISMATCH %s: %s\n", rank, c.name().c_str(), p.c_str());
    if (!ok) {
      ++st.apiErrors;
      break;  // the ranks no longer run the same operations
    }
  }
  st.seconds = nowSeconds() - start;
  std::string calls;
  for (int i = 0; i < 7; ++i)
    calls += std::string(" ") + collName(static_cast<Coll>(i)) + " " +
             std::to_string(static_cast<int>(b.inCalls[i] * 1000)) + ",";
  fprintf(stderr, "rank %d: %d cases, %d failed, %d API errors, %.2f s; ms in calls:%s large %d\n",
          rank, st.cases, st.failedCases, st.apiErrors, st.seconds, calls.c_str(),
          static_cast<int>(b.large * 1000));
  return st;
}

std::string readFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

loomResult_t startNonBlocking(RankContext& ctx) {
  loomConfig_t cfg = LOOM_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  loomResult_t r = loomGetUniqueId(&ctx.id);
  if (r == loomSuccess) r = loomCommInitRankConfig(&ctx.comm, ctx.nranks, ctx.id, ctx.rank, &cfg);
  return r;
}

loomResult_t initNonBlocking(RankContext& ctx) {
  const loomResult_t r = startNonBlocking(ctx);
  return r == loomInProgress ? loomCommWaitTicket(ctx.comm, 1, -1) : r;
}

uint64_t lastTicket(loomComm_t comm) {
  uint64_t t = 0;
  return loomCommLastTicket(comm, &t) == loomSuccess ? t : 0;
}

std::string takeFile(const std::string& path) {
  std::string text = readFile(path);
  std::remove(path.c_str());
  return text;
}

}  // namespace loomtest
