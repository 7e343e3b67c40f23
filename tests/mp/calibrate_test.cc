// Start-up calibration (LOOM_TUNER_CALIBRATE=1): the ranks pair up and time their links all at
// once (ranks 0 and 1, 2 and 3; the even side fits), every rank prices with rank 0's fit, so
// every rank predicts the same time for every candidate (read from each rank's TUNE log), and
// collectives stay correct. Over TCP (4 ranks, shm off) and over shared memory (4 ranks).
#include <dirent.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include "harness.h"

namespace loomtest {
namespace {

struct CalCase {
  bool shm;
};

class CalibrateTest : public ::testing::TestWithParam<CalCase> {};

TEST_P(CalibrateTest, RankZerosFitIsEveryRanksModel) {
  const CalCase c = GetParam();
  char dir[] = "/tmp/loom_calibrate_XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string base = dir;
  LaunchOptions opts;
  opts.nranks = 4;
  opts.shm = c.shm;
  opts.env = {{"LOOM_TUNER_CALIBRATE", "1"},
              {"LOOM_DEBUG", "INFO"},
              {"LOOM_DEBUG_SUBSYS", "TUNE"},
              {"LOOM_DEBUG_FILE", base + "/tune.%p"},
              // The schedule path is priced (the direct all-reduce is taken unpriced on one host).
              {"LOOM_ALGO", "allreduce:^direct"}};
  LaunchResult res = launch(opts, [&](RankContext& ctx) {
    // Sizes the tuner prices, each checked against the sum computed here.
    for (size_t count : {size_t{2}, size_t{5000}, size_t{300000}}) {
      std::vector<float> x(count), y(count);
      for (size_t i = 0; i < count; ++i)
        x[i] = static_cast<float>(ctx.rank + 1) * static_cast<float>(i % 7);
      if (loomAllReduce(x.data(), y.data(), count, loomFloat32, loomSum, ctx.comm, nullptr) !=
          loomSuccess)
        return 1;
      const float sum = static_cast<float>(ctx.nranks * (ctx.nranks + 1) / 2);
      for (size_t i = 0; i < count; ++i)
        if (y[i] != sum * static_cast<float>(i % 7)) return 3;
    }
    return 0;
  });
  ASSERT_TRUE(res.allPassed()) << res.report(true);

  // Every rank's log: the calibration line (the pinging ranks, 0 and 2) and its predictions.
  const std::regex calibrated(
      R"(calibrated (\w+) with rank (\d+): ([0-9.]+) us \+ ([0-9.]+) GB/s)");
  const std::regex predicted(R"(allreduce of (\d+) bytes: (\w+) predicted ([0-9.]+) us)");
  std::map<std::string, std::string> first;  // "bytes algo" -> time, as the first log said
  int logs = 0;
  std::vector<int> partners;
  size_t compared = 0;
  for (const RankOutcome& o : res.ranks) {
    const std::string text = takeFile(base + "/tune." + std::to_string(o.pid));
    if (text.empty()) continue;
    ++logs;
    for (std::sregex_iterator m(text.begin(), text.end(), calibrated), end; m != end; ++m) {
      EXPECT_EQ((*m)[1].str(), c.shm ? "shm" : "tcp");
      partners.push_back(std::stoi((*m)[2].str()));
      const double alpha = std::stod((*m)[3].str()), gbps = std::stod((*m)[4].str());
      EXPECT_TRUE(std::isfinite(alpha) && alpha >= 0 && alpha < 1e6) << alpha;
      EXPECT_TRUE(std::isfinite(gbps) && gbps > 0) << gbps;
    }
    for (std::sregex_iterator m(text.begin(), text.end(), predicted), end; m != end; ++m) {
      const std::string key = (*m)[1].str() + " " + (*m)[2].str();
      auto [it, fresh] = first.emplace(key, (*m)[3].str());
      if (!fresh) {
        ++compared;
        EXPECT_EQ(it->second, (*m)[3].str()) << "ranks predict " << key << " differently";
      }
    }
  }
  rmdir(dir);
  EXPECT_EQ(logs, 4);
  std::sort(partners.begin(), partners.end());
  EXPECT_EQ(partners, (std::vector<int>{1, 3})) << "ranks 0 and 2 time their links, with 1 and 3";
  EXPECT_GE(compared, 6u) << "the ranks' predictions were not found to compare";
}

INSTANTIATE_TEST_SUITE_P(Links, CalibrateTest, ::testing::Values(CalCase{false}, CalCase{true}),
                         [](const ::testing::TestParamInfo<CalCase>& i) {
                           return std::string(i.param.shm ? "shm" : "tcp");
                         });

// The direct all-reduce's forms priced at start-up: every rank takes rank 0's limits (its TUNE
// log says them), the limits are what the rule gives from rank 0's logged times (recomputed
// here), and every call runs the form the limits name (read from each rank's flight-recorder
// dump), with results checked against sums computed here. 2 ranks, and 4 on this machine's
// cores (more ranks than cores where it has fewer than 4).
class CalibrateFormsTest : public ::testing::TestWithParam<int> {};

// The limits the rule gives (algorithms/schedule.h, formLimit): a size is lost where the smaller
// form took more than 1.03 times the larger one's time; the limit is the size before the first
// loss that is followed by another loss or by nothing. The log rounds times to 0.001 us, so a
// comparison that rounding could turn either way is read both ways: the library's limit must be
// one of the two.
std::vector<long long> limitsFrom(const std::string& times) {
  const std::regex item(R"( (\d+):([0-9.]+)/([0-9.]+))");
  std::vector<std::pair<long long, int>> sizes;  // (bytes, 0 won, 1 lost, 2 either)
  for (std::sregex_iterator m(times.begin(), times.end(), item), end; m != end; ++m) {
    const double smaller = std::stod((*m)[2].str()), larger = std::stod((*m)[3].str());
    const double margin = smaller - 1.03 * larger;
    sizes.emplace_back(std::stoll((*m)[1].str()), std::abs(margin) <= 0.0011 ? 2 : margin > 0);
  }
  std::vector<long long> out;
  for (int ambiguousLost : {0, 1}) {
    auto lost = [&](size_t i) { return sizes[i].second == 2 ? ambiguousLost : sizes[i].second; };
    long long limit = 0;
    for (size_t i = 0; i < sizes.size(); ++i) {
      if (lost(i) && (i + 1 == sizes.size() || lost(i + 1))) break;
      limit = sizes[i].first;
    }
    out.push_back(limit);
  }
  return out;
}

bool oneOf(long long v, const std::vector<long long>& allowed) {
  return std::find(allowed.begin(), allowed.end(), v) != allowed.end();
}

TEST_P(CalibrateFormsTest, RankZerosLimitsChooseEveryRanksForm) {
  char dir[] = "/tmp/loom_calibrate_XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string base = dir;
  LaunchOptions opts;
  opts.nranks = GetParam();
  // The algorithm is held to direct: which algorithm the calibrated link costs price cheapest
  // (ring can win at some size on a loaded host) is the test above's subject.
  opts.env = {{"LOOM_TUNER_CALIBRATE", "1"},
              {"LOOM_DEBUG", "INFO"},
              {"LOOM_DEBUG_SUBSYS", "TUNE"},
              {"LOOM_DEBUG_FILE", base + "/tune.%p"},
              {"LOOM_ALGO", "allreduce:direct"}};
  const std::vector<size_t> sizes = {8,    64,   128,   256,   384,   512,    1024,  2048,
                                     4096, 8192, 16384, 32768, 65536, 131072, 262144};
  LaunchResult res = launch(opts, [&](RankContext& ctx) {
    for (size_t bytes : sizes) {
      const size_t count = bytes / sizeof(float);
      std::vector<float> x(count), y(count, -1.0f);
      for (size_t i = 0; i < count; ++i)
        x[i] = static_cast<float>(ctx.rank + 1) * static_cast<float>(i % 5);
      if (loomAllReduce(x.data(), y.data(), count, loomFloat32, loomSum, ctx.comm, nullptr) !=
          loomSuccess)
        return 1;
      const float sum = static_cast<float>(ctx.nranks * (ctx.nranks + 1) / 2);
      for (size_t i = 0; i < count; ++i)
        if (y[i] != sum * static_cast<float>(i % 5)) return 3;
    }
    const std::string path = base + "/trace." + std::to_string(ctx.rank) + ".json";
    return loomCommDumpTrace(ctx.comm, path.c_str()) == loomSuccess ? 0 : 4;
  });
  ASSERT_TRUE(res.allPassed()) << res.report(true);

  const std::regex limits(
      R"(calibrated direct forms: LL up to (\d+) B, symmetric up to (\d+) B, streamed from (\d+) B \(in place (\d+) B\))");
  const std::regex timed(
      R"(direct forms timed \(bytes:smaller/larger us\): LL/symmetric([ 0-9.:/]*); cached/streamed([ 0-9.:/]*); in place([ 0-9.:/]*); symmetric/slices([ 0-9.:/]*))");
  const std::regex call(
      R"re("coll":"allreduce","algorithm":"(\w+)","proto":"(\w+)","count":(\d+))re");
  std::vector<std::vector<long long>> agreed;
  std::vector<long long> ruleLL, ruleSym, ruleCached, ruleCachedInPlace;
  for (const RankOutcome& o : res.ranks) {
    const std::string text = takeFile(base + "/tune." + std::to_string(o.pid));
    std::smatch m;
    if (std::regex_search(text, m, limits))
      agreed.push_back({std::stoll(m[1].str()), std::stoll(m[2].str()), std::stoll(m[3].str()),
                        std::stoll(m[4].str())});
    if (std::regex_search(text, m, timed)) {
      EXPECT_EQ(o.rank, 0) << "only rank 0's times decide";
      ruleLL = limitsFrom(m[1].str());
      ruleCached = limitsFrom(m[2].str());
      ruleCachedInPlace = limitsFrom(m[3].str());
      ruleSym = limitsFrom(m[4].str());
    }
  }
  ASSERT_EQ(agreed.size(), static_cast<size_t>(opts.nranks)) << "every rank logs its limits";
  for (const auto& a : agreed) EXPECT_EQ(a, agreed[0]) << "the ranks' limits differ";
  ASSERT_FALSE(ruleLL.empty()) << "rank 0's times were not found";
  EXPECT_TRUE(oneOf(agreed[0][0], ruleLL))
      << "LL's limit " << agreed[0][0] << " is not the rule's over rank 0's times";
  EXPECT_TRUE(oneOf(agreed[0][1], ruleSym))
      << "symmetric's limit " << agreed[0][1] << " is not the rule's";
  // Streaming starts above the cached copies' limit (16 KiB, the first size timed, when they
  // lost there; the table's 64 KiB on this CPU, or above the sizes timed, when they never lost).
  for (const auto& [cachedUpTo, from] : {std::make_pair(ruleCached, agreed[0][2]),
                                         std::make_pair(ruleCachedInPlace, agreed[0][3])}) {
    bool matches = false;
    for (long long cached : cachedUpTo)
      matches = matches || (cached == 0       ? from == 16384
                            : cached < 262144 ? from == cached + 1
                                              : from > 262144);
    EXPECT_TRUE(matches) << "streaming from " << from << " B is not the rule's";
  }
  const long long llMax = agreed[0][0], symMax = agreed[0][1];
  for (int r = 0; r < opts.nranks; ++r) {
    const std::string text = takeFile(base + "/trace." + std::to_string(r) + ".json");
    size_t seen = 0;
    for (std::sregex_iterator m(text.begin(), text.end(), call), end; m != end; ++m) {
      const long long bytes = std::stoll((*m)[3].str()) * 4;
      const std::string want = bytes <= llMax ? "LL" : bytes <= symMax ? "symmetric" : "slices";
      EXPECT_EQ((*m)[1].str(), "direct") << bytes << " B on rank " << r;
      EXPECT_EQ((*m)[2].str(), want) << bytes << " B on rank " << r << " (LL up to " << llMax
                                     << " B, symmetric up to " << symMax << " B)";
      ++seen;
    }
    EXPECT_EQ(seen, sizes.size()) << "rank " << r << "'s dump";
  }
  rmdir(dir);
}

INSTANTIATE_TEST_SUITE_P(Ranks, CalibrateFormsTest, ::testing::Values(2, 4),
                         [](const ::testing::TestParamInfo<int>& i) {
                           return std::to_string(i.param) + "ranks";
                         });

// LOOM_TUNER_CACHE: the first start-up times the forms and keeps rank 0's limits in the
// directory; the next one takes them from there without timing (every rank logs the same
// limits, no rank logs times); a file that does not hold four limits is timed over and
// rewritten. 2 ranks.
TEST(CalibrateCache, ASecondStartUpTakesTheLimitsFromTheCache) {
  char dir[] = "/tmp/loom_tunecache_XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string base = dir;
  const std::regex limits(
      R"(calibrated direct forms: LL up to (-?\d+) B, symmetric up to (-?\d+) B, streamed from (-?\d+) B \(in place (-?\d+) B\))");
  // One start-up: every rank's logged limits (which must agree), and whether any rank timed.
  auto startUp = [&](bool* timed) {
    LaunchOptions opts;
    opts.nranks = 2;
    opts.env = {{"LOOM_TUNER_CALIBRATE", "1"},
                {"LOOM_TUNER_CACHE", base},
                {"LOOM_DEBUG", "INFO"},
                {"LOOM_DEBUG_SUBSYS", "TUNE"},
                {"LOOM_DEBUG_FILE", base + "/log.%p"}};
    LaunchResult res = launch(opts, [](RankContext& ctx) {
      std::vector<float> x(1000, static_cast<float>(ctx.rank + 1)), y(1000);
      if (loomAllReduce(x.data(), y.data(), x.size(), loomFloat32, loomSum, ctx.comm, nullptr) !=
          loomSuccess)
        return 1;
      return y[999] == 3.0f ? 0 : 2;
    });
    EXPECT_TRUE(res.allPassed()) << res.report(true);
    std::vector<std::string> seen;
    *timed = false;
    for (const RankOutcome& o : res.ranks) {
      const std::string text = takeFile(base + "/log." + std::to_string(o.pid));
      std::smatch m;
      if (std::regex_search(text, m, limits))
        seen.push_back(m[1].str() + " " + m[2].str() + " " + m[3].str() + " " + m[4].str());
      *timed = *timed || text.find("direct forms timed") != std::string::npos;
    }
    EXPECT_EQ(seen.size(), 2u) << "every rank logs its limits";
    for (const std::string& v : seen) EXPECT_EQ(v, seen[0]) << "the ranks' limits differ";
    return seen.empty() ? std::string() : seen[0];
  };
  // The one cache file the first start-up writes.
  auto cacheFile = [&]() {
    std::vector<std::string> files;
    if (DIR* d = opendir(dir)) {
      while (dirent* e = readdir(d))
        if (std::string(e->d_name).rfind("direct-", 0) == 0)
          files.push_back(base + "/" + e->d_name);
      closedir(d);
    }
    EXPECT_EQ(files.size(), 1u);
    return files.empty() ? std::string() : files[0];
  };
  bool timed = false;
  const std::string first = startUp(&timed);
  EXPECT_TRUE(timed) << "the first start-up must time the forms";
  const std::string file = cacheFile();
  std::string held = readFile(file);
  while (!held.empty() && held.back() == '\n') held.pop_back();
  EXPECT_EQ(held, first) << "the cache holds what the ranks installed";

  const std::string second = startUp(&timed);
  EXPECT_FALSE(timed) << "a start-up with the limits cached timed the forms";
  EXPECT_EQ(second, first);

  // A file that does not hold four limits is timed over and rewritten.
  {
    std::ofstream bad(file);
    bad << "12 not-a-number\n";
  }
  startUp(&timed);
  EXPECT_TRUE(timed) << "a bad cache file was taken";
  held = readFile(file);
  EXPECT_TRUE(std::regex_match(held, std::regex(R"(-?\d+ -?\d+ -?\d+ -?\d+\n)"))) << held;
  std::remove(file.c_str());
  rmdir(dir);
}

}  // namespace
}  // namespace loomtest
