#include "transport/tcp/tcp_connection.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>

namespace loom::transport {

namespace {
// A frame is a header (the payload's length and the slot's stamp), then the payload. A header
// with size 0 and kGoodbye set in `flags` is a failing peer's last word: the rank it lost.
struct FrameHeader {
  uint32_t size;
  uint32_t flags;
  Stamp stamp;
};
constexpr uint32_t kGoodbye = 0x80000000u;
constexpr size_t kHeader = sizeof(FrameHeader);
static_assert(kHeader == 56, "recvHeader_ holds one header");
// The staging buffer: a receive of up to this many bytes takes any frame of up to
// kStageBytes - kHeader whole; a longer read goes straight into the slot.
constexpr size_t kStageBytes = 4096;
// While at least this much of a frame's body is still in flight, the socket's receive low-water
// mark is set to what remains: poll() and the wake-up of a blocked reader then wait for the
// whole rest instead of each segment, and one recv() takes it.
constexpr size_t kLowatMinBytes = 16384;
}  // namespace

TcpConnection::TcpConnection(int peer, int fd, size_t slotBytes, size_t depth)
    : peer_(peer),
      fd_(fd),
      slotBytes_(slotBytes),
      depth_(depth),
      sendBuf_(slotBytes * depth),  // value-initialised: every page touched once, here
      recvBuf_(slotBytes * depth),
      sendSizes_(depth),
      recvSizes_(depth),
      sendStamps_(depth),
      recvStamps_(depth),
      sendFrom_(depth, nullptr),
      recvAt_(depth, nullptr),
      stage_(kStageBytes) {}

TcpConnection::~TcpConnection() {
  if (fd_ >= 0) close(fd_);
}

void* TcpConnection::trySendSlot() {
  if (posted_ - sent_ >= depth_) return nullptr;
  return sendSlotPtr(posted_);
}

void TcpConnection::postSend(size_t bytes) {
  sendSizes_[posted_ % depth_] = static_cast<uint32_t>(bytes);
  sendStamps_[posted_ % depth_] = next_;
  sendFrom_[posted_ % depth_] = nullptr;
  next_.seq = 0;
  next_.message = kScheduleData;
  ++posted_;
}

bool TcpConnection::postSendFrom(const void* data, size_t bytes) {
  if (posted_ - sent_ >= depth_) return false;
  postSend(bytes);
  sendFrom_[(posted_ - 1) % depth_] = static_cast<const char*>(data);
  return true;
}

bool TcpConnection::sendOverlaps(const void* data, size_t bytes) const {
  const char* lo = static_cast<const char*>(data);
  for (uint64_t i = sent_; i != posted_; ++i) {
    const char* from = sendFrom_[i % depth_];
    if (from != nullptr && from < lo + bytes && lo < from + sendSizes_[i % depth_]) return true;
  }
  return false;
}

const void* TcpConnection::tryRecvSlot(size_t* bytes) {
  if (filled_ == consumed_) return nullptr;
  *bytes = recvSizes_[consumed_ % depth_];
  char* at = recvAt_[consumed_ % depth_];
  return at != nullptr ? at : recvSlotPtr(consumed_);
}

void TcpConnection::releaseRecv() {
  recvAt_[consumed_ % depth_] = nullptr;
  ++consumed_;
}

bool TcpConnection::recvInto(void* dst, size_t bytes) {
  // Only the frame being read (or not begun): one already complete sits in its slot.
  if (!error_.isOk() || eof_ || filled_ != consumed_ || bytes == 0 || bytes > slotBytes_)
    return false;
  if (recvBytes_ >= kHeader) {
    const FrameHeader* h = reinterpret_cast<const FrameHeader*>(recvHeader_);
    if (h->size != bytes || h->stamp.message != kScheduleData) return false;
    std::memcpy(dst, recvSlotPtr(filled_), recvBytes_ - kHeader);  // what arrived so far
  }
  into_ = static_cast<char*>(dst);
  intoBytes_ = bytes;
  return true;
}

void TcpConnection::cancelRecvInto() {
  // The frame being read, part of it in the caller's memory: that part back into its slot.
  if (recvBytes_ > kHeader && landsInto())
    std::memcpy(recvSlotPtr(filled_), into_, recvBytes_ - kHeader);
  into_ = nullptr;
  // Complete frames not released: their bytes back into their slots.
  for (uint64_t i = consumed_; i != filled_; ++i) {
    char*& at = recvAt_[i % depth_];
    if (at != nullptr) std::memcpy(recvSlotPtr(i), at, recvSizes_[i % depth_]);
    at = nullptr;
  }
}

bool TcpConnection::landsInto() const {
  const FrameHeader* h = reinterpret_cast<const FrameHeader*>(recvHeader_);
  return into_ != nullptr && h->size == intoBytes_ && h->stamp.message == kScheduleData;
}

char* TcpConnection::bodyDst() { return landsInto() ? into_ : recvSlotPtr(filled_); }

std::string TcpConnection::closedText() const {
  std::string msg = "rank " + std::to_string(peer_) + " closed its TCP connection";
  if (lost_ >= 0 && lost_ != peer_) msg += " because rank " + std::to_string(lost_) + " failed";
  return msg;
}

int TcpConnection::lostRank() const {
  if (lost_ >= 0) return lost_;
  return error_.isOk() && !eof_ ? -1 : peer_;
}

void TcpConnection::markBrokenBecause(int lostRank) {
  if (fd_ >= 0 && lostRank >= 0 && lostRank != peer_ && sentBytes_ == 0) {
    FrameHeader h{0, kGoodbye | static_cast<uint32_t>(lostRank), Stamp{}};
    (void)!send(fd_, &h, sizeof(h), MSG_DONTWAIT | MSG_NOSIGNAL);
  }
  markBroken();
}

Status TcpConnection::fail(const char* what, int err) {
  std::string msg = closedText();
  if (err != 0) msg += std::string(" (") + what + ": " + std::strerror(err) + ")";
  error_ = LOOM_ERROR(loomRemoteError, msg);
  return error_;
}

Status TcpConnection::progress() {
  if (!error_.isOk()) return error_;
  // Write posted frames until the socket is full. A failed send is reported after the reads
  // below: a failing peer's goodbye may be waiting there, and the error should name the rank
  // it lost.
  int sendErr = 0;
  while (sent_ != posted_) {
    const uint32_t size = sendSizes_[sent_ % depth_];
    FrameHeader h{size, 0, sendStamps_[sent_ % depth_]};
    const char* body = sendFrom_[sent_ % depth_] ? sendFrom_[sent_ % depth_] : sendSlotPtr(sent_);
    iovec iov[2];
    int n = 0;
    if (sentBytes_ < kHeader) {
      iov[n++] = {reinterpret_cast<char*>(&h) + sentBytes_, kHeader - sentBytes_};
      iov[n++] = {const_cast<char*>(body), size};
    } else {
      iov[n++] = {const_cast<char*>(body) + (sentBytes_ - kHeader), size - (sentBytes_ - kHeader)};
    }
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = n;
    ssize_t w = sendmsg(fd_, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (w < 0) {
      if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) sendErr = errno;
      break;
    }
    sentBytes_ += static_cast<size_t>(w);
    if (sentBytes_ == kHeader + size) {
      ++sent_;
      sentBytes_ = 0;
    }
  }
  // Read frames while a receive slot is free.
  drained_ = false;
  while (!eof_ && filled_ - consumed_ < depth_) {
    ssize_t r;
    if (recvBytes_ < kHeader) {
      r = readSome(recvHeader_ + recvBytes_, kHeader - recvBytes_);
    } else {
      const uint32_t size = reinterpret_cast<const FrameHeader*>(recvHeader_)->size;
      if (size > slotBytes_) {
        error_ =
            LOOM_ERROR(loomInternalError, "rank " + std::to_string(peer_) + " sent a frame of " +
                                              std::to_string(size) + " bytes; slots hold " +
                                              std::to_string(slotBytes_) +
                                              " (do all ranks use the same LOOM_SLOT_BYTES?)");
        return error_;
      }
      size_t got = recvBytes_ - kHeader;
      if (got == size) {
        r = 0;  // empty frame complete; handled below
      } else {
        r = readSome(bodyDst() + got, size - got);
        if (r == 0) return fail("recv, in the middle of a message", 0);
      }
    }
    if (r < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) break;
      return fail("recv", errno);
    }
    if (r == 0 && recvBytes_ < kHeader) {
      if (recvBytes_ > 0) return fail("recv, in the middle of a message", 0);
      eof_ = true;  // an orderly close; an error only for a receiver still waiting
      break;
    }
    recvBytes_ += static_cast<size_t>(r);
    const FrameHeader* h = reinterpret_cast<const FrameHeader*>(recvHeader_);
    if (recvBytes_ == kHeader && h->size == 0 && (h->flags & kGoodbye) != 0) {
      lost_ = static_cast<int>(h->flags & ~kGoodbye);
      eof_ = true;  // the peer failed; it sends nothing more
      break;
    }
    if (recvBytes_ >= kHeader && recvBytes_ == kHeader + h->size) {
      recvSizes_[filled_ % depth_] = h->size;
      recvStamps_[filled_ % depth_] = h->stamp;
      recvAt_[filled_ % depth_] = landsInto() ? into_ : nullptr;
      into_ = nullptr;
      ++filled_;
      recvBytes_ = 0;
    }
  }
  if (sendErr != 0) return fail("send", sendErr);
  setLowat(lowatWanted());
  return Status::ok();
}

