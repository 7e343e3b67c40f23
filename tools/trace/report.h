// loom-trace's outputs: the text report, the Chrome/Perfetto trace and the
// HTML page, each over the same analysed communicators.
#pragma once

#include <ostream>
#include <string>
#include <vector>

#include "analysis.h"
#include "dump.h"

namespace loom::tracetool {

struct CommReport {
  const CommTrace* comm = nullptr;
  Analysis analysis;
};

// Straggler table, skew per operation kind, hang analysis and the verdict,
// one block per communicator. At most `maxFindings` lines of each finding kind.
void writeText(std::ostream& out, const std::vector<CommReport>& reports, size_t maxFindings = 20);

// Chrome's Trace Event Format (JSON), which ui.perfetto.dev and chrome://tracing load:
// one process per communicator, one thread per rank, a complete ("X") event
// per operation from entry to end, an instant ("i") event at each arrival.
std::string perfettoJson(const std::vector<CommReport>& reports);

// A self-contained page: per communicator a rank x operation lateness heatmap
// (element id "heatmap", then "heatmap-2", ...; one element of class "cell"
// with data-rank, data-seq and data-late-ns per rank and operation, drawn by the
// page's script), the straggler table (id "stragglers", ...), skew and findings.
std::string htmlReport(const std::vector<CommReport>& reports);

// The report's lines, shared by the text and the HTML: where each rank
// stopped; the mismatch, missing, stuck and no-dump findings (at most `limit`
// of each kind); the most harmful straggler ("" when no rank was ever last).
std::vector<std::string> lastSeenLines(const Analysis& a);
std::vector<std::string> findingLines(const Analysis& a, size_t limit);
std::string slowestLine(const Analysis& a);
// The operations that straggler was last in, latest first, at most `limit` (then how many
// more), each with the caller's tag where it has one and how late the rank was: "rank 1 was
// last in: seq 40 (tag 12) allreduce +50012.3 us, ..." ("" when no rank was ever last).
std::string slowestOpsLine(const Analysis& a, size_t limit = 5);
// The (sender, receiver) pair whose first data came latest ("" when none was recorded).
std::string slowestLinkLine(const Analysis& a);

// Text for HTML: & < > " escaped.
std::string htmlEscape(const std::string& s);
// Nanoseconds as microseconds with one decimal: "20123.4".
std::string usText(double ns);

}  // namespace loom::tracetool
