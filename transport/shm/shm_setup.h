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
// owned) on destruction. The creator holds the segment's lock until it unlinks the name, so a
// segment whose creator was killed during set-up is removed at a later set-up (util/shm.h).
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
  ShmSegment(std::string name, void* ptr, size_t bytes, int heldFd)
      : name_(std::move(name)), ptr_(ptr), bytes_(bytes), heldFd_(heldFd) {}
  std::string name_;
  void* ptr_;
  size_t bytes_;
  int heldFd_;  // the creator's descriptor, which holds the segment's lock (util/shm.h); -1 else
};

// Shared memory among the ranks of one host: SetupArgs::peers are the other local ranks.
// barrier runs a barrier among every rank of the communicator (local or not), twice in each
// connect(), also on a rank with no local peer, so that every rank calls it as often.
// directBytes: the size of each window buffer per rank (0: no windows, Links::memory null).
class ShmTransport final : public Transport {
 public:
  ShmTransport(size_t directBytes, std::function<Status()> barrier)
      : directBytes_(directBytes), barrier_(std::move(barrier)) {}
  Kind kind() const override { return Kind::Shm; }
  Result<Links> connect(const SetupArgs& args) override;

 private:
  size_t directBytes_;
  std::function<Status()> barrier_;
};

}  // namespace loom::transport
