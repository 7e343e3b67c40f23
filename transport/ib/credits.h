// The ib transport's flow control, kept apart from verbs so it is tested
// without a device.
//
// A sender writes slot i of the receiver's FIFO only when the receiver has
// released slot i - depth (its credit, which comes back as a message) and
// the local write from staging slot i - depth has completed. The receiver
// counts arrivals and releases; released slots are owed back to the sender
// and returned in batches, so a busy send queue delays credits, never loses
// them. Counters only grow; a slot index is a counter modulo depth.
#pragma once

#include <cstddef>
#include <cstdint>

namespace loom::transport::ib {

struct Credits {
  explicit Credits(size_t d) : depth(d) {}

  size_t depth;
  // Send side.
  uint64_t posted = 0;     // data writes posted
  uint64_t credited = 0;   // slots the receiver has released
  uint64_t completed = 0;  // data writes completed locally
  // Receive side.
  uint64_t arrived = 0;   // slots written by the peer
  uint64_t released = 0;  // slots handed back by the caller
  uint64_t owed = 0;      // released slots not yet announced to the peer

  bool canSend() const { return posted - credited < depth && posted - completed < depth; }
  void onPost() { ++posted; }
  // A credit message for n slots. False when it returns slots never sent.
  bool onCredit(uint64_t n) {
    if (n == 0 || n > posted - credited) return false;
    credited += n;
    return true;
  }
  // False when more writes completed than were posted.
  bool onSendComplete() {
    if (completed == posted) return false;
    ++completed;
    return true;
  }
  bool flushed() const { return completed == posted; }

  // False when the peer wrote into a slot it held no credit for.
  bool onArrival() {
    if (arrived - released >= depth) return false;
    ++arrived;
    return true;
  }
  bool hasArrival() const { return released < arrived; }
  // Slot index of the next arrival to consume / the next write to post.
  size_t recvIndex() const { return static_cast<size_t>(released % depth); }
  size_t sendIndex() const { return static_cast<size_t>(posted % depth); }
  void release() {
    ++released;
    ++owed;
  }
  // The owed credits to announce now (all of them), leaving none owed.
  uint64_t takeOwed() {
    uint64_t n = owed;
    owed = 0;
    return n;
  }
};

// Immediate data of a write: the top two bits say what it is.
enum class Imm : uint32_t { Data = 0, Credit = 1, Broken = 2 };
constexpr uint32_t kImmValueBits = 30;
constexpr uint32_t kImmValueMax = (1u << kImmValueBits) - 1;
inline uint32_t makeImm(Imm kind, uint32_t value) {
  return (static_cast<uint32_t>(kind) << kImmValueBits) | (value & kImmValueMax);
}
inline Imm immKind(uint32_t imm) { return static_cast<Imm>(imm >> kImmValueBits); }
inline uint32_t immValue(uint32_t imm) { return imm & kImmValueMax; }

}  // namespace loom::transport::ib
