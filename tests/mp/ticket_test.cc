// Per-operation completion on non-blocking communicators (loomCommLastTicket,
// loomCommWaitTicket), on real processes over shared memory and TCP: each queued
// call gets the next ticket; a wait returns when that operation is done (not the
// whole queue), its buffers then hold the scalar reference's values; a test of an
// operation a late peer holds up says in progress; a failed operation's ticket
// carries its own error, naming the dead peer, within the timeout; a thread
// blocked on a ticket returns when another thread aborts the communicator; bad
// tickets are refused by name, and a blocking communicator has none.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "harness.h"

namespace loomtest {
namespace {

// The value rank r contributes at index i: small integers, so float sums are exact.
float ticketInput(int r, size_t i, int salt) {
  return static_cast<float>((r + 1) * 10 + static_cast<int>((i * 13 + salt) % 31));
}

struct Checker {
  int rank;
  int failures = 0;
  void fail(const std::string& what) {
    fprintf(stderr, "rank %d: FAIL %s\n", rank, what.c_str());
    ++failures;
  }
  void expectResult(const char* what, loomResult_t got, loomResult_t want) {
    if (got != want)
      fail(std::string(what) + ": " + loomGetErrorString(got) + ", expected " +
           loomGetErrorString(want) + " (" + loomGetLastError(nullptr) + ")");
  }
};

// Starts a non-blocking communicator, whose running initialisation must be ticket 1, and waits
// for it.
loomResult_t initTicketOne(RankContext& ctx, Checker& c) {
  const loomResult_t r = startNonBlocking(ctx);
  if (r != loomInProgress) return r;
  uint64_t t = 0;
  c.expectResult("loomCommLastTicket after init", loomCommLastTicket(ctx.comm, &t), loomSuccess);
  if (t != 1) c.fail("initialisation's ticket is " + std::to_string(t) + ", expected 1");
  return loomCommWaitTicket(ctx.comm, 1, -1);
}

int ticketsRank(RankContext& ctx) {
  Checker c{ctx.rank};
  c.expectResult("init", initTicketOne(ctx, c), loomSuccess);
  if (c.failures) return 1;
  const int n = ctx.nranks;
  const int late = n - 1;

  // Bad tickets and arguments, each refused by name.
  c.expectResult("wait ticket 0", loomCommWaitTicket(ctx.comm, 0, 0), loomInvalidArgument);
  if (!strstr(loomGetLastError(nullptr), "ticket")) c.fail("ticket 0's error does not name it");
  c.expectResult("wait a future ticket", loomCommWaitTicket(ctx.comm, 99, 0), loomInvalidArgument);
  c.expectResult("last ticket into NULL", loomCommLastTicket(ctx.comm, nullptr),
                 loomInvalidArgument);
  c.expectResult("wait on a NULL comm", loomCommWaitTicket(nullptr, 1, 0), loomInvalidArgument);

  // The late rank joins 300 ms after the others queued the first operation.
  if (ctx.rank == late) usleep(300000);
  const size_t count = 70001;
  std::vector<float> a(count), sum(count, -1), gathered(count * n, -1), bcast(count, -1);
  for (size_t i = 0; i < count; ++i) a[i] = bcast[i] = ticketInput(ctx.rank, i, 0);
  std::vector<float> toNext(999), fromPrev(999, -1);
  for (size_t i = 0; i < toNext.size(); ++i) toNext[i] = ticketInput(ctx.rank, i, 3);

  std::vector<uint64_t> tickets;
  c.expectResult(
      "all-reduce",
      loomAllReduce(a.data(), sum.data(), count, loomFloat32, loomSum, ctx.comm, nullptr),
      loomInProgress);
  tickets.push_back(lastTicket(ctx.comm));
  if (ctx.rank != late)  // held up by the late rank: a test (timeout 0) says in progress
    c.expectResult("test of the held-up all-reduce", loomCommWaitTicket(ctx.comm, tickets[0], 0),
                   loomInProgress);
  c.expectResult("all-gather",
                 loomAllGather(a.data(), gathered.data(), count, loomFloat32, ctx.comm, nullptr),
                 loomInProgress);
  tickets.push_back(lastTicket(ctx.comm));
  c.expectResult(
      "broadcast",
      loomBroadcast(bcast.data(), bcast.data(), count, loomFloat32, 1 % n, ctx.comm, nullptr),
      loomInProgress);
  tickets.push_back(lastTicket(ctx.comm));
  loomGroupStart();
  loomSend(toNext.data(), toNext.size(), loomFloat32, (ctx.rank + 1) % n, ctx.comm, nullptr);
  loomRecv(fromPrev.data(), fromPrev.size(), loomFloat32, (ctx.rank + n - 1) % n, ctx.comm,
           nullptr);
  c.expectResult("group", loomGroupEnd(), loomInProgress);
  tickets.push_back(lastTicket(ctx.comm));
  for (size_t k = 0; k < tickets.size(); ++k)
    if (tickets[k] != 2 + k)
      c.fail("operation " + std::to_string(k) + " has ticket " + std::to_string(tickets[k]) +
             ", expected " + std::to_string(2 + k));

  // Another thread waits for the broadcast while this one waits for the all-reduce alone and
  // checks its result before anything else is waited for.
  loomResult_t fromThread = loomInternalError;
  std::thread waiter([&] { fromThread = loomCommWaitTicket(ctx.comm, tickets[2], -1); });
  c.expectResult("wait for the all-reduce", loomCommWaitTicket(ctx.comm, tickets[0], -1),
                 loomSuccess);
  int wrong = 0;
  for (size_t i = 0; i < count; ++i) {
    float s = 0;
    for (int q = 0; q < n; ++q) s += ticketInput(q, i, 0);
    if (sum[i] != s && ++wrong <= 3)
      c.fail("sum[" + std::to_string(i) + "] = " + std::to_string(sum[i]) + ", expected " +
             std::to_string(s));
  }
  waiter.join();
  c.expectResult("another thread's wait for the broadcast", fromThread, loomSuccess);
  // The group, the last ticket, done means every earlier one is too: a test answers at once.
  c.expectResult("wait for the group", loomCommWaitTicket(ctx.comm, tickets[3], -1), loomSuccess);
  c.expectResult("test of the all-gather", loomCommWaitTicket(ctx.comm, tickets[1], 0),
                 loomSuccess);
  for (size_t i = 0; i < count; ++i) {
    for (int q = 0; q < n; ++q)
      if (gathered[q * count + i] != ticketInput(q, i, 0) && ++wrong <= 6)
        c.fail("all-gather value");
    if (bcast[i] != ticketInput(1 % n, i, 0) && ++wrong <= 6) c.fail("broadcast value");
  }
  for (size_t i = 0; i < fromPrev.size(); ++i)
    if (fromPrev[i] != ticketInput((ctx.rank + n - 1) % n, i, 3) && ++wrong <= 9)
      c.fail("recv value");
  c.expectResult("destroy", loomCommDestroy(ctx.comm), loomSuccess);
  ctx.comm = nullptr;
  return c.failures == 0 ? 0 : 1;
}

class TicketTest : public ::testing::TestWithParam<bool> {};

// Three processes over the parameter's transport, each starting its own non-blocking communicator.
LaunchOptions threeRanks(bool shm) {
  LaunchOptions opts;
  opts.nranks = 3;
  opts.shm = shm;
  opts.initComm = false;
  return opts;
}

TEST_P(TicketTest, EachOperationCompletesOnItsOwnTicketWithTheReferenceValues) {
  LaunchOptions opts = threeRanks(GetParam());
  LaunchResult res = launch(opts, ticketsRank);
  EXPECT_TRUE(res.allPassed()) << res.report();
}

// Operations nobody waits for still run, on the communicator's thread. Each rank first waits for
// an all-reduce at once (its thread runs it, so the worker is not woken by the next post and must
// find the next task by looking), then queues all-reduces it only tests (timeout 0, which never
// runs one) until each is done; the last is also left to finish while the rank sleeps (the
// worker, woken or looking, moves it). Every sum is the scalar reference's; each finishes
// within 5 s of its post (the worker's grace and look are microseconds).
int unwaitedRank(RankContext& ctx) {
  Checker c{ctx.rank};
  c.expectResult("init", initTicketOne(ctx, c), loomSuccess);
  if (c.failures) return 1;
  const int n = ctx.nranks;
  const size_t count = 257;
  std::vector<float> a(count), out(count, -1);
  auto checkSum = [&](const char* what, int salt) {
    int wrong = 0;
    for (size_t i = 0; i < count; ++i) {
      float s = 0;
      for (int q = 0; q < n; ++q) s += ticketInput(q, i, salt);
      if (out[i] != s && ++wrong <= 3)
        c.fail(std::string(what) + ": out[" + std::to_string(i) + "] = " + std::to_string(out[i]) +
               ", expected " + std::to_string(s));
    }
  };
  auto post = [&](int salt) {
    for (size_t i = 0; i < count; ++i) a[i] = ticketInput(ctx.rank, i, salt);
    std::fill(out.begin(), out.end(), -1.0f);
    c.expectResult(
        "all-reduce",
        loomAllReduce(a.data(), out.data(), count, loomFloat32, loomSum, ctx.comm, nullptr),
        loomInProgress);
    return lastTicket(ctx.comm);
  };
  c.expectResult("the all-reduce waited for at once", loomCommWaitTicket(ctx.comm, post(0), -1),
                 loomSuccess);
  checkSum("the all-reduce waited for at once", 0);
  for (int k = 1; k <= 3; ++k) {
    const uint64_t t = post(k);
    const auto start = std::chrono::steady_clock::now();
    loomResult_t r = loomInProgress;
    while ((r = loomCommWaitTicket(ctx.comm, t, 0)) == loomInProgress &&
           std::chrono::steady_clock::now() - start < std::chrono::seconds(5))
      usleep(100);
    c.expectResult(("tested all-reduce " + std::to_string(k)).c_str(), r, loomSuccess);
    checkSum("a tested all-reduce", k);
  }
  const uint64_t last = post(9);
  // Nobody waits: the worker runs it meanwhile (looked at without waiting, every 50 ms for up to
  // 5 s, as a rank behind on a loaded machine may take longer than one look).
  loomResult_t left = loomInProgress;
  for (int look = 0; look < 100 && left == loomInProgress; ++look) {
    usleep(50000);
    left = loomCommWaitTicket(ctx.comm, last, 0);
  }
  c.expectResult("the all-reduce left while the rank slept", left, loomSuccess);
  checkSum("the all-reduce left while the rank slept", 9);
  c.expectResult("destroy", loomCommDestroy(ctx.comm), loomSuccess);
  ctx.comm = nullptr;
  return c.failures == 0 ? 0 : 1;
}

TEST_P(TicketTest, OperationsNobodyWaitsForRunOnTheCommunicatorsThread) {
  LaunchOptions opts = threeRanks(GetParam());
  LaunchResult res = launch(opts, unwaitedRank);
  EXPECT_TRUE(res.allPassed()) << res.report();
}

constexpr int kDeathTimeoutMs = 8000;

// The last rank dies once every rank has initialised; the others queue two all-reduces and
// wait for the first: it fails, naming the dead rank, within the timeout, and so does the next.
int deadPeerRank(RankContext& ctx) {
  Checker c{ctx.rank};
  c.expectResult("init", initTicketOne(ctx, c), loomSuccess);
  if (c.failures) return 1;
  const int victim = ctx.nranks - 1;
  ctx.shared->words[0].fetch_add(1);
  while (ctx.shared->words[0].load() < static_cast<uint32_t>(ctx.nranks)) usleep(1000);
  if (ctx.rank == victim) raise(SIGKILL);
  std::vector<float> buf(1 << 18, 1.0f);
  const double t0 = nowSeconds();
  loomAllReduce(buf.data(), buf.data(), buf.size(), loomFloat32, loomSum, ctx.comm, nullptr);
  const uint64_t first = lastTicket(ctx.comm);
  loomAllReduce(buf.data(), buf.data(), 16, loomFloat32, loomSum, ctx.comm, nullptr);
  const uint64_t second = lastTicket(ctx.comm);
  const loomResult_t r = loomCommWaitTicket(ctx.comm, first, -1);
  const double ms = (nowSeconds() - t0) * 1000;
  const std::string text = loomGetLastError(nullptr);
  fprintf(stderr, "rank %d: the all-reduce's ticket: %s after %.0f ms: %s\n", ctx.rank,
          loomGetErrorString(r), ms, text.c_str());
  if (r != loomRemoteError && r != loomTimeout)
    c.fail(std::string("expected loomRemoteError or loomTimeout, got ") + loomGetErrorString(r));
  if (ms > kDeathTimeoutMs + 2000) c.fail("the error took " + std::to_string(ms) + " ms");
  if (text.find("rank " + std::to_string(victim)) == std::string::npos)
    c.fail("the error does not name rank " + std::to_string(victim));
  const loomResult_t r2 = loomCommWaitTicket(ctx.comm, second, -1);
  if (r2 == loomSuccess || r2 == loomInProgress)
    c.fail(std::string("the next operation: ") + loomGetErrorString(r2));
  c.expectResult("abort", loomCommAbort(ctx.comm), loomSuccess);
  ctx.comm = nullptr;
  return c.failures == 0 ? 0 : 1;
}

TEST_P(TicketTest, AFailedOperationsTicketNamesTheDeadPeer) {
  LaunchOptions opts = threeRanks(GetParam());
  opts.timeoutMs = kDeathTimeoutMs;
  opts.failGraceMs = 3 * kDeathTimeoutMs;
  LaunchResult res = launch(opts, deadPeerRank);
  ASSERT_EQ(res.ranks.size(), 3u) << res.report();
  for (const RankOutcome& o : res.ranks) {
    if (o.rank == 2) continue;  // the victim
    EXPECT_TRUE(o.exited && o.exitCode == 0) << res.report(true);
  }
}

// Rank 1 never joins the all-reduce; on rank 0 a thread blocks on its ticket, and the main thread
// aborts: the wait returns an error within a second, and the abort returns.
int abortWhileWaitingRank(RankContext& ctx) {
  Checker c{ctx.rank};
  c.expectResult("init", initTicketOne(ctx, c), loomSuccess);
  if (c.failures) return 1;
  if (ctx.rank == 1) {
    while (ctx.shared->flag.load() == 0) usleep(10000);
    c.expectResult("abort", loomCommAbort(ctx.comm), loomSuccess);
    ctx.comm = nullptr;
    return c.failures == 0 ? 0 : 1;
  }
  std::vector<float> buf(4096, 1.0f);
  loomAllReduce(buf.data(), buf.data(), buf.size(), loomFloat32, loomSum, ctx.comm, nullptr);
  const uint64_t t = lastTicket(ctx.comm);
  loomAllReduce(buf.data(), buf.data(), buf.size(), loomFloat32, loomSum, ctx.comm, nullptr);
  const uint64_t dropped = lastTicket(ctx.comm);
  loomResult_t waited = loomInternalError, waitedDropped = loomInternalError;
  double returnedAt = 0, droppedAt = 0;
  std::string text;
  std::thread waiter([&] {
    waited = loomCommWaitTicket(ctx.comm, t, -1);
    text = loomGetLastError(nullptr);
    returnedAt = nowSeconds();
  });
  std::thread droppedWaiter([&] {
    waitedDropped = loomCommWaitTicket(ctx.comm, dropped, -1);
    droppedAt = nowSeconds();
  });
  usleep(200000);
  const double t0 = nowSeconds();
  c.expectResult("abort", loomCommAbort(ctx.comm), loomSuccess);
  ctx.comm = nullptr;
  waiter.join();
  droppedWaiter.join();
  returnedAt = std::max(returnedAt, droppedAt);
  fprintf(stderr, "rank 0: waits returned %s (%s) and %s, %.0f ms after the abort began\n",
          loomGetErrorString(waited), text.c_str(), loomGetErrorString(waitedDropped),
          (returnedAt - t0) * 1000);
  if (waited == loomSuccess || waited == loomInProgress) c.fail("the aborted operation's wait");
  c.expectResult("the dropped operation's wait", waitedDropped, loomRemoteError);
  if (returnedAt - t0 > 1.0) c.fail("the waits returned more than 1 s after the abort");
  ctx.shared->flag.store(1);
  return c.failures == 0 ? 0 : 1;
}

TEST_P(TicketTest, AWaitOnAnotherThreadReturnsWhenTheCommunicatorIsAborted) {
  LaunchOptions opts;
  opts.nranks = 2;
  opts.shm = GetParam();
  opts.initComm = false;
  opts.timeoutMs = 60000;  // the abort, not the timeout, must end the wait
  LaunchResult res = launch(opts, abortWhileWaitingRank);
  EXPECT_TRUE(res.allPassed()) << res.report();
}

int blockingRank(RankContext& ctx) {
  Checker c{ctx.rank};
  uint64_t t = 7;
  c.expectResult("last ticket", loomCommLastTicket(ctx.comm, &t), loomSuccess);
  if (t != 0) c.fail("a blocking communicator's last ticket is " + std::to_string(t));
  c.expectResult("wait", loomCommWaitTicket(ctx.comm, 1, 0), loomInvalidUsage);
  if (!strstr(loomGetLastError(nullptr), "blocking")) c.fail("the error does not say blocking");
  return c.failures == 0 ? 0 : 1;
}

TEST(TicketBlocking, ABlockingCommunicatorHasNoTickets) {
  LaunchOptions opts;
  opts.nranks = 1;
  LaunchResult res = launch(opts, blockingRank);
  EXPECT_TRUE(res.allPassed()) << res.report();
}

INSTANTIATE_TEST_SUITE_P(Transports, TicketTest, ::testing::Values(true, false),
                         shmOrTcp<::testing::TestParamInfo<bool>>);

}  // namespace
}  // namespace loomtest
