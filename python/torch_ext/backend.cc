#include "backend.h"

#include <Python.h>

#include <algorithm>
#include <cstring>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include "util.h"
#include "util/wait.h"

namespace loom::torchext {

namespace {

std::exception_ptr backendError(const std::string& message) {
  try {
    C10_THROW_ERROR(DistBackendError, message);
  } catch (...) {
    return std::current_exception();
  }
}

}  // namespace

namespace {

// Threads stopped from inside: each finds its queue stopping when the call that stopped it
// returns, and ends. Joined once they have ended, or at the interpreter's exit (a thread still
// returning from a future's callback takes the GIL, which it must not do once the interpreter is
// finalising).
struct StoppedThread {
  std::thread thread;
  std::shared_ptr<const std::atomic<bool>> ended;
};
struct Stopped {
  std::mutex m;
  std::vector<StoppedThread> threads;
};
Stopped& stopped() {
  // Never destroyed: a joinable thread left in it at exit (an embedder that never called
  // joinStoppedThreads) must not reach std::thread's destructor.
  static Stopped* s = new Stopped;
  return *s;
}

// Takes out the stopped threads that `which` picks.
std::vector<StoppedThread> takeStopped(const std::function<bool(const StoppedThread&)>& which) {
  std::vector<StoppedThread> taken;
  std::lock_guard<std::mutex> lock(stopped().m);
  std::vector<StoppedThread>& all = stopped().threads;
  for (auto it = all.begin(); it != all.end();) {
    if (which(*it)) {
      taken.push_back(std::move(*it));
      it = all.erase(it);
    } else {
      ++it;
    }
  }
  return taken;
}

void joinAll(std::vector<StoppedThread>& threads) {
  for (StoppedThread& t : threads) {
    if (t.thread.get_id() == std::this_thread::get_id())
      t.thread.detach();
    else
      t.thread.join();
  }
}

}  // namespace

void stopServedThread(std::thread& t, std::shared_ptr<const std::atomic<bool>> ended) {
  if (!t.joinable()) return;
  if (t.get_id() != std::this_thread::get_id()) {
    t.join();
    joinEndedThreads();
    return;
  }
  std::lock_guard<std::mutex> lock(stopped().m);
  stopped().threads.push_back(StoppedThread{std::move(t), std::move(ended)});
}

void joinEndedThreads() {
  std::vector<StoppedThread> threads = takeStopped([](const StoppedThread& t) {
    return t.thread.get_id() != std::this_thread::get_id() &&
           t.ended->load(std::memory_order_acquire);
  });
  joinAll(threads);
}

size_t stoppedThreads() {
  std::lock_guard<std::mutex> lock(stopped().m);
  return stopped().threads.size();
}

void joinStoppedThreads() {
  std::vector<StoppedThread> threads = takeStopped([](const StoppedThread&) { return true; });
  joinAll(threads);
}

// ---- LoomWork ----

LoomWork::LoomWork(LoomBackend* backend, c10d::OpType type, std::vector<at::Tensor> outputs,
                   std::function<void()> epilogue, std::vector<at::Tensor> keep)
    : c10d::Work(backend->getRank(), type),
      backend_(backend),
      outputs_(std::move(outputs)),
      epilogue_(std::move(epilogue)),
      keep_(std::move(keep)) {}

LoomWork::~LoomWork() = default;

std::exception_ptr LoomWork::complete(loomResult_t r, const std::string& message) {
  std::exception_ptr memberError;
  for (const auto& m : members_) {
    const std::exception_ptr e = m->complete(r, message);
    if (e && !memberError) memberError = e;
  }
  std::unique_lock<std::mutex> lock(mutex_);
  if (completed_) return exception_;
  if (r == loomSuccess) {
    try {
      if (epilogue_) epilogue_();
    } catch (...) {
      exception_ = std::current_exception();
    }
    if (!exception_) exception_ = memberError;
  } else {
    exception_ = backendError(backend_->describe(r, message, *this));
  }
  completed_ = true;
  // Freed after the lock: freeing a tensor may take the GIL, whose holder may be asking
  // this work for its state.
  std::function<void()> epilogue = std::move(epilogue_);
  std::vector<at::Tensor> keep = std::move(keep_);
  auto future = future_;
  auto e = exception_;
  lock.unlock();
  cv_.notify_all();
  if (future) {
    if (e)
      future->setError(e);
    else
      future->markCompleted(c10::IValue(outputs_));
  }
  return e;
}

bool LoomWork::isCompleted() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (completed_) return true;
  }
  if (ticket_ == 0) return false;
  const loomResult_t r = loomCommWaitTicket(backend_->comm(), ticket_, 0);
  if (r == loomInProgress) return false;
  completeFrom(r);
  return true;
}

