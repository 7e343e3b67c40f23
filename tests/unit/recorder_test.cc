// Flight recorder: the ring keeps the newest records, states and errors are
// kept, lateness is attributed to the rank that entered last.
#include "trace/recorder.h"

#include <gtest/gtest.h>

#include <atomic>
#include <regex>
#include <string>
#include <thread>
#include <vector>

namespace loom::trace {
namespace {

size_t countOf(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + 1)) ++n;
  return n;
}

// The ring holds a power of two of records, but a dump shows exactly the capacity asked for,
// with a single writer (a blocking communicator's) or several.
TEST(FlightRecorder, KeepsTheNewestRecordsInOrder) {
  for (size_t capacity : {1, 3, 4, 5, 7}) {
    for (bool oneWriter : {false, true}) {
      SCOPED_TRACE("capacity " + std::to_string(capacity) + (oneWriter ? ", one writer" : ""));
      FlightRecorder rec(capacity, 0, 2, oneWriter);
      for (uint64_t seq = 1; seq <= 10; ++seq) {
        OpRecord* r = rec.begin(seq, "allreduce", seq * 10, 7, 0, -1);
        ASSERT_NE(r, nullptr);
        rec.end(r, Status());
      }
      std::string json = rec.toJson("c", 0xabc, "test");
      EXPECT_EQ(countOf(json, "\"seq\":"), capacity);
      // Oldest kept first: 11 - capacity, ..., 10.
      const uint64_t oldest = 11 - capacity;
      size_t pOld = json.find("\"seq\":" + std::to_string(oldest) + ",");
      size_t p10 = json.find("\"seq\":10,");
      ASSERT_NE(pOld, std::string::npos);
      ASSERT_NE(p10, std::string::npos);
      EXPECT_LE(pOld, p10);
      EXPECT_NE(json.find("\"count\":" + std::to_string(oldest * 10) + ","), std::string::npos);
      EXPECT_EQ(json.find("\"seq\":" + std::to_string(oldest - 1) + ","), std::string::npos);
      EXPECT_EQ(rec.lastCompletedSeq(), 10u);
      EXPECT_EQ(countOf(json, "\"state\":\"completed\""), capacity);
    }
  }
}

TEST(FlightRecorder, RecordsFailuresAndEscapesTheirText) {
  FlightRecorder rec(8, 1, 2);
  OpRecord* ok = rec.begin(1, "broadcast", 1, 0, 0, 0);
  rec.end(ok, Status());
  OpRecord* bad = rec.begin(2, "allreduce", 1, 0, 0, -1);
  OpRecord* open = nullptr;
  rec.end(bad, Status(loomTimeout, "waited for \"rank 0\"\n"));
  open = rec.begin(3, "allgather", 1, 0, 0, -1);
  ASSERT_NE(open, nullptr);
  std::string json = rec.toJson("c", 1, "why");
  EXPECT_NE(json.find("\"state\":\"failed\""), std::string::npos);
  EXPECT_NE(json.find("waited for \\\"rank 0\\\" "), std::string::npos) << json;
  EXPECT_NE(json.find("\"seq\":3,\"coll\":\"allgather\""), std::string::npos);
  EXPECT_NE(json.find("\"state\":\"started\""), std::string::npos);
  EXPECT_EQ(rec.lastCompletedSeq(), 1u);  // the failed one does not count
}

