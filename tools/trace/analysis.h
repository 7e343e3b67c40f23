// loom-trace's analysis of one communicator's merged dumps: who arrives late,
// how far apart the ranks enter each kind of operation, and, for a hang, which
// ranks never entered an operation, which entered a different one at the same
// sequence number, and which are still inside one that others finished.
//
// Entry times are compared in rank 0's clock. A rank's entry into an
// operation comes from the `arrivals` of its own dump, else from another
// dump's `arrivals` (lowest rank first), else from its own `enterNs +
// clockOffsetNs`. Lateness of a rank = its entry minus the first rank's
// entry; skew of an operation = last entry minus first entry. Only operations
// with every rank's entry time known are timed. A rank counts as last (and is charged the others'
// waiting) only when the skew exceeds the clock uncertainty: twice the largest `clockErrorNs` of
// the communicator's dumps.
//
// Pure functions over the loaded dumps: no I/O.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dump.h"

namespace loom::tracetool {

// Exit codes of loom-trace (docs/TRACE.md). When several findings apply, the
// most specific wins: mismatch, then missing, then stuck, then incomplete.
enum ExitCode : int {
  kExitConsistent = 0,
  kExitUsage = 1,
  kExitBadInput = 2,
  kExitMissing = 3,     // a rank never entered an operation that others entered
  kExitMismatch = 4,    // ranks entered different operations at one sequence number
  kExitStuck = 5,       // a rank is still inside (or failed) an operation others completed
  kExitIncomplete = 6,  // no dump at all for some rank
};

// Where one rank stands at one sequence number.
enum class CellState { Timed, Untimed, Missing, Evicted, NoDump };

struct OpTiming {
  uint64_t seq = 0;
  uint64_t tag = 0;              // the caller's number for it, as the lowest rank present has it
  std::string coll;              // as the lowest rank present recorded it
  std::vector<CellState> cells;  // per rank
  std::vector<MaybeNs> arrival;  // per rank, rank 0's clock
  std::vector<int64_t> lateNs;   // per rank when timed (arrival - first), else empty
  bool timed = false;            // every rank's arrival known
  int64_t skewNs = 0;            // when timed
  int lastRank = -1;             // when timed and the skew exceeds the clock uncertainty
};

struct RankStats {
  int rank = 0;
  uint64_t ops = 0;  // timed operations
  uint64_t timesLast = 0;
  double meanLateNs = 0;
  int64_t p99LateNs = 0;  // nearest rank: the ceil(0.99 n)-th smallest
  int64_t maxLateNs = 0;
  double waitCausedNs = 0;  // sum over operations it was last of (its entry - each rank's entry)
};

struct SkewGroup {
  std::string coll;
  uint64_t count = 0;
  int dtype = -1;
  uint64_t ops = 0;
  double meanNs = 0;
  int64_t p99Ns = 0;
  int64_t maxNs = 0;
  std::string label() const;  // "allreduce 1024 x fp32 (4 KiB)"
};

struct MissingFinding {
  uint64_t seq = 0;
  std::string coll;
  std::vector<int> missing;  // dumped ranks whose record ends before seq (or skips it)
  std::vector<int> present;
};

struct MismatchFinding {
  uint64_t seq = 0;
  // Ranks grouped by what they called: ("allreduce count 1024 fp32 sum", ranks).
  std::vector<std::pair<std::string, std::vector<int>>> groups;
};

struct StuckFinding {
  uint64_t seq = 0;
  std::string coll;
  std::vector<int> stuck;      // state started/enqueued
  std::vector<int> failed;     // state failed
  std::vector<int> completed;  // may be empty when every present rank failed
  std::string firstError;      // the lowest failed rank's error text
};

// What one rank's data cost its receivers. A slow link delays data, not entry, so it shows
// here rather than in the straggler table. For every operation and every receiver whose record
// has the first arrival from this rank: data delay = that arrival minus the receiver's own entry
// (one clock: exact), less the sender's lateness (its entry minus the receiver's) where that
// exceeds the clock uncertainty, never below 0. Waits: the records whose longest single wait was
// on this rank (waitPeer), and those waits summed. In a ring a delay propagates, so every rank
// waits on its predecessor; the first data locates the slow sender.
struct PeerStats {
  int rank = 0;
  uint64_t arrivals = 0;  // (operation, receiver) pairs with a first arrival from this rank
  double meanDataNs = 0;
  int64_t p99DataNs = 0;
  int64_t maxDataNs = 0;
  uint64_t longestWaits = 0;
  double waitedOnNs = 0;
};

// The (sender, receiver) pair whose data came latest on average.
struct SlowLink {
  int from = -1, to = -1;  // -1: no first arrival recorded at all
  uint64_t ops = 0;
  double meanDataNs = 0;
};

struct LastSeen {
  int rank = 0;
  bool dumped = false;
  uint64_t seq = 0;  // 0: no operation recorded
  std::string coll, state, reason;
};

struct Analysis {
  int nranks = 0;
  int64_t clockUncertaintyNs = 0;
  std::vector<OpTiming> ops;  // every sequence number any rank recorded, ascending
  uint64_t timedOps = 0;
  uint64_t belowUncertainty = 0;  // timed operations whose skew is within the clock uncertainty
  std::vector<RankStats> ranks;   // by rank
  std::vector<SkewGroup> skew;    // by collective, then count, then type
  std::vector<MissingFinding> missing;
  std::vector<MismatchFinding> mismatches;
  std::vector<StuckFinding> stuck;
  std::vector<int> noDump;         // ranks with no dump
  std::vector<LastSeen> lastSeen;  // by rank
  std::vector<PeerStats> peers;    // by rank
  SlowLink slowestLink;

  ExitCode verdict() const;
  // Ranks by wait caused, largest first (ties: more often last, then lower rank).
  std::vector<RankStats> stragglersByImpact() const;
  // Senders by mean data delay, largest first; only those with a first arrival recorded.
  std::vector<PeerStats> sendersByDataDelay() const;
};

Analysis analyze(const CommTrace& comm);

// Nearest-rank percentile (p in (0, 100]) of unsorted values; 0 when empty.
int64_t percentile(std::vector<int64_t> values, double p);

// "{0,2,3}"
std::string rankSet(const std::vector<int>& ranks);
// What a rank called at one sequence number, as mismatch reports show it.
std::string describeCall(const OpEntry& e);
const char* verdictName(ExitCode c);

}  // namespace loom::tracetool
