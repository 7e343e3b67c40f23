// Faults over many random seeds: a rank SIGKILLed at a random moment of a
// random collective (random type, size, root and victim), over shared memory
// and over TCP. Every survivor must fail with loomRemoteError or loomTimeout
// within the timeout, name the lost rank itself (a survivor that fails because
// a neighbour failed first learns the lost rank from the broken link: the
// shared-memory `broken` word or the TCP goodbye frame carries it;
// LOOM_FAULT_STRICT_NAMING=0 accepts a chain of blame instead), abort or destroy its communicator
// promptly, and leave nothing behind: no shared-memory segment of the communicator, no extra file
// descriptor, no extra thread. Then the survivors recover without restarting: they build a new
// communicator among themselves (a fresh unique id passed through shared memory, since
// loomCommSplit needs every rank of the failed communicator) and run checked collectives on it.
//
// LOOM_FAULT_SEEDS=N runs N seeds per transport (default 25, 5 in a sanitized build);
// LOOM_FAULT_SEED=S starts at seed S, so a failing case reruns alone with LOOM_FAULT_SEEDS=1.
#include <dirent.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "harness.h"
#include "leaks.h"

namespace loomtest {
namespace {

constexpr int kTimeoutMs = 3000;  // LOOM_TIMEOUT_MS of every rank
constexpr double kSlackS = 2.0;   // beyond the timeout, for a loaded machine
constexpr double kPromptS = 2.0;  // loomCommAbort / loomCommDestroy after a failure
// A sanitized build runs several times slower (scripts/sanitize.sh): fewer seeds by default.
// And a rank forked while the launcher's rendezvous root thread runs can stay stuck on the
// sanitizer allocator's lock, so there rank 0 hosts the root (LOOM_COMM_ID) and the recovery's
// loomGetUniqueId names that address again, hosted by the lowest survivor.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr int kDefaultSeeds = 5;
constexpr bool kIdFromParent = false;
#else
constexpr int kDefaultSeeds = 25;
constexpr bool kIdFromParent = true;
#endif

int envInt(const char* name, int fallback) {
  const char* v = getenv(name);
  return v != nullptr && *v != '\0' ? atoi(v) : fallback;
}

// ---- One kill case ----

// Shared by every rank of a case (MAP_SHARED before the fork, so the ranks inherit it).
constexpr int kMaxRanks = 8;

struct FaultPage {
  std::atomic<int64_t> killedAtUs;  // CLOCK_MONOTONIC, written by the victim just before dying
  std::atomic<uint32_t> idReady;    // the recovery id below is valid
  loomUniqueId recoveryId;
  std::atomic<int> blamed[kMaxRanks];  // the rank each survivor's error names (-1: none)
};

struct KillPlan {
  uint64_t seed = 0;
  bool shm = true;
  int nranks = 3;
  int victim = 0;
  int delayMs = 0;
  Case c;
  enum Finish { kAbort, kDestroy, kAbortThenStaleDestroy } finish = kAbort;
  bool trySplit = false;  // call loomCommSplit on the failed communicator first
  std::string describe() const;
};

std::string KillPlan::describe() const {
  static const char* const kFinish[] = {"abort", "destroy", "abort+stale destroy"};
  char buf[320];
  snprintf(buf, sizeof(buf), "seed %llu: %s, %d ranks, %s, rank %d killed after %d ms, %s",
           static_cast<unsigned long long>(seed), shm ? "shm" : "tcp", nranks, c.name().c_str(),
           victim, delayMs, kFinish[finish]);
  return buf;
}

KillPlan makePlan(uint64_t seed, bool shm) {
  std::mt19937_64 rng(seed * 0x9e3779b97f4a7c15ull + (shm ? 1 : 2));
  KillPlan p;
  p.seed = seed;
  p.shm = shm;
  p.nranks = 2 + static_cast<int>(rng() % 3);  // 2..4
  p.victim = static_cast<int>(rng() % p.nranks);
  p.delayMs = static_cast<int>(rng() % 250);
  std::vector<Case> cases = buildCases(p.nranks, SuiteLevel::kCompact);
  p.c = cases[rng() % cases.size()];
  // 1 .. 2^18 elements, log-uniform: a count of 0 would not talk to the peers at all.
  p.c.count = static_cast<size_t>(std::exp2(std::uniform_real_distribution<double>(0, 18)(rng)));
  p.c.root = static_cast<int>(rng() % p.nranks);
  p.c.seed = rng();
  p.finish = static_cast<KillPlan::Finish>(rng() % 3);
  p.trySplit = rng() % 4 == 0;
  return p;
}

// The rank an error message blames: the last "rank N" that is not "rank N of M" (which names
// the reporting rank itself); -1 when there is none.
int blamedRank(const std::string& text) {
  int blamed = -1;
  for (size_t at = text.find("rank "); at != std::string::npos; at = text.find("rank ", at + 1)) {
    size_t end = at + 5;
    while (end < text.size() && isdigit(static_cast<unsigned char>(text[end]))) ++end;
    if (end == at + 5 || text.compare(end, 4, " of ") == 0) continue;
    blamed = atoi(text.c_str() + at + 5);
  }
  return blamed;
}

// Whether following each survivor's blame from `from` reaches the victim through survivors.
bool blameReachesVictim(const FaultPage& page, int from, int victim, int nranks) {
  int r = from;
  for (int hop = 0; hop < nranks; ++hop) {
    r = page.blamed[r].load();
    if (r == victim) return true;
    if (r < 0 || r >= nranks) return false;
  }
  return false;  // a cycle among survivors
}

int64_t monotonicUs() { return static_cast<int64_t>(nowSeconds() * 1e6); }

// Runs the plan's case over and over until an API error; returns whether one came.
bool runUntilError(loomComm_t comm, int rank, const KillPlan& p) {
  const std::vector<Case> batch(200, p.c);
  const double start = nowSeconds();
  while (nowSeconds() - start < 30) {
    SuiteStats st = runSuite(comm, rank, p.nranks, batch, nullptr);
    if (st.failedCases > st.apiErrors) {  // the case that hit the error counts as failed too
      fprintf(stderr, "rank %d: WRONG RESULT before the failure\n", rank);
      return false;
    }
    if (st.apiErrors > 0) return true;
  }
  return false;
}

// The survivors' new communicator: ranks in old order without the victim. The lowest survivor
// makes the id and publishes it; the others wait for it.
loomResult_t rebuild(const KillPlan& p, int rank, FaultPage* page, loomComm_t* out) {
  const int newRank = rank < p.victim ? rank : rank - 1;
  const int leader = p.victim == 0 ? 1 : 0;
  if (rank == leader) {
    loomResult_t r = loomGetUniqueId(&page->recoveryId);
    if (r != loomSuccess) return r;
    page->idReady.store(1);
  }
  for (int i = 0; i < 3000 && page->idReady.load() == 0; ++i) usleep(1000);
  if (page->idReady.load() == 0) return loomTimeout;
  return loomCommInitRank(out, p.nranks - 1, page->recoveryId, newRank);
}

int killRank(const KillPlan& p, FaultPage* page, RankContext& ctx) {
  const Footprint before = footprint();
  loomComm_t comm = nullptr;
  loomResult_t r = kIdFromParent ? loomSuccess : loomGetUniqueId(&ctx.id);
  if (r == loomSuccess) r = loomCommInitRank(&comm, p.nranks, ctx.id, ctx.rank);
  if (r != loomSuccess) {
    fprintf(stderr, "rank %d: init: %s: %s\n", ctx.rank, loomGetErrorString(r),
            loomGetLastError(nullptr));
    return 1;
  }
  std::vector<uint64_t> hashes{commHash(comm)};
  if (ctx.rank == p.victim) {
    const int delayMs = p.delayMs;
    std::thread([page, delayMs] {
      usleep(static_cast<useconds_t>(delayMs) * 1000);
      page->killedAtUs.store(monotonicUs());
      raise(SIGKILL);
    }).detach();
    runUntilError(comm, ctx.rank, p);
    fprintf(stderr, "rank %d: the victim is still alive\n", ctx.rank);
    return 1;
  }
  int failures = 0;
  auto fail = [&](const std::string& what) {
    fprintf(stderr, "rank %d: FAIL %s\n", ctx.rank, what.c_str());
    ++failures;
  };
  if (!runUntilError(comm, ctx.rank, p)) {
    fail("no error within 30 s of a peer's death");
    return 1;
  }
  const int64_t erredAtUs = monotonicUs();
  const std::string message = loomGetLastError(comm);
  const int64_t killedAtUs = page->killedAtUs.load();
  const double afterKillS = killedAtUs > 0 ? (erredAtUs - killedAtUs) * 1e-6 : -1;
  loomResult_t stored = loomSuccess;
  loomCommGetAsyncError(comm, &stored);
  fprintf(stderr, "rank %d: %s %.0f ms after the kill: %s\n", ctx.rank, loomGetErrorString(stored),
          afterKillS * 1000, message.c_str());
  if (stored != loomRemoteError && stored != loomTimeout)
    fail(std::string("stored error ") + loomGetErrorString(stored) +
         ", expected loomRemoteError or loomTimeout");
  if (killedAtUs == 0) fail("failed before the victim was killed");
  if (afterKillS > kTimeoutMs / 1000.0 + kSlackS)
    fail("the error came " + std::to_string(afterKillS) + " s after the kill");
  // A survivor whose wait was on the dead rank names it; one that waited on a survivor which had
  // already failed names the rank that survivor lost (carried by the broken link). The parent
  // also checks the chain of blame, all that LOOM_FAULT_STRICT_NAMING=0 demands.
  page->blamed[ctx.rank].store(blamedRank(message));
  if (envInt("LOOM_FAULT_STRICT_NAMING", 1) != 0 && blamedRank(message) != p.victim)
    fail("the error does not name rank " + std::to_string(p.victim) + ": " + message);

  // What loomCommSplit does on a communicator that lost a rank.
  loomComm_t split = nullptr;
  if (p.trySplit) {
    const double t0 = nowSeconds();
    r = loomCommSplit(comm, 0, ctx.rank, &split, nullptr);
    const double s = nowSeconds() - t0;
    fprintf(stderr, "rank %d: loomCommSplit on the failed communicator: %s after %.0f ms: %s\n",
            ctx.rank, loomGetErrorString(r), s * 1000, loomGetLastError(comm));
    if (s > kTimeoutMs / 1000.0 + kSlackS) fail("loomCommSplit took " + std::to_string(s) + " s");
    if (r == loomSuccess) {
      hashes.push_back(commHash(split));
      loomCommDestroy(split);  // it holds the dead rank: nothing to run on it
    }
  }

  double t0 = nowSeconds();
  r = p.finish == KillPlan::kDestroy ? loomCommDestroy(comm) : loomCommAbort(comm);
  double s = nowSeconds() - t0;
  fprintf(stderr, "rank %d: %s: %s after %.0f ms\n", ctx.rank,
          p.finish == KillPlan::kDestroy ? "loomCommDestroy" : "loomCommAbort",
          loomGetErrorString(r), s * 1000);
  if (s > kPromptS) fail("abort/destroy took " + std::to_string(s) + " s");
  if (p.finish == KillPlan::kAbort && r != loomSuccess) fail("loomCommAbort failed");
  if (p.finish == KillPlan::kAbortThenStaleDestroy) {
    // The handle is gone: a clear error, not a crash.
    r = loomCommDestroy(comm);
    if (r != loomInvalidArgument || !strstr(loomGetLastError(nullptr), "comm"))
      fail(std::string("loomCommDestroy after loomCommAbort: ") + loomGetErrorString(r) + ": " +
           loomGetLastError(nullptr));
  }
  for (const std::string& l : leaks(before, hashes, p.nranks)) fail("after the failure: " + l);

  // Recovery: a new communicator among the survivors, checked collectives on it.
  loomComm_t fresh = nullptr;
  t0 = nowSeconds();
  r = rebuild(p, ctx.rank, page, &fresh);
  if (r != loomSuccess) {
    fail(std::string("rebuilding among the survivors: ") + loomGetErrorString(r) + ": " +
         loomGetLastError(nullptr));
    return 1;
  }
  const int m = p.nranks - 1, newRank = ctx.rank < p.victim ? ctx.rank : ctx.rank - 1;
  hashes.push_back(commHash(fresh));
  std::vector<Case> all = buildCases(m, SuiteLevel::kCompact), some;
  std::mt19937_64 rng(p.seed);
  for (int i = 0; i < 8; ++i) some.push_back(all[rng() % all.size()]);
  SuiteStats st = runSuite(fresh, newRank, m, some, nullptr);
  fprintf(stderr, "rank %d: recovered as rank %d of %d in %.0f ms: %d cases, %d failed\n", ctx.rank,
          newRank, m, (nowSeconds() - t0) * 1000, st.cases, st.failedCases);
  if (st.failedCases != 0 || st.apiErrors != 0) fail("collectives after recovery");
  r = loomCommDestroy(fresh);
  if (r != loomSuccess)
    fail(std::string("destroying the new communicator: ") + loomGetLastError(nullptr));
  for (const std::string& l : leaks(before, hashes, p.nranks)) fail("after recovery: " + l);
  return failures == 0 ? 0 : 1;
}

class RandomKillTest : public ::testing::TestWithParam<bool> {};

TEST_P(RandomKillTest, SurvivorsFailNameTheRankLeakNothingAndRecover) {
  const int seeds = envInt("LOOM_FAULT_SEEDS", kDefaultSeeds);
  const int first = envInt("LOOM_FAULT_SEED", 1);
  auto* page = static_cast<FaultPage*>(
      mmap(nullptr, sizeof(FaultPage), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(page, MAP_FAILED);
  int passed = 0, survivors = 0, direct = 0;
  const double start = nowSeconds();
  for (int seed = first; seed < first + seeds; ++seed) {
    const KillPlan plan = makePlan(static_cast<uint64_t>(seed), GetParam());
    new (page) FaultPage();
    for (auto& b : page->blamed) b.store(-2);
    LaunchOptions opts;
    opts.nranks = plan.nranks;
    opts.shm = plan.shm;
    opts.timeoutMs = kTimeoutMs;
    opts.idFromParent = kIdFromParent;  // no LOOM_COMM_ID: the survivors' id is a fresh one
    opts.initComm = false;              // each rank counts its fds and threads before init
    opts.failGraceMs = 30000;           // the victim's death must not end the others
    opts.deadlineMs = 60000;
    LaunchResult res =
        launch(opts, [&plan, page](RankContext& ctx) { return killRank(plan, page, ctx); });
    bool ok = res.error.empty() && res.ranks.size() == static_cast<size_t>(plan.nranks);
    for (const RankOutcome& o : res.ranks) {
      if (o.rank == plan.victim)
        ok = ok && o.signal == SIGKILL && !o.killed;
      else
        ok = ok && o.exited && o.exitCode == 0;
    }
    std::string blame;
    for (int r = 0; r < plan.nranks; ++r) {
      if (r == plan.victim) continue;
      const int b = page->blamed[r].load();
      ++survivors;
      direct += b == plan.victim;
      blame += " " + std::to_string(r) + "->" + std::to_string(b);
      if (!blameReachesVictim(*page, r, plan.victim, plan.nranks)) {
        ok = false;
        blame += "(does not lead to rank " + std::to_string(plan.victim) + ")";
      }
    }
    printf("%s %s (%.2f s); blamed:%s\n", ok ? "ok  " : "FAIL", plan.describe().c_str(),
           res.seconds, blame.c_str());
    fflush(stdout);
    EXPECT_TRUE(ok) << plan.describe() << "\n" << res.report(true);
    passed += ok;
  }
  printf("%d of %d kill cases passed in %.1f s; %d of %d survivors named the lost rank itself\n",
         passed, seeds, nowSeconds() - start, direct, survivors);
  munmap(page, sizeof(FaultPage));
}

INSTANTIATE_TEST_SUITE_P(Transports, RandomKillTest, ::testing::Values(true, false),
                         shmOrTcp<::testing::TestParamInfo<bool>>);

}  // namespace
}  // namespace loomtest
