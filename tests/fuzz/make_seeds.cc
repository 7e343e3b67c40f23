// Writes the seed corpora of the wire-format fuzz targets from what the library itself
// produces: ids from encodeUniqueId/makeUniqueIdFor, PeerInfo::encode blobs, hellos laid out
// by wire.h's encoders as a rank sends them, the replies of a real rendezvous root (runRoot)
// to a rank that answers its challenge, and frames written by a real TcpConnection.
// Usage: make_fuzz_seeds DIR (writes DIR/<target>/<seed>). Topology and trace seeds are copies of
// tests/data files.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <thread>

#include "bootstrap/unique_id.h"
#include "bootstrap/wire.h"
#include "comm/comm.h"
#include "forged_frames.h"
#include "fuzz_net.h"
#include "transport/tcp/tcp_connection.h"
#include "util/cpus.h"
#include "util/net.h"

using namespace loom;
using namespace loom::bootstrap;
namespace auth = loom::auth;

namespace {

std::string gDir;

void write(const std::string& target, const std::string& name, const std::string& bytes) {
  std::string dir = gDir + "/" + target;
  mkdir(gDir.c_str(), 0755);
  mkdir(dir.c_str(), 0755);
  std::ofstream(dir + "/" + name, std::ios::binary) << bytes;
}

sockaddr_in loopback(uint16_t port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(port);
  return a;
}

std::string peerInfo(int cudaDev) {
  PeerInfo p;
  p.host = net::hostIdentity();
  p.pid = getpid();
  p.tcpAddr = loopback(40123);
  p.cudaDev = cudaDev;
  p.cpuMask = cpus::allowed();
  return p.encode();
}

// A root hello as Ring::exchangeWithRoot lays it out. `sign`: its nonce's first byte is even,
// so the bootstrap_root target writes the right MAC for its root's challenge; otherwise the MAC
// is one made with a wrong secret for some other challenge.
std::string hello(bool sign, int rank, int nranks, const std::string& info, uint32_t infoLen) {
  std::string fields;
  put32(fields, static_cast<uint32_t>(rank));
  put32(fields, static_cast<uint32_t>(nranks));
  putAddr(fields, loopback(40124));
  put32(fields, infoLen);
  fields += info;
  auth::Nonce challenge{}, nonce{};
  (void)auth::randomBytes(challenge.data(), challenge.size());
  (void)auth::randomBytes(nonce.data(), nonce.size());
  nonce[0] = static_cast<unsigned char>(sign ? nonce[0] & ~1u : nonce[0] | 1u);
  auto h =
      helloFrame(kHelloMagic, kRootContext, sign ? loomfuzz::fuzzSecret() : std::string(32, 'x'),
                 challenge.data(), nonce, fields, fields);
  return h.isOk() ? h.value() : std::string();
}

// What a real root answers after its challenge to a rank that answers it properly (a signed
// hello of these fields): its proof, then the table or a refusal. The proof's first MAC byte is
// made even, so the bootstrap_reply target signs it for its own transcript.
std::string rootReply(int rank, int nranks, const std::string& info) {
  sockaddr_in addr{};
  int fd = loomfuzz::listenLoopback(&addr);
  std::atomic<bool> stop{false};
  std::thread root([&] { (void)runRoot(fd, loomfuzz::fuzzSecret(), 3000, &stop); });
  int c = loomfuzz::dial(addr);
  std::string challenge, reply;
  loomfuzz::readExactly(c, &challenge, kChallengeBytes, loomfuzz::after(1000));
  if (challenge.size() == kChallengeBytes) {
    std::string fields;
    put32(fields, static_cast<uint32_t>(rank));
    put32(fields, static_cast<uint32_t>(nranks));
    putAddr(fields, loopback(40124));
    put32(fields, static_cast<uint32_t>(info.size()));
    fields += info;
    auth::Nonce nonce{};
    (void)auth::randomBytes(nonce.data(), nonce.size());
    auto h = helloFrame(kHelloMagic, kRootContext, loomfuzz::fuzzSecret(),
                        reinterpret_cast<const unsigned char*>(challenge.data()) + 4, nonce, fields,
                        fields);
    if (h.isOk()) loomfuzz::sendAll(c, h.value(), loomfuzz::after(1000));
    loomfuzz::readUntilClosed(c, &reply, loomfuzz::after(1000));
  }
  close(c);
  stop.store(true);
  int wake = loomfuzz::dial(addr);
  root.join();
  if (wake >= 0) close(wake);
  if (reply.size() > 4) reply[4] = static_cast<char>(reply[4] & ~1);
  return reply;
}

// A TCP transport hello (tcp_setup.h) from `rank` with hash `hash`, its MAC left for the
// tcp_handshake target to sign (`sign`: the nonce's first byte even) or junk (odd).
std::string tcpHello(bool sign, uint32_t rank, uint64_t hash) {
  std::string h;
  put32(h, 0x43544d4cu);  // "LMTC"
  auth::Nonce nonce{};
  (void)auth::randomBytes(nonce.data(), nonce.size());
  nonce[0] = static_cast<unsigned char>(sign ? nonce[0] & ~1u : nonce[0] | 1u);
  h.append(reinterpret_cast<const char*>(nonce.data()), nonce.size());
  h += std::string(auth::kMacBytes, '\x5a');
  put32(h, rank);
  put32(h, static_cast<uint32_t>(hash));
  put32(h, static_cast<uint32_t>(hash >> 32));
  return h;
}

// The bytes a real TcpConnection writes for these payloads, after the fuzz target's
// configuration byte (slot size, depth, write piece).
std::string frames(unsigned char config, size_t slotBytes,
                   const std::vector<std::string>& payloads) {
  int sv[2];
  socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv);
  transport::TcpConnection conn(1, sv[0], slotBytes, payloads.size());
  uint64_t seq = 1;
  for (const std::string& p : payloads) {
    transport::Stamp s;
    s.seq = seq++;
    s.earliestNs = 1000 * static_cast<int64_t>(seq);
    s.latestNs = 2000 * static_cast<int64_t>(seq);
    s.earliestRank = 0;
    s.latestRank = 1;
    if (seq % 2 == 1) {  // every other frame a message's (the odd field values of a head)
      s.message = transport::kMessageHead;
      s.tag = -7;
      s.messageBytes = p.size();
    }
    conn.stampNext(s);
    memcpy(conn.trySendSlot(), p.data(), p.size());
    conn.postSend(p.size());
  }
  while (!conn.flushed()) (void)conn.progress();
  shutdown(sv[1], SHUT_WR);
  std::string out(1, static_cast<char>(config));
  char buf[4096];
  ssize_t n;
  while ((n = recv(sv[1], buf, sizeof(buf), MSG_DONTWAIT)) > 0)
    out.append(buf, static_cast<size_t>(n));
  close(sv[1]);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 1;
  }
  gDir = argv[1];
  setenv("LOOM_DEBUG", "NONE", 1);
  const std::string& secret = loomfuzz::fuzzSecret();

  // unique_id: a local id and a LOOM_COMM_ID one.
  IdContents c;
  c.root = loopback(29500);
  c.secret = secret;
  loomUniqueId id;
  encodeUniqueId(c, &id);
  write("unique_id", "local", std::string(id.internal, sizeof(id.internal)));
  if (makeUniqueIdFor("127.0.0.1:29500", "LOOM_COMM_ID", &id).isOk())
    write("unique_id", "comm_id", std::string(id.internal, sizeof(id.internal)));

  // peer_info: blobs as ranks publish them.
  write("peer_info", "host", peerInfo(-1));
  write("peer_info", "gpu", peerInfo(3));

  // bootstrap_root: what ranks and strangers send to the root after its challenge ("LMFZ"
  // separates connections).
  const std::string info = peerInfo(-1);
  const uint32_t n = static_cast<uint32_t>(info.size());
  write("bootstrap_root", "one_rank", hello(true, 0, 1, info, n));
  write("bootstrap_root", "two_ranks",
        hello(true, 0, 2, info, n) + "LMFZ" + hello(true, 1, 2, info, n));
  write("bootstrap_root", "duplicate_rank",
        hello(true, 0, 2, info, n) + "LMFZ" + hello(true, 0, 2, info, n));
  write("bootstrap_root", "wrong_nranks",
        hello(true, 0, 2, info, n) + "LMFZ" + hello(true, 1, 3, info, n));
  write("bootstrap_root", "rank_out_of_range", hello(true, 5, 2, "", 0));
  write("bootstrap_root", "regression-huge-nranks", hello(true, 0, 0x7fffffff, "", 0));
  write("bootstrap_root", "wrong_secret", hello(false, 0, 1, info, n));
  write("bootstrap_root", "half_hello", hello(true, 0, 1, info, n).substr(0, 30));
  write("bootstrap_root", "huge_info", hello(true, 0, 1, "", 0xffffffffu));

  // bootstrap_reply: a real root's proof and table or refusal; a proof that is not signed.
  write("bootstrap_reply", "table", rootReply(0, 1, info));
  write("bootstrap_reply", "refused_rank", rootReply(5, 2, ""));
  std::string unsigned_ = rootReply(0, 1, "");
  if (unsigned_.size() > 4) unsigned_[4] = static_cast<char>(unsigned_[4] | 1);
  write("bootstrap_reply", "wrong_proof", unsigned_);

  // tcp_handshake: strangers at rank 1's transport listener ("LMFZ" separates them). The
  // target's communicator hash is 0x6c6f6f6d2d667a7a.
  const uint64_t hash = 0x6c6f6f6d2d667a7aull;
  write("tcp_handshake", "takes_rank_0", tcpHello(true, 0, hash));
  write("tcp_handshake", "unexpected_rank", tcpHello(true, 5, hash));
  write("tcp_handshake", "wrong_hash", tcpHello(true, 0, hash ^ 1));
  write("tcp_handshake", "wrong_mac", tcpHello(false, 0, hash));
  write("tcp_handshake", "half_then_rank_0",
        tcpHello(true, 0, hash).substr(0, 30) + "LMFZ" + tcpHello(true, 0, hash));
  write("tcp_handshake", "garbage_and_silence", std::string(100, '\x33') + "LMFZ");

  // tcp_frame: a real connection's frames; slots of 64 bytes, depth 4 (config byte 0x2d).
  write("tcp_frame", "frames",
        frames(0x2d, 64, {"", std::string(64, 'a'), "clock", std::string(17, '\0')}));
  write("tcp_frame", "one", frames(0x03, 4096, {std::string(100, 'z')}));
  return 0;
}
