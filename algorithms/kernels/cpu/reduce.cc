// Element-wise reduction kernels: scalar conversions, per-type element functions and the
// templated loops that apply them.
//
// Layout: each data type has a traits struct (Storage, Acc, Load, Store and the base
// operations on Acc); ReduceLoop is written once over those traits so the compiler can
// vectorise it per type. A SIMD back end can later replace ReduceLoop for chosen types
// without touching the element functions.
#include "algorithms/kernels/cpu/reduce.h"

#include <cstring>
#include <type_traits>

namespace loom::kernels {
namespace {

template <typename To, typename From>
inline To BitCast(const From& from) {
  static_assert(sizeof(To) == sizeof(From), "BitCast needs equal sizes");
  To to;
  std::memcpy(&to, &from, sizeof(To));
  return to;
}

// ---------------------------------------------------------------------------------------
// Scalar conversions. The float -> narrow conversions round to nearest even; the subnormal
// paths use a float addition against a power of two whose ulp is the target's subnormal
// step, so they rely on the default rounding mode (round to nearest even, no flush to zero).
//
// The conversions are branch-free (every case is computed, then one is selected) so that
// loops calling them vectorise. Magnitudes are compared as int32_t, which SSE2 compares
// natively. Cases are picked with Select rather than ?: so the compiler does not turn the
// choice into a branch around a (possibly trapping) float operation, which would stop
// if-conversion and vectorisation.

// c ? a : b, computed with masks.
inline uint32_t Select(bool c, uint32_t a, uint32_t b) {
  const uint32_t mask = 0u - static_cast<uint32_t>(c);
  return (a & mask) | (b & ~mask);
}

// IEEE binary16 -> binary32, exact. Subnormal halves become normal floats.
inline float HalfToFloatImpl(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t shifted = static_cast<uint32_t>(h & 0x7fffu) << 13;  // exponent and mantissa
  const int32_t exp = static_cast<int32_t>(shifted & 0x0f800000u);
  const uint32_t normal = shifted + ((127u - 15u) << 23);  // rebias
  const uint32_t inf_nan = normal + ((128u - 16u) << 23);  // exponent all ones, payload kept
  // Subnormal: as a normal with exponent -14, minus 2^-14.
  const uint32_t subnormal =
      BitCast<uint32_t>(BitCast<float>(normal + (1u << 23)) - BitCast<float>(113u << 23));
  uint32_t bits = Select(exp == 0x0f800000, inf_nan, normal);
  bits = Select(exp == 0, subnormal, bits);
  return BitCast<float>(bits | sign);
}

// binary32 -> binary16, round to nearest even; overflow gives inf, NaN stays NaN (quiet).
inline uint16_t FloatToHalfImpl(float f) {
  const uint32_t u = BitCast<uint32_t>(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t x = u & 0x7fffffffu;
  const int32_t xi = static_cast<int32_t>(x);
  const uint32_t inf_nan = Select(xi > 0x7f800000, 0x7e00u | ((x >> 13) & 0x3ffu), 0x7c00u);
  // Below 2^-14 the result is subnormal or zero; ulp(0.5f) is 2^-24, the subnormal step.
  const uint32_t subnormal = BitCast<uint32_t>(BitCast<float>(x) + 0.5f) - 0x3f000000u;
  // Normal: rounding may carry into the exponent, up to inf.
  const uint32_t normal = (x - ((127u - 15u) << 23) + 0xfffu + ((x >> 13) & 1u)) >> 13;
  uint32_t out = Select(xi < 0x38800000, subnormal, normal);
  out = Select(xi >= 0x47800000, inf_nan, out);  // >= 2^16: inf or NaN
  return static_cast<uint16_t>(out | sign);
}

inline float Bf16ToFloatImpl(uint16_t h) { return BitCast<float>(static_cast<uint32_t>(h) << 16); }

// Round to nearest even on the upper 16 bits; NaN is kept and made quiet.
inline uint16_t FloatToBf16Impl(float f) {
  const uint32_t x = BitCast<uint32_t>(f);
  const uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
  const uint32_t nan = (x >> 16) | 0x40u;
  const bool is_nan = static_cast<int32_t>(x & 0x7fffffffu) > 0x7f800000;
  return static_cast<uint16_t>(Select(is_nan, nan, rounded));
}

// fp8 decodes through 256-entry tables of float bit patterns built at compile time: a
// scalar table load is faster than the vectorised arithmetic decode without SIMD gathers.

// A subnormal mant * 2^step_exp (mant in [1, 8)) as a normal float: 1.f * 2^e.
constexpr uint32_t SubnormalBits(uint32_t sign, uint32_t mant, int step_exp) {
  int top = 0;
  while ((mant >> (top + 1)) != 0) ++top;
  const uint32_t frac = (mant - (1u << top)) << (23 - top);
  return sign | (static_cast<uint32_t>(top + step_exp + 127) << 23) | frac;
}

// OCP E4M3FN: bias 7, no infinities, S.1111.111 is NaN, max finite 448.
constexpr uint32_t E4m3Bits(uint32_t v) {
  const uint32_t sign = (v & 0x80u) << 24;
  const uint32_t exp = (v >> 3) & 0xfu;
  const uint32_t mant = v & 0x7u;
  if (exp == 0xf && mant == 0x7) return sign | 0x7fc00000u;
  if (exp == 0) return mant == 0 ? sign : SubnormalBits(sign, mant, -9);
  return sign | ((exp + 127u - 7u) << 23) | (mant << 20);
}

// E5M2: bias 15, IEEE-style infinities and NaNs, max finite 57344.
constexpr uint32_t E5m2Bits(uint32_t v) {
  const uint32_t sign = (v & 0x80u) << 24;
  const uint32_t exp = (v >> 2) & 0x1fu;
  const uint32_t mant = v & 0x3u;
  if (exp == 0x1f) return sign | 0x7f800000u | (mant == 0 ? 0u : (0x400000u | (mant << 21)));
  if (exp == 0) return mant == 0 ? sign : SubnormalBits(sign, mant, -16);
  return sign | ((exp + 127u - 15u) << 23) | (mant << 21);
}

struct Fp8Table {
  uint32_t bits[256];
};

constexpr Fp8Table MakeFp8Table(uint32_t (*decode)(uint32_t)) {
  Fp8Table table{};
  for (uint32_t v = 0; v < 256; ++v) table.bits[v] = decode(v);
  return table;
}

constexpr Fp8Table kE4m3Table = MakeFp8Table(E4m3Bits);
constexpr Fp8Table kE5m2Table = MakeFp8Table(E5m2Bits);

inline float E4m3ToFloatImpl(uint8_t v) { return BitCast<float>(kE4m3Table.bits[v]); }
inline float E5m2ToFloatImpl(uint8_t v) { return BitCast<float>(kE5m2Table.bits[v]); }

// Round to nearest even; finite values (and infinities) beyond 448 saturate to +-448.
inline uint8_t FloatToE4m3Impl(float f) {
  const uint32_t u = BitCast<uint32_t>(f);
  const uint32_t sign = (u >> 24) & 0x80u;
  const uint32_t x = u & 0x7fffffffu;
  const int32_t xi = static_cast<int32_t>(x);
  // Below 2^-6 the result is subnormal or zero; ulp(2^14) is 2^-9, the subnormal step.
  const uint32_t subnormal = BitCast<uint32_t>(BitCast<float>(x) + 16384.0f) - 0x46800000u;
  const uint32_t normal = (x - ((127u - 7u) << 23) + 0x7ffffu + ((x >> 20) & 1u)) >> 20;
  uint32_t out = Select(xi < 0x3c800000, subnormal, normal);
  out = Select(xi > 0x43e00000, 0x7eu, out);  // beyond 448: saturate
  out = Select(xi > 0x7f800000, 0x7fu, out);  // NaN
  return static_cast<uint8_t>(sign | out);
}

// Round to nearest even; finite values beyond 57344 saturate, infinities stay infinite.
inline uint8_t FloatToE5m2Impl(float f) {
  const uint32_t u = BitCast<uint32_t>(f);
  const uint32_t sign = (u >> 24) & 0x80u;
  const uint32_t x = u & 0x7fffffffu;
  const int32_t xi = static_cast<int32_t>(x);
  // Below 2^-14 the result is subnormal or zero; ulp(2^7) is 2^-16, the subnormal step.
  const uint32_t subnormal = BitCast<uint32_t>(BitCast<float>(x) + 128.0f) - 0x43000000u;
  const uint32_t normal = (x - ((127u - 15u) << 23) + 0xfffffu + ((x >> 21) & 1u)) >> 21;
  uint32_t out = Select(xi < 0x38800000, subnormal, normal);
  out = Select(xi > 0x47600000, 0x7bu, out);   // beyond 57344: saturate
  out = Select(xi == 0x7f800000, 0x7cu, out);  // inf
  out = Select(xi > 0x7f800000, 0x7eu, out);   // NaN
  return static_cast<uint8_t>(sign | out);
}

// ---------------------------------------------------------------------------------------
// Per-type element functions. Each traits struct provides:
//   Storage            the element type in memory
//   Acc                the type arithmetic is done in
//   Divisor            the type Avg divides by (MakeDivisor builds it from the rank count)
//   Load, Store        Storage <-> Acc
//   Sum, Prod, Max, Min, Div on Acc

// Integers: wrap-around arithmetic in the unsigned type of the same width; comparisons in
// the real signedness; Avg is C division of the wrapped sum.
template <typename T>
struct IntTraits {
  using Storage = T;
  using Acc = T;
  using U = std::make_unsigned_t<T>;
  // Avg divides in floating point where that is exact and vectorises: for |a| < 2^p (p the
  // significand width, 24 or 53) a correctly rounded a / d lies closer to the true quotient
  // than 1 / d, so truncating it gives C's integer quotient (a float divisor above 2^24 is
  // inexact, but then |a| < d and both quotients are 0). 64-bit types divide natively.
  using Divisor =
      std::conditional_t<sizeof(T) == 1, float, std::conditional_t<sizeof(T) == 4, double, T>>;
  // Wide enough for any quotient (only uint32_t quotients exceed int32_t).
  using Quotient = std::conditional_t<std::is_same_v<T, uint32_t>, int64_t, int32_t>;

  static Acc Load(T v) { return v; }
  static T Store(Acc v) { return v; }
  static Acc Sum(Acc a, Acc b) {
    return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
  }
  // 8-bit operands promote to int, where the product (at most 255 * 255) cannot overflow.
  static Acc Prod(Acc a, Acc b) {
    return static_cast<T>(static_cast<U>(static_cast<U>(a) * static_cast<U>(b)));
  }
  static Acc Max(Acc a, Acc b) { return a > b ? a : b; }
  static Acc Min(Acc a, Acc b) { return a < b ? a : b; }
  static Divisor MakeDivisor(int n) { return static_cast<Divisor>(n); }
  static Acc Div(Acc a, Divisor d) {
    if constexpr (sizeof(T) < 8) {
      return static_cast<T>(static_cast<Quotient>(static_cast<Divisor>(a) / d));
    } else {
      return static_cast<T>(a / d);
    }
  }
};

// Floating point: Max and Min return NaN when either input is NaN, so the result does not
// depend on the order in which ranks are combined.
template <typename A>
struct FloatOps {
  using Acc = A;
  using Divisor = A;

  static A Sum(A a, A b) { return a + b; }
  static A Prod(A a, A b) { return a * b; }
  static A Max(A a, A b) { return ((a > b) | (a != a)) ? a : b; }
  static A Min(A a, A b) { return ((a < b) | (a != a)) ? a : b; }
  static Divisor MakeDivisor(int n) { return static_cast<A>(n); }
  static A Div(A a, Divisor d) { return a / d; }
};

struct F32Traits : FloatOps<float> {
  using Storage = float;
  static float Load(float v) { return v; }
  static float Store(float v) { return v; }
};

struct F64Traits : FloatOps<double> {
  using Storage = double;
  static double Load(double v) { return v; }
  static double Store(double v) { return v; }
};

struct F16Traits : FloatOps<float> {
  using Storage = uint16_t;
  static float Load(uint16_t v) { return HalfToFloatImpl(v); }
  static uint16_t Store(float v) { return FloatToHalfImpl(v); }
};

struct Bf16Traits : FloatOps<float> {
  using Storage = uint16_t;
  static float Load(uint16_t v) { return Bf16ToFloatImpl(v); }
  static uint16_t Store(float v) { return FloatToBf16Impl(v); }
};

struct E4m3Traits : FloatOps<float> {
  using Storage = uint8_t;
  static float Load(uint8_t v) { return E4m3ToFloatImpl(v); }
  static uint8_t Store(float v) { return FloatToE4m3Impl(v); }
};

struct E5m2Traits : FloatOps<float> {
  using Storage = uint8_t;
  static float Load(uint8_t v) { return E5m2ToFloatImpl(v); }
  static uint8_t Store(float v) { return FloatToE5m2Impl(v); }
};

// Base operations as functors over a traits struct.
struct SumOp {
  template <class Ty>
  static typename Ty::Acc Apply(typename Ty::Acc a, typename Ty::Acc b) {
    return Ty::Sum(a, b);
  }
};
struct ProdOp {
  template <class Ty>
  static typename Ty::Acc Apply(typename Ty::Acc a, typename Ty::Acc b) {
    return Ty::Prod(a, b);
  }
};
struct MaxOp {
  template <class Ty>
  static typename Ty::Acc Apply(typename Ty::Acc a, typename Ty::Acc b) {
    return Ty::Max(a, b);
  }
};
struct MinOp {
  template <class Ty>
  static typename Ty::Acc Apply(typename Ty::Acc a, typename Ty::Acc b) {
    return Ty::Min(a, b);
  }
};

// ---------------------------------------------------------------------------------------
// The loops.

// One output element: post(in (+) pre(local)), or post(pre(local)) without in.
template <class Ty, class Op, bool kIn, bool kPre, bool kPost>
inline typename Ty::Storage ReduceElement(typename Ty::Storage in, typename Ty::Storage local,
                                          typename Ty::Acc scale, typename Ty::Divisor div) {
  typename Ty::Acc v = Ty::Load(local);
  if constexpr (kPre) v = Ty::Prod(v, scale);
  if constexpr (kIn) v = Op::template Apply<Ty>(Ty::Load(in), v);
  if constexpr (kPost) v = Ty::Div(v, div);
  return Ty::Store(v);
}

// Full blocks go through a stack buffer: reads of in/local and the write of dst are then in
// separate loops with constant trip counts, which the compiler vectorises without run-time
// alias checks (dst may alias in or local) and without an epilogue. The tail is scalar.
template <class Ty, class Op, bool kIn, bool kPre, bool kPost>
void ReduceLoop(typename Ty::Storage* dst, const typename Ty::Storage* in,
                const typename Ty::Storage* local, size_t n, typename Ty::Acc scale,
                typename Ty::Divisor div) {
  using S = typename Ty::Storage;
  // 256 bytes of 1- and 2-byte types, 64 elements of wider ones.
  constexpr size_t kBlock = 256 / sizeof(S) < 64 ? 64 : 256 / sizeof(S);
  // User buffers need not be aligned to the element size: every load and
  // store goes through memcpy, which compiles to plain (unaligned) moves.
  size_t i = 0;
  for (; i + kBlock <= n; i += kBlock) {
    S a[kBlock], b[kBlock], out[kBlock];
    if (kIn) std::memcpy(a, in + i, sizeof(a));
    std::memcpy(b, local + i, sizeof(b));
    for (size_t j = 0; j < kBlock; ++j)
      out[j] = ReduceElement<Ty, Op, kIn, kPre, kPost>(kIn ? a[j] : S(), b[j], scale, div);
    std::memcpy(dst + i, out, sizeof(out));
  }
  for (; i < n; ++i) {
    S a = S(), b, out;
    if (kIn) std::memcpy(&a, in + i, sizeof(S));
    std::memcpy(&b, local + i, sizeof(S));
    out = ReduceElement<Ty, Op, kIn, kPre, kPost>(a, b, scale, div);
    std::memcpy(dst + i, &out, sizeof(S));
  }
}

template <class Ty, class Op, bool kIn>
void DispatchFlags(bool pre, bool post, void* dst, const void* in, const void* local, size_t n,
                   typename Ty::Acc scale, typename Ty::Divisor div) {
  using S = typename Ty::Storage;
  auto* d = static_cast<S*>(dst);
  const auto* a = static_cast<const S*>(in);
  const auto* b = static_cast<const S*>(local);
  if (pre) {
    if (post) {
      ReduceLoop<Ty, Op, kIn, true, true>(d, a, b, n, scale, div);
    } else {
      ReduceLoop<Ty, Op, kIn, true, false>(d, a, b, n, scale, div);
    }
  } else {
    if (post) {
      ReduceLoop<Ty, Op, kIn, false, true>(d, a, b, n, scale, div);
    } else {
      ReduceLoop<Ty, Op, kIn, false, false>(d, a, b, n, scale, div);
    }
  }
}

template <class Ty>
void ReduceTyped(const Reducer& r, void* dst, const void* in, const void* local, size_t n,
                 uint32_t flags) {
  using S = typename Ty::Storage;
  const bool pre = r.hasScale && (flags & kPre) != 0;
  const bool post = r.postDivide > 1 && (flags & kPost) != 0;
  if (in == nullptr && !pre && !post) {  // dst = local
    if (dst != local) std::memmove(dst, local, n * sizeof(S));
    return;
  }
  typename Ty::Acc scale{};
  if (pre) {
    S s;
    std::memcpy(&s, r.scalar, sizeof(S));
    scale = Ty::Load(s);
  }
  const typename Ty::Divisor div = post ? Ty::MakeDivisor(r.postDivide) : typename Ty::Divisor{};
  if (in == nullptr) {
    DispatchFlags<Ty, SumOp, false>(pre, post, dst, in, local, n, scale, div);
    return;
  }
  switch (r.op) {
    case BaseOp::Sum:
      DispatchFlags<Ty, SumOp, true>(pre, post, dst, in, local, n, scale, div);
      break;
    case BaseOp::Prod:
      DispatchFlags<Ty, ProdOp, true>(pre, post, dst, in, local, n, scale, div);
      break;
    case BaseOp::Max:
      DispatchFlags<Ty, MaxOp, true>(pre, post, dst, in, local, n, scale, div);
      break;
    case BaseOp::Min:
      DispatchFlags<Ty, MinOp, true>(pre, post, dst, in, local, n, scale, div);
      break;
  }
}

}  // namespace

size_t typeSize(loomDataType_t dtype) {
  switch (dtype) {
    case loomInt8:
    case loomUint8:
    case loomFloat8e4m3:
    case loomFloat8e5m2:
      return 1;
    case loomFloat16:
    case loomBfloat16:
      return 2;
    case loomInt32:
    case loomUint32:
    case loomFloat32:
      return 4;
    case loomInt64:
    case loomUint64:
    case loomFloat64:
      return 8;
    default:
      return 0;
  }
}

bool validType(int dtype) { return dtype >= 0 && dtype < loomNumTypes; }

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
  switch (r.dtype) {
    case loomInt8:
      return ReduceTyped<IntTraits<int8_t>>(r, dst, in, local, n, flags);
    case loomUint8:
      return ReduceTyped<IntTraits<uint8_t>>(r, dst, in, local, n, flags);
    case loomInt32:
      return ReduceTyped<IntTraits<int32_t>>(r, dst, in, local, n, flags);
    case loomUint32:
      return ReduceTyped<IntTraits<uint32_t>>(r, dst, in, local, n, flags);
    case loomInt64:
      return ReduceTyped<IntTraits<int64_t>>(r, dst, in, local, n, flags);
    case loomUint64:
      return ReduceTyped<IntTraits<uint64_t>>(r, dst, in, local, n, flags);
    case loomFloat16:
      return ReduceTyped<F16Traits>(r, dst, in, local, n, flags);
    case loomFloat32:
      return ReduceTyped<F32Traits>(r, dst, in, local, n, flags);
    case loomFloat64:
      return ReduceTyped<F64Traits>(r, dst, in, local, n, flags);
    case loomBfloat16:
      return ReduceTyped<Bf16Traits>(r, dst, in, local, n, flags);
    case loomFloat8e4m3:
      return ReduceTyped<E4m3Traits>(r, dst, in, local, n, flags);
    case loomFloat8e5m2:
      return ReduceTyped<E5m2Traits>(r, dst, in, local, n, flags);
    default:
      return;
  }
}

float halfToFloat(uint16_t h) { return HalfToFloatImpl(h); }
uint16_t floatToHalf(float f) { return FloatToHalfImpl(f); }
float bf16ToFloat(uint16_t h) { return Bf16ToFloatImpl(h); }
uint16_t floatToBf16(float f) { return FloatToBf16Impl(f); }
float e4m3ToFloat(uint8_t v) { return E4m3ToFloatImpl(v); }
uint8_t floatToE4m3(float f) { return FloatToE4m3Impl(f); }
float e5m2ToFloat(uint8_t v) { return E5m2ToFloatImpl(v); }
uint8_t floatToE5m2(float f) { return FloatToE5m2Impl(f); }

}  // namespace loom::kernels
