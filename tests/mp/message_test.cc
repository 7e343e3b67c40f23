// Tagged messages (loomSendTagged, loomRecvTagged) on real processes, over shared memory and
// TCP: tags matched out of order and in order within a tag; receives from any rank, which name
// their senders; a message sent before the receiver's collective (over a FIFO schedule that
// shares the connection) kept aside while the collective runs, also when it is larger than the
// connection's FIFO; a group of large exchanges, and a ring of large sends each before its
// receive, which would deadlock if a waiting send did not read; messages to
// the rank itself; a size mismatch, bad arguments, a receive from a dead rank and one from any
// rank once every other has left refused by name. Every value is checked against what the sender
// put in, computed here independently.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "harness.h"

namespace loomtest {
namespace {

// What rank `from` puts at index i of its message tagged `tag`.
int32_t value(int from, int tag, size_t i) {
  return from * 1000003 + tag * 7919 + static_cast<int32_t>(i % 100003);
}

std::vector<int32_t> message(int from, int tag, size_t count) {
  std::vector<int32_t> v(count);
  for (size_t i = 0; i < count; ++i) v[i] = value(from, tag, i);
  return v;
}

// Index of the first element of got that differs from rank from's message, or -1.
long firstWrong(const std::vector<int32_t>& got, int from, int tag) {
  for (size_t i = 0; i < got.size(); ++i)
    if (got[i] != value(from, tag, i)) return static_cast<long>(i);
  return -1;
}

#define EXPECT_MSG(got, from, tag)                                                             \
  do {                                                                                         \
    long bad_ = firstWrong(got, from, tag);                                                    \
    if (bad_ >= 0) {                                                                           \
      fprintf(stderr, "rank %d: message from %d tagged %d wrong at %ld: %d\n", ctx.rank, from, \
              tag, bad_, got[static_cast<size_t>(bad_)]);                                      \
      return 1;                                                                                \
    }                                                                                          \
  } while (0)

LaunchOptions options(int nranks, bool shm) {
  LaunchOptions o;
  o.nranks = nranks;
  o.shm = shm;
  o.deadlineMs = 90000;
  // Small slots: messages of several slots, and FIFOs (16 KiB) smaller than the large cases.
  o.env = {{"LOOM_SLOT_BYTES", "4096"}};
  return o;
}

void expectPassed(const LaunchResult& res) { EXPECT_TRUE(res.allPassed()) << res.report(); }

// Rank 0 sends two tags, twice each, and rank 1 receives the later tag first; within a tag,
// the order sent. Slot-sized and multi-slot messages alike.
int tagsRank(RankContext& ctx) {
  const size_t counts[] = {3, 5000};
  for (size_t count : counts) {
    if (ctx.rank == 0) {
      for (int tag : {1, 2, 1, 2}) {
        std::vector<int32_t> m = message(0, tag + (count > 10 ? 10 : 0), count);
        CHECK_LOOM(loomSendTagged(m.data(), count, loomInt32, 1, tag, ctx.comm, nullptr));
      }
    } else if (ctx.rank == 1) {
      for (int tag : {2, 2, 1, 1}) {
        std::vector<int32_t> got(count, -1);
        int source = -1;
        CHECK_LOOM(
            loomRecvTagged(got.data(), count, loomInt32, 0, tag, &source, ctx.comm, nullptr));
        EXPECT_MSG(got, 0, tag + (count > 10 ? 10 : 0));
        if (source != 0) return 1;
      }
    }
  }
  // Both ordering pairs done: a barrier proves nothing was left on the connection.
  CHECK_LOOM(loomBarrier(ctx.comm, nullptr));
  return 0;
}

TEST(TaggedMessages, TagsMatchOutOfOrderAndInOrderWithinATag) {
  for (bool shm : {true, false}) expectPassed(launch(options(2, shm), tagsRank));
}

// Every rank in turn receives two messages from each other rank, from any source: the
// senders named are each other rank twice, and each message holds its sender's values.
int anySourceRank(RankContext& ctx) {
  const int n = ctx.nranks;
  const size_t count = 1500;  // two slots
  for (int dst = 0; dst < n; ++dst) {
    if (dst != ctx.rank) {
      std::vector<int32_t> m = message(ctx.rank, 5, count);
      CHECK_LOOM(loomSendTagged(m.data(), count, loomInt32, dst, 5, ctx.comm, nullptr));
      CHECK_LOOM(loomSendTagged(m.data(), count, loomInt32, dst, 5, ctx.comm, nullptr));
      continue;
    }
    std::multiset<int> senders;
    for (int k = 0; k < 2 * (n - 1); ++k) {
      std::vector<int32_t> got(count, -1);
      int source = -1;
      CHECK_LOOM(loomRecvTagged(got.data(), count, loomInt32, LOOM_ANY_SOURCE, 5, &source, ctx.comm,
                                nullptr));
      if (source < 0 || source >= n || source == ctx.rank) {
        fprintf(stderr, "rank %d: any-source receive named rank %d\n", ctx.rank, source);
        return 1;
      }
      EXPECT_MSG(got, source, 5);
      senders.insert(source);
    }
    for (int r = 0; r < n; ++r)
      if (r != ctx.rank && senders.count(r) != 2) {
        fprintf(stderr, "rank %d: rank %d named %zu times\n", ctx.rank, r, senders.count(r));
        return 1;
      }
  }
  return 0;
}

TEST(TaggedMessages, ReceiveFromAnySourceNamesEachSender) {
  for (bool shm : {true, false}) expectPassed(launch(options(3, shm), anySourceRank));
}

// Rank 0 sends rank 1 a message, then all-reduces; rank 1 all-reduces first and receives
// after. The ring all-reduce's data shares the connection from rank 0 to rank 1: rank 1 keeps
// the message aside. The large message (64 slots) waits on rank 1 reading, which its
// all-reduce does.
int beforeCollectiveRank(RankContext& ctx) {
  const int n = ctx.nranks;
  for (size_t count : {size_t{16}, size_t{65536}}) {
    const size_t reduceCount = 50000;
    std::vector<float> in(reduceCount), out(reduceCount, -1.0f);
    for (size_t i = 0; i < reduceCount; ++i) in[i] = static_cast<float>((ctx.rank + 1) * (i % 17));
    std::vector<int32_t> got(count, -1);
    if (ctx.rank == 0) {
      std::vector<int32_t> m = message(0, 9, count);
      CHECK_LOOM(loomSendTagged(m.data(), count, loomInt32, 1, 9, ctx.comm, nullptr));
    }
    CHECK_LOOM(
        loomAllReduce(in.data(), out.data(), reduceCount, loomFloat32, loomSum, ctx.comm, nullptr));
    if (ctx.rank == 1) {
      CHECK_LOOM(loomRecvTagged(got.data(), count, loomInt32, 0, 9, nullptr, ctx.comm, nullptr));
      EXPECT_MSG(got, 0, 9);
    }
    const float ranksSum = static_cast<float>(n * (n + 1) / 2);
    for (size_t i = 0; i < reduceCount; ++i)
      if (out[i] != ranksSum * static_cast<float>(i % 17)) {
        fprintf(stderr, "rank %d: sum at %zu is %g\n", ctx.rank, i, out[i]);
        return 1;
      }
  }
  return 0;
}

TEST(TaggedMessages, MessageBeforeTheReceiversCollectiveIsKeptAside) {
  for (bool shm : {true, false}) {
    LaunchOptions o = options(3, shm);
    o.env.push_back({"LOOM_ALGO", "allreduce:ring"});
    expectPassed(launch(o, beforeCollectiveRank));
  }
}

// Every rank sends every rank (itself included) 256 KiB and receives from each, all in one
// group: one by one, the sends would wait for receives that come after them.
int groupExchangeRank(RankContext& ctx) {
  const int n = ctx.nranks;
  const size_t count = 65536;
  std::vector<std::vector<int32_t>> outs, ins(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) outs.push_back(message(ctx.rank, 100 + r, count));
  std::vector<int> sources(static_cast<size_t>(n), -1);
  CHECK_LOOM(loomGroupStart());
  for (int r = 0; r < n; ++r)
    CHECK_LOOM(loomSendTagged(outs[static_cast<size_t>(r)].data(), count, loomInt32, r, 100 + r,
                              ctx.comm, nullptr));
  for (int r = 0; r < n; ++r) {
    ins[static_cast<size_t>(r)].assign(count, -1);
    CHECK_LOOM(loomRecvTagged(ins[static_cast<size_t>(r)].data(), count, loomInt32, r,
                              100 + ctx.rank, &sources[static_cast<size_t>(r)], ctx.comm, nullptr));
  }
  CHECK_LOOM(loomGroupEnd());
  for (int r = 0; r < n; ++r) {
    EXPECT_MSG(ins[static_cast<size_t>(r)], r, 100 + ctx.rank);
    if (sources[static_cast<size_t>(r)] != r) return 1;
  }
  return 0;
}

TEST(TaggedMessages, GroupOfLargeExchangesRunsAtOnce) {
  for (bool shm : {true, false}) expectPassed(launch(options(3, shm), groupExchangeRank));
}

// Every rank sends its next rank a message 16 times its FIFO, then receives from its previous
// one, each call alone: every send waits for slots until its peer reads, which that peer's own
// waiting send does, keeping the messages that arrive aside.
int ringOfLargeSendsRank(RankContext& ctx) {
  const int n = ctx.nranks;
  const int nxt = (ctx.rank + 1) % n, prev = (ctx.rank + n - 1) % n;
  const size_t count = 65536;
  std::vector<int32_t> m = message(ctx.rank, 11, count), got(count, -1);
  CHECK_LOOM(loomSendTagged(m.data(), count, loomInt32, nxt, 11, ctx.comm, nullptr));
  int source = -1;
  CHECK_LOOM(loomRecvTagged(got.data(), count, loomInt32, prev, 11, &source, ctx.comm, nullptr));
  EXPECT_MSG(got, prev, 11);
  return source == prev ? 0 : 1;
}

TEST(TaggedMessages, RingOfLargeSendsBeforeReceivesDoesNotDeadlock) {
  for (bool shm : {true, false}) expectPassed(launch(options(3, shm), ringOfLargeSendsRank));
}

// On a non-blocking communicator a receive waiting for its message does not hold up the
// operations queued after it. Every rank queues a receive from its previous rank, then an
// all-reduce, then the send to its next rank: the all-reduce's ticket is done while the
// receive's is not (its message comes with the send after it, which rank 0 holds back until
// rank 1 has looked), then the receive's, for a message of one slot and one of 64; then a
// group of two receives, whose ticket waits for both.
int keptRank(RankContext& ctx) {
  CHECK_LOOM(initNonBlocking(ctx));
  const int n = ctx.nranks;
  const int nxt = (ctx.rank + 1) % n, prev = (ctx.rank + n - 1) % n;
  for (size_t count : {size_t{100}, size_t{65536}}) {
    std::vector<int32_t> m = message(ctx.rank, 21, count), got(count, -1);
    std::vector<float> x(1000, static_cast<float>(ctx.rank + 1)), sum(1000, 0.0f);
    int source = -1;
    CHECK_LOOM(loomRecvTagged(got.data(), count, loomInt32, prev, 21, &source, ctx.comm, nullptr) ==
                       loomInProgress
                   ? loomSuccess
                   : loomInternalError);
    const uint64_t recvTicket = lastTicket(ctx.comm);
    (void)loomAllReduce(x.data(), sum.data(), x.size(), loomFloat32, loomSum, ctx.comm, nullptr);
    const uint64_t sumTicket = lastTicket(ctx.comm);
    CHECK_LOOM(loomCommWaitTicket(ctx.comm, sumTicket, -1));
    const float want = static_cast<float>(n * (n + 1) / 2);
    if (sum[0] != want || sum[999] != want) {
      fprintf(stderr, "rank %d: sum %g\n", ctx.rank, sum[0]);
      return 1;
    }
    // Rank 0 sends rank 1's message only once rank 1 has seen its receive still waiting.
    const uint32_t step = count > 100 ? 2 : 1;
    if (ctx.rank == 1) {
      if (loomCommWaitTicket(ctx.comm, recvTicket, 0) != loomInProgress) {
        fprintf(stderr, "rank 1: the receive ended before its message was sent\n");
        return 1;
      }
      ctx.shared->flag.store(step);
    }
    const double t0 = nowSeconds();
    while (ctx.rank == 0 && ctx.shared->flag.load() < step && nowSeconds() - t0 < 30) usleep(100);
    (void)loomSendTagged(m.data(), count, loomInt32, nxt, 21, ctx.comm, nullptr);
    CHECK_LOOM(loomCommWaitTicket(ctx.comm, lastTicket(ctx.comm), -1));
    CHECK_LOOM(loomCommWaitTicket(ctx.comm, recvTicket, -1));
    EXPECT_MSG(got, prev, 21);
    if (source != prev) return 1;
  }
  // Two receives kept by one group: its ticket ends only once both have their messages. The
  // one from the previous rank comes at once; the one from the next rank once every rank has
  // seen its group still waiting.
  const size_t count = 3000;
  std::vector<int32_t> a(count, -1), b(count, -1);
  std::vector<int32_t> toNext = message(ctx.rank, 31, count), toPrev = message(ctx.rank, 32, count);
  CHECK_LOOM(loomGroupStart());
  (void)loomRecvTagged(a.data(), count, loomInt32, prev, 31, nullptr, ctx.comm, nullptr);
  (void)loomRecvTagged(b.data(), count, loomInt32, nxt, 32, nullptr, ctx.comm, nullptr);
  CHECK_LOOM(loomGroupEnd() == loomInProgress ? loomSuccess : loomInternalError);
  const uint64_t both = lastTicket(ctx.comm);
  (void)loomSendTagged(toNext.data(), count, loomInt32, nxt, 31, ctx.comm, nullptr);
  CHECK_LOOM(loomCommWaitTicket(ctx.comm, lastTicket(ctx.comm), -1));
  usleep(100000);  // the message from the previous rank lands meanwhile
  if (loomCommWaitTicket(ctx.comm, both, 0) != loomInProgress) {
    fprintf(stderr, "rank %d: the group ended with one of its receives waiting\n", ctx.rank);
    return 1;
  }
  ctx.shared->counter.fetch_add(1);
  const double t0 = nowSeconds();
  while (ctx.shared->counter.load() < static_cast<uint32_t>(n) && nowSeconds() - t0 < 30)
    usleep(100);
  (void)loomSendTagged(toPrev.data(), count, loomInt32, prev, 32, ctx.comm, nullptr);
  CHECK_LOOM(loomCommWaitTicket(ctx.comm, both, -1));
  EXPECT_MSG(a, prev, 31);
  EXPECT_MSG(b, nxt, 32);
  CHECK_LOOM(loomCommWaitTicket(ctx.comm, lastTicket(ctx.comm), -1));
  return 0;
}

TEST(TaggedMessages, AKeptReceiveDoesNotHoldUpLaterOperations) {
  for (bool shm : {true, false}) {
    LaunchOptions o = options(3, shm);
    o.initComm = false;
    expectPassed(launch(o, keptRank));
  }
}

// A kept receive whose message never comes fails at the communicator's timeout (2 s here),
// naming what it waited for; the operation queued after it has run meanwhile.
int keptTimesOutRank(RankContext& ctx) {
  CHECK_LOOM(initNonBlocking(ctx));
  if (ctx.rank == 1) {  // never sends; stays until rank 0 is done
    const double t0 = nowSeconds();
    while (ctx.shared->flag.load() == 0 && nowSeconds() - t0 < 30) usleep(1000);
    return 0;
  }
  int32_t y[2] = {0, 0}, z = 5;
  (void)loomRecvTagged(y, 2, loomInt32, 1, 4, nullptr, ctx.comm, nullptr);
  const uint64_t recvTicket = lastTicket(ctx.comm);
  (void)loomSendTagged(&z, 1, loomInt32, 0, 9, ctx.comm, nullptr);  // to itself
  const double t0 = nowSeconds();
  CHECK_LOOM(loomCommWaitTicket(ctx.comm, lastTicket(ctx.comm), -1));
  const double sent = nowSeconds() - t0;
  loomResult_t r = loomCommWaitTicket(ctx.comm, recvTicket, -1);
  const double took = nowSeconds() - t0;
  const std::string err = loomGetLastError(nullptr);
  ctx.shared->flag.store(1);
  if (sent > 1 || r != loomTimeout || took > 10 ||
      err.find("receiving a message tagged 4 from rank 1") == std::string::npos) {
    fprintf(stderr, "rank 0: send after %.2f s; receive %s after %.1f s: %s\n", sent,
            loomGetErrorString(r), took, err.c_str());
    return 1;
  }
  return 0;
}

TEST(TaggedMessages, AKeptReceiveFailsAtTheTimeoutNamingWhatItWaitedFor) {
  LaunchOptions o = options(2, true);
  o.initComm = false;
  o.timeoutMs = 2000;
  expectPassed(launch(o, keptTimesOutRank));
}

// Refusals: bad arguments name the argument and queue nothing; a receive from itself with no
// message to itself; a message of the wrong size fails the receive, naming both sizes.
int refusalsRank(RankContext& ctx) {
  int32_t x[4] = {1, 2, 3, 4};
  auto expect = [&](loomResult_t got, loomResult_t want, const char* needle) {
    if (got != want || strstr(loomGetLastError(nullptr), needle) == nullptr) {
      fprintf(stderr, "rank %d: got %s (%s), expected %s naming '%s'\n", ctx.rank,
              loomGetErrorString(got), loomGetLastError(nullptr), loomGetErrorString(want), needle);
      return false;
    }
    return true;
  };
  if (!expect(loomSendTagged(x, 4, loomInt32, LOOM_ANY_SOURCE, 0, ctx.comm, nullptr),
              loomInvalidArgument, "peer") ||
      !expect(loomRecvTagged(x, 4, loomInt32, ctx.nranks, 0, nullptr, ctx.comm, nullptr),
              loomInvalidArgument, "peer") ||
      !expect(loomRecvTagged(nullptr, 4, loomInt32, 0, 0, nullptr, ctx.comm, nullptr),
              loomInvalidArgument, "recvbuff") ||
      !expect(loomRecvTagged(x, 4, loomInt32, ctx.rank, 3, nullptr, ctx.comm, nullptr),
              loomInvalidArgument, "peer"))
    return 1;
  // To itself: sent, then received, alone or in one group.
  int32_t y[4] = {0, 0, 0, 0};
  int source = -1;
  CHECK_LOOM(loomSendTagged(x, 4, loomInt32, ctx.rank, 4, ctx.comm, nullptr));
  CHECK_LOOM(loomRecvTagged(y, 4, loomInt32, LOOM_ANY_SOURCE, 4, &source, ctx.comm, nullptr));
  if (memcmp(x, y, sizeof(x)) != 0 || source != ctx.rank) return 1;
  CHECK_LOOM(loomGroupStart());
  CHECK_LOOM(loomRecvTagged(y, 2, loomInt32, ctx.rank, 5, nullptr, ctx.comm, nullptr));
  CHECK_LOOM(loomSendTagged(x + 2, 2, loomInt32, ctx.rank, 5, ctx.comm, nullptr));
  CHECK_LOOM(loomGroupEnd());
  if (y[0] != 3 || y[1] != 4) return 1;
  // Rank 0 sends 4 elements where rank 1 receives 3.
  if (ctx.rank == 0) CHECK_LOOM(loomSendTagged(x, 4, loomInt32, 1, 6, ctx.comm, nullptr));
  if (ctx.rank == 1 && !expect(loomRecvTagged(y, 3, loomInt32, 0, 6, nullptr, ctx.comm, nullptr),
                               loomInvalidUsage, "16 bytes tagged 6 to a receive of 12"))
    return 1;
  return 0;
}

TEST(TaggedMessages, RefusalsNameTheArgumentOrBothSizes) {
  expectPassed(launch(options(2, true), refusalsRank));
}

// A receive of rank 0's from `peer` that must fail with loomRemoteError, naming `needle`,
// well within the timeout: exit status 0 when it does.
int receiveFailsNaming(RankContext& ctx, int peer, const char* needle) {
  int32_t y[2] = {0, 0};
  int source = -1;
  const double t0 = nowSeconds();
  loomResult_t r = loomRecvTagged(y, 2, loomInt32, peer, 1, &source, ctx.comm, nullptr);
  const double took = nowSeconds() - t0;
  const std::string err = loomGetLastError(nullptr);
  if (r == loomRemoteError && err.find(needle) != std::string::npos && took < 10) return 0;
  fprintf(stderr, "rank 0: got %s after %.1f s: %s\n", loomGetErrorString(r), took, err.c_str());
  return 1;
}

// Rank 0's outcome (the others' ends are not checked: some exit on purpose), on both transports.
void expectRankZeroPassed(const RankFn& fn) {
  for (bool shm : {true, false}) {
    LaunchResult res = launch(options(3, shm), fn);
    ASSERT_EQ(res.ranks.size(), 3u);
    EXPECT_TRUE(res.ranks[0].exited && res.ranks[0].exitCode == 0) << res.report();
  }
}

// Rank 2 exits without sending; rank 1 sends one message and leaves (destroying its
// communicator). Rank 0's first receive from any rank takes rank 1's message; its second,
// with no rank left to send, fails at once naming both, not at the timeout.
int ranksLeaveRank(RankContext& ctx) {
  if (ctx.rank == 2) _exit(0);  // no destroy: its links drop as the process ends
  int32_t x[2] = {7, 8};
  if (ctx.rank == 1) {
    CHECK_LOOM(loomSendTagged(x, 2, loomInt32, 0, 1, ctx.comm, nullptr));
    return 0;
  }
  int32_t y[2] = {0, 0};
  int source = -1;
  CHECK_LOOM(loomRecvTagged(y, 2, loomInt32, LOOM_ANY_SOURCE, 1, &source, ctx.comm, nullptr));
  if (source != 1 || y[0] != 7 || y[1] != 8) return 1;
  return receiveFailsNaming(ctx, LOOM_ANY_SOURCE, "ranks 1, 2");
}

TEST(TaggedMessages, ReceiveFromAnyRankFailsOnceEveryOtherRankHasLeft) {
  expectRankZeroPassed(ranksLeaveRank);
}

// A receive from rank 2, which exits without sending, fails naming it.
int deadSenderRank(RankContext& ctx) {
  if (ctx.rank == 2) _exit(0);
  return ctx.rank == 1 ? 0 : receiveFailsNaming(ctx, 2, "rank 2");
}

TEST(TaggedMessages, ReceiveFromADeadRankFailsNamingIt) { expectRankZeroPassed(deadSenderRank); }

}  // namespace
}  // namespace loomtest
