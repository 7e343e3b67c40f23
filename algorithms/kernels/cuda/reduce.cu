// The stand-alone CUDA reduction and copy kernels (reduce.h).
#include "algorithms/kernels/cuda/reduce.h"
#include "algorithms/kernels/cuda/reduce_device.cuh"

namespace loom::kernels::cuda {
namespace {

struct ReduceArgs {
  void* dst;
  const void* srcs[kMaxSources];
  int nsrc;
  size_t n;
  bool vec;
  ReduceSpec spec;
};

template <class Ty, class Op>
__global__ void __launch_bounds__(kThreads) ReduceKernel(ReduceArgs a) {
  using S = typename Ty::Storage;
  const Params<Ty> p = MakeParams<Ty>(a.spec);
  const S* srcs[kMaxSources];
  for (int k = 0; k < a.nsrc; ++k) srcs[k] = static_cast<const S*>(a.srcs[k]);
  const size_t t = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  const size_t T = static_cast<size_t>(gridDim.x) * blockDim.x;
  ReduceRange<Ty, Op>(static_cast<S*>(a.dst), srcs, a.nsrc, 0, a.n, t, T, p, a.vec);
}

__global__ void __launch_bounds__(kThreads) CopyKernel(void* dst, const void* src, size_t bytes) {
  const size_t t = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  CopyBytes(dst, src, bytes, t, static_cast<size_t>(gridDim.x) * blockDim.x);
}

// Blocks for `units` units of work (16-byte vectors): 4 per multiprocessor at most.
cudaError_t GridFor(size_t units, int* grid) {
  static int sms = 0;
  if (sms == 0) {
    int dev = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    if (e != cudaSuccess) return e;
  }
  const size_t need = (units + 2 * kThreads - 1) / (2 * kThreads);
  const size_t most = static_cast<size_t>(sms) * 4;
  *grid = static_cast<int>(need < 1 ? 1 : need < most ? need : most);
  return cudaSuccess;
}

bool Aligned(const void* p) { return (reinterpret_cast<uintptr_t>(p) & (kVecBytes - 1)) == 0; }

}  // namespace

cudaError_t reduce(const Reducer& r, void* dst, const void* const* srcs, int nsrc, size_t n,
                   uint32_t flags, cudaStream_t stream, int grid) {
  if (n == 0 || nsrc == 0) return cudaSuccess;
  if (nsrc < 0 || nsrc > kMaxSources || typeSize(r.dtype) == 0) return cudaErrorInvalidValue;
  ReduceSpec spec = SpecOf(r, flags);
  if (nsrc > 2) spec.pre = false;
  if (nsrc == 1 && !spec.pre && !spec.post) {  // dst = src, as the CPU's memmove
    if (dst == srcs[0]) return cudaSuccess;
    return copy(dst, srcs[0], n * typeSize(r.dtype), stream, grid);
  }
  ReduceArgs a{};
  a.dst = dst;
  a.nsrc = nsrc;
  a.n = n;
  a.spec = spec;
  a.vec = Aligned(dst);
  for (int k = 0; k < nsrc; ++k) {
    a.srcs[k] = srcs[k];
    a.vec = a.vec && Aligned(srcs[k]);
  }
  if (grid <= 0) {
    const cudaError_t e = GridFor(n * typeSize(r.dtype) / kVecBytes + 1, &grid);
    if (e != cudaSuccess) return e;
  }
  cudaError_t launched = cudaErrorInvalidValue;
  VisitTypeAndOp(r.dtype, r.op, [&](auto ty, auto op) {
    using Ty = typename decltype(ty)::Traits;
    ReduceKernel<Ty, decltype(op)><<<grid, kThreads, 0, stream>>>(a);
    launched = cudaGetLastError();
  });
  return launched;
}

cudaError_t copy(void* dst, const void* src, size_t bytes, cudaStream_t stream, int grid) {
  if (bytes == 0 || dst == src) return cudaSuccess;
  if (grid <= 0) {
    const cudaError_t e = GridFor(bytes / kVecBytes + 1, &grid);
    if (e != cudaSuccess) return e;
  }
  CopyKernel<<<grid, kThreads, 0, stream>>>(dst, src, bytes);
  return cudaGetLastError();
}

}  // namespace loom::kernels::cuda