bool LoomWork::settled() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return completed_;
}

bool LoomWork::hasFuture() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return future_ != nullptr;
}

bool LoomWork::isSuccess() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return completed_ && !exception_;
}

std::exception_ptr LoomWork::exception() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return exception_;
}

bool LoomWork::wait(std::chrono::milliseconds timeout) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (completed_) {
      if (exception_) std::rethrow_exception(exception_);
      return true;
    }
  }
  // kNoTimeout: the group's (see groupWaitMs).
  const bool groupTimeout = timeout.count() <= 0;
  const int64_t ms = groupTimeout ? backend_->timeout().count() : timeout.count();
  if (external_) {  // the sparse lane completes it
    // The group's timeout as Loom waits it: the lane's own error (naming a rank) comes first.
    const int64_t limit = groupTimeout ? ms + waitGraceMs(ms) : ms;
    std::unique_lock<std::mutex> lock(mutex_);
    if (!cv_.wait_for(lock, std::chrono::milliseconds(limit), [this] { return completed_; }))
      std::rethrow_exception(timedOut(limit));
    if (exception_) std::rethrow_exception(exception_);
    return true;
  }
  if (ticket_ == 0) fail("wait(): the operation is still inside a coalescing block");
  const loomResult_t r = loomCommWaitTicket(
      backend_->comm(), ticket_,
      groupTimeout ? backend_->groupWaitMs() : static_cast<int>(std::min<int64_t>(ms, INT32_MAX)));
  if (r == loomInProgress) std::rethrow_exception(timedOut(ms));
  // Works before this one have finished too (but receives). Swept first: completing this one
  // may run a callback that drops the last reference to the backend.
  backend_->sweep();
  const std::exception_ptr e = completeFrom(r);
  if (e) std::rethrow_exception(e);
  return true;
}

std::exception_ptr LoomWork::timedOut(int64_t ms) {
  return backendError("loom: rank " + std::to_string(backend_->getRank()) + ": " +
                      c10d::opTypeToString(retrieveOpType()) + " #" + std::to_string(seq_) +
                      " did not finish: timeout after " + std::to_string(ms) +
                      " ms (a peer is late, stalled or dead)");
}

c10::intrusive_ptr<c10::ivalue::Future> LoomWork::getFuture() {
  std::unique_lock<std::mutex> lock(mutex_);
  if (future_) return future_;
  future_ = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()));
  auto future = future_;
  if (completed_) {
    auto e = exception_;
    lock.unlock();
    if (e)
      future->setError(e);
    else
      future->markCompleted(c10::IValue(outputs_));
    return future;
  }
  lock.unlock();
  if (!external_) backend_->completeInBackground(c10::intrusive_ptr<LoomWork>::reclaim_copy(this));
  return future;
}

std::vector<at::Tensor> LoomWork::result() { return outputs_; }

int LoomWork::sourceRank() const {
  if (!source_.defined()) return c10d::Work::sourceRank();  // not a receive: torch's error
  return source_.data_ptr<int>()[0];
}

// ---- LoomBackend: life ----

