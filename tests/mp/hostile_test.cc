// Hostile input over real processes, beyond the rendezvous port (failure_test.cc has the
// strangers there): strangers at every rank's TCP transport listener and bootstrap ring
// listener while the ranks set up, replayed handshakes after set-up, where the listeners bind,
// and the shared-memory segments (mode, owner, names, and a segment planted under a
// communicator's name before it exists).
//
// White-box where a test must speak a wire format: the secret is bytes [16, 48) of the id,
// the communicator hash is FNV-1a 64 of the secret (bootstrap.cc), the TCP transport hello is
// {u32 "LMTC", u32 rank, u64 hash, nonce[32], mac[32]} with the MAC of util/auth.h over
// context "loom/tcp/1" and the fields (rank, listening rank, hash) (tcp_setup.h), the ring
// hello {u32 "LMBR", nonce[32], mac[32], u32 rank} over context "loom/bootstrap/ring/1" and
// the fields (rank, listening rank, nranks) (wire.h), shared-memory names are
// /loom-<hash, 16 hex>-<rank> (shm_setup.cc). A captured hello is one made with the right
// secret for a challenge the listener sent on another connection.
#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "harness.h"
#include "util/auth.h"

namespace loomtest {
namespace auth = loom::auth;
namespace {

// ---- Helpers: sockets of a process, strangers, the wire formats ----

// The IPv4 TCP sockets in LISTEN state that process pid holds (/proc/net/tcp by inode).
std::vector<sockaddr_in> listeningSockets(pid_t pid) {
  std::set<unsigned long> inodes;
  std::string fdDir = "/proc/" + std::to_string(pid) + "/fd";
  if (DIR* d = opendir(fdDir.c_str())) {
    while (dirent* e = readdir(d)) {
      char target[64] = {};
      std::string path = fdDir + "/" + e->d_name;
      if (readlink(path.c_str(), target, sizeof(target) - 1) <= 0) continue;
      unsigned long ino = 0;
      if (sscanf(target, "socket:[%lu]", &ino) == 1) inodes.insert(ino);
    }
    closedir(d);
  }
  std::vector<sockaddr_in> out;
  std::ifstream tcp("/proc/net/tcp");
  std::string line;
  std::getline(tcp, line);  // header
  while (std::getline(tcp, line)) {
    std::istringstream in(line);
    std::string sl, local, remote, state, txrx, tr, retr, uid, timeout;
    unsigned long ino = 0;
    in >> sl >> local >> remote >> state >> txrx >> tr >> retr >> uid >> timeout >> ino;
    if (state != "0A" || inodes.count(ino) == 0) continue;
    unsigned ip = 0, port = 0;
    if (sscanf(local.c_str(), "%X:%X", &ip, &port) != 2) continue;
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = ip;  // /proc prints the address as the host-order word of its bytes
    a.sin_port = htons(static_cast<uint16_t>(port));
    out.push_back(a);
  }
  return out;
}

std::string addrText(const sockaddr_in& a) {
  char ip[INET_ADDRSTRLEN] = "?";
  inet_ntop(AF_INET, &a.sin_addr, ip, sizeof(ip));
  return std::string(ip) + ":" + std::to_string(ntohs(a.sin_port));
}

int dial(const sockaddr_in& a) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  if (connect(fd, reinterpret_cast<const sockaddr*>(&a), sizeof(a)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// True once the peer has closed (or reset) fd within timeoutMs; whatever it sent is discarded.
bool closedByPeer(int fd, int timeoutMs) {
  const double end = nowSeconds() + timeoutMs / 1000.0;
  char buf[4096];
  for (;;) {
    int left = static_cast<int>((end - nowSeconds()) * 1000);
    if (left <= 0) return false;
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, left) <= 0) return false;
    ssize_t n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
    if (n == 0) return true;
    if (n < 0 && errno != EAGAIN && errno != EINTR) return true;
  }
}

std::string le32(uint32_t v) {
  std::string s;
  for (int i = 0; i < 4; ++i) s.push_back(static_cast<char>(v >> (8 * i)));
  return s;
}
std::string le64(uint64_t v) { return le32(static_cast<uint32_t>(v)) + le32(v >> 32); }

constexpr uint32_t kRanksForRing = 3;  // the ranks of the communicator attacked below

std::string secretOf(const loomUniqueId& id) { return std::string(id.internal + 16, 32); }

uint64_t commHashOf(const std::string& secret) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : secret) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

// A hello as a capture holds it: made with `secret` by `rank` for `listener`, answering the
// challenge of some other connection (a nonce the listener will not send again).
std::string capturedHello(uint32_t magic, const char* context, const std::string& secret,
                          const std::string& fields, const std::string& wire) {
  auth::Nonce theirs{}, mine{};
  if (!auth::randomBytes(theirs.data(), theirs.size()).isOk() ||
      !auth::randomBytes(mine.data(), mine.size()).isOk())
    return "";
  auto mac = auth::handshakeMac(secret, context, auth::Side::Connector, theirs.data(), mine.data(),
                                fields);
  if (!mac.isOk()) return "";
  return le32(magic) + std::string(mine.begin(), mine.end()) +
         std::string(mac.value().begin(), mac.value().end()) + wire;
}
std::string transportHello(const std::string& secret, int rank, int listener) {
  const uint64_t hash = commHashOf(secret);
  std::string fields =
      le32(static_cast<uint32_t>(rank)) + le32(static_cast<uint32_t>(listener)) + le64(hash);
  // The transport hello carries its fields after the magic, the nonce and MAC after them.
  std::string h = capturedHello(0x4c4d5443u, "loom/tcp/1", secret, fields, "");
  if (h.empty()) return h;
  return h.substr(0, 4) + le32(static_cast<uint32_t>(rank)) + le64(hash) + h.substr(4);
}
std::string ringHello(const std::string& secret, int rank, int listener) {
  std::string fields = le32(static_cast<uint32_t>(rank)) + le32(static_cast<uint32_t>(listener)) +
                       le32(kRanksForRing);
  return capturedHello(0x52424d4cu, "loom/bootstrap/ring/1", secret, fields,
                       le32(static_cast<uint32_t>(rank)));
}
// A TCP transport frame header as if the handshake were done: a 4 GiB - 16 payload announced.
std::string hugeFrame() { return le32(0xfffffff0u) + std::string(36, '\0') + "tail"; }

// All-reduces and a broadcast of several sizes (one over many slots), checked exactly.
bool collectivesWork(loomComm_t comm, int rank, int nranks, const char* when) {
  for (size_t count : {size_t{1}, size_t{1023}, size_t{300001}}) {
    std::vector<float> x(count), y(count);
    for (size_t i = 0; i < count; ++i) x[i] = static_cast<float>((i * 7 + rank) % 97);
    loomResult_t r = loomAllReduce(x.data(), y.data(), count, loomFloat32, loomSum, comm, nullptr);
    if (r != loomSuccess) {
      fprintf(stderr, "rank %d %s: all-reduce of %zu: %s: %s\n", rank, when, count,
              loomGetErrorString(r), loomGetLastError(comm));
      return false;
    }
    for (size_t i = 0; i < count; ++i) {
      float want = 0;
      for (int p = 0; p < nranks; ++p) want += static_cast<float>((i * 7 + p) % 97);
      if (y[i] != want) {
        fprintf(stderr, "rank %d %s: all-reduce index %zu: got %g, want %g\n", rank, when, i, y[i],
                want);
        return false;
      }
    }
    std::vector<int32_t> b(count, rank == 1 ? 0 : -1);
    if (rank == 1)
      for (size_t i = 0; i < count; ++i) b[i] = static_cast<int32_t>(i * 31 + 5);
    r = loomBroadcast(b.data(), b.data(), count, loomInt32, 1, comm, nullptr);
    if (r != loomSuccess) {
      fprintf(stderr, "rank %d %s: broadcast: %s\n", rank, when, loomGetErrorString(r));
      return false;
    }
    for (size_t i = 0; i < count; ++i)
      if (b[i] != static_cast<int32_t>(i * 31 + 5)) {
        fprintf(stderr, "rank %d %s: broadcast index %zu: got %d\n", rank, when, i, b[i]);
        return false;
      }
  }
  return true;
}

// ---- Strangers at the TCP transport and ring listeners, replays after set-up ----

// Shared words (SharedPage::words): [0, 3) pids of ranks 0..2, [3, 6) the count of listening
// sockets each rank holds once its communicator is up.
constexpr int kRanks = 3;
constexpr int kLate = 2;  // joins only after the strangers have connected to the others

struct Attack {
  std::vector<int> fds;  // the strangers' connections, kept open
  std::vector<std::string> what;
  std::vector<sockaddr_in> targets;  // every listener attacked
  std::vector<std::string> notLoopback;
  std::string secret;
  int reached = 0;
};

// Strangers at listener `a` of rank r (its transport or its ring listener). The captured
// hellos carry the right secret and ranks the listener expects, so only the nonce keeps them
// out: were one taken, the real rank would be refused and set-up would fail.
void strangersAt(const sockaddr_in& a, int r, Attack& at) {
  std::string wrong = at.secret;
  wrong[5] ^= 0x40;
  const int lower = r == 0 ? 1 : r - 1, prev = (r + kRanks - 1) % kRanks;
  const std::pair<const char*, std::string> probes[] = {
      {"garbage", std::string(300, '\x5a')},
      {"half a transport hello", transportHello(at.secret, lower, r).substr(0, 20)},
      {"transport hello, wrong secret", transportHello(wrong, lower, r)},
      {"ring hello, wrong secret", ringHello(wrong, prev, r)},
      {"captured transport hello", transportHello(at.secret, lower, r)},
      {"captured ring hello", ringHello(at.secret, prev, r)},
      {"huge frame length", hugeFrame()},
      {"silence", ""},
  };
  for (const auto& p : probes) {
    int fd = dial(a);
    if (fd < 0) continue;
    ++at.reached;
    if (!p.second.empty()) (void)!send(fd, p.second.data(), p.second.size(), MSG_NOSIGNAL);
    at.fds.push_back(fd);
    at.what.push_back(std::string(p.first) + " at " + addrText(a));
  }
}
constexpr int kProbes = 8;

TEST(Hostile, StrangersAtTransportAndRingListenersThenReplays) {
  Attack at;
  std::vector<std::string> stillOpen, replayAccepted;
  int replays = 0;
  uint32_t listening[kRanks] = {9, 9, 9};
  LaunchOptions opts;
  opts.nranks = kRanks;
  opts.shm = false;  // every pair over TCP: every rank's transport listener is in use
  opts.timeoutMs = 30000;
  opts.deadlineMs = 120000;
  opts.beforeInit = [](RankContext& ctx) {
    ctx.shared->words[ctx.rank].store(static_cast<uint32_t>(getpid()));
    if (ctx.rank != kLate) return;
    for (int i = 0; i < 3000 && ctx.shared->flag.load() == 0; ++i) usleep(10000);
  };
  opts.whileRunning = [&](int port, SharedPage* shared) {
    // The same id every rank computes from LOOM_COMM_ID: the secret a replay would carry.
    // (The harness set no LOOM_* variable in this process; the child does it.)
    int pipeFds[2];
    if (pipe(pipeFds) != 0) return;
    pid_t kid = fork();
    if (kid == 0) {
      setenv("LOOM_COMM_ID", ("127.0.0.1:" + std::to_string(port)).c_str(), 1);
      setenv("LOOM_SOCKET_IFNAME", "lo", 1);
      loomUniqueId id;
      if (loomGetUniqueId(&id) == loomSuccess) (void)!write(pipeFds[1], id.internal, 128);
      _exit(0);
    }
    loomUniqueId id{};
    (void)!read(pipeFds[0], id.internal, 128);
    waitpid(kid, nullptr, 0);
    close(pipeFds[0]);
    close(pipeFds[1]);
    at.secret = secretOf(id);

    // Ranks 0 and 1 listen (transport and ring; rank 0 also hosts the root on `port`) and wait
    // in the rendezvous for rank 2.
    for (int r = 0; r < kRanks; ++r)
      if (r != kLate)
        for (int i = 0; i < 3000; ++i) {
          pid_t pid = static_cast<pid_t>(shared->words[r].load());
          size_t want = r == 0 ? 3 : 2;
          if (pid > 0 && listeningSockets(pid).size() >= want) break;
          if (pid > 0 && kill(pid, 0) != 0) break;  // the rank is gone: the launch reports it
          usleep(10000);
        }
    for (int r = 0; r < kRanks; ++r) {
      if (r == kLate) continue;
      for (const sockaddr_in& a : listeningSockets(static_cast<pid_t>(shared->words[r].load()))) {
        if (ntohl(a.sin_addr.s_addr) != INADDR_LOOPBACK)
          at.notLoopback.push_back("rank " + std::to_string(r) + " " + addrText(a));
        if (ntohs(a.sin_port) == port) continue;  // the root: failure_test.cc's strangers
        at.targets.push_back(a);
        strangersAt(a, r, at);
      }
    }
    usleep(100000);
    shared->flag.store(1);  // rank 2 joins; the ranks link, accept, and meet the strangers

    // Once every rank has checked its collectives, every stranger must have been closed.
    auto anyRankGone = [&] {
      for (int r = 0; r < kRanks; ++r) {
        const pid_t pid = static_cast<pid_t>(shared->words[r].load());
        if (pid > 0 && kill(pid, 0) != 0) return true;
      }
      return false;
    };
    for (int i = 0; i < 6000 && shared->counter.load() < kRanks && !anyRankGone(); ++i)
      usleep(10000);
    for (size_t i = 0; i < at.fds.size(); ++i) {
      if (!closedByPeer(at.fds[i], 10000)) stillOpen.push_back(at.what[i]);
      close(at.fds[i]);
    }
    // Captured handshakes again at every listener the ranks had, and at the root, once the
    // communicator is up (nothing should listen any more).
    sockaddr_in root{};
    root.sin_family = AF_INET;
    root.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    root.sin_port = htons(static_cast<uint16_t>(port));
    std::vector<sockaddr_in> all = at.targets;
    all.push_back(root);
    for (const sockaddr_in& a : all) {
      for (const std::string& bytes :
           {transportHello(at.secret, 0, 1), ringHello(at.secret, 0, 1)}) {
        ++replays;
        int fd = dial(a);
        if (fd < 0) continue;  // refused: nothing listens any more
        (void)!send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
        if (!closedByPeer(fd, 3000)) replayAccepted.push_back(addrText(a));
        close(fd);
      }
    }
    for (int r = 0; r < kRanks; ++r) listening[r] = shared->words[3 + r].load();
    shared->flag.store(2);
  };
  LaunchResult res = launch(opts, [](RankContext& ctx) {
    if (!collectivesWork(ctx.comm, ctx.rank, ctx.nranks, "after the strangers")) return 1;
    ctx.shared->words[3 + ctx.rank].store(static_cast<uint32_t>(listeningSockets(getpid()).size()));
    ctx.shared->counter.fetch_add(1);
    for (int i = 0; i < 6000 && ctx.shared->flag.load() != 2; ++i) usleep(10000);
    return collectivesWork(ctx.comm, ctx.rank, ctx.nranks, "after the replays") ? 0 : 1;
  });
  ASSERT_TRUE(res.allPassed()) << res.report();
  EXPECT_EQ(at.targets.size(), 4u) << "expected a transport and a ring listener on ranks 0 and 1";
  EXPECT_EQ(at.reached, kProbes * static_cast<int>(at.targets.size()));
  for (const std::string& s : stillOpen) ADD_FAILURE() << "stranger not closed: " << s;
  for (const std::string& s : at.notLoopback)
    ADD_FAILURE() << "with LOOM_SOCKET_IFNAME=lo, a listener is not on loopback: " << s;
  EXPECT_EQ(replays, 2 * static_cast<int>(at.targets.size() + 1));
  for (const std::string& s : replayAccepted) ADD_FAILURE() << "a replay was not closed: " << s;
  // Nothing listens once the communicator is up: no port is left to attack.
  for (int r = 0; r < kRanks; ++r)
    EXPECT_EQ(listening[r], 0u) << "rank " << r << " still listens with its communicator up";
}

// ---- Where the listeners bind ----

// The address every up, non-loopback IPv4 interface has (the default's candidates).
std::set<uint32_t> interfaceAddresses() {
  std::set<uint32_t> out;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return out;
  for (ifaddrs* i = list; i != nullptr; i = i->ifa_next)
    if (i->ifa_addr != nullptr && i->ifa_addr->sa_family == AF_INET && (i->ifa_flags & IFF_UP) &&
        !(i->ifa_flags & IFF_LOOPBACK))
      out.insert(reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr.s_addr);
  freeifaddrs(list);
  return out;
}

// Every listener while the ranks set up (the rendezvous root in the launcher, each rank's ring
// and TCP transport listeners) is on the chosen interface's address, never 0.0.0.0: with
// LOOM_SOCKET_IFNAME=lo on 127.0.0.1; without it on an up non-loopback interface (loopback
// where there is none). Rank 0 watches its own and the launcher's sockets from a thread while
// it initialises; rank 1 joins only once rank 0's transport and ring listeners were seen.
// Shared words: [0] listeners seen, [1] listeners on a wrong address, [2..5] the first two
// (address, port) seen wrong.
class BindAddress : public ::testing::TestWithParam<const char*> {};

TEST_P(BindAddress, ListenersAreNeverOnAllInterfaces) {
  const std::string ifname = GetParam();
  LaunchOptions opts;
  opts.nranks = 2;
  opts.shm = false;
  opts.env = {{"LOOM_SOCKET_IFNAME", ifname}};
  opts.idFromParent = true;  // the root runs in the launcher, a Loom process
  opts.beforeInit = [ifname](RankContext& ctx) {
    SharedPage* sh = ctx.shared;
    if (ctx.rank == 1) {
      for (int i = 0; i < 3000 && sh->flag.load() == 0; ++i) usleep(10000);
      return;
    }
    std::thread([sh, ifname] {
      const std::set<uint32_t> ifs = interfaceAddresses();
      std::set<std::string> seen;
      for (int i = 0; i < 6000 && sh->flag.load() < 2; ++i) {
        std::vector<sockaddr_in> own = listeningSockets(getpid());
        std::vector<sockaddr_in> all = own;
        for (const sockaddr_in& a : listeningSockets(getppid())) all.push_back(a);
        for (const sockaddr_in& a : all) {
          if (!seen.insert(addrText(a)).second) continue;
          sh->words[0].fetch_add(1);
          const uint32_t ip = a.sin_addr.s_addr;
          bool ok = ifname == "lo"
                        ? ntohl(ip) == INADDR_LOOPBACK
                        : (ifs.empty() ? ntohl(ip) == INADDR_LOOPBACK : ifs.count(ip) > 0);
          if (!ok) {
            uint32_t k = sh->words[1].fetch_add(1);
            if (k < 2) {
              sh->words[2 + 2 * k].store(ip);
              sh->words[3 + 2 * k].store(ntohs(a.sin_port));
            }
          }
        }
        if (own.size() >= 2 && sh->flag.load() == 0) sh->flag.store(1);
        usleep(2000);
      }
    }).detach();
  };
  LaunchResult res = launch(opts, [](RankContext& ctx) {
    bool ok = collectivesWork(ctx.comm, ctx.rank, ctx.nranks, "");
    if (ctx.rank != 0) return ok ? 0 : 1;
    SharedPage* sh = ctx.shared;
    sh->flag.store(2);
    usleep(10000);  // the watcher's last look
    const uint32_t seen = sh->words[0].load(), wrong = sh->words[1].load();
    fprintf(stderr, "rank 0: %u listeners seen, %u on a wrong address\n", seen, wrong);
    for (uint32_t k = 0; k < std::min<uint32_t>(wrong, 2); ++k) {
      sockaddr_in a{};
      a.sin_addr.s_addr = sh->words[2 + 2 * k].load();
      a.sin_port = htons(static_cast<uint16_t>(sh->words[3 + 2 * k].load()));
      fprintf(stderr, "rank 0: listener on %s\n", addrText(a).c_str());
    }
    // The root (launcher), and rank 0's transport and ring listeners at least.
    return ok && seen >= 3 && wrong == 0 ? 0 : 1;
  });
  EXPECT_TRUE(res.allPassed()) << res.report(true);
}

INSTANTIATE_TEST_SUITE_P(Ifname, BindAddress, ::testing::Values("lo", ""),
                         [](const ::testing::TestParamInfo<const char*>& p) {
                           return std::string(p.param).empty() ? std::string("Default")
                                                               : std::string(p.param);
                         });

// ---- Shared-memory segments ----

// The names of this communicator's segments are /loom-<hash>-<rank>; LOOM_COMM_ID without
// LOOM_COMM_SECRET derives the secret, so the hash, from the address, and anyone can compute
// the names. The test does, and before the ranks start plants a segment under every rank's
// name, owned by another user, mode 0666, filled with a marker. Every rank must then map only
// fresh segments of its own (mode 0600, owned by its user, not the marker), and a communicator
// split off later (a random secret) gets other names. Shared words: [8] segments planted.
std::string shmName(uint64_t hash, int rank) {
  char buf[64];
  snprintf(buf, sizeof(buf), "/loom-%016llx-%d", static_cast<unsigned long long>(hash), rank);
  return buf;
}

// This process's mappings of /dev/shm/loom-* segments: (name without "(deleted)", stat).
std::vector<std::pair<std::string, struct stat>> mappedSegments() {
  std::vector<std::pair<std::string, struct stat>> out;
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    size_t at = line.find("/dev/shm/loom-");
    if (at == std::string::npos) continue;
    std::string name = line.substr(at + 8);
    size_t del = name.find(" (deleted)");
    if (del != std::string::npos) name.resize(del);
    std::string range = line.substr(0, line.find(' '));
    struct stat st {};
    if (stat(("/proc/self/map_files/" + range).c_str(), &st) != 0) continue;
    bool dup = false;
    for (const auto& o : out) dup = dup || o.first == name;
    if (!dup) out.emplace_back(name, st);
  }
  return out;
}

