// The verifier proves every builder's schedules correct over a sweep of rank
// counts, counts, roots, slot sizes and FIFO depths, and fails, with a useful
// message, on hand-made and mutated schedules that are wrong.
#include "algorithms/verifier.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "algorithms/schedule.h"

namespace loom::algo {
namespace {

::testing::AssertionResult Contains(const std::string& text, const std::string& part) {
  if (text.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "\"" << part << "\" not in: " << text;
}

std::vector<Schedule> buildAll(Coll coll, int n, int root, size_t count, bool inPlace) {
  std::vector<Schedule> s;
  for (int r = 0; r < n; ++r) s.push_back(build(coll, r, n, root, count, inPlace));
  return s;
}

VerifyOptions opts(size_t slotBytes = 16, size_t fifoDepth = 1, bool inPlace = false) {
  VerifyOptions o;
  o.slotBytes = slotBytes;
  o.fifoDepth = fifoDepth;
  o.inPlace = inPlace;
  return o;
}

bool rooted(Coll c) { return c == Coll::Broadcast || c == Coll::Reduce; }

// Collectives whose traffic grows with n * n * count.
bool quadratic(Coll c) {
  return c == Coll::AllGather || c == Coll::ReduceScatter || c == Coll::AllToAll;
}

// Counts {0, 1, 7, 2n+1, 1023}, thinned where the simulation grows as
// n * n * count: 1023 up to 8 ranks and at 16; 2n+1 at chosen rank counts up
// to 64; beyond 64 ranks only 1 and 7 (2n+1 too for the linear ones).
std::vector<size_t> countsFor(Coll coll, int n) {
  const size_t wide = 2 * static_cast<size_t>(n) + 1;
  if (n > 64) return quadratic(coll) ? std::vector<size_t>{1, 7} : std::vector<size_t>{1, 7, wide};
  std::vector<size_t> counts = {0, 1, 7};
  const bool widePoint =
      n <= 16 || n == 17 || n == 24 || n == 31 || n == 32 || n == 48 || n == 63 || n == 64;
  if (!quadratic(coll) || widePoint) counts.push_back(wide);
  if (!quadratic(coll) || n <= 8 || n == 16) counts.push_back(1023);
  return counts;
}

std::vector<int> rootsFor(Coll coll, int n) {
  if (!rooted(coll)) return {-1};
  std::vector<int> roots = {0, n - 1, n / 2};
  std::sort(roots.begin(), roots.end());
  roots.erase(std::unique(roots.begin(), roots.end()), roots.end());
  return roots;
}

// The rings need two slots per pair: every rank's first step is a plain
// send, which fills the one slot to its successor, and a receive-and-send
// step must take a slot from its predecessor and fill one to its successor at
// once, so with one slot the full ring can never move. Two-rank all-gather
// and reduce-scatter have no such step (RingDeadlocksWithOneSlot).
bool ring(Coll c) {
  return c == Coll::AllReduce || c == Coll::AllGather || c == Coll::ReduceScatter;
}
size_t minFifoDepth(Coll c, int n) {
  return ring(c) && (n > 2 || (n == 2 && c == Coll::AllReduce)) ? 2 : 1;
}

std::vector<int> rankCounts() {
  std::vector<int> ns;
  for (int n = 1; n <= 64; ++n) ns.push_back(n);
  ns.push_back(128);
  ns.push_back(256);
  return ns;
}

// ---------------------------------------------------------------------------
// Every builder over the sweep.

class BuilderSweep : public ::testing::TestWithParam<std::tuple<Coll, int, bool>> {};

TEST_P(BuilderSweep, Verifies) {
  const auto [coll, n, inPlace] = GetParam();
  for (size_t count : countsFor(coll, n)) {
    for (int root : rootsFor(coll, n)) {
      const std::vector<Schedule> s = buildAll(coll, n, root, count, inPlace);
      for (size_t slot : {size_t{16}, size_t{4096}}) {
        // Large slots make single-piece steps, where the FIFO depth matters
        // least: past 16 ranks they run with the shallowest FIFO only.
        for (size_t depth : {minFifoDepth(coll, n), size_t{4}}) {
          if (slot == 4096 && depth == 4 && n > 16) continue;
          VerifyResult r = verify(s, opts(slot, depth, inPlace));
          ASSERT_TRUE(r.ok) << collName(coll) << " nranks=" << n << " root=" << root
                            << " count=" << count << " slotBytes=" << slot << " fifoDepth=" << depth
                            << " inPlace=" << inPlace << ": " << r.error;
          if (count > 0 && n > 1) {
            EXPECT_GT(r.messages, 0u);
          }
        }
      }
    }
  }
}

std::string sweepName(const ::testing::TestParamInfo<BuilderSweep::ParamType>& info) {
  const auto [coll, n, inPlace] = info.param;
  return std::string(collName(coll)) + "_n" + std::to_string(n) + (inPlace ? "_inplace" : "");
}

INSTANTIATE_TEST_SUITE_P(InPlaceDefined, BuilderSweep,
                         ::testing::Combine(::testing::Values(Coll::AllReduce, Coll::Broadcast,
                                                              Coll::Reduce, Coll::AllGather,
                                                              Coll::ReduceScatter),
                                            ::testing::ValuesIn(rankCounts()), ::testing::Bool()),
                         sweepName);
INSTANTIATE_TEST_SUITE_P(OutOfPlaceOnly, BuilderSweep,
                         ::testing::Combine(::testing::Values(Coll::AllToAll),
                                            ::testing::ValuesIn(rankCounts()),
                                            ::testing::Values(false)),
                         sweepName);

// ---------------------------------------------------------------------------
// The tree, recursive halving-doubling and hierarchical builders, over the
// same rank counts, in and out of place, and over host layouts.

// Host layouts for n ranks: one host; 2, 4 and 16 equal hosts (as equal as n
// allows); two unequal ones (a small first host, and ranks dealt round-robin
// onto 3 hosts with the last host getting one extra rank block).
std::vector<std::pair<std::string, std::vector<int>>> layoutsFor(int n) {
  std::vector<std::pair<std::string, std::vector<int>>> out;
  auto make = [n](const std::function<int(int)>& f) {
    std::vector<int> h(static_cast<size_t>(n));
    for (int r = 0; r < n; ++r) h[static_cast<size_t>(r)] = f(r);
    return h;
  };
  out.emplace_back("1host", make([](int) { return 0; }));
  for (int hosts : {2, 4, 16})
    if (n >= hosts)
      out.emplace_back(std::to_string(hosts) + "hosts", make([=](int r) { return r * hosts / n; }));
  if (n >= 3) {
    out.emplace_back("unequal_small_first", make([n](int r) { return r < n / 4 + 1 ? 7 : 3; }));
    out.emplace_back("unequal_interleaved",
                     make([n](int r) { return r % 3 == 2 && r > n / 2 ? 9 : r % 3; }));
  }
  return out;
}

std::vector<size_t> layoutCountsFor(int n, bool quadratic) {
  const size_t wide = 2 * static_cast<size_t>(n) + 1;
  if (n > 64) return quadratic ? std::vector<size_t>{1, 7} : std::vector<size_t>{0, 1, 7, wide};
  std::vector<size_t> counts = {0, 1, 7, static_cast<size_t>(n > 2 ? n - 1 : 1), wide};
  if (n <= 16) counts.push_back(1023);
  return counts;
}

enum class Builder {
  Tree,
  TreeHosts,
  RhdAllReduce,
  RhdAllGather,
  Hier,
  RdAllReduce,
  RhdReduceScatter,
  HierRd
};

const char* builderName(Builder b) {
  switch (b) {
    case Builder::Tree:
      return "tree";
    case Builder::TreeHosts:
      return "tree_hosts";
    case Builder::RhdAllReduce:
      return "rhd_allreduce";
    case Builder::RhdAllGather:
      return "rhd_allgather";
    case Builder::Hier:
      return "hier";
    case Builder::RdAllReduce:
      return "rd_allreduce";
    case Builder::RhdReduceScatter:
      return "rhd_reducescatter";
    case Builder::HierRd:
      return "hierrd";
  }
  return "?";
}

// The hierarchical all-reduce runs a ring across hosts, which needs two slots
// per pair (see verifier_test.cc); the others move with one.
size_t minDepth(Builder b) { return b == Builder::Hier ? 2 : 1; }

Schedule buildOne(Builder b, int r, int n, size_t count, const std::vector<int>& hosts) {
  switch (b) {
    case Builder::Tree:
      return buildTreeAllReduce(r, n, count);
    case Builder::TreeHosts:
      return buildTreeAllReduce(r, n, count, hosts);
    case Builder::RhdAllReduce:
      return buildRhdAllReduce(r, n, count);
    case Builder::RhdAllGather:
      return buildRhdAllGather(r, n, count);
    case Builder::Hier:
      return buildHierAllReduce(r, n, count, hosts);
    case Builder::RdAllReduce:
      return buildRdAllReduce(r, n, count);
    case Builder::RhdReduceScatter:
      return buildRhdReduceScatter(r, n, count);
    case Builder::HierRd:
      return buildHierAllReduce(r, n, count, hosts, true);
  }
  return Schedule{};
}

class NewBuilderSweep : public ::testing::TestWithParam<std::tuple<Builder, int, bool>> {};

TEST_P(NewBuilderSweep, Verifies) {
  const auto [b, n, inPlace] = GetParam();
  const bool usesHosts = b == Builder::TreeHosts || b == Builder::Hier || b == Builder::HierRd;
  auto layouts = usesHosts ? layoutsFor(n) : decltype(layoutsFor(n)){{"none", {}}};
  for (const auto& [lname, hosts] : layouts) {
    for (size_t count :
         layoutCountsFor(n, b == Builder::RhdAllGather || b == Builder::RhdReduceScatter)) {
      std::vector<Schedule> s;
      for (int r = 0; r < n; ++r) s.push_back(buildOne(b, r, n, count, hosts));
      for (size_t slot : {size_t{16}, size_t{4096}}) {
        for (size_t depth : {minDepth(b), size_t{4}}) {
          if (n > 16 && depth == 4 && slot == 4096) continue;
          if (n > 64 && depth == 4) continue;
          VerifyOptions o;
          o.slotBytes = slot;
          o.fifoDepth = depth;
          o.inPlace = inPlace;
          VerifyResult r = verify(s, o);
          ASSERT_TRUE(r.ok) << builderName(b) << " nranks=" << n << " layout=" << lname
                            << " count=" << count << " slotBytes=" << slot << " fifoDepth=" << depth
                            << " inPlace=" << inPlace << ": " << r.error;
          if (count > 0 && n > 1 && lname != "1host") {
            EXPECT_GT(r.messages, 0u);
          }
        }
      }
    }
  }
}

std::string newSweepName(const ::testing::TestParamInfo<NewBuilderSweep::ParamType>& info) {
  const auto [b, n, inPlace] = info.param;
  return std::string(builderName(b)) + "_n" + std::to_string(n) + (inPlace ? "_inplace" : "");
}

INSTANTIATE_TEST_SUITE_P(
    All, NewBuilderSweep,
    ::testing::Combine(::testing::Values(Builder::Tree, Builder::TreeHosts, Builder::RhdAllReduce,
                                         Builder::RhdAllGather, Builder::Hier, Builder::RdAllReduce,
                                         Builder::RhdReduceScatter, Builder::HierRd),
                       ::testing::ValuesIn(rankCounts()), ::testing::Bool()),
    newSweepName);

// Rings in a searched order: the ranks renumbered around the ring, the results where
// the collective defines them, for a random permutation and for host-major order of
// ranks dealt round-robin onto 4 hosts.
class RingOrderSweep : public ::testing::TestWithParam<std::tuple<Coll, int, bool>> {};

TEST_P(RingOrderSweep, Verifies) {
  const auto [coll, n, inPlace] = GetParam();
  std::vector<int> shuffled(static_cast<size_t>(n)), dealt(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r)
    shuffled[static_cast<size_t>(r)] = r, dealt[static_cast<size_t>(r)] = r % 4;
  std::mt19937 rng(static_cast<unsigned>(n));
  std::shuffle(shuffled.begin(), shuffled.end(), rng);
  for (const std::vector<int>& order : {shuffled, hostMajorOrder(dealt)}) {
    const std::vector<size_t> counts =
        n > 64 ? std::vector<size_t>{1, 7}
               : std::vector<size_t>{0, 1, 7, 2 * static_cast<size_t>(n) + 1};
    for (size_t count : counts) {
      std::vector<Schedule> s;
      for (int r = 0; r < n; ++r) s.push_back(buildRingInOrder(coll, r, n, count, order));
      for (size_t slot : {size_t{16}, size_t{4096}}) {
        VerifyResult r = verify(s, opts(slot, minFifoDepth(coll, n), inPlace));
        ASSERT_TRUE(r.ok) << collName(coll) << " nranks=" << n << " count=" << count
                          << " slotBytes=" << slot << " inPlace=" << inPlace << ": " << r.error;
      }
    }
  }
  // Host-major order of the dealt layout: 4 crossings between hosts, where rank order
  // crosses at every hop.
  if (n >= 8) {
    const std::vector<int> order = hostMajorOrder(dealt);
    int crossings = 0;
    for (int p = 0; p < n; ++p)
      crossings += dealt[static_cast<size_t>(order[static_cast<size_t>(p)])] !=
                   dealt[static_cast<size_t>(order[static_cast<size_t>((p + 1) % n)])];
    EXPECT_EQ(crossings, 4);
  }
}

INSTANTIATE_TEST_SUITE_P(All, RingOrderSweep,
                         ::testing::Combine(::testing::Values(Coll::AllReduce, Coll::AllGather,
                                                              Coll::ReduceScatter),
                                            ::testing::ValuesIn(rankCounts()), ::testing::Bool()),
                         sweepName);

TEST(VerifierTest, HostMajorOrderIsEmptyForRankOrder) {
  EXPECT_TRUE(hostMajorOrder({0, 0, 1, 1}).empty());
  EXPECT_TRUE(hostMajorOrder({}).empty());
  EXPECT_EQ(hostMajorOrder({5, 3, 5, 3}), (std::vector<int>{0, 2, 1, 3}));
}

// Every single change to a step of the new builders' schedules is caught.
TEST(VerifierTest, NewBuildersEveryMutationFails) {
  for (Builder b : {Builder::Tree, Builder::TreeHosts, Builder::RhdAllReduce, Builder::RhdAllGather,
                    Builder::Hier, Builder::HierRd}) {
    for (int n : {2, 3, 5, 6}) {
      std::vector<int> hosts;
      for (int r = 0; r < n; ++r) hosts.push_back(r < 2 ? 0 : 1);
      std::vector<Schedule> good;
      for (int r = 0; r < n; ++r) good.push_back(buildOne(b, r, n, 7, hosts));
      VerifyOptions o;
      o.fifoDepth = minDepth(b);
      ASSERT_TRUE(verify(good, o).ok) << builderName(b) << " n=" << n;
      for (int r = 0; r < n; ++r) {
        for (size_t i = 0; i < good[r].channels[0].size(); ++i) {
          const Step& st = good[r].channels[0][i];
          std::vector<std::pair<std::string, Step>> muts;
          Step m = st;
          m.count = st.count - 1;
          muts.emplace_back("count-1", m);
          m = st;
          m.flags ^= kPost;
          muts.emplace_back("toggle kPost", m);
          if (st.flags & kPre) {
            m = st;
            m.flags &= ~kPre;
            muts.emplace_back("drop kPre", m);
          }
          if (st.sendPeer >= 0 && n > 2) {
            m = st;
            m.sendPeer = (st.sendPeer + 1) % n == r ? (r + 1) % n : (st.sendPeer + 1) % n;
            muts.emplace_back("other sendPeer", m);
          }
          for (const auto& [what, step] : muts) {
            std::vector<Schedule> bad = good;
            bad[r].channels[0][i] = step;
            EXPECT_FALSE(verify(bad, o).ok) << builderName(b) << " n=" << n << " rank " << r
                                            << " step " << i << ": " << what << " was not caught";
          }
        }
      }
    }
  }
}

TEST(VerifierTest, RingDeadlocksWithOneSlot) {
  for (Coll coll : {Coll::AllReduce, Coll::AllGather, Coll::ReduceScatter}) {
    for (int n : {2, 3, 8}) {
      const std::vector<Schedule> s = buildAll(coll, n, -1, 64, false);
      EXPECT_TRUE(verify(s, opts(16, 2)).ok);
      VerifyResult r = verify(s, opts(16, 1));
      if (n == 2 && coll != Coll::AllReduce) {
        // Two-rank all-gather and reduce-scatter end with a plain receive.
        EXPECT_TRUE(r.ok) << collName(coll) << ": " << r.error;
        continue;
      }
      ASSERT_FALSE(r.ok) << collName(coll) << " n=" << n;
      EXPECT_TRUE(Contains(r.error, "deadlock"));
      EXPECT_TRUE(Contains(r.error, "waits for a free slot to rank 1 (1 full)"));
    }
  }
}

TEST(VerifierTest, CountsMessages) {
  // Ring all-reduce, 4 ranks, 16 elements: chunks of 4 elements fit one
  // 16-byte slot, each rank sends 2 * (n - 1) chunks.
  VerifyResult r = verify(buildAll(Coll::AllReduce, 4, -1, 16, false), opts(16, 2));
  ASSERT_TRUE(r.ok) << r.error;
  EXPECT_EQ(r.messages, 24u);
  r = verify(buildAll(Coll::AllReduce, 4, -1, 32, false), opts(16, 2));
  ASSERT_TRUE(r.ok) << r.error;
  EXPECT_EQ(r.messages, 48u);
}

// ---------------------------------------------------------------------------
// Mutations: every single change to a correct schedule must be caught.

class Mutation : public ::testing::TestWithParam<Coll> {};

TEST_P(Mutation, EverySingleMutationFails) {
  const Coll coll = GetParam();
  for (int n : {2, 3, 4}) {
    const int root = rooted(coll) ? 1 : -1;
    const std::vector<Schedule> good = buildAll(coll, n, root, 7, false);
    const VerifyOptions o = opts(16, minFifoDepth(coll, n));
    ASSERT_TRUE(verify(good, o).ok);
    size_t tried = 0;
    for (int r = 0; r < n; ++r) {
      for (size_t i = 0; i < good[r].channels[0].size(); ++i) {
        const Step& st = good[r].channels[0][i];
        if (st.count == 0) continue;
        std::vector<std::pair<std::string, Step>> muts;
        Step m = st;
        m.count = st.count - 1;
        muts.emplace_back("count-1", m);
        if (st.flags & kPre) {
          m = st;
          m.flags &= ~kPre;
          muts.emplace_back("drop kPre", m);
        }
        if (st.flags & kPost) {
          m = st;
          m.flags &= ~kPost;
          muts.emplace_back("drop kPost", m);
        } else {
          m = st;
          m.flags |= kPost;
          muts.emplace_back("add kPost", m);
        }
        if (st.sendPeer >= 0 && n > 2) {
          m = st;
          m.sendPeer = (st.sendPeer + 1) % n == r ? (r + 1) % n : (st.sendPeer + 1) % n;
          muts.emplace_back("other sendPeer", m);
        }
        if (st.recvPeer >= 0 && n > 2) {
          m = st;
          m.recvPeer = (st.recvPeer + 1) % n == r ? (r + 1) % n : (st.recvPeer + 1) % n;
          muts.emplace_back("other recvPeer", m);
        }
        for (const auto& [what, step] : muts) {
          std::vector<Schedule> bad = good;
          bad[r].channels[0][i] = step;
          VerifyResult res = verify(bad, o);
          EXPECT_FALSE(res.ok) << collName(coll) << " n=" << n << " rank " << r << " step " << i
                               << ": " << what << " was not caught";
          EXPECT_FALSE(res.error.empty());
          ++tried;
        }
      }
    }
    EXPECT_GT(tried, 0u);
  }
}

INSTANTIATE_TEST_SUITE_P(Builders, Mutation,
                         ::testing::Values(Coll::AllReduce, Coll::Broadcast, Coll::Reduce,
                                           Coll::AllGather, Coll::ReduceScatter, Coll::AllToAll),
                         [](const ::testing::TestParamInfo<Coll>& info) {
                           return std::string(collName(info.param));
                         });

// ---------------------------------------------------------------------------
// Hand-made schedules.

Schedule make(Coll coll, int rank, int n, size_t count, int root = -1) {
  Schedule s;
  s.coll = coll;
  s.algorithm = "test";
  s.rank = rank;
  s.nranks = n;
  s.root = root;
  s.count = count;
  s.channels.resize(1);
  return s;
}

Step step(StepOp op, int from, int to, BufRef src, BufRef dst, size_t count, uint8_t flags = 0) {
  Step s;
  s.op = op;
  s.recvPeer = from;
  s.sendPeer = to;
  s.src = src;
  s.dst = dst;
  s.count = count;
  s.flags = flags;
  return s;
}

const BufRef kSend0{Buf::Send, 0};
const BufRef kRecv0{Buf::Recv, 0};

// Two-rank all-reduce: each rank sends its input, then reduces the peer's.
std::vector<Schedule> twoRankAllReduce(size_t count) {
  std::vector<Schedule> s;
  for (int r = 0; r < 2; ++r) {
    s.push_back(make(Coll::AllReduce, r, 2, count));
    s[r].channels[0] = {
        step(StepOp::Send, -1, 1 - r, kSend0, kRecv0, count, kPre),
        step(StepOp::RecvReduceCopy, 1 - r, -1, kSend0, kRecv0, count, kPre | kPost)};
  }
  return s;
}

TEST(VerifierTest, HandMadeAllReduceVerifies) {
  for (size_t depth : {1, 4}) {
    VerifyResult r = verify(twoRankAllReduce(9), opts(16, depth));
    EXPECT_TRUE(r.ok) << r.error;
    EXPECT_EQ(r.messages, 6u);  // 9 elements: 3 pieces of at most 4, per rank
    r = verify(twoRankAllReduce(9), opts(16, depth, true));
    EXPECT_TRUE(r.ok) << r.error;
  }
}

TEST(VerifierTest, DeadlockBothReceiveFirst) {
  std::vector<Schedule> s = twoRankAllReduce(4);
  for (auto& sc : s) std::swap(sc.channels[0][0], sc.channels[0][1]);
  VerifyResult r = verify(s, opts());
  ASSERT_FALSE(r.ok);
  EXPECT_TRUE(Contains(r.error, "deadlock"));
  EXPECT_TRUE(Contains(r.error, "rank 0 channel 0 step 0 (recvReduceCopy from 1"));
  EXPECT_TRUE(Contains(r.error, "waits for a piece from rank 1"));
  EXPECT_TRUE(Contains(r.error, "rank 1 channel 0 step 0"));
  EXPECT_TRUE(Contains(r.error, "waits for a piece from rank 0"));
}

TEST(VerifierTest, DeadlockOnlyWithShallowFifos) {
  // Each rank sends two single-piece steps before receiving: needs two slots.
  std::vector<Schedule> s;
  for (int r = 0; r < 2; ++r) {
    const int p = 1 - r;
    s.push_back(make(Coll::AllGather, r, 2, 2));
    s[r].channels[0] = {
        step(StepOp::Copy, -1, -1, kSend0, {Buf::Recv, size_t(2 * r)}, 2),
        step(StepOp::Send, -1, p, kSend0, kRecv0, 1),
        step(StepOp::Send, -1, p, {Buf::Send, 1}, kRecv0, 1),
        step(StepOp::Recv, p, -1, kSend0, {Buf::Recv, size_t(2 * p)}, 1),
        step(StepOp::Recv, p, -1, kSend0, {Buf::Recv, size_t(2 * p + 1)}, 1),
    };
  }
  EXPECT_TRUE(verify(s, opts(16, 2)).ok);
  VerifyResult r = verify(s, opts(16, 1));
  ASSERT_FALSE(r.ok);
  EXPECT_TRUE(Contains(r.error, "deadlock"));
  EXPECT_TRUE(Contains(r.error, "step 2 (send to 1"));
  EXPECT_TRUE(Contains(r.error, "waits for a free slot to rank 1"));
}

TEST(VerifierTest, ThreeRankCycleNamesEveryRank) {
  std::vector<Schedule> s;
  for (int r = 0; r < 3; ++r) {
    s.push_back(make(Coll::Broadcast, r, 3, 1, 0));
    s[r].channels[0] = {step(StepOp::RecvCopySend, (r + 2) % 3, (r + 1) % 3, kRecv0, kRecv0, 1)};
  }
  VerifyResult r = verify(s, opts());
  ASSERT_FALSE(r.ok);
  for (int k = 0; k < 3; ++k)
    EXPECT_TRUE(Contains(r.error, "rank " + std::to_string(k) + " channel 0 step 0"));
}

TEST(VerifierTest, ContributionReducedTwice) {
  std::vector<Schedule> s = twoRankAllReduce(4);
  // Rank 0 sends its input twice; rank 1 adds the second copy to its result.
  s[0].channels[0].insert(s[0].channels[0].begin() + 1, s[0].channels[0][0]);
  s[0].channels[0][1].flags = 0;
  s[1].channels[0][1].flags = kPre;
  s[1].channels[0].push_back(step(StepOp::RecvReduceCopy, 0, -1, kRecv0, kRecv0, 4, kPost));
  VerifyResult r = verify(s, opts());
  ASSERT_FALSE(r.ok);
  EXPECT_TRUE(Contains(r.error, "rank 1 channel 0 step 2"));
  EXPECT_TRUE(Contains(r.error, "overlap"));
  EXPECT_TRUE(Contains(r.error, "reduced twice"));
}

TEST(VerifierTest, MissingContribution) {
  std::vector<Schedule> s = twoRankAllReduce(4);
  // Rank 1 keeps rank 0's input instead of reducing it with its own.
  s[1].channels[0][1] = step(StepOp::Recv, 0, -1, kSend0, kRecv0, 4, kPost);
  VerifyResult r = verify(s, opts());
  ASSERT_FALSE(r.ok);
  EXPECT_TRUE(Contains(r.error, "rank 1 recv[0]"));
  EXPECT_TRUE(Contains(r.error, "missing contributions of ranks {1}"));
}

TEST(VerifierTest, MissingPreScale) {
  std::vector<Schedule> s = twoRankAllReduce(4);
  s[0].channels[0][0].flags = 0;
  VerifyResult r = verify(s, opts());
  ASSERT_FALSE(r.ok);
  EXPECT_TRUE(Contains(r.error, "rank 1 recv[0]"));
  EXPECT_TRUE(Contains(r.error, "pre-scaled 1"));
}

TEST(VerifierTest, PreScaleOfForeignValue) {
  std::vector<Schedule> s = twoRankAllReduce(4);
  // Rank 1 forwards the reduced result with kPre: it would scale rank 0's part.
  s[1].channels[0].push_back(step(StepOp::Send, -1, 0, kRecv0, kRecv0, 4, kPre));
  s[0].channels[0].push_back(step(StepOp::Recv, 1, -1, kSend0, kRecv0, 4));
  VerifyResult r = verify(s, opts());
  ASSERT_FALSE(r.ok);
  EXPECT_TRUE(Contains(r.error, "rank 1 channel 0 step 2"));
  EXPECT_TRUE(Contains(r.error, "not this rank's own unscaled input"));
}

TEST(VerifierTest, PostOpTwice) {
  std::vector<Schedule> s = twoRankAllReduce(4);
  s[0].channels[0].push_back(step(StepOp::Copy, -1, -1, kRecv0, kRecv0, 4, kPost));
  VerifyResult r = verify(s, opts());
  ASSERT_FALSE(r.ok);
  EXPECT_TRUE(Contains(r.error, "rank 0 channel 0 step 2 (copy"));
  EXPECT_TRUE(Contains(r.error, "post-op applied twice"));
}

TEST(VerifierTest, SendToWrongPeer) {
  // Broadcast 0 -> 1 -> 2, but the root sends to rank 2.
  std::vector<Schedule> s;
  for (int r = 0; r < 3; ++r) s.push_back(make(Coll::Broadcast, r, 3, 4, 0));
  s[0].channels[0] = {step(StepOp::Copy, -1, -1, kSend0, kRecv0, 4),
                      step(StepOp::Send, -1, 2, kSend0, kRecv0, 4)};
  s[1].channels[0] = {step(StepOp::RecvCopySend, 0, 2, kRecv0, kRecv0, 4)};
  s[2].channels[0] = {step(StepOp::Recv, 1, -1, kRecv0, kRecv0, 4)};
  VerifyResult r = verify(s, opts());
  ASSERT_FALSE(r.ok);
  EXPECT_TRUE(Contains(r.error, "deadlock"));
  EXPECT_TRUE(Contains(r.error, "rank 2 channel 0 step 0 (recv from 1"));
  EXPECT_TRUE(Contains(r.error, "1 piece(s) from rank 0"));
}

TEST(VerifierTest, UnreceivedPieces) {
  std::vector<Schedule> s = twoRankAllReduce(4);
  s[0].channels[0].push_back(step(StepOp::Send, -1, 1, kRecv0, kRecv0, 4));
  VerifyResult r = verify(s, opts());
  ASSERT_FALSE(r.ok);
  EXPECT_TRUE(Contains(r.error, "sent by rank 0 to rank 1 on channel 0 are never received"));
  EXPECT_TRUE(Contains(r.error, "step 2 (send to 1"));
}

TEST(VerifierTest, SizeMismatch) {
  std::vector<Schedule> s = twoRankAllReduce(4);
  s[1].channels[0][1].count = 3;
  VerifyResult r = verify(s, opts());
  ASSERT_FALSE(r.ok);
  EXPECT_TRUE(Contains(r.error, "rank 1 channel 0 step 1"));
  EXPECT_TRUE(Contains(r.error, "expects 3 elements"));
  EXPECT_TRUE(Contains(r.error, "has 4 (size mismatch)"));
}

TEST(VerifierTest, OutputLeftUndefined) {
  // All-gather where rank 1 never places its own block.
  std::vector<Schedule> s;
  for (int r = 0; r < 2; ++r) {
    s.push_back(make(Coll::AllGather, r, 2, 3));
    s[r].channels[0] = {step(StepOp::Send, -1, 1 - r, kSend0, kRecv0, 3),
                        step(StepOp::Recv, 1 - r, -1, kSend0, {Buf::Recv, size_t(3 * (1 - r))}, 3)};
    if (r == 0) s[r].channels[0].push_back(step(StepOp::Copy, -1, -1, kSend0, kRecv0, 3));
  }
  VerifyResult r = verify(s, opts());
  ASSERT_FALSE(r.ok);
  EXPECT_TRUE(Contains(r.error, "allgather: rank 1 recv[3] is undefined"));
  EXPECT_TRUE(Contains(r.error, "should be {index 0, ranks {1}"));
  s[1].channels[0].push_back(step(StepOp::Copy, -1, -1, kSend0, {Buf::Recv, 3}, 3));
  EXPECT_TRUE(verify(s, opts()).ok);
}

TEST(VerifierTest, ReadsUndefined) {
  std::vector<Schedule> s = twoRankAllReduce(4);
  s[0].channels[0][0].src = kRecv0;
  s[0].channels[0][0].flags = 0;
  VerifyResult r = verify(s, opts());
  ASSERT_FALSE(r.ok);
  EXPECT_TRUE(Contains(r.error, "rank 0 channel 0 step 0 (send to 1, 4 elements) piece 0"));
  EXPECT_TRUE(Contains(r.error, "reads src recv[0], which is undefined"));
}

TEST(VerifierTest, BroadcastNonRootInputIsUndefined) {
  std::vector<Schedule> s;
  for (int r = 0; r < 2; ++r) s.push_back(make(Coll::Broadcast, r, 2, 2, 0));
  s[0].channels[0] = {step(StepOp::Copy, -1, -1, kSend0, kRecv0, 2),
                      step(StepOp::Send, -1, 1, kSend0, kRecv0, 2)};
  s[1].channels[0] = {step(StepOp::Recv, 0, -1, kSend0, kRecv0, 2)};
  ASSERT_TRUE(verify(s, opts()).ok);
  s[1].channels[0].push_back(step(StepOp::Copy, -1, -1, kSend0, kRecv0, 2));
  VerifyResult r = verify(s, opts());
  ASSERT_FALSE(r.ok);
  EXPECT_TRUE(Contains(r.error, "reads src send[0], which is undefined"));
}

TEST(VerifierTest, WritesSendBuffer) {
  std::vector<Schedule> s = twoRankAllReduce(4);
  s[1].channels[0][1].dst = kSend0;
  VerifyResult r = verify(s, opts());
  ASSERT_FALSE(r.ok);
  EXPECT_TRUE(Contains(r.error, "writes the send buffer"));
}

TEST(VerifierTest, OutOfRange) {
  std::vector<Schedule> s = twoRankAllReduce(4);
  s[1].channels[0][1].dst.offset = 1;
  VerifyResult r = verify(s, opts());
  ASSERT_FALSE(r.ok);
  EXPECT_TRUE(Contains(r.error, "dst recv[1, 5) is outside the recv buffer (4 elements)"));
}

TEST(VerifierTest, ReduceNonRootHasNoRecvBuffer) {
  std::vector<Schedule> s;
  for (int r = 0; r < 2; ++r) s.push_back(make(Coll::Reduce, r, 2, 2, 0));
  s[0].channels[0] = {step(StepOp::RecvReduceCopy, 1, -1, kSend0, kRecv0, 2, kPre | kPost)};
  s[1].channels[0] = {step(StepOp::Copy, -1, -1, kSend0, kRecv0, 2, kPre),
                      step(StepOp::Send, -1, 0, kRecv0, kRecv0, 2)};
  VerifyResult r = verify(s, opts());
  ASSERT_FALSE(r.ok);
  EXPECT_TRUE(Contains(r.error, "a non-root rank of reduce has no receive buffer"));
}

TEST(VerifierTest, BadPeers) {
  std::vector<Schedule> s = twoRankAllReduce(4);
  s[0].channels[0][0].sendPeer = 0;
  EXPECT_TRUE(Contains(verify(s, opts()).error, "sendPeer 0 is the rank itself"));
  s[0].channels[0][0].sendPeer = 2;
  EXPECT_TRUE(Contains(verify(s, opts()).error, "sendPeer 2 is not a rank"));
  s[0].channels[0][0].sendPeer = 1;
  s[0].channels[0][0].recvPeer = 1;
  EXPECT_TRUE(Contains(verify(s, opts()).error, "does not receive"));
}

TEST(VerifierTest, InconsistentSchedules) {
  std::vector<Schedule> s = twoRankAllReduce(4);
  s[1].count = 5;
  EXPECT_TRUE(Contains(verify(s, opts()).error, "schedule 1 has count 5"));
  s = twoRankAllReduce(4);
  s[1].rank = 0;
  EXPECT_TRUE(Contains(verify(s, opts()).error, "schedule 1 has rank 0"));
  s = twoRankAllReduce(4);
  s[0].nranks = 3;
  EXPECT_TRUE(Contains(verify(s, opts()).error, "nranks 3"));
  EXPECT_FALSE(verify({}, opts()).ok);
  EXPECT_FALSE(verify(twoRankAllReduce(4), opts(16, 0)).ok);
  EXPECT_TRUE(Contains(verify(buildAll(Coll::AllToAll, 2, -1, 1, false), opts(16, 1, true)).error,
                       "no in-place form"));
}

TEST(VerifierTest, ChannelsRace) {
  // Two channels both write recv[0..4) on rank 1.
  std::vector<Schedule> s = twoRankAllReduce(4);
  for (auto& sc : s) sc.channels.push_back(sc.channels[0]);
  VerifyResult r = verify(s, opts());
  ASSERT_FALSE(r.ok);
  EXPECT_TRUE(Contains(r.error, "channels race"));
}

TEST(VerifierTest, ChannelsSplitTheBuffer) {
  // The two-rank all-reduce run as two channels of half the buffer each.
  std::vector<Schedule> s = twoRankAllReduce(4);
  for (auto& sc : s) {
    sc.count = 8;
    sc.channels.push_back(sc.channels[0]);
    for (Step& st : sc.channels[1]) st.src.offset = st.dst.offset = 4;
  }
  VerifyResult r = verify(s, opts());
  EXPECT_TRUE(r.ok) << r.error;
  EXPECT_EQ(r.messages, 4u);
}

}  // namespace
}  // namespace loom::algo
