// The AVX2 kernel set (AVX2 and F16C; no FMA): reduce_common.inc and reduce_vector.inc
// compiled for 32-byte vectors. Used only where the CPU has both (see reduce_isa.h).
#include <cstring>
#include <type_traits>

#include "algorithms/kernels/cpu/reduce.h"
#include "algorithms/kernels/cpu/reduce_isa.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define LOOM_KERNELS_AVX2 1
#include <immintrin.h>

// Everything defined below is compiled for AVX2 and F16C, without contracting a multiply
// and an add into a fused multiply-add (see reduce.cc).
#pragma GCC target("avx2,f16c")
#pragma GCC optimize("fp-contract=off")
#endif

namespace loom::kernels {

#if defined(LOOM_KERNELS_AVX2)
namespace {

#include "algorithms/kernels/cpu/reduce_common.inc"

struct Isa {
  static constexpr int kFloatLanes = 8;
  using Floats = __m256;
  using Words = __m256i;
  using Bytes = __m128i;   // the low 8 bytes
  using Halves = __m128i;

  static Bytes LoadPacked(const uint8_t* p) { return _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)); }
  static Halves LoadPacked(const uint16_t* p) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)); }
  static void StorePacked(uint8_t* p, Bytes b) { _mm_storel_epi64(reinterpret_cast<__m128i*>(p), b); }
  static void StorePacked(uint16_t* p, Halves h) { _mm_storeu_si128(reinterpret_cast<__m128i*>(p), h); }
  static Words WidenBytes(Bytes b) { return _mm256_cvtepu8_epi32(b); }
  static Words WidenHalves(Halves h) { return _mm256_cvtepu16_epi32(h); }
  // The low byte of each 32-bit lane to the low 4 bytes of each 128-bit half, then the two
  // halves' words together.
  static Bytes NarrowBytes(Words w) {
    const __m256i bytes = _mm256_shuffle_epi8(
        w, _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 0, 4, 8,
                            12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1));
    return _mm256_castsi256_si128(_mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 0, 0, 0, 0, 0, 0)));
  }
  static Halves NarrowHalves(Words w) {
    const __m256i halves = _mm256_shuffle_epi8(
        w, _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1, 0, 1, 4, 5, 8,
                            9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1));
    return _mm256_castsi256_si128(_mm256_permute4x64_epi64(halves, 0x08));
  }
  static Floats HalfToFloat(Halves h) { return _mm256_cvtph_ps(h); }
  static Halves FloatToHalf(Floats f) {
    return _mm256_cvtps_ph(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  }
};

#include "algorithms/kernels/cpu/reduce_vector.inc"

constexpr internal::KernelSet kAvx2Kernels{"avx2", ReduceWith<VecKernel>,
                                           ReduceManyWith<VecKernel>};

}  // namespace

const internal::KernelSet* internal::avx2Kernels() { return &kAvx2Kernels; }

#else

const internal::KernelSet* internal::avx2Kernels() { return nullptr; }

#endif

}  // namespace loom::kernels
