// Fuzzes PeerInfo::decode (src/comm/peer_info.cc): every rank's blob in the rendezvous table,
// which the communicator decodes before it trusts any of it (host identity, pid, TCP
// listener address, CUDA device).
//
// Checked besides crashes: what decodes re-encodes (PeerInfo::encode) to a blob that decodes
// to the same fields.
#include <arpa/inet.h>

#include <cstdlib>
#include <string>

#include "comm/peer_info.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  setenv("LOOM_DEBUG", "NONE", 1);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto decoded = loom::PeerInfo::decode(std::string(reinterpret_cast<const char*>(data), size));
  if (!decoded.isOk()) return 0;
  const loom::PeerInfo& a = decoded.value();
  auto again = loom::PeerInfo::decode(a.encode());
  if (!again.isOk()) {
    fprintf(stderr, "encode(decode(blob)) does not decode: %s\n", again.status().message().c_str());
    abort();
  }
  const loom::PeerInfo& b = again.value();
  if (a.host != b.host || a.pid != b.pid || a.cudaDev != b.cudaDev ||
      a.tcpAddr.sin_addr.s_addr != b.tcpAddr.sin_addr.s_addr ||
      a.tcpAddr.sin_port != b.tcpAddr.sin_port || a.ib != b.ib ||
      !CPU_EQUAL(&a.cpuMask, &b.cpuMask)) {
    fprintf(stderr, "encode(decode(blob)) decodes to different fields\n");
    abort();
  }
  return 0;
}
