// Every collective over real processes: each (ranks, transport) configuration
// forks once and its ranks loop over all cases (harness.cc builds and checks
// them); plus the parent-made unique id, loomCommInitAll and loomCommSplit.
#include <gtest/gtest.h>

#include <atomic>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "harness.h"

namespace loomtest {
namespace {

// Bit c set: collective Coll(c) runs.
constexpr uint32_t kAllColls = ~0u;
constexpr uint32_t bit(Coll c) { return 1u << static_cast<int>(c); }

int runFullSuite(RankContext& ctx, SuiteLevel level, uint32_t colls = kAllColls) {
  std::vector<Case> cases;
  for (Case& c : buildCases(ctx.nranks, level))
    if (colls & bit(c.coll)) cases.push_back(std::move(c));
  SuiteStats st = runSuite(ctx.comm, ctx.rank, ctx.nranks, cases, ctx.shared);
  return st.failedCases == 0 && st.apiErrors == 0 ? 0 : 1;
}

TEST(Codec, KnownValues) {
  EXPECT_EQ(encodeHalf(1.0), 0x3c00);
  EXPECT_EQ(encodeHalf(-2.0), 0xc000);
  EXPECT_EQ(encodeHalf(65504.0), 0x7bff);
  EXPECT_EQ(encodeHalf(1e6), 0x7c00);
  EXPECT_EQ(encodeHalf(std::ldexp(1.0, -24)), 0x0001);
  EXPECT_EQ(encodeHalf(1.0 + std::ldexp(1.0, -11)), 0x3c00);  // tie: to even
  EXPECT_EQ(encodeHalf(1.0 + 3 * std::ldexp(1.0, -11)), 0x3c02);
  EXPECT_EQ(encodeBf16(1.0), 0x3f80);
  EXPECT_EQ(encodeBf16(-3.0), 0xc040);
  EXPECT_EQ(encodeE4m3(1.0), 0x38);
  EXPECT_EQ(encodeE4m3(448.0), 0x7e);
  EXPECT_EQ(encodeE4m3(1000.0), 0x7e);  // saturates
  EXPECT_EQ(encodeE4m3(-0.5), 0xb0);
  EXPECT_EQ(encodeE4m3(std::ldexp(1.0, -9)), 0x01);
  EXPECT_EQ(encodeE5m2(1.0), 0x3c);
  EXPECT_EQ(encodeE5m2(57344.0), 0x7b);
  EXPECT_EQ(encodeE5m2(1.25), 0x3d);
  EXPECT_EQ(encodeE5m2(std::ldexp(1.0, -16)), 0x01);
  for (int v = 0; v < 256; ++v) {
    double e4 = decodeE4m3(static_cast<uint8_t>(v)), e5 = decodeE5m2(static_cast<uint8_t>(v));
    if (!std::isnan(e4) && e4 != 0) {
      EXPECT_EQ(encodeE4m3(e4), v) << v;
    }
    if (std::isfinite(e5) && e5 != 0) {
      EXPECT_EQ(encodeE5m2(e5), v) << v;
    }
  }
  for (int v = 0; v < 65536; v += 7) {
    double h = decodeHalf(static_cast<uint16_t>(v)), b = decodeBf16(static_cast<uint16_t>(v));
    if (std::isfinite(h) && h != 0) {
      EXPECT_EQ(encodeHalf(h), v) << v;
    }
    if (std::isfinite(b) && b != 0) {
      EXPECT_EQ(encodeBf16(b), v) << v;
    }
  }
}

TEST(Cases, SameListOnEveryCallAndWithinLimits) {
  for (int n : {1, 2, 3, 4, 8}) {
    std::vector<Case> a = buildCases(n, SuiteLevel::kFull), b = buildCases(n, SuiteLevel::kFull);
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_EQ(a[i].name(), b[i].name());
      EXPECT_LT(a[i].root, n);
    }
  }
}

struct Config {
  int nranks;
  bool shm;
  const char* algo = "";       // LOOM_ALGO: "" lets the tuner pick (direct all-reduce on one host)
  uint32_t colls = kAllColls;  // the collectives checked: those whose schedule `algo` changes
};

void PrintTo(const Config& c, std::ostream* os) {
  *os << c.nranks << " ranks over " << (c.shm ? "shm" : "tcp") << " " << c.algo;
}

class CollectivesTest : public ::testing::TestWithParam<Config> {};

TEST_P(CollectivesTest, EveryCase) {
  LaunchOptions opts;
  opts.nranks = GetParam().nranks;
  opts.shm = GetParam().shm;
  if (*GetParam().algo != '\0') opts.env.push_back({"LOOM_ALGO", GetParam().algo});
  opts.timeoutMs = 60000;
  opts.deadlineMs = 240000;
  const uint32_t colls = GetParam().colls;
  LaunchResult res = launch(opts, [colls](RankContext& ctx) {
    return runFullSuite(ctx, suiteLevelFromEnv(SuiteLevel::kFull), colls);
  });
  EXPECT_TRUE(res.allPassed()) << res.report();
}

INSTANTIATE_TEST_SUITE_P(Ranks, CollectivesTest,
                         ::testing::Values(Config{1, true}, Config{2, true}, Config{3, true},
                                           Config{4, true}, Config{8, true}, Config{2, false},
                                           Config{3, false}, Config{8, false},
                                           Config{2, true, "ring"}, Config{3, true, "ring"},
                                           Config{8, true, "ring"}),
                         [](const ::testing::TestParamInfo<Config>& info) {
                           return std::to_string(info.param.nranks) + "ranks_" +
                                  (info.param.shm ? "shm" : "tcp") +
                                  (*info.param.algo ? std::string("_") + info.param.algo : "");
                         });

// Every new builder forced by LOOM_ALGO on 2, 3, 5 and 8 ranks over shared
// memory, 3 over TCP (plus the 5-rank per-collective form below); each rank checks every case
// against the scalar reference. All ranks share this host, so hier runs its one-host form here
// (direct reduce-scatter and all-gather in the host); its cross-host phase runs in the verifier's
// sweeps over host layouts. Only the collectives a forced algorithm builds are checked (broadcast,
// reduce, all-to-all and send/receive have one schedule each, checked by the Ranks configurations
// above).
std::vector<Config> forcedConfigs() {
  const uint32_t allReduce = bit(Coll::kAllReduce);
  const uint32_t rhd = allReduce | bit(Coll::kAllGather) | bit(Coll::kReduceScatter);
  std::vector<Config> out;
  for (const char* algo : {"tree", "rhd", "hier", "rd"})
    for (bool shm : {true, false})
      for (int n : {2, 3, 5, 8})
        // Over TCP (slower to run, same schedules as over shm) 3 ranks.
        if (shm || n == 3)
          out.push_back(Config{n, shm, algo, std::string(algo) == "rhd" ? rhd : allReduce});
  // Per-collective and exclusion forms of the syntax.
  out.push_back(Config{5, false, "allreduce:rhd;allgather:rhd", rhd});
  out.push_back(Config{4, true, "^direct,ring", allReduce});
  return out;
}

std::string configName(const ::testing::TestParamInfo<Config>& info) {
  std::string algo;
  for (const char* p = info.param.algo; *p; ++p)
    algo += std::isalnum(static_cast<unsigned char>(*p)) ? *p : '_';
  return std::to_string(info.param.nranks) + "ranks_" + (info.param.shm ? "shm" : "tcp") + "_" +
         algo;
}

INSTANTIATE_TEST_SUITE_P(Forced, CollectivesTest, ::testing::ValuesIn(forcedConfigs()), configName);

// The parent (here a launcher process) calls loomGetUniqueId before forking,
// so the rendezvous root runs as a thread of that process; no LOOM_COMM_ID.
TEST(CollectivesMisc, UniqueIdFromParent) {
#ifdef __SANITIZE_ADDRESS__
  // GCC's AddressSanitizer allocator is not fork-safe: a rank forked while the
  // root thread holds the allocator lock deadlocks in its first allocation.
  GTEST_SKIP() << "forking beside a running root thread deadlocks under AddressSanitizer";
#endif
  LaunchOptions opts;
  opts.nranks = 3;
  opts.idFromParent = true;
  LaunchResult res =
      launch(opts, [](RankContext& ctx) { return runFullSuite(ctx, SuiteLevel::kCompact); });
  EXPECT_TRUE(res.allPassed()) << res.report();
}

bool report(bool ok, const char* what) {
  if (!ok) fprintf(stderr, "FAILED: %s\n", what);
  return ok;
}

// loomCommInitAll (or, grouped, one thread's loomCommInitRank per rank inside a group, as NCCL
// programs initialise one process's GPUs): four ranks in one process; every group issues one
// operation per communicator from this one thread.
int initAllRank(bool grouped) {
  constexpr int kN = 4;
  constexpr size_t kCount = 1023;
  loomComm_t comms[kN] = {};
  int failures = 0;
  if (grouped) {
    loomUniqueId id;
    CHECK_LOOM(loomGetUniqueId(&id));
    CHECK_LOOM(loomGroupStart());
    for (int i = 0; i < kN; ++i) CHECK_LOOM(loomCommInitRank(&comms[i], kN, id, i));
    // Not initialised before the group ends: a call on it is refused, naming why.
    int n = 0;
    if (loomCommCount(comms[0], &n) != loomInvalidUsage ||
        strstr(loomGetLastError(nullptr), "loomGroupEnd") == nullptr)
      failures += !report(false, "a call before loomGroupEnd was not refused");
    CHECK_LOOM(loomGroupEnd());
  } else {
    CHECK_LOOM(loomCommInitAll(comms, kN, nullptr));
  }
  for (int i = 0; i < kN; ++i) {
    int count = -1, rank = -1;
    CHECK_LOOM(loomCommCount(comms[i], &count));
    CHECK_LOOM(loomCommUserRank(comms[i], &rank));
    failures += !report(count == kN && rank == i, "comm count/rank after loomCommInitAll");
  }
  std::vector<std::vector<float>> send(kN, std::vector<float>(kN * kCount));
  std::vector<std::vector<float>> recv(kN, std::vector<float>(kN * kCount, -1.0f));
  for (int i = 0; i < kN; ++i)
    for (size_t j = 0; j < kCount; ++j) send[i][j] = static_cast<float>((i * 7 + j) % 5);
  CHECK_LOOM(loomGroupStart());
  for (int i = 0; i < kN; ++i)
    CHECK_LOOM(loomAllReduce(send[i].data(), recv[i].data(), kCount, loomFloat32, loomSum, comms[i],
                             nullptr));
  CHECK_LOOM(loomGroupEnd());
  for (int i = 0; i < kN; ++i)
    for (size_t j = 0; j < kCount; ++j) {
      float want = 0;
      for (int r = 0; r < kN; ++r) want += static_cast<float>((r * 7 + j) % 5);
      if (recv[i][j] != want && failures++ < 5)
        fprintf(stderr, "InitAll allreduce: comm %d index %zu: got %g expected %g\n", i, j,
                recv[i][j], want);
    }
  CHECK_LOOM(loomGroupStart());
  for (int i = 0; i < kN; ++i)
    CHECK_LOOM(
        loomAllGather(send[i].data(), recv[i].data(), kCount, loomFloat32, comms[i], nullptr));
  CHECK_LOOM(loomGroupEnd());
  for (int i = 0; i < kN; ++i)
    for (size_t k = 0; k < kN * kCount; ++k)
      if (recv[i][k] != send[k / kCount][k % kCount] && failures++ < 5)
        fprintf(stderr, "InitAll allgather: comm %d index %zu: got %g expected %g\n", i, k,
                recv[i][k], send[k / kCount][k % kCount]);
  // A ring of sends and receives between the communicators of this process.
  CHECK_LOOM(loomGroupStart());
  for (int i = 0; i < kN; ++i) {
    CHECK_LOOM(loomSend(send[i].data(), kCount, loomFloat32, (i + 1) % kN, comms[i], nullptr));
    CHECK_LOOM(loomRecv(recv[i].data(), kCount, loomFloat32, (i + kN - 1) % kN, comms[i], nullptr));
  }
  CHECK_LOOM(loomGroupEnd());
  for (int i = 0; i < kN; ++i)
    if (memcmp(recv[i].data(), send[(i + kN - 1) % kN].data(), kCount * sizeof(float)) != 0 &&
        failures++ < 5)
      fprintf(stderr, "InitAll send/recv: comm %d got wrong data\n", i);
  // One thread per communicator, all at once (each comm used by one thread).
  std::vector<std::thread> threads;
  std::atomic<int> threadFailures{0};
  for (int i = 0; i < kN; ++i)
    threads.emplace_back([&, i] {
      std::vector<int32_t> x(kCount, i + 1), y(kCount);
      for (int iter = 0; iter < 20; ++iter) {
        loomResult_t r =
            loomAllReduce(x.data(), y.data(), kCount, loomInt32, loomSum, comms[i], nullptr);
        if (r != loomSuccess || y[kCount - 1] != kN * (kN + 1) / 2) {
          fprintf(stderr, "thread %d iteration %d: %s, got %d\n", i, iter, loomGetErrorString(r),
                  y[kCount - 1]);
          ++threadFailures;
          return;
        }
      }
    });
  for (std::thread& t : threads) t.join();
  failures += threadFailures.load();
  for (int i = 0; i < kN; ++i) CHECK_LOOM(loomCommDestroy(comms[i]));
  if (grouped) {
    // Destroyed before its group ends: the group's end makes nothing and says so.
    loomUniqueId id;
    loomComm_t lone = nullptr;
    CHECK_LOOM(loomGetUniqueId(&id));
    CHECK_LOOM(loomGroupStart());
    CHECK_LOOM(loomCommInitRank(&lone, 1, id, 0));
    CHECK_LOOM(loomCommDestroy(lone));
    if (loomGroupEnd() != loomInvalidUsage ||
        strstr(loomGetLastError(nullptr), "destroyed before its group ended") == nullptr)
      failures += !report(false, "a communicator destroyed before its group's end");
  }
  return failures == 0 ? 0 : 1;
}

// One process whose one thread runs every rank (body makes their communicators).
void launchOneThreadsRanks(std::function<int()> body) {
  LaunchOptions opts;
  opts.nranks = 1;
  opts.initComm = false;
  opts.setCommId = false;
  opts.timeoutMs = 10000;
  opts.deadlineMs = 60000;
  LaunchResult res = launch(opts, [&body](RankContext&) { return body(); });
  EXPECT_TRUE(res.allPassed()) << res.report();
}

TEST(CollectivesMisc, InitAllGroupFromOneThread) {
  launchOneThreadsRanks([] { return initAllRank(false); });
}

// A blocking loomCommInitRank inside a group used to rendezvous at once, so that one thread's
// ranks waited for each other until the timeout.
TEST(CollectivesMisc, InitRanksInAGroupFromOneThread) {
  launchOneThreadsRanks([] { return initAllRank(true); });
}

// Splits and shrinks of four ranks' communicators from one thread, inside groups (NCCL lets one
// thread do this; a split made at once waited for the other ranks until its timeout): each
// new communicator's size, ranks (by key, then old rank) and all-reduce, against sums computed
// here.
int splitInGroupRank() {
  constexpr int kN = 4;
  constexpr size_t kCount = 257;
  loomComm_t comms[kN] = {}, halves[kN] = {}, three[kN] = {};
  int failures = 0;
  CHECK_LOOM(loomCommInitAll(comms, kN, nullptr));
  // Colour i % 2, but rank 3 takes none; keys in reverse, so comm 2 leads colour 0.
  CHECK_LOOM(loomGroupStart());
  for (int i = 0; i < kN; ++i) {
    halves[i] = reinterpret_cast<loomComm_t>(&halves);  // overwritten, with NULL for rank 3
    CHECK_LOOM(
        loomCommSplit(comms[i], i == 3 ? LOOM_SPLIT_NOCOLOR : i % 2, -i, &halves[i], nullptr));
  }
  int n = 0;
  if (loomCommCount(halves[0], &n) != loomInvalidUsage)
    failures += !report(false, "a split's communicator was usable before loomGroupEnd");
  CHECK_LOOM(loomGroupEnd());
  failures += !report(halves[3] == nullptr, "LOOM_SPLIT_NOCOLOR gave a communicator");
  const int wantCount[3] = {2, 1, 2}, wantRank[3] = {1, 0, 0};
  for (int i = 0; i < 3; ++i) {
    int count = -1, rank = -1;
    CHECK_LOOM(loomCommCount(halves[i], &count));
    CHECK_LOOM(loomCommUserRank(halves[i], &rank));
    if (count != wantCount[i] || rank != wantRank[i]) {
      fprintf(stderr, "split comm %d: %d ranks, rank %d; want %d, %d\n", i, count, rank,
              wantCount[i], wantRank[i]);
      ++failures;
    }
  }
  std::vector<std::vector<float>> send(kN, std::vector<float>(kCount)), recv = send;
  for (int i = 0; i < kN; ++i)
    for (size_t j = 0; j < kCount; ++j) send[i][j] = static_cast<float>((i * 3 + j) % 7);
  auto checkSum = [&](const char* what, int i, const std::vector<int>& members) {
    for (size_t j = 0; j < kCount; ++j) {
      float want = 0;
      for (int r : members) want += send[static_cast<size_t>(r)][j];
      if (recv[i][j] != want) {
        fprintf(stderr, "%s: comm %d index %zu: got %g expected %g\n", what, i, j, recv[i][j],
                want);
        ++failures;
        return;
      }
    }
  };
  CHECK_LOOM(loomGroupStart());
  for (int i = 0; i < 3; ++i)
    CHECK_LOOM(loomAllReduce(send[i].data(), recv[i].data(), kCount, loomFloat32, loomSum,
                             halves[i], nullptr));
  CHECK_LOOM(loomGroupEnd());
  checkSum("colour 0", 0, {0, 2});
  checkSum("colour 1", 1, {1});
  checkSum("colour 0", 2, {0, 2});
  // Shrink without rank 3, which does not call it.
  int exclude = 3;
  CHECK_LOOM(loomGroupStart());
  for (int i = 0; i < 3; ++i)
    CHECK_LOOM(loomCommShrink(comms[i], &exclude, 1, &three[i], nullptr, LOOM_SHRINK_DEFAULT));
  CHECK_LOOM(loomGroupEnd());
  CHECK_LOOM(loomGroupStart());
  for (int i = 0; i < 3; ++i)
    CHECK_LOOM(loomAllReduce(send[i].data(), recv[i].data(), kCount, loomFloat32, loomSum, three[i],
                             nullptr));
  CHECK_LOOM(loomGroupEnd());
  for (int i = 0; i < 3; ++i) checkSum("shrunk", i, {0, 1, 2});
  // Two splits of each communicator in one group, rows then columns of a 2 x 2 grid: each
  // rank's two splits run in call order, as on every rank, so neither takes the other's part.
  loomComm_t rows[kN] = {}, cols[kN] = {};
  CHECK_LOOM(loomGroupStart());
  for (int i = 0; i < kN; ++i) {
    CHECK_LOOM(loomCommSplit(comms[i], i / 2, i, &rows[i], nullptr));
    CHECK_LOOM(loomCommSplit(comms[i], i % 2, i, &cols[i], nullptr));
  }
  CHECK_LOOM(loomGroupEnd());
  CHECK_LOOM(loomGroupStart());
  for (int i = 0; i < kN; ++i)
    CHECK_LOOM(loomAllReduce(send[i].data(), recv[i].data(), kCount, loomFloat32, loomSum, rows[i],
                             nullptr));
  CHECK_LOOM(loomGroupEnd());
  for (int i = 0; i < kN; ++i) checkSum("row", i, {i / 2 * 2, i / 2 * 2 + 1});
  CHECK_LOOM(loomGroupStart());
  for (int i = 0; i < kN; ++i)
    CHECK_LOOM(loomAllReduce(send[i].data(), recv[i].data(), kCount, loomFloat32, loomSum, cols[i],
                             nullptr));
  CHECK_LOOM(loomGroupEnd());
  for (int i = 0; i < kN; ++i) checkSum("column", i, {i % 2, i % 2 + 2});
  for (int i = 0; i < kN; ++i) {
    CHECK_LOOM(loomCommDestroy(rows[i]));
    CHECK_LOOM(loomCommDestroy(cols[i]));
  }
  for (int i = 0; i < kN; ++i) {
    if (halves[i] != nullptr) CHECK_LOOM(loomCommDestroy(halves[i]));
    if (three[i] != nullptr) CHECK_LOOM(loomCommDestroy(three[i]));
    CHECK_LOOM(loomCommDestroy(comms[i]));
  }
  return failures == 0 ? 0 : 1;
}

TEST(CollectivesMisc, SplitAndShrinkInAGroupFromOneThread) {
  launchOneThreadsRanks(splitInGroupRank);
}

// loomCommInitAll with a device list on a loaded graph (LOOM_TOPO_FILE: AWS p4d without NVLink
// information, GPUs 0-3 on socket 0 and 4-7 on socket 1). The ranks hold the two sockets' GPUs
// alternately, so rank order would cross between the sockets at every hop; the communicator's
// rings follow the ring search over the graph, which crosses twice. Each rank's ring successor
// is read from its schedule (LOOM_SCHEDULE_DUMP): the peer of its ring all-reduce's first send.
int graphRingRank(const std::string& dumpPath) {
  constexpr int kN = 8;
  constexpr size_t kCount = 4099;
  const int devs[kN] = {0, 4, 1, 5, 2, 6, 3, 7};
  loomComm_t comms[kN] = {};
  CHECK_LOOM(loomCommInitAll(comms, kN, devs));
  std::vector<std::vector<float>> send(kN, std::vector<float>(kCount * kN)), recv = send;
  for (int i = 0; i < kN; ++i)
    for (size_t j = 0; j < kCount; ++j) send[i][j] = static_cast<float>((i * 5 + j) % 11);
  CHECK_LOOM(loomGroupStart());
  for (int i = 0; i < kN; ++i)
    CHECK_LOOM(loomAllReduce(send[i].data(), recv[i].data(), kCount, loomFloat32, loomSum, comms[i],
                             nullptr));
  CHECK_LOOM(loomGroupEnd());
  int failures = 0;
  for (int i = 0; i < kN; ++i)
    for (size_t j = 0; j < kCount; ++j) {
      float want = 0;
      for (int r = 0; r < kN; ++r) want += static_cast<float>((r * 5 + j) % 11);
      if (recv[i][j] != want && failures++ < 5)
        fprintf(stderr, "comm %d index %zu: got %g expected %g\n", i, j, recv[i][j], want);
    }
  CHECK_LOOM(loomGroupStart());
  for (int i = 0; i < kN; ++i)
    CHECK_LOOM(
        loomAllGather(send[i].data(), recv[i].data(), kCount, loomFloat32, comms[i], nullptr));
  CHECK_LOOM(loomGroupEnd());
  for (int i = 0; i < kN; ++i)
    for (size_t k = 0; k < kN * kCount; ++k)
      if (recv[i][k] != send[k / kCount][k % kCount] && failures++ < 5)
        fprintf(stderr, "allgather: comm %d index %zu: got %g expected %g\n", i, k, recv[i][k],
                send[k / kCount][k % kCount]);
  for (int i = 0; i < kN; ++i) CHECK_LOOM(loomCommDestroy(comms[i]));

  int next[kN];
  std::fill(next, next + kN, -1);
  std::istringstream lines(readFile(dumpPath));
  for (std::string line; std::getline(lines, line);) {
    if (line.find("\"coll\":\"allreduce\",\"algorithm\":\"ring\"") == std::string::npos) continue;
    const size_t r = line.find("\"rank\":"), p = line.find("\"sendPeer\":");
    if (r == std::string::npos || p == std::string::npos) continue;
    const int rank = std::atoi(line.c_str() + r + 7);
    if (rank >= 0 && rank < kN) next[rank] = std::atoi(line.c_str() + p + 11);
  }
  auto socket = [&](int rank) { return devs[rank] / 4; };
  int crossings = 0, seen = 0;
  for (int r = 0, steps = 0; steps < kN; ++steps) {
    if (next[r] < 0 || next[r] >= kN) {
      fprintf(stderr, "rank %d has no ring successor in %s\n", r, dumpPath.c_str());
      return 1;
    }
    crossings += socket(r) != socket(next[r]);
    seen |= 1 << r;
    r = next[r];
  }
  failures += !report(seen == (1 << kN) - 1, "the ring visits every rank once");
  if (crossings != 2) fprintf(stderr, "the ring crosses between sockets %d times\n", crossings);
  failures += !report(crossings == 2, "the ring crosses between the sockets twice");
  return failures == 0 ? 0 : 1;
}

TEST(CollectivesMisc, GpuRanksRingFollowsTheGraph) {
  const std::string fixture = std::string(LOOM_SHARED_TOPOLOGIES) + "/aws-p4d.24xlarge.nccl.xml";
  if (!std::ifstream(fixture).good()) GTEST_SKIP() << fixture << " is absent";
  char dump[] = "/tmp/loom-schedules-XXXXXX";
  const int fd = mkstemp(dump);
  ASSERT_GE(fd, 0);
  close(fd);
  LaunchOptions opts;
  opts.nranks = 1;
  opts.initComm = false;
  opts.setCommId = false;
  opts.deadlineMs = 60000;
  opts.env.push_back({"LOOM_TOPO_FILE", fixture});
  opts.env.push_back({"LOOM_ALGO", "ring"});
  opts.env.push_back({"LOOM_SCHEDULE_DUMP", dump});
  const std::string path = dump;
  LaunchResult res = launch(opts, [&](RankContext&) { return graphRingRank(path); });
  EXPECT_TRUE(res.allPassed()) << res.report();
  unlink(dump);
}

// Sums `value` over comm with an int32 all-reduce.
int sumOver(loomComm_t comm, int value, int* out) {
  CHECK_LOOM(loomAllReduce(&value, out, 1, loomInt32, loomSum, comm, nullptr));
  return 0;
}

// Even and odd colours, keys that reverse the order; then a split that leaves
// the last rank out.
int splitRank(RankContext& ctx) {
  const int n = ctx.nranks, rank = ctx.rank;
  int failures = 0;
  loomComm_t sub = nullptr;
  CHECK_LOOM(loomCommSplit(ctx.comm, rank % 2, n - rank, &sub, nullptr));
  if (!report(sub != nullptr, "loomCommSplit returned no communicator")) return 1;
  int subCount = -1, subRank = -1;
  CHECK_LOOM(loomCommCount(sub, &subCount));
  CHECK_LOOM(loomCommUserRank(sub, &subRank));
  const int members = (n - rank % 2 + 1) / 2;   // ranks of my colour
  const int wantRank = members - 1 - rank / 2;  // reversed by the keys
  if (subCount != members || subRank != wantRank) {
    fprintf(stderr, "rank %d: split count/rank %d/%d, expected %d/%d\n", rank, subCount, subRank,
            members, wantRank);
    ++failures;
  }
  int sum = -1, want = 0;
  for (int r = rank % 2; r < n; r += 2) want += r;
  if (sumOver(sub, rank, &sum) != 0) return 1;
  if (sum != want) {
    fprintf(stderr, "rank %d: allreduce on the split comm: %d, expected %d\n", rank, sum, want);
    ++failures;
  }
  if (sumOver(ctx.comm, rank, &sum) != 0) return 1;
  failures += !report(sum == n * (n - 1) / 2, "allreduce on the parent after the split");
  CHECK_LOOM(loomCommFinalize(sub));
  CHECK_LOOM(loomCommDestroy(sub));

  loomComm_t part = nullptr;
  bool out = rank == n - 1;
  CHECK_LOOM(loomCommSplit(ctx.comm, out ? LOOM_SPLIT_NOCOLOR : 7, rank, &part, nullptr));
  if (out) {
    failures += !report(part == nullptr, "LOOM_SPLIT_NOCOLOR gave a communicator");
  } else {
    if (!report(part != nullptr, "split without the last rank gave no communicator")) return 1;
    CHECK_LOOM(loomCommCount(part, &subCount));
    failures += !report(subCount == n - 1, "count of the split without the last rank");
    if (sumOver(part, 1, &sum) != 0) return 1;
    failures += !report(sum == n - 1, "allreduce on the split without the last rank");
    CHECK_LOOM(loomCommDestroy(part));
  }
  return failures == 0 ? 0 : 1;
}

TEST(CollectivesMisc, SplitEvenOdd) {
  for (bool shm : {true, false}) {
    LaunchOptions opts;
    opts.nranks = 5;
    opts.shm = shm;
    opts.deadlineMs = 60000;
    LaunchResult res = launch(opts, splitRank);
    EXPECT_TRUE(res.allPassed()) << (shm ? "shm: " : "tcp: ") << res.report();
  }
}

// Several operations on one communicator in one group: an all-reduce, a
// broadcast, an all-gather and a ring of sends, all issued before any runs.
int groupedRank(RankContext& ctx) {
  constexpr size_t kCount = 4099;
  const int n = ctx.nranks, rank = ctx.rank;
  std::vector<float> a(kCount, static_cast<float>(rank + 1)), sum(kCount), bcast(kCount);
  std::vector<float> gathered(n * kCount), ring(kCount), root(kCount, 0);
  if (rank == 1)
    for (size_t j = 0; j < kCount; ++j) root[j] = static_cast<float>(j % 97);
  CHECK_LOOM(loomGroupStart());
  CHECK_LOOM(loomAllReduce(a.data(), sum.data(), kCount, loomFloat32, loomSum, ctx.comm, nullptr));
  CHECK_LOOM(loomBroadcast(root.data(), bcast.data(), kCount, loomFloat32, 1, ctx.comm, nullptr));
  CHECK_LOOM(loomAllGather(a.data(), gathered.data(), kCount, loomFloat32, ctx.comm, nullptr));
  CHECK_LOOM(loomSend(a.data(), kCount, loomFloat32, (rank + 1) % n, ctx.comm, nullptr));
  CHECK_LOOM(loomRecv(ring.data(), kCount, loomFloat32, (rank + n - 1) % n, ctx.comm, nullptr));
  CHECK_LOOM(loomGroupEnd());
  int failures = 0;
  for (size_t j = 0; j < kCount; ++j) {
    bool ok = sum[j] == n * (n + 1) / 2.0f && bcast[j] == static_cast<float>(j % 97) &&
              ring[j] == static_cast<float>((rank + n - 1) % n + 1);
    for (int r = 0; r < n; ++r) ok = ok && gathered[r * kCount + j] == static_cast<float>(r + 1);
    if (!ok && failures++ < 3)
      fprintf(stderr, "rank %d: index %zu: sum %g bcast %g ring %g\n", rank, j, sum[j], bcast[j],
              ring[j]);
  }
  return failures == 0 ? 0 : 1;
}

TEST(CollectivesMisc, SeveralOperationsInOneGroup) {
  for (bool shm : {true, false}) {
    LaunchOptions opts;
    opts.nranks = 3;
    opts.shm = shm;
    opts.deadlineMs = 60000;
    LaunchResult res = launch(opts, groupedRank);
    EXPECT_TRUE(res.allPassed()) << (shm ? "shm: " : "tcp: ") << res.report();
  }
}

}  // namespace
}  // namespace loomtest
