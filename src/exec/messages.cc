// Tagged messages (executor.h, runMessages): sends cut into their connections' slots, each
// stamped as a message's (transport::Stamp), and receives matched by the inbox (comm/inbox.h).
#include <algorithm>
#include <cstring>
#include <functional>
#include <iterator>
#include <list>
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

// A run of messages: a group's sends and receives (run()), or the receives a non-blocking
// communicator kept (progress()). Its receives live in a list, so that the inbox's pointers to
// them stay valid when a run hands the unfinished ones over to the kept list.
class MessageRun {
 public:
  MessageRun(Comm& comm, const std::vector<MessageOp>& ops, const OpArgs& op,
             std::list<Inbox::Receive>* recvs)
      : comm_(comm),
        ops_(ops),
        op_(op),
        inbox_(comm.inbox()),
        waiter_(comm, op),
        recvs_(recvs != nullptr ? *recvs : own_) {
    sent_.assign(ops_.size(), 0);
    sendDone_.assign(ops_.size(), false);
    closed_.assign(static_cast<size_t>(comm_.nranks()), 0);
  }

  ~MessageRun() {
    for (Inbox::Receive& r : own_) inbox_.unpost(&r.want);
  }

  // mayKeep: a receive still waiting once nothing moves is handed to the kept list
  // (Status(loomInProgress)) rather than waited for.
  Status run(bool mayKeep) {
    const int self = comm_.rank();
    for (const MessageOp& m : ops_) {
      if (m.isSend) continue;
      Inbox::Receive& r = own_.emplace_back();
      r.want.peer = m.peer;
      r.want.tag = m.tag;
      r.want.buf = m.buf;
      r.want.bytes = m.bytes;
      r.source = m.source;
      r.seq = op_.seq;
      r.record = op_.record;
      r.deadlineNs = op_.deadlineNs;
    }
    for (Inbox::Receive& r : own_) inbox_.post(&r.want);
    for (size_t i = 0; i < ops_.size(); ++i) {
      const MessageOp& m = ops_[i];
      if (!m.isSend || m.peer != self) continue;
      inbox_.deliverLocal(self, m.tag, m.buf, m.bytes);
      sendDone_[i] = true;
    }
    // Only a message to itself sent before or in this group reaches a receive from this rank
    // itself: refused before anything moved, the communicator stays usable.
    for (const Inbox::Receive& r : own_) {
      const Inbox::Want& w = r.want;
      if (!w.done && (w.peer == self || (w.peer == Inbox::kAnySource && comm_.nranks() == 1)))
        return LOOM_ERROR(loomInvalidArgument,
                          "peer: " + std::to_string(w.peer) + ", a receive tagged " +
                              std::to_string(w.tag) + " from this rank (" + comm_.describe() +
                              ") itself, with no message to itself sent before it or in its "
                              "group");
    }
    for (;;) {
      LOOM_ASSIGN(bool moved, pass());
      if (finished()) break;
      if (moved) continue;
      if (mayKeep && sendsDone()) {
        // Sends out, receives waiting: the operation ends here and its receives are kept, each
        // finished when its message comes (progressKept), while later operations run.
        LOOM_CHECK(waiter_.flush());
        LOOM_CHECK(results());  // a receive that failed fails the operation: none is kept
        std::list<Inbox::Receive>& kept = inbox_.kept();
        for (auto it = own_.begin(); it != own_.end();) {
          auto next = std::next(it);
          if (!it->want.done) kept.splice(kept.end(), own_, it);
          it = next;
        }
        return Status(loomInProgress, "");
      }
      LOOM_CHECK(block(0));
    }
    LOOM_CHECK(results());
    return waiter_.flush();
  }

