// Every collective on CUDA device buffers, 1, 2 and 4 ranks as processes on one GPU (the ranks
// share device 0 when there is one), through cuda_ipc (all-reduce) and through host staging
// (LOOM_CUDA_IPC_DISABLE=1, and every other collective); a CUDA graph holding an all-reduce
// replayed 100 times; a device-side wait that times out when a peer never comes. Results are
// checked against values computed here from each rank's input pattern (small integers, so
// every partial result is exact); a failure names the rank, collective, type, count and the
// first wrong element. Skips where there is no CUDA device.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "gpu_util.h"
#include "harness.h"

namespace loomtest {
namespace {

// Rank r's input element i: a small integer in [-8, 8].
double inputOf(int r, size_t i) { return static_cast<double>(((r + 1) * 7 + i * 3) % 17) - 8; }
// Inputs for prod: 1 or 2, so products of up to 8 ranks stay exact.
double prodInputOf(int r, size_t i) { return static_cast<double>(1 + (r + i) % 2); }

// Host encodings of the types the test uses.
size_t sizeOf(loomDataType_t t) {
  switch (t) {
    case loomBfloat16:
    case loomFloat16:
      return 2;
    case loomInt32:
    case loomFloat32:
      return 4;
    default:
      return 8;
  }
}
void put(loomDataType_t t, void* buf, size_t i, double v) {
  char* p = static_cast<char*>(buf) + i * sizeOf(t);
  switch (t) {
    case loomFloat32: {
      float f = static_cast<float>(v);
      std::memcpy(p, &f, 4);
      break;
    }
    case loomFloat64:
      std::memcpy(p, &v, 8);
      break;
    case loomInt32: {
      int32_t x = static_cast<int32_t>(v);
      std::memcpy(p, &x, 4);
      break;
    }
    case loomInt64: {
      int64_t x = static_cast<int64_t>(v);
      std::memcpy(p, &x, 8);
      break;
    }
    case loomBfloat16: {
      uint16_t x = static_cast<uint16_t>(codec::encodeMini(v, codec::kBf16Fmt));
      std::memcpy(p, &x, 2);
      break;
    }
    default: {
      uint16_t x = static_cast<uint16_t>(codec::encodeMini(v, codec::kHalfFmt));
      std::memcpy(p, &x, 2);
      break;
    }
  }
}
double get(loomDataType_t t, const void* buf, size_t i) {
  const char* p = static_cast<const char*>(buf) + i * sizeOf(t);
  switch (t) {
    case loomFloat32: {
      float f;
      std::memcpy(&f, p, 4);
      return f;
    }
    case loomFloat64: {
      double d;
      std::memcpy(&d, p, 8);
      return d;
    }
    case loomInt32: {
      int32_t x;
      std::memcpy(&x, p, 4);
      return x;
    }
    case loomInt64: {
      int64_t x;
      std::memcpy(&x, p, 8);
      return static_cast<double>(x);
    }
    case loomBfloat16: {
      uint16_t x;
      std::memcpy(&x, p, 2);
      return codec::decodeMini(x, codec::kBf16Fmt);
    }
    default: {
      uint16_t x;
      std::memcpy(&x, p, 2);
      return codec::decodeMini(x, codec::kHalfFmt);
    }
  }
}

// The reduction of element i over n ranks, as the library must compute it.
double reduced(int op, loomDataType_t t, int n, size_t i, double scalar) {
  double acc = 0;
  for (int r = 0; r < n; ++r) {
    const double v = op == loomProd ? prodInputOf(r, i) : inputOf(r, i);
    if (r == 0)
      acc = op == 5 ? v * scalar : v;
    else if (op == loomProd)
      acc *= v;
    else if (op == loomMax)
      acc = std::max(acc, v);
    else if (op == loomMin)
      acc = std::min(acc, v);
    else
      acc += op == 5 ? v * scalar : v;
  }
  if (op == loomAvg) {
    if (t == loomInt32 || t == loomInt64) return std::trunc(acc / n);
    if (t == loomFloat32)
      return static_cast<float>(static_cast<float>(acc) / static_cast<float>(n));
    return acc / n;  // float64 (the test averages no narrower float)
  }
  return acc;
}

struct Rank {
  RankContext& ctx;
  cudaStream_t stream = nullptr;
  std::string failure;