LoomBackend::LoomBackend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                         std::chrono::milliseconds timeout)
    : c10d::Backend(rank, size),
      timeoutMs_(timeout.count()),
      createdTimeoutMs_(std::min<int64_t>(timeout.count(), INT32_MAX)),
      store_(store) {
  joinEndedThreads();  // of backends ended from their own callbacks
  loomUniqueId id;
  std::string message;
  const loomResult_t shared = shareId("loom_unique_id", &id, nullptr, &message);
  if (shared != loomSuccess)
    fail("rank " + std::to_string(rank) + ": " + loomGetErrorString(shared) + ": " + message);
  loomConfig_t cfg = configNamed("torch");
  loomComm_t comm = nullptr;
  check(loomCommInitRankConfig(&comm, size, id, rank, &cfg), "loomCommInitRankConfig");
  comm_ = comm;
  const loomResult_t r = loomCommWaitTicket(comm, 1, -1);  // ticket 1: the initialisation
  if (r != loomSuccess) {
    const std::string text = loomGetLastError(nullptr);
    (void)loomCommAbort(comm);
    comm_ = nullptr;
    fail("rank " + std::to_string(rank) + ": joining the group of " + std::to_string(size) +
         " failed: " + loomGetErrorString(r) + ": " + text);
  }
  lastTicket_ = 1;
}

LoomBackend::~LoomBackend() {
  // The last reference may go in Python (with the GIL held), while the completion thread
  // runs a future's callback that needs the GIL: shut down without it.
  if (Py_IsInitialized() && PyGILState_Check()) {
    PyThreadState* state = PyEval_SaveThread();
    shutdown();
    PyEval_RestoreThread(state);
  } else {
    shutdown();
  }
}

void LoomBackend::stopCompletion() {
  {
    std::lock_guard<std::mutex> lock(completion_->m);
    completion_->stopping = true;
  }
  completion_->cv.notify_all();
  stopThread(completer_, completion_);
}

void LoomBackend::shutdown() {
  std::lock_guard<std::recursive_mutex> life(life_);
  if (ending_) return;  // called from a callback that the first call runs: that one ends it
  ending_ = true;
  if (comm_.load() != nullptr) {
    stopSparseLane(false);
    settleAll(false);  // what is queued runs first (each operation is bounded by the timeout)
    stopCompletion();
    for (const auto& kv : premul_) (void)loomRedOpDestroy(kv.second, comm_);
    premul_.clear();
    (void)loomCommDestroy(comm_.exchange(nullptr));
  }
  stopCompletion();
}

void LoomBackend::abort() {
  std::lock_guard<std::recursive_mutex> life(life_);
  if (ending_) return;  // as in shutdown()
  ending_ = true;
  if (comm_.load() != nullptr) {
    {  // works whose operations finished keep their results (futures' included)
      std::vector<c10::intrusive_ptr<LoomWork>> held;
      {
        std::lock_guard<std::mutex> lock(im_);
        held.assign(inflight_.begin(), inflight_.end());
      }
      for (const auto& w : held) (void)w->isCompleted();
    }
    stopSparseLane(true);
    (void)loomCommAbort(comm_.load());  // drops the queue, ends the running operation
    settleAll(true);
    stopCompletion();
    premul_.clear();  // freed with the communicator
    comm_ = nullptr;
  }
  stopCompletion();
}

int LoomBackend::groupWaitMs() const {
  const int64_t ms = timeoutMs_.load();
  return ms == createdTimeoutMs_ ? -1 : static_cast<int>(std::min<int64_t>(ms, INT32_MAX));
}

void LoomBackend::track(c10::intrusive_ptr<LoomWork> w) {
  std::lock_guard<std::mutex> lock(im_);
  inflight_.push_back(std::move(w));
}

