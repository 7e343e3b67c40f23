// loom-perf: Loom's collective benchmark, in the shape of nccl-tests (all_reduce_perf and the
// others: -C picks the collective). The sweep, table, checks and flags are bench/perf's, shared
// with the peers that compare.sh runs beside Loom.
//
// Without a launcher it starts -np ranks on this host: the parent picks a free loopback port and
// forks one child per rank; each child points LOOM_COMM_ID at that port before its first Loom
// call, and rank 0 hosts the rendezvous there. When a launcher started us (LOOM_RANK and
// LOOM_WORLD_SIZE, torchrun's RANK, mpirun's OMPI_COMM_WORLD_RANK or srun's SLURM_STEP_ID is set),
// the process runs as that one rank and loomCommInitFromEnv reads the rest (see loom.h).
//
// Buffers are host memory passed with a NULL stream, so every call is complete when it returns;
// -z is accepted for nccl-tests compatibility and changes nothing. With -G 1 (a CUDA build) they
// are device memory (cudaMalloc on the rank's current device) and the calls are queued on a
// stream of the rank's own; timing waits for the stream, checks copy the results back.
//
// Exit status: 0 on success, 1 when a Loom call failed or a result was wrong, 2 on bad usage.

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#if defined(LOOM_HAVE_CUDA)
#include <cuda_runtime_api.h>
#endif

#include "loom/loom.h"
#include "perf/perf.h"
#include "util/log.h"
#include "util/net.h"