  bool fail(const std::string& what) {
    if (failure.empty())
      failure =
          "rank " + std::to_string(ctx.rank) + " of " + std::to_string(ctx.nranks) + ": " + what;
    return false;
  }
  bool ok(loomResult_t rc, const char* call) {
    if (rc == loomSuccess) return true;
    return fail(std::string(call) + ": " + loomGetErrorString(rc) + ": " +
                loomGetLastError(ctx.comm));
  }
  bool cuda(cudaError_t e, const char* call) {
    if (e == cudaSuccess) return true;
    return fail(std::string(call) + ": " + cudaGetErrorString(e));
  }
  // Copies host data in, runs fn on device pointers, waits, copies `outBytes` back and checks
  // with expect(i) for every element of the output.
  bool run(const std::string& name, loomDataType_t t, const std::vector<char>& in, size_t outCount,
           bool inPlace, size_t inPlaceOffset, size_t outOffset,
           const std::function<loomResult_t(const void*, void*)>& call,
           const std::function<bool(size_t, double*)>& expect) {
    const size_t es = sizeOf(t);
    const size_t outBytes = outCount * es;
    const size_t bufBytes = std::max(outBytes, in.size()) + 64;
    char* dsend = nullptr;
    char* drecv = nullptr;
    if (!cuda(cudaMalloc(reinterpret_cast<void**>(&dsend), bufBytes), "cudaMalloc")) return false;
    if (!cuda(cudaMalloc(reinterpret_cast<void**>(&drecv), bufBytes), "cudaMalloc")) return false;
    bool good = cuda(cudaMemset(drecv, 0xff, bufBytes), "cudaMemset");  // NaN / -1 junk
    const char* sendPtr = inPlace ? drecv + inPlaceOffset : dsend;
    if (good && !in.empty())
      good =
          cuda(cudaMemcpy(const_cast<char*>(sendPtr), in.data(), in.size(), cudaMemcpyHostToDevice),
               "cudaMemcpy in");
    // The memset and a copy from pageable memory may still be in flight on return, and the
    // test's stream (non-blocking) does not wait for the default stream.
    if (good) good = cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    if (good) good = ok(call(sendPtr, drecv), name.c_str());
    if (good) good = cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    loomResult_t async = loomSuccess;
    if (good)
      good =
          ok(loomCommGetAsyncError(ctx.comm, &async), "loomCommGetAsyncError") &&
          (async == loomSuccess || fail(name + ": asynchronous error " + loomGetErrorString(async) +
                                        ": " + loomGetLastError(ctx.comm)));
    std::vector<char> out(outBytes);
    if (good && outBytes > 0)
      good = cuda(cudaMemcpy(out.data(), drecv + outOffset, outBytes, cudaMemcpyDeviceToHost),
                  "cudaMemcpy out");
    for (size_t i = 0; good && i < outCount; ++i) {
      double want = 0;
      if (!expect(i, &want)) continue;
      const double got = get(t, out.data(), i);
      if (!(got == want))
        good = fail(name + ", count " + std::to_string(outCount) + (inPlace ? ", in place" : "") +
                    ": element " + std::to_string(i) + " is " + std::to_string(got) + ", want " +
                    std::to_string(want));
    }
    cudaFree(dsend);
    cudaFree(drecv);
    return good;
  }
};

std::vector<char> inputs(loomDataType_t t, int rank, size_t count, bool prod, size_t first = 0) {
  std::vector<char> v(count * sizeOf(t));
  for (size_t i = 0; i < count; ++i)
    put(t, v.data(), i, prod ? prodInputOf(rank, first + i) : inputOf(rank, first + i));
  return v;
}

int runAll(RankContext& ctx, bool big) {
  Rank k{ctx, nullptr, {}};
  if (!k.cuda(cudaStreamCreateWithFlags(&k.stream, cudaStreamNonBlocking), "cudaStreamCreate")) {
    std::fprintf(stderr, "%s\n", k.failure.c_str());
    return 1;
  }
  const loomStream_t s = reinterpret_cast<loomStream_t>(k.stream);
  const int n = ctx.nranks, me = ctx.rank;
  loomComm_t comm = ctx.comm;
  int dev = -2;
  bool good = k.ok(loomCommCuDevice(comm, &dev), "loomCommCuDevice") &&
              (dev == 0 || k.fail("loomCommCuDevice gave " + std::to_string(dev) + ", want 0"));
  std::vector<size_t> counts = {1, 1000003};
  if (big) counts.push_back((size_t{9} << 20) + 7);  // > one cuda_ipc chunk of fp32
  // All-reduce: every op on float, and sum on the other types.
  struct AR {
    loomDataType_t t;
    int op;
  };
  std::vector<AR> ars = {{loomFloat32, loomSum},  {loomFloat32, loomProd}, {loomFloat32, loomMax},
                         {loomFloat32, loomMin},  {loomFloat32, loomAvg},  {loomFloat32, 5},
                         {loomInt32, loomSum},    {loomInt64, loomAvg},    {loomFloat64, loomMin},
                         {loomBfloat16, loomSum}, {loomFloat16, loomMax}};
  for (size_t count : counts) {
    for (const AR& a : ars) {
      if (!good) break;
      if (count > 1000003 && a.t != loomFloat32) continue;
      for (bool inPlace : {false, true}) {
        loomRedOp_t op = static_cast<loomRedOp_t>(a.op);
        const double scalar = 2;
        if (a.op == 5) {
          float f = 2;
          double d = 2;
          void* p = a.t == loomFloat64 ? static_cast<void*>(&d) : static_cast<void*>(&f);
          good = k.ok(loomRedOpCreatePreMulSum(&op, p, a.t, loomScalarHostImmediate, comm),
                      "loomRedOpCreatePreMulSum");
          if (!good) break;
        }
        const std::string name =
            "all-reduce type " + std::to_string(a.t) + " op " + std::to_string(a.op);
        good = k.run(
            name, a.t, inputs(a.t, me, count, a.op == loomProd), count, inPlace, 0, 0,
            [&](const void* in, void* out) {
              return loomAllReduce(in, out, count, a.t, op, comm, s);
            },
            [&](size_t i, double* w) {
              *w = reduced(a.op, a.t, n, i, scalar);
              return true;
            });
        if (a.op == 5) loomRedOpDestroy(op, comm);
      }
    }
  }
  const loomDataType_t t = loomFloat32;
  const size_t c = 100003;
  const int root = 1 % n;
  // Broadcast.
  for (bool inPlace : {false, true}) {
    if (!good) break;
    good = k.run(
        "broadcast", t, me == root ? inputs(t, me, c, false) : std::vector<char>(), c, inPlace, 0,
        0, [&](const void* in, void* out) { return loomBroadcast(in, out, c, t, root, comm, s); },
        [&](size_t i, double* w) {
          *w = inputOf(root, i);
          return true;
        });
  }
  // Reduce (sum) to root; other ranks' outputs are not checked.
  for (bool inPlace : {false, true}) {
    if (!good) break;
    good = k.run(
        "reduce", t, inputs(t, me, c, false), c, inPlace, 0, 0,
        [&](const void* in, void* out) {
          return loomReduce(in, out, c, t, loomSum, root, comm, s);
        },
        [&](size_t i, double* w) {
          *w = reduced(loomSum, t, n, i, 1);
          return me == root;
        });
  }
  // All-gather: rank r's block r.
  for (bool inPlace : {false, true}) {
    if (!good) break;
    good = k.run(
        "all-gather", t, inputs(t, me, c, false), c * n, inPlace, me * c * sizeOf(t), 0,
        [&](const void* in, void* out) { return loomAllGather(in, out, c, t, comm, s); },
        [&](size_t i, double* w) {
          *w = inputOf(static_cast<int>(i / c), i % c);
          return true;
        });
  }
  // Reduce-scatter: block `me` of the sum over ranks of their n * c inputs. In place the output
  // is recvbuff = sendbuff + rank * recvcount.
  for (bool inPlace : {false, true}) {
    if (!good) break;
    const size_t at = inPlace ? me * c * sizeOf(t) : 0;
    good = k.run(
        "reduce-scatter", t, inputs(t, me, c * n, false), c, inPlace, 0, at,
        [&](const void* in, void* out) {
          return loomReduceScatter(in, static_cast<char*>(out) + at, c, t, loomSum, comm, s);
        },
        [&](size_t i, double* w) {
          *w = reduced(loomSum, t, n, me * c + i, 1);
          return true;
        });
  }
  // All-to-all: block p of my output is rank p's block `me`.
  if (good)
    good = k.run(
        "all-to-all", t, inputs(t, me, c * n, false), c * n, false, 0, 0,
        [&](const void* in, void* out) { return loomAllToAll(in, out, c, t, comm, s); },
        [&](size_t i, double* w) {
          *w = inputOf(static_cast<int>(i / c), me * c + i % c);
          return true;
        });
  // Send to the next rank, receive from the previous one, in a group.
  if (good)
    good = k.run(
        "send/recv", t, inputs(t, me, c, false), c, false, 0, 0,
        [&](const void* in, void* out) {
          loomGroupStart();
          loomSend(in, c, t, (me + 1) % n, comm, s);
          loomRecv(out, c, t, (me + n - 1) % n, comm, s);
          return loomGroupEnd();
        },
        [&](size_t i, double* w) {
          *w = inputOf((me + n - 1) % n, i);
          return true;
        });
  // A host-buffer call after device calls still works (it waits for the staged ones).
  if (good) {
    float one = 1, sum = 0;
    good = k.ok(loomAllReduce(&one, &sum, 1, loomFloat32, loomSum, comm, nullptr),
                "host all-reduce") &&
           (sum == n || k.fail("host all-reduce after device calls gave " + std::to_string(sum)));
  }
  cudaStreamDestroy(k.stream);
  if (!good) std::fprintf(stderr, "%s\n", k.failure.c_str());
  return good ? 0 : 1;
}

// Captures one all-reduce (sum of float) in a graph and replays it 100 times, with new inputs
// before each replay, checking every result.
int runGraph(RankContext& ctx) {
  Rank k{ctx, nullptr, {}};
  const size_t count = 262147;
  const int n = ctx.nranks;
  GPU_CHECK(cudaStreamCreateWithFlags(&k.stream, cudaStreamNonBlocking));
  const loomStream_t s = reinterpret_cast<loomStream_t>(k.stream);
  float *in = nullptr, *out = nullptr;
  GPU_CHECK(cudaMalloc(reinterpret_cast<void**>(&in), count * 4));
  GPU_CHECK(cudaMalloc(reinterpret_cast<void**>(&out), count * 4));
  std::vector<float> host(count), got(count);
  // Warm-up call: sets up cuda_ipc (or the staging buffers) outside the capture.
  if (loomAllReduce(in, out, count, loomFloat32, loomSum, ctx.comm, s) != loomSuccess) {
    std::fprintf(stderr, "rank %d: warm-up all-reduce: %s\n", ctx.rank, loomGetLastError(ctx.comm));
    return 1;
  }
  GPU_CHECK(cudaStreamSynchronize(k.stream));
  cudaGraph_t graph;
  GPU_CHECK(cudaStreamBeginCapture(k.stream, cudaStreamCaptureModeThreadLocal));
  const loomResult_t rc = loomAllReduce(in, out, count, loomFloat32, loomSum, ctx.comm, s);
  GPU_CHECK(cudaStreamEndCapture(k.stream, &graph));
  if (rc != loomSuccess) {
    std::fprintf(stderr, "rank %d: all-reduce under capture: %s\n", ctx.rank,
                 loomGetLastError(ctx.comm));
    return 1;
  }
  cudaGraphExec_t exec;
  GPU_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (int it = 0; it < 100; ++it) {
    for (size_t i = 0; i < count; ++i)
      host[i] = static_cast<float>((ctx.rank + 1) * (it % 13) + i % 7);
    GPU_CHECK(cudaMemcpyAsync(in, host.data(), count * 4, cudaMemcpyHostToDevice, k.stream));
    GPU_CHECK(cudaGraphLaunch(exec, k.stream));
    GPU_CHECK(cudaMemcpyAsync(got.data(), out, count * 4, cudaMemcpyDeviceToHost, k.stream));
    GPU_CHECK(cudaStreamSynchronize(k.stream));
    for (size_t i = 0; i < count; ++i) {
      const float want =
          static_cast<float>((n * (n + 1) / 2) * (it % 13) + n * static_cast<int>(i % 7));
      if (got[i] != want) {
        std::fprintf(stderr, "rank %d of %d: graph replay %d: element %zu of %zu is %g, want %g\n",
                     ctx.rank, n, it, i, count, got[i], want);
        return 1;
      }
    }
  }
  loomResult_t async = loomSuccess;
  loomCommGetAsyncError(ctx.comm, &async);
  if (async != loomSuccess) {
    std::fprintf(stderr, "rank %d: asynchronous error after replays: %s\n", ctx.rank,
                 loomGetErrorString(async));
    return 1;
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaFree(in);
  cudaFree(out);
  cudaStreamDestroy(k.stream);
  return 0;
}

LaunchOptions optionsFor(int nranks, bool ipc) {
  LaunchOptions o;
  o.nranks = nranks;
  // Within tests/gpu/run.sh's ctest step (240 s) and each test's TIMEOUT (120 s): a hung
  // collective fails this test, not the steps after it.
  o.timeoutMs = 20000;
  o.deadlineMs = 100000;
  if (!ipc) o.env.emplace_back("LOOM_CUDA_IPC_DISABLE", "1");
  o.beforeInit = [](RankContext&) { cudaSetDevice(0); };
  return o;
}

using Param = std::tuple<int, bool>;
class GpuCollectives : public ::testing::TestWithParam<Param> {
 protected:
  void SetUp() override { LOOM_SKIP_WITHOUT_GPU(); }
};

TEST_P(GpuCollectives, EveryCollectiveOnDeviceBuffers) {
  const int n = std::get<0>(GetParam());
  const bool ipc = std::get<1>(GetParam());
  LaunchResult r =
      launch(optionsFor(n, ipc), [&](RankContext& ctx) { return runAll(ctx, n <= 2); });
  EXPECT_TRUE(r.allPassed()) << r.report();
}

TEST_P(GpuCollectives, GraphOfAllReduceReplayed100Times) {
  const int n = std::get<0>(GetParam());
  const bool ipc = std::get<1>(GetParam());
  LaunchResult r = launch(optionsFor(n, ipc), runGraph);
  EXPECT_TRUE(r.allPassed()) << r.report();
}

INSTANTIATE_TEST_SUITE_P(Ranks, GpuCollectives,
                         ::testing::Combine(::testing::Values(1, 2, 4), ::testing::Bool()),
                         [](const ::testing::TestParamInfo<Param>& info) {
                           return std::to_string(std::get<0>(info.param)) + "ranks_" +
                                  (std::get<1>(info.param) ? "ipc" : "staged");
                         });

// Rank 1 never joins the all-reduce: rank 0's cuda_ipc kernel must give up at the timeout
// (LOOM_TIMEOUT_MS = 3 s), the stream must complete, and the communicator report loomTimeout.
TEST(GpuIpcFailure, KernelWaitTimesOutWhenAPeerNeverComes) {
  LOOM_SKIP_WITHOUT_GPU();
  LaunchOptions o = optionsFor(2, true);
  o.timeoutMs = 3000;
  LaunchResult r = launch(o, [](RankContext& ctx) -> int {
    float* buf = nullptr;
    GPU_CHECK(cudaMalloc(reinterpret_cast<void**>(&buf), 4096 * 4));
    cudaStream_t st;
    GPU_CHECK(cudaStreamCreate(&st));
    const loomStream_t s = reinterpret_cast<loomStream_t>(st);
    // Both ranks set up cuda_ipc with a first, complete all-reduce.
    if (loomAllReduce(buf, buf, 4096, loomFloat32, loomSum, ctx.comm, s) != loomSuccess) return 2;
    GPU_CHECK(cudaStreamSynchronize(st));
    if (ctx.rank == 1) {  // stays away until rank 0 is done, then leaves
      for (int i = 0; i < 600 && ctx.shared->flag.load() == 0; ++i) usleep(100000);
      return 0;
    }
    const double start = nowSeconds();
    if (loomAllReduce(buf, buf, 4096, loomFloat32, loomSum, ctx.comm, s) != loomSuccess) return 3;
    GPU_CHECK(cudaStreamSynchronize(st));
    const double waited = nowSeconds() - start;
    loomResult_t async = loomSuccess;
    loomCommGetAsyncError(ctx.comm, &async);
    std::fprintf(stderr, "rank 0: kernel returned after %.1f s, asynchronous error %s: %s\n",
                 waited, loomGetErrorString(async), loomGetLastError(ctx.comm));
    ctx.shared->flag.store(1);
    if (async != loomTimeout || waited < 2.5 || waited > 30) return 4;
    // The communicator refuses further device calls with that error.
    return loomAllReduce(buf, buf, 4096, loomFloat32, loomSum, ctx.comm, s) == loomTimeout ? 0 : 5;
  });
  EXPECT_TRUE(r.allPassed()) << r.report();
}

// A first device all-reduce on a capturing stream would set up cuda_ipc inside the capture: it
// is refused with loomInvalidUsage naming the stream, and a call after the capture still sets
// cuda_ipc up and gives the right sum.
TEST(GpuCapture, FirstDeviceAllReduceUnderCaptureIsRefused) {
  LOOM_SKIP_WITHOUT_GPU();
  LaunchResult r = launch(optionsFor(2, true), [](RankContext& ctx) -> int {
    const size_t count = 4099;
    float* buf = nullptr;
    GPU_CHECK(cudaMalloc(reinterpret_cast<void**>(&buf), count * 4));
    cudaStream_t st;
    GPU_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    const loomStream_t s = reinterpret_cast<loomStream_t>(st);
    GPU_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    const loomResult_t rc = loomAllReduce(buf, buf, count, loomFloat32, loomSum, ctx.comm, s);
    const std::string why = loomGetLastError(ctx.comm);
    cudaGraph_t graph = nullptr;
    (void)cudaStreamEndCapture(st, &graph);
    if (graph != nullptr) cudaGraphDestroy(graph);
    (void)cudaGetLastError();
    if (rc != loomInvalidUsage || why.find("stream") == std::string::npos ||
        why.find("captur") == std::string::npos) {
      std::fprintf(stderr, "rank %d: under capture: %s: %s\n", ctx.rank, loomGetErrorString(rc),
                   why.c_str());
      return 2;
    }
    std::vector<float> host(count, static_cast<float>(ctx.rank + 1)), got(count);
    GPU_CHECK(cudaMemcpy(buf, host.data(), count * 4, cudaMemcpyHostToDevice));
    GPU_CHECK(cudaDeviceSynchronize());
    if (loomAllReduce(buf, buf, count, loomFloat32, loomSum, ctx.comm, s) != loomSuccess) return 3;
    GPU_CHECK(cudaStreamSynchronize(st));
    GPU_CHECK(cudaMemcpy(got.data(), buf, count * 4, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < count; ++i)
      if (got[i] != 3.0f) {
        std::fprintf(stderr, "rank %d: element %zu is %g, want 3\n", ctx.rank, i, got[i]);
        return 4;
      }
    cudaStreamDestroy(st);
    cudaFree(buf);
    return 0;
  });
  EXPECT_TRUE(r.allPassed()) << r.report();
}

}  // namespace
}  // namespace loomtest
