// The communicator: this rank, its peers, the connections to them, and the
// asynchronous error slot.
//
// Lifetime: created by Comm::create (collective over all ranks), destroyed by
// the C API's loomCommDestroy/Abort. An operation holds opMutex() while it
// runs; abort() may be called from any thread at any moment: it raises the
// abort flag (every wait checks it within milliseconds), marks every
// connection broken so peers fail fast, then waits for the running operation
// to leave before the communicator is freed.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "algorithms/cost.h"
#include "algorithms/kernels/cpu/reduce.h"
#include "algorithms/schedule.h"
#include "bootstrap/bootstrap.h"
#include "comm/inbox.h"
#include "comm/peer_info.h"
#include "loom/loom.h"
#include "trace/recorder.h"
#include "transport/memory.h"
#include "transport/transport.h"
#include "util/status.h"
#include "util/wait.h"

namespace loom::transport {
class TcpListener;
}  // namespace loom::transport
namespace loom::topo {
class System;
}

namespace loom {

struct CommOptions {
  int64_t timeoutMs = 0;
  bool blocking = true;
  bool checkCalls = false;  // LOOM_CHECK_CALLS (src/api/group.cc)
  std::string name;
  int cudaDev = -1;
};

// Resolves a loomConfig_t (may be NULL) against the environment, or, for a communicator made
// from another (split, shrink), against that parent's options: a field the config leaves
// undefined keeps the parent's value, as a NULL config keeps them all.
Result<CommOptions> resolveConfig(const loomConfig_t* config, const CommOptions* parent = nullptr);

class Comm {
 public:
  static Result<std::unique_ptr<Comm>> create(const loomUniqueId& id, int nranks, int rank,
                                              const CommOptions& options,
                                              const std::atomic<bool>* externalAbort = nullptr);
  ~Comm();

