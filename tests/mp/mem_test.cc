// loomMemAlloc buffers: the direct all-reduce reads a rank's input in place from its
// shared-memory buffer (no copy into Loom's), mixed with ranks whose input is ordinary memory;
// results are checked against a sum computed here. Bad arguments name themselves, and freed
// buffers leave nothing in /dev/shm.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "harness.h"

namespace loomtest {
namespace {

// The /dev/shm path of the loomMemAlloc segment mapped at p in this process ("" if none), from
// its own mappings: tests that run at once allocate too, so a count of segments would not do.
std::string segmentAt(const void* p) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  const auto at = reinterpret_cast<uintptr_t>(p);
  while (std::getline(maps, line)) {
    const size_t path = line.find("/dev/shm/loom-mem-");
    if (path == std::string::npos) continue;
    unsigned long lo = 0, hi = 0;
    if (sscanf(line.c_str(), "%lx-%lx", &lo, &hi) != 2 || at < lo || at >= hi) continue;
    std::string name = line.substr(path);
    const size_t del = name.find(" (deleted)");
    return del == std::string::npos ? name : name.substr(0, del);
  }
  return "";
}

bool exists(const std::string& path) { return access(path.c_str(), F_OK) == 0; }

float inputOf(int rank, size_t i) {
  return static_cast<float>(rank * 1000 + static_cast<int>(i % 997));
}

int allReduceOnMemAlloc(RankContext& ctx, int plainRank, bool inPlace, loomRedOp_t op,
                        size_t count) {
  const size_t bytes = count * sizeof(float);
  const bool mine = ctx.rank != plainRank;
  std::vector<float> plainSend(count), plainRecv(count);
  float* send = plainSend.data();
  float* recv = plainRecv.data();
  if (mine) {
    void* s = nullptr;
    void* r = nullptr;
    if (loomMemAlloc(&s, bytes) != loomSuccess || loomMemAlloc(&r, bytes) != loomSuccess) return 1;
    send = static_cast<float*>(s);
    recv = static_cast<float*>(r);
  }
  for (int rep = 0; rep < 3; ++rep) {
    for (size_t i = 0; i < count; ++i) send[i] = inputOf(ctx.rank, i + rep);
    for (size_t i = 0; i < count; ++i) recv[i] = NAN;
    float* in = inPlace ? recv : send;
    if (inPlace) std::memcpy(recv, send, bytes);
    if (loomAllReduce(in, recv, count, loomFloat32, op, ctx.comm, nullptr) != loomSuccess) {
      fprintf(stderr, "allreduce: %s\n", loomGetLastError(ctx.comm));
      return 2;
    }
    for (size_t i = 0; i < count; ++i) {
      double want = op == loomMax ? -INFINITY : 0;
      for (int r = 0; r < ctx.nranks; ++r) {
        const double v = inputOf(r, i + rep);
        want = op == loomMax ? std::max(want, v) : want + v;
      }
      if (op == loomAvg) want /= ctx.nranks;
      if (std::fabs(recv[i] - want) > 1e-3 * std::fabs(want) + 1e-3) {
        fprintf(stderr, "rank %d rep %d: element %zu is %g, expected %g\n", ctx.rank, rep, i,
                recv[i], want);
        return 3;
      }
    }
  }
  if (mine && (loomMemFree(send) != loomSuccess || loomMemFree(recv) != loomSuccess)) return 4;
  return 0;
}

// Every rank but `plainRank` passes loomMemAlloc buffers; the count spans several rounds of the
// direct buffers (LOOM_DIRECT_BYTES = 64 KiB) and ends mid-round. Below 1 MiB the direct
// all-reduce copies with plain stores; from 1 MiB it streams (LOOM_DIRECT_STREAM_BYTES set so
// whatever the CPU; both are run).
int allReduceOnMemAlloc(RankContext& ctx, int plainRank, bool inPlace, loomRedOp_t op) {
  for (size_t count : {size_t{16384} * 3 + 5000, size_t{16384} * 17 + 5000}) {
    const int rc = allReduceOnMemAlloc(ctx, plainRank, inPlace, op, count);
    if (rc != 0) return rc;
  }
  return 0;
}

struct MemCase {
  int nranks;
  int plainRank;  // -1: every rank uses loomMemAlloc
  bool inPlace;
  loomRedOp_t op;
};

class MemAllocTest : public ::testing::TestWithParam<MemCase> {};

TEST_P(MemAllocTest, DirectAllReduceReadsInputsInPlace) {
  const MemCase c = GetParam();
  LaunchOptions opts;
  opts.nranks = c.nranks;
  opts.env.push_back({"LOOM_DIRECT_BYTES", "65536"});
  opts.env.push_back({"LOOM_DIRECT_STREAM_BYTES", "1048576"});
  LaunchResult res = launch(opts, [&](RankContext& ctx) {
    return allReduceOnMemAlloc(ctx, c.plainRank, c.inPlace, c.op);
  });
  EXPECT_TRUE(res.allPassed()) << res.report(true);
}

INSTANTIATE_TEST_SUITE_P(
    Mem, MemAllocTest,
    ::testing::Values(MemCase{2, -1, false, loomSum}, MemCase{2, -1, true, loomSum},
                      MemCase{3, 1, false, loomSum}, MemCase{3, 1, true, loomAvg},
                      MemCase{4, -1, false, loomMax}, MemCase{4, 0, true, loomSum}),
    [](const ::testing::TestParamInfo<MemCase>& i) {
      return std::to_string(i.param.nranks) + "ranks_" +
             (i.param.plainRank < 0 ? std::string("all")
                                    : "plain" + std::to_string(i.param.plainRank)) +
             (i.param.inPlace ? "_inplace" : "_outofplace") + "_op" + std::to_string(i.param.op);
    });

TEST(MemAlloc, BadArgumentsAndNoLeftovers) {
  void* p = nullptr;
  EXPECT_EQ(loomMemAlloc(nullptr, 64), loomInvalidArgument);
  EXPECT_NE(std::string(loomGetLastError(nullptr)).find("ptr"), std::string::npos);
  EXPECT_EQ(loomMemAlloc(&p, 0), loomInvalidArgument);
  EXPECT_NE(std::string(loomGetLastError(nullptr)).find("size"), std::string::npos);
  ASSERT_EQ(loomMemAlloc(&p, 1 << 20), loomSuccess);
  ASSERT_NE(p, nullptr);
  const std::string segment = segmentAt(p);
  ASSERT_FALSE(segment.empty()) << "the buffer is not a /dev/shm/loom-mem- mapping";
  EXPECT_TRUE(exists(segment)) << segment;
  std::memset(p, 7, 1 << 20);
  std::vector<char> heap(64);
  EXPECT_EQ(loomMemFree(heap.data()), loomInvalidArgument);
  EXPECT_NE(std::string(loomGetLastError(nullptr)).find("ptr"), std::string::npos);
  EXPECT_EQ(loomMemFree(p), loomSuccess);
  EXPECT_EQ(loomMemFree(p), loomInvalidArgument);  // freed already
  EXPECT_FALSE(exists(segment)) << segment << " is left after loomMemFree";
}

// A process killed while it holds a buffer cannot unlink it; the next process on the host to
// allocate one removes it (the killed process no longer holds its lock: util/shm.h).
TEST(MemAlloc, KilledProcessesBuffersAreRemovedByTheNextProcess) {
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  const pid_t victim = fork();
  ASSERT_GE(victim, 0);
  if (victim == 0) {  // allocates, reports its segment's name from its own mappings, dies
    void* p = nullptr;
    if (loomMemAlloc(&p, 1 << 20) != loomSuccess) _exit(3);
    const std::string name = segmentAt(p);
    if (name.empty() ||
        write(fds[1], name.data(), name.size()) != static_cast<ssize_t>(name.size()))
      _exit(4);
    raise(SIGKILL);
  }
  close(fds[1]);
  char buf[64] = {};
  const ssize_t got = read(fds[0], buf, sizeof(buf) - 1);
  close(fds[0]);
  int status = 0;
  ASSERT_EQ(waitpid(victim, &status, 0), victim);
  ASSERT_TRUE(WIFSIGNALED(status)) << "the victim exited with " << WEXITSTATUS(status);
  ASSERT_GT(got, 0) << "the victim did not report its buffer";
  const std::string path = buf;
  // Tests running at once set up communicators, which sweep too: one of them may have removed
  // the segment already, which is what this test looks for.
  if (!exists(path)) GTEST_SKIP() << path << " was removed by another process's sweep first";
  const pid_t next = fork();
  ASSERT_GE(next, 0);
  if (next == 0) {  // a fresh process's first allocation
    void* p = nullptr;
    _exit(loomMemAlloc(&p, 4096) == loomSuccess && loomMemFree(p) == loomSuccess ? 0 : 1);
  }
  ASSERT_EQ(waitpid(next, &status, 0), next);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  EXPECT_FALSE(exists(path)) << path << " is still in /dev/shm";
  unlink(path.c_str());
}

}  // namespace
}  // namespace loomtest
