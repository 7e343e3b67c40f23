// The CUDA reduction and copy kernels (algorithms/kernels/cuda) against the CPU build's kernels:
// every type, op (sum, prod, max, min, avg, PreMulSum), flag combination and source count (1, 2,
// 3, 5), aligned (16-byte vector path) and misaligned (element path), on random bits. Integers
// must match bit for bit; floats within 1 ulp of the storage type with NaN where the CPU has NaN
// (the shared element functions make them bit-identical; the count of inexact elements is
// printed so a GPU run shows whether they are). Skips where there is no CUDA device.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "algorithms/kernels/cpu/reduce.h"
#include "algorithms/kernels/cuda/reduce.h"
#include "gpu_util.h"

namespace loom::kernels {
namespace {

bool IsFloat(loomDataType_t t) {
  return t == loomFloat16 || t == loomFloat32 || t == loomFloat64 || t == loomBfloat16 ||
         t == loomFloat8e4m3 || t == loomFloat8e5m2;
}

// Decodes any float type to double (NaN stays NaN) through the CPU conversions.
double AsDouble(loomDataType_t t, uint64_t bits) {
  switch (t) {
    case loomFloat16:
      return halfToFloat(static_cast<uint16_t>(bits));
    case loomBfloat16:
      return bf16ToFloat(static_cast<uint16_t>(bits));
    case loomFloat8e4m3:
      return e4m3ToFloat(static_cast<uint8_t>(bits));
    case loomFloat8e5m2:
      return e5m2ToFloat(static_cast<uint8_t>(bits));
    case loomFloat32: {
      float f;
      uint32_t u = static_cast<uint32_t>(bits);
      std::memcpy(&f, &u, 4);
      return f;
    }
    default: {
      double d;
      std::memcpy(&d, &bits, 8);
      return d;
    }
  }
}

// Distance in representable values of the storage type (sign-magnitude codes made monotonic).
int64_t UlpDistance(size_t es, uint64_t a, uint64_t b) {
  const int bits = static_cast<int>(es * 8);
  auto ordered = [&](uint64_t v) -> int64_t {
    const uint64_t sign = uint64_t{1} << (bits - 1);
    const uint64_t mag = v & (sign - 1);
    return (v & sign) ? -static_cast<int64_t>(mag) : static_cast<int64_t>(mag);
  };
  const int64_t d = ordered(a) - ordered(b);
  return d < 0 ? -d : d;
}

struct DeviceBuffer {
  void* p = nullptr;
  explicit DeviceBuffer(size_t bytes) { EXPECT_EQ(cudaMalloc(&p, bytes), cudaSuccess); }
  ~DeviceBuffer() { cudaFree(p); }
};

class GpuKernelTest : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override { LOOM_SKIP_WITHOUT_GPU(); }
};

TEST_P(GpuKernelTest, ReduceMatchesCpuBuild) {
  const auto dt = static_cast<loomDataType_t>(GetParam());
  const size_t es = typeSize(dt);
  const size_t n = 100003;  // vectors and a tail
  std::mt19937_64 rng(1234 + GetParam());
  int64_t inexact = 0, checked = 0;
  for (int op = 0; op <= 5; ++op) {
    for (int nsrc : {1, 2, 3, 5}) {
      for (uint32_t flags : {0u, uint32_t{kPost}, uint32_t{kPre | kPost}}) {
        for (size_t shift : {size_t{0}, size_t{1}}) {  // 1: misaligned, element by element
          Reducer r;
          if (op == 5) {
            uint64_t scalar = rng();
            r = makePreMulSum(dt, &scalar);
          } else {
            r = makeReducer(dt, static_cast<loomRedOp_t>(op), 3);
          }
          std::vector<std::vector<unsigned char>> host(static_cast<size_t>(nsrc));
          std::vector<DeviceBuffer*> dev;
          std::vector<const void*> hsrc, dsrc;
          for (auto& h : host) {
            h.resize((n + shift) * es);
            for (auto& b : h) b = static_cast<unsigned char>(rng());
            dev.push_back(new DeviceBuffer((n + shift) * es));
            ASSERT_EQ(cudaMemcpy(dev.back()->p, h.data(), h.size(), cudaMemcpyHostToDevice),
                      cudaSuccess);
            hsrc.push_back(h.data() + shift * es);
            dsrc.push_back(static_cast<char*>(dev.back()->p) + shift * es);
          }
          std::vector<unsigned char> want(n * es), got(n * es);
          if (nsrc <= 2)
            reduce(r, want.data(), nsrc == 2 ? hsrc[0] : nullptr, hsrc[nsrc - 1], n, flags);
          else
            reduceMany(r, want.data(), hsrc.data(), hsrc.size(), n, flags);
          DeviceBuffer out((n + shift) * es);
          char* dout = static_cast<char*>(out.p) + shift * es;
          ASSERT_EQ(cuda::reduce(r, dout, dsrc.data(), nsrc, n, flags, nullptr), cudaSuccess);
          ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
          ASSERT_EQ(cudaMemcpy(got.data(), dout, n * es, cudaMemcpyDeviceToHost), cudaSuccess);
          for (auto* d : dev) delete d;
          for (size_t i = 0; i < n; ++i) {
            uint64_t w = 0, g = 0;
            std::memcpy(&w, &want[i * es], es);
            std::memcpy(&g, &got[i * es], es);
            ++checked;
            if (w == g) continue;
            const std::string where = "type " + std::to_string(dt) + " op " + std::to_string(op) +
                                      " nsrc " + std::to_string(nsrc) + " flags " +
                                      std::to_string(flags) + " shift " + std::to_string(shift) +
                                      " element " + std::to_string(i) + " of " + std::to_string(n);
            ASSERT_TRUE(IsFloat(dt)) << where << ": GPU 0x" << std::hex << g << ", CPU 0x" << w;
            const bool wn = std::isnan(AsDouble(dt, w)), gn = std::isnan(AsDouble(dt, g));
            ASSERT_EQ(wn, gn) << where << ": GPU " << AsDouble(dt, g) << ", CPU "
                              << AsDouble(dt, w);
            if (!wn) {
              ASSERT_LE(UlpDistance(es, w, g), 1)
                  << where << ": GPU " << AsDouble(dt, g) << ", CPU " << AsDouble(dt, w);
            }
            ++inexact;
          }
        }
      }
    }
  }
  std::printf("type %d: %lld of %lld elements not bit-identical to the CPU build\n", GetParam(),
              static_cast<long long>(inexact), static_cast<long long>(checked));
}

INSTANTIATE_TEST_SUITE_P(EveryType, GpuKernelTest,
                         ::testing::Range(0, static_cast<int>(loomNumTypes)));

TEST(GpuCopyKernel, CopiesBytesUnchangedAtAnyAlignment) {
  LOOM_SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(7);
  for (size_t bytes : {size_t{1}, size_t{15}, size_t{16}, size_t{4097}, size_t{(1 << 22) + 3}}) {
    for (size_t shift : {size_t{0}, size_t{3}}) {
      std::vector<unsigned char> src(bytes + shift), got(bytes);
      for (auto& b : src) b = static_cast<unsigned char>(rng());
      DeviceBuffer d_src(bytes + shift), d_dst(bytes + shift);
      ASSERT_EQ(cudaMemcpy(d_src.p, src.data(), src.size(), cudaMemcpyHostToDevice), cudaSuccess);
      ASSERT_EQ(cuda::copy(static_cast<char*>(d_dst.p) + shift, static_cast<char*>(d_src.p) + shift,
                           bytes, nullptr),
                cudaSuccess);
      ASSERT_EQ(cudaMemcpy(got.data(), static_cast<char*>(d_dst.p) + shift, bytes,
                           cudaMemcpyDeviceToHost),
                cudaSuccess);
      for (size_t i = 0; i < bytes; ++i)
        ASSERT_EQ(got[i], src[i + shift]) << "byte " << i << " of " << bytes << ", shift " << shift;
    }
  }
}

}  // namespace
}  // namespace loom::kernels
