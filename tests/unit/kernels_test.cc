// Tests for the element-wise reduction kernels (algorithms/kernels/cpu/reduce.h).
//
// Expectations come from an independent reference written here: narrow floating-point
// formats are decoded from their bit fields by formula and rounded with ldexp/nearbyint in
// double; integer results are computed in uint64_t and truncated. Nothing in this file
// calls the kernel's conversions to build an expected value.
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "algorithms/kernels/cpu/reduce.h"
#include "algorithms/kernels/cpu/reduce_isa.h"

namespace loom::kernels {
namespace {

// ---------------------------------------------------------------------------------------
// Reference floating-point formats.

struct FloatFormat {
  int exp_bits;
  int man_bits;
  int bias;
  bool ieee_specials;  // all-ones exponent is inf/NaN; otherwise only S.1..1.1..1 is NaN
  bool saturate;       // finite values beyond the largest finite one saturate
};

constexpr FloatFormat kHalfFormat{5, 10, 15, true, false};
constexpr FloatFormat kBf16Format{8, 7, 127, true, false};
constexpr FloatFormat kE4m3Format{4, 3, 7, false, true};
constexpr FloatFormat kE5m2Format{5, 2, 15, true, true};

double RefMaxFinite(const FloatFormat& f) {
  const int emax_code = (1 << f.exp_bits) - 1;
  if (f.ieee_specials) {  // exponent emax_code - 1, mantissa all ones
    return std::ldexp((1 << (f.man_bits + 1)) - 1, emax_code - 1 - f.bias - f.man_bits);
  }
  // Top exponent, mantissa all ones but the last (all ones is NaN).
  return std::ldexp((1 << (f.man_bits + 1)) - 2, emax_code - f.bias - f.man_bits);
}

double RefDecode(const FloatFormat& f, uint32_t code) {
  const bool negative = ((code >> (f.exp_bits + f.man_bits)) & 1u) != 0;
  const uint32_t e = (code >> f.man_bits) & ((1u << f.exp_bits) - 1);
  const uint32_t m = code & ((1u << f.man_bits) - 1);
  const uint32_t emax_code = (1u << f.exp_bits) - 1;
  double v;
  if (f.ieee_specials && e == emax_code) {
    v = m == 0 ? std::numeric_limits<double>::infinity() : std::numeric_limits<double>::quiet_NaN();
  } else if (!f.ieee_specials && e == emax_code && m == (1u << f.man_bits) - 1) {
    v = std::numeric_limits<double>::quiet_NaN();
  } else if (e == 0) {
    v = std::ldexp(static_cast<double>(m), 1 - f.bias - f.man_bits);
  } else {
    v = std::ldexp(static_cast<double>(m + (1u << f.man_bits)),
                   static_cast<int>(e) - f.bias - f.man_bits);
  }
  return negative ? -v : v;
}

// Rounds x to the format, nearest even, with the kernel's overflow rules: IEEE formats
// overflow to inf unless saturating; saturating formats clamp finite values; e4m3 (no inf)
// also clamps infinities.
double RefRound(const FloatFormat& f, double x) {
  if (std::isnan(x)) return x;
  const double max = RefMaxFinite(f);
  if (std::isinf(x)) return f.ieee_specials ? x : std::copysign(max, x);
  if (x == 0) return x;
  const double ax = std::fabs(x);
  const int emin = 1 - f.bias;
  const int e = std::max(std::ilogb(ax), emin);
  const double quantum = std::ldexp(1.0, e - f.man_bits);
  double r = std::nearbyint(ax / quantum) * quantum;  // default mode: ties to even
  if (r > max) r = f.saturate ? max : std::numeric_limits<double>::infinity();
  return std::copysign(r, x);
}

// Equal values with equal signs, or both NaN.
bool SameValue(double expected, double actual) {
  if (std::isnan(expected) || std::isnan(actual)) return std::isnan(expected) && std::isnan(actual);
  return expected == actual && std::signbit(expected) == std::signbit(actual);
}

float FloatFromBits(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

uint32_t BitsOfFloat(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  return bits;
}

// ---------------------------------------------------------------------------------------
// Decoding: every code of every narrow format.

TEST(KernelConversions, E4m3DecodesAllCodes) {
  for (uint32_t c = 0; c < 256; ++c) {
    EXPECT_TRUE(SameValue(RefDecode(kE4m3Format, c), e4m3ToFloat(static_cast<uint8_t>(c))))
        << "code " << c;
  }
  EXPECT_EQ(e4m3ToFloat(0x7e), 448.0f);
  EXPECT_EQ(e4m3ToFloat(0xfe), -448.0f);
  EXPECT_TRUE(std::isnan(e4m3ToFloat(0x7f)));
  EXPECT_TRUE(std::isnan(e4m3ToFloat(0xff)));
  EXPECT_EQ(e4m3ToFloat(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(e4m3ToFloat(0x08), std::ldexp(1.0f, -6));
  EXPECT_EQ(e4m3ToFloat(0x38), 1.0f);
  EXPECT_EQ(e4m3ToFloat(0x78), 256.0f);  // exponent 15 is finite in E4M3FN
}

TEST(KernelConversions, E5m2DecodesAllCodes) {
  for (uint32_t c = 0; c < 256; ++c) {
    EXPECT_TRUE(SameValue(RefDecode(kE5m2Format, c), e5m2ToFloat(static_cast<uint8_t>(c))))
        << "code " << c;
  }
  EXPECT_EQ(e5m2ToFloat(0x7b), 57344.0f);
  EXPECT_EQ(e5m2ToFloat(0x7c), std::numeric_limits<float>::infinity());
  EXPECT_EQ(e5m2ToFloat(0xfc), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(e5m2ToFloat(0x7d)));
  EXPECT_EQ(e5m2ToFloat(0x01), std::ldexp(1.0f, -16));
  EXPECT_EQ(e5m2ToFloat(0x3c), 1.0f);
}

TEST(KernelConversions, HalfAndBf16DecodeAllCodes) {
  for (uint32_t c = 0; c < 65536; ++c) {
    const auto h = static_cast<uint16_t>(c);
    ASSERT_TRUE(SameValue(RefDecode(kHalfFormat, c), halfToFloat(h))) << "half code " << c;
    ASSERT_TRUE(SameValue(RefDecode(kBf16Format, c), bf16ToFloat(h))) << "bf16 code " << c;
  }
  EXPECT_EQ(halfToFloat(0x7bff), 65504.0f);
  EXPECT_EQ(halfToFloat(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(halfToFloat(0x3c00), 1.0f);
  EXPECT_EQ(bf16ToFloat(0x3f80), 1.0f);
}

// ---------------------------------------------------------------------------------------
// Encoding: every representable value, every midpoint between neighbours and the floats
// next to them, out-of-range values, specials and a sweep across all float bit patterns.

struct Encoder {
  const char* name;
  const FloatFormat* format;
  int bits;
  uint32_t (*encode)(float);
};

uint32_t EncodeHalf(float f) { return floatToHalf(f); }
uint32_t EncodeBf16(float f) { return floatToBf16(f); }
uint32_t EncodeE4m3(float f) { return floatToE4m3(f); }
uint32_t EncodeE5m2(float f) { return floatToE5m2(f); }

const Encoder kEncoders[] = {
    {"fp16", &kHalfFormat, 16, EncodeHalf},
    {"bf16", &kBf16Format, 16, EncodeBf16},
    {"e4m3", &kE4m3Format, 8, EncodeE4m3},
    {"e5m2", &kE5m2Format, 8, EncodeE5m2},
};

class EncodeTest : public ::testing::TestWithParam<Encoder> {
 protected:
  // Returns false (after one failure) when the kernel's encoding of x is wrong.
  bool Check(float x) {
    const Encoder& e = GetParam();
    const uint32_t code = e.encode(x);
    const double expected = RefRound(*e.format, x);
    const double actual = RefDecode(*e.format, code);
    if (code >> e.bits != 0 || !SameValue(expected, actual)) {
      ADD_FAILURE() << e.name << ": x=" << x << " (bits 0x" << std::hex << BitsOfFloat(x)
                    << ") gave code 0x" << code << std::dec << " = " << actual << ", expected "
                    << expected;
      return false;
    }
    return true;
  }
};

TEST_P(EncodeTest, RoundTripsEveryCode) {
  const Encoder& e = GetParam();
  for (uint32_t c = 0; c < (1u << e.bits); ++c) {
    const double v = RefDecode(*e.format, c);
    if (std::isnan(v)) {
      ASSERT_TRUE(std::isnan(RefDecode(*e.format, e.encode(static_cast<float>(v)))));
      continue;
    }
    ASSERT_EQ(e.encode(static_cast<float>(v)), c) << e.name << " value " << v;
  }
}

TEST_P(EncodeTest, RoundsMidpointsToEven) {
  const Encoder& e = GetParam();
  const uint32_t sign_bit = 1u << (e.bits - 1);
  const float inf = std::numeric_limits<float>::infinity();
  for (uint32_t c = 0; c + 1 < sign_bit; ++c) {
    const double lo = RefDecode(*e.format, c);
    const double hi = RefDecode(*e.format, c + 1);
    if (!std::isfinite(lo) || !std::isfinite(hi)) continue;
    const auto mid = static_cast<float>((lo + hi) / 2);  // exact in float for these formats
    ASSERT_EQ(static_cast<double>(mid), (lo + hi) / 2);
    const uint32_t even = (c % 2 == 0) ? c : c + 1;
    ASSERT_EQ(e.encode(mid), even) << e.name << " midpoint of codes " << c << ", " << c + 1;
    ASSERT_EQ(e.encode(-mid), even | sign_bit) << e.name << " negative midpoint " << c;
    ASSERT_EQ(e.encode(std::nextafter(mid, 0.0f)), c) << e.name << " below midpoint " << c;
    ASSERT_EQ(e.encode(std::nextafter(mid, inf)), c + 1) << e.name << " above midpoint " << c;
  }
}

TEST_P(EncodeTest, MatchesReferenceOnSpecialsAndSweep) {
  const Encoder& e = GetParam();
  const auto max = static_cast<float>(RefMaxFinite(*e.format));
  const float inf = std::numeric_limits<float>::infinity();
  const float specials[] = {0.0f,    -0.0f,        inf,           -inf,
                            NAN,     -NAN,         FLT_MAX,       -FLT_MAX,
                            FLT_MIN, FLT_TRUE_MIN, -FLT_TRUE_MIN, max,
                            -max,    max * 1.01f,  max * 2,       -max * 1.5f,
                            1e30f,   -1e30f,       1e-30f,        std::nextafter(max, inf)};
  for (float x : specials) {
    if (!Check(x)) return;
  }
  // Every value and its float neighbours.
  for (uint32_t c = 0; c < (1u << e.bits); ++c) {
    const double v = RefDecode(*e.format, c);
    if (!std::isfinite(v)) continue;
    const auto f = static_cast<float>(v);
    if (!Check(f) || !Check(std::nextafter(f, inf)) || !Check(std::nextafter(f, -inf))) return;
  }
  // A sweep of float bit patterns (a prime stride reaches every exponent and many
  // mantissas), NaN payloads included.
  for (uint64_t bits = 0; bits < (1ull << 32); bits += 4099) {
    if (!Check(FloatFromBits(static_cast<uint32_t>(bits)))) return;
  }
}

TEST_P(EncodeTest, SaturatesAndKeepsNaN) {
  const Encoder& e = GetParam();
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(std::isnan(RefDecode(*e.format, e.encode(nan))));
  EXPECT_TRUE(std::isnan(RefDecode(*e.format, e.encode(-nan))));
  const double big = RefDecode(*e.format, e.encode(FLT_MAX));
  const double neg_big = RefDecode(*e.format, e.encode(-FLT_MAX));
  const double pos_inf = RefDecode(*e.format, e.encode(inf));
  if (e.format->saturate) {
    EXPECT_EQ(big, RefMaxFinite(*e.format));
    EXPECT_EQ(neg_big, -RefMaxFinite(*e.format));
  } else {
    EXPECT_TRUE(std::isinf(big) && big > 0);
    EXPECT_TRUE(std::isinf(neg_big) && neg_big < 0);
  }
  if (e.format->ieee_specials) {
    EXPECT_TRUE(std::isinf(pos_inf));  // e5m2, fp16, bf16 keep infinities
  } else {
    EXPECT_EQ(pos_inf, RefMaxFinite(*e.format));  // e4m3 has none: clamps
  }
}

INSTANTIATE_TEST_SUITE_P(AllNarrowFormats, EncodeTest, ::testing::ValuesIn(kEncoders),
                         [](const ::testing::TestParamInfo<Encoder>& info) {
                           return std::string(info.param.name);
                         });

TEST(KernelConversions, KnownEncodings) {
  EXPECT_EQ(floatToE4m3(448.0f), 0x7e);
  EXPECT_EQ(floatToE4m3(464.0f), 0x7e);  // tie between 448 and (NaN) 480: even, and clamped
  EXPECT_EQ(floatToE4m3(1000.0f), 0x7e);
  EXPECT_EQ(floatToE4m3(-1000.0f), 0xfe);
  EXPECT_EQ(floatToE4m3(std::numeric_limits<float>::infinity()), 0x7e);
  EXPECT_EQ(floatToE4m3(1.0625f), 0x38);                // 1 + 1/16: tie, rounds to even 1.0
  EXPECT_EQ(floatToE4m3(1.1875f), 0x3a);                // 1 + 3/16: tie, rounds to even 1.25
  EXPECT_EQ(floatToE4m3(std::ldexp(1.0f, -10)), 0x00);  // half the smallest subnormal: tie to 0
  EXPECT_EQ(floatToE4m3(std::ldexp(3.0f, -10)), 0x02);  // 1.5 subnormal steps: tie to 2
  EXPECT_EQ(floatToE5m2(57344.0f), 0x7b);
  EXPECT_EQ(floatToE5m2(61440.0f), 0x7b);  // would round to inf; saturates
  EXPECT_EQ(floatToE5m2(std::numeric_limits<float>::infinity()), 0x7c);
  EXPECT_EQ(floatToE5m2(-std::numeric_limits<float>::infinity()), 0xfc);
  EXPECT_EQ(floatToHalf(65504.0f), 0x7bff);
  EXPECT_EQ(floatToHalf(65520.0f), 0x7c00);  // tie between 65504 and 65536: even is inf
  EXPECT_EQ(floatToHalf(std::ldexp(1.0f, -25)), 0x0000);  // tie to even zero
  EXPECT_EQ(floatToHalf(std::ldexp(3.0f, -25)), 0x0002);
  EXPECT_EQ(floatToHalf(-0.0f), 0x8000);
  EXPECT_EQ(floatToBf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);  // tie to even
  EXPECT_EQ(floatToBf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);
  EXPECT_EQ(floatToBf16(FLT_MAX), 0x7f80);
  const uint16_t nan = floatToBf16(FloatFromBits(0x7f800001u));  // signalling NaN payload
  EXPECT_EQ(nan & 0x7f80, 0x7f80);
  EXPECT_NE(nan & 0x007f, 0);
}

// ---------------------------------------------------------------------------------------
// Reducer construction.

TEST(KernelReducer, TypeSizesAndValidity) {
  EXPECT_EQ(typeSize(loomInt8), 1u);
  EXPECT_EQ(typeSize(loomUint8), 1u);
  EXPECT_EQ(typeSize(loomInt32), 4u);
  EXPECT_EQ(typeSize(loomUint32), 4u);
  EXPECT_EQ(typeSize(loomInt64), 8u);
  EXPECT_EQ(typeSize(loomUint64), 8u);
  EXPECT_EQ(typeSize(loomFloat16), 2u);
  EXPECT_EQ(typeSize(loomFloat32), 4u);
  EXPECT_EQ(typeSize(loomFloat64), 8u);
  EXPECT_EQ(typeSize(loomBfloat16), 2u);
  EXPECT_EQ(typeSize(loomFloat8e4m3), 1u);
  EXPECT_EQ(typeSize(loomFloat8e5m2), 1u);
  EXPECT_EQ(typeSize(static_cast<loomDataType_t>(loomNumTypes)), 0u);
  for (int t = 0; t < loomNumTypes; ++t) EXPECT_TRUE(validType(t));
  EXPECT_FALSE(validType(-1));
  EXPECT_FALSE(validType(loomNumTypes));
}

TEST(KernelReducer, MakeReducerMapsOps) {
  EXPECT_EQ(makeReducer(loomFloat32, loomSum, 4).op, BaseOp::Sum);
  EXPECT_EQ(makeReducer(loomFloat32, loomProd, 4).op, BaseOp::Prod);
  EXPECT_EQ(makeReducer(loomFloat32, loomMax, 4).op, BaseOp::Max);
  EXPECT_EQ(makeReducer(loomFloat32, loomMin, 4).op, BaseOp::Min);
  const Reducer avg = makeReducer(loomInt32, loomAvg, 5);
  EXPECT_EQ(avg.dtype, loomInt32);
  EXPECT_EQ(avg.op, BaseOp::Sum);
  EXPECT_EQ(avg.postDivide, 5);
  EXPECT_FALSE(avg.hasScale);
  EXPECT_EQ(makeReducer(loomInt32, loomSum, 5).postDivide, 0);
  const loomRedOp_t bitwise[] = {loomBand, loomBor, loomBxor};
  const BaseOp base[] = {BaseOp::BAnd, BaseOp::BOr, BaseOp::BXor};
  for (int i = 0; i < 3; ++i) {
    const Reducer r = makeReducer(loomUint32, bitwise[i], 5);
    EXPECT_EQ(r.op, base[i]);
    EXPECT_EQ(r.postDivide, 0);
    EXPECT_FALSE(r.hasScale);
    EXPECT_TRUE(isBitwise(r.op));
    EXPECT_TRUE(isBuiltInOp(bitwise[i]));
  }
  EXPECT_FALSE(isBuiltInOp(loomNumOps));  // the first PreMulSum operation
  EXPECT_FALSE(isBuiltInOp(loomBxor + 1));
}

TEST(KernelReducer, MakePreMulSumCopiesScalar) {
  const double s = 2.5;
  const Reducer r = makePreMulSum(loomFloat64, &s);
  EXPECT_EQ(r.op, BaseOp::Sum);
  EXPECT_TRUE(r.hasScale);
  EXPECT_EQ(r.postDivide, 0);
  double copied;
  std::memcpy(&copied, r.scalar, sizeof(copied));
  EXPECT_EQ(copied, 2.5);
  const uint16_t h = 0x4000;  // fp16 2.0
  const Reducer rh = makePreMulSum(loomFloat16, &h);
  EXPECT_EQ(rh.scalar[0], 0x00);
  EXPECT_EQ(rh.scalar[1], 0x40);
  EXPECT_EQ(rh.scalar[2], 0x00);  // only typeSize bytes copied
}

TEST(KernelReducer, EmptyReduceTouchesNothing) {
  reduce(makeReducer(loomFloat32, loomSum, 2), nullptr, nullptr, nullptr, 0, kPre | kPost);
}

// ---------------------------------------------------------------------------------------
// Known values.

template <typename T>
T ReduceOne(const Reducer& r, T in, T local, uint32_t flags = kPre | kPost) {
  T out{};
  reduce(r, &out, &in, &local, 1, flags);
  return out;
}

TEST(KernelKnownValues, FloatEdges) {
  const Reducer half_sum = makeReducer(loomFloat16, loomSum, 2);
  EXPECT_EQ(ReduceOne<uint16_t>(half_sum, 0x7bff, 0x7bff), 0x7c00);  // 65504 + 65504 = inf
  EXPECT_EQ(ReduceOne<uint16_t>(half_sum, 0x0001, 0x0001), 0x0002);  // subnormals add
  EXPECT_EQ(ReduceOne<uint16_t>(half_sum, 0x3c00, 0xbc00), 0x0000);  // 1 + -1 = +0
  const Reducer bf_sum = makeReducer(loomBfloat16, loomSum, 2);
  EXPECT_EQ(ReduceOne<uint16_t>(bf_sum, 0x3f80, 0x3b80), 0x3f80);  // 1 + 2^-8: tie to even
  EXPECT_EQ(ReduceOne<uint16_t>(bf_sum, 0x3f81, 0x3b80), 0x3f82);  // (1 + 2^-7) + 2^-8
  const Reducer e4_sum = makeReducer(loomFloat8e4m3, loomSum, 2);
  EXPECT_EQ(ReduceOne<uint8_t>(e4_sum, 0x7e, 0x7e), 0x7e);  // 448 + 448 saturates
  EXPECT_EQ(ReduceOne<uint8_t>(e4_sum, 0xfe, 0xfe), 0xfe);
  EXPECT_EQ(ReduceOne<uint8_t>(e4_sum, 0x7f, 0x38) & 0x7f, 0x7f);  // NaN + 1 is NaN
  const Reducer e5_sum = makeReducer(loomFloat8e5m2, loomSum, 2);
  EXPECT_EQ(ReduceOne<uint8_t>(e5_sum, 0x7b, 0x7b), 0x7b);  // 57344 + 57344 saturates
  EXPECT_EQ(ReduceOne<uint8_t>(e5_sum, 0x7c, 0x3c), 0x7c);  // inf + 1 stays inf
  const Reducer e4_avg = makeReducer(loomFloat8e4m3, loomAvg, 2);
  EXPECT_EQ(ReduceOne<uint8_t>(e4_avg, 0x38, 0x40), 0x3c);  // (1 + 2) / 2 = 1.5
  const Reducer f_max = makeReducer(loomFloat32, loomMax, 2);
  EXPECT_TRUE(std::isnan(ReduceOne<float>(f_max, NAN, 1.0f)));  // NaN wins in either order
  EXPECT_TRUE(std::isnan(ReduceOne<float>(f_max, 1.0f, NAN)));
  const Reducer d_min = makeReducer(loomFloat64, loomMin, 2);
  EXPECT_TRUE(std::isnan(ReduceOne<double>(d_min, 1.0, NAN)));
  EXPECT_EQ(ReduceOne<double>(d_min, -3.0, 2.0), -3.0);
  const Reducer f_avg = makeReducer(loomFloat32, loomAvg, 3);
  EXPECT_EQ(ReduceOne<float>(f_avg, 1.0f, 1.0f), 2.0f / 3.0f);
  EXPECT_EQ(ReduceOne<float>(f_avg, 1.0f, 1.0f, 0), 2.0f);  // without kPost: plain sum
  const float three = 3.0f;
  const Reducer pms = makePreMulSum(loomFloat32, &three);
  EXPECT_EQ(ReduceOne<float>(pms, 1.0f, 2.0f), 7.0f);     // in + 3 * local
  EXPECT_EQ(ReduceOne<float>(pms, 1.0f, 2.0f, 0), 3.0f);  // without kPre: plain sum
  const uint16_t half_scale = 0x3800;                     // 0.5
  const Reducer pms_half = makePreMulSum(loomFloat16, &half_scale);
  EXPECT_EQ(ReduceOne<uint16_t>(pms_half, 0x3c00, 0x4000), 0x4000);  // 1 + 0.5 * 2 = 2
}

TEST(KernelKnownValues, IntegerWrapAround) {
  EXPECT_EQ(ReduceOne<int8_t>(makeReducer(loomInt8, loomSum, 2), INT8_MAX, 1), INT8_MIN);
  EXPECT_EQ(ReduceOne<uint8_t>(makeReducer(loomUint8, loomSum, 2), 255, 1), 0);
  EXPECT_EQ(ReduceOne<uint8_t>(makeReducer(loomUint8, loomProd, 2), 16, 16), 0);
  EXPECT_EQ(ReduceOne<int32_t>(makeReducer(loomInt32, loomSum, 2), INT32_MAX, 1), INT32_MIN);
  EXPECT_EQ(ReduceOne<int32_t>(makeReducer(loomInt32, loomProd, 2), INT32_MIN, -1), INT32_MIN);
  EXPECT_EQ(ReduceOne<uint32_t>(makeReducer(loomUint32, loomSum, 2), UINT32_MAX, 2), 1u);
  EXPECT_EQ(ReduceOne<int64_t>(makeReducer(loomInt64, loomSum, 2), INT64_MAX, 1), INT64_MIN);
  EXPECT_EQ(ReduceOne<int64_t>(makeReducer(loomInt64, loomProd, 2), INT64_MIN, -1), INT64_MIN);
  EXPECT_EQ(ReduceOne<uint64_t>(makeReducer(loomUint64, loomProd, 2), UINT64_MAX, 2),
            UINT64_MAX - 1);
  EXPECT_EQ(ReduceOne<uint64_t>(makeReducer(loomUint64, loomSum, 2), UINT64_MAX, UINT64_MAX),
            UINT64_MAX - 1);
}

TEST(KernelKnownValues, IntegerCompareAndDivide) {
  EXPECT_EQ(ReduceOne<int8_t>(makeReducer(loomInt8, loomMax, 2), -1, 1), 1);
  EXPECT_EQ(ReduceOne<uint8_t>(makeReducer(loomUint8, loomMax, 2), 0xff, 1), 0xff);
  EXPECT_EQ(ReduceOne<int64_t>(makeReducer(loomInt64, loomMin, 2), INT64_MIN, 0), INT64_MIN);
  EXPECT_EQ(ReduceOne<uint64_t>(makeReducer(loomUint64, loomMin, 2), UINT64_MAX, 0), 0u);
  EXPECT_EQ(ReduceOne<int32_t>(makeReducer(loomInt32, loomMin, 2), -5, 3), -5);
  EXPECT_EQ(ReduceOne<uint32_t>(makeReducer(loomUint32, loomMin, 2), 0x80000000u, 3), 3u);
  // Avg divides the wrapped sum with C semantics (truncation toward zero).
  EXPECT_EQ(ReduceOne<int8_t>(makeReducer(loomInt8, loomAvg, 2), 100, 100), -28);
  EXPECT_EQ(ReduceOne<int32_t>(makeReducer(loomInt32, loomAvg, 2), -4, -3), -3);
  EXPECT_EQ(ReduceOne<uint32_t>(makeReducer(loomUint32, loomAvg, 2), 0xfffffffeu, 0xfffffffeu),
            0x7ffffffeu);
  EXPECT_EQ(ReduceOne<uint32_t>(makeReducer(loomUint32, loomAvg, 3), UINT32_MAX, 0),
            UINT32_MAX / 3);
  EXPECT_EQ(ReduceOne<int64_t>(makeReducer(loomInt64, loomAvg, 3), INT64_MIN, -1), INT64_MAX / 3);
  EXPECT_EQ(ReduceOne<uint64_t>(makeReducer(loomUint64, loomAvg, 7), UINT64_MAX, 0),
            UINT64_MAX / 7);
  const int8_t four = 4;
  EXPECT_EQ(ReduceOne<int8_t>(makePreMulSum(loomInt8, &four), 5, 64), 5);  // 64 * 4 wraps to 0
}

// ---------------------------------------------------------------------------------------
// reduce() against the reference: every type x op, odd lengths, flags and aliasing.

struct TypeInfo {
  loomDataType_t dtype;
  const char* name;
  size_t size;
  bool is_int;
  bool is_signed;
  const FloatFormat* format;  // narrow floats; nullptr for fp32, fp64 and integers
};

const TypeInfo kTypes[] = {
    {loomInt8, "int8", 1, true, true, nullptr},
    {loomUint8, "uint8", 1, true, false, nullptr},
    {loomInt32, "int32", 4, true, true, nullptr},
    {loomUint32, "uint32", 4, true, false, nullptr},
    {loomInt64, "int64", 8, true, true, nullptr},
    {loomUint64, "uint64", 8, true, false, nullptr},
    {loomFloat16, "fp16", 2, false, false, &kHalfFormat},
    {loomFloat32, "fp32", 4, false, false, nullptr},
    {loomFloat64, "fp64", 8, false, false, nullptr},
    {loomBfloat16, "bf16", 2, false, false, &kBf16Format},
    {loomFloat8e4m3, "e4m3", 1, false, false, &kE4m3Format},
    {loomFloat8e5m2, "e5m2", 1, false, false, &kE5m2Format},
};

void PrintTo(const TypeInfo& t, std::ostream* os) { *os << t.name; }

enum class TestOp { kSum, kProd, kMax, kMin, kAvg, kPreMulSum, kBand, kBor, kBxor };
const char* const kOpNames[] = {"sum",       "prod", "max", "min", "avg",
                                "premulsum", "band", "bor", "bxor"};
constexpr int kRanks = 3;  // Avg divisor: not a power of two, so division rounds

uint64_t Mask(const TypeInfo& t) { return t.size == 8 ? ~0ull : (1ull << (8 * t.size)) - 1; }

int64_t AsSigned(const TypeInfo& t, uint64_t raw) {
  const int shift = 64 - 8 * static_cast<int>(t.size);
  return static_cast<int64_t>(raw << shift) >> shift;
}

// The value of a raw floating-point element, exactly.
double DecodeRaw(const TypeInfo& t, uint64_t raw) {
  if (t.format != nullptr) return RefDecode(*t.format, static_cast<uint32_t>(raw));
  if (t.dtype == loomFloat32) return FloatFromBits(static_cast<uint32_t>(raw));
  double d;
  std::memcpy(&d, &raw, sizeof(d));
  return d;
}

uint64_t EncodeFloat(const TypeInfo& t, double v) {
  if (t.dtype == loomFloat32) return BitsOfFloat(static_cast<float>(v));
  uint64_t raw;
  std::memcpy(&raw, &v, sizeof(raw));
  return raw;
}

template <typename A>
A RefApply(TestOp op, A a, A b) {
  switch (op) {
    case TestOp::kProd:
      return a * b;
    case TestOp::kMax:
      if (std::isnan(a) || std::isnan(b)) return std::isnan(a) ? a : b;
      return a > b ? a : b;
    case TestOp::kMin:
      if (std::isnan(a) || std::isnan(b)) return std::isnan(a) ? a : b;
      return a < b ? a : b;
    default:
      return a + b;
  }
}

// Expected value of one floating-point element, computed in A (float, or double for fp64).
template <typename A>
double RefFloatElement(const TypeInfo& t, TestOp op, const uint64_t* in, uint64_t local,
                       uint64_t scalar, bool pre, bool post) {
  A v = static_cast<A>(DecodeRaw(t, local));
  if (pre) v = v * static_cast<A>(DecodeRaw(t, scalar));
  if (in != nullptr) v = RefApply<A>(op, static_cast<A>(DecodeRaw(t, *in)), v);
  if (post) v = v / static_cast<A>(kRanks);
  const auto result = static_cast<double>(v);
  return t.format != nullptr ? RefRound(*t.format, result) : result;
}

// Expected raw bits of one integer element.
uint64_t RefIntElement(const TypeInfo& t, TestOp op, const uint64_t* in, uint64_t local,
                       uint64_t scalar, bool pre, bool post) {
  const uint64_t mask = Mask(t);
  uint64_t v = local;
  if (pre) v = (v * scalar) & mask;
  if (in != nullptr) {
    const uint64_t a = *in;
    const bool a_greater = t.is_signed ? AsSigned(t, a) > AsSigned(t, v) : a > v;
    const bool a_less = t.is_signed ? AsSigned(t, a) < AsSigned(t, v) : a < v;
    switch (op) {
      case TestOp::kProd:
        v = (a * v) & mask;
        break;
      case TestOp::kMax:
        v = a_greater ? a : v;
        break;
      case TestOp::kMin:
        v = a_less ? a : v;
        break;
      case TestOp::kBand:
        v = a & v;
        break;
      case TestOp::kBor:
        v = a | v;
        break;
      case TestOp::kBxor:
        v = a ^ v;
        break;
      default:
        v = (a + v) & mask;
        break;
    }
  }
  if (post) {
    v = t.is_signed ? static_cast<uint64_t>(AsSigned(t, v) / kRanks) & mask : v / kRanks;
  }
  return v;
}

uint64_t RandomRaw(const TypeInfo& t, std::mt19937_64& rng) {
  const uint64_t mask = Mask(t);
  if (t.is_int) {
    const uint64_t extremes[] = {0, 1, mask, mask >> 1, (mask >> 1) + 1};
    return rng() % 16 == 0 ? extremes[rng() % 5] : rng() & mask;
  }
  if (t.format != nullptr) return rng() & mask;  // every code, specials included
  const double inf = std::numeric_limits<double>::infinity();
  const double specials[] = {0.0, -0.0, inf, -inf, NAN, 1e300, 1e-310, -FLT_MAX, FLT_MIN};
  const uint64_t kind = rng() % 16;
  if (kind < 10) return EncodeFloat(t, std::uniform_real_distribution<double>(-1e3, 1e3)(rng));
  if (kind < 12) return rng() & mask;  // any bit pattern: huge, tiny, NaN payloads
  if (kind < 13) return EncodeFloat(t, specials[rng() % 9]);
  return EncodeFloat(t, static_cast<double>(static_cast<int>(rng() % 17) - 8));
}

uint64_t RandomScalar(const TypeInfo& t, std::mt19937_64& rng) {
  if (t.is_int) return rng() & Mask(t);
  if (t.format == nullptr) {
    return EncodeFloat(t, std::uniform_real_distribution<double>(-4, 4)(rng));
  }
  for (;;) {  // a finite, non-zero code
    const uint64_t raw = rng() & Mask(t);
    const double v = RefDecode(*t.format, static_cast<uint32_t>(raw));
    if (std::isfinite(v) && v != 0) return raw;
  }
}

void PutRaw(std::vector<unsigned char>& buf, const TypeInfo& t, size_t i, uint64_t raw) {
  std::memcpy(buf.data() + i * t.size, &raw, t.size);  // little endian
}

uint64_t GetRaw(const std::vector<unsigned char>& buf, const TypeInfo& t, size_t i) {
  uint64_t raw = 0;
  std::memcpy(&raw, buf.data() + i * t.size, t.size);
  return raw;
}

Reducer MakeTestReducer(const TypeInfo& t, TestOp op, std::mt19937_64& rng);

// Where the operands live.
enum class Layout { kSeparate, kNoIn, kNoInDstIsLocal, kDstIsIn, kDstIsLocal, kAllSame };
const char* const kLayoutNames[] = {"separate", "no-in",      "no-in dst==local",
                                    "dst==in",  "dst==local", "dst==in==local"};

class ReduceTest : public ::testing::TestWithParam<std::tuple<TypeInfo, TestOp>> {
 protected:
  // Runs one reduce and compares it with the reference; false after the first mismatch.
  bool RunCase(size_t n, uint32_t flags, Layout layout, std::mt19937_64& rng) {
    const TypeInfo& t = std::get<0>(GetParam());
    const TestOp op = std::get<1>(GetParam());
    constexpr size_t kGuard = 16;  // elements past n that must stay untouched
    const unsigned char kFill = 0xa5;

    Reducer r;
    uint64_t scalar = 0;
    if (op == TestOp::kPreMulSum) {
      scalar = RandomScalar(t, rng);
      r = makePreMulSum(t.dtype, &scalar);
    } else {
      r = MakeTestReducer(t, op, rng);
    }
    const bool pre = op == TestOp::kPreMulSum && (flags & kPre) != 0;
    const bool post = op == TestOp::kAvg && (flags & kPost) != 0;

    std::vector<uint64_t> in_raw(n), local_raw(n);
    for (size_t i = 0; i < n; ++i) {
      in_raw[i] = RandomRaw(t, rng);
      local_raw[i] = layout == Layout::kAllSame ? in_raw[i] : RandomRaw(t, rng);
    }
    std::vector<unsigned char> in_buf((n + kGuard) * t.size, kFill);
    std::vector<unsigned char> local_buf(in_buf), dst_buf(in_buf);
    for (size_t i = 0; i < n; ++i) {
      PutRaw(in_buf, t, i, in_raw[i]);
      PutRaw(local_buf, t, i, local_raw[i]);
    }
    const bool has_in = layout != Layout::kNoIn && layout != Layout::kNoInDstIsLocal;
    std::vector<unsigned char>* dst = &dst_buf;
    if (layout == Layout::kDstIsIn || layout == Layout::kAllSame) dst = &in_buf;
    if (layout == Layout::kDstIsLocal || layout == Layout::kNoInDstIsLocal) dst = &local_buf;
    const void* local_ptr = layout == Layout::kAllSame ? in_buf.data() : local_buf.data();
    reduce(r, dst->data(), has_in ? in_buf.data() : nullptr, local_ptr, n, flags);

    auto describe = [&](size_t i) {
      return std::string(t.name) + " " + kOpNames[static_cast<int>(op)] +
             " n=" + std::to_string(n) + " flags=" + std::to_string(flags) + " " +
             kLayoutNames[static_cast<int>(layout)] + " i=" + std::to_string(i);
    };
    for (size_t i = 0; i < n; ++i) {
      const uint64_t* in = has_in ? &in_raw[i] : nullptr;
      const uint64_t actual = GetRaw(*dst, t, i);
      if (t.is_int) {
        const uint64_t expected = RefIntElement(t, op, in, local_raw[i], scalar, pre, post);
        if (actual != expected) {
          ADD_FAILURE() << describe(i) << ": in=" << (in ? *in : 0) << " local=" << local_raw[i]
                        << " expected " << expected << " got " << actual;
          return false;
        }
        continue;
      }
      const double expected =
          t.dtype == loomFloat64
              ? RefFloatElement<double>(t, op, in, local_raw[i], scalar, pre, post)
              : RefFloatElement<float>(t, op, in, local_raw[i], scalar, pre, post);
      if (!SameValue(expected, DecodeRaw(t, actual))) {
        ADD_FAILURE() << describe(i) << ": in=" << (in ? DecodeRaw(t, *in) : 0.0)
                      << " local=" << DecodeRaw(t, local_raw[i]) << " expected " << expected
                      << " got " << DecodeRaw(t, actual) << " (raw 0x" << std::hex << actual << ")";
        return false;
      }
    }
    for (size_t b = n * t.size; b < dst->size(); ++b) {
      if ((*dst)[b] != kFill) {
        ADD_FAILURE() << describe(n) << ": wrote past the end";
        return false;
      }
    }
    return true;
  }
};

std::string ReduceTestName(const ::testing::TestParamInfo<std::tuple<TypeInfo, TestOp>>& info) {
  return std::string(std::get<0>(info.param).name) + "_" +
         kOpNames[static_cast<int>(std::get<1>(info.param))];
}

TEST_P(ReduceTest, MatchesReference) {
  const TypeInfo& t = std::get<0>(GetParam());
  std::mt19937_64 rng(0x10011 + 97 * t.dtype + static_cast<int>(std::get<1>(GetParam())));
  const size_t lengths[] = {0, 1, 7, 1023, 4099};
  const uint32_t flag_sets[] = {0, kPre, kPost, kPre | kPost};
  const Layout layouts[] = {Layout::kSeparate, Layout::kNoIn,       Layout::kNoInDstIsLocal,
                            Layout::kDstIsIn,  Layout::kDstIsLocal, Layout::kAllSame};
  for (size_t n : lengths) {
    for (uint32_t flags : flag_sets) {
      for (Layout layout : layouts) {
        if (!RunCase(n, flags, layout, rng)) return;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllTypesAllOps, ReduceTest,
                         ::testing::Combine(::testing::ValuesIn(kTypes),
                                            ::testing::Values(TestOp::kSum, TestOp::kProd,
                                                              TestOp::kMax, TestOp::kMin,
                                                              TestOp::kAvg, TestOp::kPreMulSum)),
                         ReduceTestName);

// The bitwise operations on the integer types (the only ones the API gives them).
INSTANTIATE_TEST_SUITE_P(IntegerTypesBitwiseOps, ReduceTest,
                         ::testing::Combine(::testing::ValuesIn(kTypes, kTypes + 6),
                                            ::testing::Values(TestOp::kBand, TestOp::kBor,
                                                              TestOp::kBxor)),
                         ReduceTestName);

// ---------------------------------------------------------------------------------------
// Instruction-set levels: each must give the scalar level's bytes exactly, for every type,
// op, flag set, layout, length and alignment, and on every code of the narrow formats.

struct Level {
  internal::Isa isa;
  const char* name;
};

void PrintTo(const Level& level, std::ostream* os) { *os << level.name; }

const Level kLevels[] = {
    {internal::Isa::kScalar, "scalar"},
    {internal::Isa::kAvx2, "avx2"},
    {internal::Isa::kAvx512, "avx512"},
};

const Level kSimdLevels[] = {kLevels[1], kLevels[2]};

const TypeInfo kNarrowTypes[] = {kTypes[0], kTypes[1],  kTypes[6],
                                 kTypes[9], kTypes[10], kTypes[11]};

std::string LevelAndTypeName(const ::testing::TestParamInfo<std::tuple<Level, TypeInfo>>& info) {
  return std::string(std::get<0>(info.param).name) + "_" + std::get<1>(info.param).name;
}

const internal::KernelSet& ScalarKernels() { return *internal::kernelsFor(internal::Isa::kScalar); }

TEST(KernelIsa, ChoosesTheBestAllowedLevel) {
  ASSERT_NE(internal::kernelsFor(internal::Isa::kScalar), nullptr);
  EXPECT_STREQ(internal::scalarKernels()->name, "scalar");
  // The level LOOM_KERNEL_ISA allows (all of them when unset or unknown).
  internal::Isa limit = internal::Isa::kAvx512;
  if (const char* env = std::getenv("LOOM_KERNEL_ISA")) {
    if (std::string(env) == "scalar") limit = internal::Isa::kScalar;
    if (std::string(env) == "avx2") limit = internal::Isa::kAvx2;
  }
  std::string expected = "scalar";
  for (const Level& level : kLevels) {
    if (level.isa <= limit && internal::kernelsFor(level.isa) != nullptr) expected = level.name;
  }
  EXPECT_EQ(std::string(kernelIsa()), expected);
  for (const Level& level : kLevels) {
    if (const internal::KernelSet* k = internal::kernelsFor(level.isa)) {
      EXPECT_STREQ(k->name, level.name);
    }
  }
}

// A reducer for op over t; PreMulSum draws its scalar from rng.
Reducer MakeTestReducer(const TypeInfo& t, TestOp op, std::mt19937_64& rng) {
  if (op == TestOp::kPreMulSum) {
    const uint64_t scalar = RandomScalar(t, rng);
    return makePreMulSum(t.dtype, &scalar);
  }
  const loomRedOp_t ops[] = {loomSum, loomProd, loomMax, loomMin, loomAvg,
                             loomSum, loomBand, loomBor, loomBxor};
  return makeReducer(t.dtype, ops[static_cast<int>(op)], kRanks);
}

// The bitwise ones on every type too: the kernels combine bytes whatever the type (the API
// allows them on integers only), so the levels and entry points must agree there as well.
constexpr TestOp kAllOps[] = {TestOp::kSum,  TestOp::kProd, TestOp::kMax,
                              TestOp::kMin,  TestOp::kAvg,  TestOp::kPreMulSum,
                              TestOp::kBand, TestOp::kBor,  TestOp::kBxor};

// Three operand buffers; the elements start `offset` bytes in, with guard bytes after.
struct Operands {
  static constexpr size_t kGuard = 80;
  static constexpr unsigned char kFill = 0x5a;
  std::vector<unsigned char> in, local, dst;

  Operands(const TypeInfo& t, const std::vector<uint64_t>& in_raw,
           const std::vector<uint64_t>& local_raw, size_t offset)
      : in(offset + in_raw.size() * t.size + kGuard, kFill), local(in), dst(in) {
    for (size_t i = 0; i < in_raw.size(); ++i) {
      std::memcpy(in.data() + offset + i * t.size, &in_raw[i], t.size);
      std::memcpy(local.data() + offset + i * t.size, &local_raw[i], t.size);
    }
  }
};

class KernelIsaTest : public ::testing::TestWithParam<std::tuple<Level, TypeInfo>> {
 protected:
  void SetUp() override {
    const Level& level = std::get<0>(GetParam());
    kernels_ = internal::kernelsFor(level.isa);
    if (kernels_ == nullptr) {
      GTEST_SKIP() << "this CPU or build has no " << level.name << " kernels";
    }
  }

  // Runs r over the same operands at the scalar level and at this one; false (after one
  // failure) when any byte of any buffer differs.
  bool Compare(const Reducer& r, uint32_t flags, Layout layout, const std::vector<uint64_t>& in_raw,
               const std::vector<uint64_t>& local_raw, size_t offset, const std::string& what) {
    const TypeInfo& t = std::get<1>(GetParam());
    const size_t n = in_raw.size();
    Operands expected(t, in_raw, local_raw, offset), actual(expected);
    auto run = [&](const internal::KernelSet& k, Operands& o) {
      unsigned char* in = o.in.data() + offset;
      unsigned char* local = o.local.data() + offset;
      unsigned char* dst = o.dst.data() + offset;
      switch (layout) {
        case Layout::kNoIn:
          return k.reduce(r, dst, nullptr, local, n, flags);
        case Layout::kNoInDstIsLocal:
          return k.reduce(r, local, nullptr, local, n, flags);
        case Layout::kDstIsIn:
          return k.reduce(r, in, in, local, n, flags);
        case Layout::kDstIsLocal:
          return k.reduce(r, local, in, local, n, flags);
        case Layout::kAllSame:
          return k.reduce(r, in, in, in, n, flags);
        default:
          return k.reduce(r, dst, in, local, n, flags);
      }
    };
    run(ScalarKernels(), expected);
    run(*kernels_, actual);
    const std::vector<unsigned char>* e[] = {&expected.in, &expected.local, &expected.dst};
    const std::vector<unsigned char>* a[] = {&actual.in, &actual.local, &actual.dst};
    for (int b = 0; b < 3; ++b) {
      for (size_t i = 0; i < e[b]->size(); ++i) {
        if ((*e[b])[i] != (*a[b])[i]) {
          ADD_FAILURE() << kernels_->name << " " << t.name << " " << what << " flags=" << flags
                        << " " << kLayoutNames[static_cast<int>(layout)] << " n=" << n
                        << " offset=" << offset << ": buffer " << b << " byte " << i << " (element "
                        << (i - offset) / t.size << ") is 0x" << std::hex << int{(*a[b])[i]}
                        << ", scalar gives 0x" << int{(*e[b])[i]};
          return false;
        }
      }
    }
    return true;
  }

  const internal::KernelSet* kernels_ = nullptr;
};

TEST_P(KernelIsaTest, MatchesScalarOnRandomData) {
  const TypeInfo& t = std::get<1>(GetParam());
  std::mt19937_64 rng(0x15a + 31 * t.dtype);
  const size_t lengths[] = {0, 1, 7, 15, 16, 17, 31, 33, 63, 64, 65, 127, 129, 257, 1023, 4099};
  const uint32_t flag_sets[] = {0, kPre, kPost, kPre | kPost};
  const Layout layouts[] = {Layout::kSeparate, Layout::kNoIn, Layout::kDstIsIn, Layout::kDstIsLocal,
                            Layout::kAllSame};
  // Element-aligned at two offsets, and (for wider types) not element-aligned.
  const size_t offsets[] = {0, 3 * t.size, t.size > 1 ? size_t{1} : 5 * t.size};
  for (TestOp op : kAllOps) {
    for (size_t n : lengths) {
      std::vector<uint64_t> in_raw(n), local_raw(n);
      for (size_t i = 0; i < n; ++i) {
        in_raw[i] = RandomRaw(t, rng);
        local_raw[i] = RandomRaw(t, rng);
      }
      const Reducer r = MakeTestReducer(t, op, rng);
      for (uint32_t flags : flag_sets) {
        for (Layout layout : layouts) {
          for (size_t offset : offsets) {
            if (!Compare(r, flags, layout, in_raw, local_raw, offset,
                         kOpNames[static_cast<int>(op)])) {
              return;
            }
          }
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllLevelsAllTypes, KernelIsaTest,
                         ::testing::Combine(::testing::ValuesIn(kSimdLevels),
                                            ::testing::ValuesIn(kTypes)),
                         LevelAndTypeName);

// Every pair of codes of the 8-bit types, and every code of the 16-bit ones against random
// partners, through every op and flag set: all decodes, and encodes of every sum, product,
// quotient and scaled value those produce.
class KernelIsaCodesTest : public KernelIsaTest {};

TEST_P(KernelIsaCodesTest, MatchesScalarOnEveryCode) {
  const TypeInfo& t = std::get<1>(GetParam());
  std::mt19937_64 rng(0xc0de + t.dtype);
  std::vector<uint64_t> in_raw(65536), local_raw(65536);
  for (uint64_t i = 0; i < 65536; ++i) {
    in_raw[i] = t.size == 1 ? i & 0xff : RandomRaw(t, rng);
    local_raw[i] = t.size == 1 ? i >> 8 : i;
  }
  for (TestOp op : kAllOps) {
    const Reducer r = MakeTestReducer(t, op, rng);
    for (uint32_t flags : {0u, uint32_t{kPre}, uint32_t{kPost}, uint32_t{kPre | kPost}}) {
      for (Layout layout : {Layout::kSeparate, Layout::kNoIn}) {
        if (!Compare(r, flags, layout, in_raw, local_raw, 0, kOpNames[static_cast<int>(op)])) {
          return;
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllLevelsNarrowTypes, KernelIsaCodesTest,
                         ::testing::Combine(::testing::ValuesIn(kSimdLevels),
                                            ::testing::ValuesIn(kNarrowTypes)),
                         LevelAndTypeName);

// Two NaN operands: the result is the first operand's NaN (in's, or the accumulated value's),
// made quiet, at every level. Random data rarely pairs NaNs with different payloads.
TEST(KernelIsa, PicksTheFirstOperandsNaN) {
  std::mt19937_64 rng(0x7a7a);
  const size_t n = 1031;
  for (const TypeInfo& t : {kTypes[7], kTypes[8]}) {  // fp32, fp64
    const int mant = t.size == 4 ? 23 : 52;
    const uint64_t exp_mask = t.size == 4 ? 0x7f800000ull : 0x7ff0000000000000ull;
    const uint64_t quiet = 1ull << (mant - 1);
    auto random_nan = [&] {
      const uint64_t payload = (rng() & ((1ull << mant) - 1)) | 1;  // non-zero: not inf
      const uint64_t sign = (rng() & 1) << (8 * t.size - 1);
      return sign | exp_mask | payload;
    };
    std::vector<uint64_t> in_raw(n), local_raw(n);
    for (size_t i = 0; i < n; ++i) {
      in_raw[i] = random_nan();
      local_raw[i] = random_nan();
    }
    for (TestOp op : {TestOp::kSum, TestOp::kProd, TestOp::kPreMulSum}) {
      const Reducer r = MakeTestReducer(t, op, rng);
      for (const Level& level : kLevels) {
        const internal::KernelSet* k = internal::kernelsFor(level.isa);
        if (k == nullptr) continue;
        Operands o(t, in_raw, local_raw, 0);
        const void* srcs[] = {o.in.data(), o.local.data(), o.in.data()};
        for (bool many : {false, true}) {
          if (many) {
            k->reduceMany(r, o.dst.data(), srcs, 3, n, 0);
          } else {
            k->reduce(r, o.dst.data(), o.in.data(), o.local.data(), n, kPre);
          }
          for (size_t i = 0; i < n; ++i) {
            uint64_t got = 0;
            std::memcpy(&got, o.dst.data() + i * t.size, t.size);
            ASSERT_EQ(got, in_raw[i] | quiet)
                << level.name << " " << t.name << " " << kOpNames[static_cast<int>(op)]
                << (many ? " reduceMany" : " reduce") << " element " << i;
          }
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------------------
// reduceMany() against the chain of reduce() calls it replaces, at every level.

// dst = post(srcs[0] (+) srcs[1] (+) ...) as a chain of scalar-level reduce() calls.
void ReduceChain(const Reducer& r, void* dst, const std::vector<const void*>& srcs, size_t n,
                 uint32_t flags) {
  const internal::KernelSet& k = ScalarKernels();
  if (srcs.size() == 1) {
    k.reduce(r, dst, nullptr, srcs[0], n, flags & kPost);
    return;
  }
  const void* acc = srcs[0];
  for (size_t q = 1; q < srcs.size(); ++q) {
    k.reduce(r, dst, acc, srcs[q], n, q + 1 == srcs.size() ? flags & kPost : 0);
    acc = dst;
  }
}

class ReduceManyTest : public ::testing::TestWithParam<TypeInfo> {};

TEST_P(ReduceManyTest, MatchesChainedReduce) {
  const TypeInfo& t = GetParam();
  std::mt19937_64 rng(0x3a11 + t.dtype);
  constexpr size_t kMaxSources = 9;
  // 2 to 17 elements: the public entry's few-element sums (kFewElements) and past them.
  const size_t lengths[] = {0, 1, 2, 7, kFewElements, kFewElements + 1, 1023, 4099, 9001};
  const uint32_t flag_sets[] = {0, kPost, kPre | kPost};  // kPre is ignored
  for (size_t n : lengths) {
    // One more buffer than sources: sources start at 1 unless dst aliases srcs[0].
    std::vector<std::vector<unsigned char>> bufs(kMaxSources + 1);
    for (auto& buf : bufs) {
      buf.resize(n * t.size + Operands::kGuard, Operands::kFill);
      for (size_t i = 0; i < n; ++i) {
        const uint64_t raw = RandomRaw(t, rng);
        std::memcpy(buf.data() + i * t.size, &raw, t.size);
      }
    }
    for (TestOp op : kAllOps) {
      const Reducer r = MakeTestReducer(t, op, rng);
      for (uint32_t flags : flag_sets) {
        for (size_t nsrc = 1; nsrc <= kMaxSources; ++nsrc) {
          // dst separate (bufs[0]), or dst the first, or the last source exactly: each step of
          // every level reads its part of every source before it writes dst's.
          for (size_t aliasAt : {kMaxSources, size_t{0}, nsrc - 1}) {
            const bool alias = aliasAt != kMaxSources;
            // Reference: the chain of reduce() calls into a separate dst (ref[0]); aliased, the
            // result then stands in the aliased source's buffer and ref[0] keeps its bytes.
            const auto used = bufs.begin() + static_cast<long>(nsrc) + 1;
            std::vector<std::vector<unsigned char>> ref(bufs.begin(), used);
            std::vector<const void*> ref_srcs;
            for (size_t k = 0; k < nsrc; ++k) ref_srcs.push_back(ref[k + 1].data());
            ReduceChain(r, ref[0].data(), ref_srcs, n, flags);
            if (alias) {
              ref[aliasAt + 1] = ref[0];
              ref[0] = bufs[0];
            }
            const std::string where =
                alias ? " dst==srcs[" + std::to_string(aliasAt) + "]" : std::string();
            for (const Level& level : kLevels) {
              const internal::KernelSet* k = internal::kernelsFor(level.isa);
              if (k == nullptr) continue;
              std::vector<std::vector<unsigned char>> got(bufs.begin(), used);
              std::vector<const void*> srcs;
              for (size_t q = 0; q < nsrc; ++q) srcs.push_back(got[q + 1].data());
              void* dst = alias ? got[aliasAt + 1].data() : got[0].data();
              k->reduceMany(r, dst, srcs.data(), nsrc, n, flags);
              if (got != ref) {
                ADD_FAILURE() << level.name << " " << t.name << " "
                              << kOpNames[static_cast<int>(op)] << " flags=" << flags
                              << " nsrc=" << nsrc << " n=" << n << where
                              << ": differs from the chain of reduce() calls";
                return;
              }
            }
            // The public entry point, which adds few-element float and double sums itself.
            std::vector<std::vector<unsigned char>> got(bufs.begin(), used);
            std::vector<const void*> srcs;
            for (size_t q = 0; q < nsrc; ++q) srcs.push_back(got[q + 1].data());
            loom::kernels::reduceMany(r, alias ? got[aliasAt + 1].data() : got[0].data(),
                                      srcs.data(), nsrc, n, flags);
            if (got != ref) {
              ADD_FAILURE() << "reduceMany() " << t.name << " " << kOpNames[static_cast<int>(op)]
                            << " flags=" << flags << " nsrc=" << nsrc << " n=" << n << where
                            << ": differs from the chain of reduce() calls";
              return;
            }
          }
        }
      }
    }
  }
}

TEST_P(ReduceManyTest, PublicEntryPointsAgree) {
  const TypeInfo& t = GetParam();
  std::mt19937_64 rng(0x9b + t.dtype);
  const size_t n = 777;
  std::vector<std::vector<unsigned char>> bufs(5, std::vector<unsigned char>(n * t.size));
  for (auto& buf : bufs) {
    for (size_t i = 0; i < n; ++i) {
      const uint64_t raw = RandomRaw(t, rng);
      std::memcpy(buf.data() + i * t.size, &raw, t.size);
    }
  }
  const Reducer r = makeReducer(t.dtype, loomAvg, 4);
  std::vector<unsigned char> chained(n * t.size), many(n * t.size);
  reduce(r, chained.data(), bufs[0].data(), bufs[1].data(), n, 0);
  reduce(r, chained.data(), chained.data(), bufs[2].data(), n, 0);
  reduce(r, chained.data(), chained.data(), bufs[3].data(), n, kPost);
  const void* srcs[] = {bufs[0].data(), bufs[1].data(), bufs[2].data(), bufs[3].data()};
  reduceMany(r, many.data(), srcs, 4, n, kPre | kPost);
  EXPECT_EQ(many, chained);
  std::vector<unsigned char> streamed(n * t.size), again(n * t.size);
  reduceManyStream(r, streamed.data(), again.data(), srcs, 4, n, kPre | kPost);
  streamFence();
  EXPECT_EQ(streamed, chained);
  EXPECT_EQ(again, chained);
  reduceManyStream(r, nullptr, nullptr, srcs, 0, n, kPost);  // no sources: nothing
  reduceMany(r, nullptr, srcs, 0, n, kPost);                 // no sources: nothing
  reduceMany(r, nullptr, nullptr, 3, 0, kPost);              // no elements: nothing
}

// reduceManyStream writes what the chain of reduce() calls gives, to dst and to copy, at
// every level, whatever either's alignment (element-misaligned included), touching nothing
// outside them; with more sources than its tiles keep offsets for, too.
TEST_P(ReduceManyTest, StreamWritesTheChainsResultToBothDestinations) {
  const TypeInfo& t = GetParam();
  std::mt19937_64 rng(0x5e7 + t.dtype);
  const size_t lengths[] = {0, 1, 7, 33, 1023, 4099};
  const size_t dst_offsets[] = {0, 1, 8, 16, 40};
  const long copy_offsets[] = {-1, 0, 1, 16, 24, 48};  // -1: no copy
  constexpr size_t kPad = 64;
  for (size_t n : lengths) {
    for (size_t nsrc : {size_t{1}, size_t{2}, size_t{3}, size_t{5}, size_t{70}}) {
      if (nsrc == 70 && n > 33) continue;
      std::vector<std::vector<unsigned char>> bufs(nsrc, std::vector<unsigned char>(n * t.size));
      for (auto& buf : bufs) {
        for (size_t i = 0; i < n; ++i) {
          const uint64_t raw = RandomRaw(t, rng);
          std::memcpy(buf.data() + i * t.size, &raw, t.size);
        }
      }
      std::vector<const void*> srcs;
      for (const auto& buf : bufs) srcs.push_back(buf.data());
      for (TestOp op : kAllOps) {
        const Reducer r = MakeTestReducer(t, op, rng);
        for (uint32_t flags : {uint32_t{0}, uint32_t{kPost}, uint32_t{kPost | kCopyCached}}) {
          std::vector<unsigned char> ref(n * t.size);
          ReduceChain(r, ref.data(), srcs, n, flags & kPost);
          for (const Level& level : kLevels) {
            const internal::KernelSet* k = internal::kernelsFor(level.isa);
            if (k == nullptr) continue;
            for (size_t dof : dst_offsets) {
              for (long cof : copy_offsets) {
                // 64-byte aligned blocks, so that the offsets are the destinations' alignments.
                alignas(64) static unsigned char area[2][4099 * 8 + 2 * kPad];
                for (auto& a : area) std::memset(a, Operands::kFill, n * t.size + 2 * kPad);
                unsigned char* dst = area[0] + kPad + dof;
                unsigned char* copy = cof < 0 ? nullptr : area[1] + kPad + cof;
                k->reduceManyStream(r, dst, copy, srcs.data(), nsrc, n, flags);
                streamFence();
                for (int a = 0; a < (cof < 0 ? 1 : 2); ++a) {
                  const size_t at = kPad + (a == 0 ? dof : static_cast<size_t>(cof));
                  for (size_t b = 0; b < n * t.size + 2 * kPad; ++b) {
                    const bool inside = b >= at && b < at + n * t.size;
                    const unsigned char want = inside ? ref[b - at] : Operands::kFill;
                    if (area[a][b] != want) {
                      ADD_FAILURE()
                          << level.name << " " << t.name << " " << kOpNames[static_cast<int>(op)]
                          << " flags=" << flags << " nsrc=" << nsrc << " n=" << n << " dst offset "
                          << dof << " copy offset " << cof << ": " << (a == 0 ? "dst" : "copy")
                          << " byte " << b
                          << (inside ? " differs from the chain's result"
                                     : " outside the destination was written");
                      return;
                    }
                  }
                }
              }
            }
          }
        }
      }
    }
  }
}

// reduceManyStream with dst, or copy (streamed or cached), being srcs[0]: the direct
// all-reduce's own slice in place, and its PreMulSum slice in its own buffer.
TEST_P(ReduceManyTest, StreamMayWriteOverItsFirstSource) {
  const TypeInfo& t = GetParam();
  std::mt19937_64 rng(0xa11 + t.dtype);
  for (size_t n : {size_t{5}, size_t{1023}, size_t{4099}}) {
    for (size_t nsrc : {size_t{2}, size_t{3}, size_t{70}}) {
      std::vector<std::vector<unsigned char>> bufs(nsrc, std::vector<unsigned char>(n * t.size));
      for (auto& buf : bufs) {
        for (size_t i = 0; i < n; ++i) {
          const uint64_t raw = RandomRaw(t, rng);
          std::memcpy(buf.data() + i * t.size, &raw, t.size);
        }
      }
      const Reducer r = MakeTestReducer(t, TestOp::kAvg, rng);
      std::vector<const void*> ref_srcs;
      for (const auto& buf : bufs) ref_srcs.push_back(buf.data());
      std::vector<unsigned char> ref(n * t.size);
      ReduceChain(r, ref.data(), ref_srcs, n, kPost);
      for (const Level& level : kLevels) {
        const internal::KernelSet* k = internal::kernelsFor(level.isa);
        if (k == nullptr) continue;
        for (int which = 0; which < 3; ++which) {  // dst, copy streamed, copy cached
          std::vector<unsigned char> first = bufs[0], other(n * t.size);
          std::vector<const void*> srcs = ref_srcs;
          srcs[0] = first.data();
          void* dst = which == 0 ? first.data() : other.data();
          void* copy = which == 0 ? other.data() : first.data();
          k->reduceManyStream(r, dst, copy, srcs.data(), nsrc, n,
                              kPost | (which == 2 ? uint32_t{kCopyCached} : 0u));
          streamFence();
          EXPECT_EQ(first, ref) << level.name << " " << t.name << " nsrc=" << nsrc << " n=" << n
                                << (which == 0   ? " dst"
                                    : which == 1 ? " copy"
                                                 : " cached copy")
                                << " == srcs[0]";
          EXPECT_EQ(other, ref) << level.name << " " << t.name << " nsrc=" << nsrc << " n=" << n;
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllTypes, ReduceManyTest, ::testing::ValuesIn(kTypes),
                         [](const ::testing::TestParamInfo<TypeInfo>& info) {
                           return std::string(info.param.name);
                         });

}  // namespace
}  // namespace loom::kernels

// streamCopy copies exactly `bytes` whatever the alignment of either end, touching nothing
// outside [dst, dst + bytes): heads before dst's first 64-byte boundary, the whole lines and
// the tail, each checked against the source byte by byte; at every level this CPU has, and
// through the public entry point.
TEST(KernelStreamCopy, CopiesEveryAlignmentAndLengthExactly) {
  using loom::kernels::internal::Isa;
  using loom::kernels::internal::KernelSet;
  std::vector<std::pair<std::string, void (*)(void*, const void*, size_t)>> copies{
      {"public", loom::kernels::streamCopy}};
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512})
    if (const KernelSet* k = loom::kernels::internal::kernelsFor(isa))
      copies.emplace_back(k->name, k->streamCopy);
  std::mt19937 rng(7);
  std::vector<unsigned char> src(4096 + 64), dst(4096 + 192);
  for (auto& b : src) b = static_cast<unsigned char>(rng());
  const size_t lengths[] = {0, 1, 15, 16, 17, 63, 64, 65, 79, 80, 127, 128, 129, 1000, 4096};
  for (const auto& [name, copy] : copies)
    for (size_t so = 0; so < 16; so += 3)
      for (size_t dof = 0; dof < 96; dof += 5)
        for (size_t len : lengths) {
          std::fill(dst.begin(), dst.end(), static_cast<unsigned char>(0xA5));
          copy(dst.data() + 32 + dof, src.data() + so, len);
          loom::kernels::streamFence();
          for (size_t i = 0; i < dst.size(); ++i) {
            const bool inside = i >= 32 + dof && i < 32 + dof + len;
            const unsigned char want = inside ? src[so + i - 32 - dof] : 0xA5;
            ASSERT_EQ(dst[i], want) << name << ": src offset " << so << ", dst offset " << dof
                                    << ", length " << len << ", byte " << i;
          }
        }
}
