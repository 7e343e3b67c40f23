// loomAllToAllv, loomGather and loomScatter over real processes: unequal blocks (some empty,
// some past the transports' slots), displacements that leave gaps, every root, inside a
// caller's group, on shared memory and TCP; and their bad arguments, each named, with the
// communicator still usable after.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "harness.h"

namespace loomtest {
namespace {

// Elements rank src sends rank dst: 0 for some pairs, up to 6 * scale.
size_t blockCount(int src, int dst, size_t scale) {
  return static_cast<size_t>((3 * src + 5 * dst) % 7) * scale;
}

int64_t blockValue(int src, int dst, size_t k) {
  return int64_t{src} * 1000000000 + int64_t{dst} * 10000000 + static_cast<int64_t>(k);
}

// Compares got[off .. off + want.size()) with want; prints the first difference.
bool same(const std::vector<int64_t>& got, size_t off, const std::vector<int64_t>& want,
          const char* what, int rank) {
  for (size_t i = 0; i < want.size(); ++i)
    if (got[off + i] != want[i]) {
      fprintf(stderr, "rank %d: %s: element %zu is %lld, want %lld\n", rank, what, off + i,
              static_cast<long long>(got[off + i]), static_cast<long long>(want[i]));
      return false;
    }
  return true;
}

int allToAllvRank(RankContext& ctx, size_t scale) {
  const int n = ctx.nranks, me = ctx.rank;
  std::vector<size_t> sc(n), rc(n), sd(n), rd(n);
  std::vector<int64_t> send;
  for (int j = 0; j < n; ++j) {
    sc[j] = blockCount(me, j, scale);
    rc[j] = blockCount(j, me, scale);
    for (size_t k = 0; k < sc[j]; ++k) send.push_back(blockValue(me, j, k));
  }
  size_t total = 0;
  for (int j = 0; j < n; ++j) total += rc[j];
  // End to end (NULL displacements).
  std::vector<int64_t> recv(total + 1, -1);
  CHECK_LOOM(loomAllToAllv(send.data(), sc.data(), nullptr, recv.data(), rc.data(), nullptr,
                           loomInt64, ctx.comm, nullptr));
  int failures = 0;
  size_t off = 0;
  for (int j = 0; j < n; ++j) {
    std::vector<int64_t> want(rc[j]);
    for (size_t k = 0; k < rc[j]; ++k) want[k] = blockValue(j, me, k);
    failures += !same(recv, off, want, "end to end", me);
    off += rc[j];
  }
  failures += !same(recv, total, {-1}, "past the last block", me);
  // The send blocks in reverse order, the received ones with a gap of 3 before each; inside
  // an enclosing group with an all-reduce.
  std::vector<int64_t> reversed;
  size_t at = 0;
  for (int j = n; j-- > 0;) {
    sd[j] = at;
    for (size_t k = 0; k < sc[j]; ++k) reversed.push_back(blockValue(me, j, k));
    at += sc[j];
  }
  std::vector<int64_t> spaced(total + 3 * n, -1);
  for (int j = 0, o = 3; j < n; o += static_cast<int>(rc[j]) + 3, ++j) rd[j] = o;
  int64_t one = me + 1, sum = 0;
  CHECK_LOOM(loomGroupStart());
  CHECK_LOOM(loomAllToAllv(reversed.data(), sc.data(), sd.data(), spaced.data(), rc.data(),
                           rd.data(), loomInt64, ctx.comm, nullptr));
  CHECK_LOOM(loomAllReduce(&one, &sum, 1, loomInt64, loomSum, ctx.comm, nullptr));
  CHECK_LOOM(loomGroupEnd());
  for (int j = 0; j < n; ++j) {
    std::vector<int64_t> want(rc[j]);
    for (size_t k = 0; k < rc[j]; ++k) want[k] = blockValue(j, me, k);
    failures += !same(spaced, rd[j] - 3, {-1, -1, -1}, "gap", me);
    failures += !same(spaced, rd[j], want, "displaced", me);
  }
  if (sum != int64_t{n} * (n + 1) / 2) {
    fprintf(stderr, "rank %d: grouped all-reduce %lld\n", me, static_cast<long long>(sum));
    ++failures;
  }
  return failures == 0 ? 0 : 1;
}

int gatherScatterRank(RankContext& ctx, size_t count) {
  const int n = ctx.nranks, me = ctx.rank;
  int failures = 0;
  for (int root = 0; root < n; ++root) {
    std::vector<float> mine(count), all(me == root ? count * n : 0, -1.0f);
    for (size_t k = 0; k < count; ++k) mine[k] = static_cast<float>(me * 100000 + root + k % 1000);
    CHECK_LOOM(loomGather(mine.data(), me == root ? all.data() : nullptr, count, loomFloat32, root,
                          ctx.comm, nullptr));
    for (size_t i = 0; i < all.size(); ++i) {
      const float want = static_cast<float>((i / count) * 100000 + root + (i % count) % 1000);
      if (all[i] != want && failures++ < 3)
        fprintf(stderr, "rank %d: gather to %d: [%zu] %g want %g\n", me, root, i, all[i], want);
    }
    std::vector<float> src(me == root ? count * n : 0), got(count, -1.0f);
    for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<float>(i % 65536 + root);
    CHECK_LOOM(loomScatter(me == root ? src.data() : nullptr, got.data(), count, loomFloat32, root,
                           ctx.comm, nullptr));
    for (size_t k = 0; k < count; ++k) {
      const float want = static_cast<float>((me * count + k) % 65536 + root);
      if (got[k] != want && failures++ < 3)
        fprintf(stderr, "rank %d: scatter from %d: [%zu] %g want %g\n", me, root, k, got[k], want);
    }
  }
  return failures == 0 ? 0 : 1;
}

void expectAllPass(int nranks, bool shm, const RankFn& fn, const std::string& what) {
  LaunchOptions opts;
  opts.nranks = nranks;
  opts.shm = shm;
  opts.deadlineMs = 90000;
  LaunchResult res = launch(opts, fn);
  EXPECT_TRUE(res.allPassed()) << what << ", " << nranks << " ranks, " << (shm ? "shm" : "tcp")
                               << ": " << res.report();
}

void runBoth(int nranks, const RankFn& fn, const char* what) {
  for (bool shm : {true, false}) expectAllPass(nranks, shm, fn, what);
}

TEST(VariableBlocks, AllToAllvSmallAndLargeBlocks) {
  for (int n : {2, 3, 4}) {
    runBoth(
        n, [](RankContext& c) { return allToAllvRank(c, 1); }, "small blocks");
    // Blocks up to 6 * 20000 int64 (960 KB): past a slot, in several pieces.
    runBoth(
        n, [](RankContext& c) { return allToAllvRank(c, 20000); }, "large blocks");
  }
}

TEST(VariableBlocks, GatherAndScatterFromEveryRoot) {
  for (int n : {2, 3, 4}) {
    runBoth(
        n, [](RankContext& c) { return gatherScatterRank(c, 7); }, "7 elements");
    runBoth(
        n, [](RankContext& c) { return gatherScatterRank(c, 70000); }, "70000 elements");
  }
}

// The call fails with code and a message naming `word`.
bool fails(loomResult_t got, loomResult_t want, const char* word, const char* what) {
  const char* msg = loomGetLastError(nullptr);
  if (got == want && std::strstr(msg, word) != nullptr) return true;
  fprintf(stderr, "%s: got %s '%s', want %s naming '%s'\n", what, loomGetErrorString(got), msg,
          loomGetErrorString(want), word);
  return false;
}

int badArgumentsRank(RankContext& ctx) {
  const int me = ctx.rank;
  loomComm_t c = ctx.comm;
  int64_t buf[8] = {0};
  const size_t ones[2] = {1, 1}, twos[2] = {2, 2}, huge[2] = {SIZE_MAX / 4, 1};
  size_t self[2] = {1, 1};
  self[me] = 2;
  int ok = 1;
  ok &= fails(loomAllToAllv(buf, nullptr, nullptr, buf, ones, nullptr, loomInt64, c, nullptr),
              loomInvalidArgument, "sendcounts: NULL", "NULL sendcounts");
  ok &= fails(loomAllToAllv(buf, ones, nullptr, buf, nullptr, nullptr, loomInt64, c, nullptr),
              loomInvalidArgument, "recvcounts: NULL", "NULL recvcounts");
  ok &= fails(loomAllToAllv(buf, ones, nullptr, buf, self, nullptr, loomInt64, c, nullptr),
              loomInvalidArgument, "sends itself 1", "own block mismatch");
  ok &= fails(loomAllToAllv(buf, ones, huge, buf, ones, nullptr, loomInt64, c, nullptr),
              loomInvalidArgument, "sdispls[0]", "displacement past size_t");
  ok &= fails(loomAllToAllv(nullptr, ones, nullptr, buf, ones, nullptr, loomInt64, c, nullptr),
              loomInvalidArgument, "sendbuff", "NULL sendbuff");
  ok &= fails(loomAllToAllv(buf, ones, nullptr, buf, ones, nullptr, (loomDataType_t)99, c, nullptr),
              loomInvalidArgument, "datatype", "bad datatype");
  ok &= fails(loomGather(buf, buf, 1, loomInt64, 2, c, nullptr), loomInvalidArgument,
              "root: 2 is outside [0, 2)", "gather root");
  ok &= fails(loomScatter(buf, buf, 1, loomInt64, -1, c, nullptr), loomInvalidArgument, "root: -1",
              "scatter root");
  ok &= fails(loomGather(buf, nullptr, 1, loomInt64, me, c, nullptr), loomInvalidArgument,
              "recvbuff", "gather NULL recvbuff on the root");
  ok &= fails(loomScatter(nullptr, buf, 1, loomInt64, me, c, nullptr), loomInvalidArgument,
              "sendbuff", "scatter NULL sendbuff on the root");
  ok &= fails(loomGather(buf, buf, SIZE_MAX / 8, loomInt64, 0, c, nullptr), loomInvalidArgument,
              "sendcount", "gather count overflow");
  ok &= fails(loomGather(buf, buf, 1, loomInt64, 0, nullptr, nullptr), loomInvalidArgument, "comm",
              "NULL comm");
  // Counts that differ between the ranks: rank 0 sends 2 to rank 1, which expects 1. Both
  // fail, neither hangs: a rank that finds the mismatch names it, and the communicator fails
  // on the other too, with the mismatch or with the first rank's failure.
  const size_t* mine = me == 0 ? twos : ones;
  const loomResult_t r =
      loomAllToAllv(buf, mine, nullptr, buf + 4, mine, nullptr, loomInt64, c, nullptr);
  const std::string msg = loomGetLastError(nullptr);
  const bool named = r == loomInvalidUsage && msg.find("expected") != std::string::npos;
  const bool peerFailed =
      r == loomRemoteError && msg.find("failed or aborted") != std::string::npos;
  if (!named && !peerFailed) {
    fprintf(stderr, "mismatched counts: got %s '%s'\n", loomGetErrorString(r), msg.c_str());
    ok = 0;
  }
  ctx.shared->words[me].store(named ? 1 : 2);
  // Neither rank leaves (which the other could see first) before both have their error.
  ctx.shared->counter.fetch_add(1);
  for (int i = 0; i < 20000 && ctx.shared->counter.load() < 2; ++i) usleep(1000);
  if (ctx.shared->words[0].load() != 1 && ctx.shared->words[1].load() != 1) {
    fprintf(stderr, "mismatched counts: no rank named the mismatch\n");
    ok = 0;
  }
  return ok ? 0 : 1;
}

TEST(VariableBlocks, BadArgumentsAreNamed) {
  expectAllPass(2, true, badArgumentsRank, "bad arguments");
}

// A call refused for its arguments queues nothing; inside the caller's group it fails the
// group, whose loomGroupEnd then runs none of its calls and returns the refusal (as NCCL's). The
// operations after it run.
int afterRefusalRank(RankContext& ctx) {
  const size_t ones[2] = {1, 1};
  int64_t buf[2] = {ctx.rank + 1, 0}, sum = 0;
  if (loomAllToAllv(buf, ones, nullptr, buf, nullptr, nullptr, loomInt64, ctx.comm, nullptr) ==
      loomSuccess)
    return 1;
  CHECK_LOOM(loomGroupStart());
  if (loomScatter(nullptr, buf, 1, loomInt64, ctx.rank, ctx.comm, nullptr) == loomSuccess) return 1;
  CHECK_LOOM(loomAllReduce(&buf[0], &sum, 1, loomInt64, loomSum, ctx.comm, nullptr));
  if (loomGroupEnd() != loomInvalidArgument || sum != 0) {
    fprintf(stderr, "rank %d: the group of a refused call ran (sum %lld): %s\n", ctx.rank,
            static_cast<long long>(sum), loomGetLastError(ctx.comm));
    return 1;
  }
  CHECK_LOOM(loomAllReduce(&buf[0], &sum, 1, loomInt64, loomSum, ctx.comm, nullptr));
  int64_t got[2] = {0, 0};
  CHECK_LOOM(loomGather(&buf[0], got, 1, loomInt64, 0, ctx.comm, nullptr));
  if (sum != 3 || (ctx.rank == 0 && (got[0] != 1 || got[1] != 2))) {
    fprintf(stderr, "rank %d: sum %lld gathered %lld %lld\n", ctx.rank, static_cast<long long>(sum),
            static_cast<long long>(got[0]), static_cast<long long>(got[1]));
    return 1;
  }
  return 0;
}

TEST(VariableBlocks, RefusedCallQueuesNothing) {
  expectAllPass(2, true, afterRefusalRank, "after a refused call");
}

}  // namespace
}  // namespace loomtest
