#include "trace/recorder.h"

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <thread>

#include "util/env.h"
#include "util/log.h"
#include "util/wait.h"

namespace loom::trace {

const char* stateName(OpState s) {
  switch (s) {
    case OpState::Enqueued:
      return "enqueued";
    case OpState::Started:
      return "started";
    case OpState::Completed:
      return "completed";
    case OpState::Failed:
      return "failed";
  }
  return "?";
}

namespace {
size_t powerOfTwoAtLeast(size_t n) {
  size_t p = 1;
  while (p < n) p <<= 1;
  return n == 0 ? 0 : p;
}
}  // namespace

FlightRecorder::FlightRecorder(size_t capacity, int rank, int nranks, bool oneWriter)
    : rank_(rank),
      nranks_(nranks),
      ring_(powerOfTwoAtLeast(capacity)),
      mask_(ring_.empty() ? 0 : ring_.size() - 1),
      capacity_(capacity),
      peersKept_(std::min(std::max(nranks - 1, 0), OpRecord::kFirstPeers)),
      oneWriter_(oneWriter),
      seen_(static_cast<size_t>(nranks)),
      lateness_(static_cast<size_t>(nranks)) {}

namespace {

// LOOM_INJECT_DELAY=RANK:US[:EVERY], parsed once; rank -1 when unset or malformed.
struct InjectDelay {
  int rank = -1;
  int64_t us = 0;
  uint64_t every = 1;
};

const InjectDelay& injectDelay() {
  static const InjectDelay parsed = [] {
    InjectDelay d;
    const std::string& text = env::injectDelay();
    if (text.empty()) return d;
    long long rank = -1, us = -1, every = 1;
    char tail = 0;
    const int n = std::sscanf(text.c_str(), "%lld:%lld:%lld%c", &rank, &us, &every, &tail);
    if ((n != 2 && n != 3) || rank < 0 || us < 0 || every < 1) {
      LOOM_WARN(kTrace, "LOOM_INJECT_DELAY=%s is not RANK:US[:EVERY]; ignoring it", text.c_str());
      return d;
    }
    d.rank = static_cast<int>(rank);
    d.us = us;
    d.every = static_cast<uint64_t>(every);
    return d;
  }();
  return parsed;
}

}  // namespace

OpRecord* FlightRecorder::begin(uint64_t seq, const char* coll, size_t count, int dtype, int op,
                                int root) {
  return make(seq, coll, count, dtype, op, root, OpState::Started);
}

OpRecord* FlightRecorder::enqueue(uint64_t seq, const char* coll, size_t count, int dtype, int op,
                                  int root) {
  return make(seq, coll, count, dtype, op, root, OpState::Enqueued);
}

OpRecord* FlightRecorder::start(OpRecord* queued, uint64_t seq, const char* coll, size_t count,
                                int dtype, int op, int root) {
  if (queued != nullptr) {
    // The ring may have reused the record meanwhile (more than capacity operations queued):
    // the test and the update are one step against enqueue().
    std::lock_guard<std::mutex> lock(mutex_);
    if (queued->seq == seq && queued->state == OpState::Enqueued) {
      queued->state = OpState::Started;
      return queued;
    }
  }
  return begin(seq, coll, count, dtype, op, root);
}

// The ring's records are last touched capacity operations ago and have left the caches by
// then: each operation fetches the next one's lines ahead, so that small operations do not
// wait on them (docs/journal/perf.md).
void FlightRecorder::prefetchRecord(uint64_t index) const {
  const char* p = reinterpret_cast<const char*>(&ring_[index & mask_]);
  for (size_t off = 0; off < offsetof(OpRecord, error); off += 64)
    __builtin_prefetch(p + off, 1, 3);
}

OpRecord* FlightRecorder::make(uint64_t seq, const char* coll, size_t count, int dtype, int op,
                               int root, OpState state) {
  if (ring_.empty()) return nullptr;
  const InjectDelay& inject = injectDelay();
  if (inject.rank == rank_ && seq % inject.every == 0)
    std::this_thread::sleep_for(std::chrono::microseconds(inject.us));
  std::unique_lock<std::mutex> lock(mutex_, std::defer_lock);
  if (state == OpState::Enqueued) lock.lock();  // against start() on the worker
  uint64_t index;
  if (oneWriter_) {
    index = next_.load(std::memory_order_relaxed);
    next_.store(index + 1, std::memory_order_relaxed);
  } else {
    index = next_.fetch_add(1, std::memory_order_relaxed);
  }
  OpRecord& r = ring_[index & mask_];
  prefetchRecord(index + 1);
  // Reset field by field (the error text is read only in state Failed), seq last: a dump
  // running meanwhile sees seq 0 or a changed seq and skips the record.
  r.seq = 0;
  std::atomic_thread_fence(std::memory_order_release);
  r.coll = coll;
  r.tag = 0;
  r.algorithm = "";
  r.proto = "";
  r.count = count;
  r.dtype = dtype;
  r.op = op;
  r.root = root;
  r.channels = 0;
  r.state = state;
  r.enterNs = nowNs();
  r.endNs = 0;
  r.waitNs = 0;
  r.waitPeer = -1;
  r.maxWaitNs = 0;
  r.lastRank = -1;
  r.lateNs = 0;
  r.earliestRank = -1;
  r.earliestNs = 0;
  r.latestNs = 0;
  for (int i = 0; i < peersKept_; ++i) r.firstPeer[i] = -1;  // slots past these stay -1
  std::atomic_thread_fence(std::memory_order_release);
  r.seq = seq;
  return &r;
}

void FlightRecorder::end(OpRecord* r, const Status& s, int64_t endNs) {
  if (r == nullptr) return;
  r->endNs = endNs != 0 ? endNs : nowNs();
  if (s.isOk()) {
    r->state = OpState::Completed;
    lastCompleted_.store(r->seq, std::memory_order_relaxed);
  } else {
    std::lock_guard<std::mutex> lock(mutex_);
    std::snprintf(r->error, sizeof(r->error), "%s", s.message().c_str());
    r->state = OpState::Failed;
  }
}

void FlightRecorder::noteArrivals(OpRecord* r, const std::vector<int64_t>& enterNs) {
  if (r == nullptr || enterNs.empty()) return;
  const size_t n = std::min(enterNs.size(), lateness_.size());
  size_t firstRank = 0, lastRank = 0;
  int64_t sum = 0;  // of entries, less the first rank's (no overflow at any real lateness)
  for (size_t q = 0; q < n; ++q) {
    if (enterNs[q] < enterNs[firstRank]) firstRank = q;
    if (enterNs[q] > enterNs[lastRank]) lastRank = q;
    sum += enterNs[q] - enterNs[0];
  }
  const int64_t first = enterNs[firstRank], last = enterNs[lastRank];
  r->lastRank = static_cast<int>(lastRank);
  r->lateNs = last - first;
  r->earliestRank = static_cast<int>(firstRank);
  r->earliestNs = toRank0(first);
  r->latestNs = toRank0(last);
  for (size_t q = 0; q < n; ++q) {
    LatenessSums& l = lateness_[q];
    const int64_t late = enterNs[q] - first;
    l.ops += 1;
    l.sumLateNs += static_cast<double>(late);
    if (late > l.maxLateNs) l.maxLateNs = late;
  }
  LatenessSums& worst = lateness_[lastRank];
  worst.timesLast += 1;
  // Every other rank waited for the last one from its own arrival on: the sum of (last - t).
  const int64_t caused = static_cast<int64_t>(n) * (last - enterNs[0]) - sum;
  worst.waitCausedNs += static_cast<double>(caused);
}

void FlightRecorder::noteExtremes(OpRecord* r, int earliestRank, int64_t earliestNs, int latestRank,
                                  int64_t latestNs) {
  if (r == nullptr || latestRank < 0 || earliestRank < 0 || latestRank >= nranks_ ||
      earliestRank >= nranks_)
    return;
  r->lastRank = latestRank;
  r->lateNs = latestNs - earliestNs;
  r->earliestRank = earliestRank;
  r->earliestNs = earliestNs;
  r->latestNs = latestNs;
  if (latestRank == earliestRank) return;
  const int64_t lateNs = latestNs - earliestNs;
  LatenessSums& late = lateness_[static_cast<size_t>(latestRank)];
  late.ops += 1;
  late.timesLast += 1;
  late.sumLateNs += static_cast<double>(lateNs);
  if (lateNs > late.maxLateNs) late.maxLateNs = lateNs;
  // What this rank saw: it waited for the last rank from its own entry on.
  late.waitCausedNs += static_cast<double>(std::max<int64_t>(latestNs - toRank0(r->enterNs), 0));
  lateness_[static_cast<size_t>(earliestRank)].ops += 1;  // arrived first: no lateness
}

std::vector<RankLateness> FlightRecorder::lateness() const {
  std::vector<RankLateness> out(lateness_.size());
  for (size_t q = 0; q < out.size(); ++q) {
    const LatenessSums& l = lateness_[q];
    out[q] = {l.timesLast, l.sumLateNs, l.maxLateNs, l.waitCausedNs, l.ops};
  }
  return out;
}

std::string FlightRecorder::toJson(const std::string& commName, uint64_t commHash,
                                   const std::string& reason) const {
  std::lock_guard<std::mutex> lock(mutex_);  // the error texts; one dump at a time
  std::ostringstream o;
  o << "{\"rank\":" << rank_ << ",\"nranks\":" << nranks_ << ",\"comm\":\"" << commName
    << "\",\"commHash\":\"" << std::hex << commHash << std::dec << "\",\"reason\":\"" << reason
    << "\",\"clock\":\"CLOCK_MONOTONIC\",\"clockOffsetNs\":" << clockOffsetNs_
    << ",\"clockErrorNs\":" << clockErrorNs_ << ",\"lastCompletedSeq\":" << lastCompleted_.load()
    << ",\"ops\":[";
  const uint64_t next = next_.load(std::memory_order_acquire);
  const size_t n = std::min<uint64_t>(next, capacity_);
  bool any = false;
  for (size_t i = 0; i < n; ++i) {
    // A copy read whole between two reads of the same non-zero seq; a record being reset
    // (by an operation that started after `next` was read) is left out.
    const OpRecord& live = ring_[(next - n + i) & mask_];
    const uint64_t seq = live.seq;
    std::atomic_thread_fence(std::memory_order_acquire);
    const OpRecord r = live;
    std::atomic_thread_fence(std::memory_order_acquire);
    if (seq == 0 || live.seq != seq) continue;
    o << (any ? "," : "") << "{\"seq\":" << r.seq;
    if (r.tag != 0) o << ",\"tag\":" << r.tag;
    o << ",\"coll\":\"" << r.coll << "\",\"algorithm\":\"" << r.algorithm << "\",\"proto\":\""
      << r.proto << "\",\"count\":" << r.count << ",\"dtype\":" << r.dtype << ",\"op\":" << r.op
      << ",\"root\":" << r.root << ",\"channels\":" << r.channels << ",\"state\":\""
      << stateName(r.state) << "\",\"enterNs\":" << r.enterNs << ",\"endNs\":" << r.endNs
      << ",\"waitNs\":" << r.waitNs << ",\"waitPeer\":" << r.waitPeer
      << ",\"maxWaitNs\":" << r.maxWaitNs << ",\"lastRank\":" << r.lastRank
      << ",\"lateNs\":" << r.lateNs;
    any = true;
    // Entry times known to this rank, on rank 0's clock: its own, the earliest and the latest.
    o << ",\"arrivals\":[[" << rank_ << "," << toRank0(r.enterNs) << "]";
    if (r.earliestRank >= 0 && r.earliestRank != rank_)
      o << ",[" << r.earliestRank << "," << r.earliestNs << "]";
    if (r.lastRank >= 0 && r.lastRank != rank_ && r.lastRank != r.earliestRank)
      o << ",[" << r.lastRank << "," << r.latestNs << "]";
    o << "],\"firstArrivalNs\":[";
    // No peer's data is seen before the peer entered: a first arrival taken from this rank's
    // own entry time (a peer found ready at a first look that followed it: no clock is read
    // on that path) is written as the peer's entry where that is known and came later.
    for (int i = 0; i < OpRecord::kFirstPeers && r.firstPeer[i] >= 0; ++i) {
      const int p = r.firstPeer[i];
      int64_t ns = toRank0(r.firstNs[i]);
      if (p == r.earliestRank) ns = std::max(ns, static_cast<int64_t>(r.earliestNs));
      if (p == r.lastRank) ns = std::max(ns, static_cast<int64_t>(r.latestNs));
      o << (i ? "," : "") << "[" << p << "," << ns << "]";
    }
    o << "]";
    if (r.state == OpState::Failed && r.error[0] != '\0') {
      o << ",\"error\":\"";
      for (const char* p = r.error; *p; ++p) {
        if (*p == '"' || *p == '\\') o << '\\';
        o << (static_cast<unsigned char>(*p) < 0x20 ? ' ' : *p);
      }
      o << "\"";
    }
    o << "}";
  }
  o << "]}\n";
  return o.str();
}

Status FlightRecorder::dump(const std::string& path, const std::string& commName, uint64_t commHash,
                            const std::string& reason) const {
  std::string json = toJson(commName, commHash, reason);
  std::string tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "w");
  if (f == nullptr)
    return LOOM_ERROR(loomSystemError,
                      "cannot write the trace to " + path + ": " + std::strerror(errno));
  size_t w = std::fwrite(json.data(), 1, json.size(), f);
  std::fclose(f);
  if (w != json.size() || std::rename(tmp.c_str(), path.c_str()) != 0)
    return LOOM_ERROR(loomSystemError, "cannot write the trace to " + path);
  return Status::ok();
}

namespace {
std::atomic<uint64_t> gDumpRequests{0};
void onSigusr1(int) { gDumpRequests.fetch_add(1, std::memory_order_relaxed); }
}  // namespace

void installSignalHandler() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction old {};
    sigaction(SIGUSR1, nullptr, &old);
    // Leave an application's own handler alone.
    if (old.sa_handler != SIG_DFL && old.sa_handler != SIG_IGN) return;
    struct sigaction sa {};
    sa.sa_handler = onSigusr1;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGUSR1, &sa, nullptr);
  });
}

uint64_t dumpRequests() { return gDumpRequests.load(std::memory_order_relaxed); }

}  // namespace loom::trace
