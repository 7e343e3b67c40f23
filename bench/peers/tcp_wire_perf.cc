// tcp-wire-perf: the bytes a ring all-reduce moves over TCP, moved by a bare exchange with nothing
// else (no reduction, no framing, no step waiting for the one before), so that
// bench/peers/compare.sh can put beside Loom and Gloo, in the same run, what the sockets of this
// host carry for a plain program.
//
// Like loom-perf it starts -np ranks on this host by fork, with loom-perf's flags for the sweep
// (-b -e -f -i -n -w -np -T; -d and -o only name the row). The ranks form a ring over loopback
// TCP: rank r sends to rank r+1 and receives from rank r-1; with 2 ranks one connection carries
// both ways, as Loom's and Gloo's do. For a row of S bytes each rank sends 2(n-1)/n x S bytes and
// receives as many, what a ring all-reduce of S moves per rank (a reduce-scatter and an
// all-gather), streaming them out of a send buffer of S bytes and into a receive buffer of S
// (wrapping around) in non-blocking calls of up to 1 MiB. While a receive still waits for 16 KiB
// or more of its piece, the socket's receive low-water mark is that rest (so poll() wakes once
// for it), as Loom's TCP transport does; when neither way moves it spins a few rounds, then
// blocks in poll(). (Calls of 256 KiB without the low-water mark moved 10-20% less here; calls
// of 4 MiB no more.) algbw is S / time as nccl-tests counts it, so busbw (algbw x 2(n-1)/n) is
// the rate each rank's link carried.
//
// The buffers are allocated and touched once, before any timing, for the largest size. #wrong
// counts the 4-byte words of the receive buffer that do not hold the previous rank's pattern
// after a size's runs (the buffer is filled with junk first). There is no in-place form: those
// columns print N/A.
//
// Exit status: 0 on success, 1 when a transfer failed or a word was wrong, 2 on bad usage.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <new>
#include <vector>

#include "perf/perf.h"

namespace {

constexpr char kProg[] = "tcp-wire-perf";
constexpr int kMaxRanks = 64;
constexpr size_t kPiece = size_t{1} << 20;  // bytes a send() or recv() asks for at most
constexpr size_t kLowatMin = 16384;         // a rest this large is the low-water mark
constexpr int kSpins = 32;                  // rounds with nothing moved before poll()

// Shared by the ranks (an anonymous shared mapping made before the fork): a barrier, and each
// rank's time and wrong words for the size just run.
struct Shared {
  std::atomic<uint32_t> arrived;
  std::atomic<uint32_t> generation;
  double sec[kMaxRanks];
  int64_t wrong[kMaxRanks];
};

void Barrier(Shared* sh, int nranks) {
  const uint32_t gen = sh->generation.load();
  if (sh->arrived.fetch_add(1) + 1 == static_cast<uint32_t>(nranks)) {
    sh->arrived.store(0);
    sh->generation.fetch_add(1);
    return;
  }
  while (sh->generation.load() == gen) sched_yield();  // a dead rank: Launch's deadline ends it
}

// The 32-bit word i of rank r's send buffer.
uint32_t Pattern(int rank, size_t i) {
  return static_cast<uint32_t>(i) * 2654435761u + static_cast<uint32_t>(rank) * 40503u + 1;
}

bool Fail(int rank, const char* what) {
  std::fprintf(stderr, "%s: rank %d: %s: %s\n", kProg, rank, what, std::strerror(errno));
  return false;
}

// rfd's SO_RCVLOWAT, set only when it changes.
void SetLowat(int rfd, int* lowat, size_t want) {
  const int v = static_cast<int>(want);
  if (v != *lowat && setsockopt(rfd, SOL_SOCKET, SO_RCVLOWAT, &v, sizeof(v)) == 0) *lowat = v;
}

// Sends `total` bytes to sfd out of send[0, size) and receives as many from rfd into
// recv[0, size), both wrapping around; sfd may be rfd. *lowat: rfd's receive low-water mark.
bool Move(int rank, int sfd, int rfd, const char* send, char* recv, size_t size, size_t total,
          double deadline, int* lowat) {
  size_t sent = 0, got = 0;
  int idle = 0;
  while (sent < total || got < total) {
    bool moved = false;
    while (sent < total) {
      const size_t off = sent % size;
      const size_t len = std::min({kPiece, size - off, total - sent});
      const ssize_t w = ::send(sfd, send + off, len, MSG_DONTWAIT | MSG_NOSIGNAL);
      if (w < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) break;
        return Fail(rank, "send");
      }
      sent += static_cast<size_t>(w);
      moved = true;
    }
    while (got < total) {
      const size_t off = got % size;
      const size_t len = std::min({kPiece - got % kPiece, size - off, total - got});
      const ssize_t r = ::recv(rfd, recv + off, len, MSG_DONTWAIT);
      if (r == 0) {
        errno = ECONNRESET;
        return Fail(rank, "recv (the peer closed)");
      }
      if (r < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) break;
        return Fail(rank, "recv");
      }
      got += static_cast<size_t>(r);
      moved = true;
    }
    if (moved) {
      idle = 0;
      continue;
    }
    if (got < total) {
      const size_t rest = std::min(kPiece - got % kPiece, total - got);
      SetLowat(rfd, lowat, rest >= kLowatMin ? rest : 1);
    }
    if (++idle < kSpins) continue;
    if (perf::Now() > deadline) {
      errno = ETIMEDOUT;
      return Fail(rank, "moving the bytes");
    }
    pollfd p[2];
    nfds_t n = 0;
    const short out = sent < total ? POLLOUT : 0, in = got < total ? POLLIN : 0;
    if (sfd == rfd) {
      p[n++] = {sfd, static_cast<short>(out | in), 0};
    } else {
      if (out) p[n++] = {sfd, out, 0};
      if (in) p[n++] = {rfd, in, 0};
    }
    poll(p, n, 100);
  }
  return true;
}

