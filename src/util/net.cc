#include "util/net.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <sched.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "util/env.h"
#include "util/log.h"

namespace loom::net {
namespace {

struct Candidate {
  std::string name;
  std::string address;
  bool loopback;
};

std::string dotted(const in_addr& a) {
  char buf[INET_ADDRSTRLEN] = {};
  inet_ntop(AF_INET, &a, buf, sizeof(buf));
  return buf;
}

}  // namespace

NameFilter NameFilter::parse(const std::string& text, bool withPorts) {
  NameFilter f;
  size_t pos = 0;
  if (pos < text.size() && text[pos] == '^') {
    f.exclude = true;
    ++pos;
  }
  if (pos < text.size() && text[pos] == '=') {
    f.exact = true;
    ++pos;
  }
  while (pos <= text.size()) {
    size_t comma = text.find(',', pos);
    if (comma == std::string::npos) comma = text.size();
    if (comma > pos) {
      Entry e{text.substr(pos, comma - pos), -1};
      size_t colon = withPorts ? e.name.rfind(':') : std::string::npos;
      if (colon != std::string::npos) {
        char* end = nullptr;
        long port = std::strtol(e.name.c_str() + colon + 1, &end, 10);
        if (colon + 1 < e.name.size() && *end == '\0' && port > 0 && port < 256) {
          e.port = static_cast<int>(port);
          e.name.resize(colon);
        }
      }
      if (!e.name.empty()) f.entries.push_back(std::move(e));
    }
    pos = comma + 1;
  }
  return f;
}

bool NameFilter::matches(const std::string& name, int port) const {
  bool hit = false;
  for (const Entry& e : entries) {
    const bool nameHit = exact ? name == e.name : name.compare(0, e.name.size(), e.name) == 0;
    if (nameHit && (e.port < 0 || port < 0 || e.port == port)) {
      hit = true;
      break;
    }
  }
  return hit != exclude;
}

Result<std::string> localAddress() {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) {
    return LOOM_ERROR(loomSystemError, std::string("getifaddrs failed: ") + std::strerror(errno));
  }
  std::vector<Candidate> up;
  for (ifaddrs* ifa = list; ifa != nullptr; ifa = ifa->ifa_next) {
    if (ifa->ifa_addr == nullptr || ifa->ifa_addr->sa_family != AF_INET) continue;
    if ((ifa->ifa_flags & IFF_UP) == 0) continue;
    const auto* sin = reinterpret_cast<const sockaddr_in*>(ifa->ifa_addr);
    up.push_back({ifa->ifa_name, dotted(sin->sin_addr), (ifa->ifa_flags & IFF_LOOPBACK) != 0});
  }
  freeifaddrs(list);

  const std::string& ifname = env::socketIfname();
  NameFilter spec = NameFilter::parse(ifname, false);
  const Candidate* pick = nullptr;
  // A non-loopback match first; loopback only when nothing else matches.
  for (int pass = 0; pass < 2 && pick == nullptr; ++pass) {
    for (const Candidate& c : up) {
      if (c.loopback != (pass == 1)) continue;
      if (!ifname.empty() && !spec.matches(c.name)) continue;
      pick = &c;
      break;
    }
  }
  if (pick == nullptr) {
    std::string have;
    for (const Candidate& c : up) have += (have.empty() ? "" : ", ") + c.name;
    if (ifname.empty()) {
      return LOOM_ERROR(loomSystemError, "no IPv4 interface is up");
    }
    return LOOM_ERROR(loomInvalidArgument,
                      "LOOM_SOCKET_IFNAME=" + ifname + " matches no IPv4 interface that is up (" +
                          (have.empty() ? std::string("none is up") : "up: " + have) + ")");
  }
  LOOM_INFO(kBootstrap, "using interface %s (%s)", pick->name.c_str(), pick->address.c_str());
  return pick->address;
}

std::string hostIdentity() {
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) != 0) std::strcpy(host, "unknown-host");
  struct stat st {};
  unsigned long long inode = 0;
  if (stat("/proc/self/ns/net", &st) == 0) inode = static_cast<unsigned long long>(st.st_ino);
  return std::string(host) + "/net:" + std::to_string(inode);
}

std::string machineOf(const std::string& hostIdentity) {
  return hostIdentity.substr(0, hostIdentity.rfind("/net:"));
}

Result<sockaddr_in> parseHostPort(const std::string& hostPort, const char* argName) {
  auto bad = [&](const std::string& why) {
    return LOOM_ERROR(loomInvalidArgument,
                      std::string(argName) + "=" + hostPort + ": " + why + " (expected host:port)");
  };
  size_t colon = hostPort.rfind(':');
  if (colon == std::string::npos || colon == 0) return bad("no host");
  std::string host = hostPort.substr(0, colon);
  std::string portText = hostPort.substr(colon + 1);
  if (portText.empty() || portText.size() > 5 ||
      portText.find_first_not_of("0123456789") != std::string::npos) {
    return bad("bad port");
  }
  long port = std::strtol(portText.c_str(), nullptr, 10);
  if (port < 1 || port > 65535) return bad("port out of range");

  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (inet_pton(AF_INET, host.c_str(), &addr.sin_addr) == 1) return addr;

  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int rc = getaddrinfo(host.c_str(), nullptr, &hints, &res);
  if (rc != 0 || res == nullptr) {
    return bad(std::string("cannot resolve host: ") + gai_strerror(rc));
  }
  addr.sin_addr = reinterpret_cast<const sockaddr_in*>(res->ai_addr)->sin_addr;
  freeaddrinfo(res);
  return addr;
}

std::string toString(const sockaddr_in& addr) {
  return dotted(addr.sin_addr) + ":" + std::to_string(ntohs(addr.sin_port));
}

namespace {

// Binds a TCP socket to 127.0.0.1:port (0: the kernel picks); the port bound, or -1.
int bindLoopback(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  socklen_t len = sizeof(addr);
  int bound = -1;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0)
    bound = ntohs(addr.sin_port);
  close(fd);
  return bound;
}

}  // namespace

int freeLoopbackPort() {
  // The port is closed again before its user binds it. A port the kernel hands out (the
  // ephemeral range) can be taken in that moment by any socket that connects or listens on port
  // 0; so the port comes from below that range, where only an explicit bind takes it.
  int low = 32768, high = 60999;
  if (FILE* f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r")) {
    if (fscanf(f, "%d %d", &low, &high) != 2) low = 32768;
    fclose(f);
  }
  constexpr int kFirst = 10000;
  if (low - kFirst >= 1000) {
    const auto ticks = std::chrono::steady_clock::now().time_since_epoch().count();
    const uint64_t seed =
        static_cast<uint64_t>(getpid()) * 0x9E3779B97F4A7C15ull ^ static_cast<uint64_t>(ticks);
    const int span = low - kFirst;
    const int start = static_cast<int>((seed ^ (seed >> 29)) % static_cast<uint64_t>(span));
    for (int i = 0; i < 256; ++i) {
      const int port = bindLoopback(kFirst + (start + i) % span);
      if (port > 0) return port;
    }
  }
  return bindLoopback(0);
}

int currentNumaNode() {
  const int cpu = sched_getcpu();
  if (cpu < 0) return -1;
  const std::string dir = "/sys/devices/system/cpu/cpu" + std::to_string(cpu);
  for (int node = 0; node < 1024; ++node) {
    struct stat st;
    if (stat((dir + "/node" + std::to_string(node)).c_str(), &st) == 0) return node;
  }
  return -1;
}

}  // namespace loom::net
