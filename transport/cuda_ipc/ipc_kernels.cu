// The cuda_ipc all-reduce kernels (the protocol is described in ipc_kernels.h).
#include "algorithms/kernels/cuda/reduce_device.cuh"
#include "transport/cuda_ipc/ipc_kernels.h"

namespace loom::transport::cuda_ipc {
namespace {

using kernels::cuda::CopyBytes;
using kernels::cuda::kVecBytes;
using kernels::cuda::Params;
using kernels::cuda::ReduceRange;
using kernels::cuda::ReduceSpec;

__host__ __device__ inline size_t RegionBytes(size_t halfBytes, int grid) {
  return halfBytes / static_cast<size_t>(grid) / kVecBytes * kVecBytes;
}
__host__ __device__ inline size_t SlotBytes(size_t halfBytes, int grid, int nranks) {
  return RegionBytes(halfBytes, grid) / static_cast<size_t>(nranks) / kVecBytes * kVecBytes;
}
__host__ __device__ inline size_t RoundUp(size_t x, size_t m) { return (x + m - 1) / m * m; }
__host__ __device__ inline size_t CeilDiv(size_t x, size_t m) { return (x + m - 1) / m; }
__host__ __device__ inline size_t Min(size_t a, size_t b) { return a < b ? a : b; }

__host__ __device__ inline size_t ChunkElems(size_t halfBytes, int grid, int nranks, bool twoShot,
                                             size_t es) {
  const size_t g = static_cast<size_t>(grid);
  if (!twoShot) return g * (RegionBytes(halfBytes, grid) / es);
  return g * static_cast<size_t>(nranks) * (SlotBytes(halfBytes, grid, nranks) / es);
}

__device__ __forceinline__ uint64_t NowNs() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ uint64_t LoadAcquire(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void StoreRelease(uint64_t* p, uint64_t v) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

__device__ __forceinline__ uint64_t* Flags(char* base, FlagArray arr) {
  return reinterpret_cast<uint64_t*>(base) + static_cast<size_t>(arr) * kMaxBlocks;
}

__device__ __forceinline__ bool Aligned(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & (kVecBytes - 1)) == 0;
}

// Block-wide: waits until flag arr[b] of every rank reaches target. False (and the error word
// set) on timeout, abort, or another block's failure.
__device__ bool WaitPeers(const AllReduceArgs& a, FlagArray arr, uint64_t target,
                          uint64_t deadline) {
  int bad = kDeviceOk;
  const int t = static_cast<int>(threadIdx.x);
  if (t < a.nranks) {
    const uint64_t* f = Flags(a.bases[t], arr) + blockIdx.x;
    uint32_t spins = 0;
    while (LoadAcquire(f) < target) {
      if ((++spins & 255u) != 0) continue;
      if (*a.abortFlag != 0) {
        bad = kDeviceAbort;
      } else if (NowNs() > deadline) {
        bad = kDeviceTimeout;
      } else if (*static_cast<volatile int*>(a.errorWord) != 0) {
        bad = *static_cast<volatile int*>(a.errorWord);
      }
      if (bad != kDeviceOk) break;
    }
  }
  if (__syncthreads_or(bad) == 0) return true;
  if (bad != kDeviceOk) {
    *static_cast<volatile int*>(a.errorWord) = bad;
    __threadfence_system();
  }
  return false;
}

// Block-wide: publishes flag arr[b] = s after every thread's writes so far.
__device__ void Publish(const AllReduceArgs& a, FlagArray arr, uint64_t s) {
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence_system();
    StoreRelease(Flags(a.bases[a.rank], arr) + blockIdx.x, s);
  }
}

// Copies n elements of the input into a buffer, applying the PreMulSum scalar when set.
template <class Ty, class Op>
__device__ void CopyIn(typename Ty::Storage* dst, const typename Ty::Storage* src, size_t n,
                       const Params<Ty>& p) {
  if (n == 0) return;
  if (p.pre) {
    const typename Ty::Storage* srcs[1] = {src};
    ReduceRange<Ty, Op>(dst, srcs, 1, 0, n, threadIdx.x, blockDim.x, p, Aligned(src));
  } else {
    CopyBytes(dst, src, n * sizeof(*src), threadIdx.x, blockDim.x);
  }
}

template <class Ty, class Op>
__global__ void __launch_bounds__(kThreads, 2) AllReduceKernel(AllReduceArgs a, ReduceSpec spec) {
  using S = typename Ty::Storage;
  constexpr size_t V = kVecBytes / sizeof(S);
  if (*static_cast<volatile int*>(a.errorWord) != 0) return;  // failed earlier: do nothing
  const uint64_t deadline = NowNs() + a.timeoutNs;
  const size_t b = blockIdx.x;
  const size_t G = gridDim.x;
  const size_t n = static_cast<size_t>(a.nranks);
  uint64_t* mySeq = Flags(a.bases[a.rank], kSeq) + b;
  uint64_t s = *static_cast<volatile uint64_t*>(mySeq);

  Params<Ty> pIn = kernels::cuda::MakeParams<Ty>(spec);
  pIn.post = false;
  Params<Ty> pRed = pIn;
  pRed.pre = false;
  pRed.post = spec.post;

  const size_t regionBytes = RegionBytes(a.halfBytes, a.grid);
  const size_t slotBytes = SlotBytes(a.halfBytes, a.grid, a.nranks);
  const size_t chunk = ChunkElems(a.halfBytes, a.grid, a.nranks, a.twoShot, sizeof(S));
  const S* in = static_cast<const S*>(a.in);
  S* out = static_cast<S*>(a.out);
  const S* srcs[kMaxRanks];

  for (size_t off = 0; off < a.count; off += chunk) {
    ++s;
    const size_t L = Min(chunk, a.count - off);
    const size_t half = kFlagBytes + (s & 1) * a.halfBytes + b * regionBytes;
    auto region = [&](size_t p) { return reinterpret_cast<S*>(a.bases[p] + half); };
    // Peers are done with this half (chunk s - 2) before this block writes it again.
    if (s > 2 && !WaitPeers(a, kDone, s - 2, deadline)) return;
    if (!a.twoShot) {
      const size_t pe = RoundUp(CeilDiv(L, G), V);
      const size_t st = Min(b * pe, L), en = Min(st + pe, L);
      CopyIn<Ty, Op>(region(a.rank), in + off + st, en - st, pIn);
      Publish(a, kReady, s);
      if (!WaitPeers(a, kReady, s, deadline)) return;
      for (size_t p = 0; p < n; ++p) srcs[p] = region(p);
      S* dst = out + off + st;
      ReduceRange<Ty, Op>(dst, srcs, a.nranks, 0, en - st, threadIdx.x, blockDim.x, pRed,
                          Aligned(dst));
    } else {
      const size_t sl = RoundUp(CeilDiv(L, n), V);
      const size_t pe = RoundUp(CeilDiv(sl, G), V);
      auto first = [&](size_t q) { return Min(q * sl + Min(b * pe, sl), L); };
      auto last = [&](size_t q) { return Min(q * sl + Min((b + 1) * pe, sl), L); };
      auto slot = [&](size_t p, size_t q) {
        return reinterpret_cast<S*>(reinterpret_cast<char*>(region(p)) + q * slotBytes);
      };
      // Step 1: this block's piece of every slice into slot q of this rank's region.
      for (size_t q = 0; q < n; ++q)
        CopyIn<Ty, Op>(slot(a.rank, q), in + off + first(q), last(q) - first(q), pIn);
      Publish(a, kReady, s);
      if (!WaitPeers(a, kReady, s, deadline)) return;
      // Step 2: reduce slot `rank` of every rank into this rank's slot `rank`.
      const size_t me = static_cast<size_t>(a.rank);
      for (size_t p = 0; p < n; ++p) srcs[p] = slot(p, me);
      ReduceRange<Ty, Op>(slot(me, me), srcs, a.nranks, 0, last(me) - first(me), threadIdx.x,
                          blockDim.x, pRed, true);
      Publish(a, kReduced, s);
      if (!WaitPeers(a, kReduced, s, deadline)) return;
      // Step 3: gather every rank's reduced piece into the output.
      for (size_t q = 0; q < n; ++q)
        CopyBytes(out + off + first(q), slot(q, q), (last(q) - first(q)) * sizeof(S), threadIdx.x,
                  blockDim.x);
    }
    Publish(a, kDone, s);
  }
  if (threadIdx.x == 0) *static_cast<volatile uint64_t*>(mySeq) = s;
}

}  // namespace

