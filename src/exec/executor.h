// The executor: runs a schedule (algorithms/schedule.h) over the
// communicator's connections, piece by piece, calling the reduction kernels.
//
// All waiting happens in Waiter: spin (polling the connection and every
// socket), then yield, then block on the connection (futex for shared
// memory, poll() for sockets). Every wait checks the abort flag, the
// operation's deadline, and, from 10 ms into the wait and then every 100 ms,
// whether a local peer's process still exists; a timeout names the
// operation, its sequence number, the step and the peer waited for.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "algorithms/kernels/cpu/reduce.h"
#include "algorithms/schedule.h"
#include "comm/comm.h"
#include "util/wait.h"

namespace loom::exec {

struct OpArgs {
  const char* name = "";  // "allreduce", ...
  uint64_t seq = 0;
  const void* sendbuff = nullptr;
  void* recvbuff = nullptr;
  size_t elemSize = 1;
  kernels::Reducer reducer;
  int64_t deadlineNs = 0;
  trace::OpRecord* record = nullptr;  // the flight recorder's entry, or null
  char* scratch = nullptr;       // the schedule's Buf::Scratch (Comm::scratch), when it has one
  char* const* group = nullptr;  // a SendRecv schedule's buffers (Schedule::group), in order
};

// What this rank knows of the operation's entry times, spread with the data: every slot sent
// after the news changed carries it (transport::Stamp), so after a ring's n - 1 hops every rank
// knows the earliest and the latest rank. Off (seq 0) when the recorder is.
struct ArrivalNews {
  transport::Stamp known;
  uint64_t version = 0;                                        // bumps when `known` changes
  std::vector<std::pair<uint64_t, uint64_t>>* sent = nullptr;  // per peer: (seq, version) stamped

  // Starts the news of operation `seq` with this rank's own entry on rank 0's clock.
  void start(uint64_t seq, int rank, int64_t enterNs);
  void merge(const transport::Stamp& s);
  // Stamps the next slot to `peer` when it has not heard the latest news.
  void stampIfNew(transport::Connection* c, int peer);
};

// Adds a wait that went past spinning to the operation's record.
struct WaitTimer {
  trace::OpRecord* record;
  int peer;
  const int64_t* since;
  ~WaitTimer() {
    if (*since != 0) trace::FlightRecorder::addWait(record, peer, nowNs() - *since);
  }
};

// Waits for one connection to become ready, with every check of the header.
class Waiter {
 public:
  Waiter(Comm& comm, const OpArgs& op) : comm_(comm), op_(op) {}

  // Returns once ready() is true. ready() must not block; what() describes
  // the wait for messages ("receiving, step 3 of 7"), called only when
  // the wait gets long.
  template <typename Ready, typename What>
  Status until(transport::Connection* conn, bool forSend, Ready&& ready, What&& what);

  // Returns once ready() is true, for a wait on a counter that rank `peer`
  // advances in shared memory: blocks on the futex `word`, registered in
  // `sleepers` so the peer knows to wake it.
  template <typename Ready, typename What>
  Status untilWord(int peer, std::atomic<uint32_t>* word, std::atomic<uint32_t>* sleepers,
                   Ready&& ready, What&& what);

  // Returns once every socket has written all it was given.
  Status flush();

 private:
  uint64_t spinCount() const { return comm_.spinCount(); }
  static void yieldCpu();
  // When a wait next looks at its peer's process, and whether it found it gone once.
  struct LiveCheck {
    int64_t nextNs = 0;
    bool goneOnce = false;
  };
  // The abort flag, the deadline and (now and then) the peer's process. what() is called
  // only to word an error. overSocket: the wait is on a socket, whose peer's last bytes may
  // still be in the kernel's queues when its process is gone (the socket then reports the
  // exit itself, after them): a process found gone fails the wait only if it still is at the
  // next look, when those bytes have had time to arrive.
  template <typename What>
  Status check(int peer, What&& what, LiveCheck* live, bool overSocket = false);
  Status abortedError() const;
  Status timedOut(int peer, const std::string& what) const;
  // A transport failure, put in the operation's terms (or the abort's).
  Status failed(Status s, const std::string& what, int peer);
  std::string where() const;
  void block(transport::Connection* conn, bool forSend);

