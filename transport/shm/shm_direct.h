// The direct region of a shared-memory segment: a buffer every local rank
// can read, for algorithms that reduce straight out of their peers' memory
// (src/exec/shm_direct.cc) instead of passing pieces through FIFOs.
//
// Each rank owns one region: a header of counters (each on its own cache
// line; they double as futex words), low-latency lines, and three buffers
// used in turn by successive rounds, so a rank can fill one while slower
// peers still read the other two (src/exec/shm_direct.cc says why three).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace loom::transport {

// Low-latency line: a round's whole input and its round number share one
// cache line, so a reader's poll brings the data with the flag.
struct alignas(64) ShmLLLine {
  std::atomic<uint32_t> round;
  uint32_t pad;
  int64_t enterNs;  // when this rank entered the operation of `round`
  char data[48];
};
constexpr size_t kShmLLBytes = sizeof(ShmLLLine::data);

// A low-latency round of more than kShmLLBytes goes on in these lines, each with its own
// round number, so a reader takes each line as it lands instead of waiting for a flag and
// then fetching the data. They are written before the first line, whose round is the one a
// blocked reader sleeps on and the writer wakes. 56 data bytes: no element straddles two
// lines.
struct alignas(64) ShmLLMoreLine {
  std::atomic<uint32_t> round;
  uint32_t pad;
  char data[56];
};
constexpr size_t kShmLLMoreBytes = sizeof(ShmLLMoreLine::data);
constexpr size_t kShmLLMoreLines = 6;
// The largest low-latency round: 384 bytes.
constexpr size_t kShmLLMaxBytes = kShmLLBytes + kShmLLMoreLines * kShmLLMoreBytes;

struct alignas(64) ShmDirectHeader {
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
  ShmLLLine ll[2];                           // by round parity
  ShmLLMoreLine llMore[2][kShmLLMoreLines];  // by round parity: the rest of a larger round
};

constexpr size_t kShmDirectHeaderBytes = 4096;
static_assert(sizeof(ShmDirectHeader) <= kShmDirectHeaderBytes, "header too large");

constexpr uint32_t kShmDirectBuffers = 3;

inline size_t shmDirectRegionBytes(size_t bufferBytes) {
  return kShmDirectHeaderBytes + kShmDirectBuffers * bufferBytes;
}

// A view of one rank's region.
struct ShmDirectRegion {
  char* base = nullptr;
  ShmDirectHeader* header() const { return reinterpret_cast<ShmDirectHeader*>(base); }
  // slot: 0 .. kShmDirectBuffers-1 (Comm::directSlot()).
  char* buffer(uint32_t slot, size_t bufferBytes) const {
    return base + kShmDirectHeaderBytes + slot * bufferBytes;
  }
};

}  // namespace loom::transport
