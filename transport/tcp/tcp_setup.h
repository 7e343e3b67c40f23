// Setting up TCP connections: a listener per rank, opened before the
// bootstrap so its address can be published, and an authenticated handshake.
//
// Rank i connects to every TCP peer j > i and accepts every j < i. Every
// connection opens with util/auth.h's challenge-response (context
// "loom/tcp/1"; integers in host order, both ends being Loom of one build):
//   acceptor  -> connector  challenge {u32 "LMTN", nonce[32]}
//   connector -> acceptor   hello {u32 "LMTC", u32 rank, u64 commHash, nonce[32], mac[32]}
//   acceptor  -> connector  answer {u32 "LMTA", mac[32]}
// The MACs cover both nonces and the fields (connecting rank, accepting rank,
// communicator hash, as little-endian bytes). An accepted connection whose
// hello fails its MAC, names an unexpected rank, or is garbage or a half frame
// is closed and logged, and set-up goes on; a connector whose peer does not
// answer with the right MAC (a stranger at that address) fails with
// loomRemoteError naming the peer. Both sides run every handshake of the rank
// in one poll loop, each bounded by the deadline.
#pragma once

#include <netinet/in.h>

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "transport/transport.h"

namespace loom::transport {

class TcpListener {
 public:
  // Listens on ip (dotted IPv4), an ephemeral port.
  static Result<std::unique_ptr<TcpListener>> open(const std::string& ip);
  ~TcpListener();
  const sockaddr_in& address() const { return addr_; }
  int fd() const { return fd_; }

 private:
  TcpListener(int fd, sockaddr_in addr) : fd_(fd), addr_(addr) {}
  int fd_;
  sockaddr_in addr_;
};

struct TcpPeer {
  int rank;
  sockaddr_in addr;
  bool watchOnly = false;  // carries no data (tiny FIFOs): its closing is the news
};

Result<std::vector<std::unique_ptr<Connection>>> connectTcp(
    int rank, const std::vector<TcpPeer>& peers, TcpListener& listener, const std::string& secret,
    uint64_t commHash, size_t slotBytes, size_t depth, int64_t deadlineNs,
    const std::atomic<bool>* abortFlag);

}  // namespace loom::transport
