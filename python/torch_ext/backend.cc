#include "backend.h"

#include <algorithm>
#include <cstring>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include "util.h"

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
  std::unique_lock<std::mutex> lock(mutex_);
  if (completed_) return exception_;
  if (r == loomSuccess) {
    try {
      if (epilogue_) epilogue_();
    } catch (...) {
      exception_ = std::current_exception();
    }
  } else {
    exception_ = backendError(backend_->describe(r, message, *this));
  }
  completed_ = true;
  epilogue_ = nullptr;
  keep_.clear();
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
  complete(r, r == loomSuccess ? "" : loomGetLastError(nullptr));
  return true;
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
  if (ticket_ == 0) fail("wait(): the operation is still inside a coalescing block");
  // kNoTimeout: the group's, which is its communicator's (-1: the waiting thread may then run
  // the operation itself if Loom's thread has not taken it yet).
  const bool groupTimeout = timeout.count() <= 0;
  const int64_t ms = groupTimeout ? backend_->timeout().count() : timeout.count();
  const loomResult_t r =
      loomCommWaitTicket(backend_->comm(), ticket_,
                         groupTimeout ? -1 : static_cast<int>(std::min<int64_t>(ms, INT32_MAX)));
  if (r == loomInProgress)
    std::rethrow_exception(backendError("loom: rank " + std::to_string(backend_->getRank()) + ": " +
                                        c10d::opTypeToString(retrieveOpType()) + " #" +
                                        std::to_string(seq_) + " did not finish: timeout after " +
                                        std::to_string(ms) +
                                        " ms (a peer is late, stalled or dead)"));
  const std::exception_ptr e = complete(r, r == loomSuccess ? "" : loomGetLastError(nullptr));
  if (e) std::rethrow_exception(e);
  return true;
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
  backend_->completeInBackground(c10::intrusive_ptr<LoomWork>::reclaim_copy(this));
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
    : c10d::Backend(rank, size), timeout_(timeout) {
  const std::string key = "loom_unique_id";
  loomUniqueId id;
  if (rank == 0) {
    check(loomGetUniqueId(&id), "loomGetUniqueId");
    const auto* p = reinterpret_cast<const uint8_t*>(&id);
    store->set(key, std::vector<uint8_t>(p, p + sizeof(id)));
  } else {
    const std::vector<uint8_t> v = store->get(key);
    if (v.size() != sizeof(id))
      fail("the store's unique id has " + std::to_string(v.size()) + " bytes");
    std::memcpy(&id, v.data(), sizeof(id));
  }
  loomConfig_t cfg = LOOM_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  cfg.timeoutMs = static_cast<int>(std::min<int64_t>(timeout.count(), INT32_MAX));
  cfg.commName = "torch";
  check(loomCommInitRankConfig(&comm_, size, id, rank, &cfg), "loomCommInitRankConfig");
  const loomResult_t r = loomCommWaitTicket(comm_, 1, -1);  // ticket 1: the initialisation
  if (r != loomSuccess) {
    const std::string text = loomGetLastError(nullptr);
    (void)loomCommAbort(comm_);
    comm_ = nullptr;
    fail("rank " + std::to_string(rank) + ": joining the group of " + std::to_string(size) +
         " failed: " + loomGetErrorString(r) + ": " + text);
  }
}

LoomBackend::~LoomBackend() { shutdown(); }

void LoomBackend::stopCompletion() {
  {
    std::lock_guard<std::mutex> lock(cm_);
    stopping_ = true;
  }
  ccv_.notify_all();
  if (completer_.joinable()) completer_.join();
}

void LoomBackend::shutdown() {
  stopCompletion();
  if (comm_ == nullptr) return;
  for (const auto& kv : premul_) (void)loomRedOpDestroy(kv.second, comm_);
  premul_.clear();
  (void)loomCommDestroy(comm_);  // runs what is queued first (each operation is bounded)
  comm_ = nullptr;
}

void LoomBackend::abort() {
  stopCompletion();
  if (comm_ == nullptr) return;
  (void)loomCommAbort(comm_);
  comm_ = nullptr;
}

