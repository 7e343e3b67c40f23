// The "loom" torch.distributed backend: a c10d::Backend for CPU tensors over
// Loom's public C API (loom.h), nothing else of Loom.
//
// Contract. Each collective is queued on a non-blocking Loom communicator and
// returns its Work at once; Loom's worker thread moves the bytes while the caller
// goes on. A Work completes when its own operation does (loomCommWaitTicket on the
// operation's ticket), not when the whole queue drains. wait() honours its timeout
// (else the group's) and throws a DistBackendError with Loom's message, which names
// the failed peer. getFuture()'s future is completed by a completion thread that
// starts with the first future asked for. The backend holds every Work until its
// operation has finished (a Work the caller drops keeps its tensors alive, and its
// copy-out still runs), so Loom never touches freed memory. Calls whose outputs are
// not one contiguous tensor (lists of tensors) land in a staging tensor and are
// copied out once, by whoever sees the operation finish first (wait(), the completion
// thread, or the backend's sweep of finished works at the next call or wait).
// A sparse all-reduce runs on the sparse lane (a thread with a communicator of its own), its
// two dependent steps in order there, while the caller goes on.
// shutdown() lets every queued operation finish and settles its Work before Loom's
// communicator is destroyed; abort() ends them, then fails the Works left. A Work
// never reaches its backend once it has completed, so it may outlive it.
//
// Thread safety: collectives are issued by one thread at a time (torch's
// contract for a process group); wait(), isCompleted() and getFuture() may be
// called from any thread.
#pragma once

#include <loom/loom.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <thread>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

namespace loom::torchext {

class LoomBackend;

// The queue of a thread the backend starts (the completion thread, the sparse lane). The thread
// shares it with the backend, and touches nothing else of the backend between items: a future's
// callback on that thread may drop the last reference to the backend, whose destructor then
// stops the thread without joining it (see stopThread), and the thread finds stopping set here.
template <typename T>
struct Served {
  std::mutex m;
  std::condition_variable cv;
  std::deque<T> queue;
  bool stopping = false;
  // Set by the thread as its last step, once its loop has returned and holds nothing (a thread
  // stopped from inside is then joined by the next stop or backend; see stopThread).
  std::atomic<bool> ended{false};
};
struct LaneQueue : Served<std::function<void(bool)>> {
  bool aborted = false;  // the queued tasks fail instead of running
};
// Starts the thread that serves q with loop(q), which sets q->ended as it returns.
template <typename Q>
std::thread startServed(const std::shared_ptr<Q>& q,
                        std::function<void(const std::shared_ptr<Q>&)> loop) {
  return std::thread([q, loop = std::move(loop)] {
    loop(q);
    q->ended.store(true, std::memory_order_release);
  });
}
// Joins t; on t's own thread (a backend destroyed or shut down there), keeps it, with the
// queue whose `ended` says when it has finished, for a later join: by the next call here or
// the next backend made once it has ended, else by joinStoppedThreads.
void stopServedThread(std::thread& t, std::shared_ptr<const std::atomic<bool>> ended);
template <typename Q>
void stopThread(std::thread& t, const std::shared_ptr<Q>& q) {
  stopServedThread(t, std::shared_ptr<const std::atomic<bool>>(q, &q->ended));
}
// Joins the threads stopped from inside that have ended (each is then at most its exit away).
void joinEndedThreads();
// Joins every thread stopped from inside; called at the interpreter's exit, without the GIL.
void joinStoppedThreads();
// How many threads stopped from inside are not joined yet.
size_t stoppedThreads();

class LoomWork : public c10d::Work {
 public:
  LoomWork(LoomBackend* backend, c10d::OpType type, std::vector<at::Tensor> outputs,
           std::function<void()> epilogue, std::vector<at::Tensor> keep);
  ~LoomWork() override;