  // One look at the kept receives (no sends), then waits for news until untilNs or until one
  // receive ends; finishes the receives that are done, or failed, or past their deadline
  // (finish(receive, result)).
  void progress(int64_t untilNs,
                const std::function<void(const Inbox::Receive&, const Status&)>& finish) {
    for (bool ended = false;;) {
      Result<bool> moved = pass();
      if (!moved.isOk()) {  // a connection broke: every receive waiting fails with it
        for (Inbox::Receive& r : recvs_)
          if (!r.want.done) fail(r.want, moved.status());
      }
      const int64_t now = nowNs();
      for (auto it = recvs_.begin(); it != recvs_.end();) {
        auto next = std::next(it);
        Inbox::Want& w = it->want;
        if (!w.done && now > it->deadlineNs)
          fail(w, LOOM_ERROR(loomTimeout, receiving(w) + "timed out after " +
                                              std::to_string(comm_.options().timeoutMs) + " ms"));
        if (w.done) {
          Status s = w.error;
          if (s.isOk() && it->source != nullptr) *it->source = w.source;
          if (!s.isOk())
            s.prefix(comm_.describe() + ": sendrecv #" + std::to_string(it->seq) + ": ");
          inbox_.unpost(&w);
          finish(*it, s);
          recvs_.erase(it);
          ended = true;
        }
        it = next;
      }
      if (ended || recvs_.empty() || nowNs() >= untilNs) return;
      if (!moved.isOk() || moved.value()) continue;
      if (!block(untilNs).isOk()) return;  // its deadline is the kept receives' own
    }
  }

 private:
  // Moves what can move without waiting: sends' slots, messages into the receives (or the
  // store); true when something moved. Looks at who has left when nothing did.
  Result<bool> pass() {
    const int self = comm_.rank();
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
    if (!moved) moved = noteClosed();
    return moved;
  }

  // The receives' outcome, in op order: the first failure, else their senders written out.
  Status results() {
    for (const Inbox::Receive& r : recvs_) {
      if (Status e = r.want.error; r.want.done && !e.isOk())
        return e.prefix(comm_.describe() + ": " + op_.name + " #" + std::to_string(op_.seq) + ": ");
      if (r.want.done && r.source != nullptr) *r.source = r.want.source;
    }
    return Status::ok();
  }

  bool sendsDone() const {
    for (size_t i = 0; i < ops_.size(); ++i)
      if (ops_[i].isSend && !sendDone_[i]) return false;
    return true;
  }

  void fail(Inbox::Want& w, const Status& s) {
    w.error = s;
    w.done = true;
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
    for (const Inbox::Receive& r : recvs_)
      if (!r.want.done && (r.want.peer == p || r.want.peer == Inbox::kAnySource)) return true;
    return false;
  }

  // Whether this run waits on rank p's connection: it reads it, and p has not closed it.
  bool watches(int p) const { return p != comm_.rank() && !closed_[p] && reads(p); }

  // Looks at the connections the receives wait on. A peer that has closed its connection (it
  // destroyed its communicator, or its process ended) with nothing left to read fails a receive
  // from it; a receive from any rank goes on with the others, and fails once none is left.
  // True when a failing connection still held message bytes, taken now (what arrived before a
  // peer failed counts): the connection is looked at again on the next pass.
  bool noteClosed() {
    const int self = comm_.rank(), n = comm_.nranks();
    std::string gone;
    for (int p = 0; p < n; ++p) {
      if (p == self || !reads(p)) continue;
      if (!closed_[p]) {
        transport::Connection* c = comm_.conn(p);
        // checkRecv() looks at a local peer's process now and then (shared memory) or sees
        // its socket closed: cheap enough for every look.
        Status h = c->progress();
        if (h.isOk()) h = c->checkRecv();
        if (h.isOk()) continue;
        if (Result<size_t> late = inbox_.absorb(c, p); !late.isOk())
          h = late.status();  // what it held was malformed: that is the failure to name
        else if (late.value() > 0)
          return true;
        for (Inbox::Receive& r : recvs_)
          if (!r.want.done && r.want.peer == p) fail(r.want, Status(h).prefix(receiving(r.want)));
        closed_[p] = 1;
        if (closedWhy_.isOk()) closedWhy_ = h;
      }
      gone += (gone.empty() ? "" : ", ") + std::to_string(p);
    }
    bool open = false;
    for (int p = 0; p < n && !open; ++p) open = p != self && !closed_[p];
    if (open) return false;
    for (Inbox::Receive& r : recvs_)
      if (!r.want.done && r.want.peer == Inbox::kAnySource)
        fail(r.want,
             Status(closedWhy_)
                 .prefix(receiving(r.want) + "every other rank has closed its connection (ranks " +
                         gone + "); first "));
    return false;
  }

