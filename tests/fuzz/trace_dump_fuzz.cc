// Fuzzes loom-trace's reader of flight-recorder dumps (tools/trace/dump.cc): JSON written by
// ranks that may have crashed mid-write, or by anyone. The contract (dump.h): anything wrong
// is a TraceInputError naming the file; no other exception, no crash.
//
// A dump that parses is also run through the analysis as a one-rank communicator's trace
// (tools/trace/analysis.h), which reads every field the reader let through.
//
// Known limit, skipped here so that a run stays meaningful: the reader expands every per-rank
// time list ("arrivals", "firstArrivalNs") to nranks entries, so a small file with a large
// "nranks" (up to 2^20) and many operations takes 16 MB per list (a 16 KB file, 1 GB).
// Inputs whose nranks x operations exceeds kMaxCells are not parsed (docs/RELIABILITY.md).
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>

#include "analysis.h"
#include "dump.h"

using namespace loom::tracetool;

namespace {
constexpr double kMaxCells = 4e6;

bool tooManyCells(const std::string& text) {
  nlohmann::json doc = nlohmann::json::parse(text, nullptr, false);
  if (!doc.is_object()) return false;
  auto n = doc.find("nranks"), ops = doc.find("ops");
  if (n == doc.end() || ops == doc.end() || !n->is_number() || !ops->is_array()) return false;
  return n->get<double>() * static_cast<double>(ops->size()) > kMaxCells;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  if (tooManyCells(text)) return 0;
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
  if (d.rank < 0 || d.rank >= d.nranks || d.nranks > 64) return 0;  // loadDumps refuses these
  t.ranks.resize(static_cast<size_t>(d.nranks));
  t.ranks[static_cast<size_t>(d.rank)] = d;
  (void)analyze(t);
  return 0;
}