  bool isCompleted() override;
  bool isSuccess() const override;
  std::exception_ptr exception() const override;
  bool wait(std::chrono::milliseconds timeout) override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;
  std::vector<at::Tensor> result() override;
  uint64_t getSequencenumber() const override { return seq_; }
  // A receive's sender (recv, recvAnysource), once it has completed.
  int sourceRank() const override;
  // Where the receive's sender is written (a one-element int32 tensor the operation keeps).
  void setSource(at::Tensor source) { source_ = std::move(source); }

  // Set once the operation is queued (at once, or at the end of a coalescing block).
  void setTicket(uint64_t ticket, uint64_t seq) {
    ticket_ = ticket;
    seq_ = seq;
  }
  uint64_t ticket() const { return ticket_; }
  // A coalescing block's work: it completes the block's members with its own result (set
  // before the work is returned; read-only after).
  void setMembers(std::vector<c10::intrusive_ptr<LoomWork>> members) {
    members_ = std::move(members);
  }
  // Completed (successfully or not), without asking Loom.
  bool settled() const;
  // Has a future: only the completion thread, wait() and isCompleted() complete it then, so
  // that its callbacks never run inside another call (whose caller may hold locks they need).
  bool hasFuture() const;
  // A receive (recv, recvAnysource): it may finish after operations queued later.
  bool isReceive() const { return source_.defined(); }
  // Completed by the backend's sparse lane (no ticket on the communicator): wait() waits for
  // that, and its future is completed there.
  void setExternal() { external_ = true; }
  // Records the operation's result (once): runs the epilogue on success and completes the
  // future. Returns the exception, if any.
  std::exception_ptr complete(loomResult_t r, const std::string& message);
  // complete() with Loom's result r as a Loom call on this thread returned it (its message is
  // this thread's last error).
  std::exception_ptr completeFrom(loomResult_t r) {
    return complete(r, r == loomSuccess ? "" : loomGetLastError(nullptr));
  }

 private:
  LoomBackend* backend_;
  uint64_t ticket_ = 0;
  uint64_t seq_ = 0;
  std::vector<at::Tensor> outputs_;
  std::function<void()> epilogue_;
  // The error of a wait() that ran out of time.
  std::exception_ptr timedOut(int64_t ms);
  std::vector<at::Tensor> keep_;  // inputs and staging tensors the operation reads or writes
  at::Tensor source_;
  bool external_ = false;
  std::vector<c10::intrusive_ptr<LoomWork>> members_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

class LoomBackend : public c10d::Backend {
 public:
  // Joins the group: rank 0 makes Loom's unique id and publishes it in store.
  LoomBackend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
              std::chrono::milliseconds timeout);
  ~LoomBackend() override;

  const std::string getBackendName() const override { return "loom"; }
  bool supportsSplitting() const override { return true; }
  bool supportsCoalescing() const override { return true; }
  void setTimeout(std::chrono::milliseconds timeout) override { timeoutMs_ = timeout.count(); }
  void startCoalescing() override;
  c10::intrusive_ptr<c10d::Work> endCoalescing() override;
  void setSequenceNumberForGroup() override {}
  uint64_t getSequenceNumberForGroup() override { return seq_; }
  c10::intrusive_ptr<c10d::Backend> split(const c10::intrusive_ptr<c10d::Store>& store,
                                          const std::vector<int>& ranks,
                                          const c10::intrusive_ptr<Options>& opts) override;
  void abort() override;
  void shutdown() override;

