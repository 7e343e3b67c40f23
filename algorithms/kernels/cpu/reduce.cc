// Element-wise reduction kernels: the scalar kernel set, the choice of instruction-set level
// and the public entry points.
//
// Layout: reduce_common.inc holds the per-type traits (Storage, Acc, Load, Store and the base
// operations on Acc), the loops written once over those traits and the type and flag
// dispatch. This file compiles them for the baseline target as the scalar level;
// reduce_avx2.cc and reduce_avx512.cc compile them again, with vector loops for the full
// vectors, for their instruction sets (see reduce_isa.h).
#include "algorithms/kernels/cpu/reduce.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#endif
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "algorithms/kernels/cpu/reduce_isa.h"
#include "algorithms/kernels/host_device.h"

// PreMulSum multiplies then adds; a fused multiply-add would round once instead of twice and
// give results that differ from the other levels. Floating-point exceptions are not trapped
// or read: without that assumption GCC keeps a select between two computed values as a branch
// around them and does not vectorise the loop. Neither option changes any result.
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off", "no-trapping-math")
#endif

namespace loom::kernels {
namespace {

#include "algorithms/kernels/cpu/reduce_common.inc"

// The scalar level: the block loops, vectorised (if at all) for the baseline target.
struct ScalarKernel {
  static constexpr bool kFusedStream = false;  // reduceManyStream goes through tiles
  template <class Ty, class Op, bool kIn, bool kPre, bool kPost>
  static void Reduce(typename Ty::Storage* dst, const typename Ty::Storage* in,
                     const typename Ty::Storage* local, size_t n, typename Ty::Acc scale,
                     typename Ty::Divisor div) {
    ReduceLoop<Ty, Op, kIn, kPre, kPost>(dst, in, local, n, scale, div);
  }
  template <class Ty, class Op, bool kPost>
  static void ReduceMany(typename Ty::Storage* dst, const void* const* srcs, size_t nsrc, size_t n,
                         typename Ty::Divisor div) {
    ReduceManyLoop<Ty, Op, kPost>(dst, srcs, nsrc, n, div);
  }
};

// The scalar level's streamCopy: 16-byte streaming stores, which every x86-64 CPU has (memcpy
// where the target has none).
#if defined(__SSE2__)
void StreamLineSse2(char* d, const char* s) {
  const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s));
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 16));
  const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 32));
  const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 48));
  _mm_stream_si128(reinterpret_cast<__m128i*>(d), a);
  _mm_stream_si128(reinterpret_cast<__m128i*>(d + 16), b);
  _mm_stream_si128(reinterpret_cast<__m128i*>(d + 32), c);
  _mm_stream_si128(reinterpret_cast<__m128i*>(d + 48), e);
}
constexpr auto StreamCopyBaseline = StreamCopyLines<StreamLineSse2>;
#else
void StreamCopyBaseline(void* dst, const void* src, size_t bytes) { std::memcpy(dst, src, bytes); }
#endif

constexpr internal::KernelSet kScalarKernels{
    "scalar", ReduceWith<ScalarKernel>, ReduceManyWith<ScalarKernel>, StreamCopyBaseline,
    ReduceManyStreamWith<ScalarKernel, StreamCopyBaseline>};

#if defined(__x86_64__) && defined(__GNUC__)
bool cpuHasF16c() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid(1, &a, &b, &c, &d) != 0 && (c & bit_F16C) != 0;
}
#endif

bool CpuSupports(internal::Isa isa) {
#if defined(__x86_64__) && defined(__GNUC__)
  __builtin_cpu_init();
  switch (isa) {
    case internal::Isa::kScalar:
      return true;
    case internal::Isa::kAvx2:
      // F16C from CPUID: clang before 15 has no "f16c" for __builtin_cpu_supports, and the
      // fuzz build (tests/fuzz) uses clang 14.
      return __builtin_cpu_supports("avx2") && cpuHasF16c();
    case internal::Isa::kAvx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
  }
  return false;
#else
  return isa == internal::Isa::kScalar;
#endif
}

// The highest level LOOM_KERNEL_ISA allows: any level when it is unset or unknown.
internal::Isa IsaLimitFromEnv() {
  const char* value = std::getenv("LOOM_KERNEL_ISA");
  if (value == nullptr) return internal::Isa::kAvx512;
  if (std::strcmp(value, "scalar") == 0) return internal::Isa::kScalar;
  if (std::strcmp(value, "avx2") == 0) return internal::Isa::kAvx2;
  if (std::strcmp(value, "avx512") != 0 && *value != '\0')
    std::fprintf(stderr, "loom: LOOM_KERNEL_ISA=%s is not scalar, avx2 or avx512; ignoring it\n",
                 value);
  return internal::Isa::kAvx512;
}

// The best level this build and CPU support, at most the one LOOM_KERNEL_ISA names.
const internal::KernelSet* SelectKernels() {
  const internal::Isa limit = IsaLimitFromEnv();
  const internal::Isa levels[] = {internal::Isa::kAvx512, internal::Isa::kAvx2};
  for (internal::Isa isa : levels) {
    if (isa > limit) continue;
    if (const internal::KernelSet* k = internal::kernelsFor(isa)) return k;
  }
  return &kScalarKernels;
}

