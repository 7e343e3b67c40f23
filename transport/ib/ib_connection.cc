#include "transport/ib/ib_connection.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <random>

#include "util/env.h"
#include "util/log.h"
#include "util/wait.h"

namespace loom::transport::ib {
namespace {

// Work request ids: the kind in the top byte.
constexpr uint64_t kWrData = 1, kWrCredit = 2, kWrHeartbeat = 3, kWrBroken = 4, kWrRecv = 5;
constexpr uint64_t wrId(uint64_t kind) { return kind << 56; }
constexpr uint64_t wrKind(uint64_t id) { return id >> 56; }
constexpr int64_t kHeartbeatNs = 250'000'000;

size_t roundUp(size_t x, size_t to) { return (x + to - 1) / to * to; }

}  // namespace

IbConnection::IbConnection(int peer, std::shared_ptr<Device> device, size_t slotBytes, size_t depth)
    : peer_(peer),
      dev_(std::move(device)),
      v_(dev_->verbs()),
      slotBytes_(slotBytes),
      depth_(depth),
      stride_(kSlotHeader + roundUp(slotBytes, 64)),
      credits_(depth),
      recvSizes_(depth, 0),
      userSends_(depth) {}

Result<std::unique_ptr<IbConnection>> IbConnection::create(int peer, std::shared_ptr<Device> device,
                                                           size_t slotBytes, size_t depth) {
  if (slotBytes > kImmValueMax)
    return LOOM_ERROR(loomInvalidArgument, "LOOM_SLOT_BYTES: the ib transport takes at most " +
                                               std::to_string(kImmValueMax) + " bytes per slot");
  std::unique_ptr<IbConnection> c(new IbConnection(peer, std::move(device), slotBytes, depth));
  LOOM_CHECK(c->init());
  return c;
}

Status IbConnection::failure(const std::string& what) {
  return LOOM_ERROR(loomSystemError, "ib link to rank " + std::to_string(peer_) + " on " +
                                         dev_->describe() + ": " + what +
                                         " failed: " + std::strerror(errno));
}

Status IbConnection::init() {
  memBytes_ = roundUp(2 * depth_ * stride_, 4096);
  void* m = mmap(nullptr, memBytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) {
    memBytes_ = 0;
    return failure("mmap of " + std::to_string(memBytes_) + " bytes");
  }
  mem_ = static_cast<char*>(m);
  std::memset(mem_, 0, memBytes_);  // pre-fault once, here
  fifo_ = mem_;
  staging_ = mem_ + depth_ * stride_;
  mr_ = v_.regMr(dev_->pd(), mem_, memBytes_, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  if (mr_ == nullptr) return failure("ibv_reg_mr");
  channel_ = v_.createCompChannel(dev_->context());
  if (channel_ == nullptr) return failure("ibv_create_comp_channel");
  int flags = fcntl(channel_->fd, F_GETFL);
  if (flags < 0 || fcntl(channel_->fd, F_SETFL, flags | O_NONBLOCK) < 0)
    return failure("making the completion channel non-blocking");
  const int sq = static_cast<int>(2 * depth_ + 4), rq = static_cast<int>(2 * depth_ + 2);
  cq_ = v_.createCq(dev_->context(), sq + rq + 4, nullptr, channel_, 0);
  if (cq_ == nullptr) return failure("ibv_create_cq");
  ibv_qp_init_attr qa{};
  qa.send_cq = cq_;
  qa.recv_cq = cq_;
  qa.qp_type = IBV_QPT_RC;
  qa.cap.max_send_wr = static_cast<uint32_t>(sq);
  qa.cap.max_recv_wr = static_cast<uint32_t>(rq);
  qa.cap.max_send_sge = 2;  // a slot header, then the payload from registered user memory
  qa.cap.max_recv_sge = 1;
  qp_ = v_.createQp(dev_->pd(), &qa);
  if (qp_ == nullptr) return failure("ibv_create_qp");
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.pkey_index = 0;
  a.port_num = static_cast<uint8_t>(dev_->port());
  a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
  if (v_.modifyQp(qp_, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
    return failure("moving the queue pair to INIT");
  for (int i = 0; i < rq; ++i) postRecv();
  std::random_device rd;
  local_.qpn = qp_->qp_num;
  local_.psn = rd() & 0xffffff;
  local_.lid = dev_->portAttr().lid;
  local_.mtu = static_cast<uint8_t>(dev_->portAttr().active_mtu);
  local_.valid = 1;
  std::memcpy(local_.gid, dev_->gid().raw, 16);
  local_.fifoAddr = reinterpret_cast<uint64_t>(fifo_);
  local_.fifoKey = mr_->rkey;
  local_.slotStride = static_cast<uint32_t>(stride_);
  return Status::ok();
}

Status IbConnection::connect(const QpInfo& remote) {
  if (!remote.valid || remote.slotStride != stride_)
    return LOOM_ERROR(loomInternalError,
                      "rank " + std::to_string(peer_) +
                          " published no usable ib queue pair (do all ranks use the same "
                          "LOOM_SLOT_BYTES?)");
  remote_ = remote;
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = static_cast<ibv_mtu>(std::min(remote.mtu, local_.mtu));
  a.dest_qp_num = remote.qpn;
  a.rq_psn = remote.psn;
  a.max_dest_rd_atomic = 1;
  a.min_rnr_timer = 12;
  a.ah_attr.port_num = static_cast<uint8_t>(dev_->port());
  a.ah_attr.dlid = remote.lid;
  if (dev_->choice().ethernet || dev_->gidIndex() > 0) {
    a.ah_attr.is_global = 1;
    std::memcpy(a.ah_attr.grh.dgid.raw, remote.gid, 16);
    a.ah_attr.grh.sgid_index = static_cast<uint8_t>(dev_->gidIndex());
    a.ah_attr.grh.hop_limit = 64;
  }
  if (v_.modifyQp(qp_, &a,
                  IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                      IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
    return failure("moving the queue pair to RTR");
  a = {};
  a.qp_state = IBV_QPS_RTS;
  a.timeout = static_cast<uint8_t>(std::clamp<int64_t>(env::ibTimeout(), 1, 31));
  a.retry_cnt = static_cast<uint8_t>(std::clamp<int64_t>(env::ibRetryCnt(), 0, 7));
  a.rnr_retry = 7;
  a.sq_psn = local_.psn;
  a.max_rd_atomic = 1;
  if (v_.modifyQp(qp_, &a,
                  IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                      IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC))
    return failure("moving the queue pair to RTS");
  return Status::ok();
}

IbConnection::~IbConnection() {
  if (userSendCount_ > 0)
    LOOM_INFO(kTransport, "ib link to rank %d: %llu sends from registered buffers", peer_,
              static_cast<unsigned long long>(userSendCount_));
  if (qp_ != nullptr) v_.destroyQp(qp_);
  if (cq_ != nullptr) {
    ackEvents();
    v_.destroyCq(cq_);
  }
  if (channel_ != nullptr) v_.destroyCompChannel(channel_);
  if (mr_ != nullptr) v_.deregMr(mr_);
  if (mem_ != nullptr) munmap(mem_, memBytes_);
}

void IbConnection::postRecv() {
  ibv_recv_wr wr{};
  ibv_recv_wr* bad = nullptr;
  wr.wr_id = wrId(kWrRecv);
  wr.num_sge = 0;  // writes with immediate carry their data to the FIFO, not here
  if (ibv_post_recv(qp_, &wr, &bad) != 0 && error_.isOk()) error_ = failure("posting a receive");
}

int IbConnection::post(uint64_t kind, const void* local, size_t bytes, uint64_t remoteOffset,
                       bool withImm, uint32_t imm) {
  ibv_sge sge{};
  sge.addr = reinterpret_cast<uint64_t>(local);
  sge.length = static_cast<uint32_t>(bytes);
  sge.lkey = mr_->lkey;
  ibv_send_wr wr{};
  ibv_send_wr* bad = nullptr;
  wr.wr_id = wrId(kind);
  wr.sg_list = bytes > 0 ? &sge : nullptr;
  wr.num_sge = bytes > 0 ? 1 : 0;
  wr.opcode = withImm ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE;
  wr.send_flags = IBV_SEND_SIGNALED;
  if (withImm) wr.imm_data = htonl(imm);
  wr.wr.rdma.remote_addr = remote_.fifoAddr + remoteOffset;
  wr.wr.rdma.rkey = remote_.fifoKey;
  return ibv_post_send(qp_, &wr, &bad);
}

bool IbConnection::postWrite(uint64_t kind, const void* local, size_t bytes, uint64_t remoteOffset,
                             bool withImm, uint32_t imm) {
  const int rc = post(kind, local, bytes, remoteOffset, withImm, imm);
  if (rc != 0 && error_.isOk()) {
    errno = rc;
    error_ = failure("posting a write");
  }
  return rc == 0;
}

void* IbConnection::trySendSlot() {
  if (!credits_.canSend() || !error_.isOk() || !lost_.isOk()) {
    sendBlocked_ = true;
    return nullptr;
  }
  sendBlocked_ = false;
  return sendSlot(credits_.sendIndex()) + kSlotHeader;
}

void IbConnection::postSend(size_t bytes) {
  const size_t i = credits_.sendIndex();
  char* slot = sendSlot(i);
  std::memcpy(slot, &next_, sizeof(Stamp));
  next_ = Stamp{};
  credits_.onPost();
  postWrite(kWrData, slot, kSlotHeader + bytes, i * stride_, true,
            makeImm(Imm::Data, static_cast<uint32_t>(bytes)));
}

bool IbConnection::sendsFromUser(const void* data, size_t bytes) const {
  return dev_->lookup(data, bytes) != 0;
}

bool IbConnection::postSendFrom(const void* data, size_t bytes) {
  const uint32_t lkey = dev_->lookup(data, bytes);
  if (lkey == 0 || !credits_.canSend() || !error_.isOk() || !lost_.isOk()) return false;
  const size_t i = credits_.sendIndex();
  char* header = sendSlot(i);
  std::memcpy(header, &next_, sizeof(Stamp));
  next_ = Stamp{};
  ibv_sge sge[2] = {};
  sge[0].addr = reinterpret_cast<uint64_t>(header);
  sge[0].length = static_cast<uint32_t>(kSlotHeader);
  sge[0].lkey = mr_->lkey;
  sge[1].addr = reinterpret_cast<uint64_t>(data);
  sge[1].length = static_cast<uint32_t>(bytes);
  sge[1].lkey = lkey;
  ibv_send_wr wr{};
  ibv_send_wr* bad = nullptr;
  wr.wr_id = wrId(kWrData);
  wr.sg_list = sge;
  wr.num_sge = bytes > 0 ? 2 : 1;
  wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.imm_data = htonl(makeImm(Imm::Data, static_cast<uint32_t>(bytes)));
  wr.wr.rdma.remote_addr = remote_.fifoAddr + i * stride_;
  wr.wr.rdma.rkey = remote_.fifoKey;
  credits_.onPost();
  userSends_[i] = {static_cast<const char*>(data), bytes};
  ++userSendCount_;
  if (const int rc = ibv_post_send(qp_, &wr, &bad); rc != 0 && error_.isOk()) {
    errno = rc;
    error_ = failure("posting a write from registered memory");
  }
  return true;
}

bool IbConnection::sendOverlaps(const void* data, size_t bytes) const {
  const char* b = static_cast<const char*>(data);
  for (uint64_t k = credits_.completed; k < credits_.posted; ++k) {
    const UserSend& u = userSends_[static_cast<size_t>(k % depth_)];
    if (u.bytes > 0 && b < u.data + u.bytes && u.data < b + bytes) return true;
  }
  return false;
}

const void* IbConnection::tryRecvSlot(size_t* bytes) {
  if (!credits_.hasArrival()) return nullptr;
  const size_t i = credits_.recvIndex();
  *bytes = recvSizes_[i];
  return recvSlot(i) + kSlotHeader;
}

Stamp IbConnection::recvStamp() const {
  Stamp s;
  std::memcpy(&s, recvSlot(credits_.recvIndex()), sizeof(Stamp));
  return s;
}

void IbConnection::releaseRecv() {
  credits_.release();
  sendCredits();
}

void IbConnection::sendCredits() {
  if (credits_.owed == 0 || creditMsgs_ >= depth_ || !error_.isOk() || !lost_.isOk()) return;
  const uint64_t n = credits_.takeOwed();
  if (postWrite(kWrCredit, nullptr, 0, 0, true, makeImm(Imm::Credit, static_cast<uint32_t>(n))))
    ++creditMsgs_;
}

void IbConnection::handle(const ibv_wc& wc) {
  const uint64_t kind = wrKind(wc.wr_id);
  if (wc.status != IBV_WC_SUCCESS) {
    // The queue pair is in error: every later request flushes. Only a rank that
    // still needs this link fails (see progress() and checkRecv()).
    LOOM_INFO(kTransport, "ib link to rank %d: completion %s for a %s", peer_,
              v_.wcStatusStr(wc.status),
              kind == kWrRecv        ? "receive"
              : kind == kWrHeartbeat ? "heartbeat"
                                     : "write");
    if (lost_.isOk())
      lost_ =
          LOOM_ERROR(loomRemoteError, "rank " + std::to_string(peer_) + " unreachable over ib (" +
                                          dev_->describe() + "): " + v_.wcStatusStr(wc.status) +
                                          " (vendor error " + std::to_string(wc.vendor_err) + ")");
    return;
  }
  switch (kind) {
    case kWrRecv: {
      const uint32_t imm = ntohl(wc.imm_data);
      switch (immKind(imm)) {
        case Imm::Data: {
          const size_t i = static_cast<size_t>(credits_.arrived % depth_);
          if (immValue(imm) > slotBytes_ || !credits_.onArrival()) {
            error_ = LOOM_ERROR(loomInternalError, "rank " + std::to_string(peer_) +
                                                       " wrote past the ib flow control (slot of " +
                                                       std::to_string(immValue(imm)) + " bytes)");
            return;
          }
          recvSizes_[i] = immValue(imm);
          break;
        }
        case Imm::Credit:
          if (!credits_.onCredit(immValue(imm)))
            error_ = LOOM_ERROR(loomInternalError, "rank " + std::to_string(peer_) +
                                                       " returned ib credits never sent");
          break;
        case Imm::Broken:
          peerBroken_ = true;
          if (immValue(imm) > 0) peerLost_ = static_cast<int>(immValue(imm)) - 1;
          break;
        default:
          error_ = LOOM_ERROR(loomInternalError,
                              "rank " + std::to_string(peer_) + " sent an unknown ib message");
      }
      postRecv();
      break;
    }
    case kWrData:
      userSends_[static_cast<size_t>(credits_.completed % depth_)] = {};
      credits_.onSendComplete();
      break;
    case kWrCredit:
      --creditMsgs_;
      break;
    case kWrHeartbeat:
      heartbeatOut_ = false;
      break;
    default:
      break;
  }
}

int IbConnection::drain() {
  ibv_wc wcs[16];
  int total = 0;
  for (;;) {
    int n = ibv_poll_cq(cq_, 16, wcs);
    if (n < 0) {
      if (error_.isOk()) error_ = failure("polling the completion queue");
      return total;
    }
    for (int i = 0; i < n; ++i) handle(wcs[i]);
    total += n;
    if (n < 16) return total;
  }
}

void IbConnection::ackEvents() {
  ibv_cq* cq = nullptr;
  void* ctx = nullptr;
  while (v_.getCqEvent(channel_, &cq, &ctx) == 0) {
    v_.ackCqEvents(cq, 1);
    armed_ = false;
  }
}

Status IbConnection::progress() {
  if (armed_) ackEvents();
  drain();
  sendCredits();
  if (watch_ && lost_.isOk()) {
    Status s = watch_->progress();
    if (s.isOk()) s = watch_->checkRecv();
    if (!s.isOk()) {
      drain();  // completions that came before the close count
      lost_ =
          LOOM_ERROR(loomRemoteError, "rank " + std::to_string(peer_) +
                                          " is gone: its watch link closed (" + s.message() + ")");
    }
  }
  if (error_.isOk() && lost_.isOk() && !heartbeatOut_) {
    const int64_t now = nowNs();
    if (now >= nextHeartbeatNs_) {
      if (nextHeartbeatNs_ != 0 && postWrite(kWrHeartbeat, nullptr, 0, 0, false, 0)) {
        heartbeatOut_ = true;
        LOOM_TRACE(kTransport, "ib link to rank %d: heartbeat", peer_);
      }
      nextHeartbeatNs_ = now + kHeartbeatNs;
    }
  }
  if (!error_.isOk()) return error_;
  if (peerBroken_) return brokenError();
  // A lost link fails a sender at once; a receiver once it has consumed what arrived.
  if (!lost_.isOk() && (sendBlocked_ || !credits_.flushed())) return lost_;
  return Status::ok();
}

Status IbConnection::brokenError() const {
  std::string msg = "rank " + std::to_string(peer_) + " failed or aborted (ib link)";
  if (peerLost_ >= 0) msg += " because rank " + std::to_string(peerLost_) + " failed";
  return LOOM_ERROR(loomRemoteError, msg);
}

Status IbConnection::checkRecv() const {
  if (!error_.isOk()) return error_;
  if (!lost_.isOk() && !credits_.hasArrival()) return lost_;
  if (peerBroken_ && !credits_.hasArrival()) return brokenError();
  return Status::ok();
}

int IbConnection::fd() const { return channel_->fd; }

short IbConnection::pollEvents() const { return POLLIN; }

bool IbConnection::prepareWait() {
  if (!armed_) {
    if (ibv_req_notify_cq(cq_, 0) != 0) return true;
    armed_ = true;
  }
  // Completions queued before the arming raise no event: take them now.
  return drain() > 0;
}

void IbConnection::wait(bool forSend, int64_t timeoutUs) {
  (void)forSend;
  if (prepareWait()) return;
  pollfd p{channel_->fd, POLLIN, 0};
  poll(&p, 1, static_cast<int>((timeoutUs + 999) / 1000));
}

void IbConnection::markBroken() { markBrokenBecause(-1); }

void IbConnection::markBrokenBecause(int lostRank) {
  // Any thread; the provider serialises posts to one queue pair.
  if (watch_) watch_->markBrokenBecause(lostRank);
  if (qp_ == nullptr || remote_.fifoKey == 0 || brokenSent_.exchange(true)) return;
  const uint32_t said =
      lostRank >= 0 && lostRank != peer_ ? static_cast<uint32_t>(lostRank) + 1 : 0;
  post(kWrBroken, nullptr, 0, 0, true, makeImm(Imm::Broken, said));
}

int IbConnection::lostRank() const {
  if (peerLost_ >= 0) return peerLost_;
  if (watch_ && watch_->lostRank() >= 0) return watch_->lostRank();
  return peerBroken_ || !lost_.isOk() ? peer_ : -1;
}

}  // namespace loom::transport::ib
