// loom-trace's input: the flight-recorder dumps of a communicator's ranks.
//
// Each rank writes one JSON file (src/trace/recorder.cc): the communicator's
// name and hash, the rank, the rank count, and the last N operations, oldest
// first. Times are the rank's CLOCK_MONOTONIC nanoseconds; adding the dump's
// `clockOffsetNs` gives rank 0's clock, known to within `clockErrorNs` (both 0
// when the dump has none: ranks of one host share the clock). An operation
// may carry `arrivals`, the ranks' entry times in rank 0's clock as this rank
// learnt them, and `firstArrivalNs`, when the first data from each peer
// arrived, also in rank 0's clock. Both come either as one entry per rank (a
// time, or null where unknown) or as a list of [rank, time] pairs; either way
// only the known ranks are held (RankTimes), so memory grows with the dumps'
// size, not with ranks x operations.
//
// Reading never trusts the file: every field is type-checked, and anything
// wrong is a TraceInputError whose message starts with the file's name.
// Unknown fields are ignored, so newer dumps stay readable.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace loom::tracetool {

// Malformed or unreadable input; what() names the file and the field.
class TraceInputError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Valid JSON that is not a Loom dump (e.g. a report written into the same
// folder); a folder scan skips such files, a file named outright is an error.
class NotADumpError : public TraceInputError {
 public:
  using TraceInputError::TraceInputError;
};

// A file that is not JSON at all. In a folder, one not named as Loom names its dumps
// (loom-trace-*.json) is another program's, skipped with a note as a NotADumpError is; one so
// named is a damaged dump, an error.
class NotJsonError : public TraceInputError {
 public:
  using TraceInputError::TraceInputError;
};

using MaybeNs = std::optional<int64_t>;

// Times of some ranks, one per rank at most, held sparsely: (rank, ns) in ascending rank.
class RankTimes {
 public:
  using Entry = std::pair<int, int64_t>;

  RankTimes() = default;
  // Entries in any order; where a rank appears more than once, the last entry wins.
  RankTimes(std::initializer_list<Entry> entries) : RankTimes(std::vector<Entry>(entries)) {}
  explicit RankTimes(std::vector<Entry> entries);

  // Rank r's time, nullopt when unknown.
  MaybeNs at(int rank) const;
  bool empty() const { return entries_.empty(); }
  size_t size() const { return entries_.size(); }
  // The known entries, ascending rank.
  std::vector<Entry>::const_iterator begin() const { return entries_.begin(); }
  std::vector<Entry>::const_iterator end() const { return entries_.end(); }
  bool operator==(const RankTimes& o) const { return entries_ == o.entries_; }
  bool operator!=(const RankTimes& o) const { return entries_ != o.entries_; }

 private:
  std::vector<Entry> entries_;
};

struct OpEntry {
  uint64_t seq = 0;
  uint64_t tag = 0;  // the caller's own number for the operation (loomCommSetOpTag), 0: none
  std::string coll;
  std::string algorithm;
  std::string proto;
  uint64_t count = 0;
  int dtype = -1;
  int op = -1;
  int root = -1;
  std::string state;    // "enqueued", "started", "completed", "failed" (nothing else is read)
  int64_t enterNs = 0;  // the rank's own clock
  int64_t endNs = 0;    // 0 while not ended
  int64_t waitNs = 0;
  int waitPeer = -1;
  int64_t maxWaitNs = 0;
  std::string error;
  // The ranks known (none when absent), rank 0's clock.
  RankTimes arrivals;
  RankTimes firstArrivalNs;

  bool ended() const { return state == "completed" || state == "failed"; }
};

struct RankDump {
  std::string file;
  int rank = 0;
  int nranks = 0;
  std::string comm;      // the communicator's name (may be empty)
  std::string commHash;  // hex, as written
  std::string reason;    // why it was dumped: timeout, abort, destroy, SIGUSR1, request
  int64_t clockOffsetNs = 0;
  int64_t clockErrorNs = 0;
  uint64_t lastCompletedSeq = 0;
  std::vector<OpEntry> ops;  // ascending seq, no repeats

  // The operation with sequence number seq, or nullptr.
  const OpEntry* find(uint64_t seq) const;
  int64_t toRank0(int64_t ns) const { return ns + clockOffsetNs; }
};

// All dumps of one communicator, indexed by rank.
struct CommTrace {
  std::string name;
  std::string hash;
  int nranks = 0;
  std::vector<std::optional<RankDump>> ranks;  // nranks entries; nullopt: no dump for that rank

  std::string label() const;  // `"name" (hash h)`, or `hash h` when unnamed, for messages
};

// Parses one dump; `file` only names it in errors.
RankDump parseDump(const std::string& text, const std::string& file);

struct LoadResult {
  std::vector<CommTrace> comms;    // ordered by name, then hash
  std::vector<std::string> notes;  // files skipped, duplicates resolved
};

// Reads every path: a folder contributes its *.json files (those that are not
// Loom dumps are skipped with a note), a file must be a dump. Groups the dumps
// by communicator hash. Throws TraceInputError on unreadable or malformed
// input, ranks out of range, or dumps of one communicator disagreeing on the
// rank count; and, naming the file that crosses it, on more than this tool
// holds: kMaxHeldEntries operations and per-rank times over all files, or a
// communicator whose operations x ranks (what the analysis holds per
// operation and rank) exceed kMaxAnalysisCells.
constexpr uint64_t kMaxHeldEntries = uint64_t{1} << 27;
constexpr uint64_t kMaxAnalysisCells = uint64_t{1} << 24;
LoadResult loadDumps(const std::vector<std::string>& paths);

// Element size of a Loom data type code, 0 when unknown.
size_t dtypeSize(int dtype);
// "fp32", "int8", ...; the number itself when unknown.
std::string dtypeName(int dtype);
// "sum", "max", "band", ...; "premulsum" for user-made operations.
std::string redOpName(int op);

}  // namespace loom::tracetool
