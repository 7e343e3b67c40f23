// Micro-benchmarks of the reduction kernels at every instruction-set level this CPU supports,
// beside memcpy in the same run.
//
// Throughput counts the bytes a single pass reads and writes: memcpy and streamCopy (the
// streaming-store copy of the direct all-reduce, per level) 2 x size, reduce() 3 x
// size (two inputs, one output), reduceMany() with k sources (k + 1) x size, where size is
// the length of one buffer. reduceChain, the same sum as k - 1 reduce() calls (which move
// 3 x (k - 1) x size), counts (k + 1) x size too, so its rate compares with reduceMany's;
// reduceManyStream (the same sum streamed to two outputs) (k + 2) x size.
// Each size runs memcpy first, then streamCopy for each level, then reduce() sum for each type
// and level, then reduceMany(), reduceChain and reduceManyStream over fp32 for each source
// count and level:
//   loom-kernels-bench --benchmark_filter='fp16'   (one type)
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "algorithms/kernels/cpu/reduce.h"
#include "algorithms/kernels/cpu/reduce_isa.h"

namespace loom::kernels {
namespace {

constexpr size_t kSizes[] = {4 << 10, 256 << 10, 8 << 20};

struct TypeCase {
  loomDataType_t dtype;
  const char* name;
};

constexpr TypeCase kTypes[] = {
    {loomFloat32, "fp32"}, {loomFloat64, "fp64"},  {loomInt32, "int32"},
    {loomFloat16, "fp16"}, {loomBfloat16, "bf16"}, {loomFloat8e4m3, "fp8e4m3"},
};

constexpr size_t kManySources[] = {2, 4, 8};

struct FreeDeleter {
  void operator()(unsigned char* p) const { std::free(p); }
};
using Buffer = std::unique_ptr<unsigned char[], FreeDeleter>;

// size bytes of finite values of dtype in [-4, 4] (integers: any value), 64-byte aligned like
// Loom's shared-memory slots. A xorshift generator keeps setting up 8 MiB buffers quick.
Buffer MakeBuffer(loomDataType_t dtype, size_t size, uint64_t seed) {
  uint64_t state = 0x9e3779b97f4a7c15ull * (seed + 1);
  auto next = [&state] {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return state;
  };
  Buffer buf(static_cast<unsigned char*>(std::aligned_alloc(64, (size + 63) / 64 * 64)));
  const size_t es = typeSize(dtype);
  for (size_t i = 0; i + es <= size; i += es) {
    uint64_t raw = next();
    const float f = static_cast<float>(static_cast<int>(raw % 2001) - 1000) / 250.0f;
    switch (dtype) {
      case loomFloat32:
        std::memcpy(&raw, &f, sizeof(f));
        break;
      case loomFloat64: {
        const double d = f;
        std::memcpy(&raw, &d, sizeof(d));
        break;
      }
      case loomFloat16:
        raw = floatToHalf(f);
        break;
      case loomBfloat16:
        raw = floatToBf16(f);
        break;
      case loomFloat8e4m3:
        raw = floatToE4m3(f);
        break;
      default:
        break;
    }
    std::memcpy(buf.get() + i, &raw, es);
  }
  return buf;
}

void BM_Memcpy(benchmark::State& state, size_t size) {
  const Buffer src = MakeBuffer(loomInt32, size, 1), dst = MakeBuffer(loomInt32, size, 2);
  for (auto _ : state) {
    std::memcpy(dst.get(), src.get(), size);
    benchmark::DoNotOptimize(dst.get());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * 2 * size));
}

void BM_StreamCopy(benchmark::State& state, const internal::KernelSet* kernels, size_t size) {
  const Buffer src = MakeBuffer(loomInt32, size, 1), dst = MakeBuffer(loomInt32, size, 2);
  for (auto _ : state) {
    kernels->streamCopy(dst.get(), src.get(), size);
    streamFence();
    benchmark::DoNotOptimize(dst.get());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * 2 * size));
}

