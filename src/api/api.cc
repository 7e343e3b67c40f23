// The C API: argument checks, communicator handles, and the guard that keeps
// every exception and failure inside a result code and a last-error text.
#include "api/api.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <mutex>
#include <new>
#include <thread>
#include <unordered_set>

#include "api/calibrate.h"
#include "api/device.h"
#include "bootstrap/unique_id.h"
#include "mem/mem.h"
#include "util/env.h"
#include "util/log.h"
#include "util/wait.h"

namespace loom::api {
namespace {

thread_local std::string tLastError;

std::mutex& registryMutex() {
  static std::mutex m;
  return m;
}
std::unordered_set<loomComm*>& registry() {
  static std::unordered_set<loomComm*> r;
  return r;
}
// Destroyed handles, emptied, whose memory is kept for the life of the process (loomComm).
std::vector<loomComm*>& retired() {
  static std::vector<loomComm*> r;
  return r;
}
constexpr std::chrono::microseconds kPinPoll{100};  // destroy's look at the calls in flight
// Bumped (under the registry's mutex) whenever a handle leaves the registry.
std::atomic<uint64_t> gRegistryEpoch{0};
void eraseFromRegistry(loomComm* c) {
  registry().erase(c);
  gRegistryEpoch.fetch_add(1, std::memory_order_release);
}
// The last handle this thread found live, and the epoch it was found in: while no handle has
// left the registry since, the same handle needs no lock (a call's fast path).
struct LookupCache {
  loomComm* handle = nullptr;
  Comm* comm = nullptr;
  uint64_t epoch = 0;
};
thread_local LookupCache tLookup;

std::string str(long long v) { return std::to_string(v); }

// Each check is an inline test that passes without touching a Status (the per-call account,
// docs/PERFORMANCE.md); the error's words are built out of line, only on failure.
[[gnu::cold, gnu::noinline]] Status badType(loomDataType_t dt) {
  return LOOM_ERROR(loomInvalidArgument,
                    "datatype: unknown data type " + str(static_cast<int>(dt)));
}

inline Status checkType(loomDataType_t dt) {
  if (kernels::validType(static_cast<int>(dt))) return Status::ok();
  return badType(dt);
}

// Also passes PreMulSum operations and the bitwise ones, out of checkOp's line.
[[gnu::cold, gnu::noinline]] Status badOp(Comm& comm, loomRedOp_t op, loomDataType_t dt) {
  const int v = static_cast<int>(op);
  if (kernels::isBitwiseOp(v)) {
    if (kernels::isIntegerType(dt)) return Status::ok();
    static const char* const kNames[] = {"loomBand", "loomBor", "loomBxor"};
    return LOOM_ERROR(loomInvalidArgument, std::string("op: ") + kNames[v - loomBand] +
                                               " applies to the integer types only (loomInt8 to "
                                               "loomUint64), not datatype " +
                                               str(static_cast<int>(dt)));
  }
  const size_t idx = static_cast<size_t>(v) - loomNumOps;
  if (v < 0 || idx >= comm.userOps().size() || !comm.userOps()[idx])
    return LOOM_ERROR(loomInvalidArgument, "op: unknown reduction operation " + str(v));
  if (comm.userOps()[idx]->dtype != dt)
    return LOOM_ERROR(loomInvalidArgument,
                      "op: PreMulSum operation " + str(v) + " was made for another datatype");
  return Status::ok();
}

inline Status checkOp(Comm& comm, loomRedOp_t op, loomDataType_t dt) {
  const int v = static_cast<int>(op);
  if (v >= 0 && v < loomNumOps) return Status::ok();
  return badOp(comm, op, dt);
}

[[gnu::cold, gnu::noinline]] Status badCount(size_t count, size_t multiple, const char* arg) {
  return LOOM_ERROR(loomInvalidArgument,
                    std::string(arg) + ": " + std::to_string(count) +
                        " elements overflow size_t when multiplied by the type size" +
                        (multiple > 1 ? " and the rank count" : ""));
}

// bytes = count * multiple * typeSize without overflow.
inline Status checkCount(size_t count, size_t multiple, loomDataType_t dt, const char* arg) {
  size_t bytes;
  if (!__builtin_mul_overflow(count, kernels::typeSize(dt), &bytes) &&
      !__builtin_mul_overflow(bytes, multiple, &bytes))
    return Status::ok();
  return badCount(count, multiple, arg);
}

[[gnu::cold, gnu::noinline]] Status nullBuf(size_t count, const char* arg) {
  return LOOM_ERROR(loomInvalidArgument,
                    std::string(arg) + ": NULL with count " + std::to_string(count) + " > 0");
}

inline Status checkBuf(const void* p, size_t count, const char* arg) {
  if (p != nullptr || count == 0) return Status::ok();
  return nullBuf(count, arg);
}

// The in-place layout of a collective: send - recv, in bytes, modulo 2^64 (a send range that
// starts before the receive range wraps), or none (kApart).
struct InPlace {
  bool has;
  uintptr_t delta;
};
constexpr InPlace kApart{false, 0};
// Send starts `bytes` into recv (all-gather; a root's gather), or recv into send (reduce-scatter;
// a root's scatter).
inline InPlace sendInRecv(size_t bytes) { return InPlace{true, bytes}; }
inline InPlace recvInSend(size_t bytes) { return InPlace{true, uintptr_t{0} - bytes}; }

[[gnu::cold, gnu::noinline]] Status overlapping(const void* send, size_t sendBytes,
                                                const void* recv, size_t recvBytes,
                                                InPlace inPlace) {
  char text[240];
  snprintf(text, sizeof text, "recvbuff: %zu bytes at %p overlap sendbuff's %zu at %p", recvBytes,
           recv, sendBytes, send);
  std::string m = text;
  if (!inPlace.has) {
    m += "; this collective has no in-place form: pass buffers apart";
  } else {
    const bool ahead = inPlace.delta <= UINTPTR_MAX / 2;  // send starts inside recv
    const uintptr_t by = ahead ? inPlace.delta : uintptr_t{0} - inPlace.delta;
    m += by == 0 ? "; in place, sendbuff must equal recvbuff"
                 : "; in place, sendbuff must be recvbuff " + std::string(ahead ? "+ " : "- ") +
                       std::to_string(by) + " bytes";
    m += " (or pass buffers apart)";
  }
  return LOOM_ERROR(loomInvalidArgument, m);
}

// Refuses send and receive ranges that overlap other than in the collective's in-place layout:
// the collective would read bytes it had already written. The differences are taken whichever
// range comes first, so no address sum can wrap.
[[gnu::always_inline]] inline Status checkApart(const void* send, size_t sendBytes,
                                                const void* recv, size_t recvBytes,
                                                InPlace inPlace) {
  const uintptr_t s = reinterpret_cast<uintptr_t>(send), r = reinterpret_cast<uintptr_t>(recv);
  const bool overlap =
      s >= r ? s - r < recvBytes && sendBytes > 0 : r - s < sendBytes && recvBytes > 0;
  if (!overlap || (inPlace.has && s - r == inPlace.delta)) return Status::ok();
  return overlapping(send, sendBytes, recv, recvBytes, inPlace);
}

// checkApart for ranges of one size, in place when equal (all-reduce; a root's broadcast and
// reduce): the per-call account's few instructions.
[[gnu::always_inline]] inline Status checkSameApart(const void* send, const void* recv,
                                                    size_t bytes) {
  const uintptr_t s = reinterpret_cast<uintptr_t>(send), r = reinterpret_cast<uintptr_t>(recv);
  const uintptr_t d = s >= r ? s - r : r - s;
  if (d >= bytes || d == 0) return Status::ok();
  return overlapping(send, bytes, recv, bytes, sendInRecv(0));
}

Status checkRank(int r, int n, const char* arg) {
  if (r < 0 || r >= n)
    return LOOM_ERROR(loomInvalidArgument,
                      std::string(arg) + ": " + str(r) + " is outside [0, " + str(n) + ")");
  return Status::ok();
}

// A communicator's size, checked before anything is sized by it.
Status checkRankCount(int n, const char* what) {
  if (n < 1) return LOOM_ERROR(loomInvalidArgument, std::string(what) + ": " + str(n) + " < 1");
  if (n > bootstrap::kMaxRanks)
    return LOOM_ERROR(loomInvalidArgument, std::string(what) + ": " + str(n) +
                                               " ranks, more than Loom's limit of " +
                                               str(bootstrap::kMaxRanks));
  return Status::ok();
}

// Checks shared by every collective; returns the communicator.
[[gnu::always_inline]] inline Result<PinnedComm> checkCommon(loomComm* h, loomDataType_t dt) {
  LOOM_ASSIGN(PinnedComm comm, lookup(h));
  LOOM_CHECK(checkType(dt));
  return comm;
}

Status initRank(loomComm_t* out, int nranks, const loomUniqueId& id, int rank,
                const loomConfig_t* config, int cudaDev) {
  if (out == nullptr) return LOOM_ERROR(loomInvalidArgument, "comm: NULL output pointer");
  *out = nullptr;
  LOOM_CHECK(checkRankCount(nranks, "nranks"));
  LOOM_CHECK(checkRank(rank, nranks, "rank"));
  LOOM_ASSIGN(auto parsed, bootstrap::parseUniqueId(id));
  (void)parsed;
  LOOM_ASSIGN(CommOptions opts, resolveConfig(config));
  opts.cudaDev = cudaDev >= 0 ? cudaDev : device::currentDevice();
  return initComm(out, nranks, id, rank, opts);
}

// Makes the communicator of a non-blocking handle visible; a loomCommAbort that came during
// the initialisation aborts it at once.
void publish(loomComm* h, std::unique_ptr<Comm> impl) {
  Comm* c = impl.get();
  {
    std::lock_guard<std::mutex> lock(registryMutex());
    h->impl = std::move(impl);
  }
  if (h->abortRequested.load()) c->abort();
}

}  // namespace

void setLastError(const std::string& message) { tLastError = message; }

void failInit(loomComm* h, const Status& s) {
  if (h == nullptr) return;
  std::lock_guard<std::mutex> lock(registryMutex());
  h->initError = s;
}

loomResult_t guardFailed(const char* fn, const Status& s) {
  if (s.code() == loomInProgress && s.message().empty()) return loomInProgress;
  setLastError(std::string(fn) + ": " + s.message());
  LOOM_INFO(kAll, "%s failed: %s", fn, s.message().c_str());
  return s.code();
}

loomResult_t guardException(const char* fn) {
  try {
    throw;
  } catch (const std::bad_alloc&) {
    setLastError(std::string(fn) + ": out of memory");
    return loomSystemError;
  } catch (const std::exception& e) {
    setLastError(std::string(fn) + ": internal error: " + e.what());
    return loomInternalError;
  } catch (...) {
    setLastError(std::string(fn) + ": internal error (unknown exception)");
    return loomInternalError;
  }
}

void registerComm(loomComm* c) {
  std::lock_guard<std::mutex> lock(registryMutex());
  registry().insert(c);
}

void unregisterComm(loomComm* c) {
  std::lock_guard<std::mutex> lock(registryMutex());
  eraseFromRegistry(c);
}

Result<PinnedComm> lookup(loomComm* c, const char* argName) {
  LookupCache& cache = tLookup;
  if (c != nullptr && c == cache.handle &&
      cache.epoch == gRegistryEpoch.load(std::memory_order_acquire)) {
    // Pinned, then found not dead (both sequentially consistent, as destroy's store of dead
    // and its load of pins): either destroy waits for this call, or this call sees it dead.
    c->pins.fetch_add(1, std::memory_order_seq_cst);
    if (!c->dead.load(std::memory_order_seq_cst)) return PinnedComm(c, cache.comm);
    c->pins.fetch_sub(1, std::memory_order_release);
  }
  std::lock_guard<std::mutex> lock(registryMutex());
  if (c == nullptr || registry().count(c) == 0 || c->dead.load())
    return LOOM_ERROR(loomInvalidArgument,
                      std::string(argName) + ": NULL or destroyed communicator");
  if (!c->impl) {
    Status e = c->worker ? c->worker->error() : c->initError;
    if (!e.isOk())
      return Status(e.code(), std::string(argName) + ": initialisation failed: " + e.message());
    return LOOM_ERROR(
        loomInvalidUsage,
        std::string(argName) + (c->worker
                                    ? ": still initialising (non-blocking); poll "
                                      "loomCommGetAsyncError until it returns loomSuccess"
                                    : ": initialised by its group's loomGroupEnd, not yet called"));
  }
  // A handle's impl, once set, changes only as the handle leaves the registry.
  cache = {c, c->impl.get(), gRegistryEpoch.load(std::memory_order_relaxed)};
  c->pins.fetch_add(1, std::memory_order_seq_cst);  // not dead under the mutex destroy sets it in
  return PinnedComm(c, c->impl.get());
}

namespace {

// What a deferred creation makes its communicator from (nranks 0: this rank gets none).
struct Creation {
  loomUniqueId id{};
  int nranks = 0;
  int rank = 0;
};

// Inside a group, a blocking creation (an initialisation, a split, a shrink) is deferred to the
// outermost loomGroupEnd, as NCCL's group defers them: *out gets a handle at once (NULL when
// `out` is NULL: a split's rank without a colour, which still takes part), and at the group's
// end plan() says what to create, on a thread of its own beside the group's other creations.
// parent: the communicator a split or shrink is made from, whose abort ends the creation too.
Status deferCreation(loomComm_t* out, const CommOptions& opts, const loomComm* parent,
                     std::function<Result<Creation>()> plan) {
  loomComm* h = nullptr;
  if (out != nullptr) {
    h = new loomComm();
    h->timeoutMs = opts.timeoutMs;
    h->abortsWith = parent;
    registerComm(h);
    // After registering: an abort of the parent either finds h there or came before this.
    if (parent != nullptr && parent->abortRequested.load()) h->abortRequested.store(true);
    *out = h;
  }
  deferInit(
      h,
      [h, opts, plan = std::move(plan)]() -> Status {
        // Pinned while it runs, so that a destroy (which raises the abort flag it honours)
        // waits for it, and frees what it published.
        if (h != nullptr) h->pins.fetch_add(1, std::memory_order_seq_cst);
        PinnedComm pin(h, nullptr);
        struct Made {  // once made (or failed), the parent's abort no longer concerns it
          loomComm* h;
          ~Made() {
            if (h == nullptr) return;
            std::lock_guard<std::mutex> lock(registryMutex());
            h->abortsWith = nullptr;
          }
        } made{h};
        if (h != nullptr && h->dead.load(std::memory_order_seq_cst))
          return LOOM_ERROR(loomInvalidUsage, "comm: destroyed before its group ended");
        LOOM_ASSIGN(Creation c, plan());
        if (h == nullptr || c.nranks == 0) return Status::ok();
        LOOM_ASSIGN(auto impl, Comm::create(c.id, c.nranks, c.rank, opts, &h->abortRequested));
        LOOM_CHECK(calibrate(*impl));
        publish(h, std::move(impl));
        return Status::ok();
      },
      parent);
  return Status::ok();
}

}  // namespace

Status initComm(loomComm_t* out, int nranks, const loomUniqueId& id, int rank,
                const CommOptions& opts, const loomComm* parent) {
  if (opts.blocking && inGroup())
    return deferCreation(out, opts, parent, [id, nranks, rank]() -> Result<Creation> {
      return Creation{id, nranks, rank};
    });
  if (opts.blocking) {
    LOOM_ASSIGN(auto impl, Comm::create(id, nranks, rank, opts,
                                        parent != nullptr ? &parent->abortRequested : nullptr));
    LOOM_CHECK(calibrate(*impl));
    auto* h = new loomComm();
    h->impl = std::move(impl);
    registerComm(h);
    *out = h;
    return Status::ok();
  }
  auto* h = new loomComm();
  h->timeoutMs = opts.timeoutMs;
  h->worker = std::make_unique<AsyncWorker>(rank);
  registerComm(h);
  *out = h;
  h->worker->post([h, id, nranks, rank, opts]() -> Status {
    LOOM_ASSIGN(auto impl, Comm::create(id, nranks, rank, opts, &h->abortRequested));
    LOOM_CHECK(calibrate(*impl));
    publish(h, std::move(impl));
    return Status::ok();
  });
  return inProgress();
}

Status asyncError(loomComm* h, loomResult_t* out) {
  // Under the registry's mutex throughout, so that a loomCommAbort on another thread cannot
  // free the handle while it is read.
  std::lock_guard<std::mutex> lock(registryMutex());
  if (h == nullptr || registry().count(h) == 0)
    return LOOM_ERROR(loomInvalidArgument, "comm: NULL or destroyed communicator");
  if (out == nullptr) return LOOM_ERROR(loomInvalidArgument, "asyncError: NULL");
  if (h->worker && h->worker->busy()) {
    *out = loomInProgress;
    return Status::ok();
  }
  if (!h->worker && !h->impl && h->initError.isOk()) {  // initialised at its group's end
    *out = loomInProgress;
    return Status::ok();
  }
  Status e = h->worker ? h->worker->error() : h->initError;
  if (e.isOk() && h->impl) e = h->impl->asyncError();
  if (e.isOk() && h->impl) e = device::asyncError(*h->impl);  // a staged or cuda_ipc failure
  *out = e.code();
  // The failure happened on another thread: make its text this thread's last error.
  if (!e.isOk()) setLastError("loomCommGetAsyncError: " + e.message());
  return Status::ok();
}

const char* lastError() { return tLastError.c_str(); }

Status lastTicket(loomComm* h, uint64_t* ticket) {
  std::lock_guard<std::mutex> lock(registryMutex());
  if (h == nullptr || registry().count(h) == 0)
    return LOOM_ERROR(loomInvalidArgument, "comm: NULL or destroyed communicator");
  if (ticket == nullptr) return LOOM_ERROR(loomInvalidArgument, "ticket: NULL");
  *ticket = h->worker ? h->worker->lastTicket() : 0;
  return Status::ok();
}

Status waitTicket(loomComm* h, uint64_t ticket, int timeoutMs) {
  AsyncWorker* w = nullptr;
  {
    std::lock_guard<std::mutex> lock(registryMutex());
    if (h == nullptr || registry().count(h) == 0)
      return LOOM_ERROR(loomInvalidArgument, "comm: NULL or destroyed communicator");
    if (!h->worker)
      return LOOM_ERROR(loomInvalidUsage,
                        "comm: a blocking communicator has no tickets (its "
                        "calls finish before they return)");
    const uint64_t last = h->worker->lastTicket();
    if (ticket == 0 || ticket > last)
      return LOOM_ERROR(loomInvalidArgument, "ticket: " + std::to_string(ticket) +
                                                 " was not issued on comm (its last is " +
                                                 std::to_string(last) + ")");
    w = h->worker.get();
    w->enterWait();  // the worker (and so the handle) outlives this wait: destroy waits for it
  }
  // The communicator's timeout: with a grace, so that an operation that fails by its own
  // timeout (which began when it started, after this wait perhaps) reports that, with the rank
  // it waited for, before this wait gives up without knowing why.
  const int64_t ms = timeoutMs >= 0 ? timeoutMs : h->timeoutMs + waitGraceMs(h->timeoutMs);
  return w->wait(ticket, nowNs() + ms * 1000000, timeoutMs < 0);
}

Status initAll(loomComm_t* comms, int ndev, const int* devlist) {
  if (comms == nullptr) return LOOM_ERROR(loomInvalidArgument, "comms: NULL");
  LOOM_CHECK(checkRankCount(ndev, "ndev"));
  loomUniqueId id;
  LOOM_CHECK(bootstrap::makeLocalUniqueId(&id));
  std::vector<Status> results(static_cast<size_t>(ndev));
  std::vector<std::thread> threads;
  // The ranks start once every thread exists: a thread the system refuses ends the call before
  // any rank waits for it.
  std::mutex gateMutex;
  std::condition_variable gate;
  int go = 0;  // 1: run; -1: a thread could not start
  auto open = [&](int value) {
    {
      std::lock_guard<std::mutex> lock(gateMutex);
      go = value;
    }
    gate.notify_all();
  };
  for (int i = 0; i < ndev; ++i) comms[i] = nullptr;
  threads.reserve(static_cast<size_t>(ndev));
  for (int i = 0; i < ndev; ++i) {
    try {
      threads.emplace_back([&, i] {
        {
          std::unique_lock<std::mutex> lock(gateMutex);
          gate.wait(lock, [&] { return go != 0; });
          if (go < 0) return;
        }
        results[static_cast<size_t>(i)] =
            initRank(&comms[i], ndev, id, i, nullptr, devlist != nullptr ? devlist[i] : -1);
      });
    } catch (const std::exception& e) {  // std::system_error, or std::bad_alloc
      open(-1);
      for (auto& t : threads) t.join();
      return LOOM_ERROR(loomSystemError, "ndev: " + str(ndev) + " ranks, but thread " + str(i) +
                                             " could not start: " + e.what());
    }
  }
  open(1);
  for (auto& t : threads) t.join();
  for (size_t i = 0; i < results.size(); ++i) {
    if (results[i].isOk()) continue;
    for (int j = 0; j < ndev; ++j) {
      if (comms[j] == nullptr) continue;
      unregisterComm(comms[j]);
      delete comms[j];
      comms[j] = nullptr;
    }
    return results[i].prefix("rank " + std::to_string(i) + ": ");
  }
  return Status::ok();
}

namespace {

// A non-blocking parent first finishes what it has queued (before its operation lock is
// taken: its worker runs them under it), so every rank splits after the same operations.
Status drainQueue(loomComm* h, Comm* comm) {
  if (h->worker && !h->worker->waitIdle(nowNs() + comm->options().timeoutMs * 1000000))
    return LOOM_ERROR(loomTimeout, "comm: queued operations did not finish within the timeout");
  return Status::ok();
}

// The collective part of a split, under comm's operation lock: every rank's colour and key,
// and the new id of this rank's colour (nranks 0 for LOOM_SPLIT_NOCOLOR).
Result<Creation> splitPlan(Comm* comm, int color, int key) {
  const int n = comm->nranks();
  std::vector<int32_t> mine{color, key}, all(2 * static_cast<size_t>(n));
  LOOM_CHECK(comm->bootstrap().allGather(mine.data(), all.data(), sizeof(int32_t) * 2));
  // Members of my colour, ordered by key then old rank.
  std::vector<int> members;
  for (int r = 0; r < n; ++r)
    if (color != LOOM_SPLIT_NOCOLOR && all[2 * static_cast<size_t>(r)] == color)
      members.push_back(r);
  std::stable_sort(members.begin(), members.end(), [&](int a, int b) {
    return all[2 * static_cast<size_t>(a) + 1] < all[2 * static_cast<size_t>(b) + 1];
  });
  // Each colour's first member makes the new id; everyone learns all ids.
  loomUniqueId id{};
  const bool leader = !members.empty() && members[0] == comm->rank();
  if (leader) LOOM_CHECK(bootstrap::makeLocalUniqueId(&id));
  std::vector<loomUniqueId> ids(static_cast<size_t>(n));
  LOOM_CHECK(comm->bootstrap().allGather(&id, ids.data(), sizeof(loomUniqueId)));
  Creation c;
  if (members.empty()) return c;
  c.id = ids[static_cast<size_t>(members[0])];
  c.nranks = static_cast<int>(members.size());
  c.rank =
      static_cast<int>(std::find(members.begin(), members.end(), comm->rank()) - members.begin());
  return c;
}

}  // namespace

Status split(loomComm* h, int color, int key, loomComm_t* newcomm, const loomConfig_t* config) {
  LOOM_ASSIGN(Comm * comm, lookup(h));
  if (newcomm == nullptr) return LOOM_ERROR(loomInvalidArgument, "newcomm: NULL");
  *newcomm = nullptr;
  LOOM_CHECK(checkNotFinalized(h));
  if (color < 0 && color != LOOM_SPLIT_NOCOLOR)
    return LOOM_ERROR(loomInvalidArgument, "color: " + str(color) + " is negative");
  LOOM_ASSIGN(CommOptions opts, resolveConfig(config, &comm->options()));
  if (opts.blocking && inGroup())  // one thread may split several ranks' communicators
    return deferCreation(color == LOOM_SPLIT_NOCOLOR ? nullptr : newcomm, opts, h,
                         [h, color, key]() -> Result<Creation> {
                           LOOM_ASSIGN(Comm * comm, lookup(h));  // not destroyed meanwhile
                           LOOM_CHECK(checkNotFinalized(h));
                           LOOM_CHECK(drainQueue(h, comm));
                           std::lock_guard<FutexMutex> lock(comm->opMutex());
                           return splitPlan(comm, color, key);
                         });
  LOOM_CHECK(drainQueue(h, comm));
  std::lock_guard<FutexMutex> lock(comm->opMutex());
  LOOM_ASSIGN(Creation c, splitPlan(comm, color, key));
  if (c.nranks == 0) return Status::ok();
  return initComm(newcomm, c.nranks, c.id, c.rank, opts, h);
}

Status destroy(loomComm* h, bool abort) {
  Comm* comm = nullptr;
  {
    std::lock_guard<std::mutex> lock(registryMutex());
    if (h == nullptr || registry().count(h) == 0 || h->dead.load())
      return LOOM_ERROR(loomInvalidArgument, "comm: NULL or destroyed communicator");
    h->dead.store(true, std::memory_order_seq_cst);  // no call pins it from here on
    if (abort) {
      h->abortRequested.store(true);
      // Communicators split or shrunk from it whose creation waits for a group's end, or runs.
      for (loomComm* c : registry())
        if (c->abortsWith == h) c->abortRequested.store(true);
    }
    comm = h->impl.get();
  }
  // A non-blocking communicator's worker finishes its queue (destroy) or drops it (abort), then
  // ends. The queue is dropped before the abort flag ends the running initialisation or
  // operation, so no queued operation starts after the flag and fails by it.
  if (h->worker) h->worker->close(abort);
  if (abort && comm != nullptr) comm->abort();
  if (h->worker) h->worker->stop(abort);
  {
    std::lock_guard<std::mutex> lock(registryMutex());
    comm = h->impl.get();
    eraseFromRegistry(h);
  }
  // Wait for the calls that pinned it on other threads to leave: one that had found it live but
  // not yet started its operation would otherwise run on a freed communicator. An abort ends
  // their operations (a device transport's kernels too); otherwise they end as they would have
  // (each wait has its timeout).
  if (abort && comm != nullptr) device::abortTransfers(*comm);
  while (h->pins.load(std::memory_order_seq_cst) != 0) std::this_thread::sleep_for(kPinPoll);
  {
    std::lock_guard<std::mutex> lock(registryMutex());
    comm = h->impl.get();  // a deferred initialisation may have published it meanwhile
  }
  if (comm != nullptr) {
    device::release(*comm, abort);  // staged device calls finish (or, on abort, are dropped)
    comm->dumpTraceIfConfigured(abort ? "abort" : "destroy");
  }
  h->worker.reset();
  h->impl.reset();
  std::lock_guard<std::mutex> lock(registryMutex());
  retired().push_back(h);  // its memory stays (see loomComm): a late call finds it dead
  return Status::ok();
}

}  // namespace loom::api

