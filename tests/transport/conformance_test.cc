// Transport conformance: every transport against the Connection contract of
// transport/transport.h, directly (no communicator, no executor), over two real processes
// (two_ranks.h): real shared memory, real loopback sockets and, where an RDMA device is present,
// real queue pairs. Each transport joins with one INSTANTIATE_TEST_SUITE_P line at the bottom;
// where the contract leaves a transport room (how many credits the kernel adds), its
// TransportCase says so.
//
// The connections are made as src/comm/comm.cc makes them, with the transports' own set-up
// calls; what a communicator's bootstrap would carry goes over the control socket (shm's
// barriers), is known before the fork (the TCP listeners' addresses) or travels over a
// socketpair (ib's queue pair data, over a TCP connection on it that is also ib's watch link).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <functional>
#include <memory>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "transport/shm/shm_setup.h"
#include "transport/tcp/tcp_connection.h"
#include "transport/tcp/tcp_setup.h"
#include "transport/transport.h"
#include "two_ranks.h"
#include "util/env.h"
#include "util/net.h"
#include "util/wait.h"

#ifdef LOOM_HAVE_IB
#include "transport/ib/ib_connection.h"
#include "transport/ib/ib_setup.h"
#endif

namespace loomtest::transport {
namespace {

using loom::Status;
using loom::transport::Connection;
using loom::transport::Kind;
using loom::transport::Stamp;

constexpr size_t kSlot = 32 << 10;
constexpr size_t kDepth = 4;
// Past this many messages a sender that never runs out of slots has unbounded credit.
constexpr uint64_t kMaxFill = 16384;

// Cues on the control socket.
enum : uint32_t { kBarrier = 1, kFull, kReleased, kAnswer, kPosted, kGo, kBroken, kDying, kDone };

struct TransportCase {
  const char* name;
  Kind kind;
  // The sender's credit is exactly the receiver's free slots: trySendSlot() gives null with
  // `depth` slots in flight, and one release gives one slot back. Over TCP the kernel's socket
  // buffers hold frames too, so a sender runs out later and may need several releases.
  bool exactCredits;
};

void PrintTo(const TransportCase& c, std::ostream* os) { *os << c.name; }

std::string caseName(const ::testing::TestParamInfo<TransportCase>& info) {
  return info.param.name;
}

// ---- Making the connection ----

// What both ranks agree on before the fork.
struct Plan {
  uint64_t commHash = 0;
  std::unique_ptr<loom::transport::TcpListener> listeners[2];  // tcp
  sockaddr_in addrs[2] = {};
  int watch[2] = {-1, -1};  // ib: the two ends of the watch link's socketpair

