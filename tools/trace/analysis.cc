#include "analysis.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <tuple>

namespace loom::tracetool {
namespace {

bool isReducing(const std::string& coll) {
  return coll == "allreduce" || coll == "reduce" || coll == "reducescatter";
}
bool isRooted(const std::string& coll) { return coll == "broadcast" || coll == "reduce"; }
bool isPointToPoint(const std::string& coll) { return coll == "sendrecv"; }

std::string formatBytes(uint64_t b) {
  static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(b);
  int u = 0;
  while (v >= 1024 && u < 4 && std::fmod(v, 1024) == 0) {
    v /= 1024;
    ++u;
  }
  char buf[48];
  std::snprintf(buf, sizeof(buf), "%.0f %s", v, kUnits[u]);
  return buf;
}

// Every rank's entry into one operation, rank 0's clock: rank q's from the
// `arrivals` of q's own dump, else of another dump (lowest rank first), else
// q's own enterNs + clockOffsetNs; nullopt when no dump knows it. One pass over
// the dumps' known entries: O(nranks + entries), not nranks per rank.
void arrivalsOf(const CommTrace& comm, const std::vector<const OpEntry*>& present,
                std::vector<MaybeNs>& arrival) {
  const size_t n = present.size();
  for (size_t q = 0; q < n; ++q)
    if (present[q] != nullptr) arrival[q] = present[q]->arrivals.at(static_cast<int>(q));
  for (size_t r = 0; r < n; ++r) {
    if (present[r] == nullptr) continue;
    for (const auto& [q, ns] : present[r]->arrivals) {
      if (q < 0 || static_cast<size_t>(q) >= n) continue;  // the reader refuses these
      MaybeNs& slot = arrival[static_cast<size_t>(q)];
      if (!slot) slot = ns;
    }
  }
  for (size_t q = 0; q < n; ++q)
    if (!arrival[q] && present[q] != nullptr)
      arrival[q] = comm.ranks[q]->toRank0(present[q]->enterNs);
}

// Times one operation: arrivals, lateness, skew, the last rank.
void timeOp(const CommTrace& comm, const std::vector<const OpEntry*>& present, int64_t uncertainty,
            OpTiming& t) {
  const size_t n = static_cast<size_t>(comm.nranks);
  t.arrival.assign(n, std::nullopt);
  arrivalsOf(comm, present, t.arrival);
  bool all = true;
  for (size_t q = 0; q < n && all; ++q) all = t.arrival[q] && t.cells[q] != CellState::Missing;
  if (!all) return;
  t.timed = true;
  int64_t first = *t.arrival[0], last = first;
  int lastRank = 0;
  for (size_t q = 1; q < n; ++q) {
    first = std::min(first, *t.arrival[q]);
    if (*t.arrival[q] > last) {
      last = *t.arrival[q];
      lastRank = static_cast<int>(q);
    }
  }
  t.skewNs = last - first;
  t.lateNs.reserve(n);
  for (size_t q = 0; q < n; ++q) t.lateNs.push_back(*t.arrival[q] - first);
  if (t.skewNs > uncertainty) t.lastRank = lastRank;
  for (size_t q = 0; q < n; ++q)
    if (t.cells[q] != CellState::Missing) t.cells[q] = CellState::Timed;
}

void findHangs(const CommTrace& comm, uint64_t seq, const std::vector<const OpEntry*>& present,
               const OpTiming& t, Analysis& a) {
  MissingFinding miss{seq, t.coll, {}, {}};
  std::map<std::string, std::vector<int>> calls;
  std::vector<std::string> order;  // signatures in rank order, for a stable report
  StuckFinding stuck{seq, t.coll, {}, {}, {}, ""};
  for (int q = 0; q < comm.nranks; ++q) {
    const OpEntry* e = present[static_cast<size_t>(q)];
    if (t.cells[static_cast<size_t>(q)] == CellState::Missing) miss.missing.push_back(q);
    if (e == nullptr) continue;
    miss.present.push_back(q);
    std::string sig = describeCall(*e);  // what must agree across ranks
    if (calls.find(sig) == calls.end()) order.push_back(sig);
    calls[sig].push_back(q);
    if (e->state == "completed") {
      stuck.completed.push_back(q);
    } else if (e->state == "failed") {
      if (stuck.failed.empty()) stuck.firstError = e->error;
      stuck.failed.push_back(q);
    } else {
      stuck.stuck.push_back(q);
    }
  }
  if (!miss.missing.empty()) a.missing.push_back(miss);
  if (calls.size() > 1) {
    MismatchFinding m{seq, {}};
    for (const std::string& sig : order) m.groups.emplace_back(sig, calls[sig]);
    a.mismatches.push_back(m);
  }
  if (!stuck.failed.empty() || (!stuck.stuck.empty() && !stuck.completed.empty()))
    a.stuck.push_back(stuck);
}

// Mean, maximum and nearest-rank p99 of values that are not empty.
void describe(const std::vector<int64_t>& v, double* mean, int64_t* max, int64_t* p99) {
  double sum = 0;
  for (int64_t x : v) sum += static_cast<double>(x);
  *mean = sum / static_cast<double>(v.size());
  *max = *std::max_element(v.begin(), v.end());
  *p99 = percentile(v, 99);
}

void summarize(
    Analysis& a,
    const std::map<std::tuple<std::string, uint64_t, int>, std::vector<int64_t>>& skews) {
  const size_t n = static_cast<size_t>(a.nranks);
  std::vector<std::vector<int64_t>> late(n);
  for (size_t q = 0; q < n; ++q) a.ranks[q].rank = static_cast<int>(q);
  for (const OpTiming& t : a.ops) {
    if (!t.timed) continue;
    ++a.timedOps;
    for (size_t q = 0; q < n; ++q) late[q].push_back(t.lateNs[q]);
    if (t.lastRank < 0) {
      ++a.belowUncertainty;
      continue;
    }
    RankStats& s = a.ranks[static_cast<size_t>(t.lastRank)];
    ++s.timesLast;
    for (size_t q = 0; q < n; ++q) s.waitCausedNs += static_cast<double>(t.skewNs - t.lateNs[q]);
  }
  for (size_t q = 0; q < n; ++q) {
    RankStats& s = a.ranks[q];
    s.ops = late[q].size();
    if (!late[q].empty()) describe(late[q], &s.meanLateNs, &s.maxLateNs, &s.p99LateNs);
  }
  for (const auto& kv : skews) {
    SkewGroup g;
    std::tie(g.coll, g.count, g.dtype) = kv.first;
    g.ops = kv.second.size();
    describe(kv.second, &g.meanNs, &g.maxNs, &g.p99Ns);
    a.skew.push_back(g);
  }
}

// Data delays and waits per sender (PeerStats), and the slowest (sender, receiver) pair.
void peerDelays(const CommTrace& comm, Analysis& a) {
  const size_t n = static_cast<size_t>(comm.nranks);
  std::vector<std::vector<int64_t>> delays(n);
  std::map<std::pair<int, int>, std::pair<double, uint64_t>> pairs;  // (from, to): sum, ops
  a.peers.resize(n);
  for (size_t p = 0; p < n; ++p) a.peers[p].rank = static_cast<int>(p);
  for (const OpTiming& t : a.ops) {
    for (size_t r = 0; r < n; ++r) {
      if (!comm.ranks[r]) continue;
      const OpEntry* e = comm.ranks[r]->find(t.seq);
      if (e == nullptr) continue;
      if (e->waitPeer >= 0 && static_cast<size_t>(e->waitPeer) < n && e->maxWaitNs > 0) {
        PeerStats& w = a.peers[static_cast<size_t>(e->waitPeer)];
        ++w.longestWaits;
        w.waitedOnNs += static_cast<double>(e->maxWaitNs);
      }
      const int64_t entry = comm.ranks[r]->toRank0(e->enterNs);
      for (const auto& [sender, firstNs] : e->firstArrivalNs) {
        if (sender < 0 || static_cast<size_t>(sender) >= n) continue;  // the reader refuses these
        const size_t p = static_cast<size_t>(sender);
        if (p == r) continue;
        int64_t delay = firstNs - entry;
        if (t.arrival[p] && t.arrival[r]) {
          const int64_t senderLate = *t.arrival[p] - *t.arrival[r];
          if (senderLate > a.clockUncertaintyNs) delay -= senderLate;
        }
        delay = std::max<int64_t>(delay, 0);
        delays[p].push_back(delay);
        auto& pair = pairs[{static_cast<int>(p), static_cast<int>(r)}];
        pair.first += static_cast<double>(delay);
        ++pair.second;
      }
    }
  }
  for (size_t p = 0; p < n; ++p) {
    PeerStats& s = a.peers[p];
    s.arrivals = delays[p].size();
    if (!delays[p].empty()) describe(delays[p], &s.meanDataNs, &s.maxDataNs, &s.p99DataNs);
  }
  for (const auto& [key, v] : pairs) {
    const double mean = v.first / static_cast<double>(v.second);
    if (a.slowestLink.from < 0 || mean > a.slowestLink.meanDataNs)
      a.slowestLink = {key.first, key.second, v.second, mean};
  }
}

}  // namespace

int64_t percentile(std::vector<int64_t> values, double p) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  double rank = std::ceil(p / 100.0 * static_cast<double>(values.size()));
  size_t k = static_cast<size_t>(std::max(1.0, rank));
  return values[std::min(k, values.size()) - 1];
}