int Listen(sockaddr_in* addr) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  *addr = {};
  addr->sin_family = AF_INET;
  addr->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(*addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(addr), sizeof(*addr)) != 0 || listen(fd, 4) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(addr), &len) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

int RunRank(const perf::Options& o, int rank, Shared* sh, const std::vector<int>& listeners,
            const std::vector<sockaddr_in>& addrs) {
  const int n = o.nranks, next = (rank + 1) % n;
  // Rank r connects to r+1's listener and accepts r-1's connection; with 2 ranks rank 0 only
  // connects and rank 1 only accepts, and the one connection carries both ways.
  int sfd = -1, rfd = -1;
  if (n > 2 || rank == 0) {
    sfd = socket(AF_INET, SOCK_STREAM, 0);
    if (sfd < 0 ||
        connect(sfd, reinterpret_cast<const sockaddr*>(&addrs[next]), sizeof(addrs[next])) != 0)
      return Fail(rank, "connect"), 1;
  }
  if (n > 2 || rank == 1) {
    rfd = accept(listeners[rank], nullptr, nullptr);
    if (rfd < 0) return Fail(rank, "accept"), 1;
  }
  if (sfd < 0) sfd = rfd;
  if (rfd < 0) rfd = sfd;
  const int one = 1;
  for (int fd : {sfd, rfd}) setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));

  const size_t maxBytes = std::max<size_t>(o.max_bytes, 4);
  auto* send = static_cast<uint32_t*>(perf::AllocPrefaulted(maxBytes));
  auto* recv = static_cast<uint32_t*>(perf::AllocPrefaulted(maxBytes));
  if (send == nullptr || recv == nullptr) return Fail(rank, "allocating the buffers"), 1;
  for (size_t i = 0; i < maxBytes / 4; ++i) send[i] = Pattern(rank, i);
  const int prev = (rank + n - 1) % n;
  const perf::TypeInfo& type = *o.types.front();
  const char* opName = o.ops.front()->name;
  const double factor = perf::BusFactor(perf::Coll::kAllReduce, n);
  const double deadline = perf::Now() + o.timeout_s;
  int lowat = 1;

  if (rank == 0) {
    std::printf(
        "# tcp-wire-perf: the bytes of a ring all-reduce, %d ranks, loopback TCP, no reduction\n"
        "# minBytes %zu maxBytes %zu warmup iters: %d iters: %d\n#\n",
        n, o.min_bytes, o.max_bytes, o.warmup, o.iters);
    perf::PrintColumns(false);
  }
  int64_t totalWrong = 0;
  for (size_t size : perf::Sizes(o)) {
    if (size < 4) continue;
    // What a ring all-reduce of `size` moves each way per rank.
    const size_t total = static_cast<size_t>(static_cast<double>(size) * factor);
    std::memset(recv, 0xA5, size);
    const char* s = reinterpret_cast<const char*>(send);
    char* r = reinterpret_cast<char*>(recv);
    Barrier(sh, n);
    for (int i = 0; i < o.warmup; ++i)
      if (!Move(rank, sfd, rfd, s, r, size, total, deadline, &lowat)) return 1;
    Barrier(sh, n);
    const double t0 = perf::Now();
    for (int i = 0; i < o.iters; ++i)
      if (!Move(rank, sfd, rfd, s, r, size, total, deadline, &lowat)) return 1;
    sh->sec[rank] = (perf::Now() - t0) / std::max(o.iters, 1);
    int64_t wrong = 0;
    for (size_t i = 0; i < size / 4; ++i) wrong += recv[i] != Pattern(prev, i);
    sh->wrong[rank] = wrong;
    Barrier(sh, n);
    if (rank == 0) {
      double sec = 0;  // the ranks' mean, as loom-perf's default -a 1
      int64_t wrongAll = 0;
      for (int k = 0; k < n; ++k) sec += sh->sec[k] / n, wrongAll += sh->wrong[k];
      totalWrong += wrongAll;
      perf::Stats oop;  // no in-place form: the in-place columns print N/A
      oop.ran = true;
      oop.time_us = sec * 1e6;
      oop.algbw = sec > 0 ? static_cast<double>(size) / sec / 1e9 : 0;
      oop.busbw = oop.algbw * factor;
      oop.wrong = wrongAll;
      perf::PrintRow(size, size / type.size, type.name, opName, -1, oop, perf::Stats{}, false);
    }
    Barrier(sh, n);  // rank 0 has read every rank's numbers
  }
  if (rank == 0)
    std::printf("# Out of bounds values : %lld %s\n#\n", static_cast<long long>(totalWrong),
                totalWrong > 0 ? "FAILED" : "OK");
  std::free(send);
  std::free(recv);
  close(sfd);
  if (rfd != sfd) close(rfd);
  return totalWrong > 0 ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  // The all-reduce's flags, ranks started here (-np), the peers' five types.
  const perf::FlagSet flags{kProg, true, false, {perf::Coll::kAllReduce}};
  const perf::Options o = perf::ParseFlags(argc, argv, flags);
  if (o.nranks < 2 || o.nranks > kMaxRanks) {
    std::fprintf(stderr, "%s: -np %d: must be 2 to %d\n", kProg, o.nranks, kMaxRanks);
    return 2;
  }
  void* mem =
      mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) {
    std::perror("tcp-wire-perf: mmap");
    return 1;
  }
  Shared* sh = new (mem) Shared{};
  std::vector<int> listeners(o.nranks);
  std::vector<sockaddr_in> addrs(o.nranks);
  for (int r = 0; r < o.nranks; ++r) {
    listeners[r] = Listen(&addrs[r]);
    if (listeners[r] < 0) {
      std::perror("tcp-wire-perf: listen on 127.0.0.1");
      return 1;
    }
  }
  const int rc = perf::Launch(kProg, o.nranks, o.timeout_s,
                              [&](int rank) { return RunRank(o, rank, sh, listeners, addrs); });
  for (int fd : listeners) close(fd);
  return rc;
}
