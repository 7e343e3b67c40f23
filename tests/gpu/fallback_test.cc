// The CUDA build of libloom on host buffers: it loads and runs whether or not the machine has a
// CUDA driver and device (the runtime is linked statically and reports no device), host buffers
// take the host path, and loomCommCuDevice reports -1 without a device (the current device with
// one). Runs everywhere (label unit): this is the CPU-side check that the CUDA build falls back.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <vector>

#include "harness.h"

namespace loomtest {
namespace {

TEST(CudaBuildFallback, HostBuffersAndNoDeviceReported) {
  LaunchOptions o;
  o.nranks = 2;
  LaunchResult r = launch(o, [](RankContext& ctx) -> int {
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess) devices = 0;
    int want = -1;
    if (devices > 0 && cudaGetDevice(&want) != cudaSuccess) return 1;
    int dev = -2;
    if (loomCommCuDevice(ctx.comm, &dev) != loomSuccess) return 2;
    if (dev != want) {
      std::fprintf(stderr, "rank %d: loomCommCuDevice gave %d, want %d (%d devices)\n", ctx.rank,
                   dev, want, devices);
      return 3;
    }
    const size_t count = 300007;
    std::vector<float> in(count), out(count, -1);
    for (size_t i = 0; i < count; ++i) in[i] = static_cast<float>(ctx.rank + 1) * (i % 11);
    if (loomAllReduce(in.data(), out.data(), count, loomFloat32, loomSum, ctx.comm, nullptr) !=
        loomSuccess)
      return 4;
    for (size_t i = 0; i < count; ++i) {
      if (out[i] != 3.0f * (i % 11)) {
        std::fprintf(stderr, "rank %d: element %zu is %g, want %g\n", ctx.rank, i, out[i],
                     3.0f * (i % 11));
        return 5;
      }
    }
    loomResult_t async = loomSuccess;
    if (loomCommGetAsyncError(ctx.comm, &async) != loomSuccess || async != loomSuccess) return 6;
    return 0;
  });
  EXPECT_TRUE(r.allPassed()) << r.report();
}

}  // namespace
}  // namespace loomtest