std::string rankSet(const std::vector<int>& ranks) {
  std::string s = "{";
  for (size_t i = 0; i < ranks.size(); ++i) s += (i ? "," : "") + std::to_string(ranks[i]);
  return s + "}";
}

std::string describeCall(const OpEntry& e) {
  if (isPointToPoint(e.coll)) return e.coll;
  std::string s = e.coll + " count " + std::to_string(e.count) + " " + dtypeName(e.dtype);
  if (isReducing(e.coll)) s += " " + redOpName(e.op);
  if (isRooted(e.coll)) s += " root " + std::to_string(e.root);
  return s;
}

std::string SkewGroup::label() const {
  if (isPointToPoint(coll)) return coll + " (" + std::to_string(count) + " transfers)";
  std::string s = coll + " " + std::to_string(count) + " x " + dtypeName(dtype);
  if (size_t es = dtypeSize(dtype)) s += " (" + formatBytes(count * es) + ")";
  return s;
}

const char* verdictName(ExitCode c) {
  switch (c) {
    case kExitConsistent:
      return "consistent";
    case kExitUsage:
      return "usage error";
    case kExitBadInput:
      return "bad input";
    case kExitMissing:
      return "missing ranks";
    case kExitMismatch:
      return "mismatched operations";
    case kExitStuck:
      return "stuck or failed operations";
    case kExitIncomplete:
      return "ranks without a dump";
  }
  return "?";
}