// A dump taken while operations reuse the ring shows only whole records: every record's
// fields belong to one operation (here count = 10 x seq, and the collective's name and the
// failure text follow seq's parity).
TEST(FlightRecorder, DumpsDuringOperationsShowWholeRecords) {
  FlightRecorder rec(4, 0, 2);
  std::atomic<bool> done{false};
  std::thread ops([&] {
    for (uint64_t seq = 1; seq <= 200000; ++seq) {
      const bool odd = seq % 2 == 1;
      OpRecord* r = rec.begin(seq, odd ? "allreduce" : "broadcast", seq * 10, 7, 0, -1);
      rec.end(r, odd ? Status() : Status(loomTimeout, "op " + std::to_string(seq)));
    }
    done = true;
  });
  const std::regex one(
      R"re(\{"seq":(\d+),"coll":"(\w+)","algorithm":"[^"]*","proto":"[^"]*","count":(\d+)[^{}]*?(?:"error":"op (\d+)")?\})re");
  size_t dumps = 0, records = 0;
  while (!done || dumps == 0) {
    const std::string json = rec.toJson("c", 1, "test");
    ++dumps;
    for (std::sregex_iterator it(json.begin(), json.end(), one), end; it != end; ++it) {
      const uint64_t seq = std::stoull((*it)[1]);
      ++records;
      ASSERT_EQ(std::stoull((*it)[3]), seq * 10) << it->str();
      ASSERT_EQ((*it)[2].str(), seq % 2 == 1 ? "allreduce" : "broadcast") << it->str();
      if ((*it)[4].matched) {
        ASSERT_EQ(std::stoull((*it)[4]), seq) << it->str();
      }
    }
  }
  ops.join();
  EXPECT_GT(records, 0u);
}

TEST(FlightRecorder, DisabledWithZeroCapacity) {
  FlightRecorder rec(0, 0, 2);
  EXPECT_FALSE(rec.enabled());
  EXPECT_EQ(rec.begin(1, "allreduce", 1, 0, 0, -1), nullptr);
  rec.end(nullptr, Status());
  FlightRecorder::addWait(nullptr, 1, 5);
}

TEST(FlightRecorder, WaitsKeepTheLongestPeer) {
  FlightRecorder rec(2, 0, 3);
  OpRecord* r = rec.begin(1, "allreduce", 1, 0, 0, -1);
  FlightRecorder::addWait(r, 1, 100);
  FlightRecorder::addWait(r, 2, 300);
  FlightRecorder::addWait(r, 1, 200);
  EXPECT_EQ(r->waitNs, 600);
  EXPECT_EQ(r->waitPeer, 2);
  EXPECT_EQ(r->maxWaitNs, 300);
}

TEST(FlightRecorder, LatenessGoesToTheLastRank) {
  FlightRecorder rec(16, 0, 3);
  // Rank 2 enters 5 ms after the first rank in three operations; rank 1 is
  // last once, by 1 ms.
  const std::vector<std::vector<int64_t>> arrivals = {
      {1000, 1100, 5001000}, {2000, 2000, 5002000}, {3000, 4000, 5003000}, {0, 1000000, 500}};
  for (size_t i = 0; i < arrivals.size(); ++i) {
    OpRecord* r = rec.begin(i + 1, "allreduce", 1, 0, 0, -1);
    rec.noteArrivals(r, arrivals[i]);
    rec.end(r, Status());
  }
  std::vector<RankLateness> l = rec.lateness();
  ASSERT_EQ(l.size(), 3u);
  EXPECT_EQ(l[2].timesLast, 3u);
  EXPECT_EQ(l[1].timesLast, 1u);
  EXPECT_EQ(l[0].timesLast, 0u);
  EXPECT_EQ(l[2].maxLateNs, 5000000);
  EXPECT_EQ(l[1].maxLateNs, 1000000);
  for (const auto& x : l) EXPECT_EQ(x.ops, 4u);
  // Wait caused by rank 2 in op 1: (5001000-1000) + (5001000-1100) + 0.
  double expected = 0;
  for (size_t i = 0; i < 3; ++i)
    for (int64_t t : arrivals[i]) expected += static_cast<double>(arrivals[i][2] - t);
  EXPECT_DOUBLE_EQ(l[2].waitCausedNs, expected);
  std::string json = rec.toJson("c", 1, "t");
  EXPECT_EQ(countOf(json, "\"lastRank\":2"), 3u);
}

}  // namespace
}  // namespace loom::trace