using loom::Status;
using loom::api::Call;
using loom::api::guard;
using loom::api::guardCall;
using loom::api::lookup;
namespace algo = loom::algo;

namespace {

Status collective(algo::Coll coll, const void* sendbuff, void* recvbuff, size_t count,
                  loomDataType_t dt, loomRedOp_t op, int root, loomComm* h,
                  loomStream_t stream = nullptr) {
  using namespace loom::api;
  LOOM_ASSIGN(loom::Comm * comm, checkCommon(h, dt));
  const int n = comm->nranks();
  const int rank = comm->rank();
  const bool reduces = coll == algo::Coll::AllReduce || coll == algo::Coll::Reduce ||
                       coll == algo::Coll::ReduceScatter;
  if (reduces) LOOM_CHECK(checkOp(*comm, op, dt));
  const bool rooted = coll == algo::Coll::Broadcast || coll == algo::Coll::Reduce;
  if (rooted) LOOM_CHECK(checkRank(root, n, "root"));
  const size_t many = static_cast<size_t>(n);
  // One rank's block in bytes (checkCount keeps many blocks within size_t), many blocks, and
  // this rank's block's offset in a buffer of many: computed where a case needs them.
  const auto block = [&] { return count * loom::kernels::typeSize(dt); };
  const auto all = [&] { return block() * many; };
  const auto mine = [&] { return block() * static_cast<size_t>(rank); };
  switch (coll) {
    case algo::Coll::AllReduce:
      LOOM_CHECK(checkCount(count, 1, dt, "count"));
      LOOM_CHECK(checkBuf(sendbuff, count, "sendbuff"));
      LOOM_CHECK(checkBuf(recvbuff, count, "recvbuff"));
      LOOM_CHECK(checkSameApart(sendbuff, recvbuff, block()));
      break;
    case algo::Coll::Broadcast:
      LOOM_CHECK(checkCount(count, 1, dt, "count"));
      if (rank == root) LOOM_CHECK(checkBuf(sendbuff, count, "sendbuff"));
      LOOM_CHECK(checkBuf(recvbuff, count, "recvbuff"));
      if (rank == root) LOOM_CHECK(checkSameApart(sendbuff, recvbuff, block()));
      break;
    case algo::Coll::Reduce:
      LOOM_CHECK(checkCount(count, 1, dt, "count"));
      LOOM_CHECK(checkBuf(sendbuff, count, "sendbuff"));
      if (rank == root) LOOM_CHECK(checkBuf(recvbuff, count, "recvbuff"));
      if (rank == root) LOOM_CHECK(checkSameApart(sendbuff, recvbuff, block()));
      break;
    case algo::Coll::AllGather:
      LOOM_CHECK(checkCount(count, many, dt, "sendcount"));
      LOOM_CHECK(checkBuf(sendbuff, count, "sendbuff"));
      LOOM_CHECK(checkBuf(recvbuff, count, "recvbuff"));
      LOOM_CHECK(checkApart(sendbuff, block(), recvbuff, all(), sendInRecv(mine())));
      break;
    case algo::Coll::ReduceScatter:
      LOOM_CHECK(checkCount(count, many, dt, "recvcount"));
      LOOM_CHECK(checkBuf(sendbuff, count, "sendbuff"));
      LOOM_CHECK(checkBuf(recvbuff, count, "recvbuff"));
      LOOM_CHECK(checkApart(sendbuff, all(), recvbuff, block(), recvInSend(mine())));
      break;
    case algo::Coll::AllToAll:
      LOOM_CHECK(checkCount(count, many, dt, "count"));
      LOOM_CHECK(checkBuf(sendbuff, count, "sendbuff"));
      LOOM_CHECK(checkBuf(recvbuff, count, "recvbuff"));
      LOOM_CHECK(checkApart(sendbuff, all(), recvbuff, all(), kApart));
      break;
    case algo::Coll::SendRecv:  // loomSend and loomRecv, checked by their own entry points
      return LOOM_ERROR(loomInternalError, "a group is not a collective call");
  }
  Call c;
  c.kind = Call::Collective;
  c.coll = coll;
  c.sendbuff = sendbuff;
  c.recvbuff = recvbuff;
  c.count = count;
  c.dtype = dt;
  c.op = op;
  c.root = root;
  c.comm = h;
  c.stream = stream;
  return submit(c, comm);
}

// A tagged message's own arguments (loomSendTagged, loomRecvTagged).
struct Tagged {
  int tag;
  int* source;
};

// loomSend and loomRecv, or with `tagged` a tagged message: host memory only (the message
// engine does not stage device memory), and a receive's peer may be LOOM_ANY_SOURCE.
Status pointToPoint(Call::Kind kind, const void* buf, size_t count, loomDataType_t dt, int peer,
                    loomComm* h, loomStream_t stream, const Tagged* tagged = nullptr) {
  using namespace loom::api;
  const char* bufArg = kind == Call::Send ? "sendbuff" : "recvbuff";
  LOOM_ASSIGN(loom::Comm * comm, checkCommon(h, dt));
  if (!(tagged != nullptr && kind == Call::Recv && peer == LOOM_ANY_SOURCE))
    LOOM_CHECK(checkRank(peer, comm->nranks(), "peer"));
  LOOM_CHECK(checkCount(count, 1, dt, "count"));
  LOOM_CHECK(checkBuf(buf, count, bufArg));
  Call c;
  c.kind = kind;
  c.sendbuff = buf;
  c.recvbuff = const_cast<void*>(buf);
  c.count = count;
  c.dtype = dt;
  c.root = peer;
  c.comm = h;
  c.stream = stream;
  if (tagged != nullptr) {
    c.message = true;
    c.messageTag = tagged->tag;
    c.source = tagged->source;
    if (loom::device::involvesDevice(c, comm->nranks()))
      return LOOM_ERROR(loomInvalidArgument,
                        std::string(bufArg) + ": device memory; tagged messages move host memory");
  }
  return submit(c, comm);
}

// One block of a call built from sends and receives: count elements at offset (elements).
struct Block {
  int peer;
  size_t offset, count;
};

// Sends and receives of whole blocks as one group. The arguments are checked by the caller,
// so every block is queued or none is.
Status exchange(loomComm* h, loomDataType_t dt, loomStream_t stream, const void* sendbuff,
                const std::vector<Block>& sends, void* recvbuff, const std::vector<Block>& recvs) {
  using namespace loom::api;
  const size_t es = loom::kernels::typeSize(dt);
  return runAsGroup([&]() -> Status {
    for (const Block& b : sends)
      if (b.count > 0)
        LOOM_CHECK(pointToPoint(Call::Send, static_cast<const char*>(sendbuff) + b.offset * es,
                                b.count, dt, b.peer, h, stream));
    for (const Block& b : recvs)
      if (b.count > 0)
        LOOM_CHECK(pointToPoint(Call::Recv, static_cast<char*>(recvbuff) + b.offset * es, b.count,
                                dt, b.peer, h, stream));
    return Status::ok();
  });
}

// The blocks that counts and displs (NULL: end to end) give, checked: each count and each
// block's end in elements must fit in size_t bytes, and buf may be NULL only when all are 0.
Status blocksOf(const size_t* counts, const size_t* displs, int n, loomDataType_t dt,
                const void* buf, const char* countsArg, const char* displsArg, const char* bufArg,
                std::vector<Block>* out) {
  using namespace loom::api;
  if (counts == nullptr) return LOOM_ERROR(loomInvalidArgument, std::string(countsArg) + ": NULL");
  const size_t limit = SIZE_MAX / loom::kernels::typeSize(dt);
  size_t next = 0;
  out->clear();
  for (int r = 0; r < n; ++r) {
    const std::string at = "[" + std::to_string(r) + "]";
    const size_t off = displs != nullptr ? displs[r] : next;
    if (counts[r] > limit || off > limit - counts[r])
      return LOOM_ERROR(loomInvalidArgument,
                        std::string(displs != nullptr ? displsArg : countsArg) + at + ": block " +
                            std::to_string(r) + " (" + std::to_string(counts[r]) +
                            " elements from element " + std::to_string(off) +
                            ") ends past what size_t counts in bytes");
    LOOM_CHECK(checkBuf(buf, counts[r], bufArg));
    out->push_back(Block{r, off, counts[r]});
    next = off + counts[r];
  }
  return Status::ok();
}

// Refuses a send block and a receive block that overlap (all-to-all-v has no in-place form).
// Blocks of one side may interleave with the other's; each side's blocks are sorted, then swept.
Status checkBlocksApart(const void* sendbuff, const std::vector<Block>& sends, const void* recvbuff,
                        const std::vector<Block>& recvs, loomDataType_t dt) {
  using namespace loom::api;
  const size_t es = loom::kernels::typeSize(dt);
  auto ranges = [es](const void* base, const std::vector<Block>& blocks) {
    std::vector<std::pair<uintptr_t, size_t>> out;  // (first byte, bytes)
    for (const Block& b : blocks)
      if (b.count > 0)
        out.emplace_back(reinterpret_cast<uintptr_t>(base) + b.offset * es, b.count * es);
    std::sort(out.begin(), out.end());
    return out;
  };
  const auto s = ranges(sendbuff, sends), r = ranges(recvbuff, recvs);
  for (size_t i = 0, j = 0; i < s.size() && j < r.size();) {
    const auto a = s[i], b = r[j];
    const void* sp = reinterpret_cast<const void*>(a.first);
    const void* rp = reinterpret_cast<const void*>(b.first);
    LOOM_CHECK(checkApart(sp, a.second, rp, b.second, kApart));
    // The range that ends first cannot meet any later range of the other side.
    if (a.first + a.second <= b.first + b.second)
      ++i;
    else
      ++j;
  }
  return Status::ok();
}

Status allToAllv(const void* sendbuff, const size_t* sendcounts, const size_t* sdispls,
                 void* recvbuff, const size_t* recvcounts, const size_t* rdispls, loomDataType_t dt,
                 loomComm* h, loomStream_t stream) {
  using namespace loom::api;
  LOOM_ASSIGN(loom::Comm * comm, checkCommon(h, dt));
  const int n = comm->nranks(), me = comm->rank();
  std::vector<Block> sends, recvs;
  LOOM_CHECK(
      blocksOf(sendcounts, sdispls, n, dt, sendbuff, "sendcounts", "sdispls", "sendbuff", &sends));
  LOOM_CHECK(
      blocksOf(recvcounts, rdispls, n, dt, recvbuff, "recvcounts", "rdispls", "recvbuff", &recvs));
  if (recvcounts[me] != sendcounts[me])
    return LOOM_ERROR(loomInvalidArgument, "recvcounts[" + std::to_string(me) +
                                               "]: " + std::to_string(recvcounts[me]) +
                                               " elements, but this rank sends itself " +
                                               std::to_string(sendcounts[me]) + " (sendcounts[" +
                                               std::to_string(me) + "])");
  LOOM_CHECK(checkBlocksApart(sendbuff, sends, recvbuff, recvs, dt));
  return exchange(h, dt, stream, sendbuff, sends, recvbuff, recvs);
}

// Gather (toRoot) or scatter: count elements a rank, block r of root's buffer for rank r.
Status rooted(bool toRoot, const void* sendbuff, void* recvbuff, size_t count, loomDataType_t dt,
              int root, loomComm* h, loomStream_t stream) {
  using namespace loom::api;
  LOOM_ASSIGN(loom::Comm * comm, checkCommon(h, dt));
  const int n = comm->nranks(), me = comm->rank();
  LOOM_CHECK(checkRank(root, n, "root"));
  LOOM_CHECK(checkCount(count, static_cast<size_t>(n), dt, toRoot ? "sendcount" : "recvcount"));
  std::vector<Block> all;
  for (int r = 0; r < n && me == root; ++r)
    all.push_back(Block{r, static_cast<size_t>(r) * count, count});
  const std::vector<Block> one{Block{root, 0, count}};
  // The root's block of its buffer of n, in bytes: in place, the other buffer is that block.
  const size_t block = count * loom::kernels::typeSize(dt);
  const size_t at = block * static_cast<size_t>(root);
  if (toRoot) {
    LOOM_CHECK(checkBuf(sendbuff, count, "sendbuff"));
    if (me == root) LOOM_CHECK(checkBuf(recvbuff, count, "recvbuff"));
    if (me == root)
      LOOM_CHECK(
          checkApart(sendbuff, block, recvbuff, block * static_cast<size_t>(n), sendInRecv(at)));
    return exchange(h, dt, stream, sendbuff, one, recvbuff, all);
  }
  LOOM_CHECK(checkBuf(recvbuff, count, "recvbuff"));
  if (me == root) LOOM_CHECK(checkBuf(sendbuff, count, "sendbuff"));
  if (me == root)
    LOOM_CHECK(
        checkApart(sendbuff, block * static_cast<size_t>(n), recvbuff, block, recvInSend(at)));
  return exchange(h, dt, stream, sendbuff, all, recvbuff, one);
}

}  // namespace

