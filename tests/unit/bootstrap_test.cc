// Bootstrap tests: ranks are threads of this process, over loopback.
#include "bootstrap/bootstrap.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "bootstrap/unique_id.h"
#include "bootstrap/wire.h"
#include "forged_frames.h"
#include "transport/tcp/tcp_setup.h"
#include "util/auth.h"
#include "util/env.h"
#include "util/net.h"
#include "util/wait.h"

namespace loom::bootstrap {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// Loopback, unless the person running the tests chose an interface.
const bool kUseLoopback = [] { return setenv("LOOM_SOCKET_IFNAME", "lo", 0) == 0; }();

constexpr int64_t kTimeoutMs = 10000;

int64_t msSince(Clock::time_point t) {
  return std::chrono::duration_cast<milliseconds>(Clock::now() - t).count();
}

// Rank r's info blob: its length and bytes depend on r; rank 2's is the largest allowed.
std::string infoFor(int r) {
  size_t len = r == 2 ? kMaxInfoBytes : 1 + 13 * static_cast<size_t>(r);
  std::string s(len, '\0');
  for (size_t i = 0; i < len; ++i) s[i] = static_cast<char>(r * 31 + i * 7);
  return s;
}

struct Joined {
  Status status;
  std::unique_ptr<Bootstrap> boot;
};

Joined joinOne(const loomUniqueId& id, int rank, int nranks, int64_t timeoutMs = kTimeoutMs,
               const std::atomic<bool>* abortFlag = nullptr) {
  auto r = Bootstrap::join(id, rank, nranks, infoFor(rank), timeoutMs, abortFlag);
  Joined j;
  if (r.isOk()) {
    j.boot = r.take();
  } else {
    j.status = r.status();
  }
  return j;
}

// Joins `ranks` of an nranks rendezvous, each from its own thread.
std::vector<Joined> joinRanks(const loomUniqueId& id, int nranks, const std::vector<int>& ranks,
                              int64_t timeoutMs = kTimeoutMs) {
  std::vector<Joined> out(ranks.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < ranks.size(); ++i)
    threads.emplace_back([&, i] { out[i] = joinOne(id, ranks[i], nranks, timeoutMs); });
  for (std::thread& t : threads) t.join();
  return out;
}

std::vector<Joined> joinAll(const loomUniqueId& id, int nranks) {
  std::vector<int> ranks;
  for (int r = 0; r < nranks; ++r) ranks.push_back(r);
  return joinRanks(id, nranks, ranks);
}

loomUniqueId freshId(int64_t rootTimeoutMs = kTimeoutMs) {
  loomUniqueId id;
  Status s = makeLocalUniqueId(&id, rootTimeoutMs);
  EXPECT_TRUE(s.isOk()) << s.message();
  return id;
}

// Runs f(rank) on every rank at once; returns each rank's status.
template <typename F>
std::vector<Status> onEveryRank(std::vector<Joined>& ranks, F f) {
  std::vector<Status> out(ranks.size());
  std::vector<std::thread> threads;
  for (size_t r = 0; r < ranks.size(); ++r)
    threads.emplace_back([&, r] { out[r] = f(*ranks[r].boot); });
  for (std::thread& t : threads) t.join();
  return out;
}

// A blocking client socket for playing a stranger.
int dial(const sockaddr_in& addr) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  if (connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  timeval tv{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  return fd;
}

void sendBytes(int fd, const std::string& bytes) {
  ASSERT_EQ(send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL), static_cast<ssize_t>(bytes.size()));
}

std::string le32(uint32_t v) {
  std::string s;
  for (int i = 0; i < 4; ++i) s.push_back(static_cast<char>(v >> (8 * i)));
  return s;
}
std::string le64(uint64_t v) { return le32(static_cast<uint32_t>(v)) + le32(v >> 32); }

// Everything the peer sends until it closes fd (true), or until 5 s pass without a byte
// (false; dial() sets the receive timeout).
bool readUntilClosed(int fd, std::string* got) {
  char buf[4096];
  for (;;) {
    ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n == 0) return true;
    if (n < 0) return errno == ECONNRESET;
    got->append(buf, static_cast<size_t>(n));
  }
}

// True once the peer has closed fd (reads whatever it sent first).
bool closedByPeer(int fd) {
  std::string ignored;
  return readUntilClosed(fd, &ignored);
}

// Reads exactly n bytes (false on close or timeout).
bool readExactly(int fd, std::string* out, size_t n) {
  out->clear();
  char buf[512];
  while (out->size() < n) {
    ssize_t r = recv(fd, buf, std::min(sizeof(buf), n - out->size()), 0);
    if (r <= 0) return false;
    out->append(buf, static_cast<size_t>(r));
  }
  return true;
}

const unsigned char* bytesOf(const std::string& s) {
  return reinterpret_cast<const unsigned char*>(s.data());
}

// A nonce no listener sent: what a hello answers when it was made for another connection.
auth::Nonce someNonce() {
  auto n = auth::freshNonce();
  EXPECT_TRUE(n.isOk());
  return n.isOk() ? n.value() : auth::Nonce{};
}

sockaddr_in noAddress() {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  return a;
}

// A root hello as wire.h lays it out, answering the listener nonce `challenge`.
std::string rootHello(const std::string& secret, const unsigned char* challenge, int rank,
                      int nranks, const std::string& info, uint32_t infoLen) {
  std::string fields = rootFields(rank, nranks, noAddress(), info);
  std::memcpy(&fields[16], &infoLen, 4);  // little-endian, as put32
  auto h = helloFrame(kHelloMagic, kRootContext, secret, challenge, someNonce(), fields, fields);
  EXPECT_TRUE(h.isOk());
  return h.isOk() ? h.value() : std::string();
}

// A ring hello (rank -> listener) answering the listener nonce `challenge`.
std::string ringHello(const std::string& secret, const unsigned char* challenge, int rank,
                      int listener, int nranks) {
  std::string wire;
  put32(wire, static_cast<uint32_t>(rank));
  auto h = helloFrame(kRingMagic, kRingContext, secret, challenge, someNonce(),
                      ringFields(rank, listener, nranks), wire);
  EXPECT_TRUE(h.isOk());
  return h.isOk() ? h.value() : std::string();
}

// Reads a listener's challenge from fd; its nonce, or "" if fd did not get one.
std::string challengeOn(int fd) {
  std::string ch;
  if (!readExactly(fd, &ch, kChallengeBytes)) return "";
  if (parse32(bytesOf(ch), kChallengeMagic) == nullptr) return "";
  return ch.substr(4);
}

// A loopback listener, for a root or a fake peer run by the test.
int listenLoopback(sockaddr_in* addr) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || listen(fd, 64) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    if (fd >= 0) close(fd);
    return -1;
  }
  *addr = a;
  return fd;
}

