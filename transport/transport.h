// Transport connections: how two ranks move bytes.
//
// A Connection joins this rank to one peer with a FIFO of fixed-size slots in
// each direction; the number of free slots is the sender's credit. The sender
// asks for a free slot, fills it and posts it; the receiver waits for the next
// posted slot, consumes it in place (copy or reduce straight out of it) and
// releases it, which returns the credit.
//
// Blocking contract: every method except wait() must not block. trySendSlot()
// and tryRecvSlot() return nullptr when not ready; the caller calls progress()
// and tries again, and after a while of spinning calls wait() to sleep until
// the peer may have changed something (or the timeout passes). The executor
// (src/exec) owns all waiting, so timeouts, abort and liveness checks live in
// one place.
//
// Failure: progress() returns loomRemoteError once the peer has closed the
// connection or marked it broken. markBroken() tells the peer this rank has
// failed so its waits end at once instead of at their timeout.
//
// Thread safety: one thread uses a connection at a time, except markBroken(),
// which may be called from any thread.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "transport/memory.h"
#include "util/status.h"

namespace loom::transport {

enum class Kind { Shm, Tcp, Ib };

// How news on a connection (a slot posted or released, a peer gone) reaches a thread that waits.
enum class Wakeup {
  // wait() sleeps until it (shared memory's futex words); progress() is a few loads.
  Self,
  // fd() turns readable or writable with it (a socket): a poll() of fd() with pollEvents()
  // says whether progress() has anything to do, so one poll() watches many connections.
  Readable,
  // fd() signals only after prepareWait() armed it (an RDMA completion channel): progress()
  // must look on every pass; the descriptor serves a thread that sleeps.
  Armed,
};

// What a slot is, beside its bytes.
// Arrival news, so that ranks learn who entered an operation late without an extra message:
// the earliest and latest entry times (on rank 0's clock) the sender has heard of for
// operation `seq`, and whose they were. seq 0: no news.
// Whether the slot belongs to a tagged message (exec/messages.h) rather than to a schedule:
// messages are matched by the receiver at run time, so whoever reads a connection must tell
// them from a schedule's data. A message's first slot (kMessageHead) carries its tag and its
// size in bytes; its later slots are kMessageBody.
enum : uint32_t { kScheduleData = 0, kMessageHead = 1, kMessageBody = 2 };
struct Stamp {
  uint64_t seq = 0;
  int64_t earliestNs = 0;
  int64_t latestNs = 0;
  int32_t earliestRank = -1;
  int32_t latestRank = -1;
  uint32_t message = kScheduleData;
  int32_t tag = 0;
  uint64_t messageBytes = 0;
};

class Connection {
 public:
  virtual ~Connection() = default;

  virtual Kind kind() const = 0;
  virtual Wakeup wakeup() const = 0;
  virtual int peer() const = 0;
  virtual size_t slotBytes() const = 0;

  // Send side. A free slot to fill, or nullptr when every slot is in flight.
  // Calling it again before postSend() returns the same slot.
  virtual void* trySendSlot() = 0;
  // Publishes the slot from trySendSlot() holding `bytes` (<= slotBytes()).
  virtual void postSend(size_t bytes) = 0;
  // Attaches `stamp` to the next slot posted (else it carries no news and is a schedule's).
  virtual void stampNext(const Stamp& stamp) = 0;

  // Sending straight from the caller's memory, where the transport copies anyway (TCP: the
  // socket takes the bytes from there, saving the copy into a slot). postSendFrom() publishes
  // `bytes` at `data` as the next slot when trySendSlot() would give one (else returns false);
  // the memory must stay unchanged until no pending send overlaps it (sendOverlaps()).
  // Whether `bytes` at `data` can be sent that way (TCP: always; ib: when the caller registered
  // the memory with loomCommRegister).
  virtual bool sendsFromUser(const void* data, size_t bytes) const { return false; }
  // Whether `bytes` of device memory at `data` can be sent that way (ib: memory registered for
  // GPUDirect RDMA); else a device buffer is staged through host memory first.
  virtual bool sendsFromDevice(const void* data, size_t bytes) const { return false; }
  virtual bool postSendFrom(const void* data, size_t bytes) { return false; }
  virtual bool sendOverlaps(const void* data, size_t bytes) const { return false; }