extern "C" {

loomResult_t loomUseNcclEnvironment(void) {
  loom::env::readNcclNames();
  return loomSuccess;
}

loomResult_t loomGetVersion(int* version) {
  return guard("loomGetVersion", [&] {
    if (version == nullptr) return LOOM_ERROR(loomInvalidArgument, "version: NULL");
    *version = LOOM_VERSION_CODE;
    return Status::ok();
  });
}

loomResult_t loomGetUniqueId(loomUniqueId* uniqueId) {
  return guard("loomGetUniqueId", [&] {
    if (uniqueId == nullptr) return LOOM_ERROR(loomInvalidArgument, "uniqueId: NULL");
    return loom::bootstrap::makeUniqueId(uniqueId);
  });
}

loomResult_t loomCommInitRank(loomComm_t* comm, int nranks, loomUniqueId commId, int rank) {
  return guard("loomCommInitRank",
               [&] { return loom::api::initRank(comm, nranks, commId, rank, nullptr, -1); });
}

loomResult_t loomCommInitRankConfig(loomComm_t* comm, int nranks, loomUniqueId commId, int rank,
                                    loomConfig_t* config) {
  return guard("loomCommInitRankConfig",
               [&] { return loom::api::initRank(comm, nranks, commId, rank, config, -1); });
}

loomResult_t loomCommInitAll(loomComm_t* comms, int ndev, const int* devlist) {
  return guard("loomCommInitAll", [&] { return loom::api::initAll(comms, ndev, devlist); });
}

loomResult_t loomCommSplit(loomComm_t comm, int color, int key, loomComm_t* newcomm,
                           loomConfig_t* config) {
  return guard("loomCommSplit",
               [&] { return loom::api::split(comm, color, key, newcomm, config); });
}

loomResult_t loomCommFinalize(loomComm_t comm) {
  return guard("loomCommFinalize", [&]() -> Status {
    LOOM_ASSIGN(loom::Comm * c, lookup(comm));
    comm->finalized.store(true);
    if (comm->worker && comm->worker->busy()) return loom::api::inProgress();
    std::lock_guard<loom::FutexMutex> lock(c->opMutex());
    return c->asyncError();
  });
}

loomResult_t loomCommDestroy(loomComm_t comm) {
  return guard("loomCommDestroy", [&] { return loom::api::destroy(comm, false); });
}

loomResult_t loomCommAbort(loomComm_t comm) {
  return guard("loomCommAbort", [&] { return loom::api::destroy(comm, true); });
}

loomResult_t loomCommGetAsyncError(loomComm_t comm, loomResult_t* asyncError) {
  return guard("loomCommGetAsyncError", [&] { return loom::api::asyncError(comm, asyncError); });
}

loomResult_t loomCommLastTicket(loomComm_t comm, uint64_t* ticket) {
  return guard("loomCommLastTicket", [&] { return loom::api::lastTicket(comm, ticket); });
}

loomResult_t loomCommWaitTicket(loomComm_t comm, uint64_t ticket, int timeoutMs) {
  return guard("loomCommWaitTicket",
               [&] { return loom::api::waitTicket(comm, ticket, timeoutMs); });
}

loomResult_t loomCommSetOpTag(loomComm_t comm, uint64_t tag) {
  return guard("loomCommSetOpTag", [&]() -> Status {
    LOOM_ASSIGN(loom::Comm * c, lookup(comm));
    c->setNextTag(tag);
    return Status::ok();
  });
}

loomResult_t loomCommCount(const loomComm_t comm, int* count) {
  return guard("loomCommCount", [&]() -> Status {
    LOOM_ASSIGN(loom::Comm * c, lookup(comm));
    if (count == nullptr) return LOOM_ERROR(loomInvalidArgument, "count: NULL");
    *count = c->nranks();
    return Status::ok();
  });
}

loomResult_t loomCommCuDevice(const loomComm_t comm, int* device) {
  return guard("loomCommCuDevice", [&]() -> Status {
    LOOM_ASSIGN(loom::Comm * c, lookup(comm));
    if (device == nullptr) return LOOM_ERROR(loomInvalidArgument, "device: NULL");
    *device = c->options().cudaDev;
    return Status::ok();
  });
}

loomResult_t loomCommUserRank(const loomComm_t comm, int* rank) {
  return guard("loomCommUserRank", [&]() -> Status {
    LOOM_ASSIGN(loom::Comm * c, lookup(comm));
    if (rank == nullptr) return LOOM_ERROR(loomInvalidArgument, "rank: NULL");
    *rank = c->rank();
    return Status::ok();
  });
}

const char* loomGetErrorString(loomResult_t result) {
  switch (result) {
    case loomSuccess:
      return "no error";
    case loomUnhandledCudaError:
      return "unhandled cuda error (run with LOOM_DEBUG=INFO for details)";
    case loomSystemError:
      return "unhandled system error (run with LOOM_DEBUG=INFO for details)";
    case loomInternalError:
      return "internal error - please report this issue to the Loom developers";
    case loomInvalidArgument:
      return "invalid argument (loomGetLastError names the argument)";
    case loomInvalidUsage:
      return "invalid usage (loomGetLastError says why)";
    case loomRemoteError:
      return "remote process exited or there was a network error";
    case loomInProgress:
      return "operation in progress";
    case loomTimeout:
      return "operation timed out";
    default:
      return "unknown result code";
  }
}

const char* loomGetLastError(loomComm_t comm) {
  (void)comm;
  return loom::api::lastError();
}

loomResult_t loomRedOpCreatePreMulSum(loomRedOp_t* op, void* scalar, loomDataType_t datatype,
                                      loomScalarResidence_t residence, loomComm_t comm) {
  return guard("loomRedOpCreatePreMulSum", [&]() -> Status {
    LOOM_ASSIGN(loom::Comm * c, lookup(comm));
    if (op == nullptr) return LOOM_ERROR(loomInvalidArgument, "op: NULL");
    if (scalar == nullptr) return LOOM_ERROR(loomInvalidArgument, "scalar: NULL");
    LOOM_CHECK(loom::api::checkType(datatype));
    if (residence != loomScalarHostImmediate)
      return LOOM_ERROR(loomInvalidArgument,
                        "residence: only loomScalarHostImmediate is supported for host buffers");
    auto& ops = c->userOps();
    size_t idx = 0;
    while (idx < ops.size() && ops[idx]) ++idx;
    if (idx >= static_cast<size_t>(loomBand - loomNumOps))
      return LOOM_ERROR(loomInvalidUsage, "op: too many live PreMulSum operations");
    if (idx == ops.size()) ops.emplace_back();
    ops[idx] =
        std::make_unique<loom::kernels::Reducer>(loom::kernels::makePreMulSum(datatype, scalar));
    *op = static_cast<loomRedOp_t>(loomNumOps + static_cast<int>(idx));
    return Status::ok();
  });
}

loomResult_t loomRedOpDestroy(loomRedOp_t op, loomComm_t comm) {
  return guard("loomRedOpDestroy", [&]() -> Status {
    LOOM_ASSIGN(loom::Comm * c, lookup(comm));
    int v = static_cast<int>(op);
    size_t idx = static_cast<size_t>(v) - loomNumOps;
    if (v < loomNumOps || idx >= c->userOps().size() || !c->userOps()[idx])
      return LOOM_ERROR(loomInvalidArgument,
                        "op: " + std::to_string(v) + " is not a live PreMulSum operation");
    c->userOps()[idx].reset();
    return Status::ok();
  });
}

loomResult_t loomCommRegister(const loomComm_t comm, void* buff, size_t size, void** handle) {
  return guard("loomCommRegister", [&]() -> Status {
    LOOM_ASSIGN(loom::Comm * c, lookup(comm));
    if (handle == nullptr) return LOOM_ERROR(loomInvalidArgument, "handle: NULL");
    *handle = nullptr;
    LOOM_CHECK(loom::api::checkNotFinalized(comm));
    if (buff == nullptr) return LOOM_ERROR(loomInvalidArgument, "buff: NULL");
    if (size == 0) return LOOM_ERROR(loomInvalidArgument, "size: 0");
    LOOM_ASSIGN(*handle, c->registerBuffer(buff, size));
    return Status::ok();
  });
}

loomResult_t loomCommDeregister(const loomComm_t comm, void* handle) {
  return guard("loomCommDeregister", [&]() -> Status {
    LOOM_ASSIGN(loom::Comm * c, lookup(comm));
    if (handle == nullptr) return LOOM_ERROR(loomInvalidArgument, "handle: NULL");
    return c->deregisterBuffer(handle);
  });
}

loomResult_t loomMemAlloc(void** ptr, size_t size) {
  return guard("loomMemAlloc", [&]() -> Status {
    if (ptr == nullptr) return LOOM_ERROR(loomInvalidArgument, "ptr: NULL");
    *ptr = nullptr;
    LOOM_ASSIGN(*ptr, loom::mem::alloc(size));
    return Status::ok();
  });
}

loomResult_t loomMemFree(void* ptr) {
  return guard("loomMemFree", [&]() -> Status {
    if (ptr == nullptr) return LOOM_ERROR(loomInvalidArgument, "ptr: NULL");
    return loom::mem::free(ptr);
  });
}

loomResult_t loomCommDumpTrace(loomComm_t comm, const char* path) {
  return guard("loomCommDumpTrace", [&]() -> Status {
    LOOM_ASSIGN(loom::Comm * c, lookup(comm));
    return c->dumpTrace(path != nullptr ? path : "", "request");
  });
}

loomResult_t loomCommGetStragglerSummary(loomComm_t comm, loomStragglerStat_t* stats, int nstats) {
  return guard("loomCommGetStragglerSummary", [&]() -> Status {
    LOOM_ASSIGN(loom::Comm * c, lookup(comm));
    if (stats == nullptr) return LOOM_ERROR(loomInvalidArgument, "stats: NULL");
    if (nstats < c->nranks())
      return LOOM_ERROR(loomInvalidArgument, "nstats: " + std::to_string(nstats) +
                                                 " is less than the rank count " +
                                                 std::to_string(c->nranks()));
    std::vector<loom::trace::RankLateness> l = c->recorder().lateness();
    for (int r = 0; r < c->nranks(); ++r) {
      const auto& x = l[static_cast<size_t>(r)];
      loomStragglerStat_t& o = stats[r];
      o.rank = r;
      o.ops = x.ops;
      o.timesLast = x.timesLast;
      o.meanLateUs = x.ops ? x.sumLateNs / static_cast<double>(x.ops) / 1e3 : 0.0;
      o.maxLateUs = static_cast<double>(x.maxLateNs) / 1e3;
      o.waitCausedUs = x.waitCausedNs / 1e3;
    }
    return Status::ok();
  });
}

loomResult_t loomAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                           loomDataType_t datatype, loomRedOp_t op, loomComm_t comm,
                           loomStream_t stream) {
  return guardCall("loomAllReduce", [&] {
    return collective(algo::Coll::AllReduce, sendbuff, recvbuff, count, datatype, op, -1, comm,
                      stream);
  });
}

