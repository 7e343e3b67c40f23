// Internals of the C API shared by api.cc and group.cc: the handle behind
// loomComm_t, the guard every entry point runs in, and the queued calls that
// groups collect.
#pragma once

#include <algorithm>
#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "algorithms/schedule.h"
#include "api/async.h"
#include "comm/comm.h"
#include "loom/loom.h"

// impl is null while a non-blocking communicator initialises (and stays null if that fails);
// it is set, and read by other threads, under the registry's mutex.
struct loomComm {
  std::unique_ptr<loom::Comm> impl;
  std::unique_ptr<loom::api::AsyncWorker> worker;  // non-blocking communicators only
  std::atomic<bool> abortRequested{false};         // loomCommAbort, seen by a running init
  std::atomic<bool> finalized{false};  // loomCommFinalize: no operation may start after it
  uint32_t shrinks = 0;                // loomCommShrink calls so far: each derives a different id
  int64_t timeoutMs = 0;               // the communicator's timeout (loomCommWaitTicket's default)
  // Set as loomCommDestroy or loomCommAbort starts, under the registry's mutex: no call pins
  // the handle after it. pins: the calls in flight that found it live (loom::api::PinnedComm).
  // A handle's memory is never freed, so that a call that found it live can always pin it (and
  // find it dead); destroy frees what it holds once no call pins it.
  std::atomic<bool> dead{false};
  std::atomic<uint32_t> pins{0};
  // A blocking initialisation deferred to its group's end failed (under the registry's mutex).
  loom::Status initError;
  // A split's or shrink's communicator made at its group's end: the parent whose
  // loomCommAbort ends its creation too (destroy raises abortRequested here).
  const loomComm* abortsWith = nullptr;
};

namespace loom::api {

// Runs f, turning every failure (a Status or an exception) into a result
// code and this thread's last-error text. Nothing escapes. A template, so that
// a call's lambda is not copied into a std::function (a heap allocation per
// call once it captures more than two words).
loomResult_t guardFailed(const char* fn, const Status& s);
loomResult_t guardException(const char* fn);  // inside a catch block only
// guardFailed for a call a group queues (a collective, a send or a receive): inside a group,
// its failure fails the group too, so that loomGroupEnd runs none of the group's calls and
// returns the failure, as NCCL's group does (src/api/group.cc).
loomResult_t callFailed(const char* fn, const Status& s);
// Fails this thread's open group with s (the first failure is kept); nothing outside a group.
void failGroup(const Status& s);
const char* lastError();  // this thread's last error text
template <typename F>
loomResult_t guard(const char* fn, F&& f) {
  try {
    const Status s = f();
    return s.isOk() ? loomSuccess : guardFailed(fn, s);
  } catch (...) {
    return guardException(fn);
  }
}
// guard for a call a group queues (callFailed).
template <typename F>
loomResult_t guardCall(const char* fn, F&& f) {
  try {
    const Status s = f();
    return s.isOk() ? loomSuccess : callFailed(fn, s);
  } catch (...) {
    const loomResult_t r = guardException(fn);
    failGroup(Status(r, lastError()));
    return r;
  }
}
void setLastError(const std::string& message);

// Registry of live communicators, so a destroyed or bogus handle is an error.
void registerComm(loomComm* c);
void unregisterComm(loomComm* c);
// A live communicator, pinned for as long as this lives: loomCommDestroy and loomCommAbort on
// another thread wait for the call to leave before they free it. Converts to the Comm*.
class PinnedComm {
 public:
  PinnedComm(loomComm* h, Comm* c) : h_(h), c_(c) {}
  PinnedComm(PinnedComm&& o) noexcept : h_(o.h_), c_(o.c_) { o.h_ = nullptr; }
  PinnedComm& operator=(PinnedComm&&) = delete;
  ~PinnedComm() {
    if (h_ != nullptr) h_->pins.fetch_sub(1, std::memory_order_release);
  }
  operator Comm*() const { return c_; }  // NOLINT: implicit by design (LOOM_ASSIGN(Comm* c, ...))

