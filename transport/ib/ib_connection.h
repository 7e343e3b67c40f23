// An ib connection: one reliable-connected queue pair between two ranks.
//
// Each side owns a receive FIFO of `depth` slots in registered memory; the
// peer writes a slot with RDMA WRITE WITH IMMEDIATE (a 64-byte header with
// the slot's stamp, then the payload; the immediate carries the byte count),
// so the data lands in place and one receive completion announces it.
// Released slots go back to the sender as credit messages (a zero-byte write
// with immediate). Outgoing data is staged in a local mirror of the FIFO.
// Flow control is credits.h.
//
// Waiting: every event from the peer (data, credit, broken) is a completion on
// this connection's queue, whose completion channel is fd(); wait() arms it
// and sleeps in poll(). A peer that vanishes without a word is found by a
// zero-byte write sent every 250 ms while progress() runs (the queue pair's
// retries end in an error completion) and by a watched TCP connection that
// closes when the peer's process ends; either becomes loomRemoteError naming
// the peer where the link is still needed.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "transport/ib/credits.h"
#include "transport/ib/ib_setup.h"

namespace loom::transport::ib {

// What a peer needs to reach one of this rank's queue pairs.
struct QpInfo {
  uint32_t qpn = 0;
  uint32_t psn = 0;
  uint16_t lid = 0;
  uint8_t mtu = 0;  // ibv_mtu
  uint8_t valid = 0;
  uint8_t gid[16] = {};
  uint64_t fifoAddr = 0;  // the receive FIFO
  uint32_t fifoKey = 0;
  uint32_t slotStride = 0;
};

// It travels in one slot of a TCP watch link (64 bytes, tcp_setup.cc).
static_assert(sizeof(QpInfo) <= 64, "QpInfo must fit a watch link's slot");

constexpr size_t kSlotHeader = 64;

class IbConnection final : public Connection {
 public:
  // Creates the queue pair (state INIT) and its memory. connect() finishes.
  static Result<std::unique_ptr<IbConnection>> create(int peer, std::shared_ptr<Device> device,
                                                      size_t slotBytes, size_t depth);
  ~IbConnection() override;

  QpInfo localInfo() const { return local_; }
  // A second link to the same peer (an idle authenticated TCP connection) whose
  // closing means the peer's process is gone, which the ib link alone may only
  // learn after its retries, or never (some software RoCE stacks).
  void watch(std::unique_ptr<Connection> link) { watch_ = std::move(link); }
  // Moves the queue pair to ready-to-send with the peer's data.
  Status connect(const QpInfo& remote);

  Kind kind() const override { return Kind::Ib; }
  Wakeup wakeup() const override { return Wakeup::Armed; }
  int peer() const override { return peer_; }
  size_t slotBytes() const override { return slotBytes_; }
  void* trySendSlot() override;
  void postSend(size_t bytes) override;
  void stampNext(const Stamp& stamp) override { next_ = stamp; }
  bool sendsFromUser(const void* data, size_t bytes) const override;
  bool sendsFromDevice(const void* data, size_t bytes) const override {
    return sendsFromUser(data, bytes);
  }
  bool postSendFrom(const void* data, size_t bytes) override;
  bool sendOverlaps(const void* data, size_t bytes) const override;
  const void* tryRecvSlot(size_t* bytes) override;
  Stamp recvStamp() const override;
  void releaseRecv() override;
  Status progress() override;
  Status checkRecv() const override;
  bool flushed() const override { return credits_.flushed(); }
  void wait(bool forSend, int64_t timeoutUs) override;
  int fd() const override;
  short pollEvents() const override;
  bool prepareWait() override;
  void markBroken() override;
  void markBrokenBecause(int lostRank) override;
  int lostRank() const override;

 private:
  IbConnection(int peer, std::shared_ptr<Device> device, size_t slotBytes, size_t depth);
  Status init();
  // Handles every completion queued; returns how many.
  int drain();
  void handle(const ibv_wc& wc);
  // Posts a signalled write; the verbs error code, 0 on success. Touches no member state.
  int post(uint64_t kind, const void* local, size_t bytes, uint64_t remoteOffset, bool withImm,
           uint32_t imm);
  bool postWrite(uint64_t kind, const void* local, size_t bytes, uint64_t remoteOffset,
                 bool withImm, uint32_t imm);
  void postRecv();
  void sendCredits();
  void ackEvents();
  char* sendSlot(size_t i) { return staging_ + i * stride_; }
  const char* recvSlot(size_t i) const { return fifo_ + i * stride_; }
  Status failure(const std::string& what);
  Status brokenError() const;

  int peer_;
  std::shared_ptr<Device> dev_;
  const Verbs& v_;
  size_t slotBytes_, depth_, stride_;
  char* mem_ = nullptr;  // fifo_ then staging_, one registration
  size_t memBytes_ = 0;
  char* fifo_ = nullptr;
  char* staging_ = nullptr;
  ibv_mr* mr_ = nullptr;
  ibv_comp_channel* channel_ = nullptr;
  ibv_cq* cq_ = nullptr;
  ibv_qp* qp_ = nullptr;
  QpInfo local_, remote_;
  Credits credits_;
  std::vector<uint32_t> recvSizes_;
  struct UserSend {
    const char* data = nullptr;  // a send straight from registered user memory, until it completes
    size_t bytes = 0;
  };
  std::vector<UserSend> userSends_;  // per staging slot
  uint64_t userSendCount_ = 0;
  Stamp next_;
  uint32_t creditMsgs_ = 0;  // credit writes in the send queue
  bool heartbeatOut_ = false;
  int64_t nextHeartbeatNs_ = 0;
  mutable bool armed_ = false;
  std::unique_ptr<Connection> watch_;
  Status error_;              // a local failure or a protocol violation
  Status lost_;               // an error completion: the queue pair is dead
  bool sendBlocked_ = false;  // the last trySendSlot() found no slot
  bool peerBroken_ = false;
  int peerLost_ = -1;  // the rank whose failure made the peer break the link, if it said
  std::atomic<bool> brokenSent_{false};
};

}  // namespace loom::transport::ib