// Accepts one connection on listenFd within 10 s (-1 if none); it gets a 5 s receive timeout.
int acceptOne(int listenFd) {
  pollfd p{listenFd, POLLIN, 0};
  if (poll(&p, 1, 10000) <= 0) return -1;
  int fd = accept4(listenFd, nullptr, nullptr, SOCK_CLOEXEC);
  if (fd < 0) return -1;
  timeval tv{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  return fd;
}

// A rendezvous root run by the test with a chosen secret (runRoot, as makeLocalUniqueId runs it).
class TestRoot {
 public:
  TestRoot(const std::string& secret, int64_t timeoutMs) {
    int fd = listenLoopback(&addr_);
    EXPECT_GE(fd, 0);
    thread_ = std::thread([this, fd, secret, timeoutMs] {
      Status ignored = runRoot(fd, secret, timeoutMs, &stop_);
      (void)ignored;
    });
  }
  ~TestRoot() {
    stop_.store(true);
    int wake = dial(addr_);  // the root looks at stop_ between handlers
    thread_.join();
    if (wake >= 0) close(wake);
  }
  const sockaddr_in& address() const { return addr_; }

 private:
  sockaddr_in addr_{};
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

loomUniqueId idFor(const sockaddr_in& root, const std::string& secret) {
  IdContents c;
  c.root = root;
  c.secret = secret;
  loomUniqueId id;
  encodeUniqueId(c, &id);
  return id;
}

// A loopback proxy in front of `target`: it forwards the bytes of the first connection it
// accepts both ways until either side closes, and records what that connection's client sent:
// a capture of a real handshake, as someone on the path would hold it.
class RecordingProxy {
 public:
  explicit RecordingProxy(const sockaddr_in& target) : target_(target) {
    listenFd_ = listenLoopback(&addr_);
    EXPECT_GE(listenFd_, 0);
    thread_ = std::thread([this] { run(); });
  }
  ~RecordingProxy() {
    stop_.store(true);
    thread_.join();
    close(listenFd_);
  }
  const sockaddr_in& address() const { return addr_; }
  std::string recorded() {
    std::lock_guard<std::mutex> lock(mu_);
    return recorded_;
  }

 private:
  void run() {
    int client = -1;
    while (!stop_.load() && client < 0) {
      pollfd p{listenFd_, POLLIN, 0};
      if (poll(&p, 1, 50) > 0) client = accept4(listenFd_, nullptr, nullptr, SOCK_CLOEXEC);
    }
    if (client < 0) return;
    int server = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (connect(server, reinterpret_cast<const sockaddr*>(&target_), sizeof(target_)) != 0) {
      close(server);
      close(client);
      return;
    }
    char buf[65536];
    while (!stop_.load()) {
      pollfd p[2] = {{client, POLLIN, 0}, {server, POLLIN, 0}};
      if (poll(p, 2, 50) <= 0) continue;
      if (p[0].revents) {
        ssize_t n = recv(client, buf, sizeof(buf), 0);
        if (n <= 0) break;
        {
          std::lock_guard<std::mutex> lock(mu_);
          recorded_.append(buf, static_cast<size_t>(n));
        }
        if (send(server, buf, static_cast<size_t>(n), MSG_NOSIGNAL) != n) break;
      }
      if (p[1].revents) {
        ssize_t n = recv(server, buf, sizeof(buf), 0);
        if (n <= 0 || send(client, buf, static_cast<size_t>(n), MSG_NOSIGNAL) != n) break;
      }
    }
    close(server);
    close(client);
  }

  sockaddr_in target_;
  sockaddr_in addr_{};
  int listenFd_ = -1;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  std::mutex mu_;
  std::string recorded_;
};

// What a replay of `bytes` to `a` gets back: it must be a challenge and nothing more, then
// the listener must close the connection.
struct ReplayOutcome {
  bool connected = false;
  bool closed = false;
  std::string got;
};
ReplayOutcome replay(const sockaddr_in& a, const std::string& bytes) {
  ReplayOutcome out;
  int fd = dial(a);
  if (fd < 0) return out;
  out.connected = true;
  (void)!send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
  out.closed = readUntilClosed(fd, &out.got);
  close(fd);
  return out;
}
void expectRefusedReplay(const ReplayOutcome& r, const char* where,
                         uint32_t challengeMagic = kChallengeMagic) {
  EXPECT_TRUE(r.connected) << where;
  EXPECT_TRUE(r.closed) << where << ": the replay was not closed";
  ASSERT_EQ(r.got.size(), kChallengeBytes) << where << ": it was sent more than a challenge";
  EXPECT_NE(parse32(bytesOf(r.got), challengeMagic), nullptr) << where;
}

// ---- Ids, joins, the ring's collectives ----

// The launchers' port comes from below the kernel's ephemeral range, so that no socket that
// connects or listens on port 0 (another test's, in parallel) takes it before rank 0 binds it.
TEST(FreeLoopbackPortTest, IsBelowTheEphemeralRangeAndBindable) {
  int low = 0, high = 0;
  FILE* f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
  if (f == nullptr) GTEST_SKIP() << "no /proc/sys/net/ipv4/ip_local_port_range";
  ASSERT_EQ(fscanf(f, "%d %d", &low, &high), 2);
  fclose(f);
  if (low < 11000) GTEST_SKIP() << "ephemeral range starts at " << low << ": no room below it";
  std::vector<int> seen;
  for (int i = 0; i < 20; ++i) {
    const int port = loom::net::freeLoopbackPort();
    ASSERT_GT(port, 0);
    EXPECT_LT(port, low) << "port " << port << " is in the ephemeral range " << low << "-" << high;
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    ASSERT_GE(fd, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(port));
    EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0) << "port " << port;
    close(fd);
    seen.push_back(port);
  }
  std::sort(seen.begin(), seen.end());
  // Launchers started together must not all get one port.
  EXPECT_GT(std::unique(seen.begin(), seen.end()) - seen.begin(), 10);
}

TEST(UniqueIdTest, RoundTrips) {
  IdContents c;
  c.root.sin_family = AF_INET;
  c.root.sin_addr.s_addr = htonl(0x0a000001);
  c.root.sin_port = htons(4242);
  c.secret = std::string(kSecretBytes, 'x');
  c.secret[3] = '\0';
  c.rootOnRank0 = true;
  loomUniqueId id;
  encodeUniqueId(c, &id);
  auto parsed = parseUniqueId(id);
  ASSERT_TRUE(parsed.isOk()) << parsed.status().message();
  EXPECT_EQ(net::toString(parsed.value().root), "10.0.0.1:4242");
  EXPECT_EQ(parsed.value().secret, c.secret);
  EXPECT_TRUE(parsed.value().rootOnRank0);
}

TEST(UniqueIdTest, EveryCorruptedByteIsRejected) {
  IdContents c;
  c.root.sin_family = AF_INET;
  c.root.sin_addr.s_addr = htonl(0x7f000001);
  c.root.sin_port = htons(1234);
  for (size_t i = 0; i < kSecretBytes; ++i) c.secret.push_back(static_cast<char>(i * 37 + 5));
  loomUniqueId good;
  encodeUniqueId(c, &good);
  ASSERT_TRUE(parseUniqueId(good).isOk());
  for (int i = 0; i < LOOM_UNIQUE_ID_BYTES; ++i) {
    for (unsigned flip : {0x01u, 0x80u, 0xffu}) {
      loomUniqueId bad = good;
      bad.internal[i] = static_cast<char>(bad.internal[i] ^ flip);
      auto parsed = parseUniqueId(bad);
      ASSERT_FALSE(parsed.isOk()) << "byte " << i << " flip " << flip;
      EXPECT_EQ(parsed.status().code(), loomInvalidArgument);
      EXPECT_EQ(parsed.status().message().rfind("commId: ", 0), 0u) << parsed.status().message();
    }
  }
}

TEST(UniqueIdTest, JoinRejectsACorruptedId) {
  loomUniqueId id = freshId(2000);
  for (int i : {0, 9, 20, 127}) {
    loomUniqueId bad = id;
    bad.internal[i] ^= 0x10;
    Joined j = joinOne(bad, 0, 1, 1000);
    EXPECT_EQ(j.status.code(), loomInvalidArgument) << "byte " << i;
    EXPECT_EQ(j.status.message().rfind("commId: ", 0), 0u) << j.status.message();
  }
  Joined j = joinOne(id, 0, 1);  // the intact id still works, and ends its root
  EXPECT_TRUE(j.status.isOk()) << j.status.message();
}

TEST(BootstrapTest, JoinsOneRank) {
  loomUniqueId id;
  // The public maker, unless LOOM_COMM_ID asks for a root that rank 0 hosts.
  Status made = env::commId().empty() ? makeUniqueId(&id) : makeLocalUniqueId(&id);
  ASSERT_TRUE(made.isOk()) << made.message();
  Joined j = joinOne(id, 0, 1);
  ASSERT_TRUE(j.status.isOk()) << j.status.message();
  Bootstrap& b = *j.boot;
  EXPECT_EQ(b.rank(), 0);
  EXPECT_EQ(b.nranks(), 1);
  ASSERT_EQ(b.peerInfo().size(), 1u);
  EXPECT_EQ(b.peerInfo()[0], infoFor(0));
  EXPECT_EQ(b.secret().size(), kSecretBytes);
  char mine = 7, all = 0;
  EXPECT_TRUE(b.allGather(&mine, &all, 1).isOk());
  EXPECT_EQ(all, 7);
  EXPECT_TRUE(b.barrier().isOk());
}

class BootstrapRanksTest : public ::testing::TestWithParam<int> {};

TEST_P(BootstrapRanksTest, JoinsGathersAndSynchronises) {
  const int n = GetParam();
  loomUniqueId id = freshId();
  std::vector<Joined> ranks = joinAll(id, n);
  for (int r = 0; r < n; ++r) ASSERT_TRUE(ranks[r].status.isOk()) << ranks[r].status.message();
  for (int r = 0; r < n; ++r) {
    Bootstrap& b = *ranks[r].boot;
    EXPECT_EQ(b.rank(), r);
    EXPECT_EQ(b.nranks(), n);
    ASSERT_EQ(b.peerInfo().size(), static_cast<size_t>(n));
    for (int p = 0; p < n; ++p) EXPECT_EQ(b.peerInfo()[p], infoFor(p)) << "rank " << r;
    EXPECT_EQ(b.secret(), ranks[0].boot->secret());
    EXPECT_EQ(b.commHash(), ranks[0].boot->commHash());
  }

  // One byte per rank.
  std::vector<std::vector<unsigned char>> small(n, std::vector<unsigned char>(n));
  auto st = onEveryRank(ranks, [&](Bootstrap& b) {
    unsigned char mine = static_cast<unsigned char>(3 * b.rank() + 1);
    return b.allGather(&mine, small[b.rank()].data(), 1);
  });
  for (int r = 0; r < n; ++r) {
    ASSERT_TRUE(st[r].isOk()) << st[r].message();
    for (int p = 0; p < n; ++p) EXPECT_EQ(small[r][p], 3 * p + 1);
  }

  // 4 MiB per rank: every step sends and receives a whole block at once.
  const size_t big = 4u << 20;
  auto pattern = [](int rank, size_t i) {
    return static_cast<char>(rank * 131 + i * 29 + i / 4096);
  };
  std::vector<std::vector<char>> all(n, std::vector<char>(big * n));
  st = onEveryRank(ranks, [&](Bootstrap& b) {
    std::vector<char> mine(big);
    for (size_t i = 0; i < big; ++i) mine[i] = pattern(b.rank(), i);
    return b.allGather(mine.data(), all[b.rank()].data(), big);
  });
  for (int r = 0; r < n; ++r) {
    ASSERT_TRUE(st[r].isOk()) << st[r].message();
    for (int p = 0; p < n; ++p) {
      for (size_t i = 0; i < big; i += 997) {
        ASSERT_EQ(all[r][p * big + i], pattern(p, i)) << "rank " << r << " block " << p;
      }
      ASSERT_EQ(all[r][p * big + big - 1], pattern(p, big - 1));
    }
  }

  st = onEveryRank(ranks, [](Bootstrap& b) {
    for (int i = 0; i < 3; ++i) LOOM_CHECK(b.barrier());
    return b.allGather(nullptr, nullptr, 0);
  });
  for (int r = 0; r < n; ++r) EXPECT_TRUE(st[r].isOk()) << st[r].message();
}

INSTANTIATE_TEST_SUITE_P(Ranks, BootstrapRanksTest, ::testing::Values(2, 5));

// ---- The MAC helper ----

std::string unhex(const char* hex) {
  std::string out;
  for (size_t i = 0; hex[i] != '\0' && hex[i + 1] != '\0'; i += 2)
    out.push_back(static_cast<char>(std::stoi(std::string(hex + i, 2), nullptr, 16)));
  return out;
}

// RFC 4231's HMAC-SHA-256 test cases 1, 2, 3, 4, 6 and 7 (5 truncates its output).
TEST(AuthTest, HmacSha256MatchesRfc4231) {
  std::string key4;
  for (int i = 1; i <= 25; ++i) key4.push_back(static_cast<char>(i));
  const struct {
    std::string key, data;
    const char* mac;
  } cases[] = {
      {std::string(20, '\x0b'), "Hi There",
       "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"},
      {"Jefe", "what do ya want for nothing?",
       "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"},
      {std::string(20, '\xaa'), std::string(50, '\xdd'),
       "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe"},
      {key4, std::string(50, '\xcd'),
       "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b"},
      {std::string(131, '\xaa'), "Test Using Larger Than Block-Size Key - Hash Key First",
       "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"},
      {std::string(131, '\xaa'),
       "This is a test using a larger than block-size key and a larger than block-size data. "
       "The key needs to be hashed before being used by the HMAC algorithm.",
       "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2"},
  };
  for (const auto& c : cases) {
    auto mac = auth::hmacSha256(c.key.data(), c.key.size(), c.data.data(), c.data.size());
    ASSERT_TRUE(mac.isOk()) << mac.status().message();
    EXPECT_EQ(std::string(mac.value().begin(), mac.value().end()), unhex(c.mac)) << c.data;
  }
}

// handshakeMac is HMAC-SHA256 over the transcript util/auth.h documents, and every part of
// that transcript changes the MAC.
TEST(AuthTest, HandshakeMacCoversEveryPartOfTheTranscript) {
  const std::string secret(32, 'k'), fields = "fields";
  auth::Nonce a = someNonce(), c = someNonce();
  auto mac = [&](const char* ctx, auth::Side side, const auth::Nonce& na, const auth::Nonce& nc,
                 const std::string& f) {
    auto m = auth::handshakeMac(secret, ctx, side, na.data(), nc.data(), f);
    EXPECT_TRUE(m.isOk());
    return m.isOk() ? m.value() : auth::Mac{};
  };
  auto part = [](const std::string& bytes) {
    return le32(static_cast<uint32_t>(bytes.size())) + bytes;
  };
  std::string transcript = part("loom/test/1") + part("connector") +
                           part(std::string(a.begin(), a.end())) +
                           part(std::string(c.begin(), c.end())) + part(fields);
  auto direct =
      auth::hmacSha256(secret.data(), secret.size(), transcript.data(), transcript.size());
  ASSERT_TRUE(direct.isOk());
  const auth::Mac base = mac("loom/test/1", auth::Side::Connector, a, c, fields);
  EXPECT_EQ(base, direct.value());
  EXPECT_TRUE(auth::sameMac(base.data(), direct.value().data()));
  EXPECT_NE(base, mac("loom/test/2", auth::Side::Connector, a, c, fields));
  EXPECT_NE(base, mac("loom/test/1", auth::Side::Acceptor, a, c, fields));
  EXPECT_NE(base, mac("loom/test/1", auth::Side::Connector, c, a, fields));
  EXPECT_NE(base, mac("loom/test/1", auth::Side::Connector, a, someNonce(), fields));
  EXPECT_NE(base, mac("loom/test/1", auth::Side::Connector, a, c, "fieldz"));
  auth::Mac flipped = base;
  flipped[31] ^= 1;
  EXPECT_FALSE(auth::sameMac(base.data(), flipped.data()));
  // Two nonces drawn apart differ (32 random bytes).
  EXPECT_NE(someNonce(), someNonce());
}

// ---- Strangers and replays at the rendezvous root and the ring ----

// Strangers at ring listeners, connected by the hook before the ranks reach the root. Their
// bytes wait in the listener's queue until the ranks link the ring; the one that answers its
// challenge properly (right secret, wrong rank) does so from a thread of its own.
std::mutex gStrangerMu;
std::vector<int> gStrangerFds;
std::vector<std::thread> gStrangerThreads;
std::string gSecret;
int gStrangerNranks = 0;

void attackRingListener(int rank, sockaddr_in* addr) {
  std::lock_guard<std::mutex> lock(gStrangerMu);
  const int n = gStrangerNranks, prev = (rank + n - 1) % n;
  const std::string wrongSecret(kSecretBytes, 'w');
  const auth::Nonce old = someNonce();  // a challenge of some other connection
  const std::string frames[] = {
      std::string(64, '\xab'),                                      // garbage
      ringHello(wrongSecret, old.data(), prev, rank, n),            // wrong secret
      ringHello(gSecret, old.data(), prev, rank, n),                // made for another challenge
      ringHello(gSecret, old.data(), prev, rank, n).substr(0, 10),  // half a frame, then silence
      std::string(),                                                // connects, says nothing
  };
  for (const std::string& f : frames) {
    int fd = dial(*addr);
    ASSERT_GE(fd, 0);
    if (!f.empty()) sendBytes(fd, f);
    gStrangerFds.push_back(fd);
  }
  // Right secret, answering its own challenge, but not the previous rank.
  int fd = dial(*addr);
  ASSERT_GE(fd, 0);
  gStrangerFds.push_back(fd);
  gStrangerThreads.emplace_back([fd, rank, n] {
    std::string nonce = challengeOn(fd);
    if (!nonce.empty()) sendBytes(fd, ringHello(gSecret, bytesOf(nonce), rank, rank, n));
  });
}

TEST(BootstrapTest, StrangersAreTurnedAwayWhileRanksJoin) {
  const int n = 3;
  loomUniqueId id = freshId();
  auto parsed = parseUniqueId(id);
  ASSERT_TRUE(parsed.isOk());
  const sockaddr_in root = parsed.value().root;
  gSecret = parsed.value().secret;
  gStrangerNranks = n;
  std::string wrongSecret = gSecret;
  wrongSecret[0] ^= 1;
  const auth::Nonce old = someNonce();

  // Blind strangers send at once; the others read their challenge and answer it. Only an
  // answer with the right secret earns more than the challenge: a refusal (after the root's
  // proof) for a rank out of range.
  struct Stranger {
    const char* what;
    std::string bytes;  // sent at once
    bool answers;       // reads its challenge, then answers it: `secret`, rank 7 of n
    std::string secret;
  };
  const Stranger strangers[] = {
      {"wrong secret, for another challenge", rootHello(wrongSecret, old.data(), 0, n, "", 0),
       false, ""},
      {"right secret, for another challenge", rootHello(gSecret, old.data(), 0, n, "", 0), false,
       ""},
      {"garbage", std::string(200, '\x5a'), false, ""},
      {"half a frame", rootHello(gSecret, old.data(), 0, n, "", 0).substr(0, 20), false, ""},
      {"huge length", rootHello(gSecret, old.data(), 0, n, "", 0xffffffffu), false, ""},
      {"nothing", "", false, ""},
      {"wrong secret, answering its challenge", "", true, wrongSecret},
      {"rank out of range, answering its challenge", "", true, gSecret},
  };
  std::vector<int> fds;
  for (const Stranger& s : strangers) {
    int fd = dial(root);
    ASSERT_GE(fd, 0) << s.what;
    if (!s.bytes.empty()) sendBytes(fd, s.bytes);
    if (s.answers) {
      std::string nonce = challengeOn(fd);
      ASSERT_EQ(nonce.size(), auth::kNonceBytes) << s.what;
      sendBytes(fd, rootHello(s.secret, bytesOf(nonce), 7, n, "", 0));
    }
    fds.push_back(fd);
  }

  setRingListenHookForTest(&attackRingListener);
  std::vector<Joined> ranks = joinAll(id, n);
  setRingListenHookForTest(nullptr);
  for (int r = 0; r < n; ++r) ASSERT_TRUE(ranks[r].status.isOk()) << ranks[r].status.message();
  for (int r = 0; r < n; ++r)
    for (int p = 0; p < n; ++p) EXPECT_EQ(ranks[r].boot->peerInfo()[p], infoFor(p));

  // Every stranger's connection has been closed on it; only the insider got past the challenge.
  for (size_t i = 0; i < fds.size(); ++i) {
    std::string got;
    EXPECT_TRUE(readUntilClosed(fds[i], &got)) << strangers[i].what;
    const bool insider = strangers[i].answers && strangers[i].secret == gSecret;
    const size_t challenge = strangers[i].answers ? 0 : kChallengeBytes;  // read it already
    if (insider) {
      ASSERT_GE(got.size(), kChallengeBytes + kReplyHeaderBytes) << strangers[i].what;
      EXPECT_EQ(get32(bytesOf(got)), kProofMagic);
      EXPECT_EQ(get32(bytesOf(got) + kChallengeBytes), kRefusalMagic);
    } else {
      EXPECT_EQ(got.size(), challenge) << strangers[i].what << ": it learnt more than a challenge";
    }
    close(fds[i]);
  }
  {
    std::lock_guard<std::mutex> lock(gStrangerMu);
    for (std::thread& t : gStrangerThreads) t.join();
    gStrangerThreads.clear();
    EXPECT_EQ(gStrangerFds.size(), 6u * n);
    for (int fd : gStrangerFds) {
      std::string got;
      EXPECT_TRUE(readUntilClosed(fd, &got));
      // The challenge at most: a ring listener answers only its previous rank.
      EXPECT_LE(got.size(), kChallengeBytes);
      close(fd);
    }
    gStrangerFds.clear();
  }
  auto st = onEveryRank(ranks, [](Bootstrap& b) { return b.barrier(); });
  for (int r = 0; r < n; ++r) EXPECT_TRUE(st[r].isOk()) << st[r].message();
}

// A real rank's handshake with the root, recorded on its way by a proxy, is replayed to a
// second rendezvous of the same secret (as LOOM_COMM_ID gives every run) while its ranks are
// joining: before any rank and between the two. Without the root's fresh nonce, the first
// replay would take rank 0's place and the real rank 0 would be refused.
TEST(BootstrapTest, ReplayedRootHandshakeIsRefusedDuringSetUp) {
  const std::string secret(kSecretBytes, 'r');
  std::string recorded;
  {
    TestRoot rootA(secret, kTimeoutMs);
    RecordingProxy proxy(rootA.address());
    Joined a0, a1;
    std::thread t0([&] { a0 = joinOne(idFor(proxy.address(), secret), 0, 2); });
    std::thread t1([&] { a1 = joinOne(idFor(rootA.address(), secret), 1, 2); });
    t0.join();
    t1.join();
    ASSERT_TRUE(a0.status.isOk()) << a0.status.message();
    ASSERT_TRUE(a1.status.isOk()) << a1.status.message();
    recorded = proxy.recorded();
  }
  ASSERT_EQ(recorded.size(), kHelloBytes + infoFor(0).size()) << "the capture is rank 0's hello";
  EXPECT_EQ(get32(bytesOf(recorded)), kHelloMagic);

  TestRoot rootB(secret, kTimeoutMs);
  const loomUniqueId idB = idFor(rootB.address(), secret);
  expectRefusedReplay(replay(rootB.address(), recorded), "before any rank joined");
  Joined b0, b1;
  std::thread t0([&] { b0 = joinOne(idB, 0, 2); });
  // Rank 0 waits in the rendezvous for rank 1 while the replay comes (its hello may still be
  // on its way: the replay is refused either way, and rank 0's join is checked below).
  expectRefusedReplay(replay(rootB.address(), recorded), "while rank 0 waits");
  std::thread t1([&] { b1 = joinOne(idB, 1, 2); });
  t0.join();
  t1.join();
  ASSERT_TRUE(b0.status.isOk()) << b0.status.message();
  ASSERT_TRUE(b1.status.isOk()) << b1.status.message();
  EXPECT_EQ(b0.boot->peerInfo()[0], infoFor(0));
  EXPECT_EQ(b1.boot->peerInfo()[1], infoFor(1));
}

// The same for the ring link: rank 0's hello to rank 1 is recorded by a proxy the hook puts in
// front of rank 1's ring listener, then replayed to rank 1's listener of a second rendezvous of
// the same secret before rank 0 gets there. Without the nonce it would take rank 0's place.
std::atomic<RecordingProxy*> gRingProxy{nullptr};
std::string gRingCapture;
std::thread gReplayer;
ReplayOutcome gRingReplay;

void proxyRank1(int rank, sockaddr_in* addr) {
  if (rank != 1) return;
  auto* p = new RecordingProxy(*addr);
  gRingProxy.store(p);
  *addr = p->address();
}

void replayAtRank1(int rank, sockaddr_in* addr) {
  if (rank != 1) return;
  const sockaddr_in target = *addr;
  // Connected now, before rank 1 even reaches the root: first in its listener's queue.
  int fd = dial(target);
  ASSERT_GE(fd, 0);
  sendBytes(fd, gRingCapture);
  gReplayer = std::thread([fd] {
    gRingReplay.connected = true;
    gRingReplay.closed = readUntilClosed(fd, &gRingReplay.got);
    close(fd);
  });
}

TEST(BootstrapTest, ReplayedRingHandshakeIsRefusedDuringSetUp) {
  const std::string secret(kSecretBytes, 'q');
  {
    TestRoot rootA(secret, kTimeoutMs);
    setRingListenHookForTest(&proxyRank1);
    std::vector<Joined> a = joinAll(idFor(rootA.address(), secret), 2);
    setRingListenHookForTest(nullptr);
    for (const Joined& j : a) ASSERT_TRUE(j.status.isOk()) << j.status.message();
    a.clear();  // closes the ring, so the proxy's connection ends
    std::unique_ptr<RecordingProxy> proxy(gRingProxy.exchange(nullptr));
    ASSERT_TRUE(proxy);
    gRingCapture = proxy->recorded().substr(0, kRingHelloBytes);
  }
  ASSERT_EQ(gRingCapture.size(), kRingHelloBytes);
  EXPECT_EQ(get32(bytesOf(gRingCapture)), kRingMagic);

  TestRoot rootB(secret, kTimeoutMs);
  setRingListenHookForTest(&replayAtRank1);
  std::vector<Joined> b = joinAll(idFor(rootB.address(), secret), 2);
  setRingListenHookForTest(nullptr);
  ASSERT_TRUE(gReplayer.joinable());
  gReplayer.join();
  for (const Joined& j : b) ASSERT_TRUE(j.status.isOk()) << j.status.message();
  expectRefusedReplay(gRingReplay, "rank 1's ring listener");
  auto st = onEveryRank(b, [](Bootstrap& x) { return x.barrier(); });
  for (const Status& s : st) EXPECT_TRUE(s.isOk()) << s.message();
}

// A listener that does not hold the secret is found out by the connector: a fake root, and a
// fake ring listener published in rank 1's place, each answering with a wrong MAC. The rank
// refuses it with loomRemoteError (not a hang until the timeout).
void expectFakeFoundOut(const Status& s) {
  EXPECT_EQ(s.code(), loomRemoteError) << s.message();
  EXPECT_NE(s.message().find("did not prove that it holds the id's secret"), std::string::npos)
      << s.message();
}

TEST(BootstrapTest, FakeRootWithAWrongMacIsRefused) {
  sockaddr_in addr{};
  int listenFd = listenLoopback(&addr);
  ASSERT_GE(listenFd, 0);
  const std::string secret(kSecretBytes, 'f');
  std::thread fake([&] {
    int fd = acceptOne(listenFd);
    if (fd < 0) return;
    const auth::Nonce nonce = someNonce();
    sendBytes(fd, frame32(kChallengeMagic, nonce.data()));
    std::string hello;
    if (readExactly(fd, &hello, kHelloBytes + infoFor(0).size())) {
      // A one-rank table after a proof made with another secret.
      auto mac =
          auth::handshakeMac(std::string(kSecretBytes, 'x'), kRootContext, auth::Side::Acceptor,
                             nonce.data(), bytesOf(hello) + kOffNonce, hello.substr(kOffFields));
      std::string reply = frame32(kProofMagic, mac.value().data());
      std::string body;
      putAddr(body, noAddress());
      put32(body, 0);
      put32(reply, kTableMagic);
      put32(reply, 1);
      put32(reply, static_cast<uint32_t>(body.size()));
      sendBytes(fd, reply + body);
      closedByPeer(fd);
    }
    close(fd);
  });
  Joined j = joinOne(idFor(addr, secret), 0, 1, 20000);
  fake.join();
  close(listenFd);
  expectFakeFoundOut(j.status);
}

sockaddr_in gFakeRingAddr{};

void fakeRank1Listener(int rank, sockaddr_in* addr) {
  if (rank == 1) *addr = gFakeRingAddr;
}

TEST(BootstrapTest, FakeRingListenerWithAWrongMacIsRefused) {
  int listenFd = listenLoopback(&gFakeRingAddr);
  ASSERT_GE(listenFd, 0);
  const std::string secret(kSecretBytes, 'g');
  std::thread fake([&] {
    int fd = acceptOne(listenFd);  // rank 0, connecting to its next
    if (fd < 0) return;
    const auth::Nonce nonce = someNonce();
    sendBytes(fd, frame32(kChallengeMagic, nonce.data()));
    std::string hello;
    if (readExactly(fd, &hello, kRingHelloBytes)) {
      auth::Nonce wrong = someNonce();  // not a MAC at all
      sendBytes(fd, frame32(kRingAckMagic, wrong.data()));
      closedByPeer(fd);
    }
    close(fd);
  });
  TestRoot root(secret, 20000);
  setRingListenHookForTest(&fakeRank1Listener);
  Joined j0, j1;
  std::thread t0([&] { j0 = joinOne(idFor(root.address(), secret), 0, 2, 20000); });
  std::thread t1([&] { j1 = joinOne(idFor(root.address(), secret), 1, 2, 3000); });
  t0.join();
  t1.join();
  setRingListenHookForTest(nullptr);
  fake.join();
  close(listenFd);
  expectFakeFoundOut(j0.status);
  EXPECT_FALSE(j1.status.isOk());  // rank 0 never linked to it
}

TEST(BootstrapTest, MisconfiguredRanksAreRefused) {
  loomUniqueId id = freshId();
  Joined first;
  auto parsed = parseUniqueId(id);
  ASSERT_TRUE(parsed.isOk()) << parsed.status().message();
  const sockaddr_in root = parsed.value().root;
  std::thread t([&] { first = joinOne(id, 0, 2); });
  // Until the root (hosted here) has heard rank 0.
  for (int i = 0; i < 500 && hostedRootProgress(root).rfind("1 of 2 ranks joined", 0) != 0; ++i)
    std::this_thread::sleep_for(milliseconds(10));
  EXPECT_EQ(hostedRootProgress(root).rfind("1 of 2 ranks joined", 0), 0u)
      << hostedRootProgress(root);
  Joined dup = joinOne(id, 0, 2, 3000);
  EXPECT_EQ(dup.status.code(), loomInvalidUsage) << dup.status.message();
  Joined wrongSize = joinOne(id, 1, 3, 3000);
  EXPECT_EQ(wrongSize.status.code(), loomInvalidUsage) << wrongSize.status.message();
  Joined second = joinOne(id, 1, 2);
  t.join();
  ASSERT_TRUE(first.status.isOk()) << first.status.message();
  ASSERT_TRUE(second.status.isOk()) << second.status.message();
  EXPECT_TRUE(joinOne(id, 0, 1, 500).status.code() != loomSuccess);  // the root is gone
}

TEST(BootstrapTest, MissingRankTimesOut) {
  const int64_t timeoutMs = 1000;
  loomUniqueId id = freshId(timeoutMs);
  Clock::time_point start = Clock::now();
  std::vector<Joined> ranks = joinRanks(id, 3, {0, 1}, timeoutMs);
  int64_t took = msSince(start);
  for (const Joined& j : ranks) {
    EXPECT_EQ(j.status.code(), loomTimeout) << j.status.message();
    EXPECT_FALSE(j.boot);
  }
  EXPECT_GE(took, timeoutMs - 100);
  EXPECT_LT(took, timeoutMs + 2000);
}

TEST(BootstrapTest, AbortFlagEndsJoin) {
  loomUniqueId id = freshId(2000);
  std::atomic<bool> abortFlag{false};
  std::thread setter([&] {
    std::this_thread::sleep_for(milliseconds(200));
    abortFlag = true;
  });
  Clock::time_point start = Clock::now();
  Joined j = joinOne(id, 0, 2, 30000, &abortFlag);
  int64_t took = msSince(start);
  setter.join();
  EXPECT_EQ(j.status.code(), loomInvalidUsage) << j.status.message();
  EXPECT_LT(took, 1500);
}

TEST(BootstrapTest, AbortEndsAllGatherAndTellsTheNeighbours) {
  loomUniqueId id = freshId();
  std::vector<Joined> ranks = joinAll(id, 2);
  for (const Joined& j : ranks) ASSERT_TRUE(j.status.isOk()) << j.status.message();
  Status gathered;
  Clock::time_point start = Clock::now();
  std::thread waiter([&] {
    int mine = 1, all[2];
    gathered = ranks[0].boot->allGather(&mine, all, sizeof(mine));
  });
  std::this_thread::sleep_for(milliseconds(200));
  ranks[0].boot->abort();
  waiter.join();
  EXPECT_EQ(gathered.code(), loomInvalidUsage) << gathered.message();
  EXPECT_LT(msSince(start), 1500);
  // Rank 0's block reached rank 1 before the abort, so rank 1's matching call
  // may still succeed; the next one cannot.
  int mine = 2, all[2];
  Status ignored = ranks[1].boot->allGather(&mine, all, sizeof(mine));
  (void)ignored;
  Status s = ranks[1].boot->barrier();
  EXPECT_EQ(s.code(), loomRemoteError) << s.message();
  EXPECT_EQ(s.message().rfind("bootstrap: rank 0 closed its connection", 0), 0u) << s.message();
}

TEST(BootstrapTest, ClosedPeerIsARemoteError) {
  loomUniqueId id = freshId();
  std::vector<Joined> ranks = joinAll(id, 3);
  for (const Joined& j : ranks) ASSERT_TRUE(j.status.isOk()) << j.status.message();
  ranks[2].boot.reset();
  Status s = ranks[0].boot->barrier();  // rank 0 receives from rank 2
  EXPECT_EQ(s.code(), loomRemoteError) << s.message();
  EXPECT_EQ(s.message().rfind("bootstrap: rank 2 closed its connection", 0), 0u) << s.message();
  EXPECT_EQ(ranks[0].boot->barrier().code(), loomRemoteError);  // stays broken
}

TEST(BootstrapTest, SilentPeerTimesOutAllGather) {
  loomUniqueId id = freshId();
  std::vector<Joined> ranks = joinRanks(id, 2, {0, 1}, 500);
  for (const Joined& j : ranks) ASSERT_TRUE(j.status.isOk()) << j.status.message();
  Clock::time_point start = Clock::now();
  Status s = ranks[0].boot->barrier();
  EXPECT_EQ(s.code(), loomTimeout) << s.message();
  EXPECT_LT(msSince(start), 2000);
}

TEST(BootstrapTest, RankZeroHostsTheRootForAFixedAddress) {
  // An id as LOOM_COMM_ID=127.0.0.1:<port> would make it: no root until rank 0 joins.
  int probe = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(bind(probe, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(getsockname(probe, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  close(probe);
  IdContents c;
  c.root = addr;
  c.secret = std::string(kSecretBytes, 's');
  c.rootOnRank0 = true;
  loomUniqueId id;
  encodeUniqueId(c, &id);

  std::vector<Joined> ranks(3);
  std::vector<std::thread> threads;
  for (int r = 2; r >= 0; --r) {
    if (r == 0) std::this_thread::sleep_for(milliseconds(300));  // the others retry meanwhile
    threads.emplace_back([&, r] { ranks[r] = joinOne(id, r, 3); });
  }
  for (std::thread& t : threads) t.join();
  for (const Joined& j : ranks) ASSERT_TRUE(j.status.isOk()) << j.status.message();
  auto st = onEveryRank(ranks, [](Bootstrap& b) {
    int mine = 100 + b.rank(), all[3] = {};
    LOOM_CHECK(b.allGather(&mine, all, sizeof(int)));
    for (int p = 0; p < 3; ++p)
      if (all[p] != 100 + p) return Status(loomInternalError, "wrong block");
    return Status::ok();
  });
  for (const Status& s : st) EXPECT_TRUE(s.isOk()) << s.message();
}

// ---- The TCP transport's handshake (transport/tcp/tcp_setup.h lays out its frames) ----

constexpr uint64_t kTcpHash = 0x1234abcd5678ef01ull;
constexpr uint32_t kTcpChallengeMagic = 0x4e544d4cu;  // "LMTN"
constexpr uint32_t kTcpHelloMagic = 0x43544d4cu;      // "LMTC"
constexpr uint32_t kTcpAnswerMagic = 0x41544d4cu;     // "LMTA"
constexpr size_t kTcpHelloBytes = 80;

// A transport hello from `rank` to `to` answering the listener nonce `challenge`.
std::string tcpHello(const std::string& secret, const unsigned char* challenge, int rank, int to) {
  auth::Nonce mine = someNonce();
  std::string fields =
      le32(static_cast<uint32_t>(rank)) + le32(static_cast<uint32_t>(to)) + le64(kTcpHash);
  auto mac = auth::handshakeMac(secret, "loom/tcp/1", auth::Side::Connector, challenge, mine.data(),
                                fields);
  EXPECT_TRUE(mac.isOk());
  return le32(kTcpHelloMagic) + std::string(mine.begin(), mine.end()) +
         std::string(mac.value().begin(), mac.value().end()) + le32(static_cast<uint32_t>(rank)) +
         le64(kTcpHash);
}

struct TcpSide {
  Status status;
  std::vector<std::unique_ptr<transport::Connection>> conns;
};

TcpSide connectTcpAs(int rank, const std::vector<transport::TcpPeer>& peers,
                     transport::TcpListener& listener, const std::string& secret,
                     int64_t timeoutMs = kTimeoutMs) {
  TcpSide side;
  transport::TcpTransport tcp(listener, secret, peers);
  transport::SetupArgs args;
  args.rank = rank;
  for (const transport::TcpPeer& p : peers) args.peers.push_back(p.rank);
  args.commHash = kTcpHash;
  args.slotBytes = 4096;
  args.depth = 4;
  args.deadlineNs = nowNs() + timeoutMs * 1'000'000;
  auto r = tcp.connect(args);
  if (r.isOk()) {
    side.conns = std::move(r.value().conns);
  } else {
    side.status = r.status();
  }
  return side;
}

std::unique_ptr<transport::TcpListener> tcpListener() {
  auto l = transport::TcpListener::open("127.0.0.1");
  EXPECT_TRUE(l.isOk()) << l.status().message();
  return l.isOk() ? l.take() : nullptr;
}

// Sends a payload from `from` to `to` over the connections set up, and checks it arrives whole.
void expectDelivers(transport::Connection& from, transport::Connection& to) {
  const std::string payload =
      "set-up done: " + std::to_string(from.peer()) + " -> " + std::to_string(to.peer());
  void* slot = nullptr;
  const void* got = nullptr;
  size_t bytes = 0;
  Clock::time_point end = Clock::now() + milliseconds(5000);
  while ((slot = from.trySendSlot()) == nullptr && Clock::now() < end) (void)from.progress();
  ASSERT_NE(slot, nullptr);
  std::memcpy(slot, payload.data(), payload.size());
  from.postSend(payload.size());
  while (got == nullptr && Clock::now() < end) {
    ASSERT_TRUE(from.progress().isOk());
    ASSERT_TRUE(to.progress().isOk());
    got = to.tryRecvSlot(&bytes);
  }
  ASSERT_NE(got, nullptr) << "nothing arrived in 5 s";
  EXPECT_EQ(std::string(static_cast<const char*>(got), bytes), payload);
  to.releaseRecv();
}

// Ranks 0 and 1 each set up one connection, to each other, that carries a payload both ways.
void expectLinked(TcpSide& r0, TcpSide& r1) {
  ASSERT_TRUE(r0.status.isOk()) << r0.status.message();
  ASSERT_TRUE(r1.status.isOk()) << r1.status.message();
  ASSERT_EQ(r0.conns.size(), 1u);
  ASSERT_EQ(r1.conns.size(), 1u);
  EXPECT_EQ(r0.conns[0]->peer(), 1);
  EXPECT_EQ(r1.conns[0]->peer(), 0);
  expectDelivers(*r0.conns[0], *r1.conns[0]);
  expectDelivers(*r1.conns[0], *r0.conns[0]);
}

// Rank 0's handshake with rank 1's transport listener, recorded by a proxy in a first set-up,
// is replayed to rank 1's listener of a second set-up of the same secret while rank 1 waits for
// rank 0; so is a stranger's hello with a wrong secret that answers its own challenge. Both
// are closed after the challenge alone, and the real rank 0 then connects.
TEST(TcpHandshakeTest, ReplayedHelloIsRefusedDuringSetUp) {
  const std::string secret(kSecretBytes, 't');
  std::string recorded;
  {
    auto l0 = tcpListener(), l1 = tcpListener();
    ASSERT_TRUE(l0 && l1);
    RecordingProxy proxy(l1->address());
    TcpSide a0, a1;
    std::thread t0([&] { a0 = connectTcpAs(0, {{1, proxy.address()}}, *l0, secret); });
    std::thread t1([&] { a1 = connectTcpAs(1, {{0, l0->address()}}, *l1, secret); });
    t0.join();
    t1.join();
    expectLinked(a0, a1);  // through the proxy
    recorded = proxy.recorded().substr(0, kTcpHelloBytes);
  }
  ASSERT_EQ(recorded.size(), kTcpHelloBytes);
  ASSERT_EQ(get32(bytesOf(recorded)), kTcpHelloMagic);

  auto m0 = tcpListener(), m1 = tcpListener();
  ASSERT_TRUE(m0 && m1);
  TcpSide b0, b1;
  std::thread t1([&] { b1 = connectTcpAs(1, {{0, m0->address()}}, *m1, secret); });
  expectRefusedReplay(replay(m1->address(), recorded), "rank 1's transport listener",
                      kTcpChallengeMagic);
  {
    int fd = dial(m1->address());
    ASSERT_GE(fd, 0);
    std::string ch;
    ASSERT_TRUE(readExactly(fd, &ch, kChallengeBytes));
    ASSERT_EQ(get32(bytesOf(ch)), kTcpChallengeMagic);
    std::string wrong(kSecretBytes, 'w');
    sendBytes(fd, tcpHello(wrong, bytesOf(ch) + 4, 0, 1));
    std::string got;
    EXPECT_TRUE(readUntilClosed(fd, &got)) << "a wrong secret was not closed";
    EXPECT_EQ(got.size(), 0u) << "a wrong secret got an answer";
    close(fd);
  }
  std::thread t0([&] { b0 = connectTcpAs(0, {{1, m1->address()}}, *m0, secret); });
  t0.join();
  t1.join();
  expectLinked(b0, b1);
}

// Every data connection sends small messages at once (TCP_NODELAY), the accepting end as well
// as the connecting one: with Nagle's algorithm on either end, a small send that follows an
// unacknowledged one waits for the peer's delayed acknowledgement (about 40 ms), which is what
// a tree all-reduce over TCP measured while accepted sockets lacked the option. Both ends'
// socket buffers are LOOM_SOCKET_BUFFER_BYTES each way (default 4 MiB; the kernel doubles it),
// the accepting end's from its listener, where net.core.{r,w}mem_max allow that size (else the
// kernel autotunes them and the test skips).
TEST(TcpHandshakeTest, BothEndsSendSmallMessagesAtOnceAndSizeTheirBuffers) {
  const std::string secret(kSecretBytes, 'n');
  auto l0 = tcpListener(), l1 = tcpListener();
  ASSERT_TRUE(l0 && l1);
  TcpSide a0, a1;
  std::thread t0([&] { a0 = connectTcpAs(0, {{1, l1->address()}}, *l0, secret); });
  std::thread t1([&] { a1 = connectTcpAs(1, {{0, l0->address()}}, *l1, secret); });
  t0.join();
  t1.join();
  expectLinked(a0, a1);
  for (TcpSide* side : {&a0, &a1}) {
    ASSERT_EQ(side->conns.size(), 1u);
    const int fd = side->conns[0]->fd();
    ASSERT_GE(fd, 0);
    int noDelay = 0;
    socklen_t len = sizeof(noDelay);
    ASSERT_EQ(getsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &noDelay, &len), 0) << std::strerror(errno);
    EXPECT_NE(noDelay, 0) << "rank " << (side == &a0 ? 0 : 1)
                          << "'s connection to its peer has Nagle's algorithm on";
    // Loom sizes both buffers only where both limits allow the size asked for.
    const int64_t want = env::socketBufferBytes();
    long long limit = 0;
    for (const char* cap : {"/proc/sys/net/core/rmem_max", "/proc/sys/net/core/wmem_max"}) {
      long long v = 0;
      FILE* f = std::fopen(cap, "r");
      ASSERT_NE(f, nullptr) << cap;
      ASSERT_EQ(std::fscanf(f, "%lld", &v), 1) << cap;
      std::fclose(f);
      limit = limit == 0 ? v : std::min(limit, v);
    }
    if (want <= 0 || limit < want)
      GTEST_SKIP() << "socket buffers are autotuned here: LOOM_SOCKET_BUFFER_BYTES=" << want
                   << ", net.core.{r,w}mem_max down to " << limit;
    for (int opt : {SO_RCVBUF, SO_SNDBUF}) {
      int got = 0;
      socklen_t len = sizeof(got);
      ASSERT_EQ(getsockopt(fd, SOL_SOCKET, opt, &got, &len), 0) << std::strerror(errno);
      EXPECT_EQ(got, 2 * want) << "rank " << (side == &a0 ? 0 : 1) << ", "
                               << (opt == SO_RCVBUF ? "SO_RCVBUF" : "SO_SNDBUF");
    }
  }
}

// A connector refuses a listener that cannot prove the secret: one that answers with a wrong
// MAC (loomRemoteError at once) and one that never answers (loomTimeout at the deadline).
TEST(TcpHandshakeTest, FakeListenerIsRefusedByTheConnector) {
  const std::string secret(kSecretBytes, 'u');
  for (bool answers : {true, false}) {
    sockaddr_in fakeAddr{};
    int listenFd = listenLoopback(&fakeAddr);
    ASSERT_GE(listenFd, 0);
    std::thread fake([&] {
      int fd = acceptOne(listenFd);
      if (fd < 0) return;
      const auth::Nonce nonce = someNonce();
      sendBytes(fd, le32(kTcpChallengeMagic) + std::string(nonce.begin(), nonce.end()));
      std::string hello;
      if (readExactly(fd, &hello, kTcpHelloBytes) && answers) {
        auth::Nonce wrong = someNonce();
        sendBytes(fd, le32(kTcpAnswerMagic) + std::string(wrong.begin(), wrong.end()));
      }
      closedByPeer(fd);
      close(fd);
    });
    auto l0 = tcpListener();
    ASSERT_TRUE(l0);
    TcpSide side = connectTcpAs(0, {{1, fakeAddr}}, *l0, secret, answers ? 20000 : 1000);
    fake.join();
    close(listenFd);
    if (answers) {
      EXPECT_EQ(side.status.code(), loomRemoteError) << side.status.message();
      EXPECT_NE(side.status.message().find("did not prove that it holds the communicator's secret"),
                std::string::npos)
          << side.status.message();
    } else {
      EXPECT_EQ(side.status.code(), loomTimeout) << side.status.message();
      EXPECT_NE(side.status.message().find("missing ranks: 1"), std::string::npos)
          << side.status.message();
    }
  }
}

}  // namespace
}  // namespace loom::bootstrap