 private:
  loomComm* h_;
  Comm* c_;
};

// loomInvalidArgument naming `argName` unless c is a live communicator; loomInvalidUsage
// while a non-blocking communicator still initialises or after its initialisation failed.
// The communicator stays pinned while the result (or what it was moved into) lives.
Result<PinnedComm> lookup(loomComm* c, const char* argName = "comm");

// loomCommLastTicket and loomCommWaitTicket (a wait of -1 adds waitGraceMs, util/wait.h).
Status lastTicket(loomComm* h, uint64_t* ticket);
Status waitTicket(loomComm* h, uint64_t ticket, int timeoutMs);
// Refuses a new operation (or split, shrink, registration) on a finalized communicator.
inline Status checkNotFinalized(const loomComm* h) {
  if (h->finalized.load(std::memory_order_relaxed))
    return LOOM_ERROR(loomInvalidUsage,
                      "comm: finalized by loomCommFinalize; it can only be destroyed now");
  return Status::ok();
}

// Creates this rank's communicator with resolved options: at once (blocking), at the group's
// end (blocking, inside a group: deferInit), or in the background of a new worker
// (non-blocking: returns inProgress() with *out already set).
// parent: the communicator a split or shrink makes it from, whose loomCommAbort ends a blocking
// creation (the caller holds parent's operation lock, which the abort waits for).
Status initComm(loomComm_t* out, int nranks, const loomUniqueId& id, int rank,
                const CommOptions& opts, const loomComm* parent = nullptr);

// One queued call: a collective or one side of a send/receive.
struct Call {
  enum Kind { Collective, Send, Recv } kind = Collective;
  algo::Coll coll = algo::Coll::AllReduce;
  const void* sendbuff = nullptr;
  void* recvbuff = nullptr;
  size_t count = 0;
  loomDataType_t dtype = loomFloat32;
  loomRedOp_t op = loomSum;
  int root = -1;  // root, or peer for Send/Recv
  loomComm* comm = nullptr;
  loomStream_t stream = nullptr;  // device buffers only (api/device.h)
  // Set when the call was queued on a non-blocking communicator's worker: its sequence
  // number and flight-recorder entry (state Enqueued), taken when the caller made it. For
  // send/receive calls, the group's first one carries them.
  uint64_t seq = 0;
  trace::OpRecord* queued = nullptr;
  uint64_t tag = 0;  // loomCommSetOpTag's, taken when the call was issued (0: none)
  // A tagged message (loomSendTagged, loomRecvTagged): its tag, and where a receive writes its
  // sender (root is the peer, or LOOM_ANY_SOURCE).
  bool message = false;
  int messageTag = 0;
  int* source = nullptr;
  // A PreMulSum operation's reducer, copied when the call was made (submit), so that the
  // operation may be destroyed as soon as the call returns, as NCCL allows, and a queued call
  // never reads the communicator's table of operations from another thread.
  bool ownReducer = false;
  kernels::Reducer reducer;
  // A device call staged through host memory (api/device.cc): it runs on CUDA's host-callback
  // thread, where LOOM_CHECK_CALLS does not compare it (the ring is the caller's thread's).
  bool staged = false;
};

// Calls of one communicator, viewed where they lie: a group's vector, or one call on the
// caller's stack (a call outside a group copies nothing and allocates nothing).
class CallList {
 public:
  CallList(const std::vector<Call>& calls) : first_(calls.data()), n_(calls.size()) {}  // NOLINT
  explicit CallList(const Call& one) : first_(&one), n_(1) {}
  const Call* begin() const { return first_; }
  const Call* end() const { return first_ + n_; }
  size_t size() const { return n_; }
  bool empty() const { return n_ == 0; }
  const Call& operator[](size_t i) const { return first_[i]; }

 private:
  const Call* first_;
  size_t n_;
};

// Every run of calls first refuses a communicator that failed earlier, naming that failure.
Status refuseIfFailed(const Comm& comm);

// The direct all-reduce's parameters on this communicator before a call's own (element size,
// pre-scale, in place, exposed input): its windows, the CPU's thresholds, LOOM_DIRECT_*,
// LOOM_PROTO and the limits measured at start-up. Only where comm.hasDirect().
algo::DirectParams directBase(const Comm& comm);

// The reduction of a call (built-in op or the communicator's PreMulSum).
Result<kernels::Reducer> reducerFor(Comm& comm, const Call& c);

// Runs the call now, queues it when this thread is inside a group, or hands it to the
// communicator's worker (non-blocking: returns inProgress()). comm: lookup(call.comm), done by
// the caller.
Status submit(Call& call, Comm* comm);
bool inGroup();
// Inside a group, a blocking initialisation, split or shrink is deferred to the outermost
// loomGroupEnd, which runs the group's creations at once, one thread each (as NCCL's group lets
// one thread initialise or split several ranks' communicators). init makes h's communicator; h
// was made, registered and returned already (NULL: a split's rank without a colour, which only
// takes part).
// parent: the communicator a split or shrink is made from (NULL for an initialisation).
struct DeferredInit {
  loomComm* handle;
  const loomComm* parent;
  std::function<Status()> init;
};
void deferInit(loomComm* h, std::function<Status()> init, const loomComm* parent = nullptr);
// Marks h's deferred initialisation failed with s (nothing for a NULL h).
void failInit(loomComm* h, const Status& s);
// Runs the calls that issue() submits as one group, as loomGroupStart, issue, loomGroupEnd
// would (within an enclosing group they join it). Where issue() fails, the calls it queued
// are dropped and its status returned.
Status runAsGroup(const std::function<Status()>& issue);

// Runs calls of one communicator: sends/receives together first, then the
// collectives in call order (every rank issues the same sequence).
Status runOnComm(Comm& comm, CallList calls);

}  // namespace loom::api
