// Device-side building blocks of the CUDA reduction kernels, shared by the stand-alone kernels
// (reduce.cu) and the cuda_ipc all-reduce (transport/cuda_ipc/ipc_kernels.cu).
//
// ReduceRange combines nsrc sources element by element with the same element functions as the
// CPU kernels (algorithms/kernels/elementwise.inc), in the same order and with the same
// rounding, so results are bit for bit those of the CPU build:
//   nsrc == 1: dst = post(pre(src0))                      (CPU: reduce(r, dst, nullptr, src0))
//   nsrc == 2: dst = post(src0 (+) pre(src1))             (CPU: reduce(r, dst, src0, src1))
//   nsrc >= 3: dst = post(((src0 (+) src1) (+) src2) ...) (CPU: reduceMany; no pre)
// with a rounding to the storage type after every combine but the last. Threads t of T (a grid
// or a block) share the range; where every pointer is 16-byte aligned they move 16 bytes per
// load and store, two vectors at a time, and the tail is element by element. Sources are read
// with ld.global.cg (L2, never a stale L1 line): they may be peers' buffers that change between
// chunks.
//
// Included by .cu files only; each gets its own copy (unnamed namespace), as on the CPU side.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "algorithms/kernels/cpu/reduce.h"
#include "algorithms/kernels/host_device.h"

namespace loom::kernels::cuda {
namespace {

#include "algorithms/kernels/elementwise.inc"

constexpr int kVecBytes = 16;

// A load through L2 only, for any element size.
template <class S>
__device__ __forceinline__ S LoadCg(const S* p) {
  if constexpr (sizeof(S) == 1) {
    return BitCast<S>(__ldcg(reinterpret_cast<const unsigned char*>(p)));
  } else if constexpr (sizeof(S) == 2) {
    return BitCast<S>(__ldcg(reinterpret_cast<const unsigned short*>(p)));
  } else if constexpr (sizeof(S) == 4) {
    return BitCast<S>(__ldcg(reinterpret_cast<const unsigned int*>(p)));
  } else {
    return BitCast<S>(__ldcg(reinterpret_cast<const unsigned long long*>(p)));
  }
}

// Plain-old-data form of a Reducer and its flags, passed to kernels by value.
struct ReduceSpec {
  BaseOp op;
  bool pre;   // apply the PreMulSum scalar (nsrc <= 2 only, as on the CPU)
  bool post;  // divide by postDivide (Avg)
  int postDivide;
  alignas(8) unsigned char scalar[8];
};

template <class Ty>
__device__ __forceinline__ Params<Ty> MakeParams(const ReduceSpec& spec) {
  using S = typename Ty::Storage;
  Params<Ty> p;
  p.pre = spec.pre;
  p.post = spec.post;
  if (p.pre) {
    S s;
    memcpy(&s, spec.scalar, sizeof(S));
    p.scale = Ty::Load(s);
  }
  if (p.post) p.div = Ty::MakeDivisor(spec.postDivide);
  return p;
}

// dst[i] = reduction over srcs[k][i] for i in [begin, end); thread t of T. vec: dst, every source
// and begin are 16-byte aligned.
template <class Ty, class Op>
__device__ void ReduceRange(typename Ty::Storage* dst, const typename Ty::Storage* const* srcs,
                            int nsrc, size_t begin, size_t end, size_t t, size_t T,
                            const Params<Ty>& p, bool vec) {
  using S = typename Ty::Storage;
  using Acc = typename Ty::Acc;
  constexpr int V = kVecBytes / sizeof(S);
  size_t tail = begin;
  if (vec && end > begin) {
    const size_t nv = (end - begin) / V;
    for (size_t j = t; j < nv; j += 2 * T) {
      const bool two = j + T < nv;
      const size_t e0 = begin + j * V, e1 = begin + (j + T) * V;
      Acc acc0[V], acc1[V];
      for (int k = 0; k < nsrc; ++k) {
        const uint4 w0 = __ldcg(reinterpret_cast<const uint4*>(srcs[k] + e0));
        const uint4 w1 = two ? __ldcg(reinterpret_cast<const uint4*>(srcs[k] + e1)) : w0;
        S s0[V], s1[V];
        memcpy(s0, &w0, sizeof(w0));
        memcpy(s1, &w1, sizeof(w1));
#pragma unroll
        for (int l = 0; l < V; ++l) {
          Fold<Ty, Op>(acc0[l], s0[l], k, nsrc, p);
          Fold<Ty, Op>(acc1[l], s1[l], k, nsrc, p);
        }
      }
      S o0[V], o1[V];
#pragma unroll
      for (int l = 0; l < V; ++l) {
        o0[l] = Finish<Ty>(acc0[l], p);
        o1[l] = Finish<Ty>(acc1[l], p);
      }
      uint4 w0, w1;
      memcpy(&w0, o0, sizeof(w0));
      memcpy(&w1, o1, sizeof(w1));
      *reinterpret_cast<uint4*>(dst + e0) = w0;
      if (two) *reinterpret_cast<uint4*>(dst + e1) = w1;
    }
    tail = begin + nv * V;
  }
  for (size_t e = tail + t; e < end; e += T) {
    Acc acc;
    for (int k = 0; k < nsrc; ++k) Fold<Ty, Op>(acc, LoadCg(srcs[k] + e), k, nsrc, p);
    dst[e] = Finish<Ty>(acc, p);
  }
}

// Copies bytes [0, n) from src to dst unchanged (no conversion: NaN payloads survive); thread t
// of T. 16 bytes at a time where both are 16-byte aligned.
__device__ inline void CopyBytes(void* dst, const void* src, size_t n, size_t t, size_t T) {
  auto* d = static_cast<unsigned char*>(dst);
  const auto* s = static_cast<const unsigned char*>(src);
  size_t tail = 0;
  if (((reinterpret_cast<uintptr_t>(d) | reinterpret_cast<uintptr_t>(s)) & 15) == 0) {
    const size_t nv = n / 16;
    for (size_t j = t; j < nv; j += T)
      reinterpret_cast<uint4*>(d)[j] = __ldcg(reinterpret_cast<const uint4*>(s) + j);
    tail = nv * 16;
  }
  for (size_t e = tail + t; e < n; e += T) d[e] = __ldcg(s + e);
}

// Calls fn(TypeTag<Traits>{}, Op{}) with the traits of dtype and the functor of op (host side,
// to pick a kernel instantiation); nothing for an unknown type or a bitwise op.
template <class Fn>
void VisitTypeAndOp(loomDataType_t dtype, BaseOp op, Fn&& fn) {
  VisitType(dtype, [&](auto tag) {
    switch (op) {
      case BaseOp::Sum:
        return fn(tag, SumOp{});
      case BaseOp::Prod:
        return fn(tag, ProdOp{});
      case BaseOp::Max:
        return fn(tag, MaxOp{});
      case BaseOp::Min:
        return fn(tag, MinOp{});
      case BaseOp::BAnd:
      case BaseOp::BOr:
      case BaseOp::BXor:
        return;  // no device kernel: device calls reduce them on the host (src/api/device.cc)
    }
  });
}

inline ReduceSpec SpecOf(const Reducer& r, uint32_t flags) {
  ReduceSpec spec{};
  spec.op = r.op;
  spec.pre = r.hasScale && (flags & kPre) != 0;
  spec.post = r.postDivide > 1 && (flags & kPost) != 0;
  spec.postDivide = r.postDivide;
  memcpy(spec.scalar, r.scalar, sizeof(spec.scalar));
  return spec;
}

}  // namespace
}  // namespace loom::kernels::cuda
