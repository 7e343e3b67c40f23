// loomCommShrink on real processes, over shared memory and over TCP: a rank is SIGKILLed in
// the middle of all-reduces, the survivors get errors, shrink the failed communicator without
// passing any id and run an all-reduce on the rest, checked against the scalar reference;
// and a shrink that leaves out a live rank which does not call it (blocking and non-blocking).
// Nothing may be left behind: no fd, thread or segment of either communicator.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "harness.h"
#include "leaks.h"

namespace loomtest {
namespace {

double valueOf(int oldRank, size_t i) {
  return (oldRank + 1) * 1000.0 + static_cast<double>(i % 89);
}

// An all-reduce on the new communicator: each rank contributes by its old rank; the result must
// be the sum over the ranks that stayed.
int checkSum(loomComm_t comm, int oldRank, const std::vector<int>& stayed) {
  const size_t count = 65537;
  std::vector<double> in(count), out(count, -1);
  for (size_t i = 0; i < count; ++i) in[i] = valueOf(oldRank, i);
  loomResult_t r = loomAllReduce(in.data(), out.data(), count, loomFloat64, loomSum, comm, nullptr);
  if (r != loomSuccess) {
    fprintf(stderr, "rank %d: FAIL all-reduce after shrink: %s: %s\n", oldRank,
            loomGetErrorString(r), loomGetLastError(nullptr));
    return 1;
  }
  for (size_t i = 0; i < count; ++i) {
    double want = 0;
    for (int q : stayed) want += valueOf(q, i);
    if (out[i] != want) {
      fprintf(stderr, "rank %d: FAIL out[%zu] = %g, expected %g\n", oldRank, i, out[i], want);
      return 1;
    }
  }
  return 0;
}

struct KillParam {
  bool shm;
  int victim;
  int flags;
};

int killThenShrinkRank(const KillParam& p, RankContext& ctx) {
  const Footprint before = footprint();
  loomComm_t comm = nullptr;
  loomResult_t r = loomGetUniqueId(&ctx.id);
  if (r == loomSuccess) r = loomCommInitRank(&comm, ctx.nranks, ctx.id, ctx.rank);
  if (r != loomSuccess) return 1;
  std::vector<uint64_t> hashes{commHash(comm)};
  if (ctx.rank == p.victim) {
    std::thread([] {
      usleep(150000);
      raise(SIGKILL);
    }).detach();
  }
  // All-reduces until one fails (the victim's death); never more than 30 s.
  std::vector<float> buf(1 << 16, 1.0f);
  const double start = nowSeconds();
  while (r == loomSuccess && nowSeconds() - start < 30)
    r = loomAllReduce(buf.data(), buf.data(), buf.size(), loomFloat32, loomSum, comm, nullptr);
  const double erredAt = nowSeconds();
  fprintf(stderr, "rank %d: %s: %s\n", ctx.rank, loomGetErrorString(r), loomGetLastError(comm));
  if (r != loomRemoteError && r != loomTimeout) return 1;
  int excluded = p.victim;
  loomComm_t small = nullptr;
  double t0 = nowSeconds();
  r = loomCommShrink(comm, &excluded, 1, &small, nullptr, p.flags);
  const double shrinkS = nowSeconds() - t0;
  fprintf(stderr, "rank %d: loomCommShrink %.0f ms after the error: %s in %.0f ms: %s\n", ctx.rank,
          (t0 - erredAt) * 1000, loomGetErrorString(r), shrinkS * 1000,
          r == loomSuccess ? "" : loomGetLastError(nullptr));
  if (r != loomSuccess) return 1;
  int n = 0, me = -1;
  loomCommCount(small, &n);
  loomCommUserRank(small, &me);
  const int want = ctx.rank < p.victim ? ctx.rank : ctx.rank - 1;
  int failures = 0;
  if (n != ctx.nranks - 1 || me != want) {
    fprintf(stderr, "rank %d: FAIL new communicator: rank %d of %d, expected %d of %d\n", ctx.rank,
            me, n, want, ctx.nranks - 1);
    ++failures;
  }
  hashes.push_back(commHash(small));
  std::vector<int> stayed;
  for (int q = 0; q < ctx.nranks; ++q)
    if (q != p.victim) stayed.push_back(q);
  failures += checkSum(small, ctx.rank, stayed);
  if (loomCommDestroy(small) != loomSuccess) ++failures;
  if (loomCommAbort(comm) != loomSuccess) ++failures;
  for (const std::string& l : leaks(before, hashes, ctx.nranks)) {
    fprintf(stderr, "rank %d: FAIL %s\n", ctx.rank, l.c_str());
    ++failures;
  }
  return failures == 0 ? 0 : 1;
}

class ShrinkAfterKillTest : public ::testing::TestWithParam<std::tuple<bool, int, int>> {};

TEST_P(ShrinkAfterKillTest, SurvivorsShrinkAndAllReduceOnThreeRanks) {
  const KillParam p{std::get<0>(GetParam()), std::get<1>(GetParam()), std::get<2>(GetParam())};
  LaunchOptions opts;
  opts.nranks = 4;
  opts.shm = p.shm;
  opts.timeoutMs = 5000;
  opts.initComm = false;
  opts.failGraceMs = 30000;  // the victim's death must not end the others
  LaunchResult res = launch(opts, [&p](RankContext& ctx) { return killThenShrinkRank(p, ctx); });
  bool ok = res.error.empty();
  for (const RankOutcome& o : res.ranks)
    ok = ok && (o.rank == p.victim ? o.signal == SIGKILL : o.exited && o.exitCode == 0);
  EXPECT_TRUE(ok) << res.report(true);
}

// Victim 0 moves the new rendezvous to rank 1; victim 2 leaves rank 0 hosting it.
INSTANTIATE_TEST_SUITE_P(Cases, ShrinkAfterKillTest,
                         ::testing::Values(std::make_tuple(true, 2, LOOM_SHRINK_DEFAULT),
                                           std::make_tuple(true, 0, LOOM_SHRINK_ABORT),
                                           std::make_tuple(false, 2, LOOM_SHRINK_ABORT),
                                           std::make_tuple(false, 0, LOOM_SHRINK_DEFAULT)),
                         [](const ::testing::TestParamInfo<std::tuple<bool, int, int>>& info) {
                           return std::string(std::get<0>(info.param) ? "shm" : "tcp") + "_victim" +
                                  std::to_string(std::get<1>(info.param)) +
                                  (std::get<2>(info.param) == LOOM_SHRINK_ABORT ? "_abort"
                                                                                : "_default");
                         });

// Rank 3 stays alive but is left out and never calls loomCommShrink. The others first try bad
// arguments, then shrink (the new communicator non-blocking, polled to success), twice in a
// row (each shrink derives a different id), and check an all-reduce on each.
int shrinkLiveRank(RankContext& ctx) {
  const int out = ctx.nranks - 1;
  if (ctx.rank == out) {
    while (ctx.shared->flag.load() < static_cast<uint32_t>(ctx.nranks - 1)) usleep(10000);
    return 0;  // the harness destroys ctx.comm
  }
  int failures = 0;
  auto expectError = [&](loomResult_t got, loomResult_t want, const char* names) {
    const std::string text = loomGetLastError(nullptr);
    if (got == want && text.find(names) != std::string::npos) return;
    fprintf(stderr, "rank %d: FAIL expected %s naming %s, got %s: %s\n", ctx.rank,
            loomGetErrorString(want), names, loomGetErrorString(got), text.c_str());
    ++failures;
  };
  loomComm_t small = nullptr;
  int bad[1] = {ctx.nranks};
  expectError(loomCommShrink(ctx.comm, bad, 1, &small, nullptr, 0), loomInvalidArgument,
              "excludeRanksList[0]");
  int self[1] = {ctx.rank};
  expectError(loomCommShrink(ctx.comm, self, 1, &small, nullptr, 0), loomInvalidUsage,
              "excludeRanksList");
  int ok[1] = {out};
  expectError(loomCommShrink(ctx.comm, ok, 1, nullptr, nullptr, 0), loomInvalidArgument, "newcomm");
  expectError(loomCommShrink(ctx.comm, ok, 1, &small, nullptr, 7), loomInvalidArgument,
              "shrinkFlags");
  expectError(loomCommShrink(ctx.comm, nullptr, 1, &small, nullptr, 0), loomInvalidArgument,
              "excludeRanksList");
  std::vector<int> stayed;
  for (int q = 0; q < out; ++q) stayed.push_back(q);
  const Footprint before = footprint();
  std::vector<uint64_t> hashes;
  for (int round = 0; round < 2; ++round) {
    loomConfig_t cfg = LOOM_CONFIG_INITIALIZER;
    cfg.blocking = round == 0 ? 0 : 1;
    loomResult_t r = loomCommShrink(ctx.comm, ok, 1, &small, &cfg, LOOM_SHRINK_DEFAULT);
    loomResult_t state = r;
    for (int i = 0; i < 20000 && state == loomInProgress; ++i) {
      usleep(1000);
      loomCommGetAsyncError(small, &state);
    }
    if ((round == 0 && r != loomInProgress) || (round == 1 && r != loomSuccess) ||
        state != loomSuccess) {
      fprintf(stderr, "rank %d: FAIL shrink round %d: %s then %s: %s\n", ctx.rank, round,
              loomGetErrorString(r), loomGetErrorString(state), loomGetLastError(nullptr));
      return 1;
    }
    hashes.push_back(commHash(small));
    if (round == 0) {
      // A non-blocking communicator's all-reduce: queued, then polled.
      const size_t count = 1001;
      std::vector<double> in(count), res(count, -1);
      for (size_t i = 0; i < count; ++i) in[i] = valueOf(ctx.rank, i);
      r = loomAllReduce(in.data(), res.data(), count, loomFloat64, loomSum, small, nullptr);
      state = r;
      for (int i = 0; i < 20000 && state == loomInProgress; ++i) {
        usleep(1000);
        loomCommGetAsyncError(small, &state);
      }
      for (size_t i = 0; i < count && state == loomSuccess; ++i) {
        double want = 0;
        for (int q : stayed) want += valueOf(q, i);
        if (res[i] != want) state = loomInternalError;
      }
      if (r != loomInProgress || state != loomSuccess) {
        fprintf(stderr, "rank %d: FAIL non-blocking all-reduce after shrink: %s, %s\n", ctx.rank,
                loomGetErrorString(r), loomGetErrorString(state));
        ++failures;
      }
    } else {
      failures += checkSum(small, ctx.rank, stayed);
    }
    if (loomCommDestroy(small) != loomSuccess) ++failures;
  }
  if (hashes.size() == 2 && hashes[0] == hashes[1]) {
    fprintf(stderr, "rank %d: FAIL two shrinks made the same communicator hash\n", ctx.rank);
    ++failures;
  }
  for (const std::string& l : leaks(before, hashes, out)) {
    fprintf(stderr, "rank %d: FAIL %s\n", ctx.rank, l.c_str());
    ++failures;
  }
  ctx.shared->flag.fetch_add(1);
  return failures == 0 ? 0 : 1;
}

class ShrinkTest : public ::testing::TestWithParam<bool> {};

TEST_P(ShrinkTest, LeavesOutALiveRankThatDoesNotCallIt) {
  LaunchOptions opts;
  opts.nranks = 4;
  opts.shm = GetParam();
  LaunchResult res = launch(opts, shrinkLiveRank);
  EXPECT_TRUE(res.allPassed()) << res.report();
}

INSTANTIATE_TEST_SUITE_P(Transports, ShrinkTest, ::testing::Values(true, false),
                         shmOrTcp<::testing::TestParamInfo<bool>>);

}  // namespace
}  // namespace loomtest
