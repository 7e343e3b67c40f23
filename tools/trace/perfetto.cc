// The Chrome/Perfetto trace: every rank's operations on one time line.
//
// Timestamps are microseconds in rank 0's clock, counted from the earliest
// entry of any communicator given. Process ids number the communicators from
// 1, thread ids the ranks from 1 (rank r is tid r + 1, named "rank r").
#include <algorithm>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>

#include "report.h"

namespace loom::tracetool {
namespace {

using nlohmann::json;

json metadata(const char* name, int pid, int tid, const json& args) {
  json m = {{"ph", "M"}, {"name", name}, {"pid", pid}, {"args", args}};
  if (tid >= 0) m["tid"] = tid;
  return m;
}

json instant(const std::string& name, int pid, int tid, double ts) {
  return {{"ph", "i"},  {"s", "t"},   {"cat", "arrival"}, {"name", name},
          {"pid", pid}, {"tid", tid}, {"ts", ts}};
}

// The earliest and latest times a communicator's dumps mention, rank 0's clock.
std::pair<int64_t, int64_t> timeSpan(const CommTrace& c) {
  int64_t lo = std::numeric_limits<int64_t>::max(), hi = std::numeric_limits<int64_t>::min();
  for (const auto& d : c.ranks) {
    if (!d) continue;
    for (const OpEntry& e : d->ops) {
      lo = std::min(lo, d->toRank0(e.enterNs));
      hi = std::max(hi, d->toRank0(std::max(e.enterNs, e.endNs)));
      for (const RankTimes::Entry& t : e.arrivals) lo = std::min(lo, t.second);
    }
  }
  return {lo, hi};
}

const OpTiming* timingOf(const Analysis& a, uint64_t seq) {
  auto it = std::lower_bound(a.ops.begin(), a.ops.end(), seq,
                             [](const OpTiming& t, uint64_t s) { return t.seq < s; });
  return it != a.ops.end() && it->seq == seq ? &*it : nullptr;
}

void addOperations(const CommTrace& c, const Analysis& a, int pid, int64_t latest,
                   const std::function<double(int64_t)>& us, json& events) {
  for (const auto& d : c.ranks) {
    if (!d) continue;
    const int tid = d->rank + 1;
    for (const OpEntry& e : d->ops) {
      const int64_t start = d->toRank0(e.enterNs);
      // An operation still running at the dump lasts to the end of the trace.
      const int64_t end = e.ended() && e.endNs >= e.enterNs ? d->toRank0(e.endNs) : latest;
      json args = {{"seq", e.seq},
                   {"coll", e.coll},
                   {"count", e.count},
                   {"dtype", dtypeName(e.dtype)},
                   {"algorithm", e.algorithm},
                   {"proto", e.proto},
                   {"state", e.state},
                   {"wait_us", e.waitNs / 1000.0},
                   {"wait_peer", e.waitPeer}};
      if (e.coll != "sendrecv") args["op"] = redOpName(e.op);
      if (e.root >= 0) args["root"] = e.root;
      const OpTiming* t = timingOf(a, e.seq);
      args["lateness_us"] = t != nullptr && t->timed
                                ? json(t->lateNs[static_cast<size_t>(d->rank)] / 1000.0)
                                : json(nullptr);
      if (!e.error.empty()) args["error"] = e.error;
      events.push_back({{"ph", "X"},
                        {"cat", "op"},
                        {"name", e.coll + " #" + std::to_string(e.seq)},
                        {"pid", pid},
                        {"tid", tid},
                        {"ts", us(start)},
                        {"dur", std::max<int64_t>(0, end - start) / 1000.0},
                        {"args", args}});
      for (const auto& [p, t] : e.firstArrivalNs)
        if (p != d->rank)
          events.push_back(
              instant("data from rank " + std::to_string(p) + " #" + std::to_string(e.seq), pid,
                      tid, us(t)));
    }
  }
}

void addArrivals(const Analysis& a, int pid, const std::function<double(int64_t)>& us,
                 json& events) {
  for (const OpTiming& t : a.ops) {
    std::optional<int64_t> first;
    for (const MaybeNs& v : t.arrival)
      if (v && (!first || *v < *first)) first = v;
    for (size_t q = 0; q < t.arrival.size(); ++q) {
      const int tid = static_cast<int>(q) + 1;
      if (t.arrival[q])
        events.push_back(instant("arrive #" + std::to_string(t.seq), pid, tid, us(*t.arrival[q])));
      else if (t.cells[q] == CellState::Missing && first)
        events.push_back(instant("never entered #" + std::to_string(t.seq), pid, tid, us(*first)));
    }
  }
}

}  // namespace

std::string perfettoJson(const std::vector<CommReport>& reports) {
  int64_t base = std::numeric_limits<int64_t>::max();
  for (const CommReport& r : reports) base = std::min(base, timeSpan(*r.comm).first);
  if (base == std::numeric_limits<int64_t>::max()) base = 0;
  const std::function<double(int64_t)> us = [base](int64_t ns) { return (ns - base) / 1000.0; };
  json events = json::array();
  for (size_t i = 0; i < reports.size(); ++i) {
    const CommTrace& c = *reports[i].comm;
    const int pid = static_cast<int>(i) + 1;
    events.push_back(metadata("process_name", pid, -1, {{"name", "communicator " + c.label()}}));
    events.push_back(metadata("process_sort_index", pid, -1, {{"sort_index", pid}}));
    for (int q = 0; q < c.nranks; ++q) {
      events.push_back(
          metadata("thread_name", pid, q + 1, {{"name", "rank " + std::to_string(q)}}));
      events.push_back(metadata("thread_sort_index", pid, q + 1, {{"sort_index", q}}));
    }
    addOperations(c, reports[i].analysis, pid, timeSpan(c).second, us, events);
    addArrivals(reports[i].analysis, pid, us, events);
  }
  json doc = {{"traceEvents", events},
              {"displayTimeUnit", "ms"},
              {"otherData", {{"generator", "loom-trace"}, {"clock", "rank 0, microseconds"}}}};
  // Invalid UTF-8 in a name or error text is replaced rather than thrown on.
  return doc.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
}

}  // namespace loom::tracetool
