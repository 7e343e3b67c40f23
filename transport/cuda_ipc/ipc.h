// cuda_ipc: the all-reduce of ranks that share one host, reading each other's GPU memory
// directly (the kernels and their protocol: ipc_kernels.h).
//
// Set-up (IpcAllReduce::create) is collective: every rank allocates its buffer and flags,
// all-gathers the IPC handles, its GPU's UUID and multiprocessor count, and opens every peer's
// handle. Ranks may share a GPU (separate processes): the grid then shrinks so that every rank's
// blocks fit on the GPU together (spinning blocks of one process wait for blocks of another;
// without MPS the GPU time-slices between processes, which is slow but still progresses). When
// any rank cannot take part (no device, a handle that does not open, too many ranks), every rank
// learns it and create returns nullptr: the caller stages through host memory instead.
//
// enqueue() only launches a kernel on the caller's stream (capturable in a CUDA graph). Thread
// safety: one thread at a time; abort() from any thread.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "algorithms/kernels/cpu/reduce.h"
#include "transport/cuda_ipc/ipc_kernels.h"
#include "util/status.h"

namespace loom::transport::cuda_ipc {

using AllGather = std::function<Status(const void* mine, void* all, size_t bytes)>;

class IpcAllReduce {
 public:
  // bufferBytes: both halves together. Returns nullptr when some rank cannot use cuda_ipc.
  static Result<std::unique_ptr<IpcAllReduce>> create(int rank, int nranks, size_t bufferBytes,
                                                      const AllGather& allGather);
  ~IpcAllReduce();
  IpcAllReduce(const IpcAllReduce&) = delete;
  IpcAllReduce& operator=(const IpcAllReduce&) = delete;

  // out = all-reduce of every rank's in (device pointers of count elements) on stream.
  Status enqueue(const kernels::Reducer& r, const void* in, void* out, size_t count,
                 int64_t timeoutMs, cudaStream_t stream);
  // Whether the two-shot kernel serves this many bytes.
  bool twoShot(size_t bytes) const;
  // Makes every waiting kernel of this rank return (error word: abort).
  void abort();
  // The orderly end, on every rank together (as the communicator is destroyed): waits for this
  // rank's kernels, closes the peers' buffers, and waits (allGather) until every rank has done
  // so, since freeing memory another process still has open is undefined in CUDA. Where that
  // wait fails, this rank's buffer is left allocated rather than freed under a peer.
  Status close(const AllGather& allGather);
  // On abort, where no such wait is possible: this rank's buffer is left allocated.
  void abandonBuffer() { own_ = nullptr; }
  // kDeviceOk, or the error a kernel recorded (kDeviceTimeout, kDeviceAbort).
  int deviceError() const;
  int grid() const { return grid_; }

 private:
  IpcAllReduce() = default;
  // Closes every peer's opened buffer (once).
  void closePeers();

  int rank_ = 0, nranks_ = 1, grid_ = 1;
  size_t halfBytes_ = 0;
  char* own_ = nullptr;       // this rank's allocation
  std::vector<char*> bases_;  // every rank's allocation (own_ at rank_)
  int* hostWords_ = nullptr;  // mapped host memory: [0] abort, [1] error
  int* devWords_ = nullptr;   // the same, as the device sees it
};

}  // namespace loom::transport::cuda_ipc
