// What each rank publishes about itself in the rendezvous table, and its text encoding.
// Every other rank decodes the blob before trusting any of it (tests/fuzz/peer_info_fuzz.cc).
#pragma once

#include <netinet/in.h>
#include <sched.h>

#include <string>

#include "util/status.h"

namespace loom {

struct PeerInfo {
  std::string host;  // net::hostIdentity()
  int pid = 0;
  sockaddr_in tcpAddr{};
  int cudaDev = -1;
  bool ib = false;      // has an active RDMA port and may use the ib transport
  cpu_set_t cpuMask{};  // its affinity mask: the CPUs it may run on (sent as cpus::formatMask)

  std::string encode() const;
  static Result<PeerInfo> decode(const std::string& blob);
};

}  // namespace loom
