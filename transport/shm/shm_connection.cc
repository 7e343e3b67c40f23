#include "transport/shm/shm_connection.h"

#include <unistd.h>

#include <algorithm>
#include <string>

#include "util/proc.h"
#include "util/wait.h"

namespace loom::transport {

ShmConnection::ShmConnection(int peer, ShmFifo* out, ShmFifo* in, size_t slotBytes, size_t depth)
    : peer_(peer), out_(out), in_(in), slotBytes_(slotBytes), depth_(static_cast<uint32_t>(depth)) {
  out_->senderPid = static_cast<int32_t>(getpid());  // read by the peer only after set-up
}

// A receiver that waits on a peer whose process has exited fails, once nothing it sent is
// left: the peer's process is looked at (in /proc) every kLiveCheckNs of waiting.
Status ShmConnection::checkRecv() const {
  if (in_->head.load(std::memory_order_acquire) != consumed_) return Status::ok();
  if (!peerGone_) {
    const int64_t now = nowNs();
    if (now < nextLiveCheckNs_) return Status::ok();
    nextLiveCheckNs_ = now + kLiveCheckNs;
    if (in_->senderPid == static_cast<int32_t>(getpid()) || proc::alive(in_->senderPid))
      return Status::ok();
    peerGone_ = true;
  }
  // What arrived before the exit counts: look again now that it cannot grow.
  if (in_->head.load(std::memory_order_acquire) != consumed_) return Status::ok();
  return LOOM_ERROR(loomRemoteError, "rank " + std::to_string(peer_) + " (pid " +
                                         std::to_string(in_->senderPid) +
                                         ") has exited (shared-memory link)");
}

void* ShmConnection::trySendSlot() {
  if (posted_ - out_->tail.load(std::memory_order_acquire) >= depth_) return nullptr;
  return slots(out_) + static_cast<size_t>(posted_ % depth_) * slotBytes_;
}

void ShmConnection::postSend(size_t bytes) {
  out_->sizes[posted_ % depth_] = bytes;
  out_->stamps[posted_ % depth_] = next_;
  next_.seq = 0;
  next_.message = kScheduleData;
  ++posted_;
  // seq_cst store then load: pairs with the receiver's waiting flag (Dekker).
  out_->head.store(posted_, std::memory_order_seq_cst);
  if (out_->recvWaiting.load(std::memory_order_seq_cst) != 0) futexWakeAll(&out_->head);
}

const void* ShmConnection::tryRecvSlot(size_t* bytes) {
  if (in_->head.load(std::memory_order_acquire) == consumed_) return nullptr;
  uint32_t idx = consumed_ % depth_;
  *bytes = in_->sizes[idx];
  return slots(in_) + static_cast<size_t>(idx) * slotBytes_;
}

void ShmConnection::releaseRecv() {
  ++consumed_;
  in_->tail.store(consumed_, std::memory_order_seq_cst);
  if (in_->sendWaiting.load(std::memory_order_seq_cst) != 0) futexWakeAll(&in_->tail);
}

Status ShmConnection::progress() {
  if ((in_->broken.load(std::memory_order_relaxed) |
       out_->broken.load(std::memory_order_relaxed)) == 0)
    return Status::ok();
  const int lost = lostRank();
  if (lost != peer_)
    return LOOM_ERROR(loomRemoteError, "rank " + std::to_string(peer_) +
                                           " broke the shared-memory link because rank " +
                                           std::to_string(lost) + " failed");
  return LOOM_ERROR(loomRemoteError,
                    "rank " + std::to_string(peer_) + " failed or aborted (shared-memory link)");
}

int ShmConnection::lostRank() const {
  const uint32_t v = std::max(in_->broken.load(), out_->broken.load());
  return v >= 2 ? static_cast<int>(v - 2) : v == 1 || peerGone_ ? peer_ : -1;
}

void ShmConnection::wait(bool forSend, int64_t timeoutUs) {
  if (forSend) {
    out_->sendWaiting.store(1, std::memory_order_seq_cst);
    uint32_t t = out_->tail.load(std::memory_order_seq_cst);
    if (posted_ - t >= depth_ && out_->broken.load() == 0) futexWait(&out_->tail, t, timeoutUs);
    out_->sendWaiting.store(0, std::memory_order_relaxed);
  } else {
    in_->recvWaiting.store(1, std::memory_order_seq_cst);
    if (in_->head.load(std::memory_order_seq_cst) == consumed_ && in_->broken.load() == 0)
      futexWait(&in_->head, consumed_, timeoutUs);
    in_->recvWaiting.store(0, std::memory_order_relaxed);
  }
}

namespace {

// Keeps the first cause written: 0 (sound) -> 1 (broken) -> lost rank + 2.
void breakWord(std::atomic<uint32_t>& w, uint32_t v) {
  uint32_t cur = w.load();
  while (cur < 2 && cur < v && !w.compare_exchange_weak(cur, v)) {
  }
}

}  // namespace

void ShmConnection::markBrokenBecause(int lostRank) {
  if (lostRank >= 0 && lostRank != peer_) {
    breakWord(out_->broken, static_cast<uint32_t>(lostRank) + 2);
    breakWord(in_->broken, static_cast<uint32_t>(lostRank) + 2);
  }
  markBroken();
}

void ShmConnection::markBroken() {
  breakWord(out_->broken, 1);
  breakWord(in_->broken, 1);
  futexWakeAll(&out_->head);
  futexWakeAll(&out_->tail);
  futexWakeAll(&in_->head);
  futexWakeAll(&in_->tail);
}

}  // namespace loom::transport
