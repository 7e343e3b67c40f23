// loom-trace's reader on bad input (every error names the file; no other
// exception escapes) and its writers: the text lines, the Chrome/Perfetto
// events, and the HTML page's structure.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <nlohmann/json.hpp>
#include <sstream>

#include "analysis.h"
#include "dump.h"
#include "loom/loom.h"
#include "report.h"
#include "synthetic_dumps.h"

namespace loomtest {
namespace {

using namespace loom::tracetool;
using nlohmann::json;

// Three ranks, five all-reduces; rank 1 stops after seq 4 and rank 2 enters
// every operation 1 ms after the others.
std::vector<SynthRank> threeRanks() {
  std::vector<SynthRank> ranks(3);
  for (int q = 0; q < 3; ++q) {
    SynthRank& r = ranks[static_cast<size_t>(q)];
    r.rank = q;
    r.nranks = 3;
    for (uint64_t s = 1; s <= 5; ++s) {
      SynthOp o;
      o.seq = s;
      o.enterNs = static_cast<int64_t>(s) * 10000000 + (q == 2 ? 1000000 : q * 1000);
      o.endNs = static_cast<int64_t>(s) * 10000000 + 1500000;
      r.ops.push_back(o);
    }
  }
  ranks[1].ops.pop_back();
  ranks[0].ops.back().state = ranks[2].ops.back().state = "failed";
  return ranks;
}

std::string expectInputError(const std::string& text, const std::string& want) {
  try {
    parseDump(text, "/x/dump.json");
  } catch (const TraceInputError& e) {
    std::string msg = e.what();
    EXPECT_EQ(msg.rfind("/x/dump.json: ", 0), 0u) << msg;
    EXPECT_NE(msg.find(want), std::string::npos) << msg;
    return msg;
  }
  ADD_FAILURE() << "no error for: " << text;
  return "";
}

// The tool keeps its own copy of the operation codes: they must be loom.h's.
TEST(TraceOutput, OperationNamesFollowLoomsCodes) {
  EXPECT_EQ(redOpName(loomSum), "sum");
  EXPECT_EQ(redOpName(loomAvg), "avg");
  EXPECT_EQ(redOpName(loomNumOps), "premulsum");
  EXPECT_EQ(redOpName(loomBand - 1), "premulsum");
  EXPECT_EQ(redOpName(loomBand), "band");
  EXPECT_EQ(redOpName(loomBor), "bor");
  EXPECT_EQ(redOpName(loomBxor), "bxor");
  EXPECT_EQ(redOpName(loomBxor + 1), "op" + std::to_string(loomBxor + 1));
  EXPECT_EQ(redOpName(-1), "op-1");
}

TEST(TraceInput, MalformedDumpsNameTheFileAndTheField) {
  const std::string good = toJson(threeRanks()[0]).dump();
  expectInputError("{\"rank\":0,", "not valid JSON");
  expectInputError("", "not valid JSON");
  expectInputError(R"({"rank":0,"nranks":2,"ops":{}})", "\"ops\" must be an array");
  expectInputError(R"({"rank":2,"nranks":2,"ops":[]})", "\"rank\" is 2, outside 0..1");
  expectInputError(R"({"rank":0,"ops":[]})", "\"nranks\" is missing");
  expectInputError(
      R"({"rank":0,"nranks":1,"ops":[{"seq":"1","coll":"a","state":"s","enterNs":1}]})",
      "ops[0]: \"seq\" must be an integer, not string");
  expectInputError(R"({"rank":0,"nranks":1,"ops":[{"seq":1,"state":"s","enterNs":1}]})",
                   "ops[0]: \"coll\" is missing");
  expectInputError(
      R"({"rank":0,"nranks":1,"ops":[{"seq":1,"tag":-2,"coll":"a","state":"s","enterNs":1}]})",
      "ops[0]: \"tag\"");
  expectInputError(
      R"({"rank":0,"nranks":2,"ops":[{"seq":1,"coll":"a","state":"s","enterNs":1,"arrivals":[1]}]})",
      "\"arrivals\" has 1 entries for 2 ranks");
  expectInputError(R"({"rank":0,"nranks":1,"ops":[{"seq":1,"coll":"a","state":"s","enterNs":1},)"
                   R"({"seq":1,"coll":"a","state":"s","enterNs":2}]})",
                   "seq 1 appears twice");
  expectInputError(R"({"rank":0,"nranks":2,"ops":[{"seq":1,"coll":"a","state":"s","enterNs":1,)"
                   R"("arrivals":[[0,5],[2,6]]}]})",
                   "\"arrivals\" names rank 2 of 2");
  expectInputError(R"({"rank":0,"nranks":2,"ops":[{"seq":1,"coll":"a","state":"s","enterNs":1,)"
                   R"("firstArrivalNs":[[1,5],7]}]})",
                   "\"firstArrivalNs\" mixes [rank, time] pairs with other entries");
  expectInputError(R"({"rank":0,"nranks":1,"clockOffsetNs":1.5,"ops":[]})",
                   "\"clockOffsetNs\" must be an integer");
  // Times so large that differences of two could overflow.
  expectInputError(
      R"({"rank":0,"nranks":1,"ops":[{"seq":1,"coll":"a","state":"s","enterNs":9223372036854775807}]})",
      "\"enterNs\" is 9223372036854775807, outside");
  expectInputError(R"({"rank":0,"nranks":1,"ops":[{"seq":1,"coll":"a","state":"s","enterNs":1,)"
                   R"("arrivals":[[0,-9223372036854775807]]}]})",
                   "\"arrivals\" holds a time out of range");
  EXPECT_THROW(parseDump("[1,2]", "/x/dump.json"), NotADumpError);
  // Empty lists: the pair form with no rank known.
  RankDump d = parseDump(
      R"({"rank":0,"nranks":2,"ops":[{"seq":1,"coll":"a","state":"completed","enterNs":1,)"
      R"("arrivals":[],"firstArrivalNs":[[1,9]]}]})",
      "/x/dump.json");
  EXPECT_TRUE(d.ops[0].arrivals.empty());
  EXPECT_EQ(d.ops[0].firstArrivalNs, (RankTimes{{1, 9}}));
  EXPECT_NO_THROW(parseDump(good, "/x/dump.json"));
}

// A state the tool does not know is refused, naming the operation and the field, after every
// other fault of the file; it is not read as "stuck".
TEST(TraceInput, AnUnknownStateIsRefused) {
  const std::string msg = expectInputError(
      R"({"rank":0,"nranks":1,"ops":[{"seq":2,"coll":"a","state":"completed","enterNs":1},)"
      R"({"seq":1,"coll":"a","state":"finished","enterNs":1}]})",
      "ops[1]: \"state\" is \"finished\", not enqueued, started, completed or failed");
  for (const char* state : {"enqueued", "started", "completed", "failed"})
    EXPECT_NO_THROW(parseDump(std::string(R"({"rank":0,"nranks":1,"ops":[{"seq":1,"coll":"a",)") +
                                  R"("state":")" + state + R"(","enterNs":1}]})",
                              "/x/dump.json"))
        << state;
  TempDir dir;
  std::vector<SynthRank> ranks = threeRanks();
  ranks[1].ops[2].state = "running";
  for (const SynthRank& r : ranks) dir.write(r);
  try {
    loadDumps({dir.path()});
    ADD_FAILURE() << "an unknown state was accepted";
  } catch (const TraceInputError& e) {
    EXPECT_NE(std::string(e.what()).find("rank1.json: ops[2]: \"state\" is \"running\""),
              std::string::npos)
        << e.what();
  }
}

// Per-rank times hold only the ranks known, ascending, from either form; a rank named twice
// keeps its last time, a null one keeps none.
TEST(TraceInput, PerRankTimesHoldOnlyTheKnownRanks) {
  RankDump d = parseDump(
      R"({"rank":0,"nranks":4,"ops":[{"seq":1,"coll":"a","state":"completed","enterNs":1,)"
      R"("arrivals":[null,5,null,7],"firstArrivalNs":[[3,9],[1,4],[3,null],[0,2],[1,6]]}]})",
      "/x/dump.json");
  const OpEntry& e = d.ops[0];
  EXPECT_EQ(e.arrivals, (RankTimes{{1, 5}, {3, 7}}));
  EXPECT_EQ(e.arrivals.size(), 2u);
  EXPECT_EQ(e.arrivals.at(1), MaybeNs(5));
  EXPECT_EQ(e.arrivals.at(0), std::nullopt);
  EXPECT_EQ(e.arrivals.at(4), std::nullopt);
  std::vector<RankTimes::Entry> first(e.firstArrivalNs.begin(), e.firstArrivalNs.end());
  EXPECT_EQ(first, (std::vector<RankTimes::Entry>{{0, 2}, {1, 6}, {3, 9}}));
}

std::string loadError(const std::vector<std::string>& paths) {
  try {
    loadDumps(paths);
  } catch (const TraceInputError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no error";
  return "";
}

// A crafted rank count costs what the file holds: a million ranks and two operations are read
// and analysed at once; operations x ranks beyond what the analysis holds are refused, naming
// the file, whether in one file or over several.
TEST(TraceInput, ACraftedRankCountIsBoundedByWhatIsHeld) {
  TempDir dir;
  auto crafted = [](int nranks, int rank, int nops, uint64_t firstSeq) {
    std::string ops;
    for (int i = 0; i < nops; ++i)
      ops += std::string(i ? "," : "") + R"({"seq":)" + std::to_string(firstSeq + i) +
             R"(,"coll":"allreduce","state":"completed","enterNs":)" + std::to_string(i + 1) +
             R"(,"arrivals":[[)" + std::to_string(rank) + "," + std::to_string(i + 1) + "]]}";
    return R"({"rank":)" + std::to_string(rank) + R"(,"nranks":)" + std::to_string(nranks) +
           R"(,"commHash":"c","ops":[)" + ops + "]}";
  };
  const std::string big = dir.write("big.json", crafted(1 << 20, 0, 2, 1));
  LoadResult res = loadDumps({big});
  Analysis a = analyze(res.comms.at(0));
  EXPECT_EQ(a.ops.size(), 2u);
  EXPECT_EQ(a.noDump.size(), (1u << 20) - 1);
  EXPECT_EQ(a.verdict(), kExitIncomplete);

  const int many = static_cast<int>(kMaxAnalysisCells / (1 << 20)) + 1;
  const std::string huge = dir.write("huge.json", crafted(1 << 20, 0, many, 1));
  std::string msg = loadError({huge});
  EXPECT_EQ(msg.rfind(huge + ": ", 0), 0u) << msg;
  EXPECT_NE(msg.find(std::to_string(many) + " operations x 1048576 ranks, more than this tool "
                                            "analyses"),
            std::string::npos)
      << msg;
  // Two files of one communicator, each within the bound, whose sequence numbers together are not.
  const int half = many / 2 + 1;
  const std::string a0 = dir.write("a0.json", crafted(1 << 20, 0, half, 1));
  const std::string a1 = dir.write("a1.json", crafted(1 << 20, 1, half, 1000));
  EXPECT_NO_THROW(loadDumps({a0}));
  msg = loadError({a0, a1});
  EXPECT_EQ(msg.rfind(a1 + ": ", 0), 0u) << msg;
}

// Every prefix of a valid dump, and every single-byte corruption of it, is
// either read or rejected with a TraceInputError: never another exception.
TEST(TraceInput, TruncatedOrCorruptedDumpsNeverEscapeAsOtherErrors) {
  const std::string good = toJson(threeRanks()[1]).dump();
  for (size_t n = 0; n < good.size(); ++n) {
    try {
      parseDump(good.substr(0, n), "t.json");
    } catch (const TraceInputError&) {
    }
  }
  for (size_t i = 0; i < good.size(); i += 3) {
    for (char c : {'"', '9', '-', '\xff', '{'}) {
      std::string bad = good;
      bad[i] = c;
      try {
        parseDump(bad, "t.json");
      } catch (const TraceInputError&) {
      }
    }
  }
}

TEST(TraceInput, FolderAndFileErrors) {
  TempDir dir;
  EXPECT_THROW(loadDumps({dir.path()}), TraceInputError);  // no dumps at all
  EXPECT_THROW(loadDumps({dir.file("absent.json")}), TraceInputError);
  std::vector<SynthRank> ranks = threeRanks();
  dir.write(ranks[0]);
  dir.write("report.json", R"({"traceEvents":[]})");  // not a dump: skipped in a folder
  LoadResult res = loadDumps({dir.path()});
  ASSERT_EQ(res.notes.size(), 1u);
  EXPECT_NE(res.notes[0].find("report.json"), std::string::npos);
  EXPECT_THROW(loadDumps({dir.file("report.json")}), NotADumpError);  // named outright: an error
  // Another program's file that is not JSON at all: skipped in a folder too; named outright, or
  // named as Loom names its dumps (a damaged dump), an error.
  dir.write("notes.json", "junk");
  res = loadDumps({dir.path()});
  ASSERT_EQ(res.notes.size(), 2u);
  EXPECT_NE(res.notes[0].find("notes.json: not valid JSON"), std::string::npos) << res.notes[0];
  EXPECT_THROW(loadDumps({dir.file("notes.json")}), NotJsonError);
  std::remove(dir.file("notes.json").c_str());
  // A pipe or a folder named *.json in the folder is passed over (a read of a pipe would block);
  // named outright, it is an error that says what it is.
  ASSERT_EQ(mkfifo(dir.file("pipe.json").c_str(), 0600), 0);
  ASSERT_EQ(mkdir(dir.file("sub.json").c_str(), 0700), 0);
  EXPECT_EQ(loadDumps({dir.path()}).notes.size(), 1u);
  try {
    loadDumps({dir.file("pipe.json")});
    ADD_FAILURE() << "a pipe was read as a dump";
  } catch (const TraceInputError& e) {
    EXPECT_NE(std::string(e.what()).find("not a regular file"), std::string::npos) << e.what();
  }
  ranks[1].nranks = 4;
  dir.write(ranks[1]);
  try {
    loadDumps({dir.path()});
    ADD_FAILURE() << "rank counts that disagree were accepted";
  } catch (const TraceInputError& e) {
    EXPECT_NE(std::string(e.what()).find("says 4 ranks"), std::string::npos) << e.what();
  }
}

CommReport reportOf(const CommTrace& c) { return {&c, analyze(c)}; }

// The text report of these ranks' dumps, written to a folder and read back (*res: what was
// read, for a further look).
std::string textOf(const std::vector<SynthRank>& ranks, LoadResult* res = nullptr) {
  TempDir dir;
  for (const SynthRank& r : ranks) dir.write(r);
  LoadResult loaded = loadDumps({dir.path()});
  std::ostringstream out;
  writeText(out, {reportOf(loaded.comms[0])});
  if (res != nullptr) *res = std::move(loaded);
  return out.str();
}

TEST(TraceOutput, TextNamesTheStragglerAndTheMissingRank) {
  TempDir dir;
  for (const SynthRank& r : threeRanks()) dir.write(r);
  LoadResult res = loadDumps({dir.path()});
  std::ostringstream out;
  writeText(out, {reportOf(res.comms[0])});
  const std::string text = out.str();
  EXPECT_NE(text.find("seq 5 allreduce: missing ranks: {1} (entered by {0,2})"), std::string::npos)
      << text;
  EXPECT_NE(text.find("slowest: rank 2, last in 4 of 4 operations"), std::string::npos) << text;
  EXPECT_NE(text.find("Verdict: missing ranks (exit 3)"), std::string::npos) << text;
  EXPECT_NE(text.find("rank 1: last seq 4 allreduce completed"), std::string::npos) << text;
}

// The straggler's operations, latest first, with the caller's numbers for them (a dump's
// "tag", from loomCommSetOpTag) where the dumps have them.
TEST(TraceOutput, TextListsTheStragglersOperationsWithTheirTags) {
  std::vector<SynthRank> ranks = threeRanks();
  for (SynthRank& r : ranks)
    for (SynthOp& o : r.ops)
      if (o.seq != 2) o.tag = 100 + o.seq;
  LoadResult res;
  const std::string text = textOf(ranks, &res);
  EXPECT_NE(text.find("rank 2 was last in: seq 4 (tag 104) allreduce +1000.0 us, seq 3 (tag "
                      "103) allreduce +1000.0 us, seq 2 allreduce +1000.0 us, seq 1 (tag "
                      "101) allreduce +1000.0 us\n"),
            std::string::npos)
      << text;
  EXPECT_EQ(slowestOpsLine(analyze(res.comms[0]), 2),
            "rank 2 was last in: seq 4 (tag 104) allreduce +1000.0 us, seq 3 (tag 103) allreduce "
            "+1000.0 us, and 2 earlier");
}

TEST(TraceOutput, TextShowsAMismatchRankByRank) {
  std::vector<SynthRank> ranks = threeRanks();
  ranks.resize(2);
  for (SynthRank& r : ranks) r.nranks = 2;
  ranks[1].ops[2].coll = "broadcast";
  ranks[1].ops[2].root = 0;
  const std::string text = textOf(ranks);
  EXPECT_NE(text.find("mismatch at seq 3: rank 0 allreduce count 1024 fp32 sum, rank 1 "
                      "broadcast count 1024 fp32 root 0"),
            std::string::npos)
      << text;
}

TEST(TraceOutput, PerfettoHasATrackPerRankAndASlicePerOperation) {
  TempDir dir;
  std::vector<SynthRank> ranks = threeRanks();
  for (const SynthRank& r : ranks) dir.write(r);
  LoadResult res = loadDumps({dir.path()});
  std::vector<CommReport> reports = {reportOf(res.comms[0])};
  json doc = json::parse(perfettoJson(reports));
  ASSERT_TRUE(doc["traceEvents"].is_array());
  size_t slices = 0, arrivals = 0, threads = 0, missing = 0;
  for (const json& e : doc["traceEvents"]) {
    ASSERT_EQ(e["pid"], 1);
    const std::string ph = e["ph"];
    if (ph == "X") {
      ++slices;
      const int tid = e["tid"];
      ASSERT_GE(tid, 1);
      ASSERT_LE(tid, 3);
      EXPECT_GE(e["ts"].get<double>(), 0.0);
      EXPECT_GE(e["dur"].get<double>(), 0.0);
      for (const char* k : {"seq", "count", "dtype", "algorithm", "lateness_us"})
        EXPECT_TRUE(e["args"].contains(k)) << k;
      // Rank 2 is 1 ms late in every operation that every rank entered.
      if (tid == 3 && e["args"]["seq"] == 2) {
        EXPECT_NEAR(e["args"]["lateness_us"], 1000.0, 1e-6);
      }
      if (e["args"]["seq"] == 5) {
        EXPECT_TRUE(e["args"]["lateness_us"].is_null());
      }
    } else if (ph == "i") {
      const std::string name = e["name"];
      if (name.rfind("arrive #", 0) == 0) ++arrivals;
      if (name == "never entered #5") ++missing;
    } else if (ph == "M" && e["name"] == "thread_name") {
      ++threads;
    }
  }
  EXPECT_EQ(slices, 5u + 4u + 5u);
  EXPECT_EQ(arrivals, 5u + 4u + 5u);
  EXPECT_EQ(missing, 1u);
  EXPECT_EQ(threads, 3u);
}

TEST(TraceOutput, HtmlIsSelfContainedWithHeatmapDataAndTable) {
  std::vector<SynthRank> ranks = threeRanks();
  for (SynthRank& r : ranks) r.comm = "evil</script><b>\"name";
  TempDir dir;
  for (const SynthRank& r : ranks) dir.write(r);
  LoadResult res = loadDumps({dir.path()});
  const std::string html = htmlReport({reportOf(res.comms[0])});
  EXPECT_NE(html.find("id=\"heatmap\" data-ranks=\"3\" data-ops=\"5\""), std::string::npos);
  EXPECT_NE(html.find("<table id=\"stragglers\""), std::string::npos);
  EXPECT_NE(html.find("<tr data-rank=\"2\" class=\"top\">"), std::string::npos);
  for (const char* net : {"http://", "https://", "<link", "src=", "@import"})
    EXPECT_EQ(html.find(net), std::string::npos) << net;
  // The communicator's name never closes a script early or opens a tag.
  EXPECT_EQ(html.find("evil</script>"), std::string::npos);
  EXPECT_EQ(html.find("<b>"), std::string::npos);
  // The data block is valid JSON with one state per rank and operation.
  const std::string open = "<script type=\"application/json\" id=\"loom-data\">";
  size_t a = html.find(open);
  ASSERT_NE(a, std::string::npos);
  a += open.size();
  size_t b = html.find("</script>", a);
  json data = json::parse(html.substr(a, b - a));
  const json& c = data["comms"][0];
  EXPECT_EQ(c["heatmapId"], "heatmap");
  EXPECT_EQ(c["seqs"].size(), 5u);
  ASSERT_EQ(c["states"].size(), 3u);
  EXPECT_EQ(c["states"][1], "ttttm");
  EXPECT_EQ(c["late"][2][0], 1000000);
}

}  // namespace
}  // namespace loomtest
