#include "comm/peer_info.h"

#include <arpa/inet.h>

#include <cstdint>
#include <sstream>

#include "util/cpus.h"

namespace loom {

std::string PeerInfo::encode() const {
  char ip[INET_ADDRSTRLEN] = "";
  inet_ntop(AF_INET, &tcpAddr.sin_addr, ip, sizeof(ip));
  std::ostringstream o;
  o << host << '\n'
    << pid << '\n'
    << ip << '\n'
    << ntohs(tcpAddr.sin_port) << '\n'
    << cudaDev << '\n'
    << (ib ? 1 : 0) << '\n'
    << cpus::formatMask(cpuMask);
  return o.str();
}

Result<PeerInfo> PeerInfo::decode(const std::string& blob) {
  std::istringstream in(blob);
  PeerInfo p;
  std::string ip;
  int port = 0, ib = 0;
  std::string mask;
  if (!std::getline(in, p.host) || !(in >> p.pid >> ip >> port >> p.cudaDev >> ib >> mask) ||
      !cpus::parseMask(mask, &p.cpuMask))
    return LOOM_ERROR(loomInternalError, "malformed peer information in the rendezvous table");
  p.ib = ib != 0;
  p.tcpAddr.sin_family = AF_INET;
  p.tcpAddr.sin_port = htons(static_cast<uint16_t>(port));
  if (inet_pton(AF_INET, ip.c_str(), &p.tcpAddr.sin_addr) != 1)
    return LOOM_ERROR(loomInternalError, "malformed peer address " + ip);
  return p;
}

}  // namespace loom