void LoomBackend::sweep() {
  // A work is never freed under im_ or a queue's lock: freeing its tensors may take the GIL, and a
  // thread holding the GIL may be waiting for that lock (a DDP communication hook asking a future).
  // The sweep completes works without futures only (a copy-out at most), and outside the
  // lock; the completion thread completes the others.
  auto finished = [](const c10::intrusive_ptr<LoomWork>& w) {
    return w->settled() || (!w->hasFuture() && w->isCompleted());
  };
  for (;;) {
    c10::intrusive_ptr<LoomWork> w;
    {
      std::lock_guard<std::mutex> lock(im_);
      if (inflight_.empty()) return;
      w = inflight_.front();
    }
    if (!finished(w)) break;
    std::lock_guard<std::mutex> lock(im_);
    if (!inflight_.empty() && inflight_.front() == w) inflight_.pop_front();
  }  // w, perhaps the last reference, goes after the lock
  // Past this many, every held work is asked about: receives can finish out of order.
  constexpr size_t kScanAll = 16;
  std::vector<c10::intrusive_ptr<LoomWork>> held;
  {
    std::lock_guard<std::mutex> lock(im_);
    if (inflight_.size() < kScanAll) return;
    held.assign(inflight_.begin(), inflight_.end());
  }
  for (const auto& w : held) (void)finished(w);
  std::lock_guard<std::mutex> lock(im_);
  inflight_.erase(std::remove_if(inflight_.begin(), inflight_.end(),
                                 [](const auto& w) { return w->settled(); }),
                  inflight_.end());
}  // held, the last reference to the works dropped, goes after the lock

void LoomBackend::settleAll(bool aborted) {
  std::deque<c10::intrusive_ptr<LoomWork>> works;
  {
    std::lock_guard<std::mutex> lock(im_);
    works.swap(inflight_);
  }
  for (const auto& w : works) {
    if (w->settled()) continue;
    if (aborted) {
      w->complete(loomRemoteError, "the process group was aborted before the operation ended");
      continue;
    }
    const loomResult_t r = loomCommWaitTicket(comm_, w->ticket(), groupWaitMs());
    if (r == loomInProgress)
      w->complete(loomTimeout,
                  "the process group was shut down, and the operation did not "
                  "finish within the timeout");
    else
      w->completeFrom(r);
  }
}

c10::intrusive_ptr<c10d::Backend> LoomBackend::split(const c10::intrusive_ptr<c10d::Store>& store,
                                                     const std::vector<int>& ranks,
                                                     const c10::intrusive_ptr<Options>& opts) {
  auto it = std::find(ranks.begin(), ranks.end(), getRank());
  if (it == ranks.end()) return nullptr;
  const auto timeout = opts ? opts->timeout : this->timeout();
  return c10::make_intrusive<LoomBackend>(store, static_cast<int>(it - ranks.begin()),
                                          static_cast<int>(ranks.size()), timeout);
}

std::string LoomBackend::describe(loomResult_t r, const std::string& message,
                                  const LoomWork& w) const {
  // A timeout says so in torch's words (" timeout "), as gloo's and NCCL's errors do.
  const std::string what = r == loomTimeout ? "failed (a timeout of the group)" : "failed";
  return "loom: rank " + std::to_string(getRank()) + ": " +
         c10d::opTypeToString(const_cast<LoomWork&>(w).retrieveOpType()) + " #" +
         std::to_string(w.getSequencenumber()) + " " + what + ": " + loomGetErrorString(r) + ": " +
         message;
}

// ---- The sparse lane ----

void LoomBackend::toSparseLane(std::function<void(bool run)> task) {
  std::lock_guard<std::mutex> lock(lane_->m);
  if (lane_->stopping) fail("the process group was shut down or aborted");
  if (!sparseWorker_.joinable())
    sparseWorker_ = startServed<LaneQueue>(lane_, [](const auto& lane) { sparseLoop(lane); });
  lane_->queue.push_back(std::move(task));
  lane_->cv.notify_all();
}

namespace {

// The next task of the lane (empty once it is stopping and every task has run), and whether to
// run it (else fail it).
std::function<void(bool)> nextTask(LaneQueue& lane, bool wait, bool* run) {
  std::unique_lock<std::mutex> lock(lane.m);
  if (wait) lane.cv.wait(lock, [&] { return lane.stopping || !lane.queue.empty(); });
  if (lane.queue.empty()) return nullptr;
  std::function<void(bool)> task = std::move(lane.queue.front());
  lane.queue.pop_front();
  *run = !lane.aborted;
  return task;
}

}  // namespace

void LoomBackend::sparseLoop(const std::shared_ptr<LaneQueue>& lane) {
  bool run = true;
  // Each task is freed after the lock (its tensors; see sweep).
  while (std::function<void(bool)> task = nextTask(*lane, true, &run)) task(run);
}