  int rank() const { return rank_; }
  int nranks() const { return nranks_; }
  const CommOptions& options() const { return options_; }
  const PeerInfo& peer(int r) const { return peers_[static_cast<size_t>(r)]; }
  // hostOf[r]: an index per distinct host identity, in order of first appearance.
  const std::vector<int>& hostLayout() const { return hostOf_; }
  // The ring order of ranks, each host's ranks together (algo::hostMajorOrder).
  const std::vector<int>& ringOrder() const { return ringOrder_; }
  // The tuner's last choice and the schedule it built (src/api/group.cc), reused by the next
  // call of the same shape: a training loop repeats a few shapes, and a small message's call
  // should not pay for a search and a schedule each time. Used under the communicator's lock.
  struct LastPlan {
    bool valid = false;
    algo::Coll coll = algo::Coll::AllReduce;
    size_t count = 0, elemSize = 0;
    int root = -1;
    bool inPlace = false;
    // The direct all-reduce's algo::DirectParams that vary from call to call, and whether
    // its form may expose the input (then every call looks the send buffer up).
    bool scale = false, exposed = false, mayExpose = false;
    algo::Algo algo = algo::Algo::Ring;
    const char* proto = "simple";  // for the flight recorder
    algo::Schedule schedule;
    // The last built-in reduction made (api::reducerFor) and its (datatype, op): a call with
    // the same pair reuses it.
    int reducerDtype = -1, reducerOp = -1;
    kernels::Reducer reducer;
  };
  LastPlan& lastPlan() { return lastPlan_; }
  // The last group of sends and receives' shape and schedule (src/exec/fifo_steps.cc): a group
  // of the same shape reuses it.
  struct LastGroup {
    bool valid = false;
    std::vector<algo::GroupBuf> shape;
    algo::Schedule schedule;
  };
  LastGroup& lastGroup() { return lastGroup_; }
  // Per-rank scratch of the executors (src/exec/executor.cc's pieces per step, and the memory
  // steps' in src/exec/memory_steps.cc), so that their calls allocate nothing. Used under
  // the communicator's lock, by one operation at a time.
  struct ExecScratch {
    std::vector<size_t> pieces;
    std::vector<const char*> bufs, slice, inputs;
    std::vector<int> pending;
    std::vector<int64_t> enters;
    std::vector<char> llRuns;      // low-latency lines gathered per rank
    std::vector<char*> groupBufs;  // a group's buffers (OpArgs::group)
    std::vector<algo::GroupBuf> groupShape;
    // Channels running at once (src/exec/fifo_steps.cc): each one's (step, piece) order,
    // pieces per step and place.
    std::vector<std::vector<std::pair<uint32_t, uint32_t>>> chanOrder;
    std::vector<std::vector<size_t>> chanPieces;
    std::vector<size_t> chanPos;
  };
  ExecScratch& execScratch() { return execScratch_; }
  // The start-up calibration's cost table (src/api/calibrate.h; LOOM_TUNER_TABLE's format),
  // the same text on every rank; empty when not calibrated. The tuner applies it last.
  Status setCostTable(const std::string& text) {
    algo::CostModel probe = algo::defaultCostModel();
    LOOM_CHECK(algo::applyCostTable(text, "the start-up calibration", &probe));
    costTable_ = text;
    choices_.clear();  // priced with the table from now on
    return Status::ok();
  }
  const std::string& costTable() const { return costTable_; }
  // The direct all-reduce's form limits measured at start-up (src/api/calibrate.h), the same on
  // every rank: the low-latency form up to llMaxBytes, the symmetric one up to
  // symmetricMaxBytes, the slices form's copies streamed from streamBytes out of place and
  // from streamInPlaceBytes in place (on AMD EPYC in place gained from streaming at 64-128 KiB
  // where out of place did not); -1 where not measured (the CPU's table and LOOM_DIRECT_*
  // decide).
  struct DirectLimits {
    int64_t llMaxBytes = -1;
    int64_t symmetricMaxBytes = -1;
    int64_t streamBytes = -1;
    int64_t streamInPlaceBytes = -1;
  };
  void setDirectLimits(const DirectLimits& l) {
    directLimits_ = l;
    lastPlan_.valid = false;  // its schedule may be another form's now
  }
  const DirectLimits& directLimits() const { return directLimits_; }
  // Scratch memory for schedules that keep partial results outside the caller's buffers
  // (algo::Buf::Scratch): grown to the largest request and kept, its pages touched once when
  // allocated. Used under the communicator's lock.
  char* scratch(size_t bytes) {
    if (scratch_.size() < bytes) scratch_.assign(bytes, 0);
    return scratch_.data();
  }
  bootstrap::Bootstrap& bootstrap() { return *bootstrap_; }
  // Every rank's host merged into one graph (src/comm/topo_setup.h); nullptr when
  // LOOM_TOPO_DISABLE=1 or a host could not be described.
  const topo::System* system() const { return system_.get(); }

  // The connection to peer r (nullptr for r == rank()).
  transport::Connection* conn(int r) const { return conns_[static_cast<size_t>(r)].get(); }
  // Connections with a socket, for the executor's poll().
  const std::vector<transport::Connection*>& netConns() const { return netConns_; }
  // Moves bytes on every socket connection. Must not block.
  Status progressNet();
  // The same for the sockets that poll() says have news (data, room to write, an error or a
  // close): a spinning wait's cheap look. A socket receive takes the socket's lock, which the
  // sending side's delivery also takes; poll() does not.
  Status progressNetReady();

  // The ranks' windows (transport/memory.h), when every rank is on this host (else null):
  // member r is rank r.
  const transport::MemoryChannel* memory() const { return memory_.get(); }
  bool hasDirect() const { return memory_ != nullptr; }
  // The memory steps' rounds: the last round run, and the window buffer it used. An
  // operation's round k (1-based) is round last + k, on buffer (buffer + k) % kWindowBuffers;
  // every rank runs the same rounds, so all agree on both. (The buffer is counted apart: 2^32
  // is no multiple of the number of buffers.)
  uint32_t memRound() const { return memRound_; }
  uint32_t memBuffer() const { return memBuffer_; }
  void advanceMemRounds(uint32_t rounds) {
    memRound_ += rounds;
    memBuffer_ = (memBuffer_ + rounds) % transport::kWindowBuffers;
  }

