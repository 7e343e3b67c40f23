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
  // process is gone.
  const int lost = comm_.conn(peer)->lostRank();
  if (lost >= 0) comm_.noteLost(lost);
  std::string more;
  if (lost >= 0 && lost != peer && lost != comm_.rank()) {
    Status alive = comm_.checkPeerAlive(lost);
    if (!alive.isOk()) more = "; " + alive.message();
  }
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
  if (conn->fd() < 0) {
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

namespace {

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

}  // namespace

Status run(Comm& comm, const algo::Schedule& schedule, const OpArgs& op, int64_t* doneNs) {
  int64_t unused = 0;
  if (schedule.mem.slots > 0) return runMemory(comm, schedule, op, doneNs ? doneNs : &unused);
  Waiter waiter(comm, op);
  // A receive landing in the caller's memory (recvInto) that an error leaves unfinished: its
  // bytes go back to the slot, and the connection forgets the caller's memory.
  struct Landing {
    transport::Connection* conn = nullptr;
    ~Landing() {
      if (conn != nullptr) conn->cancelRecvInto();
    }
  } landing;
  ArrivalNews newsStore;
  ArrivalNews* news = nullptr;
  if (op.record != nullptr) {
    newsStore.sent = comm.stampsSent();
    newsStore.start(op.seq, comm.rank(), comm.recorder().toRank0(op.record->enterNs));
    news = &newsStore;
  }
  const kernels::Reducer& red = op.reducer;
  for (const std::vector<Step>& steps : schedule.channels) {
    std::vector<size_t>& pieces = comm.execScratch().pieces;
    pieces.assign(steps.size(), 0);
    size_t rounds = 0;
    for (size_t i = 0; i < steps.size(); ++i) {
      const Step& st = steps[i];
      size_t slot = SIZE_MAX;
      if (st.recvPeer >= 0) slot = std::min(slot, comm.conn(st.recvPeer)->slotBytes());
      if (st.sendPeer >= 0) slot = std::min(slot, comm.conn(st.sendPeer)->slotBytes());
      pieces[i] = st.count == 0      ? 0
                  : slot == SIZE_MAX ? 1
                                     : algo::numPieces(st.count, op.elemSize, slot);
      rounds = std::max(rounds, pieces[i]);
    }
    for (size_t p = 0; p < rounds; ++p) {
      for (size_t i = 0; i < steps.size(); ++i) {
        if (p >= pieces[i]) continue;
        const Step& st = steps[i];
        size_t start, len;
        algo::pieceRange(st.count, pieces[i], p, &start, &len);
        const size_t bytes = len * op.elemSize;
        const void* in = nullptr;
        transport::Connection* rc = nullptr;
        const char* src = algo::stepReads(st.op) ? bufferAt(op, st.src, start) : nullptr;
        char* dst = algo::stepWrites(st.op) ? bufferAt(op, st.dst, start) : nullptr;
        if (algo::stepRecvs(st.op)) {
          rc = comm.conn(st.recvPeer);
          // Bytes copied to dst unchanged: a transport that copies anyway (TCP) may put them
          // there itself, if no pending send still reads that range.
          if ((st.op == StepOp::Recv || st.op == StepOp::RecvCopySend) &&
              !sendsOverlap(comm, dst, bytes) && rc->recvInto(dst, bytes))
            landing.conn = rc;
          size_t got = 0;
          LOOM_CHECK(waiter.until(
              rc, false, [&] { return (in = rc->tryRecvSlot(&got)) != nullptr; },
              [&] { return "receiving, " + stepText(st, i, steps.size(), p, pieces[i]); }));
          if (got != bytes)
            return LOOM_ERROR(loomInvalidUsage,
                              comm.describe() + ": " + op.name + " #" + std::to_string(op.seq) +
                                  ": rank " + std::to_string(st.recvPeer) + " sent " +
                                  std::to_string(got) + " bytes where " + std::to_string(bytes) +
                                  " were expected; do all ranks call the same collective with "
                                  "the same count, type and root?");
          if (news != nullptr) {
            const transport::Stamp stamp = rc->recvStamp();
            news->merge(stamp);
            trace::FlightRecorder& rec = comm.recorder();
            rec.noteFirstArrival(op.record, st.recvPeer);
            rec.notePeerSeen(st.recvPeer, stamp.seq);
            rec.notePeerSeen(stamp.earliestRank, stamp.seq);
            rec.notePeerSeen(stamp.latestRank, stamp.seq);
          }
        }
        void* out = nullptr;
        transport::Connection* sc = nullptr;
        // Where the bytes to send end up in the user's buffers anyway (a plain send, or the
        // result this step writes to dst), a transport that copies regardless (TCP) sends
        // them from there rather than from a slot.
        bool fromUser = false;
        if (algo::stepSends(st.op)) {
          sc = comm.conn(st.sendPeer);
          fromUser = ((st.op == StepOp::Send && !transforms(red, st.flags)) ||
                      st.op == StepOp::RecvReduceCopySend || st.op == StepOp::RecvCopySend) &&
                     sc->sendsFromUser(st.op == StepOp::Send ? src : dst, bytes);
          LOOM_CHECK(waiter.until(
              sc, true, [&] { return (out = sc->trySendSlot()) != nullptr; },
              [&] { return "sending, " + stepText(st, i, steps.size(), p, pieces[i]); }));
        }
        // Bytes still being sent from the user's buffers must not change under the socket.
        if (dst != nullptr)
          for (transport::Connection* c : comm.netConns())
            if (c->sendOverlaps(dst, bytes))
              LOOM_CHECK(waiter.until(
                  c, true, [&] { return !c->sendOverlaps(dst, bytes); },
                  [&] {
                    return "sending from a buffer about to be written, " +
                           stepText(st, i, steps.size(), p, pieces[i]);
                  }));
        switch (st.op) {
          case StepOp::Send:
            if (transforms(red, st.flags))
              kernels::reduce(red, out, nullptr, src, len, st.flags);
            else if (!fromUser)
              std::memcpy(out, src, bytes);
            break;
          case StepOp::Recv:
            if (in != dst) std::memcpy(dst, in, bytes);
            break;
          case StepOp::RecvReduceSend:
            kernels::reduce(red, out, in, src, len, st.flags);
            break;
          case StepOp::RecvReduceCopy:
            kernels::reduce(red, dst, in, src, len, st.flags);
            break;
          case StepOp::RecvReduceCopySend:
            kernels::reduce(red, dst, in, src, len, st.flags);
            if (!fromUser) std::memcpy(out, dst, bytes);
            break;
          case StepOp::RecvCopySend:
            if (in != dst) std::memcpy(dst, in, bytes);
            if (!fromUser) std::memcpy(out, in, bytes);
            break;
          case StepOp::Copy:
            if (transforms(red, st.flags))
              kernels::reduce(red, dst, nullptr, src, len, st.flags);
            else if (dst != src)
              std::memmove(dst, src, bytes);
            break;
          default:  // memory steps never reach the FIFO executor
            break;
        }
        if (sc != nullptr) {
          if (news != nullptr) news->stampIfNew(sc, st.sendPeer);
          if (fromUser)
            sc->postSendFrom(st.op == StepOp::Send ? src : dst, bytes);
          else
            sc->postSend(bytes);
        }
        if (rc != nullptr) rc->releaseRecv();
        landing.conn = nullptr;
      }
    }
  }
  LOOM_CHECK(waiter.flush());
  if (news != nullptr) {
    const transport::Stamp& k = news->known;
    comm.recorder().noteExtremes(op.record, k.earliestRank, k.earliestNs, k.latestRank, k.latestNs);
  }
  return Status::ok();
}

}  // namespace loom::exec