loomResult_t loomBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                           loomDataType_t datatype, int root, loomComm_t comm,
                           loomStream_t stream) {
  return guardCall("loomBroadcast", [&] {
    return collective(algo::Coll::Broadcast, sendbuff, recvbuff, count, datatype, loomSum, root,
                      comm, stream);
  });
}

loomResult_t loomReduce(const void* sendbuff, void* recvbuff, size_t count, loomDataType_t datatype,
                        loomRedOp_t op, int root, loomComm_t comm, loomStream_t stream) {
  return guardCall("loomReduce", [&] {
    return collective(algo::Coll::Reduce, sendbuff, recvbuff, count, datatype, op, root, comm,
                      stream);
  });
}

loomResult_t loomAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                           loomDataType_t datatype, loomComm_t comm, loomStream_t stream) {
  return guardCall("loomAllGather", [&] {
    return collective(algo::Coll::AllGather, sendbuff, recvbuff, sendcount, datatype, loomSum, -1,
                      comm, stream);
  });
}

loomResult_t loomReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                               loomDataType_t datatype, loomRedOp_t op, loomComm_t comm,
                               loomStream_t stream) {
  return guardCall("loomReduceScatter", [&] {
    return collective(algo::Coll::ReduceScatter, sendbuff, recvbuff, recvcount, datatype, op, -1,
                      comm, stream);
  });
}

