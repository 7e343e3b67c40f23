// Setting up TCP connections: a listener per rank, opened before the
// bootstrap so its address can be published, and an authenticated handshake.
//
// Rank i connects to every TCP peer j > i and accepts every j < i. Every
// connection opens with util/auth.h's handshake (the one the bootstrap speaks too), context
// "loom/tcp/1", magics "LMTN" (challenge), "LMTC" (hello) and "LMTA" (answer); the hello's
// wire fields are the connecting rank (u32) and the communicator hash (u64), and its MAC
// covers the connecting rank, the accepting rank and the hash. An accepted connection whose
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

// TCP among ranks: SetupArgs::peers are the ranks to connect with, each of which must be in
// `addresses` (where it listens, and whether its link only watches). `listener` is this rank's,
// opened before the bootstrap so that its address could be published; `secret` is the
// communicator's, which the handshakes prove.
class TcpTransport final : public Transport {
 public:
  TcpTransport(TcpListener& listener, std::string secret, std::vector<TcpPeer> addresses)
      : listener_(listener), secret_(std::move(secret)), addresses_(std::move(addresses)) {}
  Kind kind() const override { return Kind::Tcp; }
  Result<Links> connect(const SetupArgs& args) override;

 private:
  TcpListener& listener_;
  std::string secret_;
  std::vector<TcpPeer> addresses_;
};

}  // namespace loom::transport
