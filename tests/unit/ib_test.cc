// The ib transport's logic that needs no RDMA device: device and port
// selection strings, GID choice, link rates, flow control, and the loader's
// failure path. The transport itself runs for real in tests/rdma/run.sh.
#include <gtest/gtest.h>

#ifdef LOOM_HAVE_IB
#include <cstring>
#include <random>

#include "transport/ib/credits.h"
#include "transport/ib/ib_setup.h"
#include "transport/ib/verbs.h"
#include "util/net.h"

namespace loom::transport::ib {
namespace {

TEST(IbHca, PrefixesPortsExclusionAndExactNames) {
  auto f = net::NameFilter::parse("mlx5_0:1,mlx5_1", true);
  ASSERT_EQ(f.entries.size(), 2u);
  EXPECT_EQ(f.entries[0].name, "mlx5_0");
  EXPECT_EQ(f.entries[0].port, 1);
  EXPECT_EQ(f.entries[1].port, -1);
  EXPECT_TRUE(f.matches("mlx5_0", 1));
  EXPECT_FALSE(f.matches("mlx5_0", 2));  // only port 1 of mlx5_0
  EXPECT_TRUE(f.matches("mlx5_1", 2));   // any port of mlx5_1
  EXPECT_TRUE(f.matches("mlx5_10", 1));  // a prefix
  EXPECT_FALSE(f.matches("mlx4_0", 1));

  auto exact = net::NameFilter::parse("=mlx5_1", true);
  EXPECT_TRUE(exact.matches("mlx5_1", 1));
  EXPECT_FALSE(exact.matches("mlx5_10", 1));

  auto excl = net::NameFilter::parse("^rxe1,mlx5_0:2", true);
  EXPECT_TRUE(excl.exclude);
  EXPECT_TRUE(excl.matches("rxe0", 1));
  EXPECT_FALSE(excl.matches("rxe1", 1));
  EXPECT_FALSE(excl.matches("mlx5_0", 2));
  EXPECT_TRUE(excl.matches("mlx5_0", 1));

  auto both = net::NameFilter::parse("^=rxe0", true);
  EXPECT_TRUE(both.exclude && both.exact);
  EXPECT_FALSE(both.matches("rxe0", 1));
  EXPECT_TRUE(both.matches("rxe01", 1));

  // Without ports (LOOM_SOCKET_IFNAME) a colon is part of the name.
  auto ifs = net::NameFilter::parse("eth0:1", false);
  ASSERT_EQ(ifs.entries.size(), 1u);
  EXPECT_EQ(ifs.entries[0].name, "eth0:1");
  // A suffix that is not a port number stays in the name; empty entries vanish.
  auto odd = net::NameFilter::parse("dev:x,,dev2:0", true);
  ASSERT_EQ(odd.entries.size(), 2u);
  EXPECT_EQ(odd.entries[0].name, "dev:x");
  EXPECT_EQ(odd.entries[1].name, "dev2:0");
}

ibv_gid gid(std::initializer_list<uint8_t> tail, bool v4) {
  ibv_gid g{};
  if (v4) {
    g.raw[10] = g.raw[11] = 0xff;
    size_t i = 12;
    for (uint8_t b : tail) g.raw[i++] = b;
  } else {
    g.raw[0] = 0xfe;
    g.raw[1] = 0x80;
    size_t i = 8;
    for (uint8_t b : tail) g.raw[i++] = b;
  }
  return g;
}

TEST(IbGid, PrefersRoceV2WithIpv4) {
  // A typical RoCE table: link-local v1, link-local v2, IPv4 v1, IPv4 v2.
  std::vector<ibv_gid> gids = {gid({1, 2}, false), gid({1, 2}, false), gid({10, 0, 0, 1}, true),
                               gid({10, 0, 0, 1}, true)};
  std::vector<std::string> types = {"IB/RoCE v1", "RoCE v2", "IB/RoCE v1", "RoCE v2"};
  EXPECT_EQ(pickGid(-1, types, gids), 3);
  EXPECT_EQ(pickGid(2, types, gids), 2);  // LOOM_IB_GID_INDEX wins
  EXPECT_EQ(pickGid(7, types, gids), -1);  // no such entry
  // No IPv4 address: the first RoCE v2; no types known: the first non-zero.
  EXPECT_EQ(pickGid(-1, types, {gids[0], gids[1]}), 1);
  EXPECT_EQ(pickGid(-1, {}, {ibv_gid{}, gids[0]}), 1);
  EXPECT_EQ(pickGid(-1, {}, {ibv_gid{}}), -1);
}

TEST(IbRate, WidthTimesLaneSpeed) {
  EXPECT_DOUBLE_EQ(portGbps(2, 32), 100);   // 4x EDR
  EXPECT_DOUBLE_EQ(portGbps(2, 64), 200);   // 4x HDR
  EXPECT_DOUBLE_EQ(portGbps(2, 128), 400);  // 4x NDR
  EXPECT_DOUBLE_EQ(portGbps(1, 4), 10);     // 1x QDR
  EXPECT_DOUBLE_EQ(portGbps(3, 4), 0);      // not a width code
  EXPECT_DOUBLE_EQ(portGbps(2, 3), 0);      // not a speed code
}

TEST(IbImm, KindAndValueRoundTrip) {
  for (uint32_t v : {0u, 1u, 262144u, kImmValueMax}) {
    for (Imm k : {Imm::Data, Imm::Credit, Imm::Broken}) {
      const uint32_t imm = makeImm(k, v);
      EXPECT_EQ(immKind(imm), k);
      EXPECT_EQ(immValue(imm), v);
    }
  }
}

TEST(IbCredits, SenderStopsAtDepthUntilCreditAndCompletion) {
  Credits c(4);
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(c.canSend());
    EXPECT_EQ(c.sendIndex(), static_cast<size_t>(i));
    c.onPost();
  }
  EXPECT_FALSE(c.canSend());
  EXPECT_TRUE(c.onCredit(1));
  EXPECT_FALSE(c.canSend());  // the staging slot's write has not completed
  EXPECT_TRUE(c.onSendComplete());
  EXPECT_TRUE(c.canSend());
  EXPECT_EQ(c.sendIndex(), 0u);  // slot 0 again
  EXPECT_FALSE(c.onCredit(4));   // only 3 slots are out
  EXPECT_FALSE(c.onCredit(0));
  EXPECT_TRUE(c.onCredit(3));
  EXPECT_FALSE(c.flushed());
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(c.onSendComplete());
  EXPECT_TRUE(c.flushed());
  EXPECT_FALSE(c.onSendComplete());  // nothing left to complete
}

TEST(IbCredits, ReceiverRejectsWritesBeyondDepthAndBatchesCredits) {
  Credits c(3);
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(c.onArrival());
  EXPECT_FALSE(c.onArrival());  // a fourth slot without credit
  ASSERT_TRUE(c.hasArrival());
  EXPECT_EQ(c.recvIndex(), 0u);
  c.release();
  c.release();
  EXPECT_EQ(c.recvIndex(), 2u);
  EXPECT_EQ(c.takeOwed(), 2u);
  EXPECT_EQ(c.takeOwed(), 0u);
  EXPECT_TRUE(c.onArrival());
  EXPECT_EQ(c.arrived, 4u);
}

// Two ends of a link simulated over random interleavings: the sender never
// overruns the receiver, every slot arrives in order, and nothing stalls.
TEST(IbCredits, RandomInterleavingsDeliverEverySlotInOrder) {
  std::mt19937 rng(7);
  for (size_t depth : {2u, 3u, 4u, 16u}) {
    Credits tx(depth), rx(depth);
    uint64_t inFlight = 0, completions = 0, creditsInFlight = 0, delivered = 0;
    const uint64_t total = 5000;
    int idle = 0;
    while (delivered < total) {
      bool moved = false;
      switch (rng() % 5) {
        case 0:
          if (tx.posted < total && tx.canSend()) {
            tx.onPost();
            ++inFlight;
            moved = true;
          }
          break;
        case 1:
          if (inFlight > 0) {
            ASSERT_TRUE(rx.onArrival());
            --inFlight;
            ++completions;
            moved = true;
          }
          break;
        case 2:
          if (completions > 0) {
            ASSERT_TRUE(tx.onSendComplete());
            --completions;
            moved = true;
          }
          break;
        case 3:
          if (rx.hasArrival()) {
            ASSERT_EQ(rx.recvIndex(), delivered % depth);
            rx.release();
            ++delivered;
            if (rng() % 2) creditsInFlight += rx.takeOwed();
            moved = true;
          }
          break;
        case 4:
          if (creditsInFlight > 0) {
            ASSERT_TRUE(tx.onCredit(creditsInFlight));
            creditsInFlight = 0;
            moved = true;
          } else if (rx.owed > 0) {
            creditsInFlight += rx.takeOwed();
            moved = true;
          }
          break;
      }
      idle = moved ? 0 : idle + 1;
      ASSERT_LT(idle, 1000) << "stalled at depth " << depth << " after " << delivered;
    }
    EXPECT_EQ(rx.arrived, total);
  }
}

TEST(IbLoader, MissingLibraryIsAClearReason) {
  std::string why;
  EXPECT_EQ(loadVerbsFrom("/nonexistent/libibverbs.so.1", &why), nullptr);
  EXPECT_NE(why.find("cannot load /nonexistent/libibverbs.so.1"), std::string::npos) << why;
  // A library that exists but is not libibverbs names the first missing symbol.
  EXPECT_EQ(loadVerbsFrom("libc.so.6", &why), nullptr);
  EXPECT_NE(why.find("lacks ibv_get_device_list"), std::string::npos) << why;
}

TEST(IbLoader, AvailabilityMatchesThePortsFound) {
  std::string why;
  const Verbs* v = loadVerbs(&why);
  if (v == nullptr) GTEST_SKIP() << "libibverbs not loadable here: " << why;
  const bool any = !listPorts(*v, net::NameFilter{}, false, -1).empty();
  std::string reason;
  EXPECT_EQ(available(&reason), any) << reason;
  if (!any) {
    EXPECT_EQ(reason, "no active RDMA port");
  }
}

}  // namespace
}  // namespace loom::transport::ib
#else
TEST(Ib, NotBuilt) { GTEST_SKIP() << "built without infiniband/verbs.h (libibverbs-dev)"; }
#endif
