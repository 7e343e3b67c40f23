// loom-trace's per-sender data delays on synthetic dumps: a slow link (data from one rank
// arrives late though every rank entered on time) against a late caller (data late because
// its sender entered late), with expected values computed here from the generated times.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <sstream>

#include "analysis.h"
#include "dump.h"
#include "report.h"
#include "synthetic_dumps.h"

namespace loomtest {
namespace {

using namespace loom::tracetool;

constexpr int64_t kMs = 1000000, kUs = 1000;

// A ring of `nranks`: rank r receives from r - 1. Entries: every rank at t (+ jitter), except
// `lateRank`, which enters `lateNs` later. First data from r - 1 reaches r `linkNs[r-1]` after
// both have entered (the sender's entry or the receiver's, whichever is later). The receiver's
// longest wait is on its sender, for that first-data time.
struct Ring {
  int nranks = 3, nops = 12;
  int lateRank = -1;
  int64_t lateNs = 0;
  std::vector<int64_t> linkNs;                     // per sender
  int64_t clockErrorNs = 0;                        // written into every dump but rank 0's
  std::vector<std::vector<int64_t>> enter, first;  // [op][rank], rank 0's clock
};

std::vector<SynthRank> build(Ring& g, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int64_t> jitter(0, 40 * kUs);
  std::vector<SynthRank> ranks(static_cast<size_t>(g.nranks));
  for (int q = 0; q < g.nranks; ++q) {
    SynthRank& r = ranks[static_cast<size_t>(q)];
    r.rank = q;
    r.nranks = g.nranks;
    r.clockOffsetNs = q == 0 ? 0 : q * 777 * kMs + 13;  // far from rank 0's clock
    r.clockErrorNs = q == 0 ? 0 : g.clockErrorNs;
  }
  g.enter.clear();
  g.first.clear();
  for (int i = 0; i < g.nops; ++i) {
    const int64_t t = (i + 1) * 200 * kMs;
    std::vector<int64_t> e(static_cast<size_t>(g.nranks)), f(static_cast<size_t>(g.nranks));
    for (int q = 0; q < g.nranks; ++q)
      e[static_cast<size_t>(q)] = t + jitter(rng) + (q == g.lateRank ? g.lateNs : 0);
    for (int q = 0; q < g.nranks; ++q) {
      const int from = (q + g.nranks - 1) % g.nranks;
      f[static_cast<size_t>(q)] =
          std::max(e[static_cast<size_t>(q)], e[static_cast<size_t>(from)]) +
          g.linkNs[static_cast<size_t>(from)];
      SynthOp o;
      o.seq = static_cast<uint64_t>(i + 1);
      o.enterNs = e[static_cast<size_t>(q)];
      o.endNs = f[static_cast<size_t>(q)] + 5 * kMs;
      o.firstArrivals = {{from, f[static_cast<size_t>(q)]}};
      o.waitPeer = from;
      o.maxWaitNs = f[static_cast<size_t>(q)] - e[static_cast<size_t>(q)];
      ranks[static_cast<size_t>(q)].ops.push_back(o);
    }
    g.enter.push_back(e);
    g.first.push_back(f);
  }
  return ranks;
}

Analysis analyzeRanks(const std::vector<SynthRank>& ranks) {
  TempDir dir;
  for (const SynthRank& r : ranks) dir.write(r);
  LoadResult res = loadDumps({dir.path()});
  EXPECT_EQ(res.comms.size(), 1u);
  return analyze(res.comms.at(0));
}

TEST(TracePeers, ASlowLinkIsNamedByItsSendersFirstData) {
  Ring g;
  g.linkNs = {100 * kUs, 150 * kUs, 20 * kMs};  // data from rank 2 is 20 ms slow
  const std::vector<SynthRank> ranks = build(g, 3);
  const Analysis a = analyzeRanks(ranks);
  // Expected per sender: first arrival at its receiver (the ring successor) minus the
  // receiver's entry, less the sender's lateness where positive (the clock uncertainty is 0).
  // The longest wait is the whole time from the receiver's entry.
  for (int p = 0; p < g.nranks; ++p) {
    const size_t from = static_cast<size_t>(p), to = static_cast<size_t>((p + 1) % g.nranks);
    double sum = 0, waited = 0;
    int64_t max = 0;
    for (size_t i = 0; i < g.enter.size(); ++i) {
      const int64_t local = g.first[i][to] - g.enter[i][to];
      const int64_t late = g.enter[i][from] - g.enter[i][to];
      const int64_t d = local - (late > 0 ? late : 0);
      sum += static_cast<double>(d);
      waited += static_cast<double>(local);
      max = std::max(max, d);
    }
    const PeerStats& s = a.peers[static_cast<size_t>(p)];
    SCOPED_TRACE("sender " + std::to_string(p));
    EXPECT_EQ(s.arrivals, static_cast<uint64_t>(g.nops));
    EXPECT_NEAR(s.meanDataNs, sum / g.nops, 1e-3);
    EXPECT_EQ(s.maxDataNs, max);
    EXPECT_EQ(s.longestWaits, static_cast<uint64_t>(g.nops));
    EXPECT_NEAR(s.waitedOnNs, waited, 1e-3);
  }
  ASSERT_FALSE(a.sendersByDataDelay().empty());
  EXPECT_EQ(a.sendersByDataDelay().front().rank, 2);
  EXPECT_EQ(a.slowestLink.from, 2);
  EXPECT_EQ(a.slowestLink.to, 0);
  EXPECT_EQ(a.slowestLink.ops, static_cast<uint64_t>(g.nops));
  EXPECT_GE(a.slowestLink.meanDataNs, 20 * kMs);
  EXPECT_LE(a.slowestLink.meanDataNs, 20 * kMs + 40 * kUs);
  // The callers were on time: entry skew is jitter only, and the link is no one's lateness.
  for (const RankStats& s : a.ranks) EXPECT_LE(s.maxLateNs, 40 * kUs);

  std::vector<CommReport> reports{{nullptr, a}};
  CommTrace comm;
  comm.hash = "ab";
  comm.nranks = g.nranks;
  reports[0].comm = &comm;
  std::ostringstream text;
  writeText(text, reports);
  EXPECT_NE(text.str().find("slowest data: rank 2 -> rank 0, first data 20"), std::string::npos)
      << text.str();
  EXPECT_NE(htmlReport(reports).find("id=\"senders\""), std::string::npos);
}

// Data from a late sender is late because of its caller: its lateness (above the clock
// uncertainty) is taken off, so the link is not blamed.
TEST(TracePeers, ALateSendersLatenessIsNotChargedToItsLink) {
  Ring g;
  g.lateRank = 1;
  g.lateNs = 30 * kMs;
  g.linkNs = {100 * kUs, 100 * kUs, 100 * kUs};
  const Analysis a = analyzeRanks(build(g, 5));
  // Rank 2 received rank 1's first data 30.1 ms after its own entry; 100 us of it was the link.
  EXPECT_NEAR(a.peers[1].meanDataNs, 100 * kUs, 40 * kUs);
  EXPECT_LE(a.peers[1].maxDataNs, 100 * kUs + 40 * kUs);
  EXPECT_EQ(a.stragglersByImpact().front().rank, 1);
  EXPECT_GE(a.ranks[1].maxLateNs, 30 * kMs - 40 * kUs);
}

// Where the sender's lateness is within the clock uncertainty it cannot be told from clock
// error, so nothing is taken off: the receiver's own clock alone measures the delay.
TEST(TracePeers, LatenessWithinTheClockUncertaintyIsNotTakenOff) {
  Ring g;
  g.lateRank = 1;
  g.lateNs = 30 * kMs;
  g.linkNs = {100 * kUs, 100 * kUs, 100 * kUs};
  g.clockErrorNs = 20 * kMs;  // uncertainty 40 ms
  std::vector<SynthRank> ranks = build(g, 7);
  const Analysis a = analyzeRanks(ranks);
  double sum = 0;
  for (int i = 0; i < g.nops; ++i)
    sum += static_cast<double>(g.first[static_cast<size_t>(i)][2] -
                               g.enter[static_cast<size_t>(i)][2]);
  EXPECT_NEAR(a.peers[1].meanDataNs, sum / g.nops, 1e-3);
  EXPECT_GE(a.peers[1].meanDataNs, 30 * kMs);
}

// Dumps without first arrivals (older ones) leave the section out and name no link.
TEST(TracePeers, NoFirstArrivalsNoSection) {
  Ring g;
  g.linkNs = {kMs, kMs, kMs};
  std::vector<SynthRank> ranks = build(g, 9);
  for (SynthRank& r : ranks)
    for (SynthOp& o : r.ops) {
      o.firstArrivals.clear();
      o.waitPeer = -1;
      o.maxWaitNs = 0;
    }
  const Analysis a = analyzeRanks(ranks);
  EXPECT_TRUE(a.sendersByDataDelay().empty());
  EXPECT_EQ(a.slowestLink.from, -1);
  EXPECT_EQ(slowestLinkLine(a), "");
  for (const PeerStats& p : a.peers) EXPECT_EQ(p.longestWaits, 0u);
}

}  // namespace
}  // namespace loomtest