  // Receive side. The next posted slot and its size, or nullptr if none yet.
  virtual const void* tryRecvSlot(size_t* bytes) = 0;
  // Receiving straight into the caller's memory, where the transport copies anyway (TCP: the
  // socket's bytes go to `dst` rather than to a slot). Asks that the next slot tryRecvSlot()
  // would return, when it holds `bytes` bytes, be written at `dst`, as far as it has not
  // arrived yet; its tryRecvSlot() then returns dst. Call it just before waiting for that
  // slot, with `dst` free to be written from then on. Returns false when the transport does
  // not (or that slot is already complete): the slot is received as usual. Until the slot is
  // released, dst must stay valid; cancelRecvInto() puts what arrived back into the slot.
  virtual bool recvInto(void* dst, size_t bytes) { return false; }
  virtual void cancelRecvInto() {}
  // The stamp of the slot tryRecvSlot() returned (seq 0 when none). Where it is a message's,
  // recvInto() did not apply to it.
  virtual Stamp recvStamp() const = 0;
  // Returns the slot from tryRecvSlot() to the sender.
  virtual void releaseRecv() = 0;

  // Moves pending bytes (TCP) and checks the peer's state. Must not block.
  virtual Status progress() = 0;
  // An error when nothing more can arrive (the peer closed its side) and
  // nothing is buffered. A peer that closes after its last send is normal:
  // only a receiver that still waits on it fails.
  virtual Status checkRecv() const { return Status::ok(); }
  // True when every posted slot has left this process.
  virtual bool flushed() const = 0;

  // Sleeps up to timeoutUs, or until the peer posts (forSend = false) or
  // releases (forSend = true) a slot. May return early.
  virtual void wait(bool forSend, int64_t timeoutUs) = 0;
  // The descriptor wakeup() speaks of: -1 exactly when wakeup() is Self.
  virtual int fd() const { return -1; }
  // The poll() events progress() can use now (0 when it can do nothing).
  virtual short pollEvents() const { return 0; }
  // Called before the caller sleeps in poll() on fd(): arms whatever makes
  // fd() readable on news, then returns true when news came meanwhile (the
  // caller should progress instead of sleeping).
  virtual bool prepareWait() { return false; }

  // Tells the peer that this rank failed; its waits on us end with an error.
  virtual void markBroken() = 0;
  // As markBroken, saying that this rank failed because rank `lostRank` did (a death this rank
  // saw first), so that the peer's error names the rank actually lost. Transports that cannot
  // carry it just break the link.
  virtual void markBrokenBecause(int lostRank) { markBroken(); }
  // Once progress() or checkRecv() failed: the rank whose loss broke this link (the peer, or
  // the rank the peer said it lost); -1 when unknown.
  virtual int lostRank() const { return -1; }
};

// ---- Setting up ----

// What every transport's set-up is given.
struct SetupArgs {
  int rank = 0;
  std::vector<int> peers;  // the ranks to connect with, without `rank`
  uint64_t commHash = 0;   // the same on every rank of the communicator
  size_t slotBytes = 0;    // each FIFO's slot size and slot count
  size_t depth = 0;
  // Every wait of the set-up ends by this time (loomTimeout), or once *abortFlag is raised.
  int64_t deadlineNs = 0;
  const std::atomic<bool>* abortFlag = nullptr;
};

// What every set-up gives.
struct Links {
  // What the connections and the memory live in (mapped segments, a device), released after
  // them: declared first, destroyed last.
  std::shared_ptr<void> backing;
  std::vector<std::unique_ptr<Connection>> conns;  // one per peer (in no given order)
  // Every member's mapped memory, members in rank order, this rank included (null where the
  // transport maps none).
  std::unique_ptr<MemoryChannel> memory;
};

// A way of connecting ranks. What a transport needs beyond SetupArgs (a listener, a device, a
// barrier) it is given when made; connect() is then called the same way for each. connect()
// is collective: every rank in args.peers calls it with this rank among its own peers.
class Transport {
 public:
  virtual ~Transport() = default;
  virtual Kind kind() const = 0;
  virtual Result<Links> connect(const SetupArgs& args) = 0;
};

}  // namespace loom::transport
