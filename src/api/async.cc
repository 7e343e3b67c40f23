#include "api/async.h"

#include <chrono>

#include "util/log.h"
#include "util/wait.h"

namespace loom::api {

namespace {
// How long wait() polls the done counter before it blocks: a short operation's completion is
// then seen without a futex wake-up, and a long one costs a waiting thread little.
constexpr int64_t kWaitSpinNs = 20000;
}  // namespace

AsyncWorker::AsyncWorker(int rank) : thread_([this, rank] { run(rank); }) {}

AsyncWorker::~AsyncWorker() { stop(true); }

uint64_t AsyncWorker::post(std::function<Status()> task) {
  std::lock_guard<std::mutex> lock(m_);
  const uint64_t ticket = posted_.load(std::memory_order_relaxed) + 1;
  posted_.store(ticket, std::memory_order_release);
  if (stopping_) {  // the worker has gone: the task will never run
    failed_[ticket] = LOOM_ERROR(loomInvalidUsage, "operation queued after the worker stopped");
    advanceDone();
    cv_.notify_all();
    return ticket;
  }
  queue_.push_back({ticket, std::move(task)});
  cv_.notify_all();
  return ticket;
}

bool AsyncWorker::busy() const {
  std::lock_guard<std::mutex> lock(m_);
  return running_ || !queue_.empty();
}

Status AsyncWorker::error() const {
  std::lock_guard<std::mutex> lock(m_);
  return error_;
}

bool AsyncWorker::waitIdle(int64_t deadlineNs) const {
  std::unique_lock<std::mutex> lock(m_);
  while (running_ || !queue_.empty()) {
    const int64_t left = deadlineNs - nowNs();
    if (left <= 0) return false;
    cv_.wait_for(lock, std::chrono::nanoseconds(std::min<int64_t>(left, 100000000)));
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
  while (done_.load(std::memory_order_relaxed) < ticket) {
    // The waiting thread runs the task itself when the worker has not taken it yet (it is next,
    // and nothing runs): a caller that waits at once pays no hand-over to the worker thread.
    if (mayRun && !running_ && !stopping_ && !queue_.empty() && queue_.front().ticket <= ticket) {
      Task task = std::move(queue_.front());
      queue_.pop_front();
      runTask(task, lock);
      continue;
    }
    if (nowNs() < spinUntil) {
      lock.unlock();
      while (done_.load(std::memory_order_acquire) < ticket && nowNs() < spinUntil) cpuRelax();
      lock.lock();
      continue;
    }
    const int64_t left = deadlineNs - nowNs();
    if (left <= 0) break;
    cv_.wait_for(lock, std::chrono::nanoseconds(std::min<int64_t>(left, 100000000)));
  }
  Status s;
  if (done_.load(std::memory_order_relaxed) < ticket) {
    s = inProgress();
  } else {
    auto it = failed_.find(ticket);
    if (it != failed_.end()) s = it->second;
  }
  if (--waiters_ == 0) cv_.notify_all();
  return s;
}

void AsyncWorker::runTask(Task& task, std::unique_lock<std::mutex>& lock) {
  running_ = true;
  lock.unlock();
  Status s;
  try {
    s = task.run();
  } catch (const std::exception& e) {
    s = LOOM_ERROR(loomInternalError, std::string("internal error: ") + e.what());
  } catch (...) {
    s = LOOM_ERROR(loomInternalError, "internal error (unknown exception)");
  }
  task.run = nullptr;
  lock.lock();
  running_ = false;
  if (!s.isOk()) {
    if (error_.isOk()) error_ = s;
    failed_[task.ticket] = s;
  }
  advanceDone();
  cv_.notify_all();
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
    if (!running_) advanceDone();
  }
  cv_.notify_all();
}

void AsyncWorker::stop(bool drop) {
  close(drop);
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
  std::unique_lock<std::mutex> lock(m_);
  cv_.wait(lock, [this] { return waiters_ == 0; });
}

void AsyncWorker::run(int rank) {
  log::setThreadRank(rank);
  std::unique_lock<std::mutex> lock(m_);
  for (;;) {
    cv_.wait(lock, [this] { return !running_ && (stopping_ || !queue_.empty()); });
    if (queue_.empty()) return;  // stopping, nothing left
    Task task = std::move(queue_.front());
    queue_.pop_front();
    runTask(task, lock);
  }
}

}  // namespace loom::api
