// Grouped sends and receives. Unlike a schedule, the operations of a group
// have no order between peers, so they progress together: each pass moves
// every piece that can move without waiting, and only when nothing moved
// does the rank wait (on the first unfinished operation's connection, briefly,
// so that the others are polled again soon). Sends to one peer leave in call
// order and are matched in order with that peer's receives.
#include <algorithm>
#include <cstring>
#include <deque>
#include <map>

#include "exec/executor.h"

namespace loom::exec {
namespace {

struct Cursor {
  const P2POp* op;
  size_t done = 0;  // bytes moved
};

}  // namespace

Status runP2P(Comm& comm, const std::vector<P2POp>& ops, const OpArgs& op) {
  Waiter waiter(comm, op);
  std::map<int, std::deque<Cursor>> sends, recvs;  // per peer, in call order
  std::deque<const P2POp*> selfSends, selfRecvs;
  for (const P2POp& o : ops) {
    if (o.peer == comm.rank())
      (o.isSend ? selfSends : selfRecvs).push_back(&o);
    else if (o.bytes > 0)
      (o.isSend ? sends : recvs)[o.peer].push_back({&o, 0});
  }
  // A rank's sends to itself are its receives from itself.
  if (selfSends.size() != selfRecvs.size())
    return LOOM_ERROR(loomInvalidUsage,
                      comm.describe() + ": group has " + std::to_string(selfSends.size()) +
                          " sends to itself but " + std::to_string(selfRecvs.size()) + " receives");
  for (size_t i = 0; i < selfSends.size(); ++i) {
    if (selfSends[i]->bytes != selfRecvs[i]->bytes)
      return LOOM_ERROR(loomInvalidUsage, comm.describe() +
                                              ": send to self and receive from self differ in "
                                              "size (count * type size)");
    std::memmove(selfRecvs[i]->buf, selfSends[i]->buf, selfSends[i]->bytes);
  }

  auto recvOverlaps = [&ops](const char* p, size_t n) {
    for (const P2POp& o : ops)
      if (!o.isSend && o.buf < p + n && p < o.buf + o.bytes) return true;
    return false;
  };
  for (;;) {
    bool moved = false, pending = false;
    transport::Connection* waitConn = nullptr;
    bool waitForSend = false;
    LOOM_CHECK(comm.progressNet());
    for (auto& [peer, q] : sends) {
      transport::Connection* c = comm.conn(peer);
      while (!q.empty()) {
        Cursor& cur = q.front();
        void* slot = c->trySendSlot();
        if (slot == nullptr) break;
        size_t n = std::min(c->slotBytes(), cur.op->bytes - cur.done);
        const char* from = cur.op->buf + cur.done;
        // Memory registered with an ib link's device goes from where it is (device memory
        // registered for GPUDirect RDMA must: the CPU cannot read it), unless this group
        // also receives into it.
        if (!(c->kind() == transport::Kind::Ib && !recvOverlaps(from, n) &&
              c->postSendFrom(from, n))) {
          std::memcpy(slot, from, n);
          c->postSend(n);
        }
        cur.done += n;
        moved = true;
        if (cur.done == cur.op->bytes) q.pop_front();
      }
      if (!q.empty() && waitConn == nullptr) {
        waitConn = c;
        waitForSend = true;
      }
      pending = pending || !q.empty();
    }
    for (auto& [peer, q] : recvs) {
      transport::Connection* c = comm.conn(peer);
      LOOM_CHECK(c->progress());
      while (!q.empty()) {
        Cursor& cur = q.front();
        size_t got = 0;
        const void* slot = c->tryRecvSlot(&got);
        if (slot == nullptr) break;
        size_t want = std::min(c->slotBytes(), cur.op->bytes - cur.done);
        if (got != want)
          return LOOM_ERROR(loomInvalidUsage,
                            comm.describe() + ": " + op.name + " #" + std::to_string(op.seq) +
                                ": rank " + std::to_string(peer) + " sent " + std::to_string(got) +
                                " bytes where " + std::to_string(want) +
                                " were expected; do loomSend and loomRecv counts match?");
        std::memcpy(cur.op->buf + cur.done, slot, got);
        c->releaseRecv();
        cur.done += got;
        moved = true;
        if (cur.done == cur.op->bytes) q.pop_front();
      }
      if (!q.empty() && waitConn == nullptr) waitConn = c;
      pending = pending || !q.empty();
    }
    if (!pending) break;
    if (moved) continue;
    // Nothing could move: block on one connection, waking when any pending
    // operation on any connection can move.
    auto anyReady = [&] {
      for (auto& [peer, q] : sends)
        if (!q.empty() && comm.conn(peer)->trySendSlot() != nullptr) return true;
      for (auto& [peer, q] : recvs) {
        size_t got;
        if (!q.empty() && comm.conn(peer)->tryRecvSlot(&got) != nullptr) return true;
      }
      return false;
    };
    transport::Connection* c = waitConn;
    LOOM_CHECK(waiter.until(c, waitForSend, anyReady, [&] {
      return std::string(waitForSend ? "sending" : "receiving") + ", grouped send/recv with rank " +
             std::to_string(c->peer());
    }));
  }
  return waiter.flush();
}

}  // namespace loom::exec
