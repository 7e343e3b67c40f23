// The text report: what a person reads first when a job was slow or hung.
#include <cstdarg>
#include <cstdio>

#include "report.h"

namespace loom::tracetool {
namespace {

std::string fmt(const char* format, ...) __attribute__((format(printf, 1, 2)));
std::string fmt(const char* format, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, format);
  std::vsnprintf(buf, sizeof(buf), format, ap);
  va_end(ap);
  return buf;
}

std::string seqRange(const Analysis& a) {
  if (a.ops.empty()) return "no operations recorded";
  return "seq " + std::to_string(a.ops.front().seq) + ".." + std::to_string(a.ops.back().seq);
}

void writeStragglers(std::ostream& out, const Analysis& a) {
  out << "Stragglers (lateness = entry minus the first rank's entry, in rank 0's clock; "
      << a.timedOps << " of " << a.ops.size() << " operations timed)\n";
  if (a.timedOps == 0) {
    out << "  no operation has every rank's entry time\n";
    return;
  }
  out << fmt("  %4s %6s %6s %12s %12s %12s %15s\n", "rank", "ops", "last", "mean_us", "p99_us",
             "max_us", "wait_caused_us");
  const std::vector<RankStats> order = a.stragglersByImpact();
  for (const RankStats& s : order)
    out << fmt("  %4d %6llu %6llu %12s %12s %12s %15s\n", s.rank,
               static_cast<unsigned long long>(s.ops), static_cast<unsigned long long>(s.timesLast),
               usText(s.meanLateNs).c_str(), usText(static_cast<double>(s.p99LateNs)).c_str(),
               usText(static_cast<double>(s.maxLateNs)).c_str(), usText(s.waitCausedNs).c_str());
  if (std::string s = slowestLine(a); !s.empty()) out << "  " << s << "\n";
  if (std::string s = slowestOpsLine(a); !s.empty()) out << "  " << s << "\n";
  if (a.clockUncertaintyNs > 0)
    out << "  clock uncertainty " << usText(static_cast<double>(a.clockUncertaintyNs))
        << " us: " << a.belowUncertainty << " operations within it are charged to no rank\n";
}

// Only when some dump recorded first arrivals (older dumps and synthetic ones may not).
void writeDataDelays(std::ostream& out, const Analysis& a) {
  const std::vector<PeerStats> order = a.sendersByDataDelay();
  if (order.empty()) return;
  out << "Data per sender (data = its first data at a receiver minus the receiver's entry, less "
         "the sender's lateness beyond the clock uncertainty)\n";
  out << fmt("  %4s %8s %12s %12s %12s %13s %15s\n", "rank", "arrivals", "data_mean_us",
             "data_p99_us", "data_max_us", "longest_waits", "waited_on_us");
  for (const PeerStats& p : order)
    out << fmt("  %4d %8llu %12s %12s %12s %13llu %15s\n", p.rank,
               static_cast<unsigned long long>(p.arrivals), usText(p.meanDataNs).c_str(),
               usText(static_cast<double>(p.p99DataNs)).c_str(),
               usText(static_cast<double>(p.maxDataNs)).c_str(),
               static_cast<unsigned long long>(p.longestWaits), usText(p.waitedOnNs).c_str());
  if (std::string s = slowestLinkLine(a); !s.empty()) out << "  " << s << "\n";
}

void writeSkew(std::ostream& out, const Analysis& a) {
  if (a.skew.empty()) return;
  out << "Skew per operation (skew = last entry minus first entry)\n";
  out << fmt("  %-36s %6s %12s %12s %12s\n", "operation", "ops", "mean_us", "p99_us", "max_us");
  for (const SkewGroup& g : a.skew)
    out << fmt("  %-36s %6llu %12s %12s %12s\n", g.label().c_str(),
               static_cast<unsigned long long>(g.ops), usText(g.meanNs).c_str(),
               usText(static_cast<double>(g.p99Ns)).c_str(),
               usText(static_cast<double>(g.maxNs)).c_str());
}

// Appends the first `limit` lines of a finding kind, then how many more there are.
template <typename T, typename F>
void addFindings(std::vector<std::string>& lines, const std::vector<T>& items, size_t limit,
                 F line) {
  for (size_t i = 0; i < items.size() && i < limit; ++i) lines.push_back(line(items[i]));
  if (items.size() > limit)
    lines.push_back("... and " + std::to_string(items.size() - limit) + " more");
}

std::string mismatchLine(const MismatchFinding& m) {
  std::string s = "mismatch at seq " + std::to_string(m.seq) + ":";
  for (size_t i = 0; i < m.groups.size(); ++i) {
    const std::vector<int>& ranks = m.groups[i].second;
    s += (i ? ", " : " ") +
         (ranks.size() == 1 ? "rank " + std::to_string(ranks[0]) : "ranks " + rankSet(ranks)) +
         " " + m.groups[i].first;
  }
  return s;
}

std::string missingLine(const MissingFinding& m) {
  return "seq " + std::to_string(m.seq) + " " + m.coll + ": missing ranks: " + rankSet(m.missing) +
         " (entered by " + rankSet(m.present) + ")";
}

std::string stuckLine(const StuckFinding& f) {
  std::string s = "seq " + std::to_string(f.seq) + " " + f.coll + ":";
  if (!f.stuck.empty()) s += " stuck in started on ranks " + rankSet(f.stuck);
  if (!f.failed.empty())
    s += std::string(f.stuck.empty() ? "" : ";") + " failed on ranks " + rankSet(f.failed);
  if (!f.completed.empty()) s += " while ranks " + rankSet(f.completed) + " completed";
  if (!f.firstError.empty())
    s += "; error on rank " + std::to_string(f.failed[0]) + ": \"" + f.firstError + "\"";
  return s;
}

}  // namespace

