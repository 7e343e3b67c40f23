// Where no RDMA port exists (this machine) or libibverbs cannot be loaded, the
// ib transport steps aside: by default ranks of different hosts talk TCP and
// collectives give correct results; LOOM_NET=IB makes the missing transport a
// clear init error that names the setting; a bad LOOM_NET value names itself.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "harness.h"

namespace loomtest {
namespace {

bool rdmaPortPresent() {
  // Any active port under /sys/class/infiniband means the fallback cannot be observed here.
  FILE* p = popen("cat /sys/class/infiniband/*/ports/*/state 2>/dev/null | grep -c ACTIVE", "r");
  if (p == nullptr) return false;
  int n = 0;
  if (fscanf(p, "%d", &n) != 1) n = 0;
  pclose(p);
  return n > 0;
}

int initExpecting(RankContext& ctx, loomResult_t want, const char* mention) {
  loomComm_t comm = nullptr;
  loomUniqueId id;
  if (loomGetUniqueId(&id) != loomSuccess) return 6;  // LOOM_COMM_ID: rank 0 hosts the root
  loomResult_t r = loomCommInitRank(&comm, ctx.nranks, id, ctx.rank);
  if (r != want) {
    fprintf(stderr, "rank %d: init gave %d, want %d: %s\n", ctx.rank, r, want,
            loomGetLastError(nullptr));
    if (r == loomSuccess) loomCommDestroy(comm);
    return 1;
  }
  if (r != loomSuccess) {
    const std::string msg = loomGetLastError(nullptr);
    if (msg.find(mention) == std::string::npos) {
      fprintf(stderr, "rank %d: message lacks \"%s\": %s\n", ctx.rank, mention, msg.c_str());
      return 2;
    }
    return 0;
  }
  std::vector<float> v(1000);
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = static_cast<float>(ctx.rank + 1) * static_cast<float>(i);
  if (loomAllReduce(v.data(), v.data(), v.size(), loomFloat32, loomSum, comm, nullptr) !=
      loomSuccess)
    return 3;
  const float k = static_cast<float>(ctx.nranks * (ctx.nranks + 1) / 2);
  for (size_t i = 0; i < v.size(); ++i)
    if (v[i] != k * static_cast<float>(i)) return 4;
  return loomCommDestroy(comm) == loomSuccess ? 0 : 5;
}

LaunchOptions netOptions(std::vector<std::pair<std::string, std::string>> env) {
  LaunchOptions o;
  o.nranks = 2;
  o.shm = false;  // every pair goes through the network transports
  o.initComm = false;
  o.timeoutMs = 10000;
  o.env = std::move(env);
  return o;
}

TEST(IbFallback, DefaultFallsBackToTcp) {
  if (rdmaPortPresent()) GTEST_SKIP() << "an active RDMA port exists; ib would be used";
  auto res =
      launch(netOptions({}), [](RankContext& c) { return initExpecting(c, loomSuccess, ""); });
  EXPECT_TRUE(res.allPassed()) << res.report();
}

TEST(IbFallback, DisabledIbStillWorks) {
  auto res = launch(netOptions({{"LOOM_IB_DISABLE", "1"}}),
                    [](RankContext& c) { return initExpecting(c, loomSuccess, ""); });
  EXPECT_TRUE(res.allPassed()) << res.report();
}

TEST(IbFallback, ForcedIbWithoutAPortIsAClearError) {
  if (rdmaPortPresent()) GTEST_SKIP() << "an active RDMA port exists; ib would be used";
  auto res = launch(netOptions({{"LOOM_NET", "IB"}}), [](RankContext& c) {
    return initExpecting(c, loomSystemError, "LOOM_NET=IB");
  });
  EXPECT_TRUE(res.allPassed()) << res.report();
}

TEST(IbFallback, UnknownNetValueNamesItself) {
  auto res = launch(netOptions({{"LOOM_NET", "carrier-pigeon"}}), [](RankContext& c) {
    return initExpecting(c, loomInvalidArgument, "LOOM_NET=carrier-pigeon");
  });
  EXPECT_TRUE(res.allPassed()) << res.report();
}

}  // namespace
}  // namespace loomtest