ExitCode Analysis::verdict() const {
  if (!mismatches.empty()) return kExitMismatch;
  if (!missing.empty()) return kExitMissing;
  if (!stuck.empty()) return kExitStuck;
  if (!noDump.empty()) return kExitIncomplete;
  return kExitConsistent;
}

std::vector<RankStats> Analysis::stragglersByImpact() const {
  std::vector<RankStats> v = ranks;
  std::stable_sort(v.begin(), v.end(), [](const RankStats& x, const RankStats& y) {
    if (x.waitCausedNs != y.waitCausedNs) return x.waitCausedNs > y.waitCausedNs;
    return x.timesLast > y.timesLast;
  });
  return v;
}

std::vector<PeerStats> Analysis::sendersByDataDelay() const {
  std::vector<PeerStats> v;
  for (const PeerStats& p : peers)
    if (p.arrivals > 0) v.push_back(p);
  std::stable_sort(v.begin(), v.end(), [](const PeerStats& x, const PeerStats& y) {
    return x.meanDataNs > y.meanDataNs;
  });
  return v;
}

Analysis analyze(const CommTrace& comm) {
  Analysis a;
  a.nranks = comm.nranks;
  const size_t n = static_cast<size_t>(comm.nranks);
  a.ranks.resize(n);
  // Every sequence number any rank recorded, and each dump's window of them.
  std::set<uint64_t> seqs;
  std::vector<uint64_t> firstSeq(n, 0);
  for (size_t q = 0; q < n; ++q) {
    LastSeen ls;
    ls.rank = static_cast<int>(q);
    const std::optional<RankDump>& d = comm.ranks[q];
    if (!d) {
      a.noDump.push_back(static_cast<int>(q));
    } else {
      ls.dumped = true;
      ls.reason = d->reason;
      a.clockUncertaintyNs = std::max(a.clockUncertaintyNs, 2 * d->clockErrorNs);
      for (const OpEntry& e : d->ops) seqs.insert(e.seq);
      // A rank that recorded nothing has entered nothing (the ring keeps the newest).
      firstSeq[q] = d->ops.empty() ? 0 : d->ops.front().seq;
      if (!d->ops.empty()) {
        ls.seq = d->ops.back().seq;
        ls.coll = d->ops.back().coll;
        ls.state = d->ops.back().state;
      }
    }
    a.lastSeen.push_back(ls);
  }
  std::map<std::tuple<std::string, uint64_t, int>, std::vector<int64_t>> skews;
  for (uint64_t seq : seqs) {
    OpTiming t;
    t.seq = seq;
    t.cells.assign(n, CellState::NoDump);
    std::vector<const OpEntry*> present(n, nullptr);
    const OpEntry* firstPresent = nullptr;
    for (size_t q = 0; q < n; ++q) {
      if (!comm.ranks[q]) continue;
      present[q] = comm.ranks[q]->find(seq);
      if (present[q] != nullptr) {
        t.cells[q] = CellState::Untimed;
        if (firstPresent == nullptr) firstPresent = present[q];
      } else {
        t.cells[q] = seq < firstSeq[q] ? CellState::Evicted : CellState::Missing;
      }
    }
    t.coll = firstPresent->coll;  // seqs holds only recorded numbers
    t.tag = firstPresent->tag;
    timeOp(comm, present, a.clockUncertaintyNs, t);
    findHangs(comm, seq, present, t, a);
    if (t.timed)
      skews[{firstPresent->coll, firstPresent->count, firstPresent->dtype}].push_back(t.skewNs);
    a.ops.push_back(std::move(t));
  }
  summarize(a, skews);
  peerDelays(comm, a);
  return a;
}

}  // namespace loom::tracetool
