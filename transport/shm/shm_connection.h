// Shared-memory connection between two processes (or threads) of one host.
//
// Each rank owns one segment holding a FIFO per local peer for the data that
// peer sends it. The sender writes straight into the receiver's slots (one
// copy from the user buffer, or one reduce pass from the incoming slot), so
// the receiver reduces out of its own memory. Counters are 32-bit words that
// double as futex words: waits spin, then sleep on the futex.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "transport/transport.h"

namespace loom::transport {

constexpr size_t kShmMaxDepth = 16;

// One direction of a connection, laid out in shared memory.
struct alignas(64) ShmFifo {
  std::atomic<uint32_t> head;  // slots posted by the sender
  char pad0[60];
  std::atomic<uint32_t> tail;  // slots released by the receiver
  char pad1[60];
  std::atomic<uint32_t> recvWaiting;
  std::atomic<uint32_t> sendWaiting;
  std::atomic<uint32_t> broken;  // set by either side on failure: 1, or lost rank + 2
  int32_t senderPid;             // the sending process, written at set-up
  uint64_t sizes[kShmMaxDepth];  // bytes in each slot
  Stamp stamps[kShmMaxDepth];    // each slot's arrival news
  // Slots follow at kShmFifoHeaderBytes.
};

constexpr size_t kShmFifoHeaderBytes = 4096;
static_assert(sizeof(ShmFifo) <= kShmFifoHeaderBytes, "header too large");

inline size_t shmFifoBytes(size_t slotBytes, size_t depth) {
  return kShmFifoHeaderBytes + slotBytes * depth;
}

class ShmConnection final : public Connection {
 public:
  // out: the FIFO in the peer's segment we write to; in: ours it writes to.
  ShmConnection(int peer, ShmFifo* out, ShmFifo* in, size_t slotBytes, size_t depth);

  Kind kind() const override { return Kind::Shm; }
  Wakeup wakeup() const override { return Wakeup::Self; }
  int peer() const override { return peer_; }
  size_t slotBytes() const override { return slotBytes_; }
  void* trySendSlot() override;
  void postSend(size_t bytes) override;
  void stampNext(const Stamp& stamp) override { next_ = stamp; }
  const void* tryRecvSlot(size_t* bytes) override;
  Stamp recvStamp() const override { return in_->stamps[consumed_ % depth_]; }
  void releaseRecv() override;
  Status progress() override;
  bool flushed() const override { return true; }
  void wait(bool forSend, int64_t timeoutUs) override;
  void markBroken() override;
  void markBrokenBecause(int lostRank) override;
  int lostRank() const override;
  // Fails once the peer's process has exited and nothing it sent is left to read.
  Status checkRecv() const override;

 private:
  Stamp next_;  // for the next slot posted
  static char* slots(ShmFifo* f) { return reinterpret_cast<char*>(f) + kShmFifoHeaderBytes; }

  int peer_;
  ShmFifo* out_;
  ShmFifo* in_;
  size_t slotBytes_;
  uint32_t depth_;
  uint32_t posted_ = 0;    // == out_->head, kept locally
  uint32_t consumed_ = 0;  // == in_->tail, kept locally
  static constexpr int64_t kLiveCheckNs = 20'000'000;
  mutable int64_t nextLiveCheckNs_ = 0;
  mutable bool peerGone_ = false;  // the peer's process has exited
};

}  // namespace loom::transport
