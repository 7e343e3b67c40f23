// The cost model's links from a system graph: what the tuner would know on a machine
// described by a topology (loom-topo --file), rather than a flat shm/TCP assumption.
//
// linksFromGraph() runs the ring search for the ranks' places and reads channel 0's
// ring: its order becomes the rings' order (LinkMap::ringOrder), the hops inside a host
// give the intra-host link type (NVLink when every such hop is NVL or NVB, PCIe for other
// GPU hops, shared memory for CPU ranks) and its bandwidth (the narrowest such hop's path),
// the hops between hosts give the inter-host type (the network when the hosts have ports,
// TCP otherwise) and its bandwidth (channels x their share: what all rings together move
// across a host's boundary). Latencies stay the model's. A pure function: no I/O.
#pragma once

#include <string>
#include <vector>

#include "algorithms/cost.h"
#include "topology/search.h"

namespace loom::algo {

struct GraphLinks {
  LinkMap links;
  CostModel model;
  int channels = 0;
  double intraGBps = 0;  // 0: one rank a host (no hop inside a host)
  double interGBps = 0;  // 0: one host
};

Result<GraphLinks> linksFromGraph(const topo::System& system,
                                  const std::vector<topo::RankPlace>& ranks, const CostModel& base);

// A communicator's ring order (Comm::ringOrder). Where every rank runs on a GPU the graph has
// (cudaDev[r], a device index on host hostOf[r]), channel 0 of searchRings: rings follow
// NVLink inside a host and enter and leave it through the NIC nearest its GPUs. Otherwise (no
// graph, a CPU rank, a device the graph lacks, a failed search) hostMajorOrder(hostOf), which is
// what the search answers for CPU ranks. An empty order is rank order (as hostMajorOrder
// gives it). `how` says which, and why, for the log.
struct RingOrderChoice {
  std::vector<int> order;
  bool fromGraph = false;
  std::string how;
};
RingOrderChoice commRingOrder(const topo::System* system, const std::vector<int>& hostOf,
                              const std::vector<int>& cudaDev);

}  // namespace loom::algo