size_t TcpConnection::lowatWanted() const {
  if (eof_ || filled_ - consumed_ >= depth_ || recvBytes_ < kHeader) return 1;
  const size_t frame = kHeader + reinterpret_cast<const FrameHeader*>(recvHeader_)->size;
  const size_t have = recvBytes_ + (stageEnd_ - stageBeg_);
  const size_t left = frame > have ? frame - have : 0;
  return left >= kLowatMinBytes ? left : 1;
}

void TcpConnection::setLowat(size_t bytes) {
  if (bytes == lowat_) return;
  const int v = static_cast<int>(bytes);
  if (setsockopt(fd_, SOL_SOCKET, SO_RCVLOWAT, &v, sizeof(v)) == 0) lowat_ = bytes;
}

ssize_t TcpConnection::readSome(char* dst, size_t want) {
  if (stageBeg_ == stageEnd_) {
    if (want >= kStageBytes) {
      const ssize_t r = recv(fd_, dst, want, MSG_DONTWAIT);
      drained_ = r > 0 && static_cast<size_t>(r) < want;
      return r;
    }
    if (drained_) {  // the last read found the socket empty: save a system call
      errno = EAGAIN;
      return -1;
    }
    ssize_t r = recv(fd_, stage_.data(), kStageBytes, MSG_DONTWAIT);
    if (r <= 0) return r;
    stageBeg_ = 0;
    stageEnd_ = static_cast<size_t>(r);
    drained_ = stageEnd_ < kStageBytes;
  }
  const size_t n = std::min(want, stageEnd_ - stageBeg_);
  std::memcpy(dst, stage_.data() + stageBeg_, n);
  stageBeg_ += n;
  return static_cast<ssize_t>(n);
}

void TcpConnection::wait(bool forSend, int64_t timeoutUs) {
  if (!forSend && hasStaged()) return;
  pollfd p{fd_, pollEvents(), 0};
  if (p.events == 0) return;
  int ms = static_cast<int>((timeoutUs + 999) / 1000);
  poll(&p, 1, ms);
}

Status TcpConnection::checkRecv() const {
  if (!error_.isOk()) return error_;
  if (eof_ && filled_ == consumed_) return LOOM_ERROR(loomRemoteError, closedText());
  return Status::ok();
}

short TcpConnection::pollEvents() const {
  return static_cast<short>((!eof_ && filled_ - consumed_ < depth_ ? POLLIN : 0) |
                            (wantsWrite() ? POLLOUT : 0));
}

void TcpConnection::markBroken() {
  if (fd_ >= 0) shutdown(fd_, SHUT_RDWR);
}

}  // namespace loom::transport
