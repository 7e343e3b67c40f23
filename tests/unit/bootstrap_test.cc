// Bootstrap tests: ranks are threads of this process, over loopback.
#include "bootstrap/bootstrap.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "bootstrap/unique_id.h"
#include "util/env.h"
#include "util/net.h"

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

// True once the peer has closed fd (reads whatever it sent first).
bool closedByPeer(int fd) {
  char buf[4096];
  for (;;) {
    ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n == 0) return true;
    if (n < 0) return errno == ECONNRESET;
  }
}

std::string le32(uint32_t v) {
  std::string s;
  for (int i = 0; i < 4; ++i) s.push_back(static_cast<char>(v >> (8 * i)));
  return s;
}

// A root hello as wire.h lays it out.
std::string rootHello(const std::string& secret, int rank, int nranks, uint32_t infoLen) {
  return le32(0x48424d4cu) + secret + le32(rank) + le32(nranks) + std::string(8, '\0') +
         le32(infoLen);
}

std::string ringHello(const std::string& secret, int rank) {
  return le32(0x52424d4cu) + secret + le32(rank);
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

// Strangers at ring listeners, connected by the hook before the ranks reach the root.
std::mutex gStrangerMu;
std::vector<int> gStrangerFds;
std::string gSecret;

void attackRingListener(int rank, const sockaddr_in& addr) {
  std::lock_guard<std::mutex> lock(gStrangerMu);
  std::string wrongSecret(kSecretBytes, 'w');
  const std::string frames[] = {
      std::string(64, '\xab'),                     // garbage
      ringHello(wrongSecret, rank - 1),            // wrong secret
      ringHello(gSecret, rank),                    // right secret, not the previous rank
      ringHello(gSecret, rank - 1).substr(0, 10),  // half a frame, then silence
      std::string(),                               // connects, says nothing
  };
  for (const std::string& f : frames) {
    int fd = dial(addr);
    ASSERT_GE(fd, 0);
    if (!f.empty()) sendBytes(fd, f);
    gStrangerFds.push_back(fd);
  }
}

TEST(BootstrapTest, StrangersAreTurnedAwayWhileRanksJoin) {
  const int n = 3;
  loomUniqueId id = freshId();
  auto parsed = parseUniqueId(id);
  ASSERT_TRUE(parsed.isOk());
  const sockaddr_in root = parsed.value().root;
  gSecret = parsed.value().secret;
  std::string wrongSecret = gSecret;
  wrongSecret[0] ^= 1;

  struct Stranger {
    const char* what;
    std::string bytes;
  };
  const Stranger strangers[] = {
      {"wrong secret", rootHello(wrongSecret, 0, n, 0)},
      {"garbage", std::string(200, '\x5a')},
      {"half a frame", rootHello(gSecret, 0, n, 0).substr(0, 20)},
      {"huge length", rootHello(gSecret, 0, n, 0xffffffffu)},
      {"rank out of range", rootHello(gSecret, 7, n, 0)},
      {"nothing", ""},
  };
  std::vector<int> fds;
  for (const Stranger& s : strangers) {
    int fd = dial(root);
    ASSERT_GE(fd, 0) << s.what;
    if (!s.bytes.empty()) sendBytes(fd, s.bytes);
    fds.push_back(fd);
  }

  setRingListenHookForTest(&attackRingListener);
  std::vector<Joined> ranks = joinAll(id, n);
  setRingListenHookForTest(nullptr);
  for (int r = 0; r < n; ++r) ASSERT_TRUE(ranks[r].status.isOk()) << ranks[r].status.message();
  for (int r = 0; r < n; ++r)
    for (int p = 0; p < n; ++p) EXPECT_EQ(ranks[r].boot->peerInfo()[p], infoFor(p));

  // Every stranger's connection has been closed on it.
  for (size_t i = 0; i < fds.size(); ++i) {
    EXPECT_TRUE(closedByPeer(fds[i])) << strangers[i].what;
    close(fds[i]);
  }
  {
    std::lock_guard<std::mutex> lock(gStrangerMu);
    EXPECT_EQ(gStrangerFds.size(), 5u * n);
    for (int fd : gStrangerFds) {
      EXPECT_TRUE(closedByPeer(fd));
      close(fd);
    }
    gStrangerFds.clear();
  }
  auto st = onEveryRank(ranks, [](Bootstrap& b) { return b.barrier(); });
  for (int r = 0; r < n; ++r) EXPECT_TRUE(st[r].isOk()) << st[r].message();
}

TEST(BootstrapTest, MisconfiguredRanksAreRefused) {
  loomUniqueId id = freshId();
  Joined first;
  std::thread t([&] { first = joinOne(id, 0, 2); });
  std::this_thread::sleep_for(milliseconds(300));  // rank 0 has joined the root by now
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
  EXPECT_EQ(j.status.code(), loomInternalError) << j.status.message();
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
  EXPECT_EQ(gathered.code(), loomInternalError) << gathered.message();
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

}  // namespace
}  // namespace loom::bootstrap