  // In rank `rank`'s process: lets go of what belongs to the other rank.
  void keepOnly(int rank) {
    listeners[1 - rank].reset();
    if (watch[1 - rank] >= 0) close(watch[1 - rank]);
    watch[1 - rank] = -1;
  }
  ~Plan() {
    for (int fd : watch)
      if (fd >= 0) close(fd);
  }
};

// One rank's end: its links (the mapped segments or the device they live in) and the one
// connection. `conn`, declared last, is destroyed first, before what it lives in.
struct Endpoint {
  loom::transport::Links links;
  std::unique_ptr<Connection> conn;
};

Status toStatus(const ::testing::AssertionResult& r) {
  return r ? Status::ok() : Status(loomSystemError, r.message());
}

// The transport of `kind`, made with what it needs beyond SetupArgs.
loom::Result<std::unique_ptr<loom::transport::Transport>> makeTransport(Kind kind, int rank,
                                                                        Plan& plan,
                                                                        Control& control) {
  namespace lt = loom::transport;
  const int peer = 1 - rank;
  switch (kind) {
    case Kind::Shm: {
      auto barrier = [&control] {
        Status s = toStatus(control.send(kBarrier));
        return s.isOk() ? toStatus(control.expect(kBarrier)) : s;
      };
      return std::unique_ptr<lt::Transport>(std::make_unique<lt::ShmTransport>(0, barrier));
    }
    case Kind::Tcp:
      return std::unique_ptr<lt::Transport>(
          std::make_unique<lt::TcpTransport>(*plan.listeners[rank], "conformance",
                                             std::vector<lt::TcpPeer>{{peer, plan.addrs[peer]}}));
    case Kind::Ib: {
#ifdef LOOM_HAVE_IB
      namespace ib = lt::ib;
      std::string why;
      const ib::Verbs* verbs = ib::loadVerbs(&why);
      if (verbs == nullptr) return Status(loomSystemError, "ib: " + why);
      const auto ports =
          ib::listPorts(*verbs, loom::net::NameFilter::parse(loom::env::ibHca(), true),
                        !loom::env::ibHca().empty(), -1);
      if (ports.empty()) return Status(loomSystemError, "ib: no active port");
      // As comm.cc spreads the ranks of one host over its ports.
      const ib::PortChoice& choice = ports[static_cast<size_t>(rank) % ports.size()];
      LOOM_ASSIGN(auto device,
                  ib::Device::open(*verbs, choice, static_cast<int>(loom::env::ibGidIndex())));
      // The watch link, as comm.cc's (64-byte slots, depth 2), here over a socketpair.
      std::vector<std::unique_ptr<Connection>> watches(2);
      watches[static_cast<size_t>(peer)] =
          std::make_unique<lt::TcpConnection>(peer, plan.watch[rank], 64, 2);
      plan.watch[rank] = -1;
      return std::unique_ptr<lt::Transport>(
          std::make_unique<ib::IbTransport>(std::move(device), std::move(watches)));
#else
      return Status(loomSystemError, "this build has no ib transport");
#endif
    }
  }
  return Status(loomInternalError, "unknown transport");
}

// Every transport is then joined the same way.
Status join(Kind kind, int rank, Plan& plan, Control& control, Endpoint* ep) {
  LOOM_ASSIGN(auto transport, makeTransport(kind, rank, plan, control));
  if (transport->kind() != kind) return Status(loomInternalError, "made the wrong transport");
  loom::transport::SetupArgs args;
  args.rank = rank;
  args.peers = {1 - rank};
  args.commHash = plan.commHash;
  args.slotBytes = kSlot;
  args.depth = kDepth;
  args.deadlineNs = loom::nowNs() + 15'000'000'000LL;
  LOOM_ASSIGN(ep->links, transport->connect(args));
  if (ep->links.conns.size() != 1) return Status(loomInternalError, "expected one connection");
  ep->conn = std::move(ep->links.conns[0]);
  ep->links.conns.clear();
  return Status::ok();
}

// ---- Moving messages, every wait bounded ----

using ::testing::AssertionFailure;
using ::testing::AssertionResult;
using ::testing::AssertionSuccess;

AssertionResult checkSlot(const void* slot, size_t got, uint64_t msg, size_t bytes) {
  if (got != bytes)
    return AssertionFailure() << "message " << msg << " arrived with " << got << " bytes, not "
                              << bytes;
  const size_t wrong = firstWrongByte(slot, got, msg);
  if (wrong != got)
    return AssertionFailure() << "message " << msg << " (" << bytes << " bytes): byte " << wrong
                              << " differs from what was sent";
  return AssertionSuccess();
}

// Posts message msg of `bytes` bytes once a slot is free, with `stamp` when given.
AssertionResult sendMessage(Connection& c, uint64_t msg, size_t bytes, const Deadline& d,
                            const Stamp* stamp = nullptr) {
  for (;;) {
    Status s = c.progress();
    if (!s.isOk()) return AssertionFailure() << "sending message " << msg << ": " << s.message();
    if (void* slot = c.trySendSlot()) {
      fillMessage(slot, bytes, msg);
      if (stamp != nullptr) c.stampNext(*stamp);
      c.postSend(bytes);
      return AssertionSuccess();
    }
    if (d.passed()) return AssertionFailure() << "no free slot for message " << msg << " in time";
    c.wait(true, 10000);
  }
}

// Receives message msg, which must hold `bytes` bytes of its pattern; its stamp to *stamp.
AssertionResult recvMessage(Connection& c, uint64_t msg, size_t bytes, const Deadline& d,
                            Stamp* stamp = nullptr) {
  for (;;) {
    Status s = c.progress();
    size_t got = 0;
    // What arrived counts even where the peer failed after sending it.
    if (const void* slot = c.tryRecvSlot(&got)) {
      if (stamp != nullptr) *stamp = c.recvStamp();
      AssertionResult r = checkSlot(slot, got, msg, bytes);
      c.releaseRecv();
      return r;
    }
    if (s.isOk()) s = c.checkRecv();
    if (!s.isOk())
      return AssertionFailure() << "waiting for message " << msg << ": " << s.message();
    if (d.passed()) return AssertionFailure() << "message " << msg << " did not arrive in time";
    c.wait(false, 10000);
  }
}

// Progresses until every posted slot has left this process.
AssertionResult flush(Connection& c, const Deadline& d) {
  for (;;) {
    Status s = c.progress();
    if (!s.isOk()) return AssertionFailure() << "flushing: " << s.message();
    if (c.flushed()) return AssertionSuccess();
    if (d.passed()) return AssertionFailure() << "posted slots did not leave in time";
    c.wait(true, 10000);
  }
}

// Posts messages first, first + 1, ... (messageBytes sizes) while slots are free, the peer
// taking none; the FIFO is full once trySendSlot() stays null through five rounds of
// progress() and a 30 ms wait. *posted: how many were posted.
AssertionResult fillUntilFull(Connection& c, uint64_t first, const Deadline& d, uint64_t* posted) {
  uint64_t n = 0;
  for (int quiet = 0; quiet < 5;) {
    Status s = c.progress();
    if (!s.isOk()) return AssertionFailure() << "filling, after " << n << ": " << s.message();
    if (void* slot = c.trySendSlot()) {
      const size_t bytes = messageBytes(first + n, c.slotBytes());
      fillMessage(slot, bytes, first + n);
      c.postSend(bytes);
      quiet = 0;
      if (++n > kMaxFill)
        return AssertionFailure() << "trySendSlot() still gave slots after " << n
                                  << " messages that nobody received: no credit limit";
      continue;
    }
    ++quiet;
    if (d.passed()) return AssertionFailure() << "filling the FIFO did not settle in time";
    c.wait(true, 30000);
  }
  *posted = n;
  return AssertionSuccess();
}

// Sends `sends` messages from sendFirst and receives `recvs` from recvFirst at once, as a rank
// exchanging with its peer does, then flushes.
AssertionResult pump(Connection& c, uint64_t sendFirst, uint64_t sends, uint64_t recvFirst,
                     uint64_t recvs, const std::function<size_t(uint64_t)>& size,
                     const Deadline& d) {
  uint64_t sent = 0, got = 0;
  while (sent < sends || got < recvs || !c.flushed()) {
    Status s = c.progress();
    if (!s.isOk())
      return AssertionFailure() << "after " << sent << " sent and " << got
                                << " received: " << s.message();
    bool moved = false;
    if (sent < sends) {
      if (void* slot = c.trySendSlot()) {
        if (sent == 0 && c.trySendSlot() != slot)
          return AssertionFailure() << "trySendSlot() twice before postSend() gave two slots";
        const uint64_t m = sendFirst + sent++;
        fillMessage(slot, size(m), m);
        c.postSend(size(m));
        moved = true;
      }
    }
    if (got < recvs) {
      size_t b = 0;
      if (const void* slot = c.tryRecvSlot(&b)) {
        const uint64_t m = recvFirst + got++;
        AssertionResult r = checkSlot(slot, b, m, size(m));
        c.releaseRecv();
        if (!r) return r;
        moved = true;
      } else if (Status e = c.checkRecv(); !e.isOk()) {
        return AssertionFailure() << "after " << got << " received: " << e.message();
      }
    }
    if (moved) continue;
    if (d.passed())
      return AssertionFailure() << "stalled: " << sent << " of " << sends << " sent, " << got
                                << " of " << recvs << " received";
    c.wait(got < recvs ? false : true, 1000);
  }
  return AssertionSuccess();
}

// Both ranks: the last cue, so that neither closes its end while the other still uses it.
void finish(Control& control) {
  ASSERT_TRUE(control.send(kDone));
  ASSERT_TRUE(control.expect(kDone, nullptr, 20000));
}

// Repeats progress() and wait(forSend, timeoutUs), nothing arriving, until one wait sleeps its
// whole timeout; each must return within timeout + 2 s. wait() may return early (ib: a
// completion of this rank's own writes or heartbeats), but not every time.
AssertionResult waitSleepsItsTimeout(Connection& c, bool forSend, int64_t timeoutUs) {
  const double limit = timeoutUs / 1e6;
  std::string took;
  for (int attempt = 0; attempt < 5; ++attempt) {
    Status s = c.progress();
    if (!s.isOk()) return AssertionFailure() << "progress(): " << s.message();
    const double t0 = secondsNow();
    c.wait(forSend, timeoutUs);
    const double t = secondsNow() - t0;
    took += (took.empty() ? "" : ", ") + std::to_string(t) + " s";
    if (t > limit + 2.0)
      return AssertionFailure() << "wait(" << (forSend ? "send" : "recv") << ", " << limit
                                << " s) returned after " << t << " s";
    if (t >= 0.9 * limit) return AssertionSuccess();
  }
  return AssertionFailure() << "wait(" << (forSend ? "send" : "recv") << ", " << limit
                            << " s) never slept its timeout: " << took;
}

// Progresses and waits (up to waitUs a time) until progress() or checkRecv() fails or
// `seconds` pass; returns the failure (ok when none came).
Status untilError(Connection& c, double seconds, int64_t waitUs) {
  const Deadline d(seconds);
  for (;;) {
    Status s = c.progress();
    if (s.isOk()) s = c.checkRecv();
    if (!s.isOk() || d.passed()) return s;
    c.wait(false, waitUs);
  }
}

// ---- The suite ----

using Side = std::function<void(Connection&, Control&)>;

class ConnectionConformance : public ::testing::TestWithParam<TransportCase> {
 protected:
  void SetUp() override {
    if (GetParam().kind != Kind::Ib) return;
#ifdef LOOM_HAVE_IB
    std::string why;
    if (!loom::transport::ib::available(&why))
      GTEST_SKIP() << "ib: no usable RDMA device here (" << why
                   << "); tests/rdma/run.sh runs this suite over Soft-RoCE";
#else
    GTEST_SKIP() << "ib: this build has no ib transport (infiniband/verbs.h was not found)";
#endif
  }