  using Work = c10::intrusive_ptr<c10d::Work>;
  Work broadcast(std::vector<at::Tensor>& tensors, const c10d::BroadcastOptions& opts) override;
  Work allreduce(std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) override;
  Work allreduce_coalesced(std::vector<at::Tensor>& tensors,
                           const c10d::AllreduceCoalescedOptions& opts) override;
  Work reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) override;
  Work allgather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                 const c10d::AllgatherOptions& opts) override;
  Work _allgather_base(at::Tensor& output, at::Tensor& input,
                       const c10d::AllgatherOptions& opts) override;
  Work allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                           std::vector<at::Tensor>& inputs,
                           const c10d::AllgatherOptions& opts) override;
  Work allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                       std::vector<at::Tensor>& inputs,
                                       const c10d::AllgatherOptions& opts) override;
  Work gather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
              const c10d::GatherOptions& opts) override;
  Work scatter(std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
               const c10d::ScatterOptions& opts) override;
  Work reduce_scatter(std::vector<at::Tensor>& outputs,
                      std::vector<std::vector<at::Tensor>>& inputs,
                      const c10d::ReduceScatterOptions& opts) override;
  Work _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                            const c10d::ReduceScatterOptions& opts) override;
  Work reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                       std::vector<at::Tensor>& inputs,
                                       const c10d::ReduceScatterOptions& opts) override;
  Work alltoall_base(at::Tensor& output, at::Tensor& input, std::vector<int64_t>& outputSplits,
                     std::vector<int64_t>& inputSplits, const c10d::AllToAllOptions& opts) override;
  Work alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                const c10d::AllToAllOptions& opts) override;
  Work send(std::vector<at::Tensor>& tensors, int dst, int tag) override;
  Work recv(std::vector<at::Tensor>& tensors, int src, int tag) override;
  Work recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;
  Work barrier(const c10d::BarrierOptions& opts) override;

  // For LoomWork.
  loomComm_t comm() const { return comm_.load(); }
  std::chrono::milliseconds timeout() const { return std::chrono::milliseconds(timeoutMs_.load()); }
  // Loom's timeout argument for a wait with the group's timeout: -1 (the communicator's own,
  // with which the waiting thread may run the operation itself) until setTimeout changes it.
  int groupWaitMs() const;
  // Drops the finished works from the front of the works in flight (asking Loom about the
  // oldest one; about all of them once many are held).
  void sweep();
  // Hands the work to the completion thread (started on first use).
  void completeInBackground(c10::intrusive_ptr<LoomWork> work);
  // The error text of a failed operation, naming this rank.
  std::string describe(loomResult_t r, const std::string& message, const LoomWork& w) const;

 private:
  // Queues one operation: issue() makes the Loom calls (inside a group when it makes several);
  // the work gets the operation's ticket.
  Work enqueue(c10d::OpType type, std::vector<at::Tensor> outputs,
               const std::function<void()>& issue, std::function<void()> epilogue = nullptr,
               std::vector<at::Tensor> keep = {});
  loomRedOp_t redOp(const c10d::ReduceOp& op, const at::Tensor& t);
  // All-gathers of several inputs as one operation, each into a staging tensor copied out
  // once done: outputOf(i, r) is where input i of rank r lands.
  Work allgatherStaged(std::vector<at::Tensor>& inputs,
                       const std::function<at::Tensor&(size_t, int)>& outputOf, c10d::OpType type);
  // A sparse (COO) all-reduce, on the sparse lane: sizes, then indices and values are
  // all-gathered (the second step's sizes come from the first) and summed.
  Work allreduceSparse(at::Tensor& t, const c10d::AllreduceOptions& opts);
  // One in-place operation over tensors (broadcast, reduce, all-reduces): call(tensor, i) makes
  // the Loom call loomCall for each, in one group, on the tensor or, where it is not dense, on a
  // contiguous copy copied back once done.
  Work enqueueInPlace(c10d::OpType type, std::vector<at::Tensor>& tensors, const char* loomCall,
                      const std::function<loomResult_t(const at::Tensor&, size_t)>& call);
  // All-reduces of several tensors (or one strided view) as one operation of this type.
  Work allreduceMany(std::vector<at::Tensor>& tensors, const c10d::ReduceOp& op, c10d::OpType type);
  // reduce_scatter with blocks of unequal sizes (input_tensors[i][r]: rank r's block).
  Work reduceScatterUneven(std::vector<at::Tensor>& outputs,
                           std::vector<std::vector<at::Tensor>>& inputs,
                           const c10d::ReduceScatterOptions& opts);
  // The sparse lane: a thread that runs those operations in call order (the same order on every
  // rank) on a communicator of their own, so that they are asynchronous although each has two
  // dependent steps. The first one opens the lane's communicator there (rank 0 publishes its id
  // in the group's store), so the caller never waits for it.
  void toSparseLane(std::function<void(bool run)> task);
  static void sparseLoop(const std::shared_ptr<LaneQueue>& lane);
  bool sparseLaneAborted() {
    std::lock_guard<std::mutex> lock(lane_->m);
    return lane_->aborted;
  }
  // The id of a communicator of this group, made by rank 0 and published in the group's store
  // under key; the others wait for it in slices (up to the timeout, or until aborted() says so).
  loomResult_t shareId(const std::string& key, loomUniqueId* id,
                       const std::function<bool()>& aborted, std::string* message);
  // A non-blocking configuration with the group's timeout.
  loomConfig_t configNamed(const char* name) const;
  // On the lane's thread: joins the lane's communicator, once.
  loomResult_t openSparseLane(std::string* message);
  // On the lane's thread: issue() makes Loom calls on the lane's communicator under laneMutex_
  // (so that abort never frees it under them) and returns the last one's result; then waits for
  // their operation, outside the lock. On failure, *message is Loom's.
  loomResult_t laneStep(const std::function<loomResult_t(loomComm_t)>& issue, std::string* message);
  // The sum itself: every rank's count of entries, then the entries (padded to the largest
  // count), summed into t; tag is torch's number of the operation (for loom-trace).
  loomResult_t sumSparse(at::Tensor& t, uint64_t tag, std::string* message);
  // Ends the lane: lets its queued operations run (or, aborted, aborts its communicator and
  // fails them), then frees its communicator.
  void stopSparseLane(bool aborted);
  // recv and recvAnysource (src LOOM_ANY_SOURCE): tagged messages, each tensor one.
  Work receive(std::vector<at::Tensor>& tensors, int src, int tag);
  static void completionLoop(const std::shared_ptr<Served<c10::intrusive_ptr<LoomWork>>>& c,
                             loomComm_t comm);
  void stopCompletion();
  // Holds w until its operation has finished (enqueue sweeps the finished ones first).
  void track(c10::intrusive_ptr<LoomWork> w);
  // Shutdown's and abort's end of the works in flight: each waits for its operation (or, on
  // abort, is failed once Loom has stopped).
  void settleAll(bool aborted);
  // The communicator's last ticket, asked of Loom (and kept in lastTicket_).
  uint64_t queuedTicket();

  std::atomic<loomComm_t> comm_{nullptr};
  std::atomic<int64_t> timeoutMs_;
  const int64_t createdTimeoutMs_;  // the communicator's own timeout
  // shutdown() and abort() one at a time; the first ends the group, and a call from a future's
  // callback that it runs (on its own thread) returns at once.
  std::recursive_mutex life_;
  bool ending_ = false;
  std::mutex im_;  // inflight_
  std::deque<c10::intrusive_ptr<LoomWork>> inflight_;
  uint64_t seq_ = 0;
  uint64_t lastTicket_ = 0;  // of the last operation queued
  bool coalescing_ = false;
  std::vector<c10::intrusive_ptr<LoomWork>> coalesced_;
  std::map<std::pair<int, uint64_t>, loomRedOp_t> premul_;  // (dtype, factor's bits) -> op

  // The sparse lane's tasks (argument: run; false: fail it).
  std::shared_ptr<LaneQueue> lane_ = std::make_shared<LaneQueue>();
  std::mutex laneMutex_;  // calls on sparseComm_, and its abort
  std::atomic<loomComm_t> sparseComm_{nullptr};
  bool laneOpened_ = false;  // the lane's thread only
  std::thread sparseWorker_;
  c10::intrusive_ptr<c10d::Store> store_;

  // The works whose futures the completion thread completes.
  std::shared_ptr<Served<c10::intrusive_ptr<LoomWork>>> completion_ =
      std::make_shared<Served<c10::intrusive_ptr<LoomWork>>>();
  std::thread completer_;
};

}  // namespace loom::torchext
