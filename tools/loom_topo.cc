// loom-topo: prints this host's topology (or a file's), the paths between its devices,
// the rings Loom would choose for a rank layout, and the cost model's predicted time of
// each algorithm over a sweep of sizes, with the one the tuner would pick: what Loom
// would do on this machine, without running it.
#include <sched.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "algorithms/cost.h"
#include "algorithms/graph_links.h"
#include "topology/search.h"
#include "topology/topology.h"
#include "util/env.h"
#include "util/log.h"

using namespace loom::topo;
namespace algo = loom::algo;

namespace {

void usage() {
  std::printf(
      "usage: loom-topo [--file F] [--dump OUT] [--hosts N] [--ranks-per-host R]\n"
      "                 [--max-channels C] [--no-paths] [--coll C] [--min-bytes B]\n"
      "                 [--max-bytes B] [--factor F] [--no-predict] [--graph]\n"
      "                 [--ranks-per-core K]\n"
      "  --file F            NCCL topology XML or hwloc XML instead of detecting this host\n"
      "  --dump OUT          write the topology in NCCL's schema to OUT\n"
      "  --hosts N           plan rings over N copies of the machine (default 1)\n"
      "  --ranks-per-host R  ranks on each host (default: one per GPU, else one per NUMA node)\n"
      "  --coll C            collective to predict: allreduce (default), allgather,\n"
      "                      reducescatter, broadcast, reduce, alltoall\n"
      "  --min-bytes B       smallest size of the prediction sweep (default 8)\n"
      "  --max-bytes B       largest size (default 268435456)\n"
      "  --factor F          factor between sizes (default 4)\n"
      "  --graph             predict with the graph's links (NVLink, PCIe, network ports,\n"
      "                      their bandwidths) and ring order instead of shm and TCP\n"
      "  --ranks-per-core K  ranks sharing each core, as the communicator counts them (default:\n"
      "                      the ranks of one host over the cores this process may use)\n"
      "LOOM_ALGO narrows the tuner's choice as it does in the library; LOOM_SLOT_BYTES and\n"
      "LOOM_SHM_DISABLE change the model as they change the communicator.\n");
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

// Parses a whole non-negative number; false on anything else.
bool parseCount(const char* text, long long* out) {
  char* end = nullptr;
  errno = 0;
  long long v = std::strtoll(text, &end, 10);
  if (end == text || *end != '\0' || errno != 0 || v < 0) return false;
  *out = v;
  return true;
}

// The predicted time of every algorithm with a schedule for `coll` (all-reduce on one host
// adds direct, the shared-memory path), per size, with the tuner's pick: LOOM_ALGO narrows
// the candidates exactly as in src/api/group.cc, then the cheapest prediction wins (the first
// candidate on a tie).
int printPredictions(algo::Coll coll, const std::vector<int>& hostOf, int hosts, int perHost,
                     int ranksPerCore, size_t minBytes, size_t maxBytes, size_t factor,
                     const System* graph, const std::vector<RankPlace>& ranks) {
  loom::Result<algo::CostModel> m =
      algo::tunerCostModel(loom::env::tunerTable(), loom::env::slotBytes());
  if (!m.isOk()) {
    std::fprintf(stderr, "loom-topo: %s\n", m.status().message().c_str());
    return 2;
  }
  algo::CostModel model = m.take();
  algo::LinkMap links;
  links.hostOf = hostOf;
  links.ringOrder = algo::hostMajorOrder(hostOf);
  links.intra = loom::env::shmDisable() ? algo::Link::Tcp : algo::Link::Shm;
  links.inter = algo::Link::Tcp;
  if (graph != nullptr) {  // --graph: link types, bandwidths and ring order from the graph
    loom::Result<algo::GraphLinks> g = algo::linksFromGraph(*graph, ranks, model);
    if (!g.isOk()) {
      std::fprintf(stderr, "loom-topo: %s\n", g.status().message().c_str());
      return 1;
    }
    links = g.value().links;
    model = g.value().model;
  }
  links.ranksPerCore = ranksPerCore;
  auto sel = algo::parseSelection(loom::env::algo(), "LOOM_ALGO", algo::algoNames());
  if (!sel.isOk()) {
    std::fprintf(stderr, "loom-topo: %s\n", sel.status().message().c_str());
    return 2;
  }
  const bool direct = coll == algo::Coll::AllReduce && hosts == 1;
  // The columns: every algorithm the tuner could offer at some size (at the smallest size every
  // size-limited one is offered), then any other LOOM_ALGO names (hier on one host).
  std::vector<algo::Algo> algos = algo::tunerCandidates(coll, 0, direct, hostOf, algo::Selection());
  for (algo::Algo a : algo::tunerCandidates(coll, 0, direct, hostOf, sel.value()))
    if (std::find(algos.begin(), algos.end(), a) == algos.end()) algos.push_back(a);
  const int nranks = static_cast<int>(hostOf.size());
  std::printf(
      "\npredicted %s time (us), %d host(s) x %d rank(s), %d a core, links %s/%s, slot %zu B%s%s\n",
      algo::collName(coll), hosts, perHost, ranksPerCore, algo::linkName(links.intra),
      algo::linkName(links.inter), model.slotBytes,
      loom::env::algo().empty() ? "" : ", LOOM_ALGO=", loom::env::algo().c_str());
  std::printf("%12s", "bytes");
  for (algo::Algo a : algos) std::printf(" %12s", algo::algoName(a));
  std::printf("  %s\n", "choice");
  const size_t elem = 4;  // float, loom-perf's default type
  for (size_t bytes = minBytes; bytes <= maxBytes; bytes *= factor) {
    const size_t count = std::max<size_t>(1, bytes / elem);
    std::printf("%12zu", count * elem);
    // What the tuner chooses among at this size; an algorithm it does not offer at this size
    // (rd above kRdMaxBytes where ranks share ports) prints "-".
    const std::vector<algo::Algo> offered =
        algo::tunerCandidates(coll, count * elem, direct, hostOf, algo::Selection());
    const std::vector<algo::Algo> cands =
        algo::tunerCandidates(coll, count * elem, direct, hostOf, sel.value());
    algo::Algo best = cands[0];
    double bestUs = 0;
    for (algo::Algo a : algos) {
      if (std::find(offered.begin(), offered.end(), a) == offered.end() &&
          std::find(cands.begin(), cands.end(), a) == cands.end()) {
        std::printf(" %12s", "-");
        continue;
      }
      const double us = algo::estimateUs(a, coll, nranks, count, elem, model, links);
      std::printf(" %12.1f", us);
      if (std::find(cands.begin(), cands.end(), a) == cands.end()) continue;
      if (a == cands[0] || us < bestUs) best = a, bestUs = us;
    }
    std::printf("  %s\n", algo::algoName(best));
    if (bytes > maxBytes / factor) break;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  loom::log::failExitWhenStdoutIsLost("loom-topo");
  std::string file, dump;
  int hosts = 1, ranksPerHost = 0, maxChannels = 16, ranksPerCore = 0;
  bool paths = true, predict = true, graphLinks = false;
  std::string coll = "allreduce";
  long long minBytes = 8, maxBytes = 268435456, factor = 4;
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
    else if (a == "--hosts" || a == "--ranks-per-host" || a == "--max-channels" ||
             a == "--ranks-per-core") {
      // 0 for --ranks-per-host and --ranks-per-core: from the topology and the cores.
      const bool hostsArg = a == "--hosts", channels = a == "--max-channels";
      const long long lo = hostsArg || channels ? 1 : 0, hi = hostsArg ? 4096 : 1024;
      int* out = hostsArg                  ? &hosts
                 : channels                ? &maxChannels
                 : a == "--ranks-per-host" ? &ranksPerHost
                                           : &ranksPerCore;
      const char* v = next();
      long long x = 0;
      if (!parseCount(v, &x) || x < lo || x > hi) {
        std::fprintf(stderr, "loom-topo: %s: '%s' is not a whole number in [%lld, %lld]\n",
                     a.c_str(), v, lo, hi);
        return 2;
      }
      *out = static_cast<int>(x);
    } else if (a == "--no-paths")
      paths = false;
    else if (a == "--graph")
      graphLinks = true;
    else if (a == "--no-predict")
      predict = false;
    else if (a == "--coll")
      coll = next();
    else if (a == "--min-bytes" || a == "--max-bytes" || a == "--factor") {
      long long* out = a == "--min-bytes" ? &minBytes : a == "--max-bytes" ? &maxBytes : &factor;
      const char* v = next();
      if (!parseCount(v, out)) {
        std::fprintf(stderr, "loom-topo: %s: '%s' is not a whole number >= 0\n", a.c_str(), v);
        return 2;
      }
    } else if (a == "-h" || a == "--help") {
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
  algo::Coll collective = algo::Coll::AllReduce;
  bool known = false;
  for (int c = 0; c < algo::Selection::kColls; ++c)
    if (coll == algo::collName(static_cast<algo::Coll>(c)))
      collective = static_cast<algo::Coll>(c), known = true;
  if (!known) {
    std::fprintf(stderr,
                 "loom-topo: --coll: unknown collective '%s' (known: allreduce, broadcast, "
                 "reduce, allgather, reducescatter, alltoall)\n",
                 coll.c_str());
    return 2;
  }
  constexpr long long kMaxBytes = 1ll << 34;  // the direct schedule grows with the size
  if (minBytes < 1 || maxBytes < minBytes || maxBytes > kMaxBytes || factor < 2) {
    std::fprintf(stderr,
                 "loom-topo: --min-bytes must be >= 1, --max-bytes >= --min-bytes and at most "
                 "%lld, and --factor >= 2\n",
                 kMaxBytes);
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
  if (!predict) return 0;
  std::vector<int> hostOf;
  for (const RankPlace& r : ranks.value()) hostOf.push_back(r.host);
  if (ranksPerCore <= 0) {  // as Comm counts them: the ranks over the cores they may use
    cpu_set_t mask;
    CPU_ZERO(&mask);
    const int cores = sched_getaffinity(0, sizeof(mask), &mask) == 0 ? CPU_COUNT(&mask) : 1;
    ranksPerCore = std::max(1, (ranksPerHost + cores - 1) / std::max(cores, 1));
  }
  return printPredictions(collective, hostOf, hosts, ranksPerHost, ranksPerCore,
                          static_cast<size_t>(minBytes), static_cast<size_t>(maxBytes),
                          static_cast<size_t>(factor), graphLinks ? &s : nullptr, ranks.value());
}
