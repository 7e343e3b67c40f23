// The element functions shared by the CPU and CUDA kernels (algorithms/kernels/elementwise.inc),
// as the CUDA kernels use them (Fold/Finish over several sources), against the CPU kernels
// (reduce() and reduceMany() at every instruction-set level this CPU has), for every type, op,
// flag combination and source count, bit for bit, on random bits that include NaNs, infinities,
// subnormals and extreme integers. The CPU kernels are themselves checked against an
// independent reference in kernels_test.cc; this test pins the CUDA formulation to them, so the
// GPU tests (tests/gpu) only have to show the device computes what this file computes.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "algorithms/kernels/cpu/reduce.h"
#include "algorithms/kernels/cpu/reduce_isa.h"
#include "algorithms/kernels/host_device.h"

// As the kernels compile them (reduce.cc): no contraction, no trapping assumptions.
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off", "no-trapping-math")
#endif

namespace loom::kernels {
namespace {

#include "algorithms/kernels/elementwise.inc"

// What a CUDA kernel computes for one element, written with the shared functions.
template <class Ty, class Op>
void ReferenceOf(const Reducer& r, uint32_t flags, void* dst, const std::vector<const void*>& srcs,
                 size_t n) {
  using S = typename Ty::Storage;
  const int nsrc = static_cast<int>(srcs.size());
  Params<Ty> p;
  p.pre = r.hasScale && (flags & kPre) != 0 && nsrc <= 2;
  p.post = r.postDivide > 1 && (flags & kPost) != 0;
  if (p.pre) {
    S s;
    std::memcpy(&s, r.scalar, sizeof(S));
    p.scale = Ty::Load(s);
  }
  if (p.post) p.div = Ty::MakeDivisor(r.postDivide);
  for (size_t i = 0; i < n; ++i) {
    typename Ty::Acc acc{};
    for (int k = 0; k < nsrc; ++k) {
      S s;
      std::memcpy(&s, static_cast<const S*>(srcs[static_cast<size_t>(k)]) + i, sizeof(S));
      Fold<Ty, Op>(acc, s, k, nsrc, p);
    }
    S out = Finish<Ty>(acc, p);
    if (nsrc == 1 && !p.pre && !p.post)  // a plain copy: the kernels move bytes unchanged
      std::memcpy(&out, static_cast<const S*>(srcs[0]) + i, sizeof(S));
    std::memcpy(static_cast<S*>(dst) + i, &out, sizeof(S));
  }
}

void Reference(const Reducer& r, uint32_t flags, void* dst, const std::vector<const void*>& srcs,
               size_t n) {
  VisitType(r.dtype, [&](auto tag) {
    using Ty = typename decltype(tag)::Traits;
    switch (r.op) {
      case BaseOp::Sum:
        return ReferenceOf<Ty, SumOp>(r, flags, dst, srcs, n);
      case BaseOp::Prod:
        return ReferenceOf<Ty, ProdOp>(r, flags, dst, srcs, n);
      case BaseOp::Max:
        return ReferenceOf<Ty, MaxOp>(r, flags, dst, srcs, n);
      case BaseOp::Min:
        return ReferenceOf<Ty, MinOp>(r, flags, dst, srcs, n);
      case BaseOp::BAnd:
      case BaseOp::BOr:
      case BaseOp::BXor:
        return;  // byte-wise, no shared function (kernels_test checks them)
    }
  });
}

// Random bits: every pattern of a narrow type (NaNs, infinities, subnormals) comes up.
std::vector<unsigned char> RandomBytes(size_t bytes, std::mt19937_64& rng) {
  std::vector<unsigned char> v(bytes);
  for (auto& b : v) b = static_cast<unsigned char>(rng());
  return v;
}

using Param = std::tuple<int /*dtype*/, int /*op*/>;
class SharedFunctorTest : public ::testing::TestWithParam<Param> {};

TEST_P(SharedFunctorTest, MatchCpuKernelsBitForBit) {
  const auto dt = static_cast<loomDataType_t>(std::get<0>(GetParam()));
  const int op = std::get<1>(GetParam());
  const size_t es = typeSize(dt);
  const size_t n = 1000 + 37;  // full vector blocks and a tail
  std::mt19937_64 rng(static_cast<uint64_t>(dt) * 131 + static_cast<uint64_t>(op));
  for (int nsrc : {1, 2, 3, 5}) {
    for (uint32_t flags : {0u, uint32_t{kPre}, uint32_t{kPost}, uint32_t{kPre | kPost}}) {
      Reducer r;
      if (op == 5) {  // PreMulSum with a random scalar
        const auto scalar = RandomBytes(8, rng);
        r = makePreMulSum(dt, scalar.data());
      } else {
        r = makeReducer(dt, static_cast<loomRedOp_t>(op), 3 + static_cast<int>(rng() % 6));
      }
      std::vector<std::vector<unsigned char>> data;
      std::vector<const void*> srcs;
      for (int k = 0; k < nsrc; ++k) data.push_back(RandomBytes(n * es, rng));
      for (auto& d : data) srcs.push_back(d.data());
      std::vector<unsigned char> want(n * es), got(n * es);
      Reference(r, flags, want.data(), srcs, n);
      for (internal::Isa isa :
           {internal::Isa::kScalar, internal::Isa::kAvx2, internal::Isa::kAvx512}) {
        const internal::KernelSet* k = internal::kernelsFor(isa);
        if (k == nullptr) continue;
        std::fill(got.begin(), got.end(), 0xA5);
        if (nsrc <= 2)
          k->reduce(r, got.data(), nsrc == 2 ? srcs[0] : nullptr,
                    srcs[static_cast<size_t>(nsrc - 1)], n, flags);
        else
          k->reduceMany(r, got.data(), srcs.data(), srcs.size(), n, flags);
        for (size_t i = 0; i < n; ++i) {
          if (std::memcmp(&want[i * es], &got[i * es], es) == 0) continue;
          uint64_t w = 0, g = 0;
          std::memcpy(&w, &want[i * es], es);
          std::memcpy(&g, &got[i * es], es);
          FAIL() << "type " << dt << " op " << op << " nsrc " << nsrc << " flags " << flags
                 << " level " << k->name << ": element " << i << " shared functions give 0x"
                 << std::hex << w << ", the CPU kernel 0x" << g;
        }
      }
    }
  }
}

std::string NameOf(const ::testing::TestParamInfo<Param>& info) {
  static const char* kOps[] = {"sum", "prod", "max", "min", "avg", "premulsum"};
  return "type" + std::to_string(std::get<0>(info.param)) + "_" + kOps[std::get<1>(info.param)];
}

INSTANTIATE_TEST_SUITE_P(EveryTypeAndOp, SharedFunctorTest,
                         ::testing::Combine(::testing::Range(0, static_cast<int>(loomNumTypes)),
                                            ::testing::Range(0, 6)),
                         NameOf);

// The device decodes fp8 arithmetically, the host through tables: every code agrees.
TEST(SharedFunctions, Fp8ArithmeticDecodeMatchesTables) {
  for (uint32_t v = 0; v < 256; ++v) {
    EXPECT_EQ(E4m3Bits(v), kE4m3Table.bits[v]) << "e4m3 code " << v;
    EXPECT_EQ(E5m2Bits(v), kE5m2Table.bits[v]) << "e5m2 code " << v;
  }
}

}  // namespace
}  // namespace loom::kernels
