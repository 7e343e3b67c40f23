// The communicator's system graph: every rank's host, merged into one topo::System.
//
// gatherSystem() is collective over the communicator's ranks and runs once, inside
// Comm::create, after the connections exist. On each host only the lowest rank of the
// host describes it (LOOM_TOPO_FILE, else detection, cached per process, so several
// communicators or loomCommInitAll's ranks detect once); the descriptions travel
// through the bootstrap ring as a length-prefixed exchange (one all-gather of sizes,
// one of blobs padded to the largest) and every rank merges them with
// topo::mergeHosts(). Hosts appear in order of their lowest rank, the order in which
// the tuner numbers hosts.
//
// A topology problem never fails the communicator: a host that cannot be described
// (detection failed, an unreadable LOOM_TOPO_FILE) or LOOM_TOPO_DISABLE=1 on any rank
// leaves every rank without a graph (nullptr), logged at INFO. Only a failure of the
// bootstrap itself is returned, since the communicator cannot work without it.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "util/status.h"

namespace loom::bootstrap {
class Bootstrap;
}
namespace loom::topo {
class System;
}

namespace loom {

class Comm;

// The same for a communicator under construction (its bootstrap and peers' hosts).
Result<std::shared_ptr<const topo::System>> gatherSystem(Comm& comm);

// hostOf[r] is rank r's host identity (PeerInfo::host); the strings decide which
// ranks share a host.
Result<std::shared_ptr<const topo::System>> gatherSystem(bootstrap::Bootstrap& bootstrap, int rank,
                                                         const std::vector<std::string>& hostOf);

// The communicator's ring order (Comm::ringOrder) from its graph: algo::commRingOrder, which
// follows NVLink and NICs where every rank has a GPU in the graph and is host-major otherwise
// (always, in a build without topology). `how` says which, for the log.
std::vector<int> commRingOrder(const topo::System* system, const std::vector<int>& hostOf,
                               const std::vector<int>& cudaDev, std::string* how);

// This process's host description (serializeHost of localTopology()), computed once per
// process; the error of the first attempt is kept as well, so a failing detection is not
// retried by every communicator.
Result<std::string> localHostBlob();

}  // namespace loom
