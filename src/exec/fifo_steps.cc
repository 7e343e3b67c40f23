// The executor's FIFO steps (algorithms/schedule.h): sends, receives and the reductions between
// them, piece by piece over the communicator's connections.
//
// A schedule's channels run one after another, each blocking on its next piece, unless they
// are independent (Schedule::independent: no pair of ranks carries two channels' messages);
// then they run at once, as the verifier models them: each pass moves every piece that can
// move without waiting, and only when nothing moved does the rank wait, on the first blocked
// channel's connection, waking when any channel can move. A group of sends and receives
// (buildGroup) is such a schedule.
#include <algorithm>
#include <cstring>

#include "exec/executor.h"

namespace loom::exec {
namespace {

using algo::Step;
using algo::StepOp;

bool transforms(const kernels::Reducer& r, uint16_t flags) {
  return ((flags & algo::kPre) && r.hasScale) || ((flags & algo::kPost) && r.postDivide > 1);
}

std::string stepText(const Step& st, size_t i, size_t n, size_t piece, size_t pieces) {
  return std::string(algo::stepOpName(st.op)) + ", step " + std::to_string(i + 1) + " of " +
         std::to_string(n) + ", piece " + std::to_string(piece + 1) + " of " +
         std::to_string(pieces);
}

// Whether a pending send on any socket still reads bytes in [data, data + bytes).
bool sendsOverlap(Comm& comm, const char* data, size_t bytes) {
  for (transport::Connection* c : comm.netConns())
    if (c->sendOverlaps(data, bytes)) return true;
  return false;
}

class FifoRun {
 public:
  FifoRun(Comm& comm, const algo::Schedule& s, const OpArgs& op)
      : comm_(comm), s_(s), op_(op), red_(op.reducer), waiter_(comm, op) {
    if (op.record != nullptr) {
      newsStore_.sent = comm.stampsSent();
      newsStore_.start(op.seq, comm.rank(), comm.recorder().toRank0(op.record->enterNs));
      news_ = &newsStore_;
    }
  }

  Status run() {
    if (s_.independent && s_.channels.size() > 1) {
      LOOM_CHECK(runTogether());
    } else {
      for (const std::vector<Step>& steps : s_.channels) LOOM_CHECK(runInTurn(steps));
    }
    LOOM_CHECK(waiter_.flush());
    if (news_ != nullptr) {
      const transport::Stamp& k = news_->known;
      comm_.recorder().noteExtremes(op_.record, k.earliestRank, k.earliestNs, k.latestRank,
                                    k.latestNs);
    }
    return Status::ok();
  }

 private:
  // Pieces of each step: cut to the smaller slot of its connections.
  size_t piecesOf(const Step& st) const {
    size_t slot = SIZE_MAX;
    if (st.recvPeer >= 0) slot = std::min(slot, comm_.conn(st.recvPeer)->slotBytes());
    if (st.sendPeer >= 0) slot = std::min(slot, comm_.conn(st.sendPeer)->slotBytes());
    return st.count == 0 ? 0 : slot == SIZE_MAX ? 1 : algo::numPieces(st.count, op_.elemSize, slot);
  }

  // One channel, blocking on each piece: round p runs piece p of every step that has one.
  Status runInTurn(const std::vector<Step>& steps) {
    std::vector<size_t>& pieces = comm_.execScratch().pieces;
    pieces.assign(steps.size(), 0);
    size_t rounds = 0;
    for (size_t i = 0; i < steps.size(); ++i)
      rounds = std::max(rounds, pieces[i] = piecesOf(steps[i]));
    for (size_t p = 0; p < rounds; ++p)
      for (size_t i = 0; i < steps.size(); ++i) {
        if (p >= pieces[i]) continue;
        bool done = false;
        LOOM_CHECK(piece(steps[i], i, steps.size(), p, pieces[i], true, &done));
      }
    return Status::ok();
  }