std::vector<std::string> lastSeenLines(const Analysis& a) {
  std::vector<std::string> lines;
  for (const LastSeen& l : a.lastSeen) {
    std::string s = "rank " + std::to_string(l.rank) + ": ";
    if (!l.dumped)
      s += "no dump";
    else if (l.seq == 0)
      s += "no operation recorded (dump: " + l.reason + ")";
    else
      s += "last seq " + std::to_string(l.seq) + " " + l.coll + " " + l.state +
           " (dump: " + l.reason + ")";
    lines.push_back(s);
  }
  return lines;
}

std::vector<std::string> findingLines(const Analysis& a, size_t limit) {
  std::vector<std::string> lines;
  addFindings(lines, a.mismatches, limit, mismatchLine);
  addFindings(lines, a.missing, limit, missingLine);
  addFindings(lines, a.stuck, limit, stuckLine);
  if (!a.noDump.empty())
    lines.push_back("no dump from ranks " + rankSet(a.noDump) + ": what they entered is unknown");
  return lines;
}

std::string slowestLine(const Analysis& a) {
  if (a.timedOps == 0) return "";
  const RankStats top = a.stragglersByImpact().front();
  if (top.timesLast == 0) return "";
  return "slowest: rank " + std::to_string(top.rank) + ", last in " +
         std::to_string(top.timesLast) + " of " + std::to_string(top.ops) + " operations, caused " +
         usText(top.waitCausedNs) + " us of waiting";
}

std::string slowestOpsLine(const Analysis& a, size_t limit) {
  if (a.timedOps == 0) return "";
  const RankStats top = a.stragglersByImpact().front();
  if (top.timesLast == 0) return "";
  // The latest first: a run's end is where its trouble is usually looked for.
  std::string s;
  size_t listed = 0, more = 0;
  for (auto it = a.ops.rbegin(); it != a.ops.rend(); ++it) {
    if (it->lastRank != top.rank) continue;
    if (listed == limit) {
      ++more;
      continue;
    }
    s += (listed++ ? ", " : "") + std::string("seq ") + std::to_string(it->seq);
    if (it->tag != 0) s += " (tag " + std::to_string(it->tag) + ")";
    s += " " + it->coll + " +" +
         usText(static_cast<double>(it->lateNs[static_cast<size_t>(top.rank)])) + " us";
  }
  if (more > 0) s += ", and " + std::to_string(more) + " earlier";
  return "rank " + std::to_string(top.rank) + " was last in: " + s;
}

std::string slowestLinkLine(const Analysis& a) {
  const SlowLink& l = a.slowestLink;
  if (l.from < 0) return "";
  return "slowest data: rank " + std::to_string(l.from) + " -> rank " + std::to_string(l.to) +
         ", first data " + usText(l.meanDataNs) + " us after entry on average over " +
         std::to_string(l.ops) + " operations";
}

std::string usText(double ns) { return fmt("%.1f", ns / 1000.0); }

void writeText(std::ostream& out, const std::vector<CommReport>& reports, size_t maxFindings) {
  for (size_t i = 0; i < reports.size(); ++i) {
    const CommTrace& c = *reports[i].comm;
    const Analysis& a = reports[i].analysis;
    if (i > 0) out << "\n";
    out << "== communicator " << c.label() << ": " << c.nranks << " ranks, dumps from "
        << c.nranks - static_cast<int>(a.noDump.size()) << ", " << seqRange(a) << " ==\n";
    writeStragglers(out, a);
    writeDataDelays(out, a);
    writeSkew(out, a);
    out << "Hang analysis\n";
    for (const std::string& l : lastSeenLines(a)) out << "  " << l << "\n";
    for (const std::string& l : findingLines(a, maxFindings)) out << "  " << l << "\n";
    const ExitCode v = a.verdict();
    out << "Verdict: " << verdictName(v) << " (exit " << static_cast<int>(v) << ")\n";
  }
}

}  // namespace loom::tracetool
