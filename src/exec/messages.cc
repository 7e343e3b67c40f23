// Tagged messages (executor.h, runMessages): sends cut into their connections' slots, each
// stamped as a message's (transport::Stamp), and receives matched by the inbox (comm/inbox.h).
#include <algorithm>
#include <cstring>
#include <string>

#include "comm/inbox.h"
#include "exec/executor.h"

namespace loom::exec {
namespace {

std::string fromText(int peer) {
  return peer == Inbox::kAnySource ? std::string("any rank") : "rank " + std::to_string(peer);
}

// How long a receive from any rank sleeps on one peer's connection before it looks at them
// all again: shorter than a wait's first look at the peer's process (kFirstLiveCheckNs), which
// would fail the receive for one peer gone; noteClosed() looks instead.
constexpr int64_t kSliceNs = kFirstLiveCheckNs / 2;

class MessageRun {
 public:
  MessageRun(Comm& comm, const std::vector<MessageOp>& ops, const OpArgs& op)
      : comm_(comm), ops_(ops), op_(op), inbox_(comm.inbox()), waiter_(comm, op) {}

  ~MessageRun() {
    for (Inbox::Want& w : wants_) inbox_.unpost(&w);
  }

  Status run() {
    const int self = comm_.rank();
    sent_.assign(ops_.size(), 0);
    closed_.assign(static_cast<size_t>(comm_.nranks()), 0);
    sendDone_.assign(ops_.size(), false);
    wants_.reserve(ops_.size());  // posted by address: no reallocation from here on
    for (const MessageOp& m : ops_) {
      if (m.isSend) continue;
      Inbox::Want w;
      w.peer = m.peer;
      w.tag = m.tag;
      w.buf = m.buf;
      w.bytes = m.bytes;
      wants_.push_back(w);
    }
    for (Inbox::Want& w : wants_) inbox_.post(&w);
    for (size_t i = 0; i < ops_.size(); ++i) {
      const MessageOp& m = ops_[i];
      if (!m.isSend || m.peer != self) continue;
      inbox_.deliverLocal(self, m.tag, m.buf, m.bytes);
      sendDone_[i] = true;
    }
    // Only a message to itself sent before or in this group reaches a receive from this rank
    // itself: refused before anything moved, the communicator stays usable.
    for (const Inbox::Want& w : wants_)
      if (!w.done && (w.peer == self || (w.peer == Inbox::kAnySource && comm_.nranks() == 1)))
        return LOOM_ERROR(loomInvalidArgument,
                          "peer: " + std::to_string(w.peer) + ", a receive tagged " +
                              std::to_string(w.tag) + " from this rank (" + comm_.describe() +
                              ") itself, with no message to itself sent before it or in its "
                              "group");
    for (;;) {
      LOOM_CHECK(comm_.progressNet());
      bool moved = false;
      for (size_t i = 0; i < ops_.size(); ++i)
        if (ops_[i].isSend && !sendDone_[i] && pushSlots(i)) moved = true;
      if (inbox_.finishStored()) moved = true;
      for (int p = 0; p < comm_.nranks(); ++p) {
        if (p == self || !reads(p)) continue;
        LOOM_ASSIGN(size_t taken, inbox_.absorb(comm_.conn(p), p));
        if (taken > 0) moved = true;
      }
      if (finished()) break;
      if (!moved) LOOM_CHECK(block());
    }
    for (size_t i = 0, k = 0; i < ops_.size(); ++i) {
      if (ops_[i].isSend) continue;
      const Inbox::Want& w = wants_[k++];
      if (Status e = w.error; !e.isOk())
        return e.prefix(comm_.describe() + ": " + op_.name + " #" +
                              std::to_string(op_.seq) + ": ");
      if (ops_[i].source != nullptr) *ops_[i].source = w.source;
    }
    return waiter_.flush();
  }

 private:
  // Fills the free slots of send i's connection; true when it posted one.
  bool pushSlots(size_t i) {
    const MessageOp& m = ops_[i];
    transport::Connection* c = comm_.conn(m.peer);
    bool posted = false;
    while (!sendDone_[i]) {
      void* slot = c->trySendSlot();
      if (slot == nullptr) break;
      const size_t len = std::min(c->slotBytes(), m.bytes - sent_[i]);
      if (len > 0) std::memcpy(slot, m.buf + sent_[i], len);
      transport::Stamp st;
      st.message = sent_[i] == 0 ? transport::kMessageHead : transport::kMessageBody;
      st.tag = m.tag;
      st.messageBytes = m.bytes;
      c->stampNext(st);
      c->postSend(len);
      sent_[i] += len;
      sendDone_[i] = sent_[i] == m.bytes;
      posted = true;
    }
    return posted;
  }

  // Whether this run reads rank p's connection: an unfinished receive may take a message from
  // it, or a send still waits for slots. A waiting send keeps every connection's messages moving
  // (into the store when no receive of this run wants them), so that ranks that all send large
  // messages before they receive (a ring of isends) do not wait on each other.
  bool reads(int p) const {
    for (size_t i = 0; i < ops_.size(); ++i)
      if (ops_[i].isSend && !sendDone_[i]) return true;
    for (const Inbox::Want& w : wants_)
      if (!w.done && (w.peer == p || w.peer == Inbox::kAnySource)) return true;
    return false;
  }

  // Whether this run waits on rank p's connection: it reads it, and p has not closed it.
  bool watches(int p) const { return p != comm_.rank() && !closed_[p] && reads(p); }