  // Every channel at once: each pass moves what can move; a pass that moves nothing waits.
  Status runTogether() {
    // Each channel's (step, piece) order, round-major, in the communicator's scratch (no
    // allocation once it has grown).
    Comm::ExecScratch& x = comm_.execScratch();
    const size_t nch = s_.channels.size();
    if (x.chanOrder.size() < nch) x.chanOrder.resize(nch);
    if (x.chanPieces.size() < nch) x.chanPieces.resize(nch);
    x.chanPos.assign(nch, 0);
    for (size_t c = 0; c < nch; ++c) {
      const std::vector<Step>& steps = s_.channels[c];
      std::vector<size_t>& pieces = x.chanPieces[c];
      std::vector<std::pair<uint32_t, uint32_t>>& order = x.chanOrder[c];
      pieces.clear();
      order.clear();
      size_t rounds = 0;
      for (const Step& st : steps) {
        pieces.push_back(piecesOf(st));
        rounds = std::max(rounds, pieces.back());
      }
      for (size_t p = 0; p < rounds; ++p)
        for (size_t i = 0; i < steps.size(); ++i)
          if (p < pieces[i]) order.emplace_back(static_cast<uint32_t>(i), p);
    }
    for (;;) {
      bool moved = false, pending = false;
      transport::Connection* waitConn = nullptr;
      bool waitForSend = false;
      LOOM_CHECK(comm_.progressNet());
      for (size_t c = 0; c < nch; ++c) {
        const std::vector<Step>& steps = s_.channels[c];
        const auto& order = x.chanOrder[c];
        size_t& pos = x.chanPos[c];
        while (pos < order.size()) {
          const auto [i, p] = order[pos];
          bool done = false;
          LOOM_CHECK(piece(steps[i], i, steps.size(), p, x.chanPieces[c][i], false, &done));
          if (!done) {
            if (waitConn == nullptr) {
              waitConn = blockedConn_;
              waitForSend = blockedForSend_;
            }
            break;
          }
          ++pos;
          moved = true;
        }
        pending = pending || pos < order.size();
      }
      if (!pending) return Status::ok();
      if (moved) continue;
      // Nothing could move: block on one connection, waking when any channel can move.
      auto anyReady = [&] {
        for (size_t c = 0; c < nch; ++c) {
          if (x.chanPos[c] == x.chanOrder[c].size()) continue;
          const Step& st = s_.channels[c][x.chanOrder[c][x.chanPos[c]].first];
          size_t got;
          if ((st.recvPeer < 0 || comm_.conn(st.recvPeer)->tryRecvSlot(&got) != nullptr) &&
              (st.sendPeer < 0 || comm_.conn(st.sendPeer)->trySendSlot() != nullptr))
            return true;
        }
        return false;
      };
      transport::Connection* c = waitConn;
      LOOM_CHECK(waiter_.until(c, waitForSend, anyReady, [&] {
        return std::string(waitForSend ? "sending to" : "receiving from") + " rank " +
               std::to_string(c->peer()) + ", " + algo::collName(s_.coll);
      }));
    }
  }

  // The next slot of a schedule's data from rc (*in null when none has come); the tagged
  // messages' slots before it go to the communicator's inbox, whose receive may come later.
  Status nextSlot(transport::Connection* rc, int peer, const void** in, size_t* got) {
    for (;;) {
      *in = rc->tryRecvSlot(got);
      if (*in == nullptr || rc->recvStamp().message == transport::kScheduleData)
        return Status::ok();
      LOOM_ASSIGN(size_t taken, comm_.inbox().absorb(rc, peer));
      (void)taken;
    }
  }