  bool exact() const { return GetParam().exactCredits; }

  // Runs `child` as rank 1 in a forked process and `parent` as rank 0 here, each with its end
  // of one connection; then the child must exit cleanly or, with childDies, by SIGKILL.
  void runPair(const Side& parent, const Side& child, bool childDies = false) {
    const Kind kind = GetParam().kind;
    Plan plan;
    plan.commHash = (static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}();
    int ctl[2];
    ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, ctl), 0);
    if (kind == Kind::Tcp) {
      for (int r = 0; r < 2; ++r) {
        auto l = loom::transport::TcpListener::open("127.0.0.1");
        ASSERT_TRUE(l.isOk()) << l.status().message();
        plan.listeners[r] = l.take();
        plan.addrs[r] = plan.listeners[r]->address();
      }
    }
    if (kind == Kind::Ib) {
      ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, plan.watch), 0);
      for (int fd : plan.watch) fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    }
    const pid_t pid = forkChild([&] {
      close(ctl[0]);
      Control control(ctl[1]);
      plan.keepOnly(1);
      Endpoint ep;
      Status s = join(kind, 1, plan, control, &ep);
      ASSERT_TRUE(s.isOk()) << "rank 1: set-up: " << s.message();
      child(*ep.conn, control);
    });
    ASSERT_GT(pid, 0) << "fork";
    close(ctl[1]);
    {
      Control control(ctl[0]);
      plan.keepOnly(0);
      Endpoint ep;
      Status s = join(kind, 0, plan, control, &ep);
      EXPECT_TRUE(s.isOk()) << "rank 0: set-up: " << s.message();
      if (s.isOk()) parent(*ep.conn, control);
    }  // our ends close here: a child still waiting on them hears it at once
    const ChildEnd end = waitChild(pid, 20000);
    if (childDies)
      EXPECT_TRUE(end.signal == SIGKILL && !end.killed) << "rank 1 (forked) " << end.text();
    else
      EXPECT_TRUE(end.exited && end.code == 0)
          << "rank 1 (forked) " << end.text() << "; its failures, if any, are printed above";
  }
};

