// loom-trace's analysis on synthetic dumps: lateness statistics against values
// computed here from the generated entry times, clock offsets and arrival
// lists, ring eviction, and the hang findings (missing, mismatch, stuck).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <tuple>

#include "analysis.h"
#include "dump.h"
#include "synthetic_dumps.h"

namespace loomtest {
namespace {

using namespace loom::tracetool;

constexpr int64_t kMs = 1000000;

// Every rank's entry times per operation (rank 0's clock), with rank `late`
// entering `lateNs` after the others on every `every`-th operation.
std::vector<std::vector<int64_t>> makeEntries(int nranks, int nops, int late, int every,
                                              int64_t lateNs, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int64_t> jitter(0, 50000);
  std::vector<std::vector<int64_t>> enter(static_cast<size_t>(nops));
  int64_t t = 5 * kMs;
  for (int i = 0; i < nops; ++i) {
    for (int q = 0; q < nranks; ++q) {
      int64_t e = t + jitter(rng);
      if (q == late && i % every == every - 1) e += lateNs;
      enter[static_cast<size_t>(i)].push_back(e);
    }
    t = *std::max_element(enter[static_cast<size_t>(i)].begin(),
                          enter[static_cast<size_t>(i)].end()) +
        kMs;
  }
  return enter;
}

std::vector<SynthRank> ranksFor(const std::vector<std::vector<int64_t>>& enter, int nranks) {
  std::vector<SynthRank> ranks(static_cast<size_t>(nranks));
  for (int q = 0; q < nranks; ++q) {
    SynthRank& r = ranks[static_cast<size_t>(q)];
    r.rank = q;
    r.nranks = nranks;
    r.clockOffsetNs = q * 1000 * kMs - 77;  // each rank's clock is far from rank 0's
    for (size_t i = 0; i < enter.size(); ++i) {
      SynthOp o;
      o.seq = i + 1;
      o.enterNs = enter[i][static_cast<size_t>(q)];
      o.endNs = *std::max_element(enter[i].begin(), enter[i].end()) + 100000;
      r.ops.push_back(o);
    }
  }
  return ranks;
}

CommTrace loadOne(const TempDir& dir) {
  LoadResult res = loadDumps({dir.path()});
  EXPECT_EQ(res.comms.size(), 1u);
  return res.comms.at(0);
}

// Writes the ranks' dumps into a fresh folder and analyses them as loom-trace does.
Analysis analyzeRanks(const std::vector<SynthRank>& ranks) {
  TempDir dir;
  for (const SynthRank& r : ranks) dir.write(r);
  return analyze(loadOne(dir));
}

// The expected per-rank statistics, straight from the definitions.
struct Expected {
  std::vector<double> mean, waitCaused;
  std::vector<int64_t> max, p99;
  std::vector<uint64_t> timesLast;
};

Expected expectedFrom(const std::vector<std::vector<int64_t>>& enter, int nranks) {
  Expected x;
  x.mean.assign(nranks, 0);
  x.waitCaused.assign(nranks, 0);
  x.max.assign(nranks, 0);
  x.timesLast.assign(nranks, 0);
  std::vector<std::vector<int64_t>> late(static_cast<size_t>(nranks));
  for (const auto& e : enter) {
    const int64_t first = *std::min_element(e.begin(), e.end());
    const size_t last = static_cast<size_t>(std::max_element(e.begin(), e.end()) - e.begin());
    ++x.timesLast[last];
    for (size_t q = 0; q < e.size(); ++q) {
      late[q].push_back(e[q] - first);
      x.waitCaused[last] += static_cast<double>(e[last] - e[q]);
    }
  }
  for (size_t q = 0; q < late.size(); ++q) {
    std::vector<int64_t> v = late[q];
    std::sort(v.begin(), v.end());
    double sum = 0;
    for (int64_t l : v) sum += static_cast<double>(l);
    x.mean[q] = sum / static_cast<double>(v.size());
    x.max[q] = v.back();
    // Nearest rank: the smallest value with at least 99% of the values at or below it.
    size_t k = 0;
    while (static_cast<double>(k + 1) < 0.99 * static_cast<double>(v.size())) ++k;
    x.p99.push_back(v[k]);
  }
  return x;
}

TEST(TraceAnalysis, LatenessStatisticsMatchTheGeneratedEntries) {
  const int nranks = 4, nops = 60;
  const auto enter = makeEntries(nranks, nops, 2, 5, 20 * kMs, 11);
  TempDir dir;
  for (const SynthRank& r : ranksFor(enter, nranks)) dir.write(r);
  CommTrace comm = loadOne(dir);
  Analysis a = analyze(comm);
  const Expected x = expectedFrom(enter, nranks);
  ASSERT_EQ(a.ops.size(), static_cast<size_t>(nops));
  EXPECT_EQ(a.timedOps, static_cast<uint64_t>(nops));
  for (int q = 0; q < nranks; ++q) {
    const RankStats& s = a.ranks[static_cast<size_t>(q)];
    SCOPED_TRACE("rank " + std::to_string(q));
    EXPECT_EQ(s.ops, static_cast<uint64_t>(nops));
    EXPECT_EQ(s.timesLast, x.timesLast[static_cast<size_t>(q)]);
    EXPECT_NEAR(s.meanLateNs, x.mean[static_cast<size_t>(q)], 1e-3);
    EXPECT_EQ(s.maxLateNs, x.max[static_cast<size_t>(q)]);
    EXPECT_EQ(s.p99LateNs, x.p99[static_cast<size_t>(q)]);
    EXPECT_NEAR(s.waitCausedNs, x.waitCaused[static_cast<size_t>(q)], 1e-3);
  }
  EXPECT_EQ(a.stragglersByImpact().front().rank, 2);
  EXPECT_GE(a.ranks[2].maxLateNs, 20 * kMs);
  // One kind of operation; its skew is the spread of each operation's entries.
  ASSERT_EQ(a.skew.size(), 1u);
  int64_t maxSkew = 0;
  for (const auto& e : enter)
    maxSkew = std::max(
        maxSkew, *std::max_element(e.begin(), e.end()) - *std::min_element(e.begin(), e.end()));
  EXPECT_EQ(a.skew[0].maxNs, maxSkew);
  EXPECT_EQ(a.skew[0].ops, static_cast<uint64_t>(nops));
  EXPECT_EQ(a.skew[0].label(), "allreduce 1024 x fp32 (4 KiB)");
  EXPECT_EQ(a.verdict(), kExitConsistent);
}

TEST(TraceAnalysis, DumpsWithoutClockFieldsUseTheirOwnEntryTimes) {
  const auto enter = makeEntries(3, 20, 1, 4, 3 * kMs, 5);
  TempDir dir;
  for (SynthRank r : ranksFor(enter, 3)) {
    r.clockOffsetNs = 0;
    r.writeClockFields = false;
    dir.write(r);
  }
  Analysis a = analyze(loadOne(dir));
  const Expected x = expectedFrom(enter, 3);
  EXPECT_EQ(a.ranks[1].maxLateNs, x.max[1]);
  EXPECT_EQ(a.ranks[1].timesLast, x.timesLast[1]);
  EXPECT_EQ(a.clockUncertaintyNs, 0);
}

// The ranks' own entry times are deliberately wrong here; the `arrivals`
// lists hold the truth: rank 1's knows every rank, rank 2's only itself (as
// [rank, time] pairs, the form the library writes), rank 0 has none.
TEST(TraceAnalysis, ArrivalListsWinOverOwnEntryTimes) {
  const auto truth = makeEntries(3, 10, 0, 3, 4 * kMs, 7);
  const auto skewed = makeEntries(3, 10, 2, 2, 9 * kMs, 8);
  std::vector<SynthRank> ranks = ranksFor(skewed, 3);
  for (size_t i = 0; i < truth.size(); ++i) {
    ranks[1].ops[i].arrivals =
        std::vector<std::optional<int64_t>>(truth[i].begin(), truth[i].end());
    ranks[2].ops[i].arrivals =
        std::vector<std::optional<int64_t>>{std::nullopt, std::nullopt, truth[i][2]};
    ranks[2].ops[i].pairForm = true;
  }
  Analysis a = analyzeRanks(ranks);
  const Expected x = expectedFrom(truth, 3);
  for (size_t q = 0; q < 3; ++q) {
    EXPECT_EQ(a.ranks[q].maxLateNs, x.max[q]) << "rank " << q;
    EXPECT_EQ(a.ranks[q].timesLast, x.timesLast[q]) << "rank " << q;
    EXPECT_NEAR(a.ranks[q].waitCausedNs, x.waitCaused[q], 1e-3) << "rank " << q;
  }
}

// What a rank says of itself wins over what another rank's list says of it.
TEST(TraceAnalysis, ARanksOwnArrivalWinsOverAnothersList) {
  const auto truth = makeEntries(2, 4, 1, 2, 3 * kMs, 21);
  std::vector<SynthRank> ranks = ranksFor(truth, 2);
  for (size_t i = 0; i < truth.size(); ++i) {
    ranks[0].ops[i].arrivals = std::vector<std::optional<int64_t>>{truth[i][0], truth[i][1] + 7};
    ranks[1].ops[i].arrivals = std::vector<std::optional<int64_t>>{std::nullopt, truth[i][1]};
  }
  Analysis a = analyzeRanks(ranks);
  EXPECT_EQ(a.ranks[1].maxLateNs, expectedFrom(truth, 2).max[1]);
}

// Of the other dumps' lists, the lowest rank's wins: rank 2's own dump has no list, ranks 1
// and 3 both know it (rank 3's wrongly), rank 0 does not.
TEST(TraceAnalysis, AnotherRanksListIsTakenLowestRankFirst) {
  const auto truth = makeEntries(4, 5, 2, 1, 3 * kMs, 5);
  std::vector<SynthRank> ranks = ranksFor(truth, 4);
  for (size_t i = 0; i < truth.size(); ++i) {
    ranks[2].ops[i].enterNs += 9 * kMs;  // wrong: the lists hold the truth
    ranks[0].ops[i].arrivals =
        std::vector<std::optional<int64_t>>{truth[i][0], std::nullopt, std::nullopt, std::nullopt};
    ranks[1].ops[i].arrivals =
        std::vector<std::optional<int64_t>>{std::nullopt, truth[i][1], truth[i][2], std::nullopt};
    ranks[1].ops[i].pairForm = true;
    ranks[3].ops[i].arrivals = std::vector<std::optional<int64_t>>{
        std::nullopt, std::nullopt, truth[i][2] + 5 * kMs, std::nullopt};
    ranks[3].ops[i].pairForm = true;
  }
  Analysis a = analyzeRanks(ranks);
  const Expected x = expectedFrom(truth, 4);
  ASSERT_EQ(a.timedOps, 5u);
  for (size_t q = 0; q < 4; ++q) {
    EXPECT_EQ(a.ranks[q].maxLateNs, x.max[q]) << "rank " << q;
    EXPECT_EQ(a.ranks[q].timesLast, x.timesLast[q]) << "rank " << q;
  }
  for (size_t i = 0; i < truth.size(); ++i) EXPECT_EQ(a.ops[i].arrival[2], truth[i][2]);
}

// A rank the arrival list does not know falls back to its own entry time.
TEST(TraceAnalysis, NullArrivalsFallBackToOwnEntry) {
  const auto enter = makeEntries(2, 6, 1, 2, 2 * kMs, 3);
  std::vector<SynthRank> ranks = ranksFor(enter, 2);
  for (size_t i = 0; i < enter.size(); ++i)
    ranks[0].ops[i].arrivals = std::vector<std::optional<int64_t>>{enter[i][0], std::nullopt};
  Analysis a = analyzeRanks(ranks);
  const Expected x = expectedFrom(enter, 2);
  EXPECT_EQ(a.timedOps, 6u);
  EXPECT_EQ(a.ranks[1].maxLateNs, x.max[1]);
}

TEST(TraceAnalysis, SkewWithinTheClockUncertaintyIsChargedToNoRank) {
  auto enter = makeEntries(3, 12, 0, 1000, 0, 9);  // jitter only: under 50 us
  std::vector<SynthRank> ranks = ranksFor(enter, 3);
  ranks[1].clockErrorNs = 30000;  // uncertainty 2 x 30 us = 60 us
  Analysis a = analyzeRanks(ranks);
  EXPECT_EQ(a.clockUncertaintyNs, 60000);
  EXPECT_EQ(a.belowUncertainty, 12u);
  for (const RankStats& s : a.ranks) {
    EXPECT_EQ(s.timesLast, 0u);
    EXPECT_EQ(s.waitCausedNs, 0);
  }
}

// Rank 1 stopped after seq 4; ranks 0 and 2 timed out in seq 5.
TEST(TraceAnalysis, MissingRankIsNamed) {
  auto enter = makeEntries(3, 5, 0, 1000, 0, 1);
  std::vector<SynthRank> ranks = ranksFor(enter, 3);
  ranks[1].ops.pop_back();
  for (size_t q : {0u, 2u}) {
    ranks[q].ops.back().state = "failed";
    ranks[q].ops.back().error = "allreduce #5 timed out waiting for rank 1";
  }
  Analysis a = analyzeRanks(ranks);
  ASSERT_EQ(a.missing.size(), 1u);
  EXPECT_EQ(a.missing[0].seq, 5u);
  EXPECT_EQ(a.missing[0].missing, std::vector<int>{1});
  EXPECT_EQ(a.missing[0].present, (std::vector<int>{0, 2}));
  EXPECT_EQ(a.ops.back().cells[1], CellState::Missing);
  EXPECT_FALSE(a.ops.back().timed);
  ASSERT_EQ(a.stuck.size(), 1u);  // failed everywhere it was entered
  EXPECT_EQ(a.stuck[0].failed, (std::vector<int>{0, 2}));
  EXPECT_EQ(a.stuck[0].firstError, "allreduce #5 timed out waiting for rank 1");
  EXPECT_TRUE(a.mismatches.empty());
  EXPECT_EQ(a.verdict(), kExitMissing);
  EXPECT_EQ(a.lastSeen[1].seq, 4u);
  EXPECT_EQ(a.timedOps, 4u);
}

// What rank 1 calls at seq 3 instead of the others' all-reduce of 1024 fp32 with sum.
struct MismatchCase {
  const char* name;
  const char* coll;
  uint64_t count;
  int dtype, op, root;
  const char* expected;
};

class TraceMismatch : public ::testing::TestWithParam<MismatchCase> {};

TEST_P(TraceMismatch, DifferentCallsAtOneSeqAreReported) {
  auto enter = makeEntries(3, 6, 0, 1000, 0, 2);
  std::vector<SynthRank> ranks = ranksFor(enter, 3);
  const MismatchCase& c = GetParam();
  SynthOp& o = ranks[1].ops[2];
  std::tie(o.coll, o.count, o.dtype, o.op, o.root) =
      std::make_tuple(c.coll, c.count, c.dtype, c.op, c.root);
  Analysis a = analyzeRanks(ranks);
  ASSERT_EQ(a.mismatches.size(), 1u);
  EXPECT_EQ(a.mismatches[0].seq, 3u);
  ASSERT_EQ(a.mismatches[0].groups.size(), 2u);
  EXPECT_EQ(a.mismatches[0].groups[0].first, "allreduce count 1024 fp32 sum");
  EXPECT_EQ(a.mismatches[0].groups[0].second, (std::vector<int>{0, 2}));
  EXPECT_EQ(a.mismatches[0].groups[1].first, GetParam().expected);
  EXPECT_EQ(a.mismatches[0].groups[1].second, std::vector<int>{1});
  EXPECT_EQ(a.verdict(), kExitMismatch);
}

INSTANTIATE_TEST_SUITE_P(
    Fields, TraceMismatch,
    ::testing::Values(
        MismatchCase{"collective", "broadcast", 1024, 7, 0, 0, "broadcast count 1024 fp32 root 0"},
        MismatchCase{"count", "allreduce", 512, 7, 0, -1, "allreduce count 512 fp32 sum"},
        MismatchCase{"dtype", "allreduce", 1024, 9, 0, -1, "allreduce count 1024 bf16 sum"},
        MismatchCase{"op", "allreduce", 1024, 7, 2, -1, "allreduce count 1024 fp32 max"}),
    [](const ::testing::TestParamInfo<MismatchCase>& i) { return std::string(i.param.name); });

TEST(TraceAnalysis, RootMismatchOfABroadcast) {
  auto enter = makeEntries(2, 2, 0, 1000, 0, 4);
  std::vector<SynthRank> ranks = ranksFor(enter, 2);
  for (SynthRank& r : ranks)
    for (SynthOp& o : r.ops) {
      o.coll = "broadcast";
      o.root = r.rank == 0 ? 0 : 1;
    }
  Analysis a = analyzeRanks(ranks);
  ASSERT_EQ(a.mismatches.size(), 2u);
  EXPECT_EQ(a.mismatches[0].groups[1].first, "broadcast count 1024 fp32 root 1");
}

TEST(TraceAnalysis, RankStuckInAnOperationOthersCompleted) {
  auto enter = makeEntries(3, 7, 0, 1000, 0, 6);
  std::vector<SynthRank> ranks = ranksFor(enter, 3);
  ranks[1].ops.back().state = "started";
  ranks[1].ops.back().endNs = 0;
  Analysis a = analyzeRanks(ranks);
  ASSERT_EQ(a.stuck.size(), 1u);
  EXPECT_EQ(a.stuck[0].seq, 7u);
  EXPECT_EQ(a.stuck[0].stuck, std::vector<int>{1});
  EXPECT_EQ(a.stuck[0].completed, (std::vector<int>{0, 2}));
  EXPECT_TRUE(a.missing.empty());
  EXPECT_EQ(a.verdict(), kExitStuck);
}

// Rank 0's recorder kept only seq 11..20: the older ones are not "missing".
TEST(TraceAnalysis, OperationsEvictedFromARingAreNotMissing) {
  auto enter = makeEntries(2, 20, 1, 3, kMs, 12);
  std::vector<SynthRank> ranks = ranksFor(enter, 2);
  ranks[0].ops.erase(ranks[0].ops.begin(), ranks[0].ops.begin() + 10);
  Analysis a = analyzeRanks(ranks);
  EXPECT_TRUE(a.missing.empty());
  EXPECT_EQ(a.ops.size(), 20u);
  EXPECT_EQ(a.ops[0].cells[0], CellState::Evicted);
  EXPECT_EQ(a.ops[0].cells[1], CellState::Untimed);
  EXPECT_EQ(a.timedOps, 10u);
  EXPECT_EQ(a.verdict(), kExitConsistent);
}

TEST(TraceAnalysis, RankWithoutADumpMakesTheSetIncomplete) {
  auto enter = makeEntries(3, 4, 0, 1000, 0, 13);
  std::vector<SynthRank> ranks = ranksFor(enter, 3);
  TempDir dir;
  dir.write(ranks[0]);
  dir.write(ranks[2]);
  Analysis a = analyze(loadOne(dir));
  EXPECT_EQ(a.noDump, std::vector<int>{1});
  EXPECT_EQ(a.timedOps, 0u);
  EXPECT_TRUE(a.missing.empty());
  EXPECT_EQ(a.verdict(), kExitIncomplete);
}

TEST(TraceAnalysis, DumpsAreGroupedByCommunicator) {
  auto enter = makeEntries(2, 3, 0, 1000, 0, 14);
  TempDir dir;
  for (SynthRank r : ranksFor(enter, 2)) {
    dir.write(r);
    r.hash = "00000000000000cd";
    r.comm = "other";
    r.ops.pop_back();
    dir.write(r);
  }
  LoadResult res = loadDumps({dir.path()});
  ASSERT_EQ(res.comms.size(), 2u);
  EXPECT_EQ(res.comms[0].name, "other");
  EXPECT_EQ(analyze(res.comms[0]).ops.size(), 2u);
  EXPECT_EQ(analyze(res.comms[1]).ops.size(), 3u);
}

TEST(TraceAnalysis, OfTwoDumpsOfOneRankTheNewerIsKept) {
  auto enter = makeEntries(2, 5, 0, 1000, 0, 15);
  std::vector<SynthRank> ranks = ranksFor(enter, 2);
  TempDir dir;
  for (const SynthRank& r : ranks) dir.write(r);
  SynthRank older = ranks[1];
  older.ops.resize(2);
  dir.write("explicit-rank1.json", toJson(older).dump());
  LoadResult res = loadDumps({dir.path()});
  ASSERT_EQ(res.comms.size(), 1u);
  EXPECT_EQ(res.comms[0].ranks[1]->ops.size(), 5u);
  ASSERT_EQ(res.notes.size(), 1u);
  EXPECT_NE(res.notes[0].find("explicit-rank1.json"), std::string::npos);
}

TEST(TraceAnalysis, PercentileIsNearestRank) {
  std::vector<int64_t> v;
  for (int i = 100; i >= 1; --i) v.push_back(i);
  EXPECT_EQ(percentile(v, 99), 99);
  EXPECT_EQ(percentile(v, 100), 100);
  EXPECT_EQ(percentile({7}, 99), 7);
  EXPECT_EQ(percentile({}, 99), 0);
  EXPECT_EQ(percentile({1, 2, 3}, 50), 2);
}

}  // namespace
}  // namespace loomtest
