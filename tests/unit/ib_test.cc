// The ib transport's logic that needs no RDMA device: device and port
// selection strings, GID choice, link rates, flow control, and the loader's
// failure path. The transport itself runs for real in tests/rdma/run.sh.
#include <gtest/gtest.h>

#ifdef LOOM_HAVE_IB
#include <fcntl.h>
#include <sys/socket.h>

#include <cstring>
#include <random>
#include <thread>

#include "transport/ib/credits.h"
#include "transport/ib/gdr.h"
#include "transport/ib/ib_connection.h"
#include "transport/ib/ib_setup.h"
#include "transport/ib/verbs.h"
#include "transport/tcp/tcp_connection.h"
#include "util/net.h"
#include "util/wait.h"

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
  EXPECT_EQ(pickGid(2, types, gids), 2);   // LOOM_IB_GID_INDEX wins
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

// The registration a buffer gets, for every combination of the seven conditions, against
// the rule as docs/ARCHITECTURE.md states it: host memory is plain; a device buffer takes
// dma-buf only when GPUDirect is allowed, the driver loads, exports the call, the GPU supports
// dma-buf and libibverbs has ibv_reg_dmabuf_mr; else peer memory where the module is loaded;
// else it stays staged.
TEST(IbGdr, ChoiceFollowsEveryCondition) {
  for (unsigned bits = 0; bits < 128; ++bits) {
    GdrCaps c;
    c.device = bits & 1;
    c.disabled = bits & 2;
    c.driver = bits & 4;
    c.driverDmaBuf = bits & 8;
    c.gpuDmaBuf = bits & 16;
    c.verbsDmaBuf = bits & 32;
    c.peerMem = bits & 64;
    Registration expected;
    if (!c.device)
      expected = Registration::Host;
    else if (c.disabled || !c.driver)
      expected = Registration::Staged;
    else if (c.driverDmaBuf && c.gpuDmaBuf && c.verbsDmaBuf)
      expected = Registration::DmaBuf;
    else
      expected = c.peerMem ? Registration::PeerMem : Registration::Staged;
    std::string why;
    EXPECT_EQ(chooseRegistration(c, &why), expected) << "conditions " << bits;
    // A device buffer not given dma-buf always says why; the others say nothing.
    EXPECT_EQ(why.empty(), expected == Registration::Host || expected == Registration::DmaBuf)
        << "conditions " << bits << ": " << why;
  }
}

TEST(IbGdr, ReasonsNameTheMissingPiece) {
  GdrCaps c;
  c.device = c.driver = c.driverDmaBuf = c.gpuDmaBuf = c.verbsDmaBuf = true;
  std::string why;
  c.disabled = true;
  EXPECT_EQ(chooseRegistration(c, &why), Registration::Staged);
  EXPECT_EQ(why, "LOOM_GDR_DISABLE=1");
  c.disabled = false;
  c.gpuDmaBuf = false;
  EXPECT_EQ(chooseRegistration(c, &why), Registration::Staged);
  EXPECT_NE(why.find("does not support dma-buf"), std::string::npos) << why;
  EXPECT_NE(why.find("nvidia_peermem"), std::string::npos) << why;
  c.gpuDmaBuf = true;
  c.verbsDmaBuf = false;
  c.peerMem = true;
  EXPECT_EQ(chooseRegistration(c, &why), Registration::PeerMem);
  EXPECT_NE(why.find("ibv_reg_dmabuf_mr"), std::string::npos) << why;
}

TEST(IbGdr, FailedRegistrationsFallBackInOrder) {
  GdrCaps c;
  c.device = c.driver = true;
  EXPECT_EQ(fallbackAfter(Registration::DmaBuf, c), Registration::Staged);
  c.peerMem = true;
  EXPECT_EQ(fallbackAfter(Registration::DmaBuf, c), Registration::PeerMem);
  EXPECT_EQ(fallbackAfter(Registration::PeerMem, c), Registration::Staged);
}

// Here (no GPU driver): the driver table is absent with a reason, device buffers could only
// stage, and the choice for such a buffer says so.
TEST(IbGdr, WithoutADriverDeviceBuffersStage) {
  std::string why;
  const CudaDriver* cuda = CudaDriver::get(&why);
  if (cuda != nullptr) GTEST_SKIP() << "a CUDA driver is loaded here; tests/gpu covers it";
  EXPECT_FALSE(why.empty());
  EXPECT_EQ(CudaDriver::get(&why), nullptr);  // loaded once, the same answer
  GdrCaps c;
  c.device = true;
  c.peerMem = true;
  EXPECT_EQ(chooseRegistration(c, &why), Registration::Staged);
  EXPECT_NE(why.find("CUDA driver"), std::string::npos) << why;
}

