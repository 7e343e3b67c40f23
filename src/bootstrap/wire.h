// Wire formats and waits shared by the rendezvous root (unique_id.cc) and the
// ring (bootstrap.cc); internal to src/bootstrap.
//
// Every wait runs an io_context one handler at a time, in slices of at most
// kSlice, so the deadline and the abort flags are looked at between slices.
// Handlers refer to state that outlives them: after a failure the sockets are
// closed and the io_context is run dry (drain) before that state goes away.
//
// Wire formats (integers little-endian; IPv4 address and port as in sockaddr_in). Every
// connection opens with util/auth.h's handshake (kRootProtocol, kRingProtocol; the TCP
// transport speaks the same one); the listener speaks first:
//   challenge  root/ring listener -> connector   magic "LMBC", nonce[32]
//   hello      rank -> root  magic "LMBH", nonce[32], mac[32], rank, nranks, ring ip[4],
//                            ring port[2], pad[2], infoLen, info[infoLen]
//              mac: context "loom/bootstrap/root/1", fields = the hello from rank to the end
//   proof      root -> rank  magic "LMBP", mac[32] (the acceptor's MAC over the same fields),
//                            sent in one write with the table or the refusal
//   table      root -> rank  magic "LMBT", nranks, bodyLen, then per rank:
//                            ip[4], port[2], pad[2], infoLen, info[infoLen]
//   refusal    root -> rank  magic "LMBX", loomResult_t code, msgLen, msg[msgLen]
//   leave      rank -> root  one byte, kLeaveTimeout or kLeaveAborted, then the rank shuts its
//                            side down: a rank that gives up before the table came. The root
//                            then gives up too, refusing every rank that joined (the leaver
//                            included) with who never came. A joined rank's connection that
//                            closes without the byte is taken the same way.
//   ring       rank -> next  magic "LMBR", nonce[32], mac[32], rank; answered by magic "LMBA",
//                            mac[32]; context "loom/bootstrap/ring/1", fields = rank, the
//                            listener's rank, nranks
// A connection whose hello fails its MAC is closed without a word; the root sends a proof
// (and then anything) only to a rank whose MAC it checked.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>

#include <algorithm>
#include <atomic>
#include <boost/asio.hpp>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>

#include "bootstrap/bootstrap.h"
#include "util/auth.h"
#include "util/status.h"

namespace loom::bootstrap {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;
using boost::system::error_code;

constexpr uint32_t kChallengeMagic = 0x43424d4cu;  // "LMBC"
constexpr uint32_t kHelloMagic = 0x48424d4cu;      // "LMBH"
constexpr uint32_t kProofMagic = 0x50424d4cu;      // "LMBP"
constexpr uint32_t kTableMagic = 0x54424d4cu;      // "LMBT"
constexpr uint32_t kRefusalMagic = 0x58424d4cu;    // "LMBX"
constexpr uint32_t kRingMagic = 0x52424d4cu;       // "LMBR"
constexpr uint32_t kRingAckMagic = 0x41424d4cu;    // "LMBA"
constexpr char kRootContext[] = "loom/bootstrap/root/1";
constexpr char kRingContext[] = "loom/bootstrap/ring/1";
constexpr auth::Protocol kRootProtocol{kRootContext, kChallengeMagic, kHelloMagic, kProofMagic};
constexpr auth::Protocol kRingProtocol{kRingContext, kChallengeMagic, kRingMagic, kRingAckMagic};
constexpr size_t kChallengeBytes = 4 + auth::kNonceBytes;  // also the proof and the ring answer
constexpr size_t kOffNonce = 4, kOffMac = 4 + auth::kNonceBytes;
constexpr size_t kOffFields = kOffMac + auth::kMacBytes;  // where a hello's plain fields start
constexpr size_t kHelloBytes = kOffFields + 20;           // rank, nranks, address, infoLen
constexpr size_t kReplyHeaderBytes = 12;
constexpr size_t kEntryBytes = 12;
constexpr size_t kRingHelloBytes = kOffFields + 4;
constexpr size_t kMaxRefusalBytes = 4096;
constexpr unsigned char kLeaveTimeout = 1, kLeaveAborted = 2;
constexpr std::chrono::milliseconds kSlice(100);
constexpr std::chrono::milliseconds kRetryDelay(50);
constexpr std::chrono::milliseconds kHandshake(5000);  // a connection's hello must arrive by then

using auth::get32;
using auth::put32;
inline void putAddr(std::string& s, const sockaddr_in& a) {
  s.append(reinterpret_cast<const char*>(&a.sin_addr.s_addr), 4);
  s.append(reinterpret_cast<const char*>(&a.sin_port), 2);
  s.append(2, '\0');
}
inline sockaddr_in getAddr(const unsigned char* p) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  std::memcpy(&a.sin_addr.s_addr, p, 4);
  std::memcpy(&a.sin_port, p + 4, 2);
  return a;
}
inline tcp::endpoint toEndpoint(const sockaddr_in& a) {
  return tcp::endpoint(asio::ip::address_v4(ntohl(a.sin_addr.s_addr)), ntohs(a.sin_port));
}
inline sockaddr_in fromEndpoint(const tcp::endpoint& ep) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(ep.address().to_v4().to_uint());
  a.sin_port = htons(ep.port());
  return a;
}
inline std::string remoteOf(const tcp::socket& s) {
  error_code ec;
  tcp::endpoint ep = s.remote_endpoint(ec);
  return ec ? std::string("an unknown address")
            : ep.address().to_string() + ":" + std::to_string(ep.port());
}
inline bool peerClosed(const error_code& ec) {
  return ec == asio::error::eof || ec == asio::error::connection_reset ||
         ec == asio::error::broken_pipe || ec == asio::error::connection_aborted;
}
inline bool retryableConnect(const error_code& ec) {
  return ec == asio::error::connection_refused || ec == asio::error::connection_reset ||
         ec == asio::error::timed_out || ec == asio::error::connection_aborted;
}
inline int64_t msCount(Clock::duration d) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(d).count();
}
inline std::string msString(Clock::duration d) { return std::to_string(msCount(d)) + " ms"; }

