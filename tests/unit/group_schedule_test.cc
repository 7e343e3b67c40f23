// Groups of sends and receives as schedules (algorithms/group.cc): the verifier proves random
// groups (each receive gets exactly the matching send, in order; no deadlock, whatever order
// the calls came in), and fails on groups that cannot work.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "algorithms/schedule.h"
#include "algorithms/verifier.h"
#include "contains.h"

namespace loom::algo {
namespace {

using loomtest::Contains;

std::vector<Schedule> buildAll(const std::vector<std::vector<GroupBuf>>& ops) {
  std::vector<Schedule> s;
  const int n = static_cast<int>(ops.size());
  for (int r = 0; r < n; ++r) s.push_back(buildGroup(r, n, ops[static_cast<size_t>(r)]));
  return s;
}

VerifyOptions groupOpts(size_t slotBytes = 16, size_t depth = 1) {
  VerifyOptions o;
  o.elemSize = 1;  // a group's counts are bytes
  o.slotBytes = slotBytes;
  o.fifoDepth = depth;
  o.repeat = 2;
  return o;
}

// Random matched groups: for every ordered pair, a few messages of random sizes (zero
// included); each rank's calls are its sends and receives shuffled, keeping each pair's order.
std::vector<std::vector<GroupBuf>> randomGroups(int n, std::mt19937& rng) {
  std::vector<std::vector<GroupBuf>> ops(static_cast<size_t>(n));
  std::uniform_int_distribution<int> msgs(0, 3), size(0, 70);
  // Every rank's messages, each pair's in one order at both ends.
  std::vector<std::vector<GroupBuf>> mine(static_cast<size_t>(n));
  for (int a = 0; a < n; ++a)
    for (int b = 0; b < n; ++b) {
      const int m = msgs(rng);
      for (int k = 0; k < m; ++k) {
        const size_t bytes = static_cast<size_t>(size(rng));
        mine[static_cast<size_t>(a)].push_back({bytes, true, b});
        mine[static_cast<size_t>(b)].push_back({bytes, false, a});
      }
    }
  for (int r = 0; r < n; ++r) {
    const std::vector<GroupBuf>& all = mine[static_cast<size_t>(r)];
    // Stable per (peer, direction) order, random interleaving across them.
    std::vector<std::vector<GroupBuf>> lanes;
    std::vector<std::pair<int, bool>> keys;
    for (const GroupBuf& g : all) {
      size_t k = 0;
      while (k < keys.size() && keys[k] != std::make_pair(g.peer, g.send)) ++k;
      if (k == keys.size()) {
        keys.emplace_back(g.peer, g.send);
        lanes.emplace_back();
      }
      lanes[k].push_back(g);
    }
    std::vector<size_t> next(lanes.size(), 0);
    for (size_t left = all.size(); left > 0; --left) {
      size_t k;
      do {
        k = std::uniform_int_distribution<size_t>(0, lanes.size() - 1)(rng);
      } while (next[k] == lanes[k].size());
      ops[static_cast<size_t>(r)].push_back(lanes[k][next[k]++]);
    }
  }
  return ops;
}

TEST(GroupSchedule, RandomGroupsVerify) {
  std::mt19937 rng(12345);
  for (int n = 1; n <= 9; ++n)
    for (int trial = 0; trial < 20; ++trial) {
      const auto ops = randomGroups(n, rng);
      for (size_t slot : {1, 16, 1024}) {
        VerifyResult r = verify(buildAll(ops), groupOpts(slot));
        ASSERT_TRUE(r.ok) << "n=" << n << " trial " << trial << " slot " << slot << ": " << r.error;
      }
    }
}

TEST(GroupSchedule, EachRankReceivingFirstDoesNotDeadlock) {
  // Both ranks call receive before send: channels in turn would each wait for the other's
  // send; the group's channels progress together.
  const std::vector<std::vector<GroupBuf>> ops = {{{40, false, 1}, {40, true, 1}},
                                                  {{40, false, 0}, {40, true, 0}}};
  const std::vector<Schedule> s = buildAll(ops);
  EXPECT_TRUE(s[0].independent);
  EXPECT_TRUE(channelsIndependent(s[0]));
  VerifyResult r = verify(s, groupOpts());
  EXPECT_TRUE(r.ok) << r.error;
}

TEST(GroupSchedule, SizesThatDoNotMatchAreCaught) {
  const std::vector<std::vector<GroupBuf>> ops = {{{40, true, 1}}, {{41, false, 0}}};
  VerifyResult r = verify(buildAll(ops), groupOpts(64));
  EXPECT_FALSE(r.ok);
  EXPECT_TRUE(Contains(r.error, "size mismatch")) << r.error;
}

TEST(GroupSchedule, AReceiveWithNoSendIsADeadlock) {
  const std::vector<std::vector<GroupBuf>> ops = {
      {{8, true, 1}}, {{8, false, 0}, {8, false, 2}}, {}};
  VerifyResult r = verify(buildAll(ops), groupOpts());
  EXPECT_FALSE(r.ok);
  EXPECT_TRUE(Contains(r.error, "deadlock")) << r.error;
  EXPECT_TRUE(Contains(r.error, "waits for a piece from rank 2")) << r.error;
}

TEST(GroupSchedule, SelfSendsAreCopiesIntoSelfReceivesInOrder) {
  const std::vector<std::vector<GroupBuf>> ops = {
      {{5, true, 0}, {7, true, 0}, {5, false, 0}, {7, false, 0}, {3, true, 1}}, {{3, false, 0}}};
  VerifyResult r = verify(buildAll(ops), groupOpts());
  EXPECT_TRUE(r.ok) << r.error;
  // Swapped: the first receive (5 bytes) would get the 7-byte send.
  std::vector<Schedule> s = buildAll(ops);
  std::swap(s[0].channels[0][0].src, s[0].channels[0][1].src);
  r = verify(s, groupOpts());
  EXPECT_FALSE(r.ok);
}

TEST(GroupSchedule, AReceiveIntoTheWrongBufferIsCaught) {
  const std::vector<std::vector<GroupBuf>> ops = {{{6, true, 1}, {6, true, 1}},
                                                  {{6, false, 0}, {6, false, 0}}};
  std::vector<Schedule> s = buildAll(ops);
  ASSERT_EQ(s[1].channels.size(), 2u);
  std::swap(s[1].channels[1][0].dst, s[1].channels[1][1].dst);
  VerifyResult r = verify(s, groupOpts());
  EXPECT_FALSE(r.ok);
  EXPECT_TRUE(Contains(r.error, "sendrecv: rank 1")) << r.error;
}

TEST(GroupSchedule, ChannelsThatShareAPairAreNotIndependent) {
  std::vector<Schedule> ring;
  for (int r = 0; r < 3; ++r) {
    ring.push_back(buildRingAllReduce(r, 3, 12));
    ring.back().channels.push_back(ring.back().channels[0]);  // a second channel, same pairs
    ring.back().independent = true;
  }
  EXPECT_FALSE(channelsIndependent(ring[0]));
  VerifyResult r = verify(ring, VerifyOptions{});
  EXPECT_FALSE(r.ok);
  EXPECT_TRUE(Contains(r.error, "says its channels are independent")) << r.error;
}

TEST(GroupSchedule, TheDumpListsTheGroup) {
  const Schedule s = buildGroup(0, 2, {{4, true, 1}, {0, false, 1}, {2, true, 0}, {2, false, 0}});
  const std::string j = toJson(s);
  EXPECT_TRUE(Contains(j, "\"coll\":\"sendrecv\""));
  EXPECT_TRUE(Contains(j, "\"group\":[{\"send\":1,\"count\":4},{\"recv\":1,\"count\":0}"));
  EXPECT_TRUE(Contains(j, "{\"op\":\"send\",\"sendPeer\":1,\"src\":[\"group\",0],\"count\":4}"));
  EXPECT_TRUE(Contains(j, "{\"op\":\"copy\",\"src\":[\"group\",2],\"dst\":[\"group\",3]"));
}

}  // namespace
}  // namespace loom::algo
