// The flight recorder: the last N operations of a communicator, each with
// what it was, its state, and where its time went.
//
// Every operation gets a sequence number per communicator. The recorder keeps
// a ring of records (LOOM_FLIGHT_RECORDER, default 2000; 0 turns recording
// off), written by the thread running the operations; dump() may run on any
// thread. Nothing on an operation's path takes a lock: every field is Relaxed
// (a plain load or store on x86), a record's seq is 0 while the record is being
// reset for a new operation, and a dump keeps a record only when it read the same
// non-zero seq before and after copying it. A record updated mid-operation may
// show one field from before an update and the next from after it. A failure's
// text is written and read under a mutex (errors only).
//
// Times are CLOCK_MONOTONIC nanoseconds, the same clock for every process of
// a host; adding `clockOffsetNs` (measured at bootstrap against rank 0, 0 on
// rank 0's host) converts them to rank 0's clock.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "util/status.h"
#include "util/wait.h"

namespace loom::trace {

enum class OpState : uint8_t { Enqueued, Started, Completed, Failed };
const char* stateName(OpState s);

// A field one thread writes while another may read it: a relaxed atomic (a plain load or
// store on x86) that copies and assigns as a value.
template <typename T>
class Relaxed {
 public:
  Relaxed(T v = T()) : v_(v) {}  // NOLINT: implicit, as a plain field
  Relaxed(const Relaxed& o) : v_(o.get()) {}
  Relaxed& operator=(const Relaxed& o) { return *this = o.get(); }
  Relaxed& operator=(T v) {
    v_.store(v, std::memory_order_relaxed);
    return *this;
  }
  Relaxed& operator+=(T v) { return *this = get() + v; }  // single writer
  T get() const { return v_.load(std::memory_order_relaxed); }
  operator T() const { return get(); }  // NOLINT: reads as the value

 private:
  std::atomic<T> v_;
};

struct OpRecord {
  Relaxed<uint64_t> seq = 0;  // 0 while the record is being reset
  Relaxed<uint64_t> tag = 0;  // the caller's own number for the operation (loomCommSetOpTag)
  Relaxed<const char*> coll = "";
  Relaxed<const char*> algorithm = "";
  Relaxed<const char*> proto = "";
  Relaxed<size_t> count = 0;
  Relaxed<int> dtype = 0;
  Relaxed<int> op = 0;
  Relaxed<int> root = -1;
  Relaxed<int> channels = 0;  // the schedule's channels (1 for the direct and send/receive paths)
  Relaxed<OpState> state = OpState::Enqueued;
  Relaxed<int64_t> enterNs = 0;     // the caller entered Loom
  Relaxed<int64_t> endNs = 0;       // completed or failed
  Relaxed<int64_t> waitNs = 0;      // time blocked waiting on peers
  Relaxed<int> waitPeer = -1;       // the peer of the longest single wait
  Relaxed<int64_t> maxWaitNs = 0;   // that wait
  Relaxed<int> lastRank = -1;       // the rank that arrived last, when known
  Relaxed<int64_t> lateNs = 0;      // how long after the first rank it arrived
  Relaxed<int> earliestRank = -1;   // the rank that arrived first, when known
  Relaxed<int64_t> earliestNs = 0;  // its entry and the last rank's, on rank 0's clock
  Relaxed<int64_t> latestNs = 0;
  // When data from each peer first arrived (this rank's clock), for up to kFirstPeers peers:
  // slots fill in the order peers are noted; once all are taken, a later arrival replaces the
  // earliest, so the record keeps the peers whose data came last.
  static constexpr int kFirstPeers = 8;
  Relaxed<int> firstPeer[kFirstPeers] = {-1, -1, -1, -1, -1, -1, -1, -1};
  Relaxed<int64_t> firstNs[kFirstPeers] = {};
  char error[160] = {};  // state Failed: why (written and read under the recorder's mutex)
};

// Per-rank lateness summary, accumulated over operations whose peers' entry
// times are known.
struct RankLateness {
  uint64_t timesLast = 0;
  double sumLateNs = 0;
  int64_t maxLateNs = 0;
  double waitCausedNs = 0;  // others' waiting attributed to this rank being late
  uint64_t ops = 0;
};

class FlightRecorder {
 public:
  // oneWriter: records are only ever begun by one thread at a time (a blocking communicator's,
  // under its operation lock; enqueue() is then never called), so taking a slot needs no
  // atomic read-modify-write.
  FlightRecorder(size_t capacity, int rank, int nranks, bool oneWriter = false);

  bool enabled() const { return !ring_.empty(); }
  // Starts a record (state Started); returns it, or nullptr when disabled.
  OpRecord* begin(uint64_t seq, const char* coll, size_t count, int dtype, int op, int root);
  // A record for an operation queued to run later (a non-blocking communicator's worker): state
  // Enqueued, entered now. start() turns it Started when it runs, or begins a new record if
  // the ring has reused it meanwhile (more than capacity operations were queued).
  OpRecord* enqueue(uint64_t seq, const char* coll, size_t count, int dtype, int op, int root);
  OpRecord* start(OpRecord* queued, uint64_t seq, const char* coll, size_t count, int dtype, int op,
                  int root);
  // Completes the record: ended at `endNs`, or now when 0.
  void end(OpRecord* r, const Status& s, int64_t endNs = 0);

