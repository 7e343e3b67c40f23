#include "transport/tcp/tcp_setup.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>

#include "transport/tcp/tcp_connection.h"
#include "util/log.h"
#include "util/wait.h"

namespace loom::transport {
namespace {

constexpr uint32_t kHelloMagic = 0x4c4d5443;  // "LMTC"
constexpr size_t kSecretBytes = 32;

struct Hello {
  uint32_t magic;
  uint32_t rank;
  uint64_t commHash;
  char secret[kSecretBytes];
};

Status sysError(const std::string& what) {
  return LOOM_ERROR(loomSystemError, what + ": " + std::strerror(errno));
}

std::string addrText(const sockaddr_in& a) {
  char ip[INET_ADDRSTRLEN] = "?";
  inet_ntop(AF_INET, &a.sin_addr, ip, sizeof(ip));
  return std::string(ip) + ":" + std::to_string(ntohs(a.sin_port));
}

void tune(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

Status checkWait(int64_t deadlineNs, const std::atomic<bool>* abortFlag, const char* what) {
  if (abortFlag != nullptr && abortFlag->load()) return LOOM_ERROR(loomInternalError, "aborted");
  if (nowNs() > deadlineNs)
    return LOOM_ERROR(loomTimeout, std::string("TCP transport set-up timed out ") + what);
  return Status::ok();
}

// Connects (retrying while the peer is not listening yet) and sends the hello.
Result<int> connectOne(const TcpPeer& p, const Hello& hello, int64_t deadlineNs,
                       const std::atomic<bool>* abortFlag) {
  for (;;) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return sysError("socket");
    if (connect(fd, reinterpret_cast<const sockaddr*>(&p.addr), sizeof(p.addr)) == 0) {
      tune(fd);
      if (send(fd, &hello, sizeof(hello), MSG_NOSIGNAL) != static_cast<ssize_t>(sizeof(hello))) {
        close(fd);
        return LOOM_ERROR(loomRemoteError,
                          "rank " + std::to_string(p.rank) + " at " + addrText(p.addr) +
                              " dropped the TCP transport handshake");
      }
      return fd;
    }
    int err = errno;
    close(fd);
    if (err != ECONNREFUSED && err != EINTR && err != ETIMEDOUT)
      return LOOM_ERROR(loomSystemError, "connect to rank " + std::to_string(p.rank) + " at " +
                                             addrText(p.addr) + ": " + std::strerror(err));
    LOOM_CHECK(checkWait(deadlineNs, abortFlag, "connecting"));
    usleep(10000);
  }
}

}  // namespace

Result<std::unique_ptr<TcpListener>> TcpListener::open(const std::string& ip) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return sysError("socket");
  sockaddr_in a{};
  a.sin_family = AF_INET;
  if (inet_pton(AF_INET, ip.c_str(), &a.sin_addr) != 1) {
    close(fd);
    return LOOM_ERROR(loomInvalidArgument, "not an IPv4 address: " + ip);
  }
  // Reusable, so that loomCommShrink's root can listen on this port once this listener is
  // closed, even while connections it accepted are still open (src/api/shrink.cc).
  const int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || listen(fd, SOMAXCONN) != 0) {
    Status s = sysError("bind/listen on " + ip);
    close(fd);
    return s;
  }
  socklen_t len = sizeof(a);
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  return std::unique_ptr<TcpListener>(new TcpListener(fd, a));
}

TcpListener::~TcpListener() { close(fd_); }

Result<std::vector<std::unique_ptr<Connection>>> connectTcp(
    int rank, const std::vector<TcpPeer>& peers, TcpListener& listener, const std::string& secret,
    uint64_t commHash, size_t slotBytes, size_t depth, int64_t deadlineNs,
    const std::atomic<bool>* abortFlag) {
  std::vector<std::unique_ptr<Connection>> conns;
  Hello hello{};
  hello.magic = kHelloMagic;
  hello.rank = static_cast<uint32_t>(rank);
  hello.commHash = commHash;
  std::memcpy(hello.secret, secret.data(), std::min(secret.size(), kSecretBytes));

  std::map<int, bool> expected;  // lower ranks that must connect to us
  for (const TcpPeer& p : peers) {
    if (p.rank > rank) {
      LOOM_ASSIGN(int fd, connectOne(p, hello, deadlineNs, abortFlag));
      fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
      conns.push_back(std::make_unique<TcpConnection>(p.rank, fd, p.watchOnly ? 64 : slotBytes,
                                                      p.watchOnly ? 2 : depth));
    } else {
      expected[p.rank] = false;
    }
  }

  struct Pending {
    int fd;
    Hello hello;
    size_t got;
    int64_t since;
    std::string from;
  };
  std::vector<Pending> pending;
  size_t accepted = 0;
  auto drop = [&](size_t i, const char* why) {
    LOOM_WARN(kTransport, "rejected a TCP transport connection from %s: %s",
              pending[i].from.c_str(), why);
    close(pending[i].fd);
    pending.erase(pending.begin() + static_cast<long>(i));
  };
  while (accepted < expected.size()) {
    Status w = checkWait(deadlineNs, abortFlag, "waiting for lower ranks to connect");
    if (!w.isOk()) {
      for (auto& p : pending) close(p.fd);
      std::string missing;
      for (auto& [r, ok] : expected)
        if (!ok) missing += " " + std::to_string(r);
      return w.prefix("rank " + std::to_string(rank) + " (missing ranks:" + missing + "): ");
    }
    std::vector<pollfd> fds{{listener.fd(), POLLIN, 0}};
    for (auto& p : pending) fds.push_back({p.fd, POLLIN, 0});
    poll(fds.data(), fds.size(), 100);
    if (fds[0].revents & POLLIN) {
      sockaddr_in from{};
      socklen_t len = sizeof(from);
      int fd = accept4(listener.fd(), reinterpret_cast<sockaddr*>(&from), &len,
                       SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd >= 0) pending.push_back({fd, Hello{}, 0, nowNs(), addrText(from)});
    }
    for (size_t i = pending.size(); i-- > 0;) {
      Pending& p = pending[i];
      ssize_t r = recv(p.fd, reinterpret_cast<char*>(&p.hello) + p.got, sizeof(Hello) - p.got, 0);
      if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) {
        drop(i, "closed before completing the handshake");
        continue;
      }
      if (r > 0) p.got += static_cast<size_t>(r);
      if (p.got < sizeof(Hello)) {
        if (nowNs() - p.since > 5'000'000'000LL) drop(i, "handshake incomplete after 5 s");
        continue;
      }
      int from = static_cast<int>(p.hello.rank);
      if (p.hello.magic != kHelloMagic) {
        drop(i, "bad magic");
      } else if (p.hello.commHash != commHash ||
                 std::memcmp(p.hello.secret, hello.secret, kSecretBytes) != 0) {
        drop(i, "wrong communicator secret");
      } else if (expected.count(from) == 0 || expected[from]) {
        drop(i, "unexpected rank");
      } else {
        expected[from] = true;
        ++accepted;
        tune(p.fd);
        const bool watch = std::any_of(peers.begin(), peers.end(), [from](const TcpPeer& q) {
          return q.rank == from && q.watchOnly;
        });
        conns.push_back(std::make_unique<TcpConnection>(from, p.fd, watch ? 64 : slotBytes,
                                                        watch ? 2 : depth));
        pending.erase(pending.begin() + static_cast<long>(i));
      }
    }
  }
  for (auto& p : pending) close(p.fd);
  LOOM_INFO(kTransport, "tcp: %zu peers connected", conns.size());
  return conns;
}

}  // namespace loom::transport