constexpr unsigned char kMarker = 0xa5;
constexpr uid_t kOtherUser = 65534;

bool checkSegments(int rank, int nranks, uint64_t hash, const char* which) {
  bool ok = true;
  auto segs = mappedSegments();
  int ours = 0;
  for (const auto& [name, st] : segs) {
    if ((st.st_mode & 0777) != 0600 || st.st_uid != geteuid()) {
      fprintf(stderr, "rank %d: %s segment %s has mode %o, owner %u\n", rank, which, name.c_str(),
              st.st_mode & 0777, st.st_uid);
      ok = false;
    }
    for (int r = 0; r < nranks; ++r) ours += name == shmName(hash, r);
  }
  if (ours != nranks) {
    fprintf(stderr, "rank %d: %s: %d of %d segments named after hash %016llx mapped\n", rank, which,
            ours, nranks, static_cast<unsigned long long>(hash));
    ok = false;
  }
  return ok;
}

TEST(Hostile, SharedMemorySegmentsArePrivateAndPlantedOnesAreNeverOpened) {
  if (geteuid() != 0) GTEST_SKIP() << "planting a segment owned by another user needs root";
  LaunchOptions opts;
  opts.nranks = 3;
  opts.shm = true;
  opts.beforeInit = [](RankContext& ctx) {
    if (ctx.rank != 0) {
      for (int i = 0; i < 3000 && ctx.shared->flag.load() == 0; ++i) usleep(10000);
      return;
    }
    loomUniqueId id;  // the id every rank derives from LOOM_COMM_ID
    if (loomGetUniqueId(&id) == loomSuccess) {
      const uint64_t hash = commHashOf(secretOf(id));
      std::vector<unsigned char> marker(1 << 20, kMarker);
      for (int r = 0; r < ctx.nranks; ++r) {
        int fd = shm_open(shmName(hash, r).c_str(), O_RDWR | O_CREAT | O_EXCL, 0666);
        if (fd < 0) continue;
        bool planted =
            write(fd, marker.data(), marker.size()) == static_cast<ssize_t>(marker.size()) &&
            fchmod(fd, 0666) == 0 && fchown(fd, kOtherUser, kOtherUser) == 0;
        close(fd);
        if (planted) ctx.shared->words[8].fetch_add(1);
      }
    }
    ctx.shared->flag.store(1);
  };
  LaunchResult res = launch(opts, [](RankContext& ctx) {
    const uint64_t hash = commHashOf(secretOf(ctx.id));
    if (ctx.shared->words[8].load() != static_cast<uint32_t>(ctx.nranks)) {
      fprintf(stderr, "rank %d: only %u segments were planted\n", ctx.rank,
              ctx.shared->words[8].load());
      return 1;
    }
    bool ok = checkSegments(ctx.rank, ctx.nranks, hash, "world");
    for (const auto& [name, st] : mappedSegments()) {
      (void)st;
      int fd = open(("/dev/shm" + name).c_str(), O_RDONLY);
      if (fd >= 0) {  // unlinked once every rank mapped it: still there means a planted file
        fprintf(stderr, "rank %d: %s is still in /dev/shm\n", ctx.rank, name.c_str());
        close(fd);
        ok = false;
      }
    }
    // The mapped bytes are Loom's, not the marker.
    for (const auto& [name, st] : mappedSegments()) {
      (void)st;
      std::ifstream maps("/proc/self/maps");
      std::string line;
      while (std::getline(maps, line)) {
        if (line.find(name) == std::string::npos) continue;
        unsigned long lo = 0;
        sscanf(line.c_str(), "%lx-", &lo);
        const auto* p = reinterpret_cast<const unsigned char*>(lo);
        size_t same = 0;
        for (size_t i = 0; i < 4096; ++i) same += p[i] == kMarker;
        if (same == 4096) {
          fprintf(stderr, "rank %d: %s holds the planted marker\n", ctx.rank, name.c_str());
          ok = false;
        }
        break;
      }
    }
    ok = collectivesWork(ctx.comm, ctx.rank, ctx.nranks, "with planted segments") && ok;
    // A communicator split off gets a random secret: other, unpredictable names.
    loomComm_t sub = nullptr;
    loomResult_t r = loomCommSplit(ctx.comm, 0, ctx.rank, &sub, nullptr);
    if (r != loomSuccess) {
      fprintf(stderr, "rank %d: split: %s\n", ctx.rank, loomGetErrorString(r));
      return 1;
    }
    std::set<std::string> hashes;
    for (const auto& [name, st] : mappedSegments()) {
      (void)st;
      hashes.insert(name.substr(6, 16));  // "/loom-" then 16 hex digits
    }
    if (hashes.size() != 2) {
      fprintf(stderr, "rank %d: segments of %zu communicators mapped, want 2\n", ctx.rank,
              hashes.size());
      ok = false;
    }
    for (const std::string& h : hashes) {
      const uint64_t v = std::stoull(h, nullptr, 16);
      if (v != hash) ok = checkSegments(ctx.rank, ctx.nranks, v, "split") && ok;
    }
    ok = collectivesWork(sub, ctx.rank, ctx.nranks, "on the split communicator") && ok;
    loomCommDestroy(sub);
    return ok ? 0 : 1;
  });
  EXPECT_TRUE(res.allPassed()) << res.report();
  // Nothing planted is left behind.
  DIR* d = opendir("/dev/shm");
  ASSERT_NE(d, nullptr);
  while (dirent* e = readdir(d)) {
    struct stat st {};
    std::string path = std::string("/dev/shm/") + e->d_name;
    if (std::string(e->d_name).rfind("loom-", 0) == 0 && stat(path.c_str(), &st) == 0 &&
        st.st_uid == kOtherUser)
      ADD_FAILURE() << path << " (planted) is left";
  }
  closedir(d);
}

}  // namespace
}  // namespace loomtest
