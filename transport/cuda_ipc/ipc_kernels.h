// The cuda_ipc all-reduce kernels: every rank of one host reads its peers' buffers directly
// (opened with cudaIpcOpenMemHandle, over NVLink or PCIe, or the same GPU's memory when ranks
// share one), with flags in device memory for synchronisation.
//
// Memory of one rank (one cudaMalloc, exported to every peer):
//   [flags: kFlagBytes][half 0: halfBytes][half 1: halfBytes]
// Flags hold, per block b of the kernel's grid (the grid size G is the same on every rank):
//   ready[b]  the last chunk whose input block b copied into this rank's buffer
//   reduced[b] (two-shot) the last chunk whose slice block b reduced
//   done[b]   the last chunk block b finished with (after which peers may reuse their buffers)
//   seq[b]    chunks block b has processed in all (read and written by this rank's block b only)
// Chunks are numbered 1, 2, ... per block across calls; chunk s uses half s % 2, so a block
// writes a half again only after every peer's block b reported done with chunk s - 2.
//
// Block b owns region b of each half (bytes [b * regionBytes, (b + 1) * regionBytes)) on every
// rank and only ever synchronises with block b of its peers: no grid-wide barrier, so a chunk
// pipelines across blocks. That needs the same G everywhere and the blocks of all ranks' kernels
// resident together (see ipc.cc for how G is chosen).
//
// One-shot (small messages, or 2 ranks): block b copies its piece of the input into its region
// (applying the PreMulSum scalar), publishes ready, waits for every peer's ready, reduces the
// piece from every rank's region in rank order into the output, publishes done.
// Two-shot (large): the region is cut into one slot per rank; block b copies piece (q, b) of
// every slice q into slot q, publishes ready; waits for every peer's ready and reduces slot
// `rank` of every rank's region into its own slot `rank`, publishes reduced; waits for every
// peer's reduced and copies slot q of rank q's region to the output for every q; publishes done.
//
// Every wait polls with a deadline (timeoutNs from the block's start, %globaltimer) and the
// abort flag, which the host sets on loomCommAbort. A wait that fails writes a code into the
// mapped error word (1 timeout, 2 abort) and the kernel returns; the communicator then reports
// the error and refuses further device calls.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "algorithms/kernels/cpu/reduce.h"

namespace loom::transport::cuda_ipc {

constexpr int kMaxRanks = 16;
constexpr int kMaxBlocks = 256;
constexpr int kThreads = 512;
constexpr size_t kFlagBytes = 64 * 1024;  // 4 arrays of kMaxBlocks uint64_t, padded

enum FlagArray { kReady = 0, kReduced = 1, kDone = 2, kSeq = 3 };

enum DeviceError : int { kDeviceOk = 0, kDeviceTimeout = 1, kDeviceAbort = 2 };

struct AllReduceArgs {
  const void* in = nullptr;
  void* out = nullptr;
  size_t count = 0;
  int rank = 0, nranks = 1;
  char* bases[kMaxRanks] = {};  // every rank's allocation, as mapped in this process
  size_t halfBytes = 0;
  int grid = 1;
  bool twoShot = false;
  uint64_t timeoutNs = 0;
  const volatile int* abortFlag = nullptr;  // mapped host memory
  int* errorWord = nullptr;                 // mapped host memory
};

// Elements one chunk carries (the same on every rank for the same arguments).
size_t chunkElems(size_t halfBytes, int grid, int nranks, bool twoShot, size_t elemSize);

// Queues the all-reduce on stream. r: the reducer; the PreMulSum scalar applies to each rank's
// own input, Avg divides the result.
cudaError_t launchAllReduce(const kernels::Reducer& r, const AllReduceArgs& a, cudaStream_t stream);

}  // namespace loom::transport::cuda_ipc