  // Looks at the connections the receives wait on. A peer that has closed its connection (it
  // destroyed its communicator, or its process ended) with nothing left to read fails a receive
  // from it; a receive from any rank goes on with the others, and fails once none is left.
  Status noteClosed() {
    const int self = comm_.rank(), n = comm_.nranks();
    std::string gone;
    size_t got = 0;
    for (int p = 0; p < n; ++p) {
      if (p == self || !reads(p)) continue;
      if (!closed_[p]) {
        transport::Connection* c = comm_.conn(p);
        Status h = c->progress();
        if (h.isOk()) h = c->checkRecv();
        if (h.isOk() && c->tryRecvSlot(&got) == nullptr) h = comm_.checkPeerAlive(p);
        if (h.isOk()) continue;
        for (const Inbox::Want& w : wants_)
          if (!w.done && w.peer == p) return failed(h, w);
        closed_[p] = 1;
        if (closedWhy_.isOk()) closedWhy_ = h;
      }
      gone += (gone.empty() ? "" : ", ") + std::to_string(p);
    }
    for (const Inbox::Want& w : wants_) {
      if (w.done || w.peer != Inbox::kAnySource) continue;
      bool open = false;
      for (int p = 0; p < n && !open; ++p) open = p != self && !closed_[p];
      if (!open)
        return failed(Status(closedWhy_).prefix("every other rank has closed its connection (ranks " +
                                        gone + "); first "),
                      w);
    }
    return Status::ok();
  }

  Status failed(Status s, const Inbox::Want& w) const {
    return s.prefix(comm_.describe() + ": " + op_.name + " #" + std::to_string(op_.seq) +
                    ": receiving a message tagged " + std::to_string(w.tag) + " from " +
                    fromText(w.peer) + ": ");
  }

  bool finished() const {
    for (size_t i = 0; i < ops_.size(); ++i)
      if (ops_[i].isSend && !sendDone_[i]) return false;
    for (const Inbox::Want& w : wants_)
      if (!w.done) return false;
    return true;
  }

  // Nothing moved: sleeps on one connection until something may move (a send's slot frees, a
  // message reaches a receive's connection). A receive from any rank sleeps on its peers'
  // connections in turn, the sockets all at once.
  Status block() {
    const int self = comm_.rank();
    transport::Connection* on = nullptr;
    bool forSend = false;
    std::string what;
    for (size_t i = 0; i < ops_.size() && on == nullptr; ++i) {
      if (!ops_[i].isSend || sendDone_[i]) continue;
      on = comm_.conn(ops_[i].peer);
      forSend = true;
      what = "sending a message tagged " + std::to_string(ops_[i].tag) + " to rank " +
             std::to_string(ops_[i].peer);
    }
    if (on == nullptr) {
      LOOM_CHECK(noteClosed());
      const int n = comm_.nranks();
      // A schedule's slot at a connection's head is a later operation's: waiting there would
      // not sleep, so a connection with nothing at its head comes first.
      for (int pass = 0; pass < 2 && on == nullptr; ++pass)
        for (int k = 0; k < n && on == nullptr; ++k) {
          const int p = (turn_ + k) % n;
          size_t got = 0;
          if (!watches(p) || (pass == 0 && comm_.conn(p)->tryRecvSlot(&got) != nullptr))
            continue;
          on = comm_.conn(p);
        }
      turn_ = (turn_ + 1) % n;
      for (const Inbox::Want& w : wants_)
        if (!w.done) {
          what = "receiving a message tagged " + std::to_string(w.tag) + " from " +
                 fromText(w.peer);
          break;
        }
    }
    if (on == nullptr)  // cannot happen: run() refused receives only this rank could satisfy
      return LOOM_ERROR(loomInternalError, comm_.describe() + ": a message wait with no peer");
    // A receive from several ranks sleeps on one connection for a slice at a time, so that each
    // peer's connection is watched in turn (a peer that left is noticed by noteClosed()).
    // A peer that closes its connection meanwhile ends the slice: the next look drops it.
    int candidates = 0;
    for (int p = 0; p < comm_.nranks(); ++p) candidates += watches(p);
    bool anySource = false;
    for (const Inbox::Want& w : wants_) anySource = anySource || (!w.done && w.peer < 0);
    const int64_t sliceEnd = !forSend && (candidates > 1 || anySource) ? nowNs() + kSliceNs : 0;
    auto ready = [&] {
      if (sliceEnd != 0 && nowNs() > sliceEnd) return true;
      if (!forSend && anySource && !on->checkRecv().isOk()) return true;
      for (size_t i = 0; i < ops_.size(); ++i)
        if (ops_[i].isSend && !sendDone_[i] && comm_.conn(ops_[i].peer)->trySendSlot() != nullptr)
          return true;
      for (int p = 0; p < comm_.nranks(); ++p)
        if (watches(p) && Inbox::messageAtHead(comm_.conn(p))) return true;
      return false;
    };
    return waiter_.until(on, forSend, ready, [&] { return what; });
  }

  Comm& comm_;
  const std::vector<MessageOp>& ops_;
  const OpArgs& op_;
  Inbox& inbox_;
  Waiter waiter_;
  std::vector<Inbox::Want> wants_;  // the receives, in op order
  std::vector<size_t> sent_;
  std::vector<bool> sendDone_;
  int turn_ = 0;
  std::vector<char> closed_;  // per peer: its connection closed (noteClosed)
  Status closedWhy_;          // the first such closing
};

}  // namespace

Status runMessages(Comm& comm, const std::vector<MessageOp>& ops, const OpArgs& op) {
  return MessageRun(comm, ops, op).run();
}

}  // namespace loom::exec