void LoomBackend::stopSparseLane(bool aborted) {
  {
    std::lock_guard<std::mutex> lock(lane_->m);
    lane_->stopping = true;
    lane_->aborted = lane_->aborted || aborted;
  }
  lane_->cv.notify_all();
  // On the lane's own thread (a task's future callback is ending the group), the tasks behind
  // that one run here, since the thread is not joined.
  if (sparseWorker_.joinable() && sparseWorker_.get_id() == std::this_thread::get_id()) {
    bool run = true;
    while (std::function<void(bool)> task = nextTask(*lane_, false, &run)) task(run);
  }
  if (aborted) {  // ends the running task's wait; its calls are never under way meanwhile
    std::lock_guard<std::mutex> lock(laneMutex_);
    const loomComm_t lane = sparseComm_.exchange(nullptr);
    if (lane != nullptr) (void)loomCommAbort(lane);
  }
  stopThread(sparseWorker_, lane_);
  const loomComm_t lane = sparseComm_.exchange(nullptr);
  if (lane != nullptr) (void)loomCommDestroy(lane);
}

loomConfig_t LoomBackend::configNamed(const char* name) const {
  loomConfig_t cfg = LOOM_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  cfg.timeoutMs = static_cast<int>(createdTimeoutMs_);
  cfg.commName = name;
  return cfg;
}

loomResult_t LoomBackend::shareId(const std::string& key, loomUniqueId* id,
                                  const std::function<bool()>& aborted, std::string* message) {
  try {
    if (getRank() == 0) {
      const loomResult_t r = loomGetUniqueId(id);
      if (r != loomSuccess) {
        *message = loomGetLastError(nullptr);
        return r;
      }
      const auto* p = reinterpret_cast<const uint8_t*>(id);
      store_->set(key, std::vector<uint8_t>(p, p + sizeof(*id)));
      return loomSuccess;
    }
    // In slices, so that an abort ends the wait.
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::milliseconds(createdTimeoutMs_);
    for (;;) {
      if (aborted && aborted()) {
        *message = "the process group was aborted";
        return loomRemoteError;
      }
      try {
        store_->wait({key}, std::chrono::milliseconds(100));
        break;
      } catch (const c10::Error&) {
        if (std::chrono::steady_clock::now() > deadline) {
          *message = "rank 0 did not publish " + key + " in the group's store within the timeout";
          return loomTimeout;
        }
      }
    }
    const std::vector<uint8_t> v = store_->get(key);
    if (v.size() != sizeof(*id)) {
      *message = "the store's " + key + " has " + std::to_string(v.size()) + " bytes";
      return loomInternalError;
    }
    std::memcpy(id, v.data(), sizeof(*id));
    return loomSuccess;
  } catch (const std::exception& e) {
    *message = std::string("the group's store: ") + e.what();
    return loomSystemError;
  }
}

loomResult_t LoomBackend::openSparseLane(std::string* message) {
  if (laneOpened_) {
    if (sparseComm_.load() != nullptr) return loomSuccess;
    *message = "the sparse lane was aborted or could not be opened";
    return loomRemoteError;
  }
  laneOpened_ = true;
  // A group whose communicator has failed (a peer died) cannot open the lane: say why at once,
  // rather than after the lane's rendezvous times out.
  loomResult_t failed = loomSuccess;
  if (loomCommGetAsyncError(comm_.load(), &failed) == loomSuccess && failed != loomSuccess &&
      failed != loomInProgress) {
    *message = std::string("the group's communicator has failed: ") + loomGetLastError(nullptr);
    return failed;
  }
  auto aborted = [this] { return sparseLaneAborted(); };
  loomUniqueId id;
  const loomResult_t shared = shareId("loom_sparse_lane_id", &id, aborted, message);
  if (shared != loomSuccess) return shared;
  loomConfig_t cfg = configNamed("torch sparse");
  loomComm_t lane = nullptr;
  {
    std::lock_guard<std::mutex> lock(laneMutex_);
    if (aborted()) {
      *message = "the process group was aborted";
      return loomRemoteError;
    }
    const loomResult_t r = loomCommInitRankConfig(&lane, getSize(), id, getRank(), &cfg);
    if (r != loomInProgress && r != loomSuccess) {
      *message = loomGetLastError(nullptr);
      return r;
    }
    sparseComm_ = lane;
  }
  const loomResult_t r = loomCommWaitTicket(lane, 1, -1);  // ticket 1: the initialisation
  if (r != loomSuccess)
    *message = std::string(
                   "joining the sparse lane's communicator (opened at the group's "
                   "first sparse all-reduce): ") +
               loomGetLastError(nullptr);
  return r;
}

