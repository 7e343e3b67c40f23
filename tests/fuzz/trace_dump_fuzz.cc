// Fuzzes loom-trace's reader of flight-recorder dumps (tools/trace/dump.cc): JSON written by
// ranks that may have crashed mid-write, or by anyone. The contract (dump.h): anything wrong
// is a TraceInputError naming the file; no other exception, no crash.
//
// A dump that parses is also run through the analysis as a one-rank communicator's trace
// (tools/trace/analysis.h), which reads every field the reader let through.
//
// The reader holds only the per-rank times a file names ("arrivals", "firstArrivalNs" as
// RankTimes), so any input costs memory in proportion to its size, whatever its "nranks". The
// analysis holds a cell per rank and operation; loadDumps bounds that (kMaxAnalysisCells), and
// here only dumps of up to 64 ranks are analysed.
#include <cstddef>
#include <cstdint>
#include <string>

#include "analysis.h"
#include "dump.h"

using namespace loom::tracetool;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  RankDump d;
  try {
    d = parseDump(text, "fuzz.json");
  } catch (const TraceInputError&) {
    return 0;
  }
  CommTrace t;
  t.name = d.comm;
  t.hash = d.commHash;
  t.nranks = d.nranks;
  // A rank out of range: loadDumps refuses it. More ranks: see above.
  if (d.rank < 0 || d.rank >= d.nranks || d.nranks > 64) return 0;
  t.ranks.resize(static_cast<size_t>(d.nranks));
  t.ranks[static_cast<size_t>(d.rank)] = d;
  (void)analyze(t);
  return 0;
}
