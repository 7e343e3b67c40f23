// TCP connection between two ranks (usually on different hosts).
//
// The socket is non-blocking. Posted send slots sit in a local FIFO until
// progress() writes them out as frames (a header of the length and the
// slot's stamp, then the bytes);
// progress() reads incoming frames into a local FIFO of receive slots, and
// stops reading while all of them are full, which leaves the peer's data in
// the kernel and so throttles the peer: credits without extra messages.
// Headers and small frames are read through a staging buffer, so that one
// receive takes a whole small frame (or several) and a short read tells that
// the socket is empty; a large frame's body goes straight into its slot, and while much of it
// is still owed the socket's receive low-water mark is its rest, so that the reader is woken
// once for it, not once per segment.
// Progress is driven by whichever thread waits (the executor), so no helper
// thread touches the data.
#pragma once

#include <cstdint>
#include <vector>

#include "transport/transport.h"

namespace loom::transport {

class TcpConnection final : public Connection {
 public:
  // Takes ownership of fd (connected and authenticated).
  TcpConnection(int peer, int fd, size_t slotBytes, size_t depth);
  ~TcpConnection() override;

  Kind kind() const override { return Kind::Tcp; }
  Wakeup wakeup() const override { return Wakeup::Readable; }
  int peer() const override { return peer_; }
  size_t slotBytes() const override { return slotBytes_; }
  void* trySendSlot() override;
  void postSend(size_t bytes) override;
  void stampNext(const Stamp& stamp) override { next_ = stamp; }
  bool sendsFromUser(const void*, size_t) const override { return true; }
  bool postSendFrom(const void* data, size_t bytes) override;
  bool sendOverlaps(const void* data, size_t bytes) const override;
  const void* tryRecvSlot(size_t* bytes) override;
  bool recvInto(void* dst, size_t bytes) override;
  void cancelRecvInto() override;
  Stamp recvStamp() const override { return recvStamps_[consumed_ % depth_]; }
  void releaseRecv() override;
  Status progress() override;
  bool flushed() const override { return sent_ == posted_; }
  Status checkRecv() const override;
  void wait(bool forSend, int64_t timeoutUs) override;
  int fd() const override { return fd_; }
  void markBroken() override;
  // Between frames, sends a last, empty frame whose header carries the lost rank before the
  // shutdown (in the middle of a frame the peer sees a cut frame instead).
  void markBrokenBecause(int lostRank) override;
  int lostRank() const override;
  // True when progress() has bytes it could not write yet.
  bool wantsWrite() const { return sent_ != posted_; }
  short pollEvents() const override;
  // Staged bytes a free slot could take: news that poll() on the socket cannot see.
  bool prepareWait() override { return hasStaged(); }
  bool hasStaged() const { return stageBeg_ != stageEnd_ && filled_ - consumed_ < depth_; }

 private:
  Status fail(const char* what, int err);
  // Up to `want` bytes of the stream into dst: from the staging buffer, else from the socket
  // (through the staging buffer when want is small). recv()'s contract: > 0 bytes, 0 at the
  // peer's close, -1 with errno (EAGAIN: nothing now).
  ssize_t readSome(char* dst, size_t want);
  std::string closedText() const;
  // The receive low-water mark for what the socket still owes the frame being read: its rest
  // when that is large, else 1 (any byte is news). setLowat() changes the socket's only when it
  // differs.
  size_t lowatWanted() const;
  void setLowat(size_t bytes);
  char* sendSlotPtr(uint64_t i) { return sendBuf_.data() + (i % depth_) * slotBytes_; }
  char* recvSlotPtr(uint64_t i) { return recvBuf_.data() + (i % depth_) * slotBytes_; }
  // Where frame filled_'s body of `size` bytes goes: the caller's memory (recvInto), else its slot.
  char* bodyDst();
  // Whether the frame whose header was read lands in the caller's memory: a schedule's slot of
  // the size recvInto() asked for (a message's slots go to the receiver's inbox).
  bool landsInto() const;

  int peer_;
  int fd_;
  int lost_ = -1;  // the rank a goodbye frame named
  size_t slotBytes_;
  size_t depth_;
  std::vector<char> sendBuf_, recvBuf_;
  std::vector<uint32_t> sendSizes_, recvSizes_;
  std::vector<Stamp> sendStamps_, recvStamps_;
  std::vector<const char*> sendFrom_;  // per send slot: the caller's bytes, or null (the slot)
  std::vector<char*> recvAt_;       // per receive slot: the caller's memory it landed in, or null
  char* into_ = nullptr;            // recvInto(): frame filled_ (== consumed_) goes here
  size_t intoBytes_ = 0;            // ... when it holds this many bytes
  Stamp next_;                      // for the next slot posted
  uint64_t posted_ = 0, sent_ = 0;  // send FIFO: posted, fully written
  size_t sentBytes_ = 0;            // of frame sent_ (header included)
  uint64_t filled_ = 0, consumed_ = 0;   // receive FIFO: complete frames, released
  size_t recvBytes_ = 0;                 // of frame filled_ (header included)
  alignas(8) char recvHeader_[56] = {};  // the frame header being read
  std::vector<char> stage_;              // bytes read ahead of the frame being filled
  size_t stageBeg_ = 0, stageEnd_ = 0;
  size_t lowat_ = 1;      // the socket's SO_RCVLOWAT
  bool drained_ = false;  // this progress() saw the socket empty (a short read)
  Status error_;
  bool eof_ = false;  // the peer closed its sending side
};

}  // namespace loom::transport