// Links as the watch links are (64-byte slots, depth 2), over socket pairs in one process.
struct Mesh {
  // links[a][b]: rank a's end of the link to b.
  std::vector<std::vector<std::unique_ptr<Connection>>> links;
  explicit Mesh(int n) : links(static_cast<size_t>(n)) {
    for (auto& row : links) row.resize(static_cast<size_t>(n));
    for (int a = 0; a < n; ++a)
      for (int b = a + 1; b < n; ++b) {
        int sv[2];
        EXPECT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
        for (int fd : sv) fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
        links[a][b] = std::make_unique<TcpConnection>(b, sv[0], 64, 2);
        links[b][a] = std::make_unique<TcpConnection>(a, sv[1], 64, 2);
      }
  }
};

// Every rank sends each peer a record naming (sender, receiver) and must get back exactly the
// peer's record for it, whatever order the ranks run in: all sends go out before any wait.
TEST(IbExchange, EveryPairSwapsItsRecords) {
  for (int n : {2, 3, 6}) {
    Mesh mesh(n);
    std::vector<Status> results(static_cast<size_t>(n));
    std::vector<std::vector<QpInfo>> got(static_cast<size_t>(n));
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r) {
      threads.emplace_back([&, r] {
        std::vector<Connection*> via;
        std::vector<QpInfo> mine, theirs(static_cast<size_t>(n - 1));
        for (int p = 0; p < n; ++p)
          if (p != r) {
            via.push_back(mesh.links[r][p].get());
            QpInfo q;
            q.qpn = static_cast<uint32_t>(1000 * r + p);  // from r, meant for p
            q.valid = 1;
            mine.push_back(q);
          }
        std::vector<const void*> out;
        std::vector<void*> in;
        for (size_t i = 0; i < mine.size(); ++i) out.push_back(&mine[i]), in.push_back(&theirs[i]);
        results[r] =
            exchangeOverLinks(via, out, in, sizeof(QpInfo), nowNs() + 60'000'000'000, nullptr);
        got[r] = theirs;
      });
    }
    for (auto& t : threads) t.join();
    for (int r = 0; r < n; ++r) {
      ASSERT_TRUE(results[r].isOk()) << results[r].message();
      size_t i = 0;
      for (int p = 0; p < n; ++p) {
        if (p == r) continue;
        EXPECT_EQ(got[r][i++].qpn, static_cast<uint32_t>(1000 * p + r)) << n;
      }
    }
  }
}

TEST(IbExchange, APeerThatLeavesIsNamedAndOneThatIsSilentTimesOut) {
  Mesh mesh(3);
  QpInfo mine[2], theirs[2];
  std::vector<Connection*> via = {mesh.links[0][1].get(), mesh.links[0][2].get()};
  // Rank 2 is gone: its ends close. Rank 1 is alive but never answers.
  mesh.links[2][0].reset();
  Status s = exchangeOverLinks(via, {&mine[0], &mine[1]}, {&theirs[0], &theirs[1]}, sizeof(QpInfo),
                               nowNs() + 60'000'000'000, nullptr);
  EXPECT_EQ(s.code(), loomRemoteError) << s.message();
  EXPECT_NE(s.message().find("rank 2"), std::string::npos) << s.message();

  Mesh quiet(2);
  via = {quiet.links[0][1].get()};
  s = exchangeOverLinks(via, {&mine[0]}, {&theirs[0]}, sizeof(QpInfo), nowNs() + 50'000'000,
                        nullptr);
  EXPECT_EQ(s.code(), loomTimeout) << s.message();
  EXPECT_NE(s.message().find("waiting for rank 1"), std::string::npos) << s.message();

  std::atomic<bool> abort{true};
  s = exchangeOverLinks(via, {&mine[0]}, {&theirs[0]}, sizeof(QpInfo), nowNs() + 60'000'000'000,
                        &abort);
  EXPECT_FALSE(s.isOk());
  EXPECT_NE(s.message().find("aborted"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace loom::transport::ib
#else
TEST(Ib, NotBuilt) { GTEST_SKIP() << "built without infiniband/verbs.h (libibverbs-dev)"; }
#endif
