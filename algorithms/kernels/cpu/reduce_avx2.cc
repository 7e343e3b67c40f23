// The AVX2 kernel set (AVX2 and F16C; no FMA): reduce_common.inc and reduce_vector.inc
// compiled for 32-byte vectors. Used only where the CPU has both (see reduce_isa.h).
#include <algorithm>
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

constexpr internal::KernelSet kAvx2Kernels{"avx2", ReduceWith<VecKernel>,
                                           ReduceManyWith<VecKernel>, internal::streamCopyAvx2};

}  // namespace

// Plain stores up to dst's first 64-byte boundary, then whole lines in two 32-byte streaming
// stores each, then plain stores for the tail.
void internal::streamCopyAvx2(void* dst, const void* src, size_t bytes) {
  auto* d = static_cast<char*>(dst);
  const auto* s = static_cast<const char*>(src);
  const size_t head = std::min(bytes, (64 - reinterpret_cast<uintptr_t>(d) % 64) % 64);
  std::memcpy(d, s, head);
  size_t i = head;
  for (; i + 64 <= bytes; i += 64) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i + 32));
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + i), a);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + i + 32), b);
  }
  std::memcpy(d + i, s + i, bytes - i);
}

const internal::KernelSet* internal::avx2Kernels() { return &kAvx2Kernels; }

#else

const internal::KernelSet* internal::avx2Kernels() { return nullptr; }

#endif

}  // namespace loom::kernels