  // Runs piece p of step st. blocking: waits for its slots; else, where a slot is not there
  // yet, returns with *done false and blockedConn_ / blockedForSend_ naming what it waits for.
  Status piece(const Step& st, size_t i, size_t nsteps, size_t p, size_t pieces, bool blocking,
               bool* done) {
    size_t start, len;
    algo::pieceRange(st.count, pieces, p, &start, &len);
    const size_t bytes = len * op_.elemSize;
    const char* src = algo::stepReads(st.op) ? bufferAt(op_, st.src, start) : nullptr;
    char* dst = algo::stepWrites(st.op) ? bufferAt(op_, st.dst, start) : nullptr;
    transport::Connection* rc = algo::stepRecvs(st.op) ? comm_.conn(st.recvPeer) : nullptr;
    transport::Connection* sc = algo::stepSends(st.op) ? comm_.conn(st.sendPeer) : nullptr;
    const void* in = nullptr;
    void* out = nullptr;
    size_t got = 0;
    if (!blocking) {
      // Both slots or neither: trying either takes nothing until it is posted or released.
      if (sc != nullptr && (out = sc->trySendSlot()) == nullptr) {
        blockedConn_ = sc;
        blockedForSend_ = true;
        return Status::ok();
      }
      if (rc != nullptr) LOOM_CHECK(nextSlot(rc, st.recvPeer, &in, &got));
      if (rc != nullptr && in == nullptr) {
        blockedConn_ = rc;
        blockedForSend_ = false;
        return Status::ok();
      }
    }
    // Where the bytes to send end up in the user's buffers anyway (a plain send, or the result
    // this step writes to dst), a transport that copies regardless (TCP) sends them from there
    // rather than from a slot.
    bool fromUser = false;
    if (rc != nullptr) {
      if (blocking) {
        // Bytes copied to dst unchanged: a transport that copies anyway (TCP) may put them
        // there itself, if no pending send still reads that range.
        if ((st.op == StepOp::Recv || st.op == StepOp::RecvCopySend) &&
            !sendsOverlap(comm_, dst, bytes) && rc->recvInto(dst, bytes))
          landing_.conn = rc;
        Status absorbed;
        LOOM_CHECK(waiter_.until(
            rc, false,
            [&] {
              absorbed = nextSlot(rc, st.recvPeer, &in, &got);
              return in != nullptr || !absorbed.isOk();
            },
            [&] { return "receiving, " + stepText(st, i, nsteps, p, pieces); }));
        LOOM_CHECK(absorbed);
      }
      if (got != bytes)
        return LOOM_ERROR(loomInvalidUsage,
                          comm_.describe() + ": " + op_.name + " #" + std::to_string(op_.seq) +
                              ": rank " + std::to_string(st.recvPeer) + " sent " +
                              std::to_string(got) + " bytes where " + std::to_string(bytes) +
                              " were expected; " +
                              (s_.coll == algo::Coll::SendRecv
                                   ? "do loomSend and loomRecv counts match?"
                                   : "do all ranks call the same collective with the same "
                                     "count, type and root?"));
      if (news_ != nullptr) {
        const transport::Stamp stamp = rc->recvStamp();
        news_->merge(stamp);
        trace::FlightRecorder& rec = comm_.recorder();
        rec.noteFirstArrival(op_.record, st.recvPeer);
        rec.notePeerSeen(st.recvPeer, stamp.seq);
        rec.notePeerSeen(stamp.earliestRank, stamp.seq);
        rec.notePeerSeen(stamp.latestRank, stamp.seq);
      }
    }
    if (sc != nullptr) {
      fromUser = ((st.op == StepOp::Send && !transforms(red_, st.flags)) ||
                  st.op == StepOp::RecvReduceCopySend || st.op == StepOp::RecvCopySend) &&
                 sc->sendsFromUser(st.op == StepOp::Send ? src : dst, bytes);
      if (blocking)
        LOOM_CHECK(waiter_.until(
            sc, true, [&] { return (out = sc->trySendSlot()) != nullptr; },
            [&] { return "sending, " + stepText(st, i, nsteps, p, pieces); }));
    }
    // Bytes still being sent from the user's buffers must not change under the socket.
    if (dst != nullptr)
      for (transport::Connection* c : comm_.netConns())
        if (c->sendOverlaps(dst, bytes))
          LOOM_CHECK(waiter_.until(
              c, true, [&] { return !c->sendOverlaps(dst, bytes); },
              [&] {
                return "sending from a buffer about to be written, " +
                       stepText(st, i, nsteps, p, pieces);
              }));
    switch (st.op) {
      case StepOp::Send:
        if (transforms(red_, st.flags))
          kernels::reduce(red_, out, nullptr, src, len, st.flags);
        else if (!fromUser)
          std::memcpy(out, src, bytes);
        break;
      case StepOp::Recv:
        if (in != dst) std::memcpy(dst, in, bytes);
        break;
      case StepOp::RecvReduceSend:
        kernels::reduce(red_, out, in, src, len, st.flags);
        break;
      case StepOp::RecvReduceCopy:
        kernels::reduce(red_, dst, in, src, len, st.flags);
        break;
      case StepOp::RecvReduceCopySend:
        kernels::reduce(red_, dst, in, src, len, st.flags);
        if (!fromUser) std::memcpy(out, dst, bytes);
        break;
      case StepOp::RecvCopySend:
        if (in != dst) std::memcpy(dst, in, bytes);
        if (!fromUser) std::memcpy(out, in, bytes);
        break;
      case StepOp::Copy:
        if (transforms(red_, st.flags))
          kernels::reduce(red_, dst, nullptr, src, len, st.flags);
        else if (dst != src)
          std::memmove(dst, src, bytes);
        break;
      default:  // memory steps never reach the FIFO executor
        break;
    }
    if (sc != nullptr) {
      if (news_ != nullptr) news_->stampIfNew(sc, st.sendPeer);
      if (fromUser)
        sc->postSendFrom(st.op == StepOp::Send ? src : dst, bytes);
      else
        sc->postSend(bytes);
    }
    if (rc != nullptr) rc->releaseRecv();
    landing_.conn = nullptr;
    *done = true;
    return Status::ok();
  }

