// The AVX-512 kernel set (AVX512F and AVX512BW): reduce_common.inc and reduce_vector.inc
// compiled for 64-byte vectors. Used only where the CPU has both (see reduce_isa.h).
//
// bf16 converts with integer shifts, not AVX512-BF16's VCVTNEPS2BF16: that instruction
// flushes subnormal inputs to zero, which the other levels do not.
#include <cstring>
#include <type_traits>
#include <utility>

#include "algorithms/kernels/cpu/reduce.h"
#include "algorithms/kernels/cpu/reduce_isa.h"
#include "algorithms/kernels/host_device.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define LOOM_KERNELS_AVX512 1
#include <immintrin.h>

// Everything defined below is compiled for AVX512F and AVX512BW, without contracting a
// multiply and an add into a fused multiply-add, and assuming no floating-point traps (see
// reduce.cc).
#pragma GCC target("avx512f,avx512bw")
#pragma GCC optimize("fp-contract=off", "no-trapping-math")
#endif

namespace loom::kernels {

#if defined(LOOM_KERNELS_AVX512)
namespace {

#include "algorithms/kernels/cpu/reduce_common.inc"

struct Isa {
  static constexpr int kFloatLanes = 16;
  using Floats = __m512;
  using Halves = __m256i;

  static Halves LoadHalves(const uint16_t* p) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  }
  static void StoreHalves(uint16_t* p, Halves h) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), h);
  }
  // The zero-masking forms with every lane selected: GCC 12's unmasked ones warn about an
  // uninitialised variable of their own under -Wall.
  static Floats HalfToFloat(Halves h) { return _mm512_maskz_cvtph_ps(0xffff, h); }
  static Halves FloatToHalf(Floats f) {
    return _mm512_maskz_cvtps_ph(0xffff, f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  }
};

#include "algorithms/kernels/cpu/reduce_vector.inc"

constexpr internal::KernelSet kAvx512Kernels{
    "avx512", ReduceWith<VecKernel>, ReduceManyWith<VecKernel>, internal::streamCopyAvx2,
    ReduceManyStreamWith<VecKernel, internal::streamCopyAvx2>};

}  // namespace

const internal::KernelSet* internal::avx512Kernels() { return &kAvx512Kernels; }

#else

const internal::KernelSet* internal::avx512Kernels() { return nullptr; }

#endif

}  // namespace loom::kernels
