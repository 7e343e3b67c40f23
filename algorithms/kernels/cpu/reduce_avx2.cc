// The AVX2 kernel set (AVX2 and F16C; no FMA): reduce_common.inc and reduce_vector.inc
// compiled for 32-byte vectors. Used only where the CPU has both (see reduce_isa.h).
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

#include "algorithms/kernels/cpu/reduce.h"
#include "algorithms/kernels/cpu/reduce_isa.h"
#include "algorithms/kernels/host_device.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define LOOM_KERNELS_AVX2 1
#include <immintrin.h>

// Everything defined below is compiled for AVX2 and F16C, without contracting a multiply
// and an add into a fused multiply-add, and assuming no floating-point traps (see
// reduce.cc).
#pragma GCC target("avx2,f16c")
#pragma GCC optimize("fp-contract=off", "no-trapping-math")
#endif

namespace loom::kernels {

#if defined(LOOM_KERNELS_AVX2)
namespace {

#include "algorithms/kernels/cpu/reduce_common.inc"

struct Isa {
  static constexpr int kFloatLanes = 8;
  using Floats = __m256;
  using Halves = __m128i;

  static Halves LoadHalves(const uint16_t* p) {
    return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  }
  static void StoreHalves(uint16_t* p, Halves h) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), h);
  }
  static Floats HalfToFloat(Halves h) { return _mm256_cvtph_ps(h); }
  static Halves FloatToHalf(Floats f) {
    return _mm256_cvtps_ph(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  }
};

#include "algorithms/kernels/cpu/reduce_vector.inc"

// One 64-byte line in two 32-byte streaming stores (StreamCopyLines aligns dst).
void StreamLineAvx2(char* d, const char* s) {
  const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s));
  const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + 32));
  _mm256_stream_si256(reinterpret_cast<__m256i*>(d), a);
  _mm256_stream_si256(reinterpret_cast<__m256i*>(d + 32), b);
}

constexpr internal::KernelSet kAvx2Kernels{
    "avx2", ReduceWith<VecKernel>, ReduceManyWith<VecKernel>, internal::streamCopyAvx2,
    ReduceManyStreamWith<VecKernel, internal::streamCopyAvx2>};

}  // namespace

void internal::streamCopyAvx2(void* dst, const void* src, size_t bytes) {
  StreamCopyLines<StreamLineAvx2>(dst, src, bytes);
}

const internal::KernelSet* internal::avx2Kernels() { return &kAvx2Kernels; }

#else

const internal::KernelSet* internal::avx2Kernels() { return nullptr; }

#endif

}  // namespace loom::kernels