  Comm& comm_;
  const algo::Schedule& s_;
  const OpArgs& op_;
  const kernels::Reducer& red_;
  Waiter waiter_;
  // A receive landing in the caller's memory (recvInto) that an error leaves unfinished: its
  // bytes go back to the slot, and the connection forgets the caller's memory.
  struct Landing {
    transport::Connection* conn = nullptr;
    ~Landing() {
      if (conn != nullptr) conn->cancelRecvInto();
    }
  } landing_;
  ArrivalNews newsStore_;
  ArrivalNews* news_ = nullptr;
  transport::Connection* blockedConn_ = nullptr;
  bool blockedForSend_ = false;
};

}  // namespace

Status runFifo(Comm& comm, const algo::Schedule& schedule, const OpArgs& op) {
  return FifoRun(comm, schedule, op).run();
}

Result<const algo::Schedule*> groupSchedule(Comm& comm, const std::vector<GroupOp>& ops,
                                            bool* built) {
  if (built != nullptr) *built = false;
  Comm::LastGroup& last = comm.lastGroup();
  std::vector<algo::GroupBuf>& bufs = comm.execScratch().groupShape;
  bufs.clear();
  for (const GroupOp& o : ops) bufs.push_back({o.bytes, o.isSend, o.peer});
  auto same = [](const algo::GroupBuf& a, const algo::GroupBuf& b) {
    return a.count == b.count && a.send == b.send && a.peer == b.peer;
  };
  if (last.valid &&
      std::equal(bufs.begin(), bufs.end(), last.shape.begin(), last.shape.end(), same))
    return &last.schedule;
  // A rank's sends to itself are its receives from itself: the API matched their number and
  // sizes before the group ran (checkSelfPairs in src/api/group.cc).
  size_t selfSends = 0, selfRecvs = 0;
  for (const GroupOp& o : ops)
    if (o.peer == comm.rank()) ++(o.isSend ? selfSends : selfRecvs);
  if (selfSends != selfRecvs)
    return LOOM_ERROR(loomInternalError,
                      comm.describe() + ": unmatched sends to itself reached the executor");
  last.valid = false;
  last.schedule = algo::buildGroup(comm.rank(), comm.nranks(), bufs);
  last.shape = bufs;
  last.valid = true;
  if (built != nullptr) *built = true;
  return &last.schedule;
}

}  // namespace loom::exec
