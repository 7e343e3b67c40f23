// Non-blocking communicators (config blocking = 0): one worker thread per
// communicator runs its initialisation, then its operations, in call order.
//
// Contract. post() queues a task, numbers it with a ticket (1, 2, ... in queue
// order) and returns at once; the C call that posted it returns loomInProgress.
// Tasks run one at a time, in ticket order, so "ticket t is done" means every
// earlier one is too, except kept operations (below), which end after their
// task. A thread in wait(t) for as long as the communicator's
// timeout runs the next task itself when nothing runs yet, so a caller that
// waits at once pays no hand-over to another thread. The worker thread runs
// every task nobody waits for: it takes a task once it has been queued for
// kGraceNs (the caller's own wait usually comes sooner). post() wakes it with a
// system call only when it ran the last task itself (its callers do not wait
// at once) or has slept since kIdleNs without a post; otherwise, while
// callers run their own tasks, it looks every kPollNs. So an operation nobody
// waits for starts within kGraceNs, or kPollNs after a caller stops waiting
// at once; a wait that will not run its task itself (a bounded wait, a test)
// wakes the worker to take it at once. wait(t) returns task t's own result (kept for every failed
// task until the worker is destroyed), or loomInProgress once its deadline
// passes. busy() is true while a task is queued, running or kept (below); error() is the
// first task's failure (later tasks still run: each one checks the
// communicator's stored error first, as a blocking call would). close() takes
// no more tasks and either leaves the queue to run at once (drop = false:
// loomCommDestroy) or drops it (drop = true: loomCommAbort; each dropped
// task's result is loomRemoteError). An abort calls close(true) before it
// raises the communicator's abort flag, so a task queued behind the running
// one is dropped, never started and failed by the flag. stop() closes, then
// joins the thread and waits for every waiter to leave. Every task is bounded
// by the communicator's timeout, so stop() never waits forever. Threads that
// wait for a result sleep on their own condition variable, signalled only
// while one sleeps there.
//
// Thread safety: every member may be called from any thread. Lock order:
// the API's registry mutex, then this worker's mutex; a task never runs with
// the worker's mutex held. A thread that calls wait() must hold a reference
// taken under the registry's mutex (enterWait), so that stop() outlives it.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <thread>

#include "util/status.h"

namespace loom::api {

class AsyncWorker {
 public:
  explicit AsyncWorker(int rank);
  ~AsyncWorker();
  AsyncWorker(const AsyncWorker&) = delete;
  AsyncWorker& operator=(const AsyncWorker&) = delete;

  // Queues task; returns its ticket.
  uint64_t post(std::function<Status()> task);
  // The ticket of the last task posted (0: none).
  uint64_t lastTicket() const { return posted_.load(std::memory_order_acquire); }
  bool busy() const;
  Status error() const;
  // Blocks until no task is queued or running, or deadlineNs (CLOCK_MONOTONIC) passes.
  bool waitIdle(int64_t deadlineNs) const;
  // Registers a waiter (under the registry's mutex); wait() unregisters it.
  void enterWait();
  // Task `ticket`'s result once it is done; Status(loomInProgress) if deadlineNs (nowNs())
  // passes first. Spins briefly before it blocks. With mayRun (a wait as long as the
  // communicator's timeout, which bounds every task), it runs the tasks up to `ticket` that
  // the worker has not taken. Leaves the wait entered by enterWait().
  Status wait(uint64_t ticket, int64_t deadlineNs, bool mayRun);
  // Kept operations: a task whose operation goes on after it returns (a tagged receive still
  // waiting for its message, kept by the communicator's inbox) calls keepCurrent() while it
  // runs; its ticket is then done only once finishKept(ticket, result) is called, while the
  // tasks after it run. progress (set by such a task, before it returns) moves kept work: one
  // look when untilNs has passed, else waiting for news until then. The worker calls it every
  // kPollNs while kept work remains; a thread in wait() (mayRun) for a kept ticket runs the
  // queued tasks first (the message may answer one of them), then calls it.
  static bool inTask();
  // Keeps `parts` pieces of the running task's operation (each finished by one finishKept);
  // returns its ticket.
  static uint64_t keepCurrent(int parts);
  void finishKept(uint64_t ticket, const Status& result);
  void setProgress(std::function<void(int64_t untilNs)> progress);
  // Takes no more tasks; drop: the queued ones fail with loomRemoteError and never run.
  void close(bool drop);
  // close(drop), then joins the worker thread and waits for every waiter to leave.
  void stop(bool drop);

 private:
  // See the contract: how long a task waits for its caller, how often a busy worker looks,
  // and how long without a post before it sleeps until the next one.
  static constexpr int64_t kGraceNs = 20000;
  static constexpr int64_t kPollNs = 200000;
  static constexpr int64_t kIdleNs = 2000000;

  struct Task {
    uint64_t ticket;
    int64_t postNs;  // nowNs() when queued
    std::function<Status()> run;
  };
  void run(int rank);
  // Runs task (popped from the queue under lock) with the lock released, then records its
  // result. The worker runs tasks (byWorker), and so does a thread waiting for one that nothing
  // runs yet.
  void runTask(Task& task, std::unique_lock<std::mutex>& lock, bool byWorker);
  // Under m_: marks every ticket up to the first still queued as done.
  void advanceDone();
  // Under m_: whether ticket's operation has ended (ran, and is not kept).
  bool isDone(uint64_t ticket) const {
    return done_.load(std::memory_order_relaxed) >= ticket && kept_.count(ticket) == 0;
  }
  // Under m_ (held by lock): sleeps on doneCv_ until woken or deadlineNs; wakeSleepers() wakes
  // every such sleeper (a no-op when there is none).
  void sleepUntil(std::unique_lock<std::mutex>& lock, int64_t deadlineNs) const;
  void wakeSleepers() const;

  mutable std::mutex m_;
  mutable std::condition_variable doneCv_;  // a task finished, a waiter left, a close
  std::condition_variable workCv_;          // the worker's: a post while it is idle, a close
  std::deque<Task> queue_;
  bool running_ = false;
  bool stopping_ = false;
  // How the worker sleeps: not (Awake), until the queued task's grace ends (Due), for kPollNs
  // with nothing queued (Polling), or until post() or close() wakes it (Idle).
  enum class Sleep { Awake, Due, Polling, Idle };
  Sleep sleep_ = Sleep::Awake;
  bool workerRanLast_ = false;  // the last task finished ran on the worker thread
  uint64_t urgentUpTo_ = 0;     // tasks up to this ticket have a waiter that will not run them
  int64_t lastPostNs_ = 0;
  int waiters_ = 0;
  mutable int sleepers_ = 0;  // threads asleep on doneCv_
  Status error_;
  std::map<uint64_t, Status> failed_;  // results of the tasks that failed (or were dropped)
  std::map<uint64_t, int> kept_;       // tickets whose operation goes on: its parts left
  std::function<void(int64_t)> progress_;
  std::atomic<uint64_t> posted_{0};  // written under m_
  std::atomic<uint64_t> done_{0};    // tickets <= done_ are finished; written under m_
  std::thread thread_;
};

// The result code of a call that queued work on a non-blocking communicator.
inline Status inProgress() { return Status(loomInProgress, ""); }

}  // namespace loom::api
