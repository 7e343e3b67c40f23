// The executor: runs a schedule (algorithms/schedule.h) over the
// communicator's connections, piece by piece, calling the reduction kernels.
//
// All waiting happens in Waiter: spin (polling the connection and every
// socket), then yield, then block on the connection (futex for shared
// memory, poll() for sockets). Every wait checks the abort flag, the
// operation's deadline, and, about every 100 ms, whether a local peer's
// process still exists; a timeout names the operation, its sequence number,
// the step and the peer waited for.
#pragma once

#include <cstdint>
#include <string>
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

  // Returns once every socket has written all it was given.
  Status flush();

 private:
  static uint64_t spinCount();
  static void yieldCpu();
  Status check(transport::Connection* conn, const std::string& what, int64_t* nextLiveCheck);
  void block(transport::Connection* conn, bool forSend);

  Comm& comm_;
  const OpArgs& op_;
};

// Runs this rank's schedule to completion.
Status run(Comm& comm, const algo::Schedule& schedule, const OpArgs& op);

struct P2POp {
  bool isSend = false;
  int peer = -1;
  char* buf = nullptr;  // const for sends
  size_t bytes = 0;
};

// Runs a group's sends and receives together (src/exec/p2p.cc). Sends to one
// peer are matched in order with that peer's receives.
Status runP2P(Comm& comm, const std::vector<P2POp>& ops, const OpArgs& op);

// --- template implementation ---

template <typename Ready, typename What>
Status Waiter::until(transport::Connection* conn, bool forSend, Ready&& ready, What&& what) {
  int64_t nextLiveCheck = 0;
  const uint64_t spins = spinCount();
  for (uint64_t i = 0;; ++i) {
    LOOM_CHECK(comm_.progressNet());
    LOOM_CHECK(conn->progress());
    if (ready()) return Status::ok();
    if (i < spins) {
      cpuRelax();
      continue;
    }
    LOOM_CHECK(check(conn, what(), &nextLiveCheck));
    if (i < spins + 16)
      yieldCpu();
    else
      block(conn, forSend);
  }
}

}  // namespace loom::exec
