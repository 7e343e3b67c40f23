#include "api/calibrate.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <vector>

#include "exec/executor.h"
#include "util/env.h"
#include "util/log.h"
#include "util/wait.h"

namespace loom::api {
namespace {

constexpr size_t kSizes[] = {8, 16384, 131072};  // bytes: latency, then two bandwidth points
constexpr int kWarmup = 3, kTimed = 15;
constexpr size_t kTableBytes = 256;  // the all-gathered text, per rank

// One-way time of `bytes` between this rank and `peer`: the median of kTimed round trips, halved.
// The pinging side sends first; the other answers.
Result<double> pingPong(Comm& comm, int peer, bool pinger, std::vector<char>& buf, size_t bytes) {
  exec::OpArgs op;
  op.name = "calibration";
  op.deadlineNs = nowNs() + comm.options().timeoutMs * 1000000;
  auto one = [&](bool send) {
    exec::P2POp p;
    p.isSend = send;
    p.peer = peer;
    p.buf = buf.data();
    p.bytes = bytes;
    return exec::runP2P(comm, {p}, op);
  };
  std::vector<double> us;
  for (int i = 0; i < kWarmup + kTimed; ++i) {
    const int64_t t0 = nowNs();
    LOOM_CHECK(one(pinger));
    LOOM_CHECK(one(!pinger));
    if (i >= kWarmup) us.push_back(static_cast<double>(nowNs() - t0) / 2e3);
  }
  std::nth_element(us.begin(), us.begin() + us.size() / 2, us.end());
  return us[us.size() / 2];
}

// Rank 0's side (pinger) or a partner's: fits the link to `peer` and appends its table line.
Status measure(Comm& comm, int peer, bool pinger, algo::Link link, std::string* table) {
  std::vector<char> buf(kSizes[std::size(kSizes) - 1], 1);
  std::vector<algo::CostSample> samples;
  for (size_t bytes : kSizes) {
    LOOM_ASSIGN(double us, pingPong(comm, peer, pinger, buf, bytes));
    samples.push_back({static_cast<double>(bytes), us});
  }
  if (!pinger) return Status::ok();
  const algo::LinkCost fit = algo::fitLinkCost(samples);
  // beta 0 (a flat fit) would be infinite bandwidth: keep the table's line parseable.
  const double gbps = fit.beta_us_per_byte > 0 ? 1.0 / (fit.beta_us_per_byte * 1e3) : 1000.0;
  char line[96];
  std::snprintf(line, sizeof(line), "%s %.3f %.3f\n", algo::linkName(link), fit.alpha_us, gbps);
  *table += line;
  LOOM_INFO(kTune, "calibrated %s with rank %d: %.3f us + %.3f GB/s (one-way: %.2f us at %zu B, %.2f us at %zu B)",
            algo::linkName(link), peer, fit.alpha_us, gbps, samples.front().us, kSizes[0],
            samples.back().us, kSizes[std::size(kSizes) - 1]);
  return Status::ok();
}

}  // namespace

Status calibrate(Comm& comm) {
  if (!env::tunerCalibrate() || comm.nranks() < 2) return Status::ok();
  const std::vector<int>& hostOf = comm.hostLayout();
  const int n = comm.nranks(), me = comm.rank();
  int local = -1, remote = -1;  // rank 0's partners
  for (int r = 1; r < n; ++r) {
    if (hostOf[static_cast<size_t>(r)] == hostOf[0]) {
      if (local < 0) local = r;
    } else if (remote < 0) {
      remote = r;
    }
  }
  const algo::Link intra = env::shmDisable() ? comm.netLink() : algo::Link::Shm;
  std::string table;
  if (me == 0 || me == local) {
    if (local >= 0) LOOM_CHECK(measure(comm, me == 0 ? local : 0, me == 0, intra, &table));
  }
  if (me == 0 || me == remote) {
    if (remote >= 0) LOOM_CHECK(measure(comm, me == 0 ? remote : 0, me == 0, comm.netLink(), &table));
  }
  // Everyone takes rank 0's table.
  std::vector<char> mine(kTableBytes, 0), all(kTableBytes * static_cast<size_t>(n), 0);
  std::memcpy(mine.data(), table.data(), std::min(table.size(), kTableBytes - 1));
  LOOM_CHECK(comm.bootstrap().allGather(mine.data(), all.data(), kTableBytes));
  const std::string agreed(all.data(), strnlen(all.data(), kTableBytes));
  return comm.setCostTable(agreed);
}

}  // namespace loom::api
