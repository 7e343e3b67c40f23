// Fuzzes the TCP transport's handshake (transport/tcp/tcp_setup.cc: challenge, hello and answer
// as transport/tcp/tcp_setup.h lays them out). A real TcpTransport runs as rank 1 of 2 on a
// loopback listener, waiting for rank 0. Each input is the bytes of up to three strangers,
// separated by "LMFZ": each reads the challenge, sends its bytes and half-closes. Then a real
// rank 0 (TcpTransport) connects, and the set-up ends.
//
// A hello's MAC answers a fresh nonce no input can know, so the target signs for the input:
// where the bytes are a hello (80 bytes or more, magic "LMTC": magic, nonce, MAC, rank, hash) whose
// nonce's first byte is even, it writes the right MAC for its challenge over the hello's fields
// (rank, the listener's rank, the hash in the hello), as a rank does. Odd nonces keep the input's
// MAC.
//
// Checked besides crashes and sanitizer reports: a stranger that was not signed gets nothing
// but its challenge; a signed hello of rank 0 with the communicator's hash (it proved the
// secret) is taken as rank 0, and then the real rank 0 is not started; otherwise the real rank 0
// connects; either way rank 1's set-up succeeds, and a stranger that was answered got the
// acceptor's MAC over the same transcript.
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "fuzz_net.h"
#include "transport/tcp/tcp_setup.h"
#include "util/auth.h"
#include "util/wait.h"

namespace auth = loom::auth;
using loom::transport::TcpListener;
using loom::transport::TcpPeer;

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  setenv("LOOM_DEBUG", "NONE", 1);  // every stranger is logged as a warning otherwise
  return 0;
}

namespace {

constexpr uint64_t kHash = 0x6c6f6f6d2d667a7aull;
constexpr size_t kFrame32 = 36, kHello = 80, kOffNonce = 4, kOffMac = 36, kOffFields = 68;
constexpr uint32_t kChallengeMagic = 0x4e544d4cu, kHelloMagic = 0x43544d4cu;
constexpr uint32_t kAnswerMagic = 0x41544d4cu;

uint32_t get32(const std::string& s, size_t at) {
  uint32_t v;
  std::memcpy(&v, s.data() + at, 4);
  return v;
}

// The MAC'd fields of the hello in `bytes` for listener rank 1: rank, 1, hash (little-endian).
std::string fieldsOf(const std::string& bytes) {
  std::string f = bytes.substr(kOffFields, 4);
  f.append("\x01\x00\x00\x00", 4);
  return f + bytes.substr(kOffFields + 4, 8);
}

const unsigned char* u8(const std::string& s, size_t at = 0) {
  return reinterpret_cast<const unsigned char*>(s.data()) + at;
}

// Rank `rank` of 2 connects over TCP with the other rank, listening at `peer`.
loom::Result<loom::transport::Links> connectAs(int rank, const sockaddr_in& peer,
                                               TcpListener& listener, const std::string& secret) {
  loom::transport::TcpTransport tcp(listener, secret, {TcpPeer{1 - rank, peer}});
  loom::transport::SetupArgs args;
  args.rank = rank;
  args.peers = {1 - rank};
  args.commHash = kHash;
  args.slotBytes = 256;
  args.depth = 2;
  args.deadlineNs = loom::nowNs() + 3'000'000'000LL;
  return tcp.connect(args);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<std::string> conns =
      loomfuzz::splitConnections(std::string(reinterpret_cast<const char*>(data), size), 3);
  const std::string& secret = loomfuzz::fuzzSecret();
  auto l1 = TcpListener::open("127.0.0.1");
  auto l0 = TcpListener::open("127.0.0.1");
  if (!l1.isOk() || !l0.isOk()) return 0;
  const sockaddr_in addr1 = l1.value()->address(), addr0 = l0.value()->address();

  loom::Result<loom::transport::Links> r1 = loom::Status(loomInternalError, "not run");
  std::thread rank1([&] { r1 = connectAs(1, addr0, *l1.value(), secret); });

  std::vector<int> fds;
  std::vector<std::string> challenges;
  std::vector<bool> signedHello;
  bool tookRankZero = false;
  for (std::string& c : conns) {
    int fd = loomfuzz::dial(addr1);
    if (fd < 0) break;  // rank 1 finished and closed its listener
    std::string ch;
    loomfuzz::readExactly(fd, &ch, kFrame32, loomfuzz::after(1000));
    bool sign = ch.size() == kFrame32 && get32(ch, 0) == kChallengeMagic && c.size() >= kHello &&
                get32(c, 0) == kHelloMagic && (c[kOffNonce] & 1) == 0;
    if (sign) {
      auto mac = auth::handshakeMac(secret, "loom/tcp/1", auth::Side::Connector, u8(ch, 4),
                                    u8(c, kOffNonce), fieldsOf(c));
      sign = mac.isOk();
      if (sign) {
        c.replace(kOffMac, auth::kMacBytes, reinterpret_cast<const char*>(mac.value().data()),
                  auth::kMacBytes);
      }
    }
    // A complete signed hello of rank 0 with the right hash is taken as rank 0.
    uint64_t hash = 0;
    if (sign) std::memcpy(&hash, c.data() + kOffFields + 4, 8);
    if (sign && get32(c, kOffFields) == 0 && hash == kHash) tookRankZero = true;
    loomfuzz::sendAll(fd, c, loomfuzz::after(200));
    shutdown(fd, SHUT_WR);
    fds.push_back(fd);
    challenges.push_back(ch);
    signedHello.push_back(sign);
    if (tookRankZero) break;  // rank 1 has its peers: later strangers would wait in its queue
  }

  loom::Result<loom::transport::Links> r0 = loom::Status(loomInternalError, "not run");
  std::thread rank0([&] {
    if (tookRankZero) return;
    r0 = connectAs(0, addr1, *l0.value(), secret);
  });
  rank1.join();
  rank0.join();
  if (!r1.isOk()) {
    fprintf(stderr, "rank 1's set-up failed: %s\n", r1.status().message().c_str());
    abort();
  }
  if (!tookRankZero && !r0.isOk()) {
    fprintf(stderr, "rank 0's set-up failed with no stranger in its place: %s\n",
            r0.status().message().c_str());
    abort();
  }
  if (r1.isOk()) r1.value().conns.clear();  // closes what was accepted
  if (r0.isOk()) r0.value().conns.clear();
  for (size_t i = 0; i < fds.size(); ++i) {
    // Everything after the challenge (which, on a loaded machine, may come after the target
    // stopped waiting for it: then the stranger was not signed).
    std::string reply = challenges[i];
    loomfuzz::readUntilClosed(fds[i], &reply, loomfuzz::after(1000));
    close(fds[i]);
    if (reply.size() >= kFrame32 && get32(reply, 0) == kChallengeMagic) reply.erase(0, kFrame32);
    if (reply.empty()) continue;
    if (!signedHello[i]) {
      fprintf(stderr, "an unsigned stranger got %zu bytes after its challenge\n", reply.size());
      abort();
    }
    auto want = auth::handshakeMac(secret, "loom/tcp/1", auth::Side::Acceptor, u8(challenges[i], 4),
                                   u8(conns[i], kOffNonce), fieldsOf(conns[i]));
    if (reply.size() < kFrame32 || get32(reply, 0) != kAnswerMagic || !want.isOk() ||
        !auth::sameMac(u8(reply, 4), want.value().data())) {
      fprintf(stderr, "a signed stranger was answered without the acceptor's MAC\n");
      abort();
    }
  }
  return 0;
}