  static std::string receiving(const Inbox::Want& w) {
    return "receiving a message tagged " + std::to_string(w.tag) + " from " + fromText(w.peer) +
           ": ";
  }

  bool finished() const {
    if (!sendsDone()) return false;
    for (const Inbox::Receive& r : recvs_)
      if (!r.want.done) return false;
    return true;
  }

  // Nothing moved: sleeps on one connection until something may move (a send's slot frees, a
  // message reaches a receive's connection). A receive from any rank sleeps on its peers'
  // connections in turn, the sockets all at once.
  // untilNs (when not 0): returns by then, as if something had moved.
  Status block(int64_t untilNs) {
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
      const int n = comm_.nranks();
      // A schedule's slot at a connection's head is a later operation's: waiting there would
      // not sleep, so a connection with nothing at its head comes first.
      for (int pass = 0; pass < 2 && on == nullptr; ++pass)
        for (int k = 0; k < n && on == nullptr; ++k) {
          const int p = (turn_ + k) % n;
          size_t got = 0;
          if (!watches(p) || (pass == 0 && comm_.conn(p)->tryRecvSlot(&got) != nullptr)) continue;
          on = comm_.conn(p);
        }
      turn_ = (turn_ + 1) % n;
      for (const Inbox::Receive& r : recvs_)
        if (!r.want.done) {
          what = receiving(r.want);
          what.resize(what.size() - 2);
          break;
        }
    }
    if (on == nullptr)  // every peer has left: noteClosed() failed the receives
      return Status::ok();
    // A receive from several ranks sleeps on one connection for a slice at a time, so that each
    // peer's connection is watched in turn (a peer that left is noticed by noteClosed()).
    // A peer that closes its connection meanwhile ends the slice: the next look drops it.
    int candidates = 0;
    for (int p = 0; p < comm_.nranks(); ++p) candidates += watches(p);
    bool anySource = false;
    for (const Inbox::Receive& r : recvs_)
      anySource = anySource || (!r.want.done && r.want.peer < 0);
    const int64_t sliceEnd = !forSend && (candidates > 1 || anySource) ? nowNs() + kSliceNs : 0;
    auto ready = [&] {
      if (sliceEnd != 0 && nowNs() > sliceEnd) return true;
      if (untilNs != 0 && nowNs() >= untilNs) return true;
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
  std::list<Inbox::Receive> own_;     // run(): the group's receives, in op order
  std::list<Inbox::Receive>& recvs_;  // the receives this run moves: own_, or the kept ones
  std::vector<size_t> sent_;
  std::vector<bool> sendDone_;
  int turn_ = 0;
  std::vector<char> closed_;  // per peer: its connection closed (noteClosed)
  Status closedWhy_;          // the first such closing
};

}  // namespace

Status runMessages(Comm& comm, const std::vector<MessageOp>& ops, const OpArgs& op, bool mayKeep) {
  return MessageRun(comm, ops, op, nullptr).run(mayKeep);
}

bool hasKept(Comm& comm) { return !comm.inbox().kept().empty(); }

void progressKept(Comm& comm, int64_t untilNs,
                  const std::function<void(const Inbox::Receive&, const Status&)>& finish) {
  if (comm.inbox().kept().empty()) return;
  static const std::vector<MessageOp> kNoSends;
  OpArgs op;
  op.name = "sendrecv";
  op.deadlineNs = untilNs + kSliceNs;  // the waits end by untilNs; each receive has its own
  MessageRun(comm, kNoSends, op, &comm.inbox().kept()).progress(untilNs, finish);
}

}  // namespace loom::exec
