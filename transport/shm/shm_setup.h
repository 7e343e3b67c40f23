// Setting up shared-memory connections among the ranks of one host.
//
// Every local rank creates one POSIX shared-memory segment with a FIFO for
// each local peer, pre-faulted once here (never on the data path). After a
// barrier each rank maps its peers' segments; after a second barrier each
// unlinks its own, so a crash after set-up leaks nothing.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "transport/memory.h"
#include "transport/transport.h"

namespace loom::transport {

// An mmap'ed shared-memory segment; unmaps (and unlinks, if still named and
// owned) on destruction.
class ShmSegment {
 public:
  static Result<std::unique_ptr<ShmSegment>> create(const std::string& name, size_t bytes);
  static Result<std::unique_ptr<ShmSegment>> open(const std::string& name, size_t bytes);
  ~ShmSegment();
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;

  char* data() const { return static_cast<char*>(ptr_); }
  void unlink();

 private:
  ShmSegment(std::string name, void* ptr, size_t bytes, bool owner)
      : name_(std::move(name)), ptr_(ptr), bytes_(bytes), owner_(owner) {}
  std::string name_;
  void* ptr_;
  size_t bytes_;
  bool owner_;
};

struct ShmLinks {
  std::vector<std::unique_ptr<ShmSegment>> segments;
  std::vector<std::unique_ptr<Connection>> conns;  // one per local peer
  std::vector<int> localRanks;                     // sorted, including this rank
  // The local ranks' windows (null without them), members in localRanks' order.
  std::unique_ptr<MemoryChannel> memory;
};

// localRanks: the ranks on this host, sorted, including `rank`. barrier runs
// a barrier among all ranks of the communicator. directBytes: size of each
// of the window buffers per rank (0: no windows).
Result<ShmLinks> setupShm(int rank, const std::vector<int>& localRanks, uint64_t commHash,
                          size_t slotBytes, size_t depth, size_t directBytes,
                          const std::function<Status()>& barrier);

}  // namespace loom::transport
