// Built instead of topo_setup.cc when LOOM_TOPOLOGY=OFF: no system graph, as with
// LOOM_TOPO_DISABLE=1 (the tuner does not need one).
#include "algorithms/schedule.h"
#include "comm/topo_setup.h"

namespace loom {

Result<std::shared_ptr<const topo::System>> gatherSystem(Comm&) {
  return std::shared_ptr<const topo::System>();
}

Result<std::shared_ptr<const topo::System>> gatherSystem(bootstrap::Bootstrap&, int,
                                                         const std::vector<std::string>&) {
  return std::shared_ptr<const topo::System>();
}

Result<std::string> localHostBlob() {
  return LOOM_ERROR(loomInvalidUsage, "this build has no topology detection (LOOM_TOPOLOGY=OFF)");
}

std::vector<int> commRingOrder(const topo::System*, const std::vector<int>& hostOf,
                               const std::vector<int>&, std::string* how) {
  *how = "host-major (this build has no topology)";
  return algo::hostMajorOrder(hostOf);
}

}  // namespace loom