c10::intrusive_ptr<c10d::Backend> LoomBackend::split(const c10::intrusive_ptr<c10d::Store>& store,
                                                     const std::vector<int>& ranks,
                                                     const c10::intrusive_ptr<Options>& opts) {
  auto it = std::find(ranks.begin(), ranks.end(), getRank());
  if (it == ranks.end()) return nullptr;
  const auto timeout = opts ? opts->timeout : timeout_;
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

// ---- Completion ----

void LoomBackend::completeInBackground(c10::intrusive_ptr<LoomWork> work) {
  std::lock_guard<std::mutex> lock(cm_);
  if (!completer_.joinable() && !stopping_) completer_ = std::thread([this] { completionLoop(); });
  pending_.push_back(std::move(work));
  ccv_.notify_all();
}

void LoomBackend::completionLoop() {
  for (;;) {
    c10::intrusive_ptr<LoomWork> w;
    {
      std::unique_lock<std::mutex> lock(cm_);
      ccv_.wait(lock, [this] { return stopping_ || !pending_.empty(); });
      if (pending_.empty()) return;
      w = pending_.front();
      pending_.pop_front();
    }
    // Operations finish in ticket order, each bounded by the group's timeout; the slices let
    // shutdown end this thread.
    loomResult_t r = loomInProgress;
    for (;;) {
      r = loomCommWaitTicket(comm_, w->ticket(), 200);
      if (r != loomInProgress) break;
      std::lock_guard<std::mutex> lock(cm_);
      if (stopping_) break;
    }
    if (r == loomInProgress)
      w->complete(loomRemoteError, "the process group was shut down before the operation ended");
    else
      w->complete(r, r == loomSuccess ? "" : loomGetLastError(nullptr));
  }
}

// ---- Issuing ----

c10::intrusive_ptr<c10d::Work> LoomBackend::enqueue(c10d::OpType type,
                                                    std::vector<at::Tensor> outputs,
                                                    const std::function<void()>& issue,
                                                    std::function<void()> epilogue,
                                                    std::vector<at::Tensor> keep) {
  if (comm_ == nullptr) fail("the process group was shut down or aborted");
  auto w = c10::make_intrusive<LoomWork>(this, type, std::move(outputs), std::move(epilogue),
                                         std::move(keep));
  // The first Loom operation of this one carries the group's sequence number into Loom's
  // flight recorder, so that loom-trace names operations as torch numbers them.
  if (!coalescing_) check(loomCommSetOpTag(comm_, seq_ + 1), "loomCommSetOpTag");
  issue();
  if (coalescing_) {
    coalesced_.push_back(w);
    return w;
  }
  uint64_t ticket = 0;
  check(loomCommLastTicket(comm_, &ticket), "loomCommLastTicket");
  w->setTicket(ticket, ++seq_);
  return w;
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
  check(loomGroupEnd(), "loomGroupEnd");
  uint64_t ticket = 0;
  check(loomCommLastTicket(comm_, &ticket), "loomCommLastTicket");
  const uint64_t seq = ++seq_;
  std::vector<at::Tensor> outputs;
  for (auto& w : works) {
    w->setTicket(ticket, seq);
    for (const at::Tensor& t : w->result()) outputs.push_back(t);
  }
  // The block's own work completes the others' epilogues too.
  auto all = c10::make_intrusive<LoomWork>(
      this, c10d::OpType::COALESCED, std::move(outputs),
      [works] {
        for (const auto& w : works) {
          const std::exception_ptr e = w->complete(loomSuccess, "");
          if (e) std::rethrow_exception(e);
        }
      },
      std::vector<at::Tensor>{});
  all->setTicket(ticket, seq);
  return all;
}

loomRedOp_t LoomBackend::redOp(const c10d::ReduceOp& op, const at::Tensor& t) {
  const bool isBool = t.scalar_type() == at::kBool;
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
      const double f =
          s->tensor_factor.defined() ? s->tensor_factor.item<double>() : s->double_factor;
      const loomDataType_t dt = reduceType(t);
      auto key = std::make_pair(static_cast<int>(dt), f);
      auto it = premul_.find(key);
      if (it != premul_.end()) return it->second;
      // The factor in the tensor's own type.
      at::Tensor scalar = at::scalar_tensor(f, at::TensorOptions().dtype(t.scalar_type()));
      loomRedOp_t made;
      check(loomRedOpCreatePreMulSum(&made, scalar.data_ptr(), dt, loomScalarHostImmediate, comm_),
            "loomRedOpCreatePreMulSum");
      premul_[key] = made;
      return made;
    }
    default:
      fail("op: " + std::to_string(static_cast<int>(op.op_)) +
           " (bitwise operations) is not supported by the loom backend");
  }
}

}  // namespace loom::torchext