  // Polls of a wait before it yields: long when every local rank has a core
  // of its own, short when ranks outnumber cores (a spinning rank would only
  // steal the core of the rank it waits for).
  uint64_t spinCount() const { return spinCount_; }
  // Polls of a socket before yielding: a system call each, so fewer; none where more ranks
  // than cores share the machine (the poll takes a core the sender may need).
  uint64_t netSpinCount() const { return netSpinCount_; }
  // Yields of a wait after its polls, before it blocks. Long where every rank has a core:
  // a blocked rank's core goes idle, and waking it then (the peer's wake call, and on a
  // virtual machine the idle CPU's own wake-up) cost tens of microseconds more than the
  // yields; shorter where ranks outnumber cores, whose yields hand the core to a rank that
  // may be what this one waits for (200 where two ranks share each core, 16 where more do).
  uint64_t yieldCount() const { return yieldCount_; }
  // Ranks of this machine (counted as for the spin counts above) per core, rounded up (at
  // least 1): how many ranks' buffers one core's caches hold in turn.
  int ranksPerCore() const { return ranksPerCore_; }
  // More ranks than cores on this machine.
  bool outnumbered() const { return ranksPerCore_ > 1; }

  // A non-blocking communicator numbers calls on the caller's thread as it queues them (an
  // atomic increment); a blocking one numbers each under opMutex(), where a plain increment of
  // the atomic (no locked instruction) is enough.
  uint64_t nextSeq() {
    if (!options_.blocking) return seq_.fetch_add(1, std::memory_order_relaxed) + 1;
    const uint64_t seq = seq_.load(std::memory_order_relaxed) + 1;
    seq_.store(seq, std::memory_order_relaxed);
    return seq;
  }
  uint64_t lastSeq() const { return seq_.load(std::memory_order_relaxed); }
  FutexMutex& opMutex() { return opMutex_; }
  // The tuner's choices for this communicator, by collective, size class and element size
  // (src/api/group.cc); used under opMutex().
  std::unordered_map<uint64_t, algo::Algo>& choices() { return choices_; }
  // loomCommSetOpTag: the tag the next operation issued takes (and clears).
  void setNextTag(uint64_t tag) { nextTag_.store(tag, std::memory_order_relaxed); }
  uint64_t takeNextTag() {
    return nextTag_.load(std::memory_order_relaxed) == 0
               ? 0
               : nextTag_.exchange(0, std::memory_order_relaxed);
  }

  bool aborted() const { return aborted_.load(std::memory_order_relaxed); }
  const std::atomic<bool>* abortFlag() const { return &aborted_; }
  // Raises the abort flag and tells every peer; safe from any thread.
  void abort();

  // The first asynchronous failure (a peer died, a timeout); success if none.
  Status asyncError() const;
  // Whether there is one (the test every run of calls makes first).
  bool hasFailed() const { return failed_.load(std::memory_order_acquire); }
  // Records a failure and breaks every connection so that peers fail fast, telling them the
  // lost rank noted by noteLost (else this rank) so that their errors name it.
  void fail(const Status& s);
  // The rank whose loss this rank saw first (a dead process, or the rank a broken link names).
  void noteLost(int r);

  // loomCheckPeer: loomRemoteError if peer r is on this host and its process
  // has exited.
  Status checkPeerAlive(int r) const;

  // PreMulSum reducers made by loomRedOpCreatePreMulSum (op = loomNumOps + index).
  std::vector<std::unique_ptr<kernels::Reducer>>& userOps() { return userOps_; }

  // Tagged messages that arrived before their receive, and the receives waiting (under
  // opMutex()).
  Inbox& inbox() { return inbox_; }

