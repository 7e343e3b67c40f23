#include "trace/recorder.h"

#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <sstream>

#include "util/wait.h"

namespace loom::trace {

const char* stateName(OpState s) {
  switch (s) {
    case OpState::Enqueued: return "enqueued";
    case OpState::Started: return "started";
    case OpState::Completed: return "completed";
    case OpState::Failed: return "failed";
  }
  return "?";
}

FlightRecorder::FlightRecorder(size_t capacity, int rank, int nranks)
    : rank_(rank), nranks_(nranks), ring_(capacity), lateness_(static_cast<size_t>(nranks)) {}

OpRecord* FlightRecorder::begin(uint64_t seq, const char* coll, size_t count, int dtype, int op,
                                int root) {
  if (ring_.empty()) return nullptr;
  std::lock_guard<std::mutex> lock(mutex_);
  OpRecord& r = ring_[next_++ % ring_.size()];
  r = OpRecord();
  r.seq = seq;
  r.coll = coll;
  r.count = count;
  r.dtype = dtype;
  r.op = op;
  r.root = root;
  r.state = OpState::Started;
  r.enterNs = nowNs();
  return &r;
}

void FlightRecorder::end(OpRecord* r, const Status& s) {
  if (r == nullptr) return;
  std::lock_guard<std::mutex> lock(mutex_);
  r->endNs = nowNs();
  if (s.isOk()) {
    r->state = OpState::Completed;
    lastCompleted_.store(r->seq, std::memory_order_relaxed);
  } else {
    r->state = OpState::Failed;
    std::snprintf(r->error, sizeof(r->error), "%s", s.message().c_str());
  }
}

void FlightRecorder::noteArrivals(OpRecord* r, const std::vector<int64_t>& enterNs) {
  if (r == nullptr || enterNs.empty()) return;
  auto [first, last] = std::minmax_element(enterNs.begin(), enterNs.end());
  const int lastRank = static_cast<int>(last - enterNs.begin());
  std::lock_guard<std::mutex> lock(mutex_);
  r->lastRank = lastRank;
  r->lateNs = *last - *first;
  for (size_t q = 0; q < enterNs.size() && q < lateness_.size(); ++q) {
    RankLateness& l = lateness_[q];
    const int64_t late = enterNs[q] - *first;
    ++l.ops;
    l.sumLateNs += static_cast<double>(late);
    l.maxLateNs = std::max(l.maxLateNs, late);
  }
  RankLateness& worst = lateness_[static_cast<size_t>(lastRank)];
  ++worst.timesLast;
  // Every other rank waited for the last one from its own arrival on.
  for (int64_t t : enterNs) worst.waitCausedNs += static_cast<double>(*last - t);
}

std::vector<RankLateness> FlightRecorder::lateness() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return lateness_;
}

std::string FlightRecorder::toJson(const std::string& commName, uint64_t commHash,
                                   const std::string& reason) const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::ostringstream o;
  o << "{\"rank\":" << rank_ << ",\"nranks\":" << nranks_ << ",\"comm\":\"" << commName
    << "\",\"commHash\":\"" << std::hex << commHash << std::dec << "\",\"reason\":\"" << reason
    << "\",\"clock\":\"CLOCK_MONOTONIC\",\"clockOffsetNs\":0,\"lastCompletedSeq\":"
    << lastCompleted_.load() << ",\"ops\":[";
  const size_t n = std::min<uint64_t>(next_, ring_.size());
  for (size_t i = 0; i < n; ++i) {
    const OpRecord& r = ring_[(next_ - n + i) % ring_.size()];
    o << (i ? "," : "") << "{\"seq\":" << r.seq << ",\"coll\":\"" << r.coll
      << "\",\"algorithm\":\"" << r.algorithm << "\",\"proto\":\"" << r.proto
      << "\",\"count\":" << r.count << ",\"dtype\":" << r.dtype << ",\"op\":" << r.op
      << ",\"root\":" << r.root << ",\"state\":\"" << stateName(r.state)
      << "\",\"enterNs\":" << r.enterNs << ",\"endNs\":" << r.endNs
      << ",\"waitNs\":" << r.waitNs << ",\"waitPeer\":" << r.waitPeer
      << ",\"maxWaitNs\":" << r.maxWaitNs << ",\"lastRank\":" << r.lastRank
      << ",\"lateNs\":" << r.lateNs;
    if (r.error[0] != '\0') {
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

Status FlightRecorder::dump(const std::string& path, const std::string& commName,
                            uint64_t commHash, const std::string& reason) const {
  std::string json = toJson(commName, commHash, reason);
  std::string tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "w");
  if (f == nullptr)
    return LOOM_ERROR(loomSystemError, "cannot write the trace to " + path + ": " +
                                           std::strerror(errno));
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
