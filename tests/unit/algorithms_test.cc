// The algorithm dispatcher, the cost model and the LOOM_ALGO / LOOM_PROTO
// parser. (The verifier's sweeps over the tree, rhd and hier builders are in
// verifier_test.cc, beside the ring's.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "algorithms/cost.h"
#include "algorithms/schedule.h"

namespace loom::algo {
namespace {

// The dispatcher builds the named algorithm and falls back to the default
// builder where the algorithm has none for the collective.
TEST(AlgorithmsTest, DispatchByName) {
  const std::vector<int> hosts = {0, 0, 1, 1};
  EXPECT_STREQ(build(Algo::Tree, Coll::AllReduce, 0, 4, -1, 8, false, hosts).algorithm, "tree");
  EXPECT_STREQ(build(Algo::Rhd, Coll::AllReduce, 0, 4, -1, 8, false, hosts).algorithm, "rhd");
  EXPECT_STREQ(build(Algo::Rhd, Coll::AllGather, 0, 4, -1, 8, false, hosts).algorithm, "rhd");
  EXPECT_STREQ(build(Algo::Hier, Coll::AllReduce, 0, 4, -1, 8, false, hosts).algorithm, "hier");
  EXPECT_STREQ(build(Algo::HierRd, Coll::AllReduce, 0, 4, -1, 8, false, hosts).algorithm, "hierrd");
  EXPECT_STREQ(build(Algo::Rhd, Coll::ReduceScatter, 0, 4, -1, 8, false, hosts).algorithm, "rhd");
  EXPECT_STREQ(build(Algo::Tree, Coll::Broadcast, 0, 4, 1, 8, false, hosts).algorithm, "chain");
  EXPECT_TRUE(algoBuilds(Algo::Rhd, Coll::ReduceScatter));
  EXPECT_FALSE(algoBuilds(Algo::Rd, Coll::ReduceScatter));
  EXPECT_STREQ(build(Algo::Rd, Coll::AllReduce, 0, 4, -1, 8, false, hosts).algorithm, "rd");
  EXPECT_STREQ(build(Algo::Rd, Coll::AllGather, 0, 4, -1, 8, false, hosts).algorithm, "ring");
  Algo a;
  EXPECT_TRUE(parseAlgo("rd", &a));
  EXPECT_EQ(a, Algo::Rd);
  EXPECT_TRUE(parseAlgo("RHD", &a));
  EXPECT_EQ(a, Algo::Rhd);
  EXPECT_FALSE(parseAlgo("nccl", &a));
}

// Tree depth: the number of sequential hops is logarithmic, not linear.
TEST(AlgorithmsTest, TreeIsShallow) {
  const int n = 64;
  int maxSteps = 0;
  for (int r = 0; r < n; ++r)
    maxSteps =
        std::max(maxSteps, static_cast<int>(buildTreeAllReduce(r, n, 1 << 10).channels[0].size()));
  EXPECT_LE(maxSteps, 12);  // at most 3 children and 1 parent per tree, two trees
  // Recursive halving-doubling of one element: 2 log2(n) exchanges at most.
  for (int r = 0; r < n; ++r) EXPECT_LE(buildRhdAllReduce(r, n, 1).channels[0].size(), 12u);
}

// Recursive doubling: one exchange per doubling (a send and a receive-reduce of the whole
// buffer), so 2 ranks finish in one; folded ranks add a hand-over and a hand-back.
TEST(AlgorithmsTest, RecursiveDoublingTakesLogRounds) {
  for (int n : {2, 4, 8, 16}) {
    int rounds = 0;
    while ((1 << rounds) < n) ++rounds;
    for (int r = 0; r < n; ++r) {
      const Schedule s = buildRdAllReduce(r, n, 1000);
      ASSERT_EQ(s.channels[0].size(), static_cast<size_t>(2 * rounds)) << n << " ranks, rank " << r;
      for (const Step& st : s.channels[0]) EXPECT_EQ(st.count, 1000u);
    }
  }
  // 6 ranks: ranks 0 and 2 fold into 1 and 3 (one send, one receive each); the rest double twice.
  EXPECT_EQ(buildRdAllReduce(0, 6, 10).channels[0].size(), 2u);
  EXPECT_EQ(buildRdAllReduce(1, 6, 10).channels[0].size(), 6u);
  EXPECT_EQ(buildRdAllReduce(5, 6, 10).channels[0].size(), 4u);
}

// ---------------------------------------------------------------------------
// Cost model

LinkMap hostsMap(int n, int perHost, Link intra, Link inter) {
  LinkMap m;
  m.intra = intra;
  m.inter = inter;
  for (int r = 0; r < n; ++r) m.hostOf.push_back(r / perHost);
  return m;
}

TEST(CostModelTest, TreeBeatsRingForSmallMessagesAcrossSlowLinks) {
  const CostModel model = defaultCostModel();
  for (int n : {8, 16, 32}) {
    const LinkMap links = hostsMap(n, 1, Link::Shm, Link::Tcp);
    const double tree = estimateUs(Algo::Tree, Coll::AllReduce, n, 2, 4, model, links);
    const double ring = estimateUs(Algo::Ring, Coll::AllReduce, n, 2, 4, model, links);
    const double rhd = estimateUs(Algo::Rhd, Coll::AllReduce, n, 2, 4, model, links);
    EXPECT_LT(tree, ring) << n << " ranks";
    EXPECT_LT(rhd, ring) << n << " ranks";
  }
  // Beyond the simulated sizes the closed forms agree.
  const LinkMap big = hostsMap(128, 1, Link::Shm, Link::Tcp);
  EXPECT_LT(estimateUs(Algo::Tree, Coll::AllReduce, 128, 2, 4, model, big),
            estimateUs(Algo::Ring, Coll::AllReduce, 128, 2, 4, model, big));
}

// Where ranks outnumber cores every wait for a peer pays a hand-over of the core: a
// simulated schedule pays it once per receive or memory wait, the closed form once per
// counted round; with one rank a core nothing changes. On one host of 8 ranks 4 a core the
// direct all-reduce (one or two waits) is then the cheapest at every size, as measured there.
TEST(CostModelTest, RanksSharingCoresPayAHandOverPerWait) {
  const CostModel model = defaultCostModel();
  LinkMap one;
  LinkMap four = one;
  four.ranksPerCore = 4;
  EXPECT_EQ(one.handoverUs(model), 0);
  EXPECT_DOUBLE_EQ(four.handoverUs(model), 4 * model.handover_us);
  // Recursive doubling of 8 ranks: 3 rounds, each a wait, in both forms.
  for (auto estimate : {estimateUs, closedFormUs}) {
    const double slow = estimate(Algo::Rd, Coll::AllReduce, 8, 2, 4, model, four);
    const double fast = estimate(Algo::Rd, Coll::AllReduce, 8, 2, 4, model, one);
    EXPECT_NEAR(slow - fast, 3 * four.handoverUs(model), 1e-6);
  }
  // 2 ranks of recursive doubling: one wait.
  EXPECT_NEAR(estimateUs(Algo::Rd, Coll::AllReduce, 2, 2, 4, model, four) -
                  estimateUs(Algo::Rd, Coll::AllReduce, 2, 2, 4, model, one),
              four.handoverUs(model), 1e-6);
  for (size_t bytes = 8; bytes <= (size_t{8} << 20); bytes *= 4) {
    const size_t count = bytes / 4;
    const double direct = estimateUs(Algo::Direct, Coll::AllReduce, 8, count, 4, model, four);
    for (Algo a : {Algo::Ring, Algo::Tree, Algo::Rhd, Algo::Rd})
      EXPECT_LT(direct, estimateUs(a, Coll::AllReduce, 8, count, 4, model, four))
          << algoName(a) << " at " << bytes << " B";
  }
}

// Small messages: recursive doubling needs the fewest rounds (one for 2 ranks, against two for
// ring and rhd); large ones: it moves the whole buffer every round and loses to the ring.
TEST(CostModelTest, RecursiveDoublingForSmallMessagesOnly) {
  const CostModel model = defaultCostModel();
  for (int n : {2, 4, 8}) {
    const LinkMap links = hostsMap(n, 1, Link::Shm, Link::Tcp);
    auto us = [&](Algo a, size_t count) {
      return estimateUs(a, Coll::AllReduce, n, count, 4, model, links);
    };
    for (Algo other : {Algo::Ring, Algo::Rhd, Algo::Tree})
      EXPECT_LT(us(Algo::Rd, 2), us(other, 2)) << n << " ranks, against " << algoName(other);
    const size_t big = size_t{16} << 20;
    EXPECT_GT(us(Algo::Rd, big), us(Algo::Ring, big)) << n << " ranks";
  }
}

// The tuner offers rd above kRdMaxBytes only where no ranks share a host's port: on one host
// (every pair has its own connection) and with one rank a host; not with several ranks on each
// of several hosts, where the model would price its rounds too cheaply.
TEST(CostModelTest, RecursiveDoublingOfferedAtLargeSizesUnlessPortsAreShared) {
  const size_t big = kRdMaxBytes * 64;
  auto offersRd = [](size_t bytes, const std::vector<int>& hostOf) {
    const std::vector<Algo> c = tunerCandidates(Coll::AllReduce, bytes, false, hostOf, Selection());
    return std::find(c.begin(), c.end(), Algo::Rd) != c.end();
  };
  struct Case {
    std::vector<int> hostOf;
    bool shared;
  } cases[] = {
      {{0, 0}, false},      {{0, 0, 0, 0}, false}, {{0, 1, 2, 3}, false},
      {{0, 0, 1, 1}, true}, {{0, 1, 0, 1}, true},  {{0, 1, 2, 2}, true},
  };
  for (const Case& k : cases) {
    EXPECT_EQ(portsShared(k.hostOf), k.shared) << ::testing::PrintToString(k.hostOf);
    EXPECT_TRUE(offersRd(kRdMaxBytes, k.hostOf)) << ::testing::PrintToString(k.hostOf);
    EXPECT_EQ(offersRd(big, k.hostOf), !k.shared) << ::testing::PrintToString(k.hostOf);
  }
  // LOOM_ALGO naming rd offers it at any size.
  Result<Selection> sel = parseSelection("allreduce:rd,ring", "LOOM_ALGO", algoNames());
  ASSERT_TRUE(sel.isOk());
  const std::vector<Algo> c =
      tunerCandidates(Coll::AllReduce, big, false, {0, 0, 1, 1}, sel.value());
  EXPECT_NE(std::find(c.begin(), c.end(), Algo::Rd), c.end());
}

// Recursive doubling on 2 ranks sends piece p + 1 only after piece p came back, so each of
// its pieces pays a latency in turn: its price is proportional to its size, and from where the
// ring's two latencies stop mattering the ring (half the reduction) is cheaper. Pieces merged
// to bound the simulation's work would drop those latencies (it priced rd 3% under the ring at
// 32 MiB, where it ran 35% slower).
TEST(CostModelTest, RecursiveDoublingPaysALatencyAPiece) {
  const CostModel model = defaultCostModel();
  const LinkMap links = hostsMap(2, 1, Link::Shm, Link::Tcp);
  auto us = [&](Algo a, size_t bytes) {
    return estimateUs(a, Coll::AllReduce, 2, bytes / 4, 4, model, links);
  };
  const size_t mib = size_t{1} << 20;
  for (size_t bytes : {8 * mib, 32 * mib, 128 * mib, 256 * mib}) {
    EXPECT_NEAR(us(Algo::Rd, bytes) / us(Algo::Rd, 2 * mib), static_cast<double>(bytes / (2 * mib)),
                1e-6 * static_cast<double>(bytes / mib))
        << bytes;
    EXPECT_LT(us(Algo::Ring, bytes), us(Algo::Rd, bytes)) << bytes;
  }
}

TEST(CostModelTest, RingOrRhdBestForLargeMessages) {
  const CostModel model = defaultCostModel();
  for (int n : {4, 8}) {
    const LinkMap links = hostsMap(n, n, Link::Shm, Link::Tcp);  // one host
    const size_t count = size_t{16} << 20;                       // 64 MiB of floats
    const double tree = estimateUs(Algo::Tree, Coll::AllReduce, n, count, 4, model, links);
    const double ring = estimateUs(Algo::Ring, Coll::AllReduce, n, count, 4, model, links);
    const double rhd = estimateUs(Algo::Rhd, Coll::AllReduce, n, count, 4, model, links);
    EXPECT_LT(std::min(ring, rhd), tree) << n << " ranks";
  }
}

TEST(CostModelTest, HierBeatsRingAcrossHostsForLargeMessages) {
  const CostModel model = defaultCostModel();
  const LinkMap links = hostsMap(16, 4, Link::Shm, Link::Tcp);
  const size_t count = size_t{4} << 20;
  EXPECT_LT(estimateUs(Algo::Hier, Coll::AllReduce, 16, count, 4, model, links),
            estimateUs(Algo::Tree, Coll::AllReduce, 16, count, 4, model, links));
}

TEST(CostModelTest, PredictsAHandComputedExchange) {
  // Two ranks each send 400 bytes then receive: alpha + 400 beta on the sender,
  // plus the reduction of 400 bytes after the receive.
  CostModel model = defaultCostModel();
  model.links[static_cast<int>(Link::Tcp)] = {10, 0.01};
  model.reduce_us_per_byte = 0.001;
  LinkMap links;
  links.hostOf = {0, 1};
  std::vector<Schedule> s;
  for (int r = 0; r < 2; ++r) {
    s.push_back(emptySchedule(Coll::AllReduce, "test", r, 2, -1, 100));
    s[r].channels[0] = {makeStep(StepOp::Send, -1, 1 - r, {Buf::Send, 0}, {}, 100, kPre),
                        makeStep(StepOp::RecvReduceCopy, 1 - r, -1, {Buf::Send, 0}, {Buf::Recv, 0},
                                 100, kPre | kPost)};
  }
  EXPECT_NEAR(predictUs(s, 4, model, links), 4.0 + 10.0 + 0.4, 1e-9);
  // An unmatched receive can never finish.
  s[0].channels[0].erase(s[0].channels[0].begin());
  EXPECT_TRUE(std::isinf(predictUs(s, 4, model, links)));
}

// Per-message overhead: each end of every message is busy for it, so two messages
// in a row to one peer cost the sender 2 o and the receiver 2 o after the first arrival.
TEST(CostModelTest, PricesPerMessageOverheadAtBothEnds) {
  CostModel model = defaultCostModel();
  model.links[static_cast<int>(Link::Tcp)] = {10, 0.01, 3};
  model.reduce_us_per_byte = 0;
  LinkMap links;
  links.hostOf = {0, 1};
  std::vector<Schedule> s;
  for (int r = 0; r < 2; ++r) s.push_back(emptySchedule(Coll::AllGather, "test", r, 2, -1, 100));
  s[0].channels[0] = {makeStep(StepOp::Send, -1, 1, {Buf::Send, 0}, {}, 100),
                      makeStep(StepOp::Send, -1, 1, {Buf::Send, 0}, {}, 100)};
  s[1].channels[0] = {makeStep(StepOp::Recv, 0, -1, {}, {Buf::Recv, 0}, 100),
                      makeStep(StepOp::Recv, 0, -1, {}, {Buf::Recv, 0}, 100)};
  // Sender: (3 + 400 * 0.01) per message, the second leaves at 14 and lands at 24; the
  // receiver takes the first at 17 + 3 = 20, the second at max(20, 24) + 3 = 27.
  EXPECT_NEAR(predictUs(s, 4, model, links), 27.0, 1e-9);
  model.links[static_cast<int>(Link::Tcp)].overhead_us = 0;
  EXPECT_NEAR(predictUs(s, 4, model, links), 18.0, 1e-9);  // 8 + 10
}

// Ranks of one host share its port to the others: two ranks of host 0 that each send 400 bytes
// to their own peer on host 1 at once take the port one after the other (the second lands at
// 2 x 4 + 10 = 18), where ranks on hosts of their own land at 4 + 10 = 14; messages inside a host
// do not queue there.
TEST(CostModelTest, RanksOfAHostShareItsPort) {
  CostModel model = defaultCostModel();
  model.links[static_cast<int>(Link::Tcp)] = {10, 0.01};
  model.links[static_cast<int>(Link::Shm)] = {1, 0.001};
  model.reduce_us_per_byte = 0;
  std::vector<Schedule> s;
  for (int r = 0; r < 4; ++r) s.push_back(emptySchedule(Coll::AllGather, "test", r, 4, -1, 100));
  for (int r : {0, 1}) {
    s[static_cast<size_t>(r)].channels[0] = {
        makeStep(StepOp::Send, -1, r + 2, {Buf::Send, 0}, {}, 100)};
    s[static_cast<size_t>(r) + 2].channels[0] = {
        makeStep(StepOp::Recv, r, -1, {}, {Buf::Recv, 0}, 100)};
  }
  LinkMap links;
  links.hostOf = {0, 0, 1, 1};
  EXPECT_NEAR(predictUs(s, 4, model, links), 18.0, 1e-9);
  links.hostOf = {0, 1, 2, 3};  // every rank its own host and port
  EXPECT_NEAR(predictUs(s, 4, model, links), 14.0, 1e-9);
  links.hostOf = {0, 1, 1, 0};  // host 0 sends one message and receives the other: no queue
  EXPECT_NEAR(predictUs(s, 4, model, links), 14.0, 1e-9);
  links.hostOf = {0, 0, 0, 0};  // one host: shared memory, no port
  EXPECT_NEAR(predictUs(s, 4, model, links), 1.4, 1e-9);
}

TEST(CostModelTest, TableOverridesNamedLinksOnly) {
  CostModel m = defaultCostModel();
  const CostModel d = defaultCostModel();
  Status st = applyCostTable("# measured\n tcp 12.5 0.125 4  # shaped\n\nreduce 5\n", "t", &m);
  ASSERT_TRUE(st.isOk()) << st.message();
  EXPECT_DOUBLE_EQ(m.link(Link::Tcp).alpha_us, 12.5);
  EXPECT_DOUBLE_EQ(m.link(Link::Tcp).beta_us_per_byte, 1.0 / 125);
  EXPECT_DOUBLE_EQ(m.link(Link::Tcp).overhead_us, 4);
  EXPECT_DOUBLE_EQ(m.reduce_us_per_byte, 1.0 / 5e3);
  EXPECT_DOUBLE_EQ(m.link(Link::Shm).alpha_us, d.link(Link::Shm).alpha_us);
  EXPECT_DOUBLE_EQ(m.link(Link::Shm).overhead_us, 0);
  // Errors name the source, the line and what is wrong.
  for (const char* bad : {"tcp 1\n", "eth 1 2\n", "shm 1 0\n", "shm -1 2\n", "shm 1 2 3 4\n",
                          "nvlink 1 2 -3\n", "reduce x\n"}) {
    Status e = applyCostTable(std::string("\n") + bad, "table.txt", &m);
    EXPECT_EQ(e.code(), loomInvalidArgument) << bad;
    EXPECT_NE(e.message().find("table.txt:2:"), std::string::npos) << e.message();
  }
  EXPECT_FALSE(tunerCostModel("/nonexistent/table", 0).isOk());
  EXPECT_EQ(tunerCostModel("", 0).value().slotBytes, 64u);
}

TEST(CostModelTest, FitRecoversAlphaBeta) {
  std::mt19937 rng(7);
  std::normal_distribution<double> noise(0.0, 0.05);
  std::vector<CostSample> samples;
  for (double bytes = 8; bytes <= (1 << 24); bytes *= 2)
    samples.push_back({bytes, 12.5 + bytes * 4e-4 + noise(rng)});
  LinkCost c = fitLinkCost(samples);
  EXPECT_NEAR(c.alpha_us, 12.5, 0.1);
  EXPECT_NEAR(c.beta_us_per_byte, 4e-4, 1e-7);
  // One size: no slope, alpha is the mean.
  c = fitLinkCost({{64, 3}, {64, 5}});
  EXPECT_DOUBLE_EQ(c.alpha_us, 4);
  EXPECT_DOUBLE_EQ(c.beta_us_per_byte, 0);
  c = fitLinkCost({});
  EXPECT_EQ(c.alpha_us, 0);
}

// ---------------------------------------------------------------------------
// LOOM_ALGO / LOOM_PROTO

int bit(Algo a) { return static_cast<int>(a); }

TEST(SelectionTest, EmptyAllowsEverything) {
  Result<Selection> s = parseSelection("  ", "LOOM_ALGO", algoNames());
  ASSERT_TRUE(s.isOk());
  for (int c = 0; c < Selection::kColls; ++c) {
    EXPECT_FALSE(s.value().restricted[c]);
    EXPECT_TRUE(s.value().allows(static_cast<Coll>(c), bit(Algo::Direct)));
  }
}

TEST(SelectionTest, PlainListAppliesToEveryCollective) {
  Result<Selection> s = parseSelection("ring, TREE", "LOOM_ALGO", algoNames());
  ASSERT_TRUE(s.isOk());
  for (Coll c : {Coll::AllReduce, Coll::Broadcast, Coll::AllGather}) {
    EXPECT_TRUE(s.value().restricted[static_cast<int>(c)]);
    EXPECT_TRUE(s.value().allows(c, bit(Algo::Ring)));
    EXPECT_TRUE(s.value().allows(c, bit(Algo::Tree)));
    EXPECT_FALSE(s.value().allows(c, bit(Algo::Direct)));
    EXPECT_FALSE(s.value().allows(c, bit(Algo::Rhd)));
  }
}

TEST(SelectionTest, PerCollective) {
  Result<Selection> s =
      parseSelection("allreduce:ring,tree;AllGather:rhd", "LOOM_ALGO", algoNames());
  ASSERT_TRUE(s.isOk());
  const Selection& sel = s.value();
  EXPECT_TRUE(sel.allows(Coll::AllReduce, bit(Algo::Tree)));
  EXPECT_FALSE(sel.allows(Coll::AllReduce, bit(Algo::Direct)));
  EXPECT_TRUE(sel.allows(Coll::AllGather, bit(Algo::Rhd)));
  EXPECT_FALSE(sel.allows(Coll::AllGather, bit(Algo::Ring)));
  EXPECT_FALSE(sel.restricted[static_cast<int>(Coll::Broadcast)]);
  EXPECT_TRUE(sel.allows(Coll::Broadcast, bit(Algo::Chain)));
}

TEST(SelectionTest, ExclusionAndOverride) {
  Result<Selection> s = parseSelection("^direct;allreduce:^direct,tree", "LOOM_ALGO", algoNames());
  ASSERT_TRUE(s.isOk());
  const Selection& sel = s.value();
  EXPECT_FALSE(sel.allows(Coll::AllToAll, bit(Algo::Direct)));
  EXPECT_TRUE(sel.allows(Coll::AllToAll, bit(Algo::Ring)));
  EXPECT_FALSE(sel.allows(Coll::AllReduce, bit(Algo::Tree)));
  EXPECT_TRUE(sel.allows(Coll::AllReduce, bit(Algo::Hier)));
}

TEST(SelectionTest, InvalidTextNamesTheVariable) {
  struct Bad {
    const char* text;
    const char* why;
  };
  for (const Bad& b :
       {Bad{"allreduce:foo", "unknown name 'foo'"}, Bad{"bogus:ring", "unknown collective 'bogus'"},
        Bad{"ring,,tree", "empty name"}, Bad{"allreduce:", "empty name"}, Bad{"^", "empty name"}}) {
    Result<Selection> s = parseSelection(b.text, "LOOM_ALGO", algoNames());
    ASSERT_FALSE(s.isOk()) << b.text;
    const std::string msg = s.status().message();
    EXPECT_NE(msg.find(std::string("LOOM_ALGO=") + b.text), std::string::npos) << msg;
    EXPECT_NE(msg.find(b.why), std::string::npos) << msg;
  }
}

TEST(SelectionTest, Protocols) {
  Result<Selection> s = parseSelection("allreduce:LL;^ll", "LOOM_PROTO", protoNames());
  ASSERT_TRUE(s.isOk());
  // The later plain entry overrides the earlier per-collective one.
  EXPECT_FALSE(s.value().allows(Coll::AllReduce, 0));
  EXPECT_TRUE(s.value().allows(Coll::AllReduce, 1));
  s = parseSelection("allreduce:simple", "LOOM_PROTO", protoNames());
  ASSERT_TRUE(s.isOk());
  EXPECT_FALSE(s.value().allows(Coll::AllReduce, 0));
  EXPECT_TRUE(s.value().allows(Coll::Broadcast, 0));
  s = parseSelection("ll128", "LOOM_PROTO", protoNames());
  ASSERT_FALSE(s.isOk());
  EXPECT_NE(s.status().message().find("LOOM_PROTO=ll128"), std::string::npos);
  EXPECT_NE(s.status().message().find("known: ll, simple"), std::string::npos);
}

}  // namespace
}  // namespace loom::algo
