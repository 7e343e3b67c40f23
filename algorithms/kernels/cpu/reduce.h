// Element-wise reduction kernels for every Loom data type and operation.
//
// One entry point, reduce(), combines an incoming piece with a local one:
//   dst[i] = post( in[i] (+) pre(local[i]) )
// where (+) is the base operation (sum, prod, max, min), pre() multiplies by
// the PreMulSum scalar when the reducer has one and kPre is set, and post()
// divides by the rank count for Avg when kPost is set. With in == nullptr,
// dst[i] = post(pre(local[i])). Integers wrap as in C (computed unsigned);
// fp16, bf16, fp8 (e4m3, e5m2) compute in fp32 and round to nearest even
// once per element; fp8 conversions saturate to the largest finite value.
// dst may alias in or local exactly. Thread safe; no allocation. Where both
// operands of a floating-point sum or product are NaN, the result is the first's
// (in's) NaN, made quiet.
//
// reduceMany() combines any number of sources in one pass. Both run scalar, AVX2 or AVX-512
// loops, whichever is the best the CPU supports (chosen once, at first use; the environment
// variable LOOM_KERNEL_ISA=scalar|avx2|avx512 caps the level); every level gives
// bit-identical results.
#pragma once

#include <cstddef>
#include <cstdint>

#include "loom/loom.h"

namespace loom::kernels {

// BAnd, BOr and BXor combine the elements' bytes whatever their type (the API allows them on
// integer types only); kPre and kPost do not apply to them.
enum class BaseOp : uint8_t { Sum, Prod, Max, Min, BAnd, BOr, BXor };

inline bool isBitwise(BaseOp op) { return op >= BaseOp::BAnd; }
// Whether op is loomBand, loomBor or loomBxor.
inline bool isBitwiseOp(int op) { return op >= loomBand && op <= loomBxor; }
// Whether op is one of loomRedOp_t's fixed operations (not a PreMulSum one).
inline bool isBuiltInOp(int op) { return (op >= 0 && op < loomNumOps) || isBitwiseOp(op); }
inline bool isIntegerType(loomDataType_t dtype) { return dtype >= loomInt8 && dtype <= loomUint64; }

// kCopyCached: reduceManyStream only, its copy takes plain stores (for a copy whose lines
// are in the caches already, such as an in-place output just read).
enum ReduceFlags : uint32_t { kPre = 1, kPost = 2, kCopyCached = 4 };

// Up to this many elements, reduceMany adds float and double sums itself (no vector kernel).
constexpr size_t kFewElements = 8;

struct Reducer {
  loomDataType_t dtype = loomFloat32;
  BaseOp op = BaseOp::Sum;
  bool hasScale = false;                    // PreMulSum
  alignas(8) unsigned char scalar[8] = {};  // the scalar, encoded as dtype
  int postDivide = 0;                       // Avg: divide results by this (0 or 1: no post-op)
};

inline bool validType(int dtype) { return dtype >= 0 && dtype < loomNumTypes; }
// Bytes per element; 0 for an unknown type. Inline: every call's argument checks and plan
// look-up ask it.
inline size_t typeSize(loomDataType_t dtype) {
  // In loomDataType_t's order: int8, uint8, int32, uint32, int64, uint64, float16, float32,
  // float64, bfloat16, float8e4m3, float8e5m2.
  static_assert(loomInt8 == 0 && loomUint8 == 1 && loomInt32 == 2 && loomUint32 == 3 &&
                    loomInt64 == 4 && loomUint64 == 5 && loomFloat16 == 6 && loomFloat32 == 7 &&
                    loomFloat64 == 8 && loomBfloat16 == 9 && loomFloat8e4m3 == 10 &&
                    loomFloat8e5m2 == 11 && loomNumTypes == 12,
                "kSizes follows loomDataType_t");
  static constexpr unsigned char kSizes[loomNumTypes] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};
  return validType(dtype) ? kSizes[dtype] : 0;
}

// A reducer for a built-in op (sum, prod, max, min, avg, band, bor, bxor) over nranks ranks.
Reducer makeReducer(loomDataType_t dtype, loomRedOp_t op, int nranks);
// A PreMulSum reducer; scalar points to one value of dtype.
Reducer makePreMulSum(loomDataType_t dtype, const void* scalar);

void reduce(const Reducer& r, void* dst, const void* in, const void* local, size_t n,
            uint32_t flags);

// dst[i] = post( srcs[0][i] (+) srcs[1][i] (+) ... (+) srcs[nsrc-1][i] ), combined in index
// order with the result rounded to dtype after every combine, so that the result is bit for
// bit that of chaining reduce(r, dst, acc, srcs[k], n, 0) for k = 1, 2, ... with acc =
// srcs[0] and then dst (kPost on the last call only). kPre is not applied: the sources are
// already scaled. One source gives reduce(r, dst, nullptr, srcs[0], n, flags & kPost); none
// does nothing. dst may alias any one source exactly: every level reads an element's (or a
// step's) part of every source before it writes dst's. Each source is read once and dst
// written once.
void reduceMany(const Reducer& r, void* dst, const void* const* srcs, size_t nsrc, size_t n,
                uint32_t flags);

// dst = src (bytes), written with non-temporal (streaming) stores where the CPU has them
// (x86-64), else memcpy: the lines go to memory, not to this core's cache, which is faster
// when another core reads them next or the copy is larger than the caches. The stores are
// weakly ordered: call streamFence() before publishing the data to another thread or
// process. Buffers must not overlap. 32-byte stores where the CPU has AVX2 (the avx2 and avx512
// levels), else 16-byte ones; LOOM_KERNEL_ISA=scalar keeps the 16-byte ones.
void streamCopy(void* dst, const void* src, size_t bytes);
// dst = reduceMany(r, ., srcs, nsrc, n, flags), bit for bit, written with streaming stores as
// streamCopy writes; so is copy, the same result again, unless it is nullptr (with
// kCopyCached in flags, copy takes plain stores). One pass: each source is read once and the
// result goes from registers (or, at the scalar level and for integer Avg, from a tile in
// the L1 cache) to both. For a result that another core reads next or that is larger than
// the caches, such as the direct all-reduce's slice, which goes to its shared buffer and to
// the output. Either destination may be srcs[0] exactly (a step reads before it writes), not
// both; otherwise neither overlaps a source or the other. Call streamFence() before
// publishing the data.
void reduceManyStream(const Reducer& r, void* dst, void* copy, const void* const* srcs, size_t nsrc,
                      size_t n, uint32_t flags);
// Orders every streaming store before it ahead of every store after it.
void streamFence();

// The instruction-set level reduce() and reduceMany() use: "scalar", "avx2" or "avx512".
const char* kernelIsa();

// Scalar conversions (exposed for tests and the verifier's references).
float halfToFloat(uint16_t h);
uint16_t floatToHalf(float f);
float bf16ToFloat(uint16_t h);
uint16_t floatToBf16(float f);
float e4m3ToFloat(uint8_t v);
uint8_t floatToE4m3(float f);
float e5m2ToFloat(uint8_t v);
uint8_t floatToE5m2(float f);

}  // namespace loom::kernels
