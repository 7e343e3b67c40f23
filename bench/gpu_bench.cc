// loom-gpu-bench: the CUDA reduction kernel's bandwidth beside cudaMemcpy device to device, in
// the same run, as bytes read + written per second (a copy of B bytes moves 2B; a reduce of k
// sources moves (k + 1)B). Prints one JSON object on stdout; exits 1 on a CUDA error.
//   loom-gpu-bench [bytes per buffer, default 256M] [iterations, default 20]
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "algorithms/kernels/cuda/reduce.h"

namespace {

#define BENCH_CHECK(call)                                                                     \
  do {                                                                                        \
    const cudaError_t e_ = (call);                                                            \
    if (e_ != cudaSuccess) {                                                                  \
      std::fprintf(stderr, "loom-gpu-bench: %s failed: %s\n", #call, cudaGetErrorString(e_)); \
      std::exit(1);                                                                           \
    }                                                                                         \
  } while (0)

// Seconds per call of fn, timed with events over iters calls after 3 warm-up calls.
template <class Fn>
double timeIt(int iters, Fn&& fn) {
  cudaEvent_t a, b;
  BENCH_CHECK(cudaEventCreate(&a));
  BENCH_CHECK(cudaEventCreate(&b));
  for (int i = 0; i < 3; ++i) fn();
  BENCH_CHECK(cudaEventRecord(a));
  for (int i = 0; i < iters; ++i) fn();
  BENCH_CHECK(cudaEventRecord(b));
  BENCH_CHECK(cudaEventSynchronize(b));
  float ms = 0;
  BENCH_CHECK(cudaEventElapsedTime(&ms, a, b));
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return ms / 1e3 / iters;
}

}  // namespace

int main(int argc, char** argv) {
  const size_t bytes = argc > 1 ? std::strtoull(argv[1], nullptr, 0) : size_t{256} << 20;
  const int iters = argc > 2 ? std::atoi(argv[2]) : 20;
  int dev = 0;
  BENCH_CHECK(cudaGetDevice(&dev));
  cudaDeviceProp prop{};
  BENCH_CHECK(cudaGetDeviceProperties(&prop, dev));
  std::vector<void*> buf(4);
  for (auto& p : buf) {
    BENCH_CHECK(cudaMalloc(&p, bytes));
    BENCH_CHECK(cudaMemset(p, 0, bytes));
  }
  const double gb = 1e9;
  const double copy = timeIt(iters, [&] {
    BENCH_CHECK(cudaMemcpyAsync(buf[0], buf[1], bytes, cudaMemcpyDeviceToDevice, nullptr));
  });
  const double copyKernel = timeIt(
      iters, [&] { BENCH_CHECK(loom::kernels::cuda::copy(buf[0], buf[1], bytes, nullptr)); });
  std::string out = "{\"device\": \"" + std::string(prop.name) +
                    "\", \"bytes\": " + std::to_string(bytes) +
                    ", \"memcpy_d2d_GBps\": " + std::to_string(2 * bytes / copy / gb) +
                    ", \"copy_kernel_GBps\": " + std::to_string(2 * bytes / copyKernel / gb);
  struct Case {
    loomDataType_t t;
    const char* name;
    int nsrc;
  };
  const Case cases[] = {{loomFloat32, "float32", 2},
                        {loomBfloat16, "bfloat16", 2},
                        {loomFloat16, "float16", 2},
                        {loomFloat32, "float32", 3},
                        {loomFloat8e4m3, "e4m3", 2}};
  double ratio = 0;
  for (const Case& c : cases) {
    const loom::kernels::Reducer r = loom::kernels::makeReducer(c.t, loomSum, c.nsrc);
    const size_t n = bytes / loom::kernels::typeSize(c.t);
    const void* srcs[3] = {buf[1], buf[2], buf[3]};
    const double t = timeIt(iters, [&] {
      BENCH_CHECK(loom::kernels::cuda::reduce(r, buf[0], srcs, c.nsrc, n, 0, nullptr));
    });
    const double bw = (c.nsrc + 1) * bytes / t / gb;
    if (c.t == loomFloat32 && c.nsrc == 2) ratio = bw / (2 * bytes / copy / gb);
    out += ", \"reduce_" + std::string(c.name) + "_sum_" + std::to_string(c.nsrc) +
           "src_GBps\": " + std::to_string(bw);
  }
  out += ", \"reduce_float32_vs_memcpy\": " + std::to_string(ratio) + "}";
  std::printf("%s\n", out.c_str());
  for (auto* p : buf) cudaFree(p);
  return 0;
}
