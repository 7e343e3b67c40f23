// Writes the seed corpora of the wire-format fuzz targets from what the library itself
// produces: ids from encodeUniqueId/makeUniqueIdFor, PeerInfo::encode blobs, hellos laid out
// by wire.h's encoders as a rank sends them, the replies of a real rendezvous root (runRoot)
// to such hellos, and frames written by a real TcpConnection. Usage: make_fuzz_seeds DIR
// (writes DIR/<target>/<seed>). Topology and trace seeds are copies of tests/data files.
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
#include "fuzz_net.h"
#include "transport/tcp/tcp_connection.h"
#include "util/net.h"

using namespace loom;
using namespace loom::bootstrap;

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
  return p.encode();
}

// A root hello as Ring::exchangeWithRoot sends it.
std::string hello(const std::string& secret, int rank, int nranks, const std::string& info,
                  uint32_t infoLen) {
  std::string h;
  put32(h, kHelloMagic);
  h += secret;
  put32(h, static_cast<uint32_t>(rank));
  put32(h, static_cast<uint32_t>(nranks));
  putAddr(h, loopback(40124));
  put32(h, infoLen);
  return h + info;
}

// What a real root answers to these connections' bytes (one per connection, in order).
std::string rootReply(const std::string& bytes) {
  sockaddr_in addr{};
  int fd = loomfuzz::listenLoopback(&addr);
  std::atomic<bool> stop{false};
  std::thread root([&] { (void)runRoot(fd, loomfuzz::fuzzSecret(), 3000, &stop); });
  int c = loomfuzz::dial(addr);
  std::string reply;
  loomfuzz::sendAll(c, bytes, loomfuzz::after(1000));
  loomfuzz::readUntilClosed(c, &reply, loomfuzz::after(1000));
  close(c);
  stop.store(true);
  int wake = loomfuzz::dial(addr);
  root.join();
  if (wake >= 0) close(wake);
  return reply;
}

// The bytes a real TcpConnection writes for these payloads, after the fuzz target's
// configuration byte (slot size, depth, write piece).
std::string frames(unsigned char config, size_t slotBytes, const std::vector<std::string>& payloads) {
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
    conn.stampNext(s);
    memcpy(conn.trySendSlot(), p.data(), p.size());
    conn.postSend(p.size());
  }
  while (!conn.flushed()) (void)conn.progress();
  shutdown(sv[1], SHUT_WR);
  std::string out(1, static_cast<char>(config));
  char buf[4096];
  ssize_t n;
  while ((n = recv(sv[1], buf, sizeof(buf), MSG_DONTWAIT)) > 0) out.append(buf, static_cast<size_t>(n));
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

  // bootstrap_root: what ranks and strangers send to the root ("LMFZ" separates connections).
  const std::string info = peerInfo(-1);
  write("bootstrap_root", "one_rank", hello(secret, 0, 1, info, info.size()));
  write("bootstrap_root", "two_ranks",
        hello(secret, 0, 2, info, info.size()) + "LMFZ" + hello(secret, 1, 2, info, info.size()));
  write("bootstrap_root", "duplicate_rank",
        hello(secret, 0, 2, info, info.size()) + "LMFZ" + hello(secret, 0, 2, info, info.size()));
  write("bootstrap_root", "wrong_secret", hello(std::string(32, 'x'), 0, 1, info, info.size()));
  write("bootstrap_root", "half_hello", hello(secret, 0, 1, info, info.size()).substr(0, 30));
  write("bootstrap_root", "huge_info", hello(secret, 0, 1, "", 0xffffffffu));

  // bootstrap_reply: a real root's table and refusals.
  write("bootstrap_reply", "table", rootReply(hello(secret, 0, 1, info, info.size())));
  write("bootstrap_reply", "refused_rank", rootReply(hello(secret, 5, 2, "", 0)));
  write("bootstrap_reply", "refused_info", rootReply(hello(secret, 0, 1, "", 1u << 20)));

  // tcp_frame: a real connection's frames; slots of 64 bytes, depth 4 (config byte 0x2d).
  write("tcp_frame", "frames", frames(0x2d, 64, {"", std::string(64, 'a'), "clock", std::string(17, '\0')}));
  write("tcp_frame", "one", frames(0x03, 4096, {std::string(100, 'z')}));
  return 0;
}
