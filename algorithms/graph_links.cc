#include "algorithms/graph_links.h"

#include <algorithm>

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
  if (intra > 0) g.model.links[static_cast<int>(g.links.intra)].beta_us_per_byte = 1.0 / (intra * 1e3);
  if (g.links.hosts() > 1 && plan.totalBw() > 0) {
    g.interGBps = plan.totalBw();
    g.model.links[static_cast<int>(g.links.inter)].beta_us_per_byte = 1.0 / (g.interGBps * 1e3);
  }
  return g;
}

}  // namespace loom::algo
