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
  char* const bufs[] = {buf.data()};
  op.group = bufs;
  auto one = [&](bool send) -> Status {
    exec::GroupOp p;
    p.isSend = send;
    p.peer = peer;
    p.buf = buf.data();
    p.bytes = bytes;
    LOOM_ASSIGN(const algo::Schedule* s, exec::groupSchedule(comm, {p}));
    return exec::run(comm, *s, op);
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
  LOOM_INFO(kTune,
            "calibrated %s with rank %d: %.3f us + %.3f GB/s (one-way: %.2f us at %zu B, %.2f us "
            "at %zu B)",
            algo::linkName(link), peer, fit.alpha_us, gbps, samples.front().us, kSizes[0],
            samples.back().us, kSizes[std::size(kSizes) - 1]);
  return Status::ok();
}

// Every rank pairs up, so that the links are timed under the load of a collective's round, in
// which all ranks send at once (on a host with more ranks than cores, the ranks' turns on the
// cores are part of every message's cost). Hosts are taken in order of their lowest rank and
// their ranks in ascending order: local ranks 2i and 2i + 1 time the host's link, and the
// ranks of local index i on hosts 2k and 2k + 1 the network. The even side pings. Rank 0
// (local 0 of host 0) thus times shared memory with the next rank of its host and the network
// with the lowest rank of the next host.
struct Pairing {
  int intra = -1, inter = -1;  // partners, -1 for none
  bool intraPings = false, interPings = false;
};

Pairing pairUp(const std::vector<int>& hostOf, int me) {
  const std::vector<std::vector<int>> members = algo::hostMembers(hostOf);
  Pairing p;
  for (size_t h = 0; h < members.size(); ++h) {
    auto it = std::find(members[h].begin(), members[h].end(), me);
    if (it == members[h].end()) continue;
    const size_t li = static_cast<size_t>(it - members[h].begin());
    const size_t lp = li ^ 1, hp = h ^ 1;
    if (lp < members[h].size()) p.intra = members[h][lp], p.intraPings = li % 2 == 0;
    if (hp < members.size() && li < members[hp].size())
      p.inter = members[hp][li], p.interPings = h % 2 == 0;
  }
  return p;
}

}  // namespace

Status calibrate(Comm& comm) {
  if (!env::tunerCalibrate() || comm.nranks() < 2) return Status::ok();
  const int n = comm.nranks(), me = comm.rank();
  const Pairing pair = pairUp(comm.hostLayout(), me);
  const algo::Link intra = env::shmDisable() ? comm.netLink() : algo::Link::Shm;
  std::string table;
  // Every pair measures; rank 0's figures become the table.
  if (pair.intra >= 0) LOOM_CHECK(measure(comm, pair.intra, pair.intraPings, intra, &table));
  if (pair.inter >= 0)
    LOOM_CHECK(measure(comm, pair.inter, pair.interPings, comm.netLink(), &table));
  if (me != 0) table.clear();
  // Everyone takes rank 0's table.
  std::vector<char> mine(kTableBytes, 0), all(kTableBytes * static_cast<size_t>(n), 0);
  std::memcpy(mine.data(), table.data(), std::min(table.size(), kTableBytes - 1));
  LOOM_CHECK(comm.bootstrap().allGather(mine.data(), all.data(), kTableBytes));
  const std::string agreed(all.data(), strnlen(all.data(), kTableBytes));
  return comm.setCostTable(agreed);
}

}  // namespace loom::api
