// Non-blocking communicators (config blocking = 0): one worker thread per
// communicator runs its initialisation, then its operations, in call order.
//
// Contract. post() queues a task and returns at once; the C call that posted
// it returns loomInProgress. busy() is true while a task is queued or running;
// error() is the first task's failure (later tasks still run: each one checks
// the communicator's stored error first, as a blocking call would). stop()
// runs what is queued (drop = false: loomCommDestroy) or drops it (drop =
// true: loomCommAbort, whose abort flag ends the running task within a wait's
// polling interval), then joins the thread. Every task is bounded by the
// communicator's timeout, so stop() never waits forever.
//
// Thread safety: every member may be called from any thread. Lock order:
// the API's registry mutex, then this worker's mutex; a task never runs with
// the worker's mutex held.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
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

  void post(std::function<Status()> task);
  bool busy() const;
  Status error() const;
  // Blocks until no task is queued or running, or deadlineNs (CLOCK_MONOTONIC) passes.
  bool waitIdle(int64_t deadlineNs) const;
  void stop(bool drop);

 private:
  void run(int rank);

  mutable std::mutex m_;
  mutable std::condition_variable cv_;
  std::deque<std::function<Status()>> queue_;
  bool running_ = false;
  bool stopping_ = false;
  Status error_;
  std::thread thread_;
};

// The result code of a call that queued work on a non-blocking communicator.
inline Status inProgress() { return Status(loomInProgress, ""); }

}  // namespace loom::api
