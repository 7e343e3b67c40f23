#include "api/async.h"

#include <chrono>

#include "util/log.h"
#include "util/wait.h"

namespace loom::api {

AsyncWorker::AsyncWorker(int rank) : thread_([this, rank] { run(rank); }) {}

AsyncWorker::~AsyncWorker() { stop(true); }

void AsyncWorker::post(std::function<Status()> task) {
  std::lock_guard<std::mutex> lock(m_);
  queue_.push_back(std::move(task));
  cv_.notify_all();
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

void AsyncWorker::stop(bool drop) {
  {
    std::lock_guard<std::mutex> lock(m_);
    stopping_ = true;
    if (drop) queue_.clear();
    cv_.notify_all();
  }
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
}

void AsyncWorker::run(int rank) {
  log::setThreadRank(rank);
  std::unique_lock<std::mutex> lock(m_);
  for (;;) {
    cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping, nothing left
    std::function<Status()> task = std::move(queue_.front());
    queue_.pop_front();
    running_ = true;
    lock.unlock();
    Status s;
    try {
      s = task();
    } catch (const std::exception& e) {
      s = LOOM_ERROR(loomInternalError, std::string("internal error: ") + e.what());
    } catch (...) {
      s = LOOM_ERROR(loomInternalError, "internal error (unknown exception)");
    }
    task = nullptr;
    lock.lock();
    running_ = false;
    if (!s.isOk() && error_.isOk()) error_ = s;
    cv_.notify_all();
  }
}

}  // namespace loom::api