void BM_Reduce(benchmark::State& state, const internal::KernelSet* kernels, loomDataType_t dtype,
               size_t size) {
  const Reducer r = makeReducer(dtype, loomSum, 2);
  const size_t n = size / typeSize(dtype);
  const Buffer in = MakeBuffer(dtype, size, 1), local = MakeBuffer(dtype, size, 2);
  const Buffer dst = MakeBuffer(dtype, size, 3);
  for (auto _ : state) {
    kernels->reduce(r, dst.get(), in.get(), local.get(), n, 0);
    benchmark::DoNotOptimize(dst.get());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * 3 * size));
}

// How BM_ReduceMany combines its sources: one reduceMany(); k - 1 reduce() calls; one
// reduceManyStream() to two destinations (streaming stores to both).
enum class ManyForm { kMany, kChain, kStream };

void BM_ReduceMany(benchmark::State& state, const internal::KernelSet* kernels, size_t nsrc,
                   ManyForm form, size_t size) {
  const Reducer r = makeReducer(loomFloat32, loomSum, static_cast<int>(nsrc));
  const size_t n = size / sizeof(float);
  std::vector<Buffer> bufs;
  std::vector<const void*> srcs;
  for (size_t k = 0; k < nsrc; ++k) {
    bufs.push_back(MakeBuffer(loomFloat32, size, k + 1));
    srcs.push_back(bufs.back().get());
  }
  const Buffer dst = MakeBuffer(loomFloat32, size, 0);
  const Buffer copy = MakeBuffer(loomFloat32, size, 0);
  unsigned char* out = dst.get();
  for (auto _ : state) {
    if (form == ManyForm::kChain) {
      kernels->reduce(r, out, srcs[0], srcs[1], n, 0);
      for (size_t k = 2; k < nsrc; ++k) kernels->reduce(r, out, out, srcs[k], n, 0);
    } else if (form == ManyForm::kStream) {
      kernels->reduceManyStream(r, out, copy.get(), srcs.data(), nsrc, n, 0);
      streamFence();
    } else {
      kernels->reduceMany(r, out, srcs.data(), nsrc, n, 0);
    }
    benchmark::DoNotOptimize(out);
    benchmark::ClobberMemory();
  }
  const size_t outputs = form == ManyForm::kStream ? 2 : 1;
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * (nsrc + outputs) * size));
}

std::string SizeName(size_t size) {
  return size >= (1 << 20) ? std::to_string(size >> 20) + "MiB"
                           : std::to_string(size >> 10) + "KiB";
}

void RegisterAll() {
  std::vector<const internal::KernelSet*> levels;
  for (internal::Isa isa : {internal::Isa::kScalar, internal::Isa::kAvx2, internal::Isa::kAvx512}) {
    if (const internal::KernelSet* k = internal::kernelsFor(isa)) levels.push_back(k);
  }
  for (size_t size : kSizes) {
    const std::string suffix = "/" + SizeName(size);
    benchmark::RegisterBenchmark(("memcpy" + suffix).c_str(), BM_Memcpy, size);
    for (const internal::KernelSet* k : levels)
      benchmark::RegisterBenchmark((std::string("streamCopy/") + k->name + suffix).c_str(),
                                   BM_StreamCopy, k, size);
    for (const TypeCase& t : kTypes) {
      for (const internal::KernelSet* k : levels) {
        benchmark::RegisterBenchmark(
            (std::string("reduce/") + t.name + "/" + k->name + suffix).c_str(), BM_Reduce, k,
            t.dtype, size);
      }
    }
    for (size_t nsrc : kManySources) {
      for (ManyForm form : {ManyForm::kMany, ManyForm::kChain, ManyForm::kStream}) {
        const char* formName = form == ManyForm::kMany    ? "reduceMany"
                               : form == ManyForm::kChain ? "reduceChain"
                                                          : "reduceManyStream";
        for (const internal::KernelSet* k : levels) {
          const std::string name = formName + std::to_string(nsrc) + "/fp32/" + k->name + suffix;
          benchmark::RegisterBenchmark(name.c_str(), BM_ReduceMany, k, nsrc, form, size);
        }
      }
    }
  }
}

}  // namespace
}  // namespace loom::kernels

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::AddCustomContext("kernel_isa", loom::kernels::kernelIsa());
  loom::kernels::RegisterAll();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
