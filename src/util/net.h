// Network helpers shared by the bootstrap and the TCP transport: which local
// address to use, and what identifies this host.
#pragma once

#include <netinet/in.h>

#include <string>
#include <vector>

#include "util/status.h"

namespace loom::net {

// A list of names in NCCL's selection syntax, as LOOM_SOCKET_IFNAME and
// LOOM_IB_HCA take it: comma-separated prefixes ("eth,ib"); a leading "^"
// excludes the names listed; a leading "=" matches whole names only. With
// ports, an entry may end in ":N" (a device's port: "mlx5_0:1"), and then
// matches that port only.
struct NameFilter {
  struct Entry {
    std::string name;
    int port = -1;  // -1: any port
  };
  bool exclude = false;
  bool exact = false;
  std::vector<Entry> entries;

  static NameFilter parse(const std::string& text, bool withPorts);
  // Whether `name` (and `port`, -1 when it has none) is selected.
  bool matches(const std::string& name, int port = -1) const;
};

// The IPv4 address Loom listens on and advertises. LOOM_SOCKET_IFNAME selects
// interfaces as NCCL_SOCKET_IFNAME does (comma-separated prefixes; a leading ^
// excludes; a leading = matches names exactly); without it the first up
// non-loopback IPv4 interface is used, else loopback. Returns the address in
// dotted form, e.g. "10.0.0.1".
Result<std::string> localAddress();

// Identifies the host for transport selection: hostname plus the inode of this
// process's network namespace, so ranks in different namespaces count as
// different hosts. Example: "node1/net:4026531840".
std::string hostIdentity();
// The machine part of a host identity (the hostname): network namespaces of one machine are
// different hosts that share its cores. "node1/net:4026531840" -> "node1".
std::string machineOf(const std::string& hostIdentity);

// Parses "host:port" (host may be a name or dotted IPv4) into an address.
// The argument name is used in the error message.
Result<sockaddr_in> parseHostPort(const std::string& hostPort, const char* argName);

std::string toString(const sockaddr_in& addr);  // "10.0.0.1:4242"

// The NUMA node of the CPU this thread runs on, or -1 when unknown.
int currentNumaNode();

// A TCP port on 127.0.0.1 that was free a moment ago (for tests and local launchers), or -1.
int freeLoopbackPort();

}  // namespace loom::net
