// The schedule IR: what one rank does for one collective, as data.
//
// An algorithm never moves bytes. Its builder emits a Schedule: for each
// channel, an ordered list of primitive Steps over element ranges of the
// operation's buffers. One executor (src/exec) runs every schedule; the
// verifier (verifier.h) runs all ranks' schedules symbolically.
//
// Execution model, shared by the executor and the verifier:
//  * A step moving `count` elements is cut into numPieces() pieces of at most
//    one transport slot each; pieceRange() gives piece p's element range. Both
//    ends of a transfer compute the same pieces from the same count.
//  * Steps run round-major: for round p = 0, 1, ..., every step that has a
//    piece p runs it, in step order. Each piece of a send fills one slot of
//    the FIFO to the peer; each piece of a receive consumes one.
//  * A step's receive completes before its send starts (recv-reduce-send
//    writes the reduced piece straight into the outgoing slot).
//
// Memory steps (Mem*) are for ranks that map each other's memory (shared memory on one host):
// each rank owns a window of Schedule::mem.slots buffers of mem.count elements and two flags
// (MemWord), and reads its peers' windows in place. A memory step is never cut into pieces.
// Rounds: an operation's memory steps name rounds 1..mem.rounds; an executor numbers them
// after the communicator's previous operations (base + round), and round g uses buffer
// (base + g) % mem.slots, so back-to-back operations go on rotating the buffers. A flag only
// grows; a wait for round g ends once the flag is at least g. What a peer may read, and when a
// buffer may be written again, follows from the flags alone: the verifier proves both
// (verifier.h).
// Builders are pure functions of their arguments: no I/O, no globals.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "loom/loom.h"

