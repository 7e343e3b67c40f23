// The direct all-reduce as memory steps (algorithms/direct.cc): the verifier proves every form
// (LL, symmetric, slices; exposed inputs, pre-scaling, streaming, in place) for 1..64 ranks
// over back-to-back operations, and catches schedules whose flag waits are broken: a missing
// wait, a gather that does not wait, two buffers where the protocol needs three.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "algorithms/schedule.h"
#include "algorithms/verifier.h"
#include "contains.h"

namespace loom::algo {
namespace {

using loomtest::Contains;

struct Variant {
  const char* name;
  DirectForm form;
  bool scale, exposed, stream, inPlace;
};

// Parameters that force `v`'s form with windows of 16 elements, so that counts of a few dozen
// take several rounds and the three buffers are reused within one operation.
DirectParams paramsFor(const Variant& v) {
  DirectParams p;
  p.elemSize = 4;
  p.windowBytes = 64;
  p.llMaxBytes = v.form == DirectForm::LL ? 384 : 0;
  p.scale = v.scale;
  p.exposed = v.exposed;
  p.inPlace = v.inPlace;
  p.tuning.symmetricBytes = v.form == DirectForm::Symmetric ? size_t{1} << 30 : 0;
  p.tuning.streamBytes = v.stream ? 0 : size_t{1} << 30;
  p.tuning.streamOutputBytes = v.stream ? 0 : size_t{1} << 30;
  p.tuning.cachedRoundBytes = 32;  // rounds of 8 elements where not streamed
  return p;
}

std::vector<Schedule> buildAll(int n, size_t count, const DirectParams& p) {
  std::vector<Schedule> s;
  for (int r = 0; r < n; ++r) s.push_back(buildDirectAllReduce(r, n, count, p));
  return s;
}

VerifyOptions opts(bool inPlace) {
  VerifyOptions o;
  o.inPlace = inPlace;
  o.repeat = 3;  // back-to-back operations reuse the buffers: the rotation is checked too
  return o;
}

const Variant kVariants[] = {
    {"ll", DirectForm::LL, false, false, false, false},
    {"ll_scaled", DirectForm::LL, true, false, false, false},
    {"ll_inplace", DirectForm::LL, false, false, false, true},
    {"symmetric", DirectForm::Symmetric, false, false, false, false},
    {"symmetric_scaled", DirectForm::Symmetric, true, false, false, true},
    {"slices", DirectForm::Slices, false, false, false, false},
    {"slices_inplace", DirectForm::Slices, false, false, false, true},
    {"slices_scaled", DirectForm::Slices, true, false, false, false},
    {"slices_stream", DirectForm::Slices, false, false, true, false},
    {"slices_stream_inplace", DirectForm::Slices, false, false, true, true},
    {"slices_exposed", DirectForm::Slices, false, true, false, false},
    {"slices_exposed_stream", DirectForm::Slices, false, true, true, true},
};

TEST(DirectSchedule, FormsFollowTheParameters) {
  for (const Variant& v : kVariants) {
    const DirectParams p = paramsFor(v);
    const size_t count = v.form == DirectForm::LL ? 20 : 50;
    EXPECT_EQ(directForm(count * 4, 4, p), v.form) << v.name;
    const Schedule s = buildDirectAllReduce(1, 4, count, p);
    EXPECT_EQ(s.mem.lowLatency, v.form == DirectForm::LL) << v.name;
    EXPECT_EQ(s.mem.slots, v.form == DirectForm::LL ? kDirectLLSlots : kDirectSlots) << v.name;
    // Rounds: one for LL; else windows of 16 elements streamed, 8 in the caches.
    const size_t perRound = v.form == DirectForm::LL ? count : v.stream ? 16 : 8;
    EXPECT_EQ(s.mem.rounds, (count + perRound - 1) / perRound) << v.name;
    bool exposes = false;
    for (const Step& st : s.channels[0]) exposes |= st.op == StepOp::MemExpose;
    EXPECT_EQ(exposes, v.exposed && !v.scale) << v.name;
  }
  DirectParams p = paramsFor(kVariants[0]);
  EXPECT_EQ(directForm(0, 2, p), DirectForm::Symmetric) << "an empty message takes no LL line";
  EXPECT_EQ(directForm(385, 2, p), DirectForm::Slices);
}

TEST(DirectSchedule, EveryFormVerifiesForOneTo64Ranks) {
  for (const Variant& v : kVariants) {
    const DirectParams p = paramsFor(v);
    const std::vector<size_t> counts = v.form == DirectForm::LL
                                           ? std::vector<size_t>{1, 12, 13, 96}
                                           : std::vector<size_t>{0, 1, 7, 16, 50};
    for (int n = 1; n <= 64; n = n < 9 ? n + 1 : n * 2) {
      for (size_t count : counts) {
        VerifyResult r = verify(buildAll(n, count, p), opts(v.inPlace));
        EXPECT_TRUE(r.ok) << v.name << " n=" << n << " count=" << count << ": " << r.error;
      }
    }
  }
}

// Removes the first step of rank `rank` for which pick() holds; false if none.
template <typename Pick>
bool dropStep(std::vector<Schedule>& s, int rank, Pick pick) {
  std::vector<Step>& st = s[static_cast<size_t>(rank)].channels[0];
  for (size_t i = 0; i < st.size(); ++i) {
    if (!pick(st[i])) continue;
    st.erase(st.begin() + static_cast<long>(i));
    return true;
  }
  return false;
}

TEST(DirectSchedule, AMissingWaitForPeersInputIsCaught) {
  for (const Variant& v : kVariants) {
    for (int n : {2, 3, 5}) {
      for (int victim = 0; victim < n; ++victim) {
        std::vector<Schedule> s = buildAll(n, 50, paramsFor(v));
        // The wait of the last round: by then every window holds defined values of earlier
        // rounds, so only the clocks can tell that the read may come before the write.
        ASSERT_TRUE(dropStep(s, victim, [&](const Step& st) {
          return st.op == StepOp::MemWait && st.round == s[0].mem.rounds;
        })) << v.name;
        VerifyResult r = verify(s, opts(v.inPlace));
        EXPECT_FALSE(r.ok) << v.name << " n=" << n << " rank " << victim;
        EXPECT_TRUE(Contains(r.error, "race") || Contains(r.error, "undefined") ||
                    Contains(r.error, "index"))
            << v.name;
      }
    }
  }
}

TEST(DirectSchedule, AGatherThatDoesNotWaitForTheReducedSliceIsARace) {
  for (const Variant& v : kVariants) {
    if (v.form != DirectForm::Slices) continue;
    std::vector<Schedule> s = buildAll(3, 50, paramsFor(v));
    Step& last = s[1].channels[0].back();
    ASSERT_EQ(last.op, StepOp::MemGather) << v.name;
    last.flags |= kNoWait;
    VerifyResult r = verify(s, opts(v.inPlace));
    EXPECT_FALSE(r.ok) << v.name;
    EXPECT_TRUE(Contains(r.error, "rank 1 channel 0 step")) << r.error;
    EXPECT_TRUE(Contains(r.error, "race") || Contains(r.error, "in place")) << r.error;
  }
}

TEST(DirectSchedule, TwoBuffersAreTooFewForTheSlicesForm) {
  // With two, round g would fill round g-2's buffer, which a peer gathers only after it has
  // seen round g's input.
  std::vector<Schedule> s = buildAll(3, 50, paramsFor(kVariants[5]));
  for (Schedule& x : s) x.mem.slots = 2;
  VerifyResult r = verify(s, opts(false));
  EXPECT_FALSE(r.ok);
  EXPECT_TRUE(Contains(r.error, "race")) << r.error;
  EXPECT_TRUE(Contains(r.error, "'s window[")) << r.error;
}

TEST(DirectSchedule, OneLowLatencyLineIsTooFewForBackToBackOperations) {
  std::vector<Schedule> s = buildAll(4, 12, paramsFor(kVariants[0]));
  for (Schedule& x : s) x.mem.slots = 1;
  VerifyResult r = verify(s, opts(false));
  EXPECT_FALSE(r.ok);
  EXPECT_TRUE(Contains(r.error, "race")) << r.error;
  VerifyOptions one = opts(false);
  one.repeat = 1;  // a single operation never reuses the line
  EXPECT_TRUE(verify(s, one).ok);
}

TEST(DirectSchedule, AnExposedInputMustNotBeLeftBeforeThePeersReadIt) {
  // Without its final gather (whose waits end after every peer has read every input), rank 0
  // could return, and its caller overwrite the send buffer, while rank 1 still reduces from it
  // in place.
  std::vector<Schedule> s = buildAll(2, 20, paramsFor(kVariants[10]));
  ASSERT_EQ(s[0].channels[0].back().op, StepOp::MemGather);
  s[0].channels[0].pop_back();
  VerifyResult r = verify(s, opts(false));
  EXPECT_FALSE(r.ok);
  EXPECT_TRUE(Contains(r.error, "rank 0's input in place") ||
              Contains(r.error, "its input exposed in place"))
      << r.error;
  EXPECT_TRUE(Contains(r.error, "race")) << r.error;
}

TEST(DirectSchedule, AWaitForARoundNeverPublishedIsADeadlock) {
  // The last round's publish (a missing publish of an earlier round is no deadlock: flags only
  // grow, and the next round's publish ends the wait, later).
  std::vector<Schedule> s = buildAll(3, 50, paramsFor(kVariants[3]));
  const uint32_t last = s[0].mem.rounds;
  ASSERT_TRUE(dropStep(
      s, 2, [&](const Step& st) { return st.op == StepOp::MemPublish && st.round == last; }));
  VerifyOptions o = opts(false);
  o.repeat = 1;
  VerifyResult r = verify(s, o);
  EXPECT_FALSE(r.ok);
  EXPECT_TRUE(Contains(r.error, "deadlock")) << r.error;
  EXPECT_TRUE(
      Contains(r.error, "waits for rank 2's ready flag to reach round " + std::to_string(last)))
      << r.error;
}

TEST(DirectSchedule, MalformedMemoryStepsAreRefused) {
  const DirectParams p = paramsFor(kVariants[5]);
  auto check = [&](auto mutate, const char* expected) {
    std::vector<Schedule> s = buildAll(2, 20, p);
    mutate(s[0]);
    VerifyResult r = verify(s, opts(false));
    EXPECT_FALSE(r.ok) << expected;
    EXPECT_TRUE(Contains(r.error, expected));
  };
  check([](Schedule& s) { s.channels[0][0].round = 99; }, "is not in 1..");
  check([](Schedule& s) { s.channels[0][0].dst.offset = 15; }, "outside the window");
  check([](Schedule& s) { s.mem.slots = 0; }, "window differs");
  check([](Schedule& s) { s.channels[0][0].flags |= kSkipOwn; }, "flags not allowed");
  check(
      [](Schedule& s) {
        s.channels[0].push_back(makeFlagStep(StepOp::MemPublish, MemWord::Ready, 1));
      },
      "flags only grow");
}

TEST(DirectSchedule, TheDumpNamesMemoryStepsAndTheWindow) {
  const Schedule s = buildDirectAllReduce(0, 2, 50, paramsFor(kVariants[8]));
  const std::string j = toJson(s);
  EXPECT_TRUE(Contains(j, "\"algorithm\":\"direct\""));
  EXPECT_TRUE(Contains(j, "\"window\":{\"count\":16,\"slots\":3,\"rounds\":4"));
  EXPECT_TRUE(Contains(j, "{\"op\":\"memPublish\",\"round\":1,\"word\":\"ready\"}"));
  EXPECT_TRUE(Contains(j, "\"op\":\"memGather\""));
  EXPECT_TRUE(Contains(j, "\"op\":\"memReduce\",\"src\":[\"window\","));
}

// The calibration's rule: a form keeps sizes only while it was never the slower one, so a size
// measured faster further up does not win back the sizes after a loss.
TEST(DirectSchedule, FormLimitIsTheLongestRunWhereTheSmallerFormWins) {
  EXPECT_EQ(formLimit({}), 0u);
  // Two losses in a row end the smaller form's run before the first of them.
  EXPECT_EQ(formLimit({{8, 1.0, 2.0}, {64, 1.0, 1.0}, {128, 3.0, 2.0}, {256, 3.0, 2.0}}), 64u);
  // One loss between wins is noise: the run goes on.
  EXPECT_EQ(formLimit({{8, 1.0, 2.0}, {64, 3.0, 2.0}, {128, 1.0, 2.0}, {256, 3.0, 2.0}}), 128u);
  EXPECT_EQ(formLimit({{8, 2.5, 2.0}, {64, 2.5, 2.0}, {128, 1.0, 2.0}}), 0u);
  EXPECT_EQ(formLimit({{512, 0.4, 0.5}, {1024, 0.6, 0.7}}), 1024u);
  // Within the tolerance is a tie, which the smaller form keeps; beyond it, a loss.
  EXPECT_EQ(formLimit({{512, 1.02, 1.0}, {1024, 1.02, 1.0}}), 1024u);
  EXPECT_EQ(formLimit({{512, 1.05, 1.0}, {1024, 1.05, 1.0}}), 0u);
  // A loss at the last size measured ends the run there.
  EXPECT_EQ(formLimit({{512, 0.4, 0.5}, {1024, 0.9, 0.7}}), 512u);
  // A time that is not a number (a failed measurement) is a loss.
  EXPECT_EQ(formLimit({{512, 0.4, 0.5}, {1024, std::nan(""), 0.7}, {2048, 0.9, 0.7}}), 512u);
  // What the limits then choose: a fixed limit rules over the tables', whatever the cores.
  DirectParams p = defaultDirectParams();
  p.ranksPerCore = 2;
  p.llMaxBytes = 64;
  p.tuning.symmetricFixedBytes = 2048;
  EXPECT_EQ(directForm(64, 4, p), DirectForm::LL);
  EXPECT_EQ(directForm(65, 4, p), DirectForm::Symmetric);
  EXPECT_EQ(directForm(2048, 4, p), DirectForm::Symmetric);
  EXPECT_EQ(directForm(2049, 4, p), DirectForm::Slices);
  p.llMaxBytes = 0;
  p.tuning.symmetricFixedBytes = 0;
  EXPECT_EQ(directForm(8, 4, p), DirectForm::Slices);
}

// Which size the symmetric form ends at: symmetricBytes / nranks on either table.
TEST(DirectSchedule, SymmetricLimitByRanks) {
  for (CpuVendor vendor : {CpuVendor::Amd, CpuVendor::Intel}) {
    DirectParams p = defaultDirectParams();
    p.tuning = directTuning(vendor);
    p.llMaxBytes = 0;
    for (int n : {2, 4, 8}) {
      const size_t limit = (size_t{64} << 10) / static_cast<size_t>(n);
      EXPECT_EQ(directForm(limit, n, p), DirectForm::Symmetric) << n;
      EXPECT_EQ(directForm(limit + 4, n, p), DirectForm::Slices) << n;
    }
  }
}

}  // namespace
}  // namespace loom::algo