loomResult_t loomAllToAll(const void* sendbuff, void* recvbuff, size_t count,
                          loomDataType_t datatype, loomComm_t comm, loomStream_t stream) {
  return guardCall("loomAllToAll", [&] {
    return collective(algo::Coll::AllToAll, sendbuff, recvbuff, count, datatype, loomSum, -1, comm,
                      stream);
  });
}

loomResult_t loomAllToAllv(const void* sendbuff, const size_t sendcounts[], const size_t sdispls[],
                           void* recvbuff, const size_t recvcounts[], const size_t rdispls[],
                           loomDataType_t datatype, loomComm_t comm, loomStream_t stream) {
  return guardCall("loomAllToAllv", [&] {
    return allToAllv(sendbuff, sendcounts, sdispls, recvbuff, recvcounts, rdispls, datatype, comm,
                     stream);
  });
}

loomResult_t loomGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                        loomDataType_t datatype, int root, loomComm_t comm, loomStream_t stream) {
  return guardCall("loomGather", [&] {
    return rooted(true, sendbuff, recvbuff, sendcount, datatype, root, comm, stream);
  });
}

loomResult_t loomScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                         loomDataType_t datatype, int root, loomComm_t comm, loomStream_t stream) {
  return guardCall("loomScatter", [&] {
    return rooted(false, sendbuff, recvbuff, recvcount, datatype, root, comm, stream);
  });
}

