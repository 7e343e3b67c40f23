#include "algorithms/graph_links.h"

#include <algorithm>
#include <cstdio>

namespace loom::algo {

Result<GraphLinks> linksFromGraph(const topo::System& system,
                                  const std::vector<topo::RankPlace>& ranks,
                                  const CostModel& base) {
  LOOM_ASSIGN(topo::RingPlan plan, topo::searchRings(system, ranks));
  if (plan.channels.empty())
    return LOOM_ERROR(loomInternalError, "ring search found no ring for the ranks");
  GraphLinks g;
  g.model = base;
  g.channels = static_cast<int>(plan.channels.size());
  for (const topo::RankPlace& p : ranks) g.links.hostOf.push_back(p.host);
  const topo::Channel& ch = plan.channels[0];
  g.links.ringOrder = ch.ring;
  bool allNvlink = true, gpus = false, ports = false;
  double intra = 0;
  for (const topo::Hop& h : ch.hops) {
    gpus = gpus || ranks[static_cast<size_t>(h.from)].kind == topo::NodeType::Gpu;
    if (h.type == topo::PathType::Net) {
      ports = ports || h.netOut >= 0;
      continue;
    }
    if (h.from == h.to || h.type == topo::PathType::Loc) continue;  // ranks sharing a device
    allNvlink = allNvlink && (h.type == topo::PathType::Nvl || h.type == topo::PathType::Nvb);
    intra = intra == 0 ? h.bw : std::min(intra, h.bw);
  }
  g.links.intra = !gpus ? Link::Shm : allNvlink ? Link::NvLink : Link::Pcie;
  g.links.inter = ports ? Link::Net : Link::Tcp;
  g.intraGBps = intra;
  if (intra > 0)
    g.model.links[static_cast<int>(g.links.intra)].beta_us_per_byte = 1.0 / (intra * 1e3);
  if (g.links.hosts() > 1 && plan.totalBw() > 0) {
    g.interGBps = plan.totalBw();
    g.model.links[static_cast<int>(g.links.inter)].beta_us_per_byte = 1.0 / (g.interGBps * 1e3);
  }
  return g;
}

RingOrderChoice commRingOrder(const topo::System* system, const std::vector<int>& hostOf,
                              const std::vector<int>& cudaDev) {
  auto hostMajor = [&](const std::string& why) {
    return RingOrderChoice{hostMajorOrder(hostOf), false, "host-major (" + why + ")"};
  };
  if (system == nullptr) return hostMajor("no system graph");
  const size_t n = hostOf.size();
  if (cudaDev.size() != n) return hostMajor("no device list");
  std::vector<topo::RankPlace> places(n);
  for (size_t r = 0; r < n; ++r) {
    const std::string rank = "rank " + std::to_string(r);
    if (cudaDev[r] < 0) return hostMajor(rank + " has no GPU");
    if (system->gpu(hostOf[r], cudaDev[r]) < 0)
      return hostMajor("host " + std::to_string(hostOf[r]) + "'s graph has no GPU " +
                       std::to_string(cudaDev[r]) + ", " + rank + "'s device");
    places[r] = {hostOf[r], topo::NodeType::Gpu, cudaDev[r]};
  }
  Result<topo::RingPlan> plan = topo::searchRings(*system, places);
  if (!plan.isOk()) return hostMajor("ring search: " + plan.status().message());
  if (plan.value().channels.empty()) return hostMajor("the ring search found no ring");
  std::vector<int> ring = plan.value().channels[0].ring;
  std::vector<int> sorted = ring;
  std::sort(sorted.begin(), sorted.end());
  bool identity = true;
  for (size_t r = 0; r < n; ++r) {
    if (sorted.size() != n || sorted[r] != static_cast<int>(r))
      return hostMajor("the ring search's ring is not a permutation of the ranks");
    identity = identity && ring[r] == static_cast<int>(r);
  }
  if (identity) ring.clear();  // rank order, as hostMajorOrder says it
  char bw[64];
  std::snprintf(bw, sizeof(bw), "%.1f", plan.value().bwPerChannel);
  return RingOrderChoice{std::move(ring), true,
                         "channel 0 of the ring search over the graph (" +
                             std::to_string(plan.value().channels.size()) + " channel(s) of " + bw +
                             " GB/s)"};
}

}  // namespace loom::algo