const internal::KernelSet& Active() {
  static const internal::KernelSet* const kernels = SelectKernels();
  return *kernels;
}

}  // namespace

namespace internal {

const KernelSet* scalarKernels() { return &kScalarKernels; }

const KernelSet* kernelsFor(Isa isa) {
  if (!CpuSupports(isa)) return nullptr;
  switch (isa) {
    case Isa::kScalar:
      return scalarKernels();
    case Isa::kAvx2:
      return avx2Kernels();
    case Isa::kAvx512:
      return avx512Kernels();
  }
  return nullptr;
}

}  // namespace internal

Reducer makeReducer(loomDataType_t dtype, loomRedOp_t op, int nranks) {
  Reducer r;
  r.dtype = dtype;
  switch (op) {
    case loomProd:
      r.op = BaseOp::Prod;
      break;
    case loomMax:
      r.op = BaseOp::Max;
      break;
    case loomMin:
      r.op = BaseOp::Min;
      break;
    case loomAvg:
      r.op = BaseOp::Sum;
      r.postDivide = nranks;
      break;
    case loomBand:
      r.op = BaseOp::BAnd;
      break;
    case loomBor:
      r.op = BaseOp::BOr;
      break;
    case loomBxor:
      r.op = BaseOp::BXor;
      break;
    default:
      r.op = BaseOp::Sum;
      break;
  }
  return r;
}

Reducer makePreMulSum(loomDataType_t dtype, const void* scalar) {
  Reducer r;
  r.dtype = dtype;
  r.op = BaseOp::Sum;
  r.hasScale = true;
  const size_t size = typeSize(dtype);
  if (scalar != nullptr && size != 0) std::memcpy(r.scalar, scalar, size);
  return r;
}

void reduce(const Reducer& r, void* dst, const void* in, const void* local, size_t n,
            uint32_t flags) {
  if (n == 0) return;
  Active().reduce(r, dst, in, local, n, flags);
}

namespace {

// dst[i] = srcs[0][i] + srcs[1][i] + ..., one add at a time in T: what the vector kernels
// compute for a plain sum, element by element.
template <typename T>
void sumFew(void* dst, const void* const* srcs, size_t nsrc, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    T acc, in;
    std::memcpy(&acc, static_cast<const char*>(srcs[0]) + i * sizeof(T), sizeof(T));
    for (size_t k = 1; k < nsrc; ++k) {
      std::memcpy(&in, static_cast<const char*>(srcs[k]) + i * sizeof(T), sizeof(T));
      acc += in;
    }
    std::memcpy(static_cast<char*>(dst) + i * sizeof(T), &acc, sizeof(T));
  }
}

}  // namespace

void reduceMany(const Reducer& r, void* dst, const void* const* srcs, size_t nsrc, size_t n,
                uint32_t flags) {
  if (n == 0 || nsrc == 0) return;
  // A float or double sum of a few elements: the dispatch to a vector kernel would cost more
  // than the adds (a small all-reduce's whole reduction is a handful of them).
  if (n <= kFewElements && nsrc >= 2 && r.op == BaseOp::Sum && !r.hasScale &&
      (r.postDivide <= 1 || !(flags & kPost))) {
    if (r.dtype == loomFloat32) return sumFew<float>(dst, srcs, nsrc, n);
    if (r.dtype == loomFloat64) return sumFew<double>(dst, srcs, nsrc, n);
  }
  Active().reduceMany(r, dst, srcs, nsrc, n, flags);
}

void streamCopy(void* dst, const void* src, size_t bytes) {
  if (bytes != 0) Active().streamCopy(dst, src, bytes);
}

void reduceManyStream(const Reducer& r, void* dst, void* copy, const void* const* srcs, size_t nsrc,
                      size_t n, uint32_t flags) {
  if (n == 0 || nsrc == 0) return;
  Active().reduceManyStream(r, dst, copy, srcs, nsrc, n, flags);
}

void streamFence() {
#if defined(__SSE2__)
  _mm_sfence();
#else
  std::atomic_thread_fence(std::memory_order_seq_cst);
#endif
}

const char* kernelIsa() { return Active().name; }

float halfToFloat(uint16_t h) { return HalfToFloatImpl(h); }
uint16_t floatToHalf(float f) { return FloatToHalfImpl(f); }
float bf16ToFloat(uint16_t h) { return Bf16ToFloatImpl(h); }
uint16_t floatToBf16(float f) { return FloatToBf16Impl(f); }
float e4m3ToFloat(uint8_t v) { return E4m3ToFloatImpl(v); }
uint8_t floatToE4m3(float f) { return FloatToE4m3Impl(f); }
float e5m2ToFloat(uint8_t v) { return E5m2ToFloatImpl(v); }
uint8_t floatToE5m2(float f) { return FloatToE5m2Impl(f); }

}  // namespace loom::kernels
