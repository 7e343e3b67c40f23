// The instruction-set levels behind reduce() and reduceMany(), for the kernels library itself,
// its tests and its benchmark.
//
// Each level is a KernelSet: the same entry points compiled for one instruction set. The
// scalar set is plain C++ for the baseline target; the AVX2 set needs AVX2 and F16C; the
// AVX-512 set needs AVX512F and AVX512BW. Every level gives bit-identical results. reduce()
// and reduceMany() use the best level this CPU supports, chosen once at first use, unless
// LOOM_KERNEL_ISA (scalar, avx2 or avx512) asks for a lower one. streamCopy() and
// reduceManyStream() are chosen the same way.
#pragma once

#include <cstddef>
#include <cstdint>

#include "algorithms/kernels/cpu/reduce.h"

namespace loom::kernels::internal {

enum class Isa : uint8_t { kScalar, kAvx2, kAvx512 };

struct KernelSet {
  const char* name;  // "scalar", "avx2" or "avx512"
  void (*reduce)(const Reducer& r, void* dst, const void* in, const void* local, size_t n,
                 uint32_t flags);
  void (*reduceMany)(const Reducer& r, void* dst, const void* const* srcs, size_t nsrc, size_t n,
                     uint32_t flags);
  void (*streamCopy)(void* dst, const void* src, size_t bytes);
  void (*reduceManyStream)(const Reducer& r, void* dst, void* copy, const void* const* srcs,
                           size_t nsrc, size_t n, uint32_t flags);
};

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
// The AVX2 level's streamCopy (32-byte streaming stores), which the AVX-512 level uses too:
// 64-byte streaming stores were no faster for large copies and slower for small ones
// (docs/journal/perf.md).
void streamCopyAvx2(void* dst, const void* src, size_t bytes);
#endif

// Each level as built, or nullptr where this build has no such level (not an x86-64 GCC
// build). These do not check the CPU.
const KernelSet* scalarKernels();
const KernelSet* avx2Kernels();
const KernelSet* avx512Kernels();

// A level that both this build and this CPU support, else nullptr.
const KernelSet* kernelsFor(Isa isa);

}  // namespace loom::kernels::internal