  trace::FlightRecorder& recorder() { return *recorder_; }
  // Per peer, the (operation, news version) last stamped on a slot to it (exec::ArrivalNews).
  std::vector<std::pair<uint64_t, uint64_t>>* stampsSent() { return &stampsSent_; }
  // Writes the flight recorder to `path` ("" : LOOM_TRACE_DIR's file for this
  // rank). reason says why ("timeout", "SIGUSR1", ...).
  Status dumpTrace(const std::string& path, const std::string& reason);
  // Dumps into LOOM_TRACE_DIR, if set (errors are logged, not returned).
  void dumpTraceIfConfigured(const std::string& reason);
  // Dumps if a SIGUSR1 arrived since the last look. Cheap; called by waits.
  void pollDumpRequest();
  // Publishes this rank's last completed operation where local peers see it.
  void publishCompleted(uint64_t seq);
  // A local peer's last completed operation, or 0 when unknown.
  uint64_t peerLastSeq(int r) const;

  // loomCommRegister / loomCommDeregister: the handle is this communicator's own record.
  Result<void*> registerBuffer(void* buff, size_t size);
  Status deregisterBuffer(void* handle);

  // The link to other hosts (Tcp, or Net over ib) and its rate in Gb/s (0: unknown).
  algo::Link netLink() const { return netLink_; }
  double netGbps() const { return netGbps_; }

  // A short description for messages: "rank 3 of 8 (name)".
  std::string describe() const;

 private:
  Comm() = default;
  static Result<bool> wantIb();
  // The ib transport on this rank's port, its queue pair data to go over `watches` (indexed
  // by rank); notes the port's rate.
  Result<std::unique_ptr<transport::Transport>> ibTransport(
      std::vector<std::unique_ptr<transport::Connection>> watches);
  // Takes one transport's links: each connection to its peer's place (and into netConns_ when
  // a wait polls it), the peers' memory, and what both live in.
  void adopt(transport::Links links);

  int rank_ = 0;
  int nranks_ = 1;
  CommOptions options_;
  std::vector<PeerInfo> peers_;
  std::vector<int> hostOf_;
  std::vector<int> ringOrder_;
  LastGroup lastGroup_;
  LastPlan lastPlan_;
  ExecScratch execScratch_;
  std::string costTable_;
  DirectLimits directLimits_;
  std::vector<char> scratch_;
  algo::Link netLink_ = algo::Link::Tcp;
  std::shared_ptr<void> ibDevice_;  // transport::ib::Device, where ib peers exist
  struct Registration {
    void* buff;
    size_t size;
    std::shared_ptr<void> region;  // the device's registration, if any
  };
  std::mutex regMutex_;
  std::vector<std::unique_ptr<Registration>> registrations_;
  double netGbps_ = 0;
  std::shared_ptr<const topo::System> system_;
  std::unique_ptr<bootstrap::Bootstrap> bootstrap_;
  std::unique_ptr<transport::TcpListener> listener_;
  // What the connections and memory_ live in: declared before them, destroyed after them.
  std::vector<std::shared_ptr<void>> backings_;
  std::vector<std::unique_ptr<transport::Connection>> conns_;
  std::vector<transport::Connection*> netConns_;
  std::atomic<uint64_t> seq_{0};
  std::unique_ptr<transport::MemoryChannel> memory_;  // shm's windows, when every rank is local
  uint32_t memRound_ = 0;
  uint32_t memBuffer_ = 0;
  uint64_t spinCount_ = 0;
  uint64_t netSpinCount_ = 0;
  uint64_t yieldCount_ = 16;
  int ranksPerCore_ = 1;
  FutexMutex opMutex_;
  std::unordered_map<uint64_t, algo::Algo> choices_;
  std::atomic<uint64_t> nextTag_{0};
  std::atomic<bool> aborted_{false};
  mutable std::mutex errorMutex_;
  Status asyncError_;
  std::atomic<bool> failed_{false};  // asyncError_ is set: the fast test on every call
  std::atomic<int> lostRank_{-1};
  std::vector<std::unique_ptr<kernels::Reducer>> userOps_;
  std::unique_ptr<trace::FlightRecorder> recorder_;
  std::vector<std::pair<uint64_t, uint64_t>> stampsSent_;
  Inbox inbox_;
  uint64_t dumpRequestsSeen_ = 0;
};

}  // namespace loom
