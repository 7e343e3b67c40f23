// Failures over real processes: a rank that dies mid-operation, an abort from
// another thread, peers that never come (timeouts), bad arguments at every
// entry point, and strangers on the rendezvous port.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "harness.h"

namespace loomtest {
namespace {

// ---- A rank dies in the middle of a series of large all-reduces ----

constexpr int kDeathTimeoutMs = 15000;
constexpr int kVictim = 1;
constexpr int kVictimIteration = 3;

int deathRank(RankContext& ctx) {
  constexpr size_t kCount = size_t{1} << 21;  // 8 MB of fp32
  std::vector<float> send(kCount, 1.0f), recv(kCount);
  for (int iter = 0; iter < 500; ++iter) {
    if (ctx.rank == kVictim && iter == kVictimIteration) {
      // Die a moment into this all-reduce, while the others wait on this rank.
      std::thread([] {
        usleep(3000);
        raise(SIGKILL);
      }).detach();
    }
    double t0 = nowSeconds();
    loomResult_t r =
        loomAllReduce(send.data(), recv.data(), kCount, loomFloat32, loomSum, ctx.comm, nullptr);
    double ms = (nowSeconds() - t0) * 1000;
    if (r == loomSuccess) {
      if (recv[kCount - 1] != static_cast<float>(ctx.nranks)) {
        fprintf(stderr, "rank %d: iteration %d: wrong sum %g\n", ctx.rank, iter, recv[kCount - 1]);
        return 1;
      }
      continue;
    }
    int failures = 0;
    fprintf(stderr, "rank %d: iteration %d failed after %.0f ms with %s: %s\n", ctx.rank, iter, ms,
            loomGetErrorString(r), loomGetLastError(ctx.comm));
    if (r != loomRemoteError && r != loomTimeout) {
      fprintf(stderr, "rank %d: expected loomRemoteError or loomTimeout\n", ctx.rank);
      ++failures;
    }
    if (ms >= kDeathTimeoutMs) {
      fprintf(stderr, "rank %d: the error took %.0f ms, not within LOOM_TIMEOUT_MS=%d\n", ctx.rank,
              ms, kDeathTimeoutMs);
      ++failures;
    }
    if (iter < kVictimIteration) {
      fprintf(stderr, "rank %d: failed before the victim died\n", ctx.rank);
      ++failures;
    }
    loomResult_t async = loomSuccess;
    loomResult_t ra = loomCommGetAsyncError(ctx.comm, &async);
    if (ra != loomSuccess || async == loomSuccess) {
      fprintf(stderr, "rank %d: loomCommGetAsyncError: %s, stored %s (expected an error)\n",
              ctx.rank, loomGetErrorString(ra), loomGetErrorString(async));
      ++failures;
    }
    // The next call must fail too, and at once.
    t0 = nowSeconds();
    r = loomAllReduce(send.data(), recv.data(), 1024, loomFloat32, loomSum, ctx.comm, nullptr);
    ms = (nowSeconds() - t0) * 1000;
    if (r == loomSuccess || ms > 2000) {
      fprintf(stderr, "rank %d: an all-reduce after the failure: %s after %.0f ms\n", ctx.rank,
              loomGetErrorString(r), ms);
      ++failures;
    }
    // Rank 0 aborts, the others destroy; both must return promptly.
    t0 = nowSeconds();
    r = ctx.rank == 0 ? loomCommAbort(ctx.comm) : loomCommDestroy(ctx.comm);
    ms = (nowSeconds() - t0) * 1000;
    ctx.comm = nullptr;
    fprintf(stderr, "rank %d: %s returned %s after %.0f ms\n", ctx.rank,
            ctx.rank == 0 ? "loomCommAbort" : "loomCommDestroy", loomGetErrorString(r), ms);
    if (ms > 5000) ++failures;
    if (ctx.rank == 0 && r != loomSuccess) ++failures;
    return failures == 0 ? 0 : 1;
  }
  fprintf(stderr, "rank %d: every all-reduce succeeded; rank %d did not die?\n", ctx.rank, kVictim);
  return 1;
}

class PeerDeathTest : public ::testing::TestWithParam<bool> {};

TEST_P(PeerDeathTest, OthersFailFastThenAbortAndDestroy) {
  LaunchOptions opts;
  opts.nranks = 3;
  opts.shm = GetParam();
  opts.timeoutMs = kDeathTimeoutMs;
  opts.failGraceMs = 3 * kDeathTimeoutMs;  // the victim's death must not end the others
  opts.deadlineMs = 90000;
  LaunchResult res = launch(opts, deathRank);
  ASSERT_EQ(res.ranks.size(), 3u) << res.report();
  for (const RankOutcome& o : res.ranks) {
    if (o.rank == kVictim)
      EXPECT_TRUE(o.signal == SIGKILL && !o.killed) << res.report(true);
    else
      EXPECT_TRUE(o.exited && o.exitCode == 0) << "rank " << o.rank << "\n" << res.report(true);
  }
}

// ---- loomCommAbort from another thread ----

// Rank 0 waits in an all-reduce that rank 1 has not joined; another thread
// aborts rank 0's communicator, which must end the wait at once. Rank 1 then
// joins the all-reduce and must see loomRemoteError, while rank 0's process
// is still alive, within the timeout. The all-reduce is a ring (LOOM_ALGO), in
// which rank 1 needs data rank 0 sends only after hearing from it: with one
// exchange (rd, which the tuner takes over TCP at this size) rank 0's whole
// input is on its way before the abort, and rank 1's all-reduce rightly
// completes.
// Runs call on this thread while another thread aborts ctx.comm 0.5 s in; returns call's result,
// and in *late the seconds from the abort to call's return (or a failed abort: 1e9).
template <typename F>
loomResult_t callWhileAborted(RankContext& ctx, const char* what, F call, double* late) {
  double abortedAt = 0;
  loomResult_t aborted = loomInternalError;
  std::thread aborter([&] {
    usleep(500000);
    abortedAt = nowSeconds();
    aborted = loomCommAbort(ctx.comm);
  });
  const loomResult_t r = call();
  const std::string text = r == loomSuccess ? "" : loomGetLastError(nullptr);
  const double ended = nowSeconds();
  aborter.join();
  ctx.comm = nullptr;  // freed by loomCommAbort
  fprintf(stderr, "rank 0: %s returned %s %.0f ms after the abort: %s; abort: %s\n", what,
          loomGetErrorString(r), (ended - abortedAt) * 1000, text.c_str(),
          loomGetErrorString(aborted));
  *late = aborted == loomSuccess ? ended - abortedAt : 1e9;
  return r;
}

int abortRank(RankContext& ctx) {
  constexpr size_t kCount = 1 << 16;
  std::vector<float> x(kCount, 1.0f), y(kCount);
  SharedPage* sh = ctx.shared;
  int failures = 0;
  if (ctx.rank == 0) {
    double late = 0;
    const loomResult_t r = callWhileAborted(
        ctx, "all-reduce",
        [&] {
          return loomAllReduce(x.data(), y.data(), kCount, loomFloat32, loomSum, ctx.comm, nullptr);
        },
        &late);
    if (r == loomSuccess || late > 2.0) ++failures;
    sh->flag.store(1);
    for (int i = 0; i < 3000 && sh->words[0].load() == 0; ++i) usleep(10000);
  } else {
    for (int i = 0; i < 3000 && sh->flag.load() == 0; ++i) usleep(10000);
    const double t0 = nowSeconds();
    loomResult_t r =
        loomAllReduce(x.data(), y.data(), kCount, loomFloat32, loomSum, ctx.comm, nullptr);
    const double ms = (nowSeconds() - t0) * 1000;
    sh->words[0].store(1);
    fprintf(stderr, "rank 1: all-reduce against the aborted rank: %s after %.0f ms: %s\n",
            loomGetErrorString(r), ms, loomGetLastError(ctx.comm));
    if (r != loomRemoteError || ms >= kDeathTimeoutMs) ++failures;
  }
  return failures == 0 ? 0 : 1;
}

TEST_P(PeerDeathTest, AbortFromAnotherThread) {
  LaunchOptions opts;
  opts.nranks = 2;
  opts.shm = GetParam();
  opts.timeoutMs = kDeathTimeoutMs;
  opts.failGraceMs = 3 * kDeathTimeoutMs;
  opts.deadlineMs = 90000;
  if (!opts.shm) opts.env.push_back({"LOOM_ALGO", "allreduce:ring"});
  LaunchResult res = launch(opts, abortRank);
  EXPECT_TRUE(res.allPassed()) << res.report(true);
}

INSTANTIATE_TEST_SUITE_P(Transports, PeerDeathTest, ::testing::Values(true, false),
                         shmOrTcp<::testing::TestParamInfo<bool>>);

// Rank 0 shrinks or splits its communicator while rank 1, alive, never does; another thread
// aborts rank 0's communicator, which must end the call at once with the abort's code (a
// shrink's new communicator used to wait out the whole timeout, and a split's abort was
// reported as an internal error).
int abortedWhileMaking(RankContext& ctx, bool shrink) {
  SharedPage* sh = ctx.shared;
  int failures = 0;
  if (ctx.rank == 0) {
    loomComm_t made = nullptr;
    double late = 0;
    const loomResult_t r = callWhileAborted(
        ctx, shrink ? "shrink" : "split",
        [&] {
          return shrink ? loomCommShrink(ctx.comm, nullptr, 0, &made, nullptr, LOOM_SHRINK_DEFAULT)
                        : loomCommSplit(ctx.comm, 0, 0, &made, nullptr);
        },
        &late);
    if (r != loomInvalidUsage || made != nullptr || late > 2.0) ++failures;
    sh->flag.store(1);
  } else {
    for (int i = 0; i < 3000 && sh->flag.load() == 0; ++i) usleep(10000);
  }
  return failures == 0 ? 0 : 1;
}

class AbortWhileMaking : public ::testing::TestWithParam<bool> {};  // true: shrink; false: split

TEST_P(AbortWhileMaking, EndsItAtOnce) {
  LaunchOptions opts;
  opts.timeoutMs = 15000;
  opts.deadlineMs = 60000;
  const bool shrink = GetParam();
  LaunchResult res =
      launch(opts, [shrink](RankContext& ctx) { return abortedWhileMaking(ctx, shrink); });
  EXPECT_TRUE(res.allPassed()) << res.report(true);
}

INSTANTIATE_TEST_SUITE_P(Calls, AbortWhileMaking, ::testing::Values(true, false),
                         [](const ::testing::TestParamInfo<bool>& p) {
                           return p.param ? "shrink" : "split";
                         });

// loomCommAbort on one thread at a random moment while another thread calls in a loop: the
// calls that found the communicator live finish (or fail) before it is freed, and the later ones
// fail naming comm. A call that had looked the communicator up but not yet started its
// operation used to run on freed memory (a crash; under ASan a use after free), and a
// non-blocking one could hang on the freed worker's mutex.
int abortRacingCalls(RankContext& ctx, bool blocking) {
  int failures = 0;
  unsigned seed = 12345u + static_cast<unsigned>(blocking);
  for (int it = 0; it < 150 && failures == 0; ++it) {
    loomComm_t comm = nullptr;
    loomResult_t r = loomSuccess;
    if (blocking) {
      r = loomCommInitAll(&comm, 1, nullptr);
    } else {
      loomConfig_t cfg = LOOM_CONFIG_INITIALIZER;
      cfg.blocking = 0;
      loomUniqueId id;
      r = loomGetUniqueId(&id);
      if (r == loomSuccess) r = loomCommInitRankConfig(&comm, 1, id, 0, &cfg);
      if (r == loomInProgress) r = loomCommWaitTicket(comm, 1, -1);
    }
    if (r != loomSuccess) {
      fprintf(stderr, "rank %d: init: %s\n", ctx.rank, loomGetLastError(nullptr));
      return 1;
    }
    std::atomic<bool> stop{false};
    std::thread caller([&] {
      float x[64], y[64];
      for (int i = 0; i < 64; ++i) x[i] = static_cast<float>(i);
      while (!stop.load()) {
        loomResult_t c = loomAllReduce(x, y, 64, loomFloat32, loomSum, comm, nullptr);
        if (c == loomInProgress) {
          uint64_t t = 0;
          c = loomCommLastTicket(comm, &t);
          if (c == loomSuccess) c = loomCommWaitTicket(comm, t, -1);
        }
        if (c == loomSuccess && y[63] != 63.0f) {
          fprintf(stderr, "iteration %d: wrong sum %g\n", it, y[63]);
          ++failures;
        }
        if (c == loomInvalidArgument) break;  // destroyed: every later call says so too
      }
    });
    usleep(static_cast<useconds_t>(rand_r(&seed) % 2000));
    if (loomCommAbort(comm) != loomSuccess) {
      fprintf(stderr, "iteration %d: abort: %s\n", it, loomGetLastError(nullptr));
      ++failures;
    }
    stop.store(true);
    caller.join();
  }
  return failures == 0 ? 0 : 1;
}

class AbortRace : public ::testing::TestWithParam<bool> {};  // true: blocking

TEST_P(AbortRace, CallsNeverUseAFreedCommunicator) {
  LaunchOptions opts;
  opts.nranks = 1;
  opts.initComm = false;
  opts.timeoutMs = 5000;
  opts.deadlineMs = 120000;
  const bool blocking = GetParam();
  LaunchResult res =
      launch(opts, [blocking](RankContext& ctx) { return abortRacingCalls(ctx, blocking); });
  EXPECT_TRUE(res.allPassed()) << res.report(true);
}

INSTANTIATE_TEST_SUITE_P(Modes, AbortRace, ::testing::Values(true, false),
                         [](const ::testing::TestParamInfo<bool>& p) {
                           return p.param ? "blocking" : "nonblocking";
                         });

// A config given to loomCommSplit or loomCommShrink sets only the fields it defines: the rest
// are the parent's, not the defaults (the environment's LOOM_TIMEOUT_MS, 30 s here). Rank 0 runs
// an all-reduce on each child that rank 1 never joins: it fails within the child's timeout, named
// by the child's name. It used to wait the environment's 30 s and lose the parent's name.
int madeWithPartConfig(RankContext& ctx) {
  SharedPage* sh = ctx.shared;
  int failures = 0;
  auto fail = [&](const std::string& what) {
    fprintf(stderr, "rank %d: %s\n", ctx.rank, what.c_str());
    ++failures;
  };
  loomConfig_t parentCfg = LOOM_CONFIG_INITIALIZER;
  parentCfg.timeoutMs = 3000;
  parentCfg.commName = "parent-comm";
  loomResult_t r = loomGetUniqueId(&ctx.id);
  if (r == loomSuccess)
    r = loomCommInitRankConfig(&ctx.comm, ctx.nranks, ctx.id, ctx.rank, &parentCfg);
  if (r != loomSuccess) return fail(std::string("init: ") + loomGetLastError(nullptr)), 1;
  // Rank 0 alone runs an all-reduce on made; it must time out after timeoutMs (and well before
  // the other communicator's timeout) with an error that names `name`.
  auto alone = [&](loomComm_t made, int timeoutMs, const char* name, uint32_t step) {
    if (ctx.rank == 0) {
      float x = 1, y = 0;
      const double t0 = nowSeconds();
      const loomResult_t a = loomAllReduce(&x, &y, 1, loomFloat32, loomSum, made, nullptr);
      const double s = nowSeconds() - t0;
      const std::string msg = loomGetLastError(made);
      if (a != loomTimeout) fail(std::string("expected loomTimeout, got ") + loomGetErrorString(a));
      if (s < timeoutMs / 1000.0 * 0.9 || s > timeoutMs / 1000.0 + 1.3)
        fail("timed out after " + std::to_string(s) + " s; its timeout is " +
             std::to_string(timeoutMs) + " ms");
      if (msg.find(name) == std::string::npos)
        fail("error does not name " + std::string(name) + ": " + msg);
      sh->flag.store(step);
    } else {
      for (int i = 0; i < 3000 && sh->flag.load() < step; ++i) usleep(10000);
    }
    loomCommAbort(made);
  };
  loomConfig_t named = LOOM_CONFIG_INITIALIZER;
  named.commName = "child-comm";
  loomComm_t child = nullptr;
  r = loomCommSplit(ctx.comm, 0, ctx.rank, &child, &named);
  if (r != loomSuccess) return fail(std::string("split: ") + loomGetLastError(ctx.comm)), 1;
  alone(child, 3000, "child-comm", 1);  // the parent's timeout, its own name
  loomConfig_t timed = LOOM_CONFIG_INITIALIZER;
  timed.timeoutMs = 1500;
  loomComm_t shrunk = nullptr;
  r = loomCommShrink(ctx.comm, nullptr, 0, &shrunk, &timed, LOOM_SHRINK_DEFAULT);
  if (r != loomSuccess) return fail(std::string("shrink: ") + loomGetLastError(ctx.comm)), 1;
  alone(shrunk, 1500, "parent-comm", 2);  // its own timeout, the parent's name
  return failures == 0 ? 0 : 1;
}

TEST(Config, SplitAndShrinkTakeTheParentsFieldsTheirConfigLeavesUndefined) {
  LaunchOptions opts;
  opts.initComm = false;
  opts.timeoutMs = 30000;
  opts.deadlineMs = 60000;
  LaunchResult res = launch(opts, madeWithPartConfig);
  EXPECT_TRUE(res.allPassed()) << res.report(true);
}

// A split's child outlives its parent: the parent's abort flag, which ends the child's set-up,
// is not watched (read) after it (under ASan a read of the freed parent fails this test).
TEST(Abort, ASplitsChildOutlivesItsParent) {
  LaunchOptions opts;
  opts.deadlineMs = 60000;
  LaunchResult res = launch(opts, [](RankContext& ctx) {
    loomComm_t sub = nullptr, sub2 = nullptr;
    loomResult_t r = loomCommSplit(ctx.comm, 0, ctx.rank, &sub, nullptr);
    if (r == loomSuccess) r = loomCommDestroy(ctx.comm);
    ctx.comm = nullptr;
    if (r == loomSuccess) r = loomCommSplit(sub, 0, ctx.rank, &sub2, nullptr);  // sub's ring
    float x[4] = {1, 2, 3, 4}, y[4] = {};
    if (r == loomSuccess) r = loomAllReduce(x, y, 4, loomFloat32, loomSum, sub2, nullptr);
    if (r != loomSuccess || y[3] != 4.0f * ctx.nranks) {
      fprintf(stderr, "split, destroy the parent, split the child: %s: %s\n", loomGetErrorString(r),
              loomGetLastError(nullptr));
      return 1;
    }
    return loomCommDestroy(sub2) == loomSuccess && loomCommDestroy(sub) == loomSuccess ? 0 : 1;
  });
  EXPECT_TRUE(res.allPassed()) << res.report(true);
}

// A timeout longer than 64-bit nanosecond deadlines can hold is taken as the longest one, not
// overflowed into none (every wait used to fail at once).
TEST(Timeouts, AHugeTimeoutIsTakenAsTheLongest) {
  LaunchOptions opts;
  opts.deadlineMs = 60000;
  opts.env.push_back({"LOOM_TIMEOUT_MS", "10000000000000"});
  LaunchResult res = launch(opts, [](RankContext& ctx) {
    float x[4] = {1, 2, 3, 4}, y[4] = {};
    const loomResult_t r = loomAllReduce(x, y, 4, loomFloat32, loomSum, ctx.comm, nullptr);
    if (r != loomSuccess || y[3] != 4.0f * ctx.nranks) {
      fprintf(stderr, "all-reduce: %s: %s\n", loomGetErrorString(r), loomGetLastError(ctx.comm));
      return 1;
    }
    return 0;
  });
  EXPECT_TRUE(res.allPassed()) << res.report(true);
}

// ---- A peer that is alive but never comes: timeouts ----

constexpr int kShortTimeoutMs = 1500;

// Checks that `call` failed with loomTimeout after about kShortTimeoutMs.
bool timedOut(const char* what, loomResult_t r, double seconds) {
  fprintf(stderr, "%s: %s after %.0f ms: %s\n", what, loomGetErrorString(r), seconds * 1000,
          loomGetLastError(nullptr));
  return r == loomTimeout && seconds * 1000 > kShortTimeoutMs * 0.9 &&
         seconds * 1000 < kShortTimeoutMs + 3000;
}

TEST(Timeouts, CollectiveWithAPeerThatNeverCalls) {
  LaunchOptions opts;
  opts.nranks = 2;
  opts.timeoutMs = kShortTimeoutMs;
  opts.deadlineMs = 60000;
  LaunchResult res = launch(opts, [](RankContext& ctx) {
    float x[64] = {}, y[64];
    if (ctx.rank == 1) {  // alive, but skips the all-reduce; destroys once rank 0 gave up
      for (int i = 0; i < 1000 && ctx.shared->flag.load() == 0; ++i) usleep(10000);
      double t0 = nowSeconds();
      loomResult_t r = loomCommDestroy(ctx.comm);
      ctx.comm = nullptr;
      double ms = (nowSeconds() - t0) * 1000;
      fprintf(stderr, "rank 1: loomCommDestroy after rank 0 aborted: %s after %.0f ms\n",
              loomGetErrorString(r), ms);
      return ms < 3000 ? 0 : 1;
    }
    double t0 = nowSeconds();
    loomResult_t r = loomAllReduce(x, y, 64, loomFloat32, loomSum, ctx.comm, nullptr);
    bool ok = timedOut("rank 0 all-reduce", r, nowSeconds() - t0);
    ctx.shared->flag.store(1);
    loomCommAbort(ctx.comm);
    ctx.comm = nullptr;
    return ok ? 0 : 1;
  });
  EXPECT_TRUE(res.allPassed()) << res.report(true);
}

// Every rank but the last initialises; the last never joins. Each must time out, and its error
// must name the missing rank: rank 0's because it hosts the root, which knows who never came,
// the others' because a rank whose timeout ends leaves, and the root answers every rank that
// joined with who never came.
// rank0LateMs: how much later rank 0 starts than the others (whose own timeouts then end first).
// No rank's error may come before the first rank's timeout could have ended (a rank refused
// because another gave up hears it before its own timeout would): the ranks' starts are kept
// in the shared page, on the clock every process shares.
void initWithoutTheLastRank(int nranks, int rank0LateMs) {
  LaunchOptions opts;
  opts.nranks = nranks;
  opts.initComm = false;
  opts.timeoutMs = kShortTimeoutMs;
  opts.deadlineMs = 60000;
  LaunchResult res = launch(opts, [&](RankContext& ctx) {
    if (ctx.rank == nranks - 1) return 0;  // never joins
    if (ctx.rank == 0) usleep(rank0LateMs * 1000);
    loomUniqueId id;
    loomComm_t comm = nullptr;
    // Milliseconds modulo 2^32 (differences of such are right while under 49 days).
    const auto ms = [] {
      return static_cast<uint32_t>(static_cast<uint64_t>(nowSeconds() * 1000)) | 1u;
    };
    const uint32_t startMs = ms();
    ctx.shared->words[ctx.rank].store(startMs);
    loomResult_t r = loomGetUniqueId(&id);
    if (r == loomSuccess) r = loomCommInitRank(&comm, nranks, id, ctx.rank);
    const uint32_t endMs = ms();
    uint32_t sinceFirst = endMs - startMs;
    for (int k = 0; k < nranks - 1; ++k)
      // (a rank that began after this one ended counts for nothing)
      if (uint32_t w = ctx.shared->words[k].load(); w != 0 && static_cast<int32_t>(endMs - w) > 0)
        sinceFirst = std::max(sinceFirst, endMs - w);
    fprintf(stderr, "rank %d init: %s after %u ms (%u ms after the first rank began): %s\n",
            ctx.rank, loomGetErrorString(r), endMs - startMs, sinceFirst,
            loomGetLastError(nullptr));
    if (r != loomTimeout || sinceFirst < kShortTimeoutMs * 0.9 ||
        endMs - startMs > kShortTimeoutMs + 3000)
      return 1;
    const std::string missing = "missing rank(s) " + std::to_string(nranks - 1);
    return strstr(loomGetLastError(nullptr), missing.c_str()) != nullptr ? 0 : 1;
  });
  EXPECT_TRUE(res.allPassed()) << res.report(true);
}

TEST(Timeouts, InitWithARankThatNeverJoins) { initWithoutTheLastRank(2, 0); }

TEST(Timeouts, InitNamesTheMissingRankOnEveryRank) { initWithoutTheLastRank(3, 100); }

// A rank that joined and then exited ends the initialisation of the others at once: the root
// sees its connection close, gives up, and says who left and who never came.
TEST(Timeouts, InitEndsWhenAJoinedRankExits) {
  LaunchOptions opts;
  opts.nranks = 3;
  opts.initComm = false;
  opts.timeoutMs = 20000;
  opts.deadlineMs = 60000;
  LaunchResult res = launch(opts, [](RankContext& ctx) {
    if (ctx.rank == 2) return 0;  // never joins
    loomUniqueId id;
    loomComm_t comm = nullptr;
    loomResult_t r = loomGetUniqueId(&id);
    // Joins (within milliseconds; 2.5 s leaves room for a loaded machine), then its process ends
    // mid-initialisation.
    if (ctx.rank == 1) {
      std::thread([] {
        usleep(2500 * 1000);
        _exit(0);
      }).detach();
    }
    const double t0 = nowSeconds();
    if (r == loomSuccess) r = loomCommInitRank(&comm, 3, id, ctx.rank);
    const double s = nowSeconds() - t0;
    const char* text = loomGetLastError(nullptr);
    fprintf(stderr, "rank 0 init: %s after %.0f ms: %s\n", loomGetErrorString(r), s * 1000, text);
    return r == loomRemoteError && s < 10 && strstr(text, "rank 1 closed its connection") &&
                   strstr(text, "missing rank(s) 2")
               ? 0
               : 1;
  });
  EXPECT_TRUE(res.allPassed()) << res.report(true);
}

// ---- Bad arguments ----

// Whether text holds word as a whole identifier ("op" in "op: unknown", not in "operation").
bool namesWord(const char* text, const char* word) {
  auto ident = [](char ch) { return isalnum(static_cast<unsigned char>(ch)) || ch == '_'; };
  const size_t len = strlen(word);
  for (const char* p = strstr(text, word); p != nullptr; p = strstr(p + 1, word))
    if ((p == text || !ident(p[-1])) && !ident(p[len])) return true;
  return false;
}

struct ArgChecker {
  loomComm_t comm;
  int failures = 0;
  // r must be loomInvalidArgument or loomInvalidUsage, and the last error must name `arg`.
  void expect(const char* what, loomResult_t r, const char* arg) {
    const char* msg = loomGetLastError(comm);
    bool codeOk = r == loomInvalidArgument || r == loomInvalidUsage;
    bool named = arg == nullptr || (msg != nullptr && namesWord(msg, arg));
    if (getenv("LOOM_MP_VERBOSE") != nullptr)
      fprintf(stderr, "%s -> %s: \"%s\"\n", what, loomGetErrorString(r), msg ? msg : "(null)");
    if (!codeOk || !named) {
      fprintf(stderr,
              "BAD-ARG %s: returned %s, last error \"%s\"; expected an invalid "
              "argument/usage naming \"%s\"\n",
              what, loomGetErrorString(r), msg ? msg : "(null)", arg ? arg : "");
      ++failures;
    }
  }
};

#define EXPECT_BAD(checker, call, arg) (checker).expect(#call, (call), (arg))

int badCollectiveArgs(RankContext& ctx) {
  loomComm_t comm = ctx.comm;
  ArgChecker c{comm};
  const int n = ctx.nranks;
  float send[16] = {1, 2, 3, 4}, recv[64] = {};
  const auto kBadType = static_cast<loomDataType_t>(99);
  const auto kNegType = static_cast<loomDataType_t>(-1);
  const auto kBadOp = static_cast<loomRedOp_t>(99);
  const auto kNegOp = static_cast<loomRedOp_t>(-1);
  const size_t kHuge = SIZE_MAX / 2;
  EXPECT_BAD(c, loomAllReduce(nullptr, recv, 4, loomFloat32, loomSum, comm, nullptr), "sendbuff");
  EXPECT_BAD(c, loomAllReduce(send, nullptr, 4, loomFloat32, loomSum, comm, nullptr), "recvbuff");
  EXPECT_BAD(c, loomAllReduce(send, recv, 4, kBadType, loomSum, comm, nullptr), "datatype");
  EXPECT_BAD(c, loomAllReduce(send, recv, 4, kNegType, loomSum, comm, nullptr), "datatype");
  EXPECT_BAD(c, loomAllReduce(send, recv, 4, loomFloat32, kBadOp, comm, nullptr), "op");
  EXPECT_BAD(c, loomAllReduce(send, recv, 4, loomFloat32, kNegOp, comm, nullptr), "op");
  EXPECT_BAD(c, loomAllReduce(send, recv, 4, loomFloat32, loomNumOps, comm, nullptr), "op");
  // The bitwise operations take integer types only; the values just past them are no op.
  EXPECT_BAD(c, loomAllReduce(send, recv, 4, loomFloat32, loomBand, comm, nullptr), "op");
  EXPECT_BAD(c, loomAllReduce(send, recv, 2, loomFloat64, loomBxor, comm, nullptr), "op");
  EXPECT_BAD(c, loomReduce(send, recv, 8, loomBfloat16, loomBor, 0, comm, nullptr), "op");
  EXPECT_BAD(c,
             loomAllReduce(send, recv, 4, loomInt32, static_cast<loomRedOp_t>(loomBand - 1), comm,
                           nullptr),
             "op");
  EXPECT_BAD(c,
             loomAllReduce(send, recv, 4, loomInt32, static_cast<loomRedOp_t>(loomBxor + 1), comm,
                           nullptr),
             "op");
  EXPECT_BAD(c, loomRedOpDestroy(loomBand, comm), "op");
  EXPECT_BAD(c, loomAllReduce(send, recv, kHuge, loomFloat32, loomSum, comm, nullptr), "count");
  c.comm = nullptr;
  EXPECT_BAD(c, loomAllReduce(send, recv, 4, loomFloat32, loomSum, nullptr, nullptr), "comm");
  EXPECT_BAD(c, loomBarrier(nullptr, nullptr), "comm");
  int count = 0;
  EXPECT_BAD(c, loomCommCount(nullptr, &count), "comm");
  EXPECT_BAD(c, loomGetVersion(nullptr), "version");
  c.comm = comm;
  EXPECT_BAD(c, loomBroadcast(send, recv, 4, loomFloat32, -1, comm, nullptr), "root");
  EXPECT_BAD(c, loomBroadcast(send, recv, 4, loomFloat32, n, comm, nullptr), "root");
  EXPECT_BAD(c, loomBroadcast(send, recv, 4, kBadType, 0, comm, nullptr), "datatype");
  EXPECT_BAD(c, loomReduce(send, recv, 4, loomFloat32, loomSum, n, comm, nullptr), "root");
  EXPECT_BAD(c, loomReduce(send, recv, 4, loomFloat32, kBadOp, 0, comm, nullptr), "op");
  EXPECT_BAD(c, loomReduce(nullptr, recv, 4, loomFloat32, loomSum, 0, comm, nullptr), "sendbuff");
  EXPECT_BAD(c, loomAllGather(nullptr, recv, 4, loomFloat32, comm, nullptr), "sendbuff");
  EXPECT_BAD(c, loomAllGather(send, recv, kHuge, loomFloat32, comm, nullptr), "count");
  EXPECT_BAD(c, loomAllGather(send, recv, SIZE_MAX / 4 / n + 1, loomFloat32, comm, nullptr),
             "count");
  EXPECT_BAD(c, loomReduceScatter(send, recv, kHuge, loomFloat32, loomSum, comm, nullptr), "count");
  EXPECT_BAD(c, loomReduceScatter(send, recv, 4, loomFloat32, kBadOp, comm, nullptr), "op");
  EXPECT_BAD(c, loomAllToAll(send, recv, 4, kBadType, comm, nullptr), "datatype");
  EXPECT_BAD(c, loomAllToAll(send, nullptr, 4, loomFloat32, comm, nullptr), "recvbuff");
  // Send and receive ranges that overlap other than in the collective's in-place layout (a
  // collective would read what it had written). Every rank passes its own rank as root, so
  // every rank refuses the rooted ones alike.
  const int me = ctx.rank;
  float* b = recv;
  EXPECT_BAD(c, loomAllReduce(b, b + 1, 4, loomFloat32, loomSum, comm, nullptr), "recvbuff");
  EXPECT_BAD(c, loomAllReduce(b + 3, b, 4, loomFloat32, loomSum, comm, nullptr), "recvbuff");
  EXPECT_BAD(c, loomBroadcast(b, b + 1, 4, loomFloat32, me, comm, nullptr), "recvbuff");
  EXPECT_BAD(c, loomReduce(b + 1, b, 4, loomFloat32, loomSum, me, comm, nullptr), "recvbuff");
  EXPECT_BAD(c, loomAllGather(b + 4 * me + 1, b, 4, loomFloat32, comm, nullptr), "recvbuff");
  EXPECT_BAD(c, loomAllGather(b + 4 * ((me + 1) % n), b, 4, loomFloat32, comm, nullptr),
             "recvbuff");
  EXPECT_BAD(c, loomReduceScatter(b, b + 4 * me + 1, 4, loomFloat32, loomSum, comm, nullptr),
             "recvbuff");
  EXPECT_BAD(c, loomAllToAll(b, b, 4, loomFloat32, comm, nullptr), "recvbuff");
  EXPECT_BAD(c, loomAllToAll(b, b + 4 * n - 1, 4, loomFloat32, comm, nullptr), "recvbuff");
  EXPECT_BAD(c, loomGather(b + 4 * me + 2, b, 4, loomFloat32, me, comm, nullptr), "recvbuff");
  EXPECT_BAD(c, loomScatter(b, b + 4 * me + 1, 4, loomFloat32, me, comm, nullptr), "recvbuff");
  {
    // Blocks of two elements, rank j's at 2j: the receive side starts inside the send side.
    size_t counts[64], displs[64];
    for (int j = 0; j < n; ++j) counts[j] = 2, displs[j] = 2 * static_cast<size_t>(j);
    EXPECT_BAD(
        c,
        loomAllToAllv(b, counts, displs, b + 2 * n - 1, counts, displs, loomFloat32, comm, nullptr),
        "recvbuff");
  }
  EXPECT_BAD(c, loomSend(send, 4, loomFloat32, n, comm, nullptr), "peer");
  EXPECT_BAD(c, loomSend(send, 4, loomFloat32, -1, comm, nullptr), "peer");
  EXPECT_BAD(c, loomRecv(recv, 4, loomFloat32, n, comm, nullptr), "peer");
  EXPECT_BAD(c, loomSend(nullptr, 4, loomFloat32, 0, comm, nullptr), "sendbuff");
  EXPECT_BAD(c, loomRecv(nullptr, 4, loomFloat32, 0, comm, nullptr), "recvbuff");
  EXPECT_BAD(c, loomRecv(recv, 4, kBadType, 0, comm, nullptr), "datatype");
  loomRedOp_t op;
  float scalar = 2;
  EXPECT_BAD(c, loomRedOpCreatePreMulSum(&op, nullptr, loomFloat32, loomScalarHostImmediate, comm),
             "scalar");
  EXPECT_BAD(c, loomRedOpCreatePreMulSum(&op, &scalar, kBadType, loomScalarHostImmediate, comm),
             "datatype");
  EXPECT_BAD(c,
             loomRedOpCreatePreMulSum(nullptr, &scalar, loomFloat32, loomScalarHostImmediate, comm),
             "op");
  EXPECT_BAD(c, loomRedOpCreatePreMulSum(&op, &scalar, loomFloat32, loomScalarDevice, comm),
             nullptr);
  EXPECT_BAD(c, loomRedOpDestroy(loomSum, comm), "op");
  EXPECT_BAD(c, loomRedOpDestroy(kBadOp, comm), "op");
  EXPECT_BAD(c, loomCommCount(comm, nullptr), "count");
  EXPECT_BAD(c, loomCommUserRank(comm, nullptr), "rank");
  EXPECT_BAD(c, loomCommGetAsyncError(comm, nullptr), "asyncError");
  EXPECT_BAD(c, loomGroupEnd(), nullptr);  // no matching loomGroupStart

  // The communicator still works: NULL buffers with count 0, then a real all-reduce.
  int failures = c.failures;
  auto expectOk = [&](const char* what, loomResult_t r) {
    if (r == loomSuccess) return;
    fprintf(stderr, "%s: %s: %s\n", what, loomGetErrorString(r), loomGetLastError(comm));
    ++failures;
  };
  const loomDataType_t f32 = loomFloat32;
  expectOk("AllReduce count 0, NULL buffers",
           loomAllReduce(nullptr, nullptr, 0, f32, loomSum, comm, nullptr));
  expectOk("Broadcast count 0", loomBroadcast(nullptr, nullptr, 0, f32, 1, comm, nullptr));
  expectOk("Reduce count 0", loomReduce(nullptr, nullptr, 0, f32, loomMax, 0, comm, nullptr));
  expectOk("AllGather count 0", loomAllGather(nullptr, nullptr, 0, f32, comm, nullptr));
  expectOk("ReduceScatter count 0",
           loomReduceScatter(nullptr, nullptr, 0, f32, loomSum, comm, nullptr));
  expectOk("AllToAll count 0", loomAllToAll(nullptr, nullptr, 0, f32, comm, nullptr));
  expectOk("GroupStart", loomGroupStart());
  expectOk("Send count 0", loomSend(nullptr, 0, f32, (ctx.rank + 1) % n, comm, nullptr));
  expectOk("Recv count 0", loomRecv(nullptr, 0, f32, (ctx.rank + n - 1) % n, comm, nullptr));
  expectOk("GroupEnd", loomGroupEnd());
  int version = 0, device = 0;
  expectOk("GetVersion", loomGetVersion(&version));
  expectOk("CuDevice", loomCommCuDevice(comm, &device));
  const bool gpu = access("/dev/nvidiactl", F_OK) == 0;
  if (version != LOOM_VERSION_CODE || (device != -1 && !gpu)) {
    fprintf(stderr, "version %d (expected %d), device %d (expected -1 without a GPU)\n", version,
            LOOM_VERSION_CODE, device);
    ++failures;
  }
  for (int code = 0; code <= loomNumResults + 5; ++code) {
    const char* text = loomGetErrorString(static_cast<loomResult_t>(code));
    if (text == nullptr || *text == '\0') {
      fprintf(stderr, "loomGetErrorString(%d) gave no text\n", code);
      ++failures;
    }
  }
  // Overlap as the in-place forms allow, at root 1, beside touching but disjoint ranges: run,
  // and checked against the values every rank put in.
  {
    const int me = ctx.rank, root = 1 % n;
    std::vector<float> buf(static_cast<size_t>(8 * n));
    auto check = [&](const char* what, size_t at, float want) {
      if (buf[at] != want) {
        fprintf(stderr, "%s: element %zu holds %g, expected %g\n", what, at, buf[at], want);
        ++failures;
      }
    };
    // Gather in place at root: each rank's 4 values (10 * rank + i) into root's block rank.
    for (int i = 0; i < 4; ++i) buf[static_cast<size_t>(4 * me + i)] = 10.0f * me + i;
    expectOk("Gather in place at root 1",
             loomGather(buf.data() + 4 * me, me == root ? buf.data() : nullptr, 4, f32, root, comm,
                        nullptr));
    for (int q = 0; q < n && me == root; ++q)
      for (int i = 0; i < 4; ++i)
        check("gather in place", static_cast<size_t>(4 * q + i), 10.0f * q + i);
    // Scatter in place at root: root's block q (100 + 10 * q + i) to rank q.
    for (int q = 0; q < n; ++q)
      for (int i = 0; i < 4; ++i)
        buf[static_cast<size_t>(4 * q + i)] = me == root ? 100.0f + 10.0f * q + i : -1.0f;
    expectOk("Scatter in place at root 1",
             loomScatter(me == root ? buf.data() : nullptr, buf.data() + 4 * me, 4, f32, root, comm,
                         nullptr));
    for (int i = 0; i < 4; ++i)
      check("scatter in place", static_cast<size_t>(4 * me + i), 100.0f + 10.0f * me + i);
    // An all-reduce whose send range ends where its receive range starts.
    for (int i = 0; i < 4; ++i) buf[static_cast<size_t>(4 + i)] = 1.0f + me + i;
    expectOk("AllReduce, touching ranges",
             loomAllReduce(buf.data() + 4, buf.data(), 4, f32, loomSum, comm, nullptr));
    for (int i = 0; i < 4; ++i) {
      float want = 0;
      for (int q = 0; q < n; ++q) want += 1.0f + q + i;
      check("all-reduce, touching ranges", static_cast<size_t>(i), want);
    }
    // All-to-all-v with send and receive blocks interleaved in one buffer: block j of each
    // side at 4j, receives 2 elements after sends.
    size_t counts[64], sdispls[64], rdispls[64];
    for (int j = 0; j < n; ++j) {
      counts[j] = 2, sdispls[j] = 4 * static_cast<size_t>(j), rdispls[j] = sdispls[j] + 2;
      for (int k = 0; k < 2; ++k) buf[sdispls[j] + static_cast<size_t>(k)] = 10.0f * me + 2 * j + k;
    }
    expectOk("AllToAllv, interleaved blocks", loomAllToAllv(buf.data(), counts, sdispls, buf.data(),
                                                            counts, rdispls, f32, comm, nullptr));
    for (int j = 0; j < n; ++j)
      for (int k = 0; k < 2; ++k)
        check("all-to-all-v, interleaved", rdispls[j] + static_cast<size_t>(k),
              10.0f * j + 2 * me + k);
  }
  loomResult_t r = loomSuccess;
  r = loomAllReduce(send, recv, 4, loomFloat32, loomSum, comm, nullptr);
  if (r != loomSuccess || recv[3] != 4.0f * n) {
    fprintf(stderr, "all-reduce after the bad calls: %s, recv[3]=%g\n", loomGetErrorString(r),
            recv[3]);
    ++failures;
  }
  loomResult_t async = loomInternalError;
  if (loomCommGetAsyncError(comm, &async) != loomSuccess || async != loomSuccess) {
    fprintf(stderr, "bad arguments left an asynchronous error: %s\n", loomGetErrorString(async));
    ++failures;
  }
  return failures == 0 ? 0 : 1;
}

int badInitArgs(RankContext& ctx) {
  ArgChecker c{nullptr};
  loomUniqueId id;
  loomComm_t comm = nullptr;
  EXPECT_BAD(c, loomGetUniqueId(nullptr), "uniqueId");
  if (loomGetUniqueId(&id) != loomSuccess) {
    fprintf(stderr, "loomGetUniqueId failed: %s\n", loomGetLastError(nullptr));
    return 1;
  }
  EXPECT_BAD(c, loomCommInitRank(&comm, 0, id, 0), "nranks");
  EXPECT_BAD(c, loomCommInitRank(&comm, -3, id, 0), "nranks");
  EXPECT_BAD(c, loomCommInitRank(&comm, 1, id, 1), "rank");
  EXPECT_BAD(c, loomCommInitRank(&comm, 1, id, -1), "rank");
  EXPECT_BAD(c, loomCommInitRank(&comm, 2, id, 2), "rank");
  EXPECT_BAD(c, loomCommInitRank(nullptr, 1, id, 0), "comm");
  loomConfig_t config = LOOM_CONFIG_INITIALIZER;
  config.magic = 0;
  EXPECT_BAD(c, loomCommInitRankConfig(&comm, 1, id, 0, &config), "config");
  EXPECT_BAD(c, loomCommInitAll(nullptr, 2, nullptr), "comms");
  loomComm_t comms[2];
  EXPECT_BAD(c, loomCommInitAll(comms, 0, nullptr), "ndev");
  // Sizes no communicator can have are refused before anything is sized by them (an
  // INT_MAX-rank table took minutes and gigabytes before failing).
  EXPECT_BAD(c, loomCommInitRank(&comm, INT_MAX, id, 0), "nranks");
  EXPECT_BAD(c, loomCommInitRank(&comm, (1 << 20) + 1, id, 0), "nranks");
  EXPECT_BAD(c, loomCommInitAll(comms, INT_MAX, nullptr), "ndev");
  {  // shared memory the machine cannot back is refused, not touched until the OOM killer comes
    void* p = reinterpret_cast<void*>(1);
    const loomResult_t r = loomMemAlloc(&p, size_t{1} << 50);
    const char* msg = loomGetLastError(nullptr);
    if (r != loomSystemError || p != nullptr || !namesWord(msg, "size")) {
      fprintf(stderr, "loomMemAlloc of 1 PiB: %s, \"%s\"\n", loomGetErrorString(r), msg);
      ++c.failures;
    }
  }
  for (int pos : {0, 5, 9, 40, 100, LOOM_UNIQUE_ID_BYTES - 1}) {
    loomUniqueId bad = id;
    bad.internal[pos] ^= 0x5a;
    std::string what = "loomCommInitRank with byte " + std::to_string(pos) + " of the id flipped";
    loomResult_t r = loomCommInitRank(&comm, 1, bad, 0);
    c.expect(what.c_str(), r, "commId");
    if (r == loomSuccess) loomCommDestroy(comm);
  }
  // The real id still works.
  loomResult_t r = loomCommInitRank(&comm, 1, id, 0);
  float x[3] = {1, 2, 3}, y[3] = {};
  if (r == loomSuccess) r = loomAllReduce(x, y, 3, loomFloat32, loomSum, comm, nullptr);
  if (r != loomSuccess || y[2] != 3.0f) {
    fprintf(stderr, "init and all-reduce with the good id: %s: %s\n", loomGetErrorString(r),
            loomGetLastError(comm));
    ++c.failures;
  }
  // A finalized communicator starts nothing more; it is still destroyed as usual.
  if (comm != nullptr) {
    if (loomCommFinalize(comm) != loomSuccess) ++c.failures;
    EXPECT_BAD(c, loomAllReduce(x, y, 3, loomFloat32, loomSum, comm, nullptr), "finalized");
    EXPECT_BAD(c, loomBroadcast(x, y, 3, loomFloat32, 0, comm, nullptr), "finalized");
    loomComm_t sub = nullptr;
    EXPECT_BAD(c, loomCommSplit(comm, 0, 0, &sub, nullptr), "finalized");
    if (sub != nullptr) ++c.failures;
  }
  if (comm != nullptr && loomCommDestroy(comm) != loomSuccess) ++c.failures;
  return c.failures == 0 ? 0 : 1;
}

// A call refused inside a group fails the group: loomGroupEnd runs none of its calls and
// returns the refusal (naming the argument), as NCCL's group does; the communicator then works,
// and the ranks stay in step. The group's other calls used to run, paired across ranks with
// calls the peer had meant for another buffer (wrong sums, with success).
int badCallInGroup(RankContext& ctx) {
  loomComm_t comm = ctx.comm;
  int failures = 0;
  auto fail = [&](const std::string& what) {
    fprintf(stderr, "rank %d: %s\n", ctx.rank, what.c_str());
    ++failures;
  };
  float a[4] = {1, 1, 1, 1}, b[4] = {-1, -1, -1, -1}, x[4] = {2, 2, 2, 2}, y[4] = {-1, -1, -1, -1};
  // Nested two deep, the bad call inside: the inner end succeeds, the outer one fails.
  if (loomGroupStart() != loomSuccess || loomGroupStart() != loomSuccess) fail("group start");
  if (loomAllReduce(x, y, 4, loomFloat32, loomSum, comm, nullptr) != loomSuccess) fail("queue x");
  if (loomAllReduce(a, b, 4, loomFloat32, static_cast<loomRedOp_t>(77), comm, nullptr) !=
      loomInvalidArgument)
    fail("bad op was not refused");
  if (loomGroupEnd() != loomSuccess) fail("inner group end");
  const loomResult_t r = loomGroupEnd();
  const std::string msg = loomGetLastError(comm);
  if (r != loomInvalidArgument ||
      msg.find("op: unknown reduction operation 77") == std::string::npos ||
      msg.find("none of its") == std::string::npos)
    fail("group end: " + std::string(loomGetErrorString(r)) + ": " + msg);
  if (y[0] != -1 || b[0] != -1) fail("a call of the failed group ran");
  // A send to this rank itself with no receive from itself, in a group and alone, and sizes
  // that differ: refused before anything moves, naming peer (they used to fail the
  // communicator, on every rank).
  const int me = ctx.rank;
  if (loomGroupStart() != loomSuccess) fail("group start");
  (void)loomSend(a, 4, loomFloat32, me, comm, nullptr);
  const loomResult_t self = loomGroupEnd();
  if (self != loomInvalidArgument || !namesWord(loomGetLastError(comm), "peer"))
    fail("self send in a group: " + std::string(loomGetLastError(comm)));
  const loomResult_t alone = loomSend(a, 4, loomFloat32, me, comm, nullptr);
  if (alone != loomInvalidArgument || !namesWord(loomGetLastError(comm), "peer"))
    fail("self send alone: " + std::string(loomGetLastError(comm)));
  if (loomGroupStart() != loomSuccess) fail("group start");
  (void)loomSend(a, 4, loomFloat32, me, comm, nullptr);
  (void)loomRecv(b, 3, loomFloat32, me, comm, nullptr);
  const loomResult_t sizes = loomGroupEnd();
  const std::string sizesMsg = loomGetLastError(comm);
  if (sizes != loomInvalidArgument || sizesMsg.find("16 bytes") == std::string::npos ||
      sizesMsg.find("12") == std::string::npos)
    fail("self send and receive of different sizes: " + sizesMsg);
  // The communicator works, and the ranks are in step: an all-reduce of every rank's rank + 1.
  float v = static_cast<float>(ctx.rank + 1), sum = 0;
  if (loomAllReduce(&v, &sum, 1, loomFloat32, loomSum, comm, nullptr) != loomSuccess ||
      sum != static_cast<float>(ctx.nranks * (ctx.nranks + 1) / 2))
    fail("all-reduce after the failed group: " + std::to_string(sum));
  // The next group runs.
  if (loomGroupStart() != loomSuccess ||
      loomAllReduce(x, y, 4, loomFloat32, loomSum, comm, nullptr) != loomSuccess ||
      loomGroupEnd() != loomSuccess || y[3] != 2.0f * ctx.nranks)
    fail("the next group: y[3] = " + std::to_string(y[3]));
  return failures == 0 ? 0 : 1;
}

TEST(BadArguments, ACallRefusedInAGroupFailsTheGroup) {
  LaunchOptions opts;
  opts.nranks = 2;
  opts.timeoutMs = 10000;
  opts.deadlineMs = 60000;
  LaunchResult res = launch(opts, badCallInGroup);
  EXPECT_TRUE(res.allPassed()) << res.report(true);
}

TEST(BadArguments, CollectivesAndQueries) {
  LaunchOptions opts;
  opts.nranks = 2;
  opts.timeoutMs = 10000;
  opts.deadlineMs = 60000;
  LaunchResult res = launch(opts, badCollectiveArgs);
  EXPECT_TRUE(res.allPassed()) << res.report();
}

// LOOM_CHECK_CALLS=1: ranks that call different collectives, counts, types, ops or roots at
// once are refused on every rank alike, naming the argument; the communicator still works.
LaunchOptions checkCallsOptions(bool shm) {
  LaunchOptions opts;
  opts.nranks = 3;
  opts.shm = shm;
  opts.timeoutMs = 10000;
  opts.deadlineMs = 60000;
  opts.env = {{"LOOM_CHECK_CALLS", "1"}};
  return opts;
}

// How many of recv[0, count) are not the sum over n ranks of rank q's input q + 1 + i.
int wrongSums(const float* recv, int count, int n) {
  int wrong = 0;
  for (int i = 0; i < count; ++i) {
    float want = 0;
    for (int q = 0; q < n; ++q) want += static_cast<float>(q + 1 + i);
    if (recv[i] != want) ++wrong;
  }
  return wrong;
}

// Counts into *bad unless r is loomInvalidArgument and comm's last error starts the check's
// message with arg (and holds `also`, where given).
void expectDiffer(loomComm_t comm, int* bad, const char* what, loomResult_t r, const char* arg,
                  const char* also = nullptr) {
  const char* msg = loomGetLastError(comm);
  const std::string want = std::string(arg) + ": the ranks' calls differ (LOOM_CHECK_CALLS)";
  if (r != loomInvalidArgument || msg == nullptr || strstr(msg, want.c_str()) == nullptr ||
      (also != nullptr && strstr(msg, also) == nullptr)) {
    fprintf(stderr, "%s: %s, \"%s\"; expected \"%s\"%s%s\n", what, loomGetErrorString(r),
            msg ? msg : "(null)", want.c_str(), also ? " with " : "", also ? also : "");
    ++*bad;
  }
}

int mismatchedCalls(RankContext& ctx) {
  loomComm_t comm = ctx.comm;
  const int rank = ctx.rank, n = ctx.nranks;
  int bad = 0;
  float send[32], recv[32];
  for (int i = 0; i < 32; ++i) send[i] = static_cast<float>(rank + 1 + i);
  auto allReduce = [&](size_t count, loomDataType_t dt, loomRedOp_t op) {
    return loomAllReduce(send, recv, count, dt, op, comm, nullptr);
  };
  expectDiffer(comm, &bad, "kinds",
               rank == 1 ? loomBroadcast(send, recv, 8, loomFloat32, 0, comm, nullptr)
                         : allReduce(8, loomFloat32, loomSum),
               "collective",
               "rank 0 calls allreduce(count 8, datatype 7, op 0), rank 1 calls "
               "broadcast(count 8, datatype 7, root 0)");
  expectDiffer(comm, &bad, "counts", allReduce(rank == n - 1 ? 16 : 8, loomFloat32, loomSum),
               "count", "rank 2 calls allreduce(count 16,");
  expectDiffer(comm, &bad, "types", allReduce(8, rank == 1 ? loomInt32 : loomFloat32, loomSum),
               "datatype");
  expectDiffer(comm, &bad, "ops", allReduce(8, loomFloat32, rank == 0 ? loomMax : loomSum), "op");
  expectDiffer(comm, &bad, "roots", loomBroadcast(send, recv, 8, loomFloat32, rank, comm, nullptr),
               "root");
  // In a group, the second call differs: the group ends with its error.
  loomGroupStart();
  allReduce(4, loomFloat32, loomSum);
  loomAllGather(send, recv, rank == 2 ? 2 : 1, loomFloat32, comm, nullptr);
  expectDiffer(comm, &bad, "a group", loomGroupEnd(), "count");
  // Each rank's own PreMulSum operation (its handle and factor) is the same call.
  loomRedOp_t premul;
  float factor = static_cast<float>(rank + 1);
  loomResult_t r =
      loomRedOpCreatePreMulSum(&premul, &factor, loomFloat32, loomScalarHostImmediate, comm);
  if (r == loomSuccess) r = allReduce(8, loomFloat32, premul);
  for (int i = 0; r == loomSuccess && i < 8; ++i) {
    float want = 0;
    for (int q = 0; q < n; ++q) want += static_cast<float>((q + 1) * (q + 1 + i));
    if (recv[i] != want) {
      fprintf(stderr, "rank %d: premul element %d: %g, want %g\n", rank, i, recv[i], want);
      ++bad;
    }
  }
  if (r == loomSuccess) r = loomRedOpDestroy(premul, comm);
  // The communicator still works.
  if (r == loomSuccess) r = allReduce(32, loomFloat32, loomSum);
  if (r == loomSuccess) bad += wrongSums(recv, 32, n);
  if (r != loomSuccess) {
    fprintf(stderr, "rank %d: %s: %s\n", rank, loomGetErrorString(r), loomGetLastError(comm));
    ++bad;
  }
  return bad == 0 ? 0 : 1;
}

// The same on a non-blocking communicator (the torch backend's kind): the queued call's ticket
// fails naming the argument, and the calls queued after it run.
int mismatchedQueuedCalls(RankContext& ctx) {
  loomResult_t r = initNonBlocking(ctx);
  if (r != loomSuccess) return 2;
  loomComm_t comm = ctx.comm;
  const int rank = ctx.rank, n = ctx.nranks;
  float send[8], recv[8];
  for (int i = 0; i < 8; ++i) send[i] = static_cast<float>(rank + 1 + i);
  int bad = 0;
  r = loomAllReduce(send, recv, rank == 1 ? 4 : 8, loomFloat32, loomSum, comm, nullptr);
  const uint64_t badTicket = lastTicket(comm);
  const loomResult_t r2 = loomAllReduce(send, recv, 8, loomFloat32, loomSum, comm, nullptr);
  const uint64_t good = lastTicket(comm);
  if (r != loomInProgress || r2 != loomInProgress || badTicket == 0 || good != badTicket + 1)
    return 3;
  expectDiffer(comm, &bad, "queued", loomCommWaitTicket(comm, badTicket, -1), "count");
  r = loomCommWaitTicket(comm, good, -1);
  const int wrong = r == loomSuccess ? wrongSums(recv, 8, n) : 0;
  if (r != loomSuccess)
    fprintf(stderr, "rank %d: %s: %s\n", rank, loomGetErrorString(r), loomGetLastError(comm));
  return r == loomSuccess && wrong == 0 && bad == 0 ? 0 : 1;
}

TEST(CallCheck, MismatchedQueuedCallsFailTheirTicketsOnly) {
  LaunchOptions opts = checkCallsOptions(true);
  opts.initComm = false;
  LaunchResult res = launch(opts, mismatchedQueuedCalls);
  EXPECT_TRUE(res.allPassed()) << res.report();
}

TEST(CallCheck, MismatchedCallsAreRefusedOnEveryRank) {
  for (bool shm : {true, false}) {
    LaunchResult res = launch(checkCallsOptions(shm), mismatchedCalls);
    EXPECT_TRUE(res.allPassed()) << (shm ? "shm: " : "tcp: ") << res.report();
  }
}

TEST(BadArguments, Init) {
  LaunchOptions opts;
  opts.nranks = 1;
  opts.initComm = false;
  opts.timeoutMs = 5000;
  opts.deadlineMs = 60000;
  LaunchResult res = launch(opts, badInitArgs);
  EXPECT_TRUE(res.allPassed()) << res.report();
}

// ---- Strangers on the rendezvous port ----

int connectTo(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

void sendAll(int fd, const void* data, size_t bytes) { (void)!send(fd, data, bytes, MSG_NOSIGNAL); }

void put32(unsigned char* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}

// Hellos that carry the right secret but bad fields: a 4 GiB info length, a
// rank outside [0, nranks), a different nranks. White-box: the secret is taken
// from bytes [16, 48) of the id, the hello laid out as src/bootstrap/wire.h
// does (magic, secret, rank, nranks, address, info length); if those layouts
// change, these degrade to strangers with a wrong secret.
void sendInsiderJunk(int port) {
  loomUniqueId id;
  if (loomGetUniqueId(&id) != loomSuccess) return;
  const uint32_t fields[][3] = {{0, 2, 0xffffffffu}, {7, 2, 16}, {1, 3, 0}};
  std::vector<int> fds;
  for (const auto& f : fields) {
    unsigned char hello[56] = {};
    put32(hello, 0x48424d4cu);  // "LMBH"
    memcpy(hello + 4, id.internal + 16, 32);
    put32(hello + 36, f[0]);
    put32(hello + 40, f[1]);
    put32(hello + 52, f[2]);
    int fd = connectTo(port);
    if (fd < 0) continue;
    sendAll(fd, hello, sizeof(hello));
    fds.push_back(fd);
  }
  usleep(100000);
  for (int fd : fds) close(fd);
}

TEST(Strangers, GarbageOnTheRendezvousPort) {
  std::vector<int> open;  // connections kept open (half frames) until the ranks are done
  int connected = 0;
  LaunchOptions opts;
  opts.nranks = 2;
  opts.timeoutMs = 30000;
  opts.deadlineMs = 90000;
  // Rank 1 joins only once the strangers have had their go at rank 0's root.
  opts.beforeInit = [](RankContext& ctx) {
    if (ctx.rank != 1) return;
    for (int i = 0; i < 2000 && ctx.shared->flag.load() == 0; ++i) usleep(10000);
    sendInsiderJunk(ctx.port);
  };
  opts.whileRunning = [&](int port, SharedPage* shared) {
    int fd = -1;
    for (int i = 0; i < 1500 && fd < 0; ++i) {  // until rank 0's root listens
      fd = connectTo(port);
      if (fd < 0) usleep(10000);
    }
    if (fd >= 0) ++connected;
    std::vector<unsigned char> junk(4096);
    for (size_t i = 0; i < junk.size(); ++i) junk[i] = static_cast<unsigned char>(i * 131 + 7);
    sendAll(fd, junk.data(), junk.size());  // garbage, then close
    close(fd);
    if ((fd = connectTo(port)) >= 0) {  // connect and close at once
      ++connected;
      close(fd);
    }
    const unsigned char half[3] = {0x10, 0, 0};
    const unsigned char huge[16] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f, 1, 2, 3};
    const uint32_t bigLen = 0x7fffffff;
    std::vector<unsigned char> zeros(200, 0);  // a wrong secret, perhaps a whole frame
    struct Probe {
      const void* data;
      size_t bytes;
    } probes[] = {{half, sizeof(half)},
                  {huge, sizeof(huge)},
                  {&bigLen, sizeof(bigLen)},
                  {zeros.data(), zeros.size()}};
    for (const Probe& p : probes) {
      if ((fd = connectTo(port)) < 0) continue;
      ++connected;
      sendAll(fd, p.data, p.bytes);
      open.push_back(fd);
    }
    usleep(200000);
    shared->flag.store(1);
  };
  LaunchResult res = launch(opts, [](RankContext& ctx) {
    float x[1023], y[1023];
    for (int i = 0; i < 1023; ++i) x[i] = static_cast<float>(i % 3 + ctx.rank);
    loomResult_t r = loomAllReduce(x, y, 1023, loomFloat32, loomSum, ctx.comm, nullptr);
    if (r != loomSuccess) {
      fprintf(stderr, "rank %d: all-reduce: %s: %s\n", ctx.rank, loomGetErrorString(r),
              loomGetLastError(ctx.comm));
      return 1;
    }
    for (int i = 0; i < 1023; ++i)
      if (y[i] != static_cast<float>(2 * (i % 3) + 1)) {
        fprintf(stderr, "rank %d: index %d: got %g\n", ctx.rank, i, y[i]);
        return 1;
      }
    return 0;
  });
  for (int fd : open) close(fd);
  EXPECT_GE(connected, 5) << "the strangers could not reach the rendezvous port";
  EXPECT_TRUE(res.allPassed()) << res.report();
}

}  // namespace
}  // namespace loomtest