// Many messages each way at once, of every size from 0 to slotBytes(): each arrives in order,
// with its size and every byte as sent.
TEST_P(ConnectionConformance, SlotsArriveInOrderWithTheirSizesAndBytes) {
  constexpr uint64_t kCount = 500;
  auto size = [](uint64_t m) { return messageBytes(m, kSlot); };
  auto side = [&](int rank) {
    return [&, rank](Connection& c, Control& control) {
      EXPECT_EQ(c.kind(), GetParam().kind);
      EXPECT_EQ(c.peer(), 1 - rank);
      EXPECT_EQ(c.slotBytes(), kSlot);
      const uint64_t mine = (rank + 1) * 1'000'000ULL, theirs = (2 - rank) * 1'000'000ULL;
      EXPECT_TRUE(pump(c, mine, kCount, theirs, kCount, size, Deadline(15)));
      finish(control);
    };
  };
  runPair(side(0), side(1));
}

// With every slot in flight trySendSlot() gives null, and stays null while the receiver holds
// them; once the receiver releases one the sender gets a slot again: the very next one where
// credits are exact, else (TCP) after as many releases as the kernel needs.
TEST_P(ConnectionConformance, SenderRunsOutOfCreditsUntilTheReceiverReleasesOne) {
  const bool exactCredits = exact();
  runPair(
      [&](Connection& c, Control& control) {
        uint64_t posted = 0;
        ASSERT_TRUE(control.expect(kFull, &posted, 20000));
        const Deadline d(15);
        // Release one slot at a time until the sender says it has one: at once where credits
        // are exact (it has 5 s), else after a 5 ms look at each release.
        uint64_t released = 0;
        for (;;) {
          ASSERT_TRUE(recvMessage(c, released, messageBytes(released, kSlot), d));
          ++released;
          ASSERT_TRUE(c.progress().isOk());
          if (released == 1) {
            ASSERT_TRUE(control.send(kReleased));
          }
          if (control.readable(exactCredits ? 5000 : 5)) break;
          ASSERT_FALSE(exactCredits) << "no slot for the sender within 5 s of a release";
          ASSERT_LT(released, posted) << "every slot released, and still no credit";
        }
        ASSERT_TRUE(control.expect(kAnswer));
        if (exactCredits) {
          EXPECT_EQ(released, 1u) << "releases before the sender got a slot";
        }
        ASSERT_TRUE(control.expect(kPosted));
        for (uint64_t m = released; m <= posted; ++m)
          ASSERT_TRUE(recvMessage(c, m, messageBytes(m, kSlot), d));
        finish(control);
      },
      [&](Connection& c, Control& control) {
        const Deadline d(15);
        uint64_t posted = 0;
        ASSERT_TRUE(fillUntilFull(c, 0, d, &posted));
        if (exactCredits) {
          EXPECT_EQ(posted, kDepth) << "slots posted before trySendSlot() gave null";
        }
        ASSERT_TRUE(control.send(kFull, posted));
        ASSERT_TRUE(control.expect(kReleased, nullptr, 20000));
        const Deadline look(10);
        while (c.trySendSlot() == nullptr) {
          ASSERT_FALSE(look.passed()) << "no slot within 10 s of the receiver releasing slots";
          c.wait(true, 10000);
          ASSERT_TRUE(c.progress().isOk());
        }
        ASSERT_TRUE(control.send(kAnswer));
        // The credit is good for one message.
        ASSERT_TRUE(sendMessage(c, posted, messageBytes(posted, kSlot), d));
        if (exactCredits) {
          ASSERT_TRUE(c.progress().isOk());
          EXPECT_EQ(c.trySendSlot(), nullptr) << "one release gave more than one slot";
        }
        ASSERT_TRUE(control.send(kPosted));
        ASSERT_TRUE(flush(c, d));
        finish(control);
      });
}

