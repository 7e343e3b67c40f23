// cuda_ipc set-up and launch (ipc.h).
#include "transport/cuda_ipc/ipc.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "transport/cuda_ipc/cuda_check.h"
#include "util/log.h"

namespace loom::transport::cuda_ipc {
namespace {

// The one-shot kernel up to this many bytes (and always with two ranks, where both move the
// same bytes between GPUs and one-shot moves fewer within one).
constexpr size_t kOneShotMaxBytes = 512 * 1024;

// What each rank tells the others at set-up.
struct RankInfo {
  int32_t ok = 0;
  int32_t sms = 0;
  char uuid[16] = {};
  cudaIpcMemHandle_t handle{};
};

}  // namespace

Result<std::unique_ptr<IpcAllReduce>> IpcAllReduce::create(int rank, int nranks, size_t bufferBytes,
                                                           const AllGather& allGather) {
  std::unique_ptr<IpcAllReduce> x(new IpcAllReduce());
  x->rank_ = rank;
  x->nranks_ = nranks;
  x->halfBytes_ = std::max<size_t>(bufferBytes / 2, 64 * 1024) / 4096 * 4096;
  RankInfo mine;
  // Local part: a failure here is this rank's "no", told to the others, not an error.
  auto local = [&]() -> Status {
    if (nranks < 2 || nranks > kMaxRanks)
      return LOOM_ERROR(loomInvalidUsage, "cuda_ipc serves 2.." + std::to_string(kMaxRanks) +
                                              " ranks, not " + std::to_string(nranks));
    int dev = 0;
    LOOM_CUDA_CHECK(cudaGetDevice(&dev));
    cudaDeviceProp prop{};
    LOOM_CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
    mine.sms = prop.multiProcessorCount;
    std::memcpy(mine.uuid, &prop.uuid, sizeof(mine.uuid));
    void* p = nullptr;
    LOOM_CUDA_CHECK(cudaMalloc(&p, kFlagBytes + 2 * x->halfBytes_));
    x->own_ = static_cast<char*>(p);
    LOOM_CUDA_CHECK(cudaMemset(x->own_, 0, kFlagBytes));
    LOOM_CUDA_CHECK(cudaDeviceSynchronize());
    LOOM_CUDA_CHECK(cudaIpcGetMemHandle(&mine.handle, x->own_));
    void* words = nullptr;
    LOOM_CUDA_CHECK(cudaHostAlloc(&words, 2 * sizeof(int), cudaHostAllocMapped));
    x->hostWords_ = static_cast<int*>(words);
    x->hostWords_[0] = x->hostWords_[1] = 0;
    void* dwords = nullptr;
    LOOM_CUDA_CHECK(cudaHostGetDevicePointer(&dwords, words, 0));
    x->devWords_ = static_cast<int*>(dwords);
    return Status::ok();
  };
  Status s = local();
  mine.ok = s.isOk() ? 1 : 0;
  if (!s.isOk())
    LOOM_INFO(kTransport, "cuda_ipc unavailable on this rank: %s", s.message().c_str());
  std::vector<RankInfo> all(static_cast<size_t>(nranks));
  LOOM_CHECK(allGather(&mine, all.data(), sizeof(RankInfo)));
  for (const RankInfo& info : all)
    if (info.ok == 0) return std::unique_ptr<IpcAllReduce>();

  // Grid: one block per multiprocessor, shared among the ranks on each GPU, the same everywhere.
  int grid = kMaxBlocks;
  for (const RankInfo& a : all) {
    int sharing = 0;
    for (const RankInfo& b : all) sharing += std::memcmp(a.uuid, b.uuid, sizeof(a.uuid)) == 0;
    grid = std::min(grid, std::max(1, a.sms / std::max(1, sharing)));
  }
  x->grid_ = grid;

  // Open every peer's buffer.
  x->bases_.assign(static_cast<size_t>(nranks), nullptr);
  x->bases_[static_cast<size_t>(rank)] = x->own_;
  int opened = 1;
  for (int r = 0; r < nranks && opened; ++r) {
    if (r == rank) continue;
    void* p = nullptr;
    const cudaError_t e = cudaIpcOpenMemHandle(&p, all[static_cast<size_t>(r)].handle,
                                               cudaIpcMemLazyEnablePeerAccess);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      LOOM_INFO(kTransport, "cuda_ipc: cannot open rank %d's buffer: %s", r, cudaGetErrorString(e));
      opened = 0;
      break;
    }
    x->bases_[static_cast<size_t>(r)] = static_cast<char*>(p);
  }
  std::vector<int> allOpened(static_cast<size_t>(nranks));
  LOOM_CHECK(allGather(&opened, allOpened.data(), sizeof(int)));
  for (int o : allOpened)
    if (o == 0) return std::unique_ptr<IpcAllReduce>();
  LOOM_INFO(kTransport, "cuda_ipc: %d ranks, grid %d, 2 x %zu bytes per rank", nranks, grid,
            x->halfBytes_);
  return x;
}

void IpcAllReduce::closePeers() {
  for (size_t r = 0; r < bases_.size(); ++r)
    if (bases_[r] != nullptr && static_cast<int>(r) != rank_) {
      (void)cudaIpcCloseMemHandle(bases_[r]);
      bases_[r] = nullptr;
    }
}

Status IpcAllReduce::close(const AllGather& allGather) {
  if (own_ == nullptr) return Status::ok();
  (void)cudaDeviceSynchronize();
  closePeers();
  (void)cudaGetLastError();
  const int closed = 1;
  std::vector<int> all(static_cast<size_t>(nranks_));
  Status s = allGather(&closed, all.data(), sizeof(int));
  if (!s.isOk()) own_ = nullptr;  // a peer may still have it open: leave it allocated
  return s;
}

IpcAllReduce::~IpcAllReduce() {
  // Kernels of this rank still running read and write these buffers: let them finish first.
  if (own_ != nullptr || hostWords_ != nullptr) (void)cudaDeviceSynchronize();
  closePeers();
  if (own_ != nullptr) (void)cudaFree(own_);
  if (hostWords_ != nullptr) (void)cudaFreeHost(hostWords_);
  (void)cudaGetLastError();
}

bool IpcAllReduce::twoShot(size_t bytes) const { return nranks_ > 2 && bytes > kOneShotMaxBytes; }

Status IpcAllReduce::enqueue(const kernels::Reducer& r, const void* in, void* out, size_t count,
                             int64_t timeoutMs, cudaStream_t stream) {
  AllReduceArgs a;
  a.in = in;
  a.out = out;
  a.count = count;
  a.rank = rank_;
  a.nranks = nranks_;
  for (int i = 0; i < nranks_; ++i) a.bases[i] = bases_[static_cast<size_t>(i)];
  a.halfBytes = halfBytes_;
  a.grid = grid_;
  a.twoShot = twoShot(count * kernels::typeSize(r.dtype));
  a.timeoutNs = static_cast<uint64_t>(std::max<int64_t>(timeoutMs, 1)) * 1000000ull;
  a.abortFlag = devWords_;
  a.errorWord = devWords_ + 1;
  return cuda::cudaStatus(launchAllReduce(r, a, stream), "cuda_ipc all-reduce kernel launch");
}

void IpcAllReduce::abort() {
  if (hostWords_ != nullptr) static_cast<volatile int*>(hostWords_)[0] = 1;
}

int IpcAllReduce::deviceError() const {
  return hostWords_ != nullptr ? static_cast<volatile int*>(hostWords_)[1] : kDeviceOk;
}

}  // namespace loom::transport::cuda_ipc
