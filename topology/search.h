// Ring search: the order in which ranks pass data around a ring, per channel.
//
// Given a System and where each rank runs (a GPU, or a CPU socket/NUMA domain, on one
// of the system's hosts), searchRings orders the ranks so that each ring's slowest hop
// is as fast as possible:
//  * inside a host, a Hamiltonian cycle (one host) or path (several hosts) over the
//    ranks' devices, maximizing the narrowest hop (exact for up to 16 devices a host;
//    ranks sharing a device sit next to each other);
//  * between hosts, each host is entered and left through one of its network ports:
//    the ring enters at a device near that port and leaves from another device near it;
//  * several channels where links allow: rings are packed one after another, each
//    taking its share of bandwidth from every link it crosses (links used by several
//    hops of one ring count several times); the per-channel share is chosen to
//    maximize channels x share (ties: fewer channels).
// Tree hints name, per channel and host, the port and the rank nearest to it.
// searchRings is a pure function of its arguments: no I/O, no globals.
#pragma once

#include <vector>

#include "topology/system.h"
#include "util/status.h"

namespace loom::topo {

struct RankPlace {
  int host = 0;
  NodeType kind = NodeType::Gpu;  // Gpu (index = dev) or Cpu (index = numaid)
  int index = 0;
};

struct SearchOptions {
  int maxChannels = 16;
  int minChannels = 1;
};

struct Hop {
  int from = -1, to = -1;  // ranks
  PathType type = PathType::Dis;
  double bw = 0;  // GB/s of the path (not the channel's share); 0 between hosts without ports
  int netOut = -1, netIn = -1;  // NET nodes of a hop between hosts
};

struct HostRoute {
  int host = 0;
  int net = -1;  // NET node the ring enters and leaves by (-1: the host has none)
  int entryRank = -1, exitRank = -1;
};

struct TreeHint {
  int host = 0;
  int net = -1;       // NET node for this host's inter-host traffic on this channel
  int headRank = -1;  // the host's rank nearest to it
};

struct Channel {
  std::vector<int> ring;          // ranks in ring order
  std::vector<Hop> hops;          // hops[i]: ring[i] -> ring[(i + 1) % n]
  std::vector<HostRoute> routes;  // several hosts only
  std::vector<TreeHint> tree;     // per host
};

struct RingPlan {
  double bwPerChannel = 0;  // GB/s each channel's ring sustains
  std::vector<Channel> channels;
  double totalBw() const { return bwPerChannel * static_cast<double>(channels.size()); }
};

// Rank r of every host (r < ranksPerHost) on GPU r mod #GPUs, or, on hosts without
// GPUs, on NUMA domains in blocks; ranks numbered host-major.
Result<std::vector<RankPlace>> placeRanks(const System& system, int ranksPerHost);

Result<RingPlan> searchRings(const System& system, const std::vector<RankPlace>& ranks,
                             const SearchOptions& options = {});

}  // namespace loom::topo
