// Non-blocking communicators (config blocking = 0) on real processes, over shared memory and
// over TCP: init returns loomInProgress at once and is polled to success; collectives queued
// without waiting run in call order and give the scalar reference's results; loomCommAbort
// from another thread ends an initialisation that can never finish (a rank never joins) and a
// collective that waits on a stalled peer, within a bound, leaving no thread, fd or segment.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "harness.h"
#include "leaks.h"

namespace loomtest {
namespace {

constexpr double kAbortBoundS = 1.0;  // loomCommAbort must return within this

loomConfig_t nonBlocking() {
  loomConfig_t c = LOOM_CONFIG_INITIALIZER;
  c.blocking = 0;
  return c;
}

// Polls loomCommGetAsyncError until it stops saying loomInProgress (or timeoutS passes).
loomResult_t pollDone(loomComm_t comm, double timeoutS, int* inProgressPolls) {
  const double start = nowSeconds();
  for (;;) {
    loomResult_t state = loomInternalError;
    loomResult_t r = loomCommGetAsyncError(comm, &state);
    if (r != loomSuccess) return r;
    if (state != loomInProgress) return state;
    ++*inProgressPolls;
    if (nowSeconds() - start > timeoutS) return loomInProgress;
    usleep(1000);
  }
}

// The value rank r contributes at index i: small integers, so float sums are exact.
float input(int r, size_t i, int salt) {
  return static_cast<float>((r + 1) * 100 + static_cast<int>((i * 7 + salt) % 61));
}

// Ranks that init by themselves (timeoutMs 0: the harness's default).
LaunchResult launchSelfInit(int nranks, bool shm, const RankFn& fn, int timeoutMs = 0) {
  LaunchOptions opts;
  opts.nranks = nranks;
  opts.shm = shm;
  opts.initComm = false;
  if (timeoutMs > 0) opts.timeoutMs = timeoutMs;
  return launch(opts, fn);
}

// With a timeout far beyond what the test waits for.
LaunchResult launchLong(int nranks, bool shm, const RankFn& fn) {
  return launchSelfInit(nranks, shm, fn, 60000);
}

// Prints what leaks() finds; returns how many problems.
int countLeaks(int rank, const Footprint& before, const std::vector<uint64_t>& hashes, int n) {
  int problems = 0;
  for (const std::string& l : leaks(before, hashes, n)) {
    fprintf(stderr, "rank %d: FAIL after abort: %s\n", rank, l.c_str());
    ++problems;
  }
  return problems;
}

int initThenQueueRank(RankContext& ctx) {
  const Footprint before = footprint();
  int failures = 0;
  auto fail = [&](const std::string& what) {
    fprintf(stderr, "rank %d: FAIL %s\n", ctx.rank, what.c_str());
    ++failures;
  };
  // The others see init in progress meanwhile, and their init calls return well before it.
  if (ctx.rank == ctx.nranks - 1) usleep(1500000);
  loomConfig_t cfg = nonBlocking();
  loomResult_t r = loomGetUniqueId(&ctx.id);
  double t0 = nowSeconds();
  if (r == loomSuccess) r = loomCommInitRankConfig(&ctx.comm, ctx.nranks, ctx.id, ctx.rank, &cfg);
  const double initCallS = nowSeconds() - t0;
  if (r != loomInProgress) {
    fail(std::string("loomCommInitRankConfig: ") + loomGetErrorString(r) + ", expected " +
         "loomInProgress: " + loomGetLastError(nullptr));
    return 1;
  }
  if (initCallS > 1.0) fail("loomCommInitRankConfig took " + std::to_string(initCallS) + " s");
  // A collective before init completes is refused, naming why.
  float x = 1, y = 0;
  int polls = 0;
  loomResult_t early = loomAllReduce(&x, &y, 1, loomFloat32, loomSum, ctx.comm, nullptr);
  loomResult_t state = pollDone(ctx.comm, 20, &polls);
  const double initS = nowSeconds() - t0;
  fprintf(stderr, "rank %d: init call %.1f ms, done after %.0f ms and %d in-progress polls: %s\n",
          ctx.rank, initCallS * 1000, initS * 1000, polls, loomGetErrorString(state));
  if (state != loomSuccess) {
    fail(std::string("init ended with ") + loomGetErrorString(state) + ": " +
         loomGetLastError(nullptr));
    return 1;
  }
  if (ctx.rank != ctx.nranks - 1) {
    if (polls == 0) fail("init was never seen in progress, though the last rank came 1.5 s late");
    if (early != loomInvalidUsage && early != loomInProgress)
      fail(std::string("all-reduce during init: ") + loomGetErrorString(early));
  }
  const std::vector<uint64_t> hashes{commHash(ctx.comm)};

  // Queue operations without waiting: they must run in call order.
  const int n = ctx.nranks;
  const size_t count = 100003;
  std::vector<float> a(count), sum(count, -1), inPlace(count), gathered(count * n, -1),
      bcast(count, -1), scattered(count / n, -1), full(count / n * n);
  for (size_t i = 0; i < count; ++i) a[i] = inPlace[i] = input(ctx.rank, i, 0);
  for (size_t i = 0; i < full.size(); ++i) full[i] = input(ctx.rank, i, 5);
  std::vector<float> root2(count);
  for (size_t i = 0; i < count; ++i) root2[i] = input(2 % n, i, 9);
  std::vector<loomResult_t> rs;
  rs.push_back(loomAllReduce(a.data(), sum.data(), count, loomFloat32, loomSum, ctx.comm, nullptr));
  rs.push_back(loomAllReduce(inPlace.data(), inPlace.data(), count, loomFloat32, loomMax, ctx.comm,
                             nullptr));
  rs.push_back(loomAllGather(a.data(), gathered.data(), count, loomFloat32, ctx.comm, nullptr));
  rs.push_back(
      loomBroadcast(root2.data(), bcast.data(), count, loomFloat32, 2 % n, ctx.comm, nullptr));
  // A group of one reduce-scatter and a ring of sends and receives.
  std::vector<float> toNext(1000), fromPrev(1000, -1);
  for (size_t i = 0; i < toNext.size(); ++i) toNext[i] = input(ctx.rank, i, 3);
  loomGroupStart();
  loomReduceScatter(full.data(), scattered.data(), count / n, loomFloat32, loomSum, ctx.comm,
                    nullptr);
  loomSend(toNext.data(), toNext.size(), loomFloat32, (ctx.rank + 1) % n, ctx.comm, nullptr);
  loomRecv(fromPrev.data(), fromPrev.size(), loomFloat32, (ctx.rank + n - 1) % n, ctx.comm,
           nullptr);
  rs.push_back(loomGroupEnd());
  for (size_t k = 0; k < rs.size(); ++k)
    if (rs[k] != loomInProgress && rs[k] != loomSuccess)
      fail("queued call " + std::to_string(k) + ": " + loomGetErrorString(rs[k]));
  polls = 0;
  t0 = nowSeconds();
  state = pollDone(ctx.comm, 30, &polls);
  fprintf(stderr, "rank %d: 5 queued calls done after %.0f ms, %d in-progress polls: %s\n",
          ctx.rank, (nowSeconds() - t0) * 1000, polls, loomGetErrorString(state));
  if (state != loomSuccess) {
    fail(std::string("queued calls: ") + loomGetErrorString(state) + ": " +
         loomGetLastError(nullptr));
    return 1;
  }
  int wrong = 0;
  auto expect = [&](const char* what, size_t i, float got, float want) {
    if (got == want) return;
    if (++wrong <= 5)
      fprintf(stderr, "rank %d: %s[%zu] = %g, expected %g\n", ctx.rank, what, i, got, want);
  };
  for (size_t i = 0; i < count; ++i) {
    float s = 0, m = 0;
    for (int q = 0; q < n; ++q) {
      s += input(q, i, 0);
      m = std::max(m, input(q, i, 0));
    }
    expect("sum", i, sum[i], s);
    expect("max", i, inPlace[i], m);
    expect("broadcast", i, bcast[i], root2[i]);
    for (int q = 0; q < n; ++q)
      expect("allgather", q * count + i, gathered[q * count + i], input(q, i, 0));
  }
  for (size_t i = 0; i < scattered.size(); ++i) {
    const size_t at = static_cast<size_t>(ctx.rank) * scattered.size() + i;
    float s = 0;
    for (int q = 0; q < n; ++q) s += input(q, at, 5);
    expect("reducescatter", i, scattered[i], s);
  }
  for (size_t i = 0; i < fromPrev.size(); ++i)
    expect("recv", i, fromPrev[i], input((ctx.rank + n - 1) % n, i, 3));
  if (wrong > 0) fail(std::to_string(wrong) + " wrong values");
  t0 = nowSeconds();
  r = loomCommDestroy(ctx.comm);
  ctx.comm = nullptr;
  if (r != loomSuccess) fail(std::string("destroy: ") + loomGetLastError(nullptr));
  for (const std::string& l : leaks(before, hashes, n)) fail("after destroy: " + l);
  return failures == 0 ? 0 : 1;
}

// A split called while the non-blocking parent still runs queued calls waits for them first (it
// once waited under the lock those calls need, until the timeout), then gives a blocking child.
int splitBusyParentRank(RankContext& ctx) {
  loomConfig_t cfg = nonBlocking();
  int polls = 0;
  CHECK_LOOM(loomGetUniqueId(&ctx.id));
  loomResult_t r = loomCommInitRankConfig(&ctx.comm, ctx.nranks, ctx.id, ctx.rank, &cfg);
  if (r != loomInProgress && r != loomSuccess) return 1;
  if (pollDone(ctx.comm, 20, &polls) != loomSuccess) return 1;
  const size_t count = 1 << 20;
  std::vector<float> a(count), sum(count, -1);
  for (size_t i = 0; i < count; ++i) a[i] = input(ctx.rank, i, 0);
  for (int k = 0; k < 4; ++k) {
    r = loomAllReduce(a.data(), sum.data(), count, loomFloat32, loomSum, ctx.comm, nullptr);
    if (r != loomInProgress && r != loomSuccess) return 1;
  }
  loomConfig_t blocking = LOOM_CONFIG_INITIALIZER;
  blocking.blocking = 1;
  loomComm_t sub = nullptr;
  const double t0 = nowSeconds();
  r = loomCommSplit(ctx.comm, 0, -ctx.rank, &sub, &blocking);
  const double splitS = nowSeconds() - t0;
  if (r != loomSuccess || splitS > 10) {
    fprintf(stderr, "rank %d: split of a busy parent: %s after %.1f s: %s\n", ctx.rank,
            loomGetErrorString(r), splitS, loomGetLastError(nullptr));
    return 1;
  }
  int failures = 0;
  for (size_t i = 0; i < count && failures < 5; ++i) {
    float want = 0;
    for (int q = 0; q < ctx.nranks; ++q) want += input(q, i, 0);
    if (sum[i] != want && ++failures <= 5)
      fprintf(stderr, "rank %d: sum[%zu] = %g, expected %g\n", ctx.rank, i, sum[i], want);
  }
  int rank = -1;
  CHECK_LOOM(loomCommUserRank(sub, &rank));  // keys in reverse: the last rank leads
  if (rank != ctx.nranks - 1 - ctx.rank) {
    fprintf(stderr, "rank %d: rank %d in the child\n", ctx.rank, rank);
    ++failures;
  }
  CHECK_LOOM(loomCommDestroy(sub));
  return failures == 0 ? 0 : 1;
}

TEST(NonBlockingSplit, WaitsForTheParentsQueuedCallsOutsideTheirLock) {
  LaunchResult res = launchLong(3, true, splitBusyParentRank);
  EXPECT_TRUE(res.allPassed()) << res.report();
}

class NonBlockingTest : public ::testing::TestWithParam<bool> {};

TEST_P(NonBlockingTest, InitPolledToSuccessThenQueuedCollectivesMatchReference) {
  LaunchResult res = launchSelfInit(4, GetParam(), initThenQueueRank);
  EXPECT_TRUE(res.allPassed()) << res.report();
}

// Ranks 0..n-2 start a non-blocking init; the last rank never joins. Another thread aborts after
// 300 ms while the main thread polls; the abort must return within kAbortBoundS.
int abortDuringInitRank(RankContext& ctx) {
  if (ctx.rank == ctx.nranks - 1) {
    while (ctx.shared->flag.load() < static_cast<uint32_t>(ctx.nranks - 1)) usleep(10000);
    return 0;
  }
  const Footprint before = footprint();
  loomConfig_t cfg = nonBlocking();
  loomComm_t comm = nullptr;
  loomResult_t r = loomGetUniqueId(&ctx.id);
  if (r == loomSuccess) r = loomCommInitRankConfig(&comm, ctx.nranks, ctx.id, ctx.rank, &cfg);
  if (r != loomInProgress) {
    fprintf(stderr, "rank %d: init: %s\n", ctx.rank, loomGetErrorString(r));
    return 1;
  }
  std::atomic<bool> aborted{false};
  double abortS = 0;
  loomResult_t abortResult = loomInternalError;
  std::thread aborter([&] {
    usleep(300000);
    const double t0 = nowSeconds();
    abortResult = loomCommAbort(comm);
    abortS = nowSeconds() - t0;
    aborted.store(true);
  });
  // Poll from this thread meanwhile: loomCommGetAsyncError may race with the abort. It says
  // in progress, then (in the moment between the aborted init and the handle's end) the
  // abort's error, then loomInvalidArgument once the handle is gone; never success.
  int inProgress = 0, other = 0;
  while (!aborted.load()) {
    loomResult_t state = loomSuccess;
    r = loomCommGetAsyncError(comm, &state);
    if (r == loomSuccess && state == loomInProgress)
      ++inProgress;
    else if ((r == loomSuccess && state == loomSuccess) ||
             (r != loomSuccess && r != loomInvalidArgument))
      ++other;
    usleep(1000);
  }
  aborter.join();
  ctx.shared->flag.fetch_add(1);
  fprintf(stderr, "rank %d: loomCommAbort during init: %s in %.1f ms; %d in-progress polls\n",
          ctx.rank, loomGetErrorString(abortResult), abortS * 1000, inProgress);
  int failures = 0;
  if (abortResult != loomSuccess) ++failures;
  if (abortS > kAbortBoundS) ++failures;
  if (inProgress == 0 || other != 0) ++failures;
  return failures + countLeaks(ctx.rank, before, {}, ctx.nranks) == 0 ? 0 : 1;
}

TEST_P(NonBlockingTest, AbortFromAnotherThreadDuringInitWhileARankNeverJoins) {
  // The abort, not the timeout, must end the init.
  LaunchResult res = launchLong(4, GetParam(), abortDuringInitRank);
  EXPECT_TRUE(res.allPassed()) << res.report();
}

// All ranks init (non-blocking); ranks 0 and 1 queue an all-reduce that rank 2 never joins (it
// stalls until they are done). Another thread aborts it mid-wait.
int abortDuringCollectiveRank(RankContext& ctx) {
  const Footprint before = footprint();
  loomConfig_t cfg = nonBlocking();
  loomResult_t r = loomGetUniqueId(&ctx.id);
  if (r == loomSuccess) r = loomCommInitRankConfig(&ctx.comm, ctx.nranks, ctx.id, ctx.rank, &cfg);
  int polls = 0;
  if (r != loomInProgress || pollDone(ctx.comm, 20, &polls) != loomSuccess) {
    fprintf(stderr, "rank %d: init failed: %s\n", ctx.rank, loomGetLastError(nullptr));
    return 1;
  }
  const std::vector<uint64_t> hashes{commHash(ctx.comm)};
  loomComm_t comm = ctx.comm;
  ctx.comm = nullptr;
  const int stalled = ctx.nranks - 1;
  int failures = 0;
  if (ctx.rank == stalled) {
    while (ctx.shared->flag.load() < static_cast<uint32_t>(ctx.nranks - 1)) usleep(10000);
    r = loomCommAbort(comm);
  } else {
    std::vector<float> buf(1 << 20, 1.0f);
    r = loomAllReduce(buf.data(), buf.data(), buf.size(), loomFloat32, loomSum, comm, nullptr);
    usleep(200000);
    loomResult_t state = loomSuccess;
    loomCommGetAsyncError(comm, &state);
    if (r != loomInProgress || state != loomInProgress) {
      fprintf(stderr, "rank %d: FAIL all-reduce %s, state %s after 200 ms (expected in progress)\n",
              ctx.rank, loomGetErrorString(r), loomGetErrorString(state));
      ++failures;
    }
    // Abort only once every waiting rank has looked (an abort breaks the peers' links too).
    ctx.shared->words[0].fetch_add(1);
    while (ctx.shared->words[0].load() < static_cast<uint32_t>(ctx.nranks - 1)) usleep(1000);
    double abortS = 0;
    std::thread aborter([&] {
      const double t0 = nowSeconds();
      r = loomCommAbort(comm);
      abortS = nowSeconds() - t0;
    });
    aborter.join();
    fprintf(stderr, "rank %d: loomCommAbort during an all-reduce: %s in %.1f ms\n", ctx.rank,
            loomGetErrorString(r), abortS * 1000);
    if (r != loomSuccess || abortS > kAbortBoundS) ++failures;
    ctx.shared->flag.fetch_add(1);
  }
  return failures + countLeaks(ctx.rank, before, hashes, ctx.nranks) == 0 ? 0 : 1;
}

TEST_P(NonBlockingTest, AbortFromAnotherThreadDuringACollectiveWithAStalledPeer) {
  LaunchResult res = launchLong(3, GetParam(), abortDuringCollectiveRank);
  EXPECT_TRUE(res.allPassed()) << res.report();
}

// PreMulSum operations destroyed as soon as the call that takes them returns (as NCCL allows),
// while the worker has yet to run it, and new ones made meanwhile (the table of operations
// grows under the queued calls): every queued all-reduce still uses its own factor.
int premulDestroyedWhileQueuedRank(RankContext& ctx) {
  if (initNonBlocking(ctx) != loomSuccess) {
    fprintf(stderr, "rank %d: init: %s\n", ctx.rank, loomGetLastError(nullptr));
    return 1;
  }
  constexpr int kCalls = 24;
  const size_t count = 4099;
  std::vector<std::vector<double>> bufs(kCalls, std::vector<double>(count));
  int failures = 0;
  for (int k = 0; k < kCalls; ++k) {
    for (size_t i = 0; i < count; ++i) bufs[k][i] = static_cast<double>(ctx.rank + 1 + i % 5);
    double factor = 0.5 * (k + 1);
    loomRedOp_t op;
    loomResult_t r =
        loomRedOpCreatePreMulSum(&op, &factor, loomFloat64, loomScalarHostImmediate, ctx.comm);
    if (r == loomSuccess)
      r = loomAllReduce(bufs[k].data(), bufs[k].data(), count, loomFloat64, op, ctx.comm, nullptr);
    if (r != loomSuccess && r != loomInProgress) {
      fprintf(stderr, "rank %d: call %d: %s\n", ctx.rank, k, loomGetLastError(nullptr));
      return 1;
    }
    if (loomRedOpDestroy(op, ctx.comm) != loomSuccess) ++failures;
  }
  const loomResult_t r = loomCommWaitTicket(ctx.comm, lastTicket(ctx.comm), -1);
  if (r != loomSuccess) {
    fprintf(stderr, "rank %d: wait: %s\n", ctx.rank, loomGetLastError(nullptr));
    return 1;
  }
  for (int k = 0; k < kCalls; ++k) {
    for (size_t i = 0; i < count; ++i) {
      double want = 0;  // factor * sum over ranks, each term exact in binary
      for (int q = 0; q < ctx.nranks; ++q) want += 0.5 * (k + 1) * (q + 1 + i % 5);
      if (bufs[k][i] != want) {
        if (++failures <= 5)
          fprintf(stderr, "rank %d: call %d [%zu] = %g, expected %g\n", ctx.rank, k, i, bufs[k][i],
                  want);
      }
    }
  }
  return failures == 0 ? 0 : 1;
}

TEST_P(NonBlockingTest, PreMulSumDestroyedRightAfterTheCallStillAppliesItsFactor) {
  LaunchResult res = launchSelfInit(3, GetParam(), premulDestroyedWhileQueuedRank);
  EXPECT_TRUE(res.allPassed()) << res.report();
}

INSTANTIATE_TEST_SUITE_P(Transports, NonBlockingTest, ::testing::Values(true, false),
                         shmOrTcp<::testing::TestParamInfo<bool>>);

}  // namespace
}  // namespace loomtest