 private:
  OpRecord* make(uint64_t seq, const char* coll, size_t count, int dtype, int op, int root,
                 OpState state);
  void prefetchRecord(uint64_t index) const;

 public:
  // Adds one wait of `ns` on `peer` to the current record.
  static void addWait(OpRecord* r, int peer, int64_t ns) {
    if (r == nullptr) return;
    r->waitNs += ns;
    if (ns > r->maxWaitNs) {
      r->maxWaitNs = ns;
      r->waitPeer = peer;
    }
  }
  // Records every rank's entry time (same clock) for the current operation.
  void noteArrivals(OpRecord* r, const std::vector<int64_t>& enterNs);
  // Records the earliest and latest entries (rank 0's clock) learned from stamps; this rank
  // waited for the latest from its own entry on.
  void noteExtremes(OpRecord* r, int earliestRank, int64_t earliestNs, int latestRank,
                    int64_t latestNs);
  // Notes the first data from `peer` in the current operation (cheap; called per piece: the
  // clock is read only for a peer not noted yet).
  static void noteFirstArrival(OpRecord* r, int peer) {
    if (r == nullptr) return;
    for (int i = 0; i < OpRecord::kFirstPeers && r->firstPeer[i] >= 0; ++i)
      if (r->firstPeer[i] == peer) return;
    noteFirstArrivalAt(r, peer, nowNs());
  }
  // The same with the time given (a caller that saw several peers ready at once reads the
  // clock once for all of them). A peer already noted keeps its first time.
  static void noteFirstArrivalAt(OpRecord* r, int peer, int64_t ns) {
    if (r == nullptr) return;
    int slot = 0;
    for (int i = 0; i < OpRecord::kFirstPeers; ++i) {
      if (r->firstPeer[i] == peer) return;
      if (r->firstPeer[i] < 0) {
        slot = i;
        break;
      }
      if (r->firstNs[i] < r->firstNs[slot]) slot = i;
    }
    if (r->firstPeer[slot] >= 0 && r->firstNs[slot] >= ns) return;
    r->firstPeer[slot] = peer;
    r->firstNs[slot] = ns;
  }
  // Rank 0's clock minus this rank's, and the bound on that estimate's error (bootstrap).
  void setClock(int64_t offsetNs, int64_t errorNs) {
    clockOffsetNs_ = offsetNs;
    clockErrorNs_ = errorNs;
  }
  int64_t toRank0(int64_t ns) const { return ns + clockOffsetNs_; }

  uint64_t lastCompletedSeq() const { return lastCompleted_.load(std::memory_order_relaxed); }
  // Rank `peer` entered operation `seq`: its news (a stamp it sent, or one naming it as the
  // earliest or latest entry) reached this rank. Called by the thread running operations.
  void notePeerSeen(int peer, uint64_t seq) {
    if (peer >= 0 && static_cast<size_t>(peer) < seen_.size() && seq > seen_[peer])
      seen_[peer] = seq;
  }
  // The latest operation that rank `peer` is known to have entered, 0 when none; read by the
  // thread running operations (a timeout's message).
  uint64_t peerSeenSeq(int peer) const {
    return peer >= 0 && static_cast<size_t>(peer) < seen_.size() ? seen_[peer] : 0;
  }
  std::vector<RankLateness> lateness() const;

  // JSON: {"rank":..,"nranks":..,"ops":[...]} with the oldest record first.
  std::string toJson(const std::string& commName, uint64_t commHash,
                     const std::string& reason) const;
  // Writes toJson() to path.
  Status dump(const std::string& path, const std::string& commName, uint64_t commHash,
              const std::string& reason) const;

 private:
  int rank_, nranks_;
  // RankLateness, written by the thread running operations while lateness() may read it.
  struct LatenessSums {
    Relaxed<uint64_t> timesLast = 0;
    Relaxed<double> sumLateNs = 0;
    Relaxed<int64_t> maxLateNs = 0;
    Relaxed<double> waitCausedNs = 0;
    Relaxed<uint64_t> ops = 0;
  };
  // The ring holds a power of two of records (at least the capacity asked for), so that a
  // record's slot is a mask, not a division; dumps show the last `capacity_`.
  std::vector<OpRecord> ring_;
  uint64_t mask_ = 0;
  size_t capacity_ = 0;
  int peersKept_ = 0;  // firstPeer slots an operation can fill: min(nranks - 1, 8)
  bool oneWriter_ = false;
  std::atomic<uint64_t> next_{0};  // records started
  std::atomic<uint64_t> lastCompleted_{0};
  std::vector<uint64_t> seen_;  // per rank: peerSeenSeq()
  mutable std::mutex mutex_;    // failures' text; start() against a reused record
  std::vector<LatenessSums> lateness_;
  int64_t clockOffsetNs_ = 0, clockErrorNs_ = 0;
};

// SIGUSR1 asks every communicator of the process to dump its recorder into
// LOOM_TRACE_DIR. install() sets the handler once; pending() is polled by
// operations and waits.
void installSignalHandler();
uint64_t dumpRequests();

}  // namespace loom::trace