// A root hello's MAC'd fields: rank, nranks, ring address, infoLen, then info.
inline std::string rootFields(int rank, int nranks, const sockaddr_in& ring,
                              const std::string& info) {
  std::string f;
  put32(f, static_cast<uint32_t>(rank));
  put32(f, static_cast<uint32_t>(nranks));
  putAddr(f, ring);
  put32(f, static_cast<uint32_t>(info.size()));
  return f + info;
}
// A ring hello's MAC'd fields: the connecting rank, the listening rank, nranks.
inline std::string ringFields(int rank, int listener, int nranks) {
  std::string f;
  put32(f, static_cast<uint32_t>(rank));
  put32(f, static_cast<uint32_t>(listener));
  put32(f, static_cast<uint32_t>(nranks));
  return f;
}

// Completion of one asynchronous operation, for waits on a single operation.
struct Pending {
  bool done = false;
  error_code ec;
  size_t bytes = 0;  // what a read or write moved, also when it was cancelled part way
};
struct Done {
  Pending* p;
  void operator()(const error_code& e) const { p->ec = e, p->done = true; }
  void operator()(const error_code& e, size_t n) const { p->ec = e, p->done = true, p->bytes = n; }
};

// What a wait gives up on.
struct Limits {
  std::string who;  // "rank 3", named in the error
  Clock::time_point start;
  Clock::time_point deadline;
  const std::atomic<bool>* abortFlag = nullptr;
  const std::atomic<bool>* aborted = nullptr;
  bool isAborted() const {
    return (abortFlag != nullptr && abortFlag->load()) || (aborted != nullptr && aborted->load());
  }
};

inline Limits makeLimits(std::string who, int64_t timeoutMs, const std::atomic<bool>* abortFlag,
                         const std::atomic<bool>* aborted) {
  Limits lim;
  lim.who = std::move(who);
  lim.start = Clock::now();
  lim.deadline = lim.start + std::chrono::milliseconds(timeoutMs);
  lim.abortFlag = abortFlag;
  lim.aborted = aborted;
  return lim;
}

// Runs io's handlers until done() holds, the deadline passes, or an abort flag is set.
inline Status waitFor(asio::io_context& io, const std::function<bool()>& done, const Limits& lim,
                      const std::function<std::string()>& what) {
  io.restart();
  while (!done()) {
    if (lim.isAborted()) {
      return LOOM_ERROR(loomInvalidUsage,
                        "bootstrap: " + lim.who + " was aborted by loomCommAbort while " + what());
    }
    Clock::time_point now = Clock::now();
    if (now >= lim.deadline) {
      return LOOM_ERROR(loomTimeout, "bootstrap: " + lim.who + " timed out after " +
                                         msString(now - lim.start) + " " + what());
    }
    io.run_one_for(std::min<Clock::duration>(kSlice, lim.deadline - now));
    if (io.stopped() && !done()) {
      return LOOM_ERROR(loomInternalError,
                        "bootstrap: " + lim.who + " had nothing left to wait for " + what());
    }
  }
  return Status::ok();
}

// Runs io until every handler has run; call after closing what they wait on.
inline void drain(asio::io_context& io) {
  io.restart();
  io.run();
}

}  // namespace loom::bootstrap