size_t chunkElems(size_t halfBytes, int grid, int nranks, bool twoShot, size_t elemSize) {
  return ChunkElems(halfBytes, grid, nranks, twoShot, elemSize);
}

cudaError_t launchAllReduce(const kernels::Reducer& r, const AllReduceArgs& a,
                            cudaStream_t stream) {
  if (a.count == 0) return cudaSuccess;
  if (a.nranks < 2 || a.nranks > kMaxRanks || a.grid < 1 || a.grid > kMaxBlocks ||
      kernels::typeSize(r.dtype) == 0 ||
      chunkElems(a.halfBytes, a.grid, a.nranks, a.twoShot, kernels::typeSize(r.dtype)) == 0)
    return cudaErrorInvalidValue;
  const ReduceSpec spec = kernels::cuda::SpecOf(r, kernels::kPre | kernels::kPost);
  cudaError_t launched = cudaErrorInvalidValue;
  kernels::cuda::VisitTypeAndOp(r.dtype, r.op, [&](auto ty, auto op) {
    using Ty = typename decltype(ty)::Traits;
    AllReduceKernel<Ty, decltype(op)><<<a.grid, kThreads, 0, stream>>>(a, spec);
    launched = cudaGetLastError();
  });
  return launched;
}

}  // namespace loom::transport::cuda_ipc
