// The direct all-reduce over many rounds of small direct buffers: runs of operations of
// different sizes back to back (low-latency lines, the symmetric form, the slices form over
// 1 to 18 rounds with plain stores, with streaming stores from 1 MiB and with the output
// streamed too from 8 MiB; rounds that end mid-buffer; round counts that shift which buffer
// the next operation starts in), in place and out of place, with more ranks than cores and
// one rank at the lowest CPU priority, so that ranks are preempted mid-operation and their
// peers run as far ahead as the protocol lets them. A buffer reused too early shows as a
// wrong element: every result is checked against a sum computed here. (Inputs that peers
// read in place from loomMemAlloc memory are tested the same way in mem_test.cc.)
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "harness.h"

namespace loomtest {
namespace {

constexpr size_t kDirectBytes = 65536;  // LOOM_DIRECT_BYTES for these runs
constexpr size_t kRoundElems = kDirectBytes / sizeof(int32_t);
constexpr size_t kSymMax = 16384;  // LOOM_DIRECT_SYM_MAX: larger rounds take slices

int32_t inputOf(int rank, int op, size_t i) {
  return static_cast<int32_t>((rank + 1) * 7919 + op * 104729 + static_cast<int>(i % 65521));
}

int runSequence(RankContext& ctx) {
  // Element counts: within one low-latency line, across several lines, the symmetric form
  // (up to kSymMax), the slices form over 1, 2, 3, 4 and 18 rounds (the last from 1 MiB:
  // streaming stores) and over 129 rounds (from 8 MiB: the output streams too, out of place).
  const std::vector<size_t> counts = {1,
                                      90,
                                      2000,
                                      kRoundElems,
                                      kRoundElems * 2,
                                      kRoundElems * 2 + 17,
                                      kRoundElems * 4,
                                      kRoundElems * 17 + 5000,
                                      kRoundElems * 128 + 3};
  size_t maxCount = 0;
  for (size_t c : counts) maxCount = std::max(maxCount, c);
  std::vector<int32_t> send(maxCount), recv(maxCount);
  int op = 0;
  for (int pass = 0; pass < 2; ++pass) {
    for (size_t count : counts) {
      for (int inPlace = 0; inPlace < 2; ++inPlace, ++op) {
        for (size_t i = 0; i < count; ++i) send[i] = inputOf(ctx.rank, op, i);
        if (inPlace)
          std::memcpy(recv.data(), send.data(), count * sizeof(int32_t));
        else
          std::fill(recv.begin(), recv.begin() + static_cast<long>(count), -1);
        const void* in = inPlace ? recv.data() : send.data();
        if (loomAllReduce(in, recv.data(), count, loomInt32, loomSum, ctx.comm, nullptr) !=
            loomSuccess) {
          fprintf(stderr, "rank %d op %d: %s\n", ctx.rank, op, loomGetLastError(ctx.comm));
          return 2;
        }
        for (size_t i = 0; i < count; ++i) {
          int64_t want = 0;
          for (int r = 0; r < ctx.nranks; ++r) want += inputOf(r, op, i);
          if (recv[i] != static_cast<int32_t>(want)) {
            fprintf(stderr, "rank %d op %d (count %zu, %s): element %zu is %d, expected %lld\n",
                    ctx.rank, op, count, inPlace ? "in place" : "out of place", i, recv[i],
                    static_cast<long long>(want));
            return 3;
          }
        }
      }
    }
  }
  return 0;
}

class DirectRoundsTest : public ::testing::TestWithParam<int> {};

// The direct all-reduce forced, kSymMax, streaming stores from `streamBytes` whatever the CPU
// (the default is 64 MiB on all but AMD's), and rank 1 at the lowest priority.
LaunchOptions sequenceOptions(int nranks, size_t streamBytes) {
  LaunchOptions opts;
  opts.nranks = nranks;
  opts.env.push_back({"LOOM_DIRECT_SYM_MAX", std::to_string(kSymMax)});
  opts.env.push_back({"LOOM_DIRECT_STREAM_BYTES", std::to_string(streamBytes)});
  opts.env.push_back({"LOOM_ALGO", "allreduce:direct"});
  opts.beforeInit = [](RankContext& ctx) {
    if (ctx.rank == 1) setpriority(PRIO_PROCESS, 0, 19);
  };
  return opts;
}

TEST_P(DirectRoundsTest, BackToBackOperationsOfEverySizeSumRight) {
  LaunchOptions opts = sequenceOptions(GetParam(), size_t{1} << 20);
  opts.env.push_back({"LOOM_DIRECT_BYTES", std::to_string(kDirectBytes)});
  LaunchResult res = launch(opts, runSequence);
  EXPECT_TRUE(res.allPassed()) << res.report(true);
}

// The default 1 MiB buffers with plain stores up to 8 MiB: such rounds take 256 KiB of each
// buffer (128 KiB where two ranks share each core), so the same sequence runs through many
// rounds of part of a buffer.
TEST_P(DirectRoundsTest, PartBufferRoundsSumRight) {
  LaunchResult res = launch(sequenceOptions(GetParam(), size_t{64} << 20), runSequence);
  EXPECT_TRUE(res.allPassed()) << res.report(true);
}

// The same with every rank on one CPU, so that all of them share a core on any machine: the
// output streams from 16 MiB divided by the ranks a core runs, so the 8 MiB operation's output
// streams (out of place) while its copies stay plain; 2 ranks take the 128 KiB rounds of two
// ranks a core.
TEST_P(DirectRoundsTest, StreamedOutputOfPlainRoundsSumsRight) {
  LaunchOptions opts = sequenceOptions(GetParam(), size_t{64} << 20);
  opts.beforeInit = [lower = opts.beforeInit, cpu = allowedCpus().front()](RankContext& ctx) {
    bindToCpu(cpu);
    lower(ctx);
  };
  LaunchResult res = launch(opts, runSequence);
  EXPECT_TRUE(res.allPassed()) << res.report(true);
}

INSTANTIATE_TEST_SUITE_P(Ranks, DirectRoundsTest, ::testing::Values(2, 3, 5),
                         [](const ::testing::TestParamInfo<int>& i) {
                           return std::to_string(i.param) + "ranks";
                         });

}  // namespace
}  // namespace loomtest
