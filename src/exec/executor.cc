#include "exec/executor.h"

#include <poll.h>
#include <sched.h>

#include <cstring>

#include "util/env.h"
#include "util/log.h"

namespace loom::exec {

using algo::Step;
using algo::StepOp;

void Waiter::yieldCpu() { sched_yield(); }

std::string Waiter::where() const {
  return comm_.describe() + ": " + op_.name + " #" + std::to_string(op_.seq);
}

Status Waiter::failed(Status s, const std::string& what, int peer) {
  if (comm_.aborted()) return abortedError();
  // The link names the rank lost first; where that rank shares this host, say whether its
  // process is gone (a shared-memory link that lost its own peer has said so already).
  transport::Connection* conn = comm_.conn(peer);
  const int lost = conn->lostRank();
  const bool tcp = conn->kind() == transport::Kind::Tcp;
  int cause = lost;
  std::string more;
  if (lost >= 0 && lost != comm_.rank() && (lost != peer || tcp)) {
    Status alive = comm_.checkPeerAlive(lost);
    if (!alive.isOk()) {
      more = "; " + alive.message();
    } else if (lost == peer && tcp && comm_.peer(peer).host == comm_.peer(comm_.rank()).host) {
      // A live peer of this host closed its socket without a goodbye naming why (it failed in
      // the middle of a frame, or its socket was full): a rank of this host whose process is
      // gone is the likely cause, named as such, and taken as the rank lost, when it is the
      // only one; several are listed.
      int dead = 0;
      for (int r = 0; r < comm_.nranks(); ++r) {
        if (r == peer || r == comm_.rank()) continue;
        if (Status gone = comm_.checkPeerAlive(r); !gone.isOk()) {
          cause = dead++ == 0 ? r : lost;
          more += "; " + gone.message();
        }
      }
      if (dead == 1) more += ", the likely cause";
    }
  }
  if (cause >= 0) comm_.noteLost(cause);
  s.prefix(where() + " (" + what + "): ");
  return more.empty() ? s : Status(s.code(), s.message() + more, s.file(), s.line());
}

Status Waiter::abortedError() const {
  return LOOM_ERROR(loomInvalidUsage, where() + " was aborted by loomCommAbort");
}

Status Waiter::timedOut(int peer, const std::string& what) const {
  std::string msg = where() + " timed out after " + std::to_string(comm_.options().timeoutMs) +
                    " ms waiting for rank " + std::to_string(peer) + " (" + what + ")";
  // On this host the peer publishes its last completed operation; elsewhere the last news
  // from it (the stamps riding with its data) says which operation it was last seen in.
  if (uint64_t last = comm_.peerLastSeq(peer))
    msg += "; rank " + std::to_string(peer) + " last completed operation #" + std::to_string(last);
  else if (uint64_t seen = comm_.recorder().peerSeenSeq(peer))
    msg += "; the last news from rank " + std::to_string(peer) + " is from operation #" +
           std::to_string(seen);
  return LOOM_ERROR(loomTimeout, msg);
}

void Waiter::block(transport::Connection* conn, bool forSend) {
  const auto& net = comm_.netConns();
  if (net.empty()) {
    conn->wait(forSend, 10000);
    return;
  }
  if (conn->wakeup() == transport::Wakeup::Self) {
    // A shared-memory wait in a communicator with sockets: wake often enough
    // to keep the sockets moving.
    conn->wait(forSend, 1000);
    return;
  }
  pollfd fds[64];
  nfds_t n = 0;
  for (transport::Connection* c : net) {
    if (n == 64) break;
    if (c->prepareWait()) return;  // news arrived while arming: progress instead
    short ev = c->pollEvents();
    if (ev != 0) fds[n++] = {c->fd(), ev, 0};
  }
  poll(fds, n, 10);
}

Status Waiter::flush() {
  for (transport::Connection* c : comm_.netConns()) {
    if (c->flushed()) continue;  // nothing left to write: no system call
    LOOM_CHECK(until(
        c, true, [c] { return c->flushed(); }, [] { return std::string("flushing sends"); }));
  }
  return Status::ok();
}

void ArrivalNews::start(uint64_t seq, int rank, int64_t enterNs) {
  known = {seq, enterNs, enterNs, rank, rank};
  version = 1;
}

void ArrivalNews::merge(const transport::Stamp& s) {
  if (known.seq == 0 || s.seq != known.seq) return;
  if (s.earliestNs < known.earliestNs) {
    known.earliestNs = s.earliestNs;
    known.earliestRank = s.earliestRank;
    ++version;
  }
  if (s.latestNs > known.latestNs) {
    known.latestNs = s.latestNs;
    known.latestRank = s.latestRank;
    ++version;
  }
}

void ArrivalNews::stampIfNew(transport::Connection* c, int peer) {
  if (known.seq == 0 || sent == nullptr) return;
  auto& last = (*sent)[static_cast<size_t>(peer)];
  if (last.first == known.seq && last.second == version) return;
  last = {known.seq, version};
  c->stampNext(known);
}

Status run(Comm& comm, const algo::Schedule& schedule, const OpArgs& op, int64_t* doneNs) {
  int64_t unused = 0;
  if (schedule.mem.slots > 0) return runMemory(comm, schedule, op, doneNs ? doneNs : &unused);
  return runFifo(comm, schedule, op);
}

}  // namespace loom::exec
