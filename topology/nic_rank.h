// Which RDMA port is nearest to a rank: the ports of this host ranked by the
// path from the rank's GPU (or, without one, its CPU) to each port's NIC in the
// system graph.
//
// Order: the path type first (PIX, PXB, PHB, SYS as NCCL types them: a NIC under
// the GPU's own PCIe switch before one across the host bridge), then the path's
// bandwidth (higher first), then the order the ports came in. A port the graph
// does not know (no NIC with its bus id or name) ranks after every known one.
// Pure: no I/O; the ib transport feeds it the ports libibverbs lists and the
// host's graph (topology.h), and tests feed it machine fixtures.
#pragma once

#include <string>
#include <vector>

#include "topology/system.h"

namespace loom::topo {

struct NicPort {
  std::string name;   // RDMA device name (mlx5_0), matched against <net name>
  std::string busId;  // PCI bus id of its function ("0000:10:1b.0"), matched against NICs
};

struct NicRank {
  size_t port = 0;                // index into the ports given
  int node = -1;                  // the Nic or Net node matched, -1 when none
  PathType type = PathType::Dis;  // from the source (Dis: not in the graph)
  double bw = 0;                  // GB/s along that path
};

// Ports ranked from `source` (a Gpu or Cpu node of `system`), nearest first.
std::vector<NicRank> rankNics(const System& system, int source, const std::vector<NicPort>& ports);

// The source node for a rank on `host`: its GPU (by PCI bus id) when gpuBusId is
// not empty and the graph has it, else the CPU of NUMA node `numa`, else -1.
int nicRankSource(const System& system, int host, const std::string& gpuBusId, int numa);

// How many leading entries of `ranked` are equally near (same path type and
// bandwidth) as the first, among the known ones; 0 when none is known. Ranks that
// share a GPU spread over these.
size_t nearestTier(const std::vector<NicRank>& ranked);

}  // namespace loom::topo