  Comm& comm_;
  const OpArgs& op_;
};

// Runs this rank's schedule to completion: its FIFO steps here (executor.cc), its memory steps
// (a schedule with a window, Schedule::mem) in memory_steps.cc. With the recorder on, arrival
// news rides with the data and the record gets the earliest and latest ranks. *doneNs (when
// given): when the operation ended, where the steps read the clock at their end anyway, else 0.
Status run(Comm& comm, const algo::Schedule& schedule, const OpArgs& op, int64_t* doneNs = nullptr);
// The bodies of run(): memory steps (memory_steps.cc) and FIFO steps (fifo_steps.cc).
Status runMemory(Comm& comm, const algo::Schedule& schedule, const OpArgs& op, int64_t* doneNs);
Status runFifo(Comm& comm, const algo::Schedule& schedule, const OpArgs& op);

// Element `start` of the operation's buffer `ref` (send, receive, scratch, or a group's).
inline char* bufferAt(const OpArgs& op, const algo::BufRef& ref, size_t start) {
  if (ref.buf == algo::Buf::Group) return op.group[ref.offset] + start * op.elemSize;
  char* base = ref.buf == algo::Buf::Send ? const_cast<char*>(static_cast<const char*>(op.sendbuff))
               : ref.buf == algo::Buf::Recv ? static_cast<char*>(op.recvbuff)
                                            : op.scratch;
  return base + (ref.offset + start) * op.elemSize;
}

// A group of sends and receives (loomGroupStart/End; all-to-allv, gather, scatter), in call
// order: checks that its sends to this rank pair up with its receives from it (in order, equal
// sizes), builds its schedule (algo::buildGroup, counts in bytes) and runs it.
struct GroupOp {
  bool isSend = false;
  int peer = -1;
  char* buf = nullptr;  // const for sends
  size_t bytes = 0;
};
// The schedule is the communicator's (Comm::lastGroup), kept for the next group of this shape;
// *built says whether this call built it.
Result<const algo::Schedule*> groupSchedule(Comm& comm, const std::vector<GroupOp>& ops,
                                            bool* built = nullptr);

// One side of a tagged message (loomSendTagged, loomRecvTagged). Messages are not schedules: a
// receive from any rank is matched when a message arrives, by the communicator's inbox
// (comm/inbox.h), which also keeps messages that came before their receive.
struct MessageOp {
  bool isSend = false;
  int peer = -1;  // a receive's sender, or Inbox::kAnySource
  int tag = 0;
  char* buf = nullptr;  // const for sends
  size_t bytes = 0;
  int* source = nullptr;  // where a receive writes its sender's rank (may be null)
};
// Runs a group's messages together: each send goes out as its connection takes slots (it ends
// once its bytes have left this process, whether or not the peer has received them), each
// receive takes its message as it arrives, from the inbox or from the connections. With
// mayKeep (a non-blocking communicator's operation), once the sends are out and nothing more
// arrives, the receives still waiting are kept by the inbox (Inbox::kept(): they get the
// operation's ticket from the caller) and it returns Status(loomInProgress): the operation ends
// when they do, while the operations after it run.
Status runMessages(Comm& comm, const std::vector<MessageOp>& ops, const OpArgs& op,
                   bool mayKeep = false);
// Whether receives are kept; moves them (one look, then waits for news until untilNs) and
// calls finish for each that is done, failed, or past its deadline (then drops it). Under the
// operation lock.
bool hasKept(Comm& comm);
void progressKept(Comm& comm, int64_t untilNs,
                  const std::function<void(const Inbox::Receive&, const Status&)>& finish);

// --- template implementation ---

// A wait looks at a local peer's process (/proc, some microseconds) first this long into the
// wait, when most waits are over, then every kLiveCheckNs.
constexpr int64_t kFirstLiveCheckNs = 10'000'000;
constexpr int64_t kLiveCheckNs = 100'000'000;

template <typename What>
Status Waiter::check(int peer, What&& what, LiveCheck* live, bool overSocket) {
  if (comm_.aborted()) return abortedError();
  comm_.pollDumpRequest();
  const int64_t now = nowNs();
  if (now > op_.deadlineNs) return timedOut(peer, what());
  if (live->nextNs == 0) {
    live->nextNs = now + kFirstLiveCheckNs;
  } else if (now >= live->nextNs) {
    live->nextNs = now + kLiveCheckNs;
    Status s = comm_.checkPeerAlive(peer);
    if (!s.isOk() && overSocket && !live->goneOnce) {
      live->goneOnce = true;
      return Status::ok();
    }
    if (!s.isOk()) {
      comm_.noteLost(peer);
      return s.prefix(where() + ": " + what() + ": ");
    }
  }
  return Status::ok();
}

template <typename Ready, typename What>
Status Waiter::until(transport::Connection* conn, bool forSend, Ready&& ready, What&& what) {
  LiveCheck live;
  int64_t blockedSince = 0;
  WaitTimer timer{op_.record, conn->peer(), &blockedSince};
  // Polling a socket is a system call: spin briefly on sockets, longer on
  // shared memory (where other sockets are moved every 64 polls).
  const bool net = conn->wakeup() != transport::Wakeup::Self;
  const uint64_t spins = net ? comm_.netSpinCount() : spinCount();
  const uint64_t yields = comm_.yieldCount();
  for (uint64_t i = 0;; ++i) {
    Status s;
    // A socket is in the communicator's net list: the first look moves every socket, later
    // ones only those poll() reports ready.
    if (net)
      s = i == 0 ? comm_.progressNet() : comm_.progressNetReady();
    else if ((i & 63) == 0)
      s = comm_.progressNet();
    if (s.isOk() && !net) s = conn->progress();
    // Data that arrived counts even if the peer failed or left afterwards.
    if (ready()) return Status::ok();
    if (s.isOk() && !forSend) s = conn->checkRecv();
    // ready() may itself look at the connection (a receive from any rank ends its slice when
    // the peer has left): a failure found between its look and this one is its to see.
    if (!s.isOk()) return ready() ? Status::ok() : failed(s, what(), conn->peer());
    if (i < spins) {
      cpuRelax();
      continue;
    }
    if (i == spins) blockedSince = nowNs();
    s = check(conn->peer(), what, &live, net);
    if (!s.isOk()) return ready() ? Status::ok() : s;
    if (i < spins + yields)
      yieldCpu();
    else
      block(conn, forSend);
  }
}

template <typename Ready, typename What>
Status Waiter::untilWord(int peer, std::atomic<uint32_t>* word, std::atomic<uint32_t>* sleepers,
                         Ready&& ready, What&& what) {
  LiveCheck live;
  int64_t blockedSince = 0;
  WaitTimer timer{op_.record, peer, &blockedSince};
  const uint64_t spins = spinCount();
  const uint64_t yields = comm_.yieldCount();
  for (uint64_t i = 0;; ++i) {
    if (ready()) return Status::ok();
    if (i < spins) {
      cpuRelax();
      continue;
    }
    if (i == spins) blockedSince = nowNs();
    Status s = comm_.conn(peer)->progress();
    if (!s.isOk()) return ready() ? Status::ok() : failed(s, what(), peer);
    s = check(peer, what, &live);
    if (!s.isOk()) return ready() ? Status::ok() : s;
    if (i < spins + yields) {
      yieldCpu();
      continue;
    }
    uint32_t seen = word->load(std::memory_order_seq_cst);
    sleepers->fetch_add(1, std::memory_order_seq_cst);
    if (!ready()) futexWait(word, seen, 10000);
    sleepers->fetch_sub(1, std::memory_order_seq_cst);
  }
}

}  // namespace loom::exec