// The sender fills every slot (and, over TCP, the socket buffers) while the receiver takes
// nothing; then the receiver drains them all, in order and intact, and no more.
TEST_P(ConnectionConformance, AFullFifoDrainsInOrder) {
  const bool exactCredits = exact();
  runPair(
      [&](Connection& c, Control& control) {
        uint64_t posted = 0;
        ASSERT_TRUE(control.expect(kFull, &posted, 20000));
        const Deadline d(15);
        for (uint64_t m = 0; m < posted; ++m)
          ASSERT_TRUE(recvMessage(c, m, messageBytes(m, kSlot), d));
        // Nothing more: the sender posted `posted` and flushed them.
        usleep(50000);
        ASSERT_TRUE(c.progress().isOk());
        size_t b = 0;
        EXPECT_EQ(c.tryRecvSlot(&b), nullptr) << "a slot beyond the " << posted << " posted";
        finish(control);
      },
      [&](Connection& c, Control& control) {
        const Deadline d(15);
        uint64_t posted = 0;
        ASSERT_TRUE(fillUntilFull(c, 0, d, &posted));
        if (exactCredits) {
          EXPECT_EQ(posted, kDepth);
        }
        ASSERT_TRUE(control.send(kFull, posted));
        ASSERT_TRUE(flush(c, d));
        finish(control);
      });
}