loomResult_t LoomBackend::laneStep(const std::function<loomResult_t(loomComm_t)>& issue,
                                   std::string* message) {
  loomComm_t lane = nullptr;
  uint64_t ticket = 0;
  {
    std::lock_guard<std::mutex> lock(laneMutex_);
    lane = sparseComm_.load();
    if (lane == nullptr) {
      *message = "the process group was aborted";
      return loomRemoteError;
    }
    loomResult_t r = issue(lane);
    if (r == loomSuccess) return r;  // nothing was queued
    if (r == loomInProgress) r = loomCommLastTicket(lane, &ticket);
    if (r != loomSuccess) {
      *message = loomGetLastError(nullptr);
      return r;
    }
  }
  // Safe against an abort meanwhile: it then fails the operation (or refuses the handle).
  const loomResult_t r = loomCommWaitTicket(lane, ticket, -1);
  if (r != loomSuccess) *message = loomGetLastError(nullptr);
  return r;
}

// ---- Completion ----

void LoomBackend::completeInBackground(c10::intrusive_ptr<LoomWork> work) {
  Served<c10::intrusive_ptr<LoomWork>>& c = *completion_;
  std::lock_guard<std::mutex> lock(c.m);
  // Once shutdown() or abort() has begun, settleAll completes every work (and its future).
  if (c.stopping) return;
  if (!completer_.joinable()) {
    const loomComm_t comm = comm_;
    completer_ = startServed<Served<c10::intrusive_ptr<LoomWork>>>(
        completion_, [comm](const auto& c) { completionLoop(c, comm); });
  }
  c.queue.push_back(std::move(work));
  c.cv.notify_all();
}

void LoomBackend::completionLoop(const std::shared_ptr<Served<c10::intrusive_ptr<LoomWork>>>& c,
                                 loomComm_t comm) {
  std::deque<c10::intrusive_ptr<LoomWork>>& pending = c->queue;
  for (;;) {
    // Declared before the lock, so that works are freed after it (see sweep).
    std::vector<c10::intrusive_ptr<LoomWork>> done;
    c10::intrusive_ptr<LoomWork> w;
    {
      std::unique_lock<std::mutex> lock(c->m);
      c->cv.wait(lock, [&] { return c->stopping || !pending.empty(); });
      if (c->stopping) {  // shutdown and abort have settled the works; the communicator may be gone
        done.assign(pending.begin(), pending.end());
        pending.clear();
        lock.unlock();
        for (const auto& x : done)
          x->complete(loomRemoteError,
                      "the process group was shut down before the operation ended");
        return;
      }
      // Works completed elsewhere (wait(), the sweep, settleAll) leave the queue.
      for (auto it = pending.begin(); it != pending.end();) {
        if ((*it)->settled()) {
          done.push_back(std::move(*it));
          it = pending.erase(it);
        } else {
          ++it;
        }
      }
      if (pending.empty()) continue;
      w = pending.front();
    }
    // Operations finish in ticket order, each bounded by the group's timeout, except receives,
    // which may finish after operations queued later: behind a waiting receive the others are
    // polled. The slices let shutdown end this thread.
    const loomResult_t r = loomCommWaitTicket(comm, w->ticket(), w->isReceive() ? 2 : 200);
    if (r != loomInProgress) {
      w->completeFrom(r);
      continue;
    }
    std::vector<c10::intrusive_ptr<LoomWork>> rest;
    {
      std::lock_guard<std::mutex> lock(c->m);
      if (w->isReceive() && !c->stopping) rest.assign(pending.begin() + 1, pending.end());
    }
    for (const auto& x : rest) {
      const loomResult_t rx = loomCommWaitTicket(comm, x->ticket(), 0);
      if (rx != loomInProgress) x->completeFrom(rx);
    }
  }
}

