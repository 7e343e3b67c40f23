#include "api/async.h"

#include <sys/prctl.h>

#include <chrono>

#include "util/log.h"
#include "util/wait.h"

namespace loom::api {

namespace {
// How long wait() polls the done counter before it blocks: a short operation's completion is
// then seen without a futex wake-up, and a long one costs a waiting thread little.
constexpr int64_t kWaitSpinNs = 20000;
// The worker's timer slack: its timed sleeps end within this of their deadline (the kernel's
// default of 50 us would double kPollNs).
constexpr unsigned long kWorkerTimerSlackNs = 5000;
// The task this thread runs (runTask), for keepCurrent().
struct Current {
  AsyncWorker* worker = nullptr;
  uint64_t ticket = 0;
};
thread_local Current tCurrent;
}  // namespace

bool AsyncWorker::inTask() { return tCurrent.worker != nullptr; }

uint64_t AsyncWorker::keepCurrent(int parts) {
  AsyncWorker* w = tCurrent.worker;
  std::lock_guard<std::mutex> lock(w->m_);
  w->kept_[tCurrent.ticket] += parts;
  return tCurrent.ticket;
}

void AsyncWorker::finishKept(uint64_t ticket, const Status& result) {
  std::lock_guard<std::mutex> lock(m_);
  auto it = kept_.find(ticket);
  if (it == kept_.end()) return;  // dropped by an abort meanwhile
  if (!result.isOk()) {
    if (error_.isOk()) error_ = result;
    failed_.emplace(ticket, result);  // the operation's first failure
  }
  if (--it->second > 0) return;  // another part of the operation still waits
  kept_.erase(it);
  wakeSleepers();
}

void AsyncWorker::setProgress(std::function<void(int64_t untilNs)> progress) {
  std::lock_guard<std::mutex> lock(m_);
  if (!progress_) progress_ = std::move(progress);
}

AsyncWorker::AsyncWorker(int rank) : thread_([this, rank] { run(rank); }) {}

AsyncWorker::~AsyncWorker() { stop(true); }

uint64_t AsyncWorker::post(std::function<Status()> task) {
  std::lock_guard<std::mutex> lock(m_);
  const uint64_t ticket = posted_.load(std::memory_order_relaxed) + 1;
  posted_.store(ticket, std::memory_order_release);
  if (stopping_) {  // the worker has gone: the task will never run
    failed_[ticket] = LOOM_ERROR(loomInvalidUsage, "operation queued after the worker stopped");
    advanceDone();
    wakeSleepers();
    return ticket;
  }
  const int64_t now = nowNs();
  queue_.push_back({ticket, now, std::move(task)});
  lastPostNs_ = now;
  // While callers run their own tasks (the last one finished ran on a waiting thread), a worker
  // in its timed sleeps finds the task on its next look; it is woken at once only when it ran
  // the last task itself (callers that do not wait at once) or sleeps without a deadline (idle
  // for kIdleNs).
  if (sleep_ == Sleep::Idle || (sleep_ == Sleep::Polling && workerRanLast_)) {
    sleep_ = Sleep::Awake;
    workCv_.notify_one();
  }
  return ticket;
}

bool AsyncWorker::busy() const {
  std::lock_guard<std::mutex> lock(m_);
  return running_ || !queue_.empty() || !kept_.empty();
}

Status AsyncWorker::error() const {
  std::lock_guard<std::mutex> lock(m_);
  return error_;
}

void AsyncWorker::sleepUntil(std::unique_lock<std::mutex>& lock, int64_t deadlineNs) const {
  const int64_t left = deadlineNs - nowNs();
  if (left <= 0) return;
  ++sleepers_;
  doneCv_.wait_for(lock, std::chrono::nanoseconds(std::min<int64_t>(left, 100000000)));
  --sleepers_;
}

void AsyncWorker::wakeSleepers() const {
  if (sleepers_ > 0) doneCv_.notify_all();
}

bool AsyncWorker::waitIdle(int64_t deadlineNs) const {
  std::unique_lock<std::mutex> lock(m_);
  while (running_ || !queue_.empty() || !kept_.empty()) {
    if (deadlineNs - nowNs() <= 0) return false;
    sleepUntil(lock, deadlineNs);
  }
  return true;
}

void AsyncWorker::enterWait() {
  std::lock_guard<std::mutex> lock(m_);
  ++waiters_;
}

Status AsyncWorker::wait(uint64_t ticket, int64_t deadlineNs, bool mayRun) {
  const int64_t spinUntil = std::min(deadlineNs, nowNs() + kWaitSpinNs);
  std::unique_lock<std::mutex> lock(m_);
  while (!isDone(ticket)) {
    const bool kept = done_.load(std::memory_order_relaxed) >= ticket;
    // The waiting thread runs the task itself when the worker has not taken it yet (it is next,
    // and nothing runs): a caller that waits at once pays no hand-over to the worker thread.
    // Waiting for a kept operation, it runs whatever is queued, then moves the kept work.
    if (mayRun && !running_ && !stopping_ && !queue_.empty() &&
        (kept || queue_.front().ticket <= ticket)) {
      Task task = std::move(queue_.front());
      queue_.pop_front();
      runTask(task, lock, false);
      continue;
    }
    if (mayRun && kept && progress_ && deadlineNs > nowNs()) {
      std::function<void(int64_t)> progress = progress_;
      lock.unlock();
      progress(std::min(deadlineNs, nowNs() + kPollNs));
      lock.lock();
      continue;
    }
    // A caller that will not run the task (a bounded wait, a test) has the worker take it now,
    // without its grace.
    if (!mayRun && !running_ && !queue_.empty() && queue_.front().ticket <= ticket &&
        urgentUpTo_ < ticket) {
      urgentUpTo_ = ticket;
      if (sleep_ != Sleep::Awake) {
        sleep_ = Sleep::Awake;
        workCv_.notify_one();
      }
    }
    if (nowNs() < spinUntil) {
      lock.unlock();
      while (done_.load(std::memory_order_acquire) < ticket && nowNs() < spinUntil) cpuRelax();
      lock.lock();
      continue;
    }
    if (deadlineNs - nowNs() <= 0) break;
    sleepUntil(lock, deadlineNs);
  }
  Status s;
  if (!isDone(ticket)) {
    s = inProgress();
  } else {
    auto it = failed_.find(ticket);
    if (it != failed_.end()) s = it->second;
  }
  if (--waiters_ == 0) wakeSleepers();  // stop() may be waiting for the last waiter
  return s;
}

void AsyncWorker::runTask(Task& task, std::unique_lock<std::mutex>& lock, bool byWorker) {
  running_ = true;
  lock.unlock();
  Status s;
  tCurrent = {this, task.ticket};
  try {
    s = task.run();
  } catch (const std::exception& e) {
    s = LOOM_ERROR(loomInternalError, std::string("internal error: ") + e.what());
  } catch (...) {
    s = LOOM_ERROR(loomInternalError, "internal error (unknown exception)");
  }
  tCurrent = {};
  task.run = nullptr;
  lock.lock();
  running_ = false;
  workerRanLast_ = byWorker;
  if (!s.isOk()) {
    if (error_.isOk()) error_ = s;
    failed_[task.ticket] = s;
  }
  advanceDone();
  wakeSleepers();
}

void AsyncWorker::advanceDone() {
  done_.store(queue_.empty() ? posted_.load(std::memory_order_relaxed) : queue_.front().ticket - 1,
              std::memory_order_release);
}

void AsyncWorker::close(bool drop) {
  std::lock_guard<std::mutex> lock(m_);
  stopping_ = true;
  if (drop) {
    for (const Task& t : queue_)
      failed_[t.ticket] = LOOM_ERROR(loomRemoteError,
                                     "operation dropped: the communicator was "
                                     "aborted before it ran");
    queue_.clear();
    for (const auto& [t, parts] : kept_)
      failed_[t] = LOOM_ERROR(loomRemoteError,
                              "operation dropped: the communicator was aborted while its "
                              "receive waited for its message");
    kept_.clear();
    if (!running_) advanceDone();
  }
  sleep_ = Sleep::Awake;
  workCv_.notify_all();
  wakeSleepers();
}

void AsyncWorker::stop(bool drop) {
  close(drop);
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
  std::unique_lock<std::mutex> lock(m_);
  while (waiters_ != 0) sleepUntil(lock, nowNs() + 100000000);
}

void AsyncWorker::run(int rank) {
  log::setThreadRank(rank);
  (void)prctl(PR_SET_TIMERSLACK, kWorkerTimerSlackNs, 0, 0, 0);
  std::unique_lock<std::mutex> lock(m_);
  for (;;) {
    const int64_t now = nowNs();
    if (!running_ && !queue_.empty()) {
      // A task waits kGraceNs for its caller's wait() to run it; once closing, none waits.
      const int64_t due = queue_.front().postNs + kGraceNs;
      if (stopping_ || now >= due || queue_.front().ticket <= urgentUpTo_) {
        Task task = std::move(queue_.front());
        queue_.pop_front();
        runTask(task, lock, true);
        continue;
      }
      sleep_ = Sleep::Due;
      workCv_.wait_for(lock, std::chrono::nanoseconds(due - now));
    } else if (stopping_ && queue_.empty() && kept_.empty()) {
      return;
    } else if (!kept_.empty() && progress_) {
      // Kept operations: one look now and then (a waiter moves them faster), the core given up
      // between looks.
      if (!running_) {
        std::function<void(int64_t)> progress = progress_;
        lock.unlock();
        progress(nowNs());
        lock.lock();
      }
      if (!kept_.empty() && (running_ || queue_.empty())) {
        sleep_ = Sleep::Polling;
        workCv_.wait_for(lock, std::chrono::nanoseconds(kPollNs));
      }
    } else if (running_ || now - lastPostNs_ < kIdleNs) {  // busy: look again in kPollNs
      sleep_ = Sleep::Polling;
      workCv_.wait_for(lock, std::chrono::nanoseconds(kPollNs));
    } else {
      sleep_ = Sleep::Idle;  // until post() or close() sets Awake
      workCv_.wait(lock, [this] { return sleep_ == Sleep::Awake; });
    }
    sleep_ = Sleep::Awake;
  }
}

}  // namespace loom::api
