// CUDA reduction and copy kernels, launched on a stream (host-callable API; the kernels are in
// reduce.cu, their device code in reduce_device.cuh).
//
// reduce() is the device twin of the CPU kernels (algorithms/kernels/cpu/reduce.h), bit for bit:
//   nsrc == 1: dst = post(pre(srcs[0]))               as reduce(r, dst, nullptr, srcs[0], flags)
//   nsrc == 2: dst = post(srcs[0] (+) pre(srcs[1]))   as reduce(r, dst, srcs[0], srcs[1], flags)
//   nsrc >= 3: dst = post(srcs[0] (+) ... )           as reduceMany(r, dst, srcs, nsrc, flags)
// All pointers are device memory; dst may alias srcs[0]. One pass: every source is read once and
// dst written once, 16 bytes at a time where every pointer is 16-byte aligned, by a grid-stride
// loop. Launches only: the calls return once the kernel is queued (and can be captured in a
// CUDA graph). Return the launch's CUDA error.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "algorithms/kernels/cpu/reduce.h"

namespace loom::kernels::cuda {

constexpr int kMaxSources = 16;
constexpr int kThreads = 512;  // threads per block of every kernel here

// grid 0: enough blocks to fill the device (4 per multiprocessor, at most what n needs).
cudaError_t reduce(const Reducer& r, void* dst, const void* const* srcs, int nsrc, size_t n,
                   uint32_t flags, cudaStream_t stream, int grid = 0);

// dst = src, bytes unchanged.
cudaError_t copy(void* dst, const void* src, size_t bytes, cudaStream_t stream, int grid = 0);

}  // namespace loom::kernels::cuda