// An empty message is a slot like any other: it arrives (a non-null slot of 0 bytes), in its
// place between others, and takes one slot.
TEST_P(ConnectionConformance, AZeroLengthMessageIsASlotOfItsOwn) {
  const std::vector<size_t> sizes = {0, 1, 0, 0, 3, 0, kSlot, 0};
  runPair(
      [&](Connection& c, Control& control) {
        const Deadline d(10);
        for (size_t m = 0; m < sizes.size(); ++m) ASSERT_TRUE(recvMessage(c, m, sizes[m], d));
        finish(control);
      },
      [&](Connection& c, Control& control) {
        const Deadline d(10);
        for (size_t m = 0; m < sizes.size(); ++m) ASSERT_TRUE(sendMessage(c, m, sizes[m], d));
        ASSERT_TRUE(flush(c, d));
        finish(control);
      });
}

// A thread that waits learns of news as wakeup() says, as the executor waits: on Self
// connections in wait(); on the others in a poll() of fd() (armed by prepareWait() first). The
// news comes within a second of a wait bounded at 5 s.
TEST_P(ConnectionConformance, NewsReachesAWaiterAsWakeupSays) {
  runPair(
      [&](Connection& c, Control& control) {
        const bool self = c.wakeup() == loom::transport::Wakeup::Self;
        EXPECT_EQ(self, c.fd() < 0) << "fd() must be -1 exactly when wakeup() is Self";
        const Deadline d(10);
        ASSERT_TRUE(control.send(kGo));
        const double t0 = secondsNow();
        size_t got = 0;
        for (;;) {
          ASSERT_TRUE(c.progress().isOk());
          if (c.tryRecvSlot(&got) != nullptr) break;
          ASSERT_FALSE(d.passed()) << "message 0 did not arrive in time";
          if (self) {
            c.wait(false, 5'000'000);
          } else if (!c.prepareWait()) {
            pollfd p{c.fd(), c.pollEvents(), 0};
            ASSERT_NE(p.events, 0) << "nothing to poll for while a receive waits";
            poll(&p, 1, 5000);
          }
        }
        EXPECT_LT(secondsNow() - t0, 1.0) << "the news did not end the wait";
        ASSERT_TRUE(checkSlot(c.tryRecvSlot(&got), got, 0, 100));
        c.releaseRecv();
        finish(control);
      },
      [&](Connection& c, Control& control) {
        ASSERT_TRUE(control.expect(kGo));
        // Late enough that the peer is asleep in its wait.
        usleep(200'000);
        ASSERT_TRUE(sendMessage(c, 0, 100, Deadline(10)));
        ASSERT_TRUE(flush(c, Deadline(10)));
        finish(control);
      });
}

// Messages of exactly slotBytes() bytes, more than the FIFO holds, both ways at once: each
// arrives whole.
TEST_P(ConnectionConformance, AMessageOfSlotBytesArrivesWhole) {
  constexpr uint64_t kCount = 3 * kDepth + 1;
  auto size = [](uint64_t) { return kSlot; };
  auto side = [&](int rank) {
    return [&, rank](Connection& c, Control& control) {
      ASSERT_EQ(c.slotBytes(), kSlot);
      const uint64_t mine = (rank + 1) * 1000ULL, theirs = (2 - rank) * 1000ULL;
      EXPECT_TRUE(pump(c, mine, kCount, theirs, kCount, size, Deadline(10)));
      finish(control);
    };
  };
  runPair(side(0), side(1));
}

// stampNext() attaches a stamp to the next slot posted only: the receiver reads it with
// recvStamp() on that slot, and seq 0 on slots posted without one; through slot reuse, on an
// empty slot and on a full one.
TEST_P(ConnectionConformance, StampsRideWithTheirSlots) {
  constexpr uint64_t kCount = 2 * kDepth + 3;
  auto size = [](uint64_t m) { return m == 4 ? 0 : m == 5 ? kSlot : messageBytes(m, kSlot); };
  auto stampOf = [](uint64_t m) {
    Stamp s;
    s.seq = 1000 + m;
    s.earliestNs = -static_cast<int64_t>(m) * 1000 - 1;
    s.latestNs = static_cast<int64_t>(m) * 1'000'000'007LL;
    s.earliestRank = static_cast<int32_t>(m);
    s.latestRank = static_cast<int32_t>(100 + m);
    return s;
  };
  auto stamped = [](uint64_t m) { return m % 2 == 0 || m == 5; };
  runPair(
      [&](Connection& c, Control& control) {
        const Deadline d(10);
        for (uint64_t m = 0; m < kCount; ++m) {
          Stamp got;
          ASSERT_TRUE(recvMessage(c, m, size(m), d, &got));
          if (!stamped(m)) {
            EXPECT_EQ(got.seq, 0u) << "message " << m << " was posted without a stamp";
            continue;
          }
          const Stamp want = stampOf(m);
          EXPECT_EQ(got.seq, want.seq) << "message " << m;
          EXPECT_EQ(got.earliestNs, want.earliestNs) << "message " << m;
          EXPECT_EQ(got.latestNs, want.latestNs) << "message " << m;
          EXPECT_EQ(got.earliestRank, want.earliestRank) << "message " << m;
          EXPECT_EQ(got.latestRank, want.latestRank) << "message " << m;
        }
        finish(control);
      },
      [&](Connection& c, Control& control) {
        const Deadline d(10);
        for (uint64_t m = 0; m < kCount; ++m) {
          const Stamp s = stampOf(m);
          ASSERT_TRUE(sendMessage(c, m, size(m), d, stamped(m) ? &s : nullptr));
        }
        ASSERT_TRUE(flush(c, d));
        finish(control);
      });
}

// With nothing coming, wait() returns within its timeout: a receiver's, and a sender's whose
// every slot is in flight to a peer that takes nothing.
TEST_P(ConnectionConformance, WaitReturnsWithinItsTimeoutWhenNothingComes) {
  // Under ib's 250 ms heartbeat, so that not every wait has a completion to wake it.
  constexpr int64_t kWaitUs = 200'000;
  runPair(
      [&](Connection& c, Control& control) {
        EXPECT_TRUE(waitSleepsItsTimeout(c, false, kWaitUs));
        uint64_t posted = 0;
        ASSERT_TRUE(fillUntilFull(c, 0, Deadline(10), &posted));
        EXPECT_TRUE(waitSleepsItsTimeout(c, true, kWaitUs));
        ASSERT_TRUE(control.send(kDone));
      },
      [&](Connection&, Control& control) {
        // Idle until told; takes nothing.
        ASSERT_TRUE(control.expect(kDone, nullptr, 20000));
      });
}

// markBroken() on one side ends the other's wait at once (not at its 5 s timeout), with
// loomRemoteError from progress() or checkRecv(), and lostRank() names the peer.
TEST_P(ConnectionConformance, MarkBrokenEndsThePeersWaitAtOnce) {
  runPair(
      [&](Connection& c, Control& control) {
        ASSERT_TRUE(c.progress().isOk());
        ASSERT_TRUE(c.checkRecv().isOk());
        EXPECT_EQ(c.lostRank(), -1);
        ASSERT_TRUE(control.send(kGo));
        const double t0 = secondsNow();
        Status s = untilError(c, 6, 5'000'000);
        const double took = secondsNow() - t0;
        ASSERT_FALSE(s.isOk()) << "no error within 6 s of the peer's markBroken()";
        EXPECT_EQ(s.code(), loomRemoteError) << s.message();
        EXPECT_LT(took, 2.5) << "a wait(5 s) did not end at the peer's markBroken(): "
                             << s.message();
        EXPECT_EQ(c.lostRank(), 1) << s.message();
        ASSERT_TRUE(control.expect(kBroken));
        ASSERT_TRUE(control.send(kDone));
      },
      [&](Connection& c, Control& control) {
        ASSERT_TRUE(control.expect(kGo));
        usleep(100000);  // the peer is asleep in wait() by now
        c.markBroken();
        ASSERT_TRUE(control.send(kBroken));
        ASSERT_TRUE(control.expect(kDone, nullptr, 20000));
      });
}

// markBrokenBecause(7): the peer's error and lostRank() name rank 7, the rank actually lost.
TEST_P(ConnectionConformance, MarkBrokenBecauseNamesTheRankLost) {
  runPair(
      [&](Connection& c, Control& control) {
        ASSERT_TRUE(control.expect(kBroken));
        Status s = untilError(c, 5, 10000);
        ASSERT_FALSE(s.isOk()) << "no error within 5 s of the peer's markBrokenBecause(7)";
        EXPECT_EQ(s.code(), loomRemoteError) << s.message();
        EXPECT_EQ(c.lostRank(), 7) << s.message();
        EXPECT_NE(s.message().find("rank 7"), std::string::npos) << s.message();
        ASSERT_TRUE(control.send(kDone));
      },
      [&](Connection& c, Control& control) {
        c.markBrokenBecause(7);
        ASSERT_TRUE(control.send(kBroken));
        ASSERT_TRUE(control.expect(kDone, nullptr, 20000));
      });
}

// The sender posts the first slots of a longer message, as many as it can (over TCP its last
// frame may be cut short in the socket), and is SIGKILLed. The receiver gets what arrived, in
// order and intact, then loomRemoteError within 5 s, lostRank() naming the dead rank: never a
// hang.
TEST_P(ConnectionConformance, APeerThatDiesMidMessageIsAnErrorNotAHang) {
  const TransportCase tc = GetParam();
  runPair(
      [&](Connection& c, Control& control) {
        uint64_t posted = 0;
        ASSERT_TRUE(control.expect(kDying, &posted, 20000));
        const double t0 = secondsNow();
        const Deadline d(5);
        uint64_t got = 0;
        Status s;
        for (;;) {
          s = c.progress();
          size_t b = 0;
          if (const void* slot = c.tryRecvSlot(&b)) {
            ASSERT_TRUE(checkSlot(slot, b, got, messageBytes(got, kSlot)));
            c.releaseRecv();
            ++got;
            continue;
          }
          if (s.isOk()) s = c.checkRecv();
          if (!s.isOk() || d.passed()) break;
          c.wait(false, 10000);
        }
        const double took = secondsNow() - t0;
        EXPECT_LE(got, posted);
        if (tc.exactCredits) {
          EXPECT_EQ(got, posted) << "slots posted before the death, lost";
        }
        ASSERT_FALSE(s.isOk()) << "no error within 5 s of the peer's death (" << got
                               << " slots received)";
        EXPECT_EQ(s.code(), loomRemoteError) << s.message();
        EXPECT_LT(took, 5.0) << s.message();
        EXPECT_EQ(c.lostRank(), 1) << s.message();
      },
      [&](Connection& c, Control& control) {
        uint64_t posted = 0;
        ASSERT_TRUE(fillUntilFull(c, 0, Deadline(10), &posted));
        ASSERT_TRUE(control.send(kDying, posted));
        raise(SIGKILL);
      },
      /*childDies=*/true);
}

// A peer that closes after its last send is normal: what it sent is read to the end without
// an error; only then does a receiver still waiting on it fail, naming it.
TEST_P(ConnectionConformance, APeerThatLeavesAfterItsLastSendIsReadToTheEnd) {
  const std::vector<size_t> sizes = {kSlot, 0, 100};
  runPair(
      [&](Connection& c, Control& control) {
        ASSERT_TRUE(control.expectClosed(10000));  // the peer's process is gone
        const Deadline d(5);
        for (size_t m = 0; m < sizes.size(); ++m) ASSERT_TRUE(recvMessage(c, m, sizes[m], d));
        Status s = untilError(c, 5, 10000);
        ASSERT_FALSE(s.isOk()) << "waiting on a peer that left: no error within 5 s";
        EXPECT_EQ(s.code(), loomRemoteError) << s.message();
        EXPECT_EQ(c.lostRank(), 1) << s.message();
      },
      [&](Connection& c, Control&) {
        const Deadline d(5);
        for (size_t m = 0; m < sizes.size(); ++m) ASSERT_TRUE(sendMessage(c, m, sizes[m], d));
        ASSERT_TRUE(flush(c, d));
      });
}

// ---- The transports ----

INSTANTIATE_TEST_SUITE_P(Shm, ConnectionConformance,
                         ::testing::Values(TransportCase{"shm", Kind::Shm, true}), caseName);
INSTANTIATE_TEST_SUITE_P(Tcp, ConnectionConformance,
                         ::testing::Values(TransportCase{"tcp", Kind::Tcp, false}), caseName);
INSTANTIATE_TEST_SUITE_P(Ib, ConnectionConformance,
                         ::testing::Values(TransportCase{"ib", Kind::Ib, true}), caseName);

}  // namespace
}  // namespace loomtest::transport