namespace {

constexpr char kProg[] = "loom-perf";

loomComm_t g_comm = nullptr;
int g_rank = -1;

[[noreturn]] void Fail(const char* what, loomResult_t rc) {
  std::fprintf(stderr, "%s: rank %d: %s failed: %s: %s\n", kProg, g_rank, what,
               loomGetErrorString(rc), loomGetLastError(g_comm));
  std::fflush(nullptr);
  // Aborting lets the peers fail with loomRemoteError instead of waiting for a timeout.
  if (g_comm != nullptr) loomCommAbort(g_comm);
  _exit(1);
}

#define PERF_CHECK(call)                                \
  do {                                                  \
    loomResult_t perf_rc_ = (call);                     \
    if (perf_rc_ != loomSuccess) Fail(#call, perf_rc_); \
  } while (0)

class LoomBackend : public perf::Backend {
 public:
  LoomBackend(loomComm_t comm, int rank, int nranks) : comm_(comm), rank_(rank), nranks_(nranks) {}

  void Run(perf::Coll c, const void* send, void* recv, size_t count, const perf::TypeInfo& t,
           loomRedOp_t op, int root) override {
    const loomDataType_t ty = t.type;
    switch (c) {
      case perf::Coll::kAllReduce:
        PERF_CHECK(loomAllReduce(send, recv, count, ty, op, comm_, stream_));
        break;
      case perf::Coll::kAllGather:
        PERF_CHECK(loomAllGather(send, recv, count, ty, comm_, stream_));
        break;
      case perf::Coll::kReduceScatter:
        PERF_CHECK(loomReduceScatter(send, recv, count, ty, op, comm_, stream_));
        break;
      case perf::Coll::kBroadcast:
        PERF_CHECK(loomBroadcast(send, recv, count, ty, root, comm_, stream_));
        break;
      case perf::Coll::kReduce:
        PERF_CHECK(loomReduce(send, recv, count, ty, op, root, comm_, stream_));
        break;
      case perf::Coll::kAllToAll:
        PERF_CHECK(loomAllToAll(send, recv, count, ty, comm_, stream_));
        break;
      case perf::Coll::kGather:
        PERF_CHECK(loomGather(send, recv, count, ty, root, comm_, stream_));
        break;
      case perf::Coll::kScatter:
        PERF_CHECK(loomScatter(send, recv, count, ty, root, comm_, stream_));
        break;
      case perf::Coll::kSendRecv:
        PERF_CHECK(loomGroupStart());
        PERF_CHECK(loomSend(send, count, ty, (rank_ + 1) % nranks_, comm_, stream_));
        PERF_CHECK(loomRecv(recv, count, ty, (rank_ + nranks_ - 1) % nranks_, comm_, stream_));
        PERF_CHECK(loomGroupEnd());
        break;
    }
  }
  void GroupStart() override { PERF_CHECK(loomGroupStart()); }
  void GroupEnd() override { PERF_CHECK(loomGroupEnd()); }
  void Barrier() override { PERF_CHECK(loomBarrier(comm_, stream_)); }
  void* Alloc(size_t bytes) override {
    void* p = nullptr;
    PERF_CHECK(loomMemAlloc(&p, bytes > 0 ? bytes : 1));
    return p;
  }
  void Free(void* p) override { PERF_CHECK(loomMemFree(p)); }
#if defined(LOOM_HAVE_CUDA)
  void* DeviceAlloc(size_t bytes) override {
    if (stream_ == nullptr) {
      cudaStream_t s = nullptr;
      CudaCheck(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
      stream_ = reinterpret_cast<loomStream_t>(s);
    }
    void* p = nullptr;
    CudaCheck(cudaMalloc(&p, bytes > 0 ? bytes : 1), "cudaMalloc");
    return p;
  }
  void DeviceFree(void* p) override { CudaCheck(cudaFree(p), "cudaFree"); }
  void CopyToDevice(void* dst, const void* src, size_t bytes) override {
    CudaCheck(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy to the device");
    // From pageable memory the copy may still be in flight on return, and the collectives'
    // stream does not wait for the default stream.
    CudaCheck(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  }
  void CopyToHost(void* dst, const void* src, size_t bytes) override {
    CudaCheck(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy to the host");
  }
  void Sync() override {
    if (stream_ == nullptr) return;
    CudaCheck(cudaStreamSynchronize(reinterpret_cast<cudaStream_t>(stream_)),
              "cudaStreamSynchronize");
    loomResult_t async = loomSuccess;
    PERF_CHECK(loomCommGetAsyncError(comm_, &async));
    if (async != loomSuccess) Fail("a device call (asynchronous error)", async);
  }

 private:
  void CudaCheck(cudaError_t e, const char* what) {
    if (e == cudaSuccess) return;
    std::fprintf(stderr, "%s: rank %d: %s failed: %s\n", kProg, g_rank, what,
                 cudaGetErrorString(e));
    Fail(what, loomUnhandledCudaError);
  }
#else
 private:
#endif
  loomStream_t stream_ = nullptr;
  loomComm_t comm_;
  int rank_, nranks_;
};

// rank < 0: a launcher started this process, and its environment says which rank it is.
int RunRank(const perf::Options& o, int rank, int nranks) {
  g_rank = rank;
  if (rank < 0) {
    PERF_CHECK(loomCommInitFromEnv(&g_comm, nullptr));
    PERF_CHECK(loomCommUserRank(g_comm, &rank));
    PERF_CHECK(loomCommCount(g_comm, &nranks));
    g_rank = rank;
  } else {
    loomUniqueId id;
    PERF_CHECK(loomGetUniqueId(&id));
    PERF_CHECK(loomCommInitRank(&g_comm, nranks, id, rank));
  }
  int version = 0;
  loomGetVersion(&version);
  LoomBackend backend(g_comm, rank, nranks);
  const std::string title = "Loom " + std::to_string(version / 10000) + "." +
                            std::to_string(version / 100 % 100) + "." +
                            std::to_string(version % 100);
  const int rc = perf::RunSweep(backend, o, rank, nranks, title);
  PERF_CHECK(loomCommFinalize(g_comm));
  PERF_CHECK(loomCommDestroy(g_comm));
  g_comm = nullptr;
  return rc;
}

// Whether a launcher started this process: one of the variables loomCommInitFromEnv starts from.
bool UnderLauncher() {
  for (const char* name : {"LOOM_RANK", "LOOM_WORLD_SIZE", "RANK", "WORLD_SIZE",
                           "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "SLURM_STEP_ID"}) {
    const char* v = std::getenv(name);
    if (v != nullptr && *v != '\0') return true;
  }
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  loom::log::failExitWhenStdoutIsLost(kProg);
  perf::FlagSet flags;
  flags.prog = kProg;
  flags.launches = true;
  const perf::Options o = perf::ParseFlags(argc, argv, flags);
  // Fail on an unwritable -J path now rather than after the run.
  if (!o.json_path.empty()) {
    FILE* f = std::fopen(o.json_path.c_str(), "a");
    if (f == nullptr) {
      std::fprintf(stderr, "%s: cannot write %s: %s\n", kProg, o.json_path.c_str(),
                   std::strerror(errno));
      return 2;
    }
    std::fclose(f);
  }
  if (UnderLauncher()) return RunRank(o, -1, 0);
  const int port = loom::net::freeLoopbackPort();
  if (port < 0) {
    std::fprintf(stderr, "%s: cannot find a free loopback port: %s\n", kProg, std::strerror(errno));
    return 1;
  }
  const std::string comm_id = "127.0.0.1:" + std::to_string(port);
  return perf::Launch(kProg, o.nranks, o.timeout_s, [&](int rank) {
    // Loom reads its environment once, at its first call: set it before any.
    setenv("LOOM_COMM_ID", comm_id.c_str(), 1);
    setenv("LOOM_SOCKET_IFNAME", "lo", 0);
    return RunRank(o, rank, o.nranks);
  });
}
