// Peer memory: the face of a transport whose ranks map each other's memory (shared memory on
// one host), beside Connection's FIFOs. The schedule IR's memory steps run over it
// (algorithms/schedule.h; src/exec/memory_steps.cc).
//
// Each member owns a window region: a header of flags (each on its own cache line; they double
// as futex words), low-latency lines, and kWindowBuffers buffers used in turn by successive
// rounds, so a rank can fill one while slower peers still read the others (algorithms/direct.cc
// says why three). MemoryChannel is a view of every member's region, mapped here.
//
// Blocking contract: nothing here blocks. A reader waits for a flag itself (src/exec's Waiter),
// registered in the flag owner's `sleepers` before it sleeps on the flag's futex, so that
// publish() knows to wake it.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "util/wait.h"

namespace loom::transport {

// Low-latency line: a round's whole input and its round number share one
// cache line, so a reader's poll brings the data with the flag.
struct alignas(64) LLLine {
  std::atomic<uint32_t> round;
  uint32_t pad;
  int64_t enterNs;  // when this rank entered the operation of `round`
  char data[48];
};
constexpr size_t kLLBytes = sizeof(LLLine::data);

// A low-latency round of more than kLLBytes goes on in these lines, each with its own
// round number, so a reader takes each line as it lands instead of waiting for a flag and
// then fetching the data. They are written before the first line, whose round is the one a
// blocked reader sleeps on and the writer wakes. 56 data bytes: no element straddles two
// lines.
struct alignas(64) LLMoreLine {
  std::atomic<uint32_t> round;
  uint32_t pad;
  char data[56];
};
constexpr size_t kLLMoreBytes = sizeof(LLMoreLine::data);
constexpr size_t kLLMoreLines = 6;
// The largest low-latency round: 384 bytes.
constexpr size_t kLLMaxBytes = kLLBytes + kLLMoreLines * kLLMoreBytes;

struct alignas(64) WindowHeader {
  std::atomic<uint32_t> ready;  // rounds whose input this rank has published
  uint32_t pad0;
  int64_t enterNs[2];  // by round parity: when this rank entered that round's op
  char pad0b[40];
  std::atomic<uint32_t> reduced;  // rounds whose slice this rank has reduced
  char pad1[60];
  std::atomic<uint32_t> sleepers;  // ranks blocked on one of these counters
  char pad2[60];
  std::atomic<uint64_t> lastSeq;  // the last operation this rank completed
  char pad3[56];
  // By round parity: where this round's input is. Token 0: in this region's buffer; else in
  // this rank's loomMemAlloc buffer `token` (src/mem), at byte `offset`.
  uint64_t inputToken[2];
  uint64_t inputOffset[2];
  char pad4[32];
  LLLine ll[2];                        // by round parity
  LLMoreLine llMore[2][kLLMoreLines];  // by round parity: the rest of a larger round
};

constexpr size_t kWindowHeaderBytes = 4096;
static_assert(sizeof(WindowHeader) <= kWindowHeaderBytes, "header too large");

constexpr uint32_t kWindowBuffers = 3;

inline size_t windowRegionBytes(size_t bufferBytes) {
  return kWindowHeaderBytes + kWindowBuffers * bufferBytes;
}

// A view of one rank's region.
struct WindowRegion {
  char* base = nullptr;
  WindowHeader* header() const { return reinterpret_cast<WindowHeader*>(base); }
  // slot: 0 .. kWindowBuffers-1.
  char* buffer(uint32_t slot, size_t bufferBytes) const {
    return base + kWindowHeaderBytes + slot * bufferBytes;
  }
};

// Every member's window, as this rank maps them.
class MemoryChannel {
 public:
  MemoryChannel(std::vector<WindowRegion> regions, size_t windowBytes, int self)
      : regions_(std::move(regions)),
        own_(regions_[static_cast<size_t>(self)].header()),
        windowBytes_(windowBytes),
        self_(self) {}

  int members() const { return static_cast<int>(regions_.size()); }
  int self() const { return self_; }
  size_t windowBytes() const { return windowBytes_; }
  WindowHeader* header(int member) const { return regions_[static_cast<size_t>(member)].header(); }
  char* window(int member, uint32_t buffer) const {
    return regions_[static_cast<size_t>(member)].buffer(buffer, windowBytes_);
  }
  // Stores value in this member's flag `word` and wakes the members asleep on its flags.
  void publish(std::atomic<uint32_t>& word, uint32_t value) const {
    word.store(value, std::memory_order_seq_cst);
    if (own_->sleepers.load(std::memory_order_seq_cst) != 0) futexWakeAll(&word);
  }

 private:
  std::vector<WindowRegion> regions_;
  WindowHeader* own_;  // this member's header
  size_t windowBytes_;
  int self_;
};

}  // namespace loom::transport
