#include "transport/tcp/tcp_setup.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <optional>

#include "transport/tcp/tcp_connection.h"
#include "util/auth.h"
#include "util/env.h"
#include "util/log.h"
#include "util/wait.h"

namespace loom::transport {
namespace {

// The handshake (util/auth.h): the hello's wire fields are the connecting rank (u32) and the
// communicator hash (u64).
constexpr auth::Protocol kProtocol{"loom/tcp/1", 0x4e544d4c /* "LMTN" */, 0x43544d4c /* "LMTC" */,
                                   0x41544d4c /* "LMTA" */};
constexpr size_t kHelloBytes = auth::kHelloHeadBytes + 12;
constexpr int64_t kHandshakeNs = 5'000'000'000LL;  // an accepted connection's hello by then

// The MAC'd fields of a hello: the connecting rank, the accepting rank, the communicator hash.
std::string fields(int from, int to, uint64_t commHash) {
  std::string f;
  auth::put32(f, static_cast<uint32_t>(from));
  auth::put32(f, static_cast<uint32_t>(to));
  auth::put64(f, commHash);
  return f;
}

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

// A data connection's socket buffers, each way: LOOM_SOCKET_BUFFER_BYTES, set before connect()
// and on the listener (accepted sockets inherit it), so that the handshake advertises a window
// scale that fits. Left to the kernel's autotuning, the buffers settled at random on loopback,
// and the throughput of large messages varied with them from run to run; a fixed size (4 MiB
// by default, 8 MiB once the kernel doubles it) gives the higher throughput in every run
// (docs/journal/perf.md). A size set by hand also turns autotuning off, and the kernel caps it
// at net.core.wmem_max / rmem_max: where those are below the request (212992 by default) the
// buffers stay autotuned, since a small size set by hand is slower than autotuning.
// 0: autotuned.
int socketBufferBytes() {
  static const int bytes = [] {
    const int64_t want = env::socketBufferBytes();
    if (want <= 0) return 0;
    auto limit = [](const char* path) {
      long long v = 0;
      FILE* f = std::fopen(path, "r");
      if (f == nullptr) return 0LL;
      if (std::fscanf(f, "%lld", &v) != 1) v = 0;
      std::fclose(f);
      return v;
    };
    const long long cap =
        std::min(limit("/proc/sys/net/core/wmem_max"), limit("/proc/sys/net/core/rmem_max"));
    if (cap < want) {
      LOOM_INFO(
          kTransport,
          "tcp: socket buffers left to the kernel's autotuning: LOOM_SOCKET_BUFFER_BYTES=%lld "
          "is above net.core.wmem_max / rmem_max (%lld)",
          static_cast<long long>(want), cap);
      return 0;
    }
    return static_cast<int>(std::min<int64_t>(want, 1 << 30));
  }();
  return bytes;
}

void sizeBuffers(int fd) {
  const int b = socketBufferBytes();
  if (b <= 0) return;
  setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &b, sizeof(b));
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &b, sizeof(b));
}

Status checkWait(int64_t deadlineNs, const std::atomic<bool>* abortFlag, const char* what) {
  if (abortFlag != nullptr && abortFlag->load())
    return LOOM_ERROR(loomInvalidUsage, std::string("TCP transport set-up was aborted by "
                                                    "loomCommAbort while ") +
                                            what);
  if (nowNs() > deadlineNs)
    return LOOM_ERROR(loomTimeout, std::string("TCP transport set-up timed out ") + what);
  return Status::ok();
}

