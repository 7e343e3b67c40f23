// loom-topo: prints this host's topology (or a file's), the paths between its devices,
// and the rings Loom would choose for a rank layout.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "topology/search.h"
#include "topology/topology.h"

using namespace loom::topo;

namespace {

void usage() {
  std::printf(
      "usage: loom-topo [--file F] [--dump OUT] [--hosts N] [--ranks-per-host R]\n"
      "                 [--max-channels C] [--no-paths]\n"
      "  --file F            NCCL topology XML or hwloc XML instead of detecting this host\n"
      "  --dump OUT          write the topology in NCCL's schema to OUT\n"
      "  --hosts N           plan rings over N copies of the machine (default 1)\n"
      "  --ranks-per-host R  ranks on each host (default: one per GPU, else one per NUMA node)\n");
}

std::string rankName(const System& s, const std::vector<RankPlace>& ranks, int r) {
  const RankPlace& p = ranks[static_cast<size_t>(r)];
  std::string dev = (p.kind == NodeType::Gpu ? "GPU" : "CPU") + std::to_string(p.index);
  return s.hosts().size() > 1 ? "h" + std::to_string(p.host) + ":" + dev : dev;
}

void printTree(const System& s) {
  for (size_t h = 0; h < s.hosts().size(); ++h) {
    const Host& host = s.hosts()[h];
    std::printf("host %zu%s%s: %zu GPU(s), %zu CPU(s), %zu NIC(s), %zu network port(s)\n", h,
                host.name.empty() ? "" : " ", host.name.c_str(),
                s.nodesOf(NodeType::Gpu, static_cast<int>(h)).size(),
                s.nodesOf(NodeType::Cpu, static_cast<int>(h)).size(),
                s.nodesOf(NodeType::Nic, static_cast<int>(h)).size(),
                s.nodesOf(NodeType::Net, static_cast<int>(h)).size());
    for (int n : host.nodes) {
      const Node& nd = s.node(n);
      std::printf("  %-22s", nd.label().c_str());
      if (nd.type == NodeType::Cpu)
        std::printf(" numa %d, %d hardware threads%s", nd.numa, nd.pus,
                    nd.cores ? (", " + std::to_string(nd.cores) + " cores").c_str() : "");
      if (nd.type == NodeType::Gpu) std::printf(" %s sm %d", nd.busId.c_str(), nd.sm);
      if (nd.type == NodeType::Net) std::printf(" %lld Mb/s", static_cast<long long>(nd.speedMbps));
      std::printf("\n");
      for (const Link& l : nd.links)
        std::printf("      %s %.1f GB/s -> %s\n", linkTypeName(l.type), l.bw,
                    s.node(l.to).label().c_str());
    }
  }
}

void printPaths(const System& s, int host) {
  std::vector<int> devs = s.nodesOf(NodeType::Gpu, host);
  if (devs.empty()) devs = s.nodesOf(NodeType::Cpu, host);
  std::vector<int> nets = s.nodesOf(NodeType::Net, host);
  std::printf("\npaths (type/GB/s) on host %d:\n%-10s", host, "");
  for (int b : devs) std::printf(" %-11s", s.node(b).label().c_str());
  for (int b : nets) std::printf(" %-11s", ("NET" + std::to_string(s.node(b).dev)).c_str());
  std::printf("\n");
  for (int a : devs) {
    std::printf("%-10s", s.node(a).label().c_str());
    for (int b : devs) std::printf(" %s/%-7.1f", pathTypeName(s.path(a, b).type), s.path(a, b).bw);
    for (int b : nets) std::printf(" %s/%-7.1f", pathTypeName(s.path(a, b).type), s.path(a, b).bw);
    std::printf("\n");
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string file, dump;
  int hosts = 1, ranksPerHost = 0, maxChannels = 16;
  bool paths = true;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "loom-topo: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--file")
      file = next();
    else if (a == "--dump")
      dump = next();
    else if (a == "--hosts")
      hosts = std::atoi(next());
    else if (a == "--ranks-per-host")
      ranksPerHost = std::atoi(next());
    else if (a == "--max-channels")
      maxChannels = std::atoi(next());
    else if (a == "--no-paths")
      paths = false;
    else if (a == "-h" || a == "--help") {
      usage();
      return 0;
    } else {
      std::fprintf(stderr, "loom-topo: unknown argument %s\n", a.c_str());
      usage();
      return 2;
    }
  }
  if (hosts < 1) {
    std::fprintf(stderr, "loom-topo: --hosts must be >= 1\n");
    return 2;
  }
  auto one = file.empty() ? localTopology() : loadTopologyFile(file);
  if (!one.isOk()) {
    std::fprintf(stderr, "loom-topo: %s\n", one.status().message().c_str());
    return 1;
  }
  if (!dump.empty()) {
    loom::Status st = dumpTopologyFile(one.value(), dump);
    if (!st.isOk()) {
      std::fprintf(stderr, "loom-topo: %s\n", st.message().c_str());
      return 1;
    }
  }
  std::printf("topology: %s\n", file.empty() ? "this host" : file.c_str());
  printTree(one.value());
  if (paths) printPaths(one.value(), 0);

  auto sys = hosts == 1 ? std::move(one) : replicateHost(one.value(), hosts);
  if (!sys.isOk()) {
    std::fprintf(stderr, "loom-topo: %s\n", sys.status().message().c_str());
    return 1;
  }
  const System& s = sys.value();
  if (ranksPerHost <= 0) {
    size_t g = s.nodesOf(NodeType::Gpu, 0).size();
    ranksPerHost = static_cast<int>(g ? g : s.nodesOf(NodeType::Cpu, 0).size());
  }
  auto ranks = placeRanks(s, ranksPerHost);
  if (!ranks.isOk()) {
    std::fprintf(stderr, "loom-topo: %s\n", ranks.status().message().c_str());
    return 1;
  }
  SearchOptions opt;
  opt.maxChannels = maxChannels;
  auto plan = searchRings(s, ranks.value(), opt);
  if (!plan.isOk()) {
    std::fprintf(stderr, "loom-topo: %s\n", plan.status().message().c_str());
    return 1;
  }
  const RingPlan& p = plan.value();
  std::printf("\nrings for %d host(s) x %d rank(s): %zu channel(s) x %.1f GB/s = %.1f GB/s\n",
              hosts, ranksPerHost, p.channels.size(), p.bwPerChannel, p.totalBw());
  for (size_t c = 0; c < p.channels.size(); ++c) {
    const Channel& ch = p.channels[c];
    std::printf("channel %zu:", c);
    for (const Hop& h : ch.hops) {
      std::printf(" %s -%s", rankName(s, ranks.value(), h.from).c_str(), pathTypeName(h.type));
      if (h.type == PathType::Net && h.netOut >= 0)
        std::printf("(NET%d>NET%d)", s.node(h.netOut).dev, s.node(h.netIn).dev);
      std::printf("->");
    }
    std::printf(" %s\n",
                ch.ring.empty() ? "" : rankName(s, ranks.value(), ch.ring.front()).c_str());
    for (const TreeHint& t : ch.tree)
      if (t.net >= 0)
        std::printf("  tree hint host %d: NET%d (%s), head rank %d\n", t.host, s.node(t.net).dev,
                    s.node(t.net).name.c_str(), t.headRank);
  }
  // Cost-model hook: when algorithms/cost.h exists, the predicted time of each collective
  // over this plan is printed here (wired by the algorithms owner; nothing is estimated yet).
  return 0;
}