// ---- Issuing ----

c10::intrusive_ptr<c10d::Work> LoomBackend::enqueue(c10d::OpType type,
                                                    std::vector<at::Tensor> outputs,
                                                    const std::function<void()>& issue,
                                                    std::function<void()> epilogue,
                                                    std::vector<at::Tensor> keep) {
  if (comm_ == nullptr) fail("the process group was shut down or aborted");
  // Finished works go first: once the operation is queued, a wait() that comes at once runs it
  // itself (without a hand-over to Loom's thread), so nothing should come in between.
  sweep();
  auto w = c10::make_intrusive<LoomWork>(this, type, std::move(outputs), std::move(epilogue),
                                         std::move(keep));
  // The first Loom operation of this one carries the group's sequence number into Loom's
  // flight recorder, so that loom-trace names operations as torch numbers them.
  if (!coalescing_) check(loomCommSetOpTag(comm_, seq_ + 1), "loomCommSetOpTag");
  try {
    issue();
  } catch (...) {
    // Loom refused one of this operation's calls. In a coalesced block the block's group then
    // runs none of its calls (endCoalescing fails every operation of the block); an operation
    // of several calls outside a group may have queued the calls before the refused one: the
    // tensors stay held until they have run.
    if (coalescing_) {
      coalesced_.push_back(w);
      try {
        (void)endCoalescing();
      } catch (...) {
      }
    } else {
      uint64_t now = 0;
      if (loomCommLastTicket(comm_, &now) == loomSuccess && now != lastTicket_) {
        lastTicket_ = now;
        w->setTicket(now, ++seq_);
        track(w);
      }
    }
    throw;
  }
  if (coalescing_) {
    coalesced_.push_back(w);
    return w;
  }
  w->setTicket(queuedTicket(), ++seq_);
  track(w);
  return w;
}

uint64_t LoomBackend::queuedTicket() {
  const uint64_t before = lastTicket_;
  if (loomCommLastTicket(comm_, &lastTicket_) != loomSuccess) {
    lastTicket_ = before;
    fail(std::string("loomCommLastTicket: ") + loomGetLastError(nullptr));
  }
  return lastTicket_;
}

void LoomBackend::startCoalescing() {
  if (coalescing_) fail("startCoalescing: already coalescing");
  check(loomGroupStart(), "loomGroupStart");
  check(loomCommSetOpTag(comm_, seq_ + 1), "loomCommSetOpTag");  // the block's number
  coalescing_ = true;
}

c10::intrusive_ptr<c10d::Work> LoomBackend::endCoalescing() {
  if (!coalescing_) fail("endCoalescing: not coalescing");
  coalescing_ = false;
  std::vector<c10::intrusive_ptr<LoomWork>> works;
  works.swap(coalesced_);
  const loomResult_t ended = loomGroupEnd();
  if (ended != loomSuccess && ended != loomInProgress) {
    // A call of the block was refused, so Loom ran none of the block's calls: each operation
    // fails with that refusal (none is left waiting for a ticket it will never get).
    const std::string why = loomGetLastError(nullptr);
    for (auto& w : works) (void)w->complete(ended, why);
    fail("loomGroupEnd: " + why);
  }
  const uint64_t ticket = queuedTicket();
  const uint64_t seq = ++seq_;
  std::vector<at::Tensor> outputs;
  for (auto& w : works) {
    w->setTicket(ticket, seq);
    for (const at::Tensor& t : w->result()) outputs.push_back(t);
  }
  // The block's own work settles the others with its result (their copy-outs, their futures).
  auto all = c10::make_intrusive<LoomWork>(this, c10d::OpType::COALESCED, std::move(outputs),
                                           nullptr, std::vector<at::Tensor>{});
  all->setMembers(std::move(works));
  all->setTicket(ticket, seq);
  track(all);
  return all;
}