namespace loom::algo {

// SendRecv: a group of sends and receives (loomGroupStart/End, and what all-to-allv, gather
// and scatter are made of); buildGroup.
enum class Coll : uint8_t {
  AllReduce,
  Broadcast,
  Reduce,
  AllGather,
  ReduceScatter,
  AllToAll,
  SendRecv
};
const char* collName(Coll c);

enum class StepOp : uint8_t {
  Send,                // send src
  Recv,                // dst = in
  RecvReduceSend,      // send (in (+) src)
  RecvReduceCopy,      // dst = in (+) src
  RecvReduceCopySend,  // dst = in (+) src; send dst
  RecvCopySend,        // dst = in; send in
  Copy,                // dst = src (applying kPre / kPost)
  // Memory steps (round = Step::round, on the window buffer of that round):
  MemPut,      // window[dst] = src (kPre; kWithFlag: and publish `word`)
  MemExpose,   // this round's input is src itself: the peers read it in place (loomMemAlloc)
  MemPublish,  // this rank's flag `word` = round
  MemWait,     // until every peer's flag `word` >= round
  MemReduce,   // dst = every rank's round input at src.offset, reduced (see kOwnSrc, kAlsoOut)
  MemGather,   // every rank q's chunk q of window[src, +count) -> dst + chunk q (chunkRange)
};
constexpr int kNumStepOps = static_cast<int>(StepOp::MemGather) + 1;
const char* stepOpName(StepOp op);
bool stepRecvs(StepOp op);
bool stepSends(StepOp op);
bool stepReads(StepOp op);   // uses src
bool stepWrites(StepOp op);  // writes dst
bool stepIsMemory(StepOp op);

// The flags of a rank's window (memory steps).
enum class MemWord : uint8_t {
  Ready = 0,    // the rank's input of a round is in its window (or exposed)
  Reduced = 1,  // the rank's reduced slice of a round is in its window
};
constexpr int kNumMemWords = 2;
const char* memWordName(MemWord w);

// Which buffer of the operation a range lives in. Scratch is the communicator's own memory
// (Schedule::scratchCount elements, allocated once and kept), for partial results that belong
// in neither of the caller's buffers.
// Window is this rank's window buffer of the step's round (memory steps). Group is buffer
// BufRef::offset of a SendRecv schedule's group (Schedule::group), whole: its steps move it
// from its start.
enum class Buf : uint8_t { Send = 0, Recv = 1, Scratch = 2, Window = 3, Group = 4 };
const char* bufName(Buf b);

struct BufRef {
  Buf buf = Buf::Send;
  size_t offset = 0;  // in elements
};

enum StepFlags : uint16_t {
  kPre = 1,   // src is this rank's own input: apply the op's pre-scale (PreMulSum)
  kPost = 2,  // the result is final: apply the op's post-op (Avg divides by nranks)
  // MemReduce: this rank's contribution is its send buffer at `aux`, not its round input.
  kOwnSrc = 4,
  // MemReduce: the result also goes to the receive buffer at `aux`.
  kAlsoOut = 8,
  // MemGather: no flag wait (an earlier wait already covers the chunks).
  kNoWait = 16,
  // MemGather: this rank's own chunk is not copied (kAlsoOut wrote it).
  kSkipOwn = 32,
  // Hints to the executor, which change no value: what others read next is written with
  // streaming stores (kStream), and so is the output (kStreamOut).
  kStream = 64,
  kStreamOut = 128,
  // MemReduce: a peer's round input may be exposed in place (MemExpose) rather than in its
  // window; the executor looks where each peer put it.
  kMayExpose = 256,
  // MemPut: the data carries the flag: flag `word` = round is published with it, in one step
  // (low-latency lines, each of which holds its round beside its data).
  kWithFlag = 512,
};

struct Step {
  StepOp op = StepOp::Copy;
  int recvPeer = -1;  // rank received from, -1 if none
  int sendPeer = -1;  // rank sent to, -1 if none
  BufRef src;         // local operand (Send, *Reduce*, Copy)
  BufRef dst;         // local result (Recv, *Copy*)
  size_t count = 0;   // elements
  uint16_t flags = 0;
  // Memory steps: the round (1-based), the flag (MemWord) of MemPublish / MemWait, and the
  // caller's-buffer offset of kOwnSrc / kAlsoOut.
  uint32_t round = 0;
  uint8_t word = 0;
  size_t aux = 0;
};

// The windows a schedule's memory steps use (slots 0: none).
struct MemWindow {
  size_t count = 0;         // elements per buffer
  uint32_t slots = 0;       // buffers, used in turn by rounds
  uint32_t rounds = 0;      // rounds per operation
  bool lowLatency = false;  // LL: input and flag share cache lines (kLLMaxBytes at most)
};

// One buffer of a group (Coll::SendRecv), in call order: sent to or received from `peer`.
struct GroupBuf {
  size_t count = 0;  // elements
  bool send = false;
  int peer = -1;
};

struct Schedule {
  Coll coll = Coll::AllReduce;
  const char* algorithm = "ring";
  int rank = 0;
  int nranks = 1;
  int root = -1;
  size_t count = 0;             // the collective's count argument
  size_t scratchCount = 0;      // elements of Buf::Scratch the steps use (0: none)
  MemWindow mem;                // the memory steps' windows
  std::vector<GroupBuf> group;  // Coll::SendRecv: the group's buffers
  // No directed pair of ranks carries the messages of two channels: the channels may run at
  // once over the pairs' connections, each receive matched by pair (channelsIndependent()).
  bool independent = false;
  std::vector<std::vector<Step>> channels;  // channels[c] = ordered steps
};

// Pieces of a step of `count` elements of `elemSize` bytes with slots of
// `slotBytes`: 0 when count is 0, else ceil(bytes / slotBytes).
size_t numPieces(size_t count, size_t elemSize, size_t slotBytes);
// Piece p's range [*start, *start + *len) within the step's count elements.
void pieceRange(size_t count, size_t pieces, size_t p, size_t* start, size_t* len);

// An empty one-channel schedule, for builders to fill.
Schedule emptySchedule(Coll coll, const char* algorithm, int rank, int nranks, int root,
                       size_t count);
// A step over [src.offset, +count) / [dst.offset, +count).
Step makeStep(StepOp op, int recvPeer, int sendPeer, BufRef src, BufRef dst, size_t count,
              uint16_t flags = 0);
// A memory step of `round`.
Step makeMemStep(StepOp op, uint32_t round, BufRef src, BufRef dst, size_t count,
                 uint16_t flags = 0, size_t aux = 0);
Step makeFlagStep(StepOp op, MemWord word, uint32_t round);
// (a mod n) in [0, n).
inline int ringMod(int a, int n) { return ((a % n) + n) % n; }

// JSON, one object per schedule (used by LOOM_SCHEDULE_DUMP and golden files).
std::string toJson(const Schedule& s);

// Elements of chunk c when count elements are split into n near-equal chunks.
void chunkRange(size_t count, int n, int c, size_t* offset, size_t* len);

// The fold of n members onto n' = the largest power of two <= n "virtual" members, as
// recursive halving and doubling use it (rhd.cc; hier.cc across hosts): with e = n - n', even
// member 2i (i < e) hands its data to 2i + 1, which plays virtual member i; members from 2e on
// play r - e.
struct Fold {
  int nranks = 1;
  int pow2 = 1;   // n'
  int extra = 0;  // e = n - n'
  // The virtual member r plays, or -1 for a member folded into its successor.
  int vrankOf(int r) const {
    if (r < 2 * extra) return (r % 2 == 1) ? r / 2 : -1;
    return r - extra;
  }
  int rankOf(int v) const { return v < extra ? 2 * v + 1 : v + extra; }
};

inline Fold makeFold(int n) {
  Fold f;
  f.nranks = n;
  while (f.pow2 * 2 <= n) f.pow2 *= 2;
  f.extra = n - f.pow2;
  return f;
}

// Whether no (from, to) pair of ranks appears in two channels of s (as a step's send or
// receive): then its channels can progress together.
bool channelsIndependent(const Schedule& s);

// A group of sends and receives (group.cc), in call order. Each peer's sends go in order on a
// channel of their own and its receives on another, so a group progresses in any order the
// peers allow and cannot deadlock on itself; sends to this rank are copies into its receives
// from it, in order (the caller checks that they pair up). Counts in elements of the size
// the executor is given; zero-length remote operations move nothing and are left out.
Schedule buildGroup(int rank, int nranks, const std::vector<GroupBuf>& ops);

// Builders (ring.cc, chain.cc, direct.cc). `count` is the argument of the C
// call (per-rank count for AllGather, ReduceScatter and AllToAll).
Schedule buildRingAllReduce(int rank, int nranks, size_t count);
Schedule buildRingAllGather(int rank, int nranks, size_t count);
Schedule buildRingReduceScatter(int rank, int nranks, size_t count);
Schedule buildChainBroadcast(int rank, int nranks, int root, size_t count, bool inPlace);
Schedule buildChainReduce(int rank, int nranks, int root, size_t count);
Schedule buildDirectAllToAll(int rank, int nranks, size_t count);
// Dispatches on coll (root ignored where meaningless).
Schedule build(Coll coll, int rank, int nranks, int root, size_t count, bool inPlace);

// Host layouts: hostOf[r] names rank r's host; ranks with equal values share
// a host (the values need not be dense or sorted).
//
// Double binary tree all-reduce (tree.cc). With an empty hostOf every rank is
// a node of both trees; with a layout of two or more hosts the ranks of a
// host form a chain and the trees join hosts.
Schedule buildTreeAllReduce(int rank, int nranks, size_t count,
                            const std::vector<int>& hostOf = {});
// Recursive halving-doubling (rhd.cc): any rank count (non-powers of two fold
// the first ranks onto their successors). Reduce-scatter is the halving alone; it keeps
// partial sums of other ranks' blocks, which a reduce-scatter's receive buffer (this rank's
// block only) cannot hold, in scratch (n blocks).
Schedule buildRhdAllReduce(int rank, int nranks, size_t count);
Schedule buildRhdAllGather(int rank, int nranks, size_t count);
Schedule buildRhdReduceScatter(int rank, int nranks, size_t count);
// Recursive doubling of whole buffers (rhd.cc, "rd"): log2(n') exchanges, the fewest rounds
// (one for 2 ranks), each carrying the whole buffer; for small messages. Folds as rhd does.
Schedule buildRdAllReduce(int rank, int nranks, size_t count);
// Hierarchical all-reduce (hier.cc): reduce-scatter in each host, ring
// all-reduce of matching slices across hosts (recursive doubling with
// rdAcross: "hierrd"), all-gather in each host; hosts may hold different
// numbers of ranks. An empty hostOf is one host.
Schedule buildHierAllReduce(int rank, int nranks, size_t count, const std::vector<int>& hostOf,
                            bool rdAcross = false);

// Direct all-reduce (direct.cc): every rank on one host, each reading its peers' windows in
// place (memory steps). Three forms:
//  * LL (up to DirectParams::llMaxBytes): one round; input and flag share cache lines, so a
//    poll of a peer's line brings its data. Every rank reduces every input, in rank order.
//  * Symmetric (up to DirectTuning::symmetricBytes / nranks, by default): each round is put,
//  published,
//    waited for and reduced whole by every rank, in rank order, so results agree bit for bit;
//    one wait a round.
//  * Slices: rank r reduces slice r of every rank's round input into its window, publishes
//    it, and every rank gathers the slices; each element is reduced once. The gather of round
//    g - 1 follows round g's wait, which covers it (a peer publishes round g's input after
//    its round g - 1 slice), so a round costs one wait; three buffers keep that safe.
// Messages larger than a window buffer go in rounds.
enum class DirectForm : uint8_t { LL, Symmetric, Slices };
const char* directFormName(DirectForm f);  // "LL", "symmetric", "slices"

// The direct all-reduce's thresholds, by CPU (directTuning); the executor may override them
// from the environment (LOOM_DIRECT_*).
struct DirectTuning {
  // Slices form: from this size the copies others read, and the reduction's own slice, go
  // with streaming stores.
  size_t streamBytes = 0;
  // Out of place: from this size, counted over the ranks that share a core, the output is
  // written with streaming stores.
  size_t streamOutputBytes = 0;
  // A round not streamed takes at most this of a window buffer (half where two ranks share
  // a core), so that it stays in the caches.
  size_t cachedRoundBytes = 0;
  // Symmetric form up to symmetricBytes / nranks; or, where symmetricFixedBytes >= 0
  // (LOOM_DIRECT_SYM_MAX, or the start-up calibration's limit), up to that whatever the ranks.
  size_t symmetricBytes = 0;
  int64_t symmetricFixedBytes = -1;
};
enum class CpuVendor : uint8_t { Amd, Intel, Other };
DirectTuning directTuning(CpuVendor vendor);
// The streamOutputBytes that goes with a streamBytes (the table's rule).
size_t streamOutputBytesFor(size_t streamBytes);

struct DirectParams {
  size_t elemSize = 4;
  size_t windowBytes = 0;  // bytes of each window buffer
  size_t llMaxBytes = 0;   // LL form up to this many bytes (0: never)
  int ranksPerCore = 1;    // ranks of the host sharing a core (at least 1)
  bool scale = false;      // the op pre-scales (PreMulSum): every input is put, scaled
  bool inPlace = false;    // the receive buffer is the send buffer
  bool exposed = false;    // the send buffer is memory the peers map (loomMemAlloc)
  DirectTuning tuning;
};
DirectForm directForm(size_t bytes, int nranks, const DirectParams& p);
// The start-up calibration's rule for one limit between two forms (src/api/calibrate.cc):
// given each form's time at ascending sizes, the smaller form (LL against symmetric, symmetric
// against slices) loses a size where it took more than kFormTolerance times the larger one's
// time; its limit is the size before its first loss that a second loss follows at once (or
// that is the last size measured), 0 when that is the first size. One loss between wins is
// taken as the noise of a shared host; a time that is not a number is a loss.
constexpr double kFormTolerance = 1.03;
struct FormTimes {
  size_t bytes = 0;
  double smallerUs = 0, largerUs = 0;
};
size_t formLimit(const std::vector<FormTimes>& times);
// What build(Algo::Direct, Coll::AllReduce, ...) uses (the cost model's and the tools' view):
// 4-byte elements, windows of kDirectWindowBytes, LL up to kDirectLLMaxBytes, one rank a core,
// out of place, the table for an unnamed CPU.
constexpr size_t kDirectWindowBytes = size_t{1} << 20;  // LOOM_DIRECT_BYTES' default
constexpr size_t kDirectLLMaxBytes = 384;               // transport::kLLMaxBytes
DirectParams defaultDirectParams();
// Window buffers of the direct forms: LL uses two (by round parity), the others three.
constexpr uint32_t kDirectSlots = 3;
constexpr uint32_t kDirectLLSlots = 2;
Schedule buildDirectAllReduce(int rank, int nranks, size_t count, const DirectParams& p);

// Algorithms by name, as LOOM_ALGO and the tuner know them. Direct all-reduce is
// buildDirectAllReduce (memory steps, one host; build() gives it defaultDirectParams(), the
// library its own); direct all-to-all is buildDirectAllToAll.
enum class Algo : uint8_t { Ring, Tree, Rhd, Hier, Chain, Direct, Rd, HierRd };
constexpr int kNumAlgos = 8;
const char* algoName(Algo a);
// Parses a name (case-insensitive); false if unknown.
bool parseAlgo(const std::string& name, Algo* out);
// Whether build(a, coll, ...) below has a builder for coll.
bool algoBuilds(Algo a, Coll coll);
// Builds algorithm a's schedule for coll; falls back to build(coll, ...)
// where a has no builder for coll. `ringOrder` (empty: 0, 1, ..., n-1) is the
// order in which the ring algorithms pass data (buildRingInOrder).
Schedule build(Algo a, Coll coll, int rank, int nranks, int root, size_t count, bool inPlace,
               const std::vector<int>& hostOf, const std::vector<int>& ringOrder = {});

// Ring all-reduce, all-gather or reduce-scatter over the ring order[0] ->
// order[1] -> ... -> order[n-1] -> order[0] (a permutation of the ranks; empty:
// rank order): the schedule of ring position p = order^-1(rank), its peers
// renamed to the ranks at the neighbouring positions and, for all-gather and
// reduce-scatter, each block p of the n-block buffer moved to block order[p],
// so every rank's block still lands where the collective defines it.
Schedule buildRingInOrder(Coll coll, int rank, int nranks, size_t count,
                          const std::vector<int>& order);
// The ring order that keeps each host's ranks together: hosts in order of their
// lowest rank, ranks ascending within a host (what ring search gives when every
// rank of a host sits on one node); the ring crosses between hosts once per
// host. Empty when that is rank order already.
std::vector<int> hostMajorOrder(const std::vector<int>& hostOf);
// The ranks of each host of `hostOf` (hostOf[r] is rank r's host): hosts in order of their
// lowest rank, ranks ascending.
std::vector<std::vector<int>> hostMembers(const std::vector<int>& hostOf);

}  // namespace loom::algo
