// The collective benchmark shared by loom-perf and the peers measured beside it (Open MPI, Gloo):
// nccl-tests' flags, sweep, table, checks and footer, written once. A library plugs in as a
// Backend (how to run one operation, a barrier); RunSweep does the rest on every rank, and rank 0
// prints. Types and ops are Loom's enums (loom/loom.h is used for its constants only; nothing
// here links libloom), so every table and JSON file has the same columns whatever ran it.
//
// Sizes follow nccl-tests: a row's size is the bytes of the larger buffer (all_gather: what each
// rank receives; reduce_scatter: what each rank sends), and busbw is algbw times the collective's
// bus factor (all_reduce 2(n-1)/n; all_gather, reduce_scatter and alltoall (n-1)/n; others 1).
//
// Every result is checked against a reference computed here, element by element, from each
// rank's input pattern: small integers chosen so that every partial result is exact in the type,
// so the expected value is exact whatever order a library reduces in.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "loom/loom.h"

namespace perf {

enum class Coll {
  kAllReduce,
  kAllGather,
  kReduceScatter,
  kBroadcast,
  kReduce,
  kAllToAll,
  kSendRecv,
  kGather,
  kScatter
};

struct CollInfo {
  Coll coll;
  const char* name;  // as nccl-tests' binaries: all_reduce for all_reduce_perf
  bool reduces;      // takes -o
  bool rooted;       // takes -r
  bool in_place;     // has an in-place form (else those columns print N/A)
};
extern const CollInfo kColls[9];
const CollInfo& InfoOf(Coll c);

// Bytes moved over the bus per byte of the row's size, as nccl-tests defines busbw.
double BusFactor(Coll c, int nranks);

enum class Kind { kInt, kUint, kFloat, kDouble, kSmallFloat };
struct FloatFormat {
  int exp_bits;
  int man_bits;
  bool ieee;  // an all-ones exponent means inf/NaN (false for e4m3: only S.1111.111 is NaN)
};

// `exact`: no partial result of the pattern exceeds this magnitude and every integer up to it is
// representable; `max_pow2`: the largest power of two a product may reach.
struct TypeInfo {
  loomDataType_t type;
  const char* name;
  size_t size;
  Kind kind;
  const FloatFormat* fmt;
  int64_t exact;
  int max_pow2;
  bool is_signed() const { return kind != Kind::kUint; }
};
extern const TypeInfo kTypes[12];  // indexed by loomDataType_t
const TypeInfo& TypeOf(loomDataType_t t);

struct OpInfo {
  loomRedOp_t op;
  const char* name;
};
extern const OpInfo kOps[5];

// -a: how each row's time combines the ranks' times.
enum class Average { kRank0 = 0, kMean = 1, kMin = 2, kMax = 3 };

struct Options {
  size_t min_bytes = size_t{32} << 20;
  size_t max_bytes = size_t{32} << 20;
  size_t step_factor = 2;
  size_t step_bytes = size_t{1} << 20;
  int iters = 20;
  int warmup = 5;
  int agg = 1;    // -m: operations per timed iteration, issued as one group
  int check = 1;  // -c: checked runs per size
  Average average = Average::kMean;
  int root = 0;    // -r: the root of broadcast and reduce; -1: every root in turn
  int skew = 0;    // -I: arrival-skew columns
  int reg = 0;     // -R: buffers from the library's own allocator (Backend::Alloc)
  int gpu = 0;     // -G: device buffers (Backend::DeviceAlloc), checked after copying back
  int nranks = 2;  // -np, where the program starts its own ranks
  int timeout_s = 1800;
  std::vector<const CollInfo*> colls;
  std::vector<const TypeInfo*> types;
  std::vector<const OpInfo*> ops;
  std::string json_path;
};

// What the flags a program accepts beyond the common ones.
struct FlagSet {
  const char* prog;
  bool launches = false;    // -np and -T: the program starts its own ranks
  bool all_types = true;    // every Loom type (else float, double, int32, int64, uint8)
  std::vector<Coll> colls;  // the collectives it can run (-C); empty: all
};

// Parses argv; exits with status 2 and a usage line naming the flag on bad input.
Options ParseFlags(int argc, char** argv, const FlagSet& flags);

class Backend {
 public:
  virtual ~Backend() = default;
  // One operation. `count` is the count the C call takes (all_gather: per-rank send count;
  // reduce_scatter: per-rank receive count; alltoall: elements per peer; gather: per-rank send
  // count; scatter: per-rank receive count). send == recv, or send inside recv, is in place as
  // NCCL defines it. sendrecv sends to rank+1 and receives from
  // rank-1. A backend reports its own errors and ends the process on failure.
  virtual void Run(Coll c, const void* send, void* recv, size_t count, const TypeInfo& t,
                   loomRedOp_t op, int root) = 0;
  virtual void GroupStart() {}
  virtual void GroupEnd() {}
  virtual void Barrier() = 0;
  // Where the backend cannot run a combination (a peer without that type), the row prints N/A.
  virtual bool Supports(Coll c, const TypeInfo& t, loomRedOp_t op) const { return true; }
  // The sweep's two buffers under -R 1 (e.g. loomMemAlloc); nullptr: not supported.
  virtual void* Alloc(size_t bytes) { return nullptr; }
  virtual void Free(void* p) {}
  // -G 1: device buffers. Run then queues on the backend's stream; Sync waits for it. A backend
  // without devices returns nullptr.
  virtual void* DeviceAlloc(size_t bytes) { return nullptr; }
  virtual void DeviceFree(void* p) {}
  virtual void CopyToDevice(void* dst, const void* src, size_t bytes) {}
  virtual void CopyToHost(void* dst, const void* src, size_t bytes) {}
  virtual void Sync() {}
};

// Runs the sweep on one rank (rank 0 prints, `title` heads the table) and returns the exit
// status: 1 when a result was wrong. Buffers are allocated and first touched once, before any
// timing. Writes o.json_path (rank 0) when set.
int RunSweep(Backend& b, const Options& o, int rank, int nranks, const std::string& title);

// One size's numbers for one form (out of place or in place), as a row prints them.
struct Stats {
  bool ran = false;  // false: N/A (no in-place form, or the backend cannot run it)
  double time_us = 0, algbw = 0, busbw = 0;
  int64_t wrong = -1;   // -1: not checked
  double skew_us = -1;  // largest arrival skew of a timed iteration (-I)
  int last = -1;        // the rank most often last to arrive (-I)
  double last_share = 0;
};

// The table's column heads (after the title lines), and one row: the same layout whatever
// program prints it, so that bench/peers/compare.sh reads them all alike. Both flush stdout.
void PrintColumns(bool skew);
void PrintRow(size_t size, size_t count, const char* type, const char* op, int root,
              const Stats& oop, const Stats& ip, bool skew);

// Seconds on the steady clock.
double Now();

// The sizes a sweep measures: -b to -e by factor -f (or step -i), in bytes.
std::vector<size_t> Sizes(const Options& o);

// Starts nranks processes on this host running body(rank), waits for them (once one fails the
// others get a grace period, then are killed; so are all at timeout_s), and returns 0 when all
// succeeded. Children die with the parent.
int Launch(const char* prog, int nranks, int timeout_s, const std::function<int(int)>& body);

// Page-aligned memory of at least `bytes`, every page touched; nullptr on failure.
void* AllocPrefaulted(size_t bytes);

// A non-negative integer with an optional K, M or G suffix (powers of 1024) into *out; false
// (and *out untouched) where s is not one or overflows.
bool ParseSize(const char* s, size_t* out);

}  // namespace perf
