#include "topology/nic_rank.h"

#include <algorithm>

namespace loom::topo {
namespace {

// Bus ids of one PCI device (any function): ports of a multi-function NIC share its node.
bool sameDevice(const std::string& a, const std::string& b) {
  const int64_t x = parseBusId(a), y = parseBusId(b);
  return x >= 0 && y >= 0 && (x >> 4) == (y >> 4);
}

int findPortNode(const System& system, int host, const NicPort& port) {
  // The exact function first, then the device (another function of a multi-port NIC),
  // then a net node of the same name.
  for (int n : system.nodesOf(NodeType::Nic, host))
    if (!port.busId.empty() && parseBusId(system.node(n).busId) == parseBusId(port.busId) &&
        parseBusId(port.busId) >= 0)
      return n;
  for (int n : system.nodesOf(NodeType::Nic, host))
    if (!port.busId.empty() && sameDevice(system.node(n).busId, port.busId)) return n;
  for (int n : system.nodesOf(NodeType::Net, host))
    if (!port.name.empty() && system.node(n).name == port.name) return n;
  return -1;
}

}  // namespace

int nicRankSource(const System& system, int host, const std::string& gpuBusId, int numa) {
  if (!gpuBusId.empty())
    for (int g : system.nodesOf(NodeType::Gpu, host))
      if (parseBusId(system.node(g).busId) == parseBusId(gpuBusId) && parseBusId(gpuBusId) >= 0)
        return g;
  return numa >= 0 ? system.cpu(host, numa) : -1;
}

std::vector<NicRank> rankNics(const System& system, int source, const std::vector<NicPort>& ports) {
  std::vector<NicRank> out(ports.size());
  const int host = source >= 0 ? system.node(source).host : -1;
  for (size_t i = 0; i < ports.size(); ++i) {
    NicRank& r = out[i];
    r.port = i;
    if (source < 0) continue;
    r.node = findPortNode(system, host, ports[i]);
    if (r.node < 0) continue;
    const Path& p = system.path(source, r.node);
    r.type = p.type;
    r.bw = p.type == PathType::Dis ? 0 : p.bw;
  }
  std::stable_sort(out.begin(), out.end(), [](const NicRank& a, const NicRank& b) {
    if (a.type != b.type) return a.type < b.type;
    return a.bw > b.bw;
  });
  return out;
}

size_t nearestTier(const std::vector<NicRank>& ranked) {
  if (ranked.empty() || ranked[0].type == PathType::Dis) return 0;
  size_t n = 1;
  while (n < ranked.size() && ranked[n].type == ranked[0].type && ranked[n].bw == ranked[0].bw) ++n;
  return n;
}

}  // namespace loom::topo