loomResult_t loomSend(const void* sendbuff, size_t count, loomDataType_t datatype, int peer,
                      loomComm_t comm, loomStream_t stream) {
  return guardCall("loomSend", [&] {
    return pointToPoint(Call::Send, sendbuff, count, datatype, peer, comm, stream);
  });
}

loomResult_t loomRecv(void* recvbuff, size_t count, loomDataType_t datatype, int peer,
                      loomComm_t comm, loomStream_t stream) {
  return guardCall("loomRecv", [&] {
    return pointToPoint(Call::Recv, recvbuff, count, datatype, peer, comm, stream);
  });
}

loomResult_t loomSendTagged(const void* sendbuff, size_t count, loomDataType_t datatype, int peer,
                            int tag, loomComm_t comm, loomStream_t stream) {
  return guardCall("loomSendTagged", [&] {
    const Tagged tagged{tag, nullptr};
    return pointToPoint(Call::Send, sendbuff, count, datatype, peer, comm, stream, &tagged);
  });
}

loomResult_t loomRecvTagged(void* recvbuff, size_t count, loomDataType_t datatype, int peer,
                            int tag, int* source, loomComm_t comm, loomStream_t stream) {
  return guardCall("loomRecvTagged", [&] {
    const Tagged tagged{tag, source};
    return pointToPoint(Call::Recv, recvbuff, count, datatype, peer, comm, stream, &tagged);
  });
}

loomResult_t loomBarrier(loomComm_t comm, loomStream_t stream) {
  return guardCall("loomBarrier", [&]() -> Status {
    // A one-byte all-reduce over the data connections: when it returns,
    // every rank has entered the barrier.
    static thread_local uint8_t cell[2];
    return collective(algo::Coll::AllReduce, &cell[0], &cell[1], 1, loomUint8, loomMax, -1, comm);
  });
}

}  // extern "C"