// Connects, retrying while the peer is not listening yet; the handshake follows in connectAll.
Result<int> connectOne(const TcpPeer& p, int64_t deadlineNs, const std::atomic<bool>* abortFlag) {
  for (;;) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return sysError("socket");
    sizeBuffers(fd);
    if (connect(fd, reinterpret_cast<const sockaddr*>(&p.addr), sizeof(p.addr)) == 0) {
      tune(fd);
      fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
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

// One connection's handshake, either side. The connector waits for the challenge, sends its
// hello and waits for the answer; the acceptor sends the challenge, waits for the hello and
// sends the answer. Both sides poll all of theirs at once, so no rank waits on another's order.
struct Shake {
  int fd = -1;
  bool outgoing = false;
  const TcpPeer* peer = nullptr;  // outgoing: whom; incoming: set once the hello checks out
  std::string from;               // the remote address, for the log
  int64_t since = 0;
  std::optional<auth::Acceptor> acceptor;    // incoming
  std::optional<auth::Connector> connector;  // outgoing, once the challenge came
  std::string out;                           // bytes still to send
  std::string in;                            // bytes received of the frame awaited
  size_t want = 0;                           // that frame's size
  bool answered = false;                     // acceptor: the answer is queued; done once it is sent
};

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
  sizeBuffers(fd);
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

namespace {

Result<std::vector<std::unique_ptr<Connection>>> connectAll(
    int rank, const std::vector<TcpPeer>& peers, TcpListener& listener, const std::string& secret,
    uint64_t commHash, size_t slotBytes, size_t depth, int64_t deadlineNs,
    const std::atomic<bool>* abortFlag) {
  std::vector<std::unique_ptr<Connection>> conns;
  std::vector<Shake> shakes;
  std::map<int, const TcpPeer*> expected;  // lower ranks that must connect to us
  std::map<int, bool> joined;
  size_t outgoing = 0;
  auto closeAll = [&] {
    for (Shake& sh : shakes) close(sh.fd);
    shakes.clear();
  };
  for (const TcpPeer& p : peers) {
    if (p.rank > rank) {
      Result<int> fd = connectOne(p, deadlineNs, abortFlag);
      if (!fd.isOk()) {
        closeAll();
        return fd.status();
      }
      Shake sh;
      sh.fd = fd.value();
      sh.outgoing = true;
      sh.peer = &p;
      sh.from = addrText(p.addr);
      sh.want = auth::kFrame32Bytes;
      shakes.push_back(std::move(sh));
      ++outgoing;
    } else {
      expected[p.rank] = &p;
    }
  }
  auto finish = [&](Shake& sh) {
    const TcpPeer& p = *sh.peer;
    conns.push_back(std::make_unique<TcpConnection>(p.rank, sh.fd, p.watchOnly ? 64 : slotBytes,
                                                    p.watchOnly ? 2 : depth));
    sh.fd = -1;
  };
  auto drop = [&](Shake& sh, const std::string& why) {
    LOOM_WARN(kTransport, "rejected a TCP transport connection from %s: %s", sh.from.c_str(),
              why.c_str());
    close(sh.fd);
    sh.fd = -1;
  };
  // What a connector learns that ends its set-up: the peer it dialled is not a Loom rank of
  // this communicator.
  auto refused = [&](Shake& sh, const std::string& why) {
    Status s = LOOM_ERROR(loomRemoteError, "rank " + std::to_string(rank) + ": rank " +
                                               std::to_string(sh.peer->rank) + " at " + sh.from +
                                               " " + why);
    closeAll();
    return s;
  };

  // Returns false when an outgoing handshake failed (*failure says why).
  std::function<bool(Shake&, Status*)> step = [&](Shake& sh, Status* failure) -> bool {
    while (!sh.out.empty()) {
      ssize_t w = send(sh.fd, sh.out.data(), sh.out.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      if (w > 0) {
        sh.out.erase(0, static_cast<size_t>(w));
      } else if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
        break;
      } else {
        if (sh.outgoing) {
          *failure = refused(sh, "closed the TCP transport handshake (did it refuse this rank?)");
          return false;
        }
        drop(sh, "closed during the handshake");
        return true;
      }
    }
    if (sh.answered) {
      if (sh.out.empty()) finish(sh);
      return true;
    }
    while (sh.in.size() < sh.want) {
      char buf[128];
      ssize_t r = recv(sh.fd, buf, std::min(sizeof(buf), sh.want - sh.in.size()), MSG_DONTWAIT);
      if (r > 0) {
        sh.in.append(buf, static_cast<size_t>(r));
        continue;
      }
      if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return true;
      if (sh.outgoing) {
        *failure = refused(sh, "closed the TCP transport handshake (did it refuse this rank?)");
        return false;
      }
      drop(sh, "closed before completing the handshake");
      return true;
    }
    const auto* in = reinterpret_cast<const unsigned char*>(sh.in.data());
    if (sh.outgoing && !sh.connector) {  // the challenge: answer it with our hello
      if (!auth::Connector::isChallenge(kProtocol, in)) {
        *failure = refused(sh, "did not open with a Loom TCP transport challenge");
        return false;
      }
      std::string wire;
      auth::put32(wire, static_cast<uint32_t>(rank));
      auth::put64(wire, commHash);
      Result<auth::Connector> c = auth::Connector::answer(
          kProtocol, secret, in, fields(rank, sh.peer->rank, commHash), wire);
      if (!c.isOk()) {
        *failure = c.status();
        closeAll();
        return false;
      }
      sh.connector = c.take();
      sh.out = sh.connector->hello();
      sh.in.clear();
      sh.want = auth::kFrame32Bytes;
      return true;
    }
    if (sh.outgoing) {  // the answer: the acceptor's MAC
      if (!sh.connector->check(in)) {
        *failure = refused(sh,
                           "did not prove that it holds the communicator's secret (a "
                           "stranger listening at its address?)");
        return false;
      }
      finish(sh);
      return true;
    }
    // Acceptor: the hello. Its MAC first; only then are its fields believed.
    const int from = static_cast<int>(auth::get32(in + auth::kHelloHeadBytes));
    const uint64_t theirHash = auth::get64(in + auth::kHelloHeadBytes + 4);
    if (auth::get32(in) != kProtocol.helloMagic) {
      drop(sh, "bad magic");
    } else if (theirHash != commHash || !sh.acceptor->check(in, fields(from, rank, commHash))) {
      drop(sh, "its MAC does not match (another communicator, a stranger, or a replayed hello)");
    } else if (expected.count(from) == 0 || joined[from]) {
      drop(sh, "unexpected rank " + std::to_string(from));
    } else {
      Result<std::string> answer = sh.acceptor->answer();
      if (!answer.isOk()) {
        drop(sh, answer.status().message());
        return true;
      }
      joined[from] = true;
      sh.peer = expected[from];
      sh.out = answer.take();
      sh.answered = true;
      return step(sh, failure);  // sends the answer at once (it fits any socket buffer)
    }
    return true;
  };

  for (;;) {
    shakes.erase(
        std::remove_if(shakes.begin(), shakes.end(), [](const Shake& sh) { return sh.fd < 0; }),
        shakes.end());
    if (conns.size() == outgoing + expected.size()) break;
    Status w = checkWait(deadlineNs, abortFlag, "in the handshakes with its peers");
    if (!w.isOk()) {
      std::string missing;
      for (const Shake& sh : shakes)
        if (sh.outgoing) missing += " " + std::to_string(sh.peer->rank);
      for (auto& [r, p] : expected)
        if (!joined[r]) missing += " " + std::to_string(r);
      closeAll();
      return w.prefix("rank " + std::to_string(rank) + " (missing ranks:" + missing + "): ");
    }
    std::vector<pollfd> fds{{listener.fd(), POLLIN, 0}};
    for (const Shake& sh : shakes)
      fds.push_back({sh.fd, static_cast<short>(POLLIN | (sh.out.empty() ? 0 : POLLOUT)), 0});
    poll(fds.data(), fds.size(), 100);
    if (fds[0].revents & POLLIN) {
      sockaddr_in from{};
      socklen_t len = sizeof(from);
      int fd = accept4(listener.fd(), reinterpret_cast<sockaddr*>(&from), &len,
                       SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd >= 0) {
        tune(fd);
        Shake sh;
        sh.fd = fd;
        sh.from = addrText(from);
        sh.since = nowNs();
        sh.want = kHelloBytes;
        Result<auth::Acceptor> acceptor = auth::Acceptor::start(kProtocol, secret);
        if (!acceptor.isOk()) {
          drop(sh, acceptor.status().message());
        } else {
          sh.acceptor = acceptor.take();
          sh.out = sh.acceptor->challenge();
          shakes.push_back(std::move(sh));
        }
      }
    }
    for (Shake& sh : shakes) {
      if (sh.fd < 0) continue;
      Status failure;
      if (!step(sh, &failure)) return failure;
      if (sh.fd >= 0 && !sh.outgoing && !sh.answered && nowNs() - sh.since > kHandshakeNs)
        drop(sh, "handshake incomplete after 5 s");
    }
  }
  closeAll();
  LOOM_INFO(kTransport, "tcp: %zu peers connected", conns.size());
  return conns;
}

}  // namespace

Result<Links> TcpTransport::connect(const SetupArgs& args) {
  std::vector<TcpPeer> peers;
  for (int r : args.peers) {
    auto it = std::find_if(addresses_.begin(), addresses_.end(),
                           [r](const TcpPeer& p) { return p.rank == r; });
    if (it == addresses_.end())
      return LOOM_ERROR(loomInternalError, "tcp: no address for rank " + std::to_string(r));
    peers.push_back(*it);
  }
  Links links;
  LOOM_ASSIGN(links.conns, connectAll(args.rank, peers, listener_, secret_, args.commHash,
                                      args.slotBytes, args.depth, args.deadlineNs, args.abortFlag));
  return links;
}

}  // namespace loom::transport
