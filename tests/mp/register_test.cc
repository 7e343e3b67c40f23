// loomCommRegister: buffers registered with the communicator are sent in place
// by the ib transport (tests/rdma/run.sh runs these cases over Soft-RoCE with
// LOOM_NET=IB and checks that sends came from registered memory); over shared
// memory and TCP registration changes nothing. Results are checked against
// sums computed here, including after a registered buffer is rewritten while
// earlier sends from it may still be in flight, and bad handles name themselves.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "harness.h"

namespace loomtest {
namespace {

float valueOf(int rank, size_t i, int rep) {
  return static_cast<float>((rank + 1) * 3 +
                            static_cast<int>((i * 7 + static_cast<size_t>(rep)) % 1001));
}

int registeredCollectives(RankContext& ctx) {
  const int n = ctx.nranks;
  // Several slots per message (LOOM_SLOT_BYTES = 64 KiB) and a partial last one.
  const size_t count = 16384 * 5 + 123;
  std::vector<float> send(count * static_cast<size_t>(n)), recv(count * static_cast<size_t>(n));
  void* hs = nullptr;
  void* hr = nullptr;
  if (loomCommRegister(ctx.comm, send.data(), send.size() * sizeof(float), &hs) != loomSuccess ||
      loomCommRegister(ctx.comm, recv.data(), recv.size() * sizeof(float), &hr) != loomSuccess) {
    fprintf(stderr, "register: %s\n", loomGetLastError(ctx.comm));
    return 1;
  }
  for (int rep = 0; rep < 4; ++rep) {
    // All-reduce, out of place then in place: the ring sends partial sums from recv.
    for (size_t i = 0; i < count; ++i) send[i] = valueOf(ctx.rank, i, rep);
    const bool inPlace = rep % 2 == 1;
    if (inPlace) std::memcpy(recv.data(), send.data(), count * sizeof(float));
    if (loomAllReduce(inPlace ? recv.data() : send.data(), recv.data(), count, loomFloat32, loomSum,
                      ctx.comm, nullptr) != loomSuccess) {
      fprintf(stderr, "allreduce: %s\n", loomGetLastError(ctx.comm));
      return 2;
    }
    for (size_t i = 0; i < count; ++i) {
      float want = 0;
      for (int r = 0; r < n; ++r) want += valueOf(r, i, rep);
      if (recv[i] != want) {
        fprintf(stderr, "rank %d rep %d: allreduce[%zu] = %g, want %g\n", ctx.rank, rep, i, recv[i],
                want);
        return 3;
      }
    }
    // All-gather straight from the registered send buffer into the registered receive buffer.
    if (loomAllGather(send.data(), recv.data(), count, loomFloat32, ctx.comm, nullptr) !=
        loomSuccess) {
      fprintf(stderr, "allgather: %s\n", loomGetLastError(ctx.comm));
      return 4;
    }
    for (int r = 0; r < n; ++r)
      for (size_t i = 0; i < count; ++i)
        if (recv[static_cast<size_t>(r) * count + i] != valueOf(r, i, rep)) {
          fprintf(stderr, "rank %d rep %d: allgather block %d [%zu] wrong\n", ctx.rank, rep, r, i);
          return 5;
        }
    // Send/receive around the ring, from part of a registered buffer.
    const int to = (ctx.rank + 1) % n, from = (ctx.rank + n - 1) % n;
    loomGroupStart();
    loomSend(send.data() + 5, count - 5, loomFloat32, to, ctx.comm, nullptr);
    loomRecv(recv.data(), count - 5, loomFloat32, from, ctx.comm, nullptr);
    if (loomGroupEnd() != loomSuccess) {
      fprintf(stderr, "sendrecv: %s\n", loomGetLastError(ctx.comm));
      return 6;
    }
    for (size_t i = 0; i + 5 < count; ++i)
      if (recv[i] != valueOf(from, i + 5, rep)) {
        fprintf(stderr, "rank %d rep %d: recv[%zu] wrong\n", ctx.rank, rep, i);
        return 7;
      }
  }
  if (loomCommDeregister(ctx.comm, hs) != loomSuccess ||
      loomCommDeregister(ctx.comm, hr) != loomSuccess) {
    fprintf(stderr, "deregister: %s\n", loomGetLastError(ctx.comm));
    return 8;
  }
  // A second deregistration, a null handle and a stranger's handle are refused by name.
  int dummy = 0;
  if (loomCommDeregister(ctx.comm, hs) != loomInvalidArgument ||
      std::string(loomGetLastError(ctx.comm)).find("handle") == std::string::npos ||
      loomCommDeregister(ctx.comm, nullptr) != loomInvalidArgument ||
      loomCommDeregister(ctx.comm, &dummy) != loomInvalidArgument)
    return 9;
  void* h = &dummy;
  if (loomCommRegister(ctx.comm, nullptr, 16, &h) != loomInvalidArgument || h != nullptr ||
      std::string(loomGetLastError(ctx.comm)).find("buff") == std::string::npos ||
      loomCommRegister(ctx.comm, send.data(), 0, &h) != loomInvalidArgument ||
      loomCommRegister(ctx.comm, send.data(), 16, nullptr) != loomInvalidArgument ||
      loomCommRegister(nullptr, send.data(), 16, &h) != loomInvalidArgument)
    return 10;
  return 0;
}

class RegisterTest : public ::testing::TestWithParam<std::tuple<int, bool>> {};

TEST_P(RegisterTest, CollectivesFromRegisteredBuffers) {
  LaunchOptions opts;
  opts.nranks = std::get<0>(GetParam());
  opts.shm = std::get<1>(GetParam());
  opts.env = {{"LOOM_SLOT_BYTES", "65536"}};
  LaunchResult res = launch(opts, registeredCollectives);
  EXPECT_TRUE(res.allPassed()) << res.report();
}

INSTANTIATE_TEST_SUITE_P(Ranks, RegisterTest,
                         ::testing::Combine(::testing::Values(2, 3), ::testing::Bool()),
                         [](const auto& info) {
                           return std::to_string(std::get<0>(info.param)) + "ranks_" +
                                  (std::get<1>(info.param) ? "shm" : "net");
                         });

}  // namespace
}  // namespace loomtest