loomRedOp_t LoomBackend::redOp(const c10d::ReduceOp& op, const at::Tensor& t) {
  const bool isBool = t.scalar_type() == at::kBool;
  // A complex tensor reduces as its parts: sums (and averages, and scaled sums) only.
  if (t.is_complex() && op.op_ != c10d::ReduceOp::SUM && op.op_ != c10d::ReduceOp::AVG &&
      op.op_ != c10d::ReduceOp::PREMUL_SUM)
    fail("op: " + std::to_string(static_cast<int>(op.op_)) + " of " +
         c10::toString(t.scalar_type()) +
         " tensors (complex tensors reduce by SUM, AVG and "
         "PREMUL_SUM only)");
  switch (op.op_) {
    case c10d::ReduceOp::SUM:
      return isBool ? loomMax : loomSum;  // bool: sum is "any"
    case c10d::ReduceOp::PRODUCT:
      return isBool ? loomMin : loomProd;
    case c10d::ReduceOp::MIN:
      return loomMin;
    case c10d::ReduceOp::MAX:
      return loomMax;
    case c10d::ReduceOp::AVG:
      if (isBool) fail("op: AVG of bool tensors");
      return loomAvg;
    case c10d::ReduceOp::PREMUL_SUM: {
      const auto* s = dynamic_cast<const c10d::PreMulSumSupplement*>(op.supplement_.get());
      if (s == nullptr) fail("op: PREMUL_SUM without its factor");
      if (!at::isFloatingType(t.scalar_type()) && !t.is_complex())
        fail(std::string("op: PREMUL_SUM of ") + c10::toString(t.scalar_type()) +
             " tensors (it scales floating-point and complex tensors only)");
      if (s->tensor_factor.defined() && s->tensor_factor.is_complex())
        fail("op: PREMUL_SUM with a complex factor (the loom backend scales by real factors)");
      const double f =
          s->tensor_factor.defined() ? s->tensor_factor.item<double>() : s->double_factor;
      const loomDataType_t dt = reduceType(t);
      // Keyed by the factor's bits: a NaN factor would compare equal to every key.
      uint64_t bits = 0;
      std::memcpy(&bits, &f, sizeof(bits));
      auto key = std::make_pair(static_cast<int>(dt), bits);
      auto it = premul_.find(key);
      if (it != premul_.end()) return it->second;
      // A factor that changes every call would grow the cache without bound. Loom copies an
      // operation into each call that takes it, so the cached ones may go at any time.
      if (premul_.size() >= 64) {
        for (const auto& kv : premul_) (void)loomRedOpDestroy(kv.second, comm_);
        premul_.clear();
      }
      // The factor in the tensor's own (real) type.
      at::Tensor scalar =
          at::scalar_tensor(f, at::TensorOptions().dtype(c10::toRealValueType(t.scalar_type())));
      loomRedOp_t made;
      check(loomRedOpCreatePreMulSum(&made, scalar.data_ptr(), dt, loomScalarHostImmediate, comm_),
            "loomRedOpCreatePreMulSum");
      premul_[key] = made;
      return made;
    }
    case c10d::ReduceOp::BAND:
    case c10d::ReduceOp::BOR:
    case c10d::ReduceOp::BXOR: {
      static const char* const kNames[] = {"BAND", "BOR", "BXOR"};
      const int i = op.op_ == c10d::ReduceOp::BAND ? 0 : op.op_ == c10d::ReduceOp::BOR ? 1 : 2;
      if (!at::isIntegralType(t.scalar_type(), /*includeBool=*/true))
        fail(std::string("op: ") + kNames[i] + " of " + c10::toString(t.scalar_type()) +
             " tensors (bitwise operations take integer and bool tensors)");
      const loomRedOp_t ops[] = {loomBand, loomBor, loomBxor};
      return ops[i];
    }
    default:
      fail("op: " + std::to_string(static_cast<int>(op.op_)) +
           " is not supported by the loom backend");
  }
}

}  // namespace loom::torchext
