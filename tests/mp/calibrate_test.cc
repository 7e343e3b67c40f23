// Start-up calibration (LOOM_TUNER_CALIBRATE=1): the ranks pair up and time their links all at
// once (ranks 0 and 1, 2 and 3; the even side fits), every rank prices with rank 0's fit, so
// every rank predicts the same time for every candidate (read from each rank's TUNE log), and
// collectives stay correct. Over TCP (4 ranks, shm off) and over shared memory (4 ranks).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
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
    const std::string text = readFile(base + "/tune." + std::to_string(o.pid));
    std::remove((base + "/tune." + std::to_string(o.pid)).c_str());
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

}  // namespace
}  // namespace loomtest
