#include "comm/topo_setup.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <mutex>

#include "algorithms/graph_links.h"
#include "bootstrap/bootstrap.h"
#include "comm/comm.h"
#include "topology/topology.h"
#include "util/env.h"
#include "util/log.h"
#include "util/wait.h"

namespace loom {
namespace {

// A stable 64-bit name for a host identity (FNV-1a).
uint64_t hashOf(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char ch : s) h = (h ^ ch) * 1099511628211ull;
  return h;
}

// A blob of size 0 says "nothing from me": this rank is not its host's describer. The
// sentinel says "this host has no description", and so no rank keeps a graph.
constexpr uint64_t kNoTopology = ~uint64_t{0};

}  // namespace

Result<std::string> localHostBlob() {
  static std::once_flag once;
  static Result<std::string> blob = std::string();
  std::call_once(once, [] {
    const int64_t start = nowNs();
    Result<topo::System> sys = topo::localTopology();
    if (sys.isOk()) {
      blob = topo::serializeHost(sys.value());
      LOOM_INFO(kTopo, "this host's topology: %zu bytes of NCCL XML in %.1f ms",
                blob.value().size(), (nowNs() - start) / 1e6);
    } else {
      blob = sys.status();
    }
  });
  return blob;
}

Result<std::shared_ptr<const topo::System>> gatherSystem(bootstrap::Bootstrap& bootstrap, int rank,
                                                         const std::vector<std::string>& hostOf) {
  const size_t n = hostOf.size();
  const std::string& mine = hostOf[static_cast<size_t>(rank)];
  const bool describer = std::find(hostOf.begin(), hostOf.end(), mine) - hostOf.begin() == rank;
  std::string blob;
  uint64_t size = 0;
  if (env::topoDisable()) {
    size = kNoTopology;
  } else if (describer) {
    Result<std::string> local = localHostBlob();
    if (local.isOk()) {
      blob = local.value();
      size = blob.size();
    } else if (!env::topoFile().empty()) {  // asked for by name: say so, once a process
      static std::once_flag warned;
      std::call_once(warned, [&] {
        LOOM_WARN(kTopo, "LOOM_TOPO_FILE: %s; continuing without a system graph",
                  local.status().message().c_str());
      });
      size = kNoTopology;
    } else {
      LOOM_INFO(kTopo, "no topology for this host (%s); continuing without a system graph",
                local.status().message().c_str());
      size = kNoTopology;
    }
  }
  // Step 1: every rank's blob size (or the sentinel).
  std::vector<uint64_t> sizes(n);
  LOOM_CHECK(bootstrap.allGather(&size, sizes.data(), sizeof(size)));
  uint64_t longest = 0;
  for (size_t r = 0; r < n; ++r) {
    if (sizes[r] == kNoTopology) {
      LOOM_INFO(kTopo,
                "rank %zu has no topology (LOOM_TOPO_DISABLE or detection failed): "
                "no system graph",
                r);
      return std::shared_ptr<const topo::System>();
    }
    longest = std::max(longest, sizes[r]);
  }
  if (longest == 0) return std::shared_ptr<const topo::System>();  // no rank described a host
  // Step 2: the blobs, padded to the longest.
  std::vector<char> padded(longest, '\0'), all(longest * n);
  std::memcpy(padded.data(), blob.data(), blob.size());
  LOOM_CHECK(bootstrap.allGather(padded.data(), all.data(), longest));
  std::vector<topo::HostBlob> hosts;
  for (size_t r = 0; r < n; ++r) {
    if (sizes[r] == 0) continue;
    hosts.push_back(topo::HostBlob{hashOf(hostOf[r]), hostOf[r],
                                   std::string(all.data() + r * longest, sizes[r])});
  }
  Result<topo::System> merged = topo::mergeHosts(hosts);
  if (!merged.isOk()) {
    LOOM_INFO(kTopo, "merging the hosts' topologies failed (%s); no system graph",
              merged.status().message().c_str());
    return std::shared_ptr<const topo::System>();
  }
  auto sys = std::make_shared<const topo::System>(merged.take());
  LOOM_INFO(kTopo, "system graph: %zu host(s), %zu GPU(s), %zu NIC port(s)", sys->hosts().size(),
            sys->nodesOf(topo::NodeType::Gpu).size(), sys->nodesOf(topo::NodeType::Net).size());
  return sys;
}

Result<std::shared_ptr<const topo::System>> gatherSystem(Comm& comm) {
  std::vector<std::string> hostOf;
  for (int r = 0; r < comm.nranks(); ++r) hostOf.push_back(comm.peer(r).host);
  return gatherSystem(comm.bootstrap(), comm.rank(), hostOf);
}

std::vector<int> commRingOrder(const topo::System* system, const std::vector<int>& hostOf,
                               const std::vector<int>& cudaDev, std::string* how) {
  algo::RingOrderChoice c = algo::commRingOrder(system, hostOf, cudaDev);
  *how = std::move(c.how);
  return std::move(c.order);
}

}  // namespace loom
