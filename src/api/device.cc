// Collectives on CUDA device buffers (device.h): pointer classification, the staged path through
// pinned host memory, and the dispatch to cuda_ipc.
#include "api/device.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "transport/cuda_ipc/cuda_check.h"
#include "transport/cuda_ipc/ipc.h"
#include "util/env.h"
#include "util/log.h"
#include "util/wait.h"

namespace loom::device {
namespace {

using api::Call;

int deviceCount() {
  static const int count = [] {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
      (void)cudaGetLastError();  // no driver or no GPU: not sticky, clear it
      n = 0;
    }
    return n;
  }();
  return count;
}

bool isDevicePointer(const void* p) {
  if (p == nullptr || deviceCount() == 0) return false;
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged;
}

// Bytes of a call's send and receive buffers on this rank, and whether each carries data in
// (send) or out (recv) here; a buffer without data is still staged (as scratch) when it is
// device memory.
struct Extent {
  size_t send = 0, recv = 0;
  bool sendIn = true, recvOut = true;
};

Extent extentOf(const Call& c, int n, int rank) {
  const size_t b = c.count * kernels::typeSize(c.dtype);
  const size_t all = b * static_cast<size_t>(n);
  Extent e;
  if (c.kind == Call::Send) return {b, 0, true, false};
  if (c.kind == Call::Recv) return {0, b, false, true};
  switch (c.coll) {
    case algo::Coll::AllReduce:
      e = {b, b};
      break;
    case algo::Coll::Broadcast:
      e = {b, b, rank == c.root, true};
      break;
    case algo::Coll::Reduce:
      e = {b, b, true, rank == c.root};
      break;
    case algo::Coll::AllGather:
      e = {b, all};
      break;
    case algo::Coll::ReduceScatter:
      e = {all, b};
      break;
    case algo::Coll::AllToAll:
      e = {all, all};
      break;
    case algo::Coll::SendRecv:  // sends and receives name their own buffers
      break;
  }
  return e;
}

// A staged call list, run by the host function. Kept until it has run, or, when captured in a
// graph, until the communicator is freed (every replay runs it again).
struct DeviceState;
struct StagedOp {
  Comm* comm;
  DeviceState* state;
  std::vector<Call> calls;  // pointing into the staging buffer
  bool captured;
};

struct DeviceState {
  std::mutex m;
  int device = -1;
  char* stage = nullptr;  // pinned host memory
  size_t stageBytes = 0;
  std::vector<char*> retired;       // earlier staging buffers: captured graphs may still use them
  std::atomic<int64_t> pending{0};  // staged host functions queued and not yet run
  std::vector<std::unique_ptr<StagedOp>> captured;
  bool ipcTried = false;
  std::unique_ptr<transport::cuda_ipc::IpcAllReduce> ipc;
};

std::mutex gStatesMutex;
std::unordered_map<const Comm*, std::unique_ptr<DeviceState>>& states() {
  static std::unordered_map<const Comm*, std::unique_ptr<DeviceState>> s;
  return s;
}

// How many states exist: host-only calls (none staged on any communicator) skip the lock.
std::atomic<size_t> gStateCount{0};

DeviceState* findState(const Comm& comm) {
  if (gStateCount.load(std::memory_order_acquire) == 0) return nullptr;
  std::lock_guard<std::mutex> lock(gStatesMutex);
  auto it = states().find(&comm);
  return it == states().end() ? nullptr : it->second.get();
}

DeviceState& stateOf(const Comm& comm) {
  std::lock_guard<std::mutex> lock(gStatesMutex);
  auto& slot = states()[&comm];
  if (!slot) {
    slot = std::make_unique<DeviceState>();
    gStateCount.fetch_add(1, std::memory_order_release);
    slot->device = comm.options().cudaDev >= 0 ? comm.options().cudaDev : currentDevice();
  }
  return *slot;
}

// Makes dev current for the scope (the communicator's device), restoring the caller's.
class DeviceGuard {
 public:
  explicit DeviceGuard(int dev) {
    int cur = -1;
    if (dev >= 0 && cudaGetDevice(&cur) == cudaSuccess && cur != dev &&
        cudaSetDevice(dev) == cudaSuccess)
      prev_ = cur;
    (void)cudaGetLastError();
  }
  ~DeviceGuard() {
    if (prev_ >= 0) (void)cudaSetDevice(prev_);
  }

 private:
  int prev_ = -1;
};

void CUDART_CB runStaged(void* data) {
  auto* op = static_cast<StagedOp*>(data);
  Status s;
  try {
    s = api::runOnComm(*op->comm, op->calls);
  } catch (const std::exception& e) {
    s = LOOM_ERROR(loomInternalError, std::string("staged device call: ") + e.what());
  } catch (...) {
    s = LOOM_ERROR(loomInternalError, "staged device call: unknown exception");
  }
  if (!s.isOk()) {
    LOOM_WARN(kExec, "staged device call failed: %s", s.message().c_str());
    op->comm->fail(s);
  }
  if (!op->captured) {
    op->state->pending.fetch_sub(1);
    delete op;
  }
}

Status ipcError(Comm& comm, DeviceState& st) {
  if (!st.ipc) return Status::ok();
  const int e = st.ipc->deviceError();
  if (e == transport::cuda_ipc::kDeviceOk) return Status::ok();
  Status s = e == transport::cuda_ipc::kDeviceTimeout
                 ? Status(loomTimeout, comm.describe() +
                                           ": cuda_ipc all-reduce kernel timed out waiting for a "
                                           "peer's flags (LOOM_TIMEOUT_MS)")
                 : Status(loomRemoteError, comm.describe() + ": cuda_ipc all-reduce aborted");
  comm.fail(s);
  return s;
}

// The communicator's bootstrap all-gather, for cuda_ipc's set-up and close.
transport::cuda_ipc::AllGather allGatherOf(Comm& comm) {
  return [&comm](const void* mine, void* all, size_t bytes) {
    return comm.bootstrap().allGather(mine, all, bytes);
  };
}

Status setupIpc(Comm& comm, DeviceState& st) {
  st.ipcTried = true;
  if (env::cudaIpcDisable() || comm.nranks() < 2 || comm.nranks() > transport::cuda_ipc::kMaxRanks)
    return Status::ok();
  for (int r = 0; r < comm.nranks(); ++r)
    if (comm.peer(r).host != comm.peer(comm.rank()).host) return Status::ok();
  LOOM_ASSIGN(st.ipc, transport::cuda_ipc::IpcAllReduce::create(
                          comm.rank(), comm.nranks(),
                          static_cast<size_t>(std::max<int64_t>(env::cudaIpcBytes(), 1 << 20)),
                          allGatherOf(comm)));
  if (!st.ipc) LOOM_INFO(kTransport, "cuda_ipc not available: all-reduce stages through the host");
  return Status::ok();
}

// Where a staged buffer goes: bytes of device memory at dev, at offset off of the stage.
struct Copy {
  const char* dev;
  size_t bytes;
  size_t off;
};

Status enqueueStaged(Comm& comm, DeviceState& st, api::CallList calls, cudaStream_t stream) {
  std::vector<Call> host(calls.begin(), calls.end());
  std::vector<Copy> in, out;
  std::vector<std::pair<const void**, size_t>> sendFix;
  std::vector<std::pair<void**, size_t>> recvFix;
  size_t total = 0;
  auto alloc = [&](size_t bytes) {
    const size_t off = total;
    total += (bytes + 255) / 256 * 256;
    return off;
  };
  for (Call& c : host) {
    c.stream = nullptr;
    c.staged = true;
    const Extent e = extentOf(c, comm.nranks(), comm.rank());
    const char* s = static_cast<const char*>(c.sendbuff);
    const char* r = static_cast<const char*>(c.recvbuff);
    const bool sd = e.send > 0 && isDevicePointer(s);
    const bool rd = e.recv > 0 && isDevicePointer(r);
    if (sd && rd && s < r + e.recv && r < s + e.send) {  // overlapping: one region for both
      const char* lo = std::min(s, r);
      const size_t off = alloc(static_cast<size_t>(std::max(s + e.send, r + e.recv) - lo));
      sendFix.emplace_back(&c.sendbuff, off + static_cast<size_t>(s - lo));
      recvFix.emplace_back(&c.recvbuff, off + static_cast<size_t>(r - lo));
      if (e.sendIn) in.push_back({s, e.send, off + static_cast<size_t>(s - lo)});
      if (e.recvOut) out.push_back({r, e.recv, off + static_cast<size_t>(r - lo)});
      continue;
    }
    // A send over ib from device memory registered for GPUDirect RDMA leaves from where it
    // is (its Send step posts it with postSendFrom); the host function runs in stream order, after
    // the kernels that wrote it, and returns once the NIC has read it.
    if (sd && c.kind == Call::Send && c.root != comm.rank()) {
      transport::Connection* link = comm.conn(c.root);
      if (link != nullptr && link->sendsFromDevice(s, e.send)) continue;
    }
    if (sd) {
      const size_t off = alloc(e.send);
      sendFix.emplace_back(&c.sendbuff, off);
      if (e.sendIn) in.push_back({s, e.send, off});
    }
    if (rd) {
      const size_t off = alloc(e.recv);
      recvFix.emplace_back(&c.recvbuff, off);
      if (e.recvOut) out.push_back({r, e.recv, off});
    }
  }
  if (total > st.stageBytes) {
    const size_t want = std::max({total, 2 * st.stageBytes, size_t{1} << 20});
    void* p = nullptr;
    const cudaError_t e = cudaMallocHost(&p, want);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      return LOOM_ERROR(loomUnhandledCudaError,
                        "cudaMallocHost of " + std::to_string(want) +
                            " bytes of staging memory failed: " + cudaGetErrorString(e) +
                            " (inside a graph capture: run the call once before capturing)");
    }
    if (st.stage != nullptr) st.retired.push_back(st.stage);
    st.stage = static_cast<char*>(p);
    st.stageBytes = want;
  }
  for (auto& f : sendFix) *f.first = st.stage + f.second;
  for (auto& f : recvFix) *f.first = st.stage + f.second;

  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  LOOM_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
  const bool captured = capture == cudaStreamCaptureStatusActive;

  for (const Copy& c : in)
    LOOM_CUDA_CHECK(cudaMemcpyAsync(st.stage + c.off, c.dev, c.bytes, cudaMemcpyDefault, stream));
  auto op = std::make_unique<StagedOp>(StagedOp{&comm, &st, std::move(host), captured});
  if (!captured) st.pending.fetch_add(1);
  const cudaError_t e = cudaLaunchHostFunc(stream, runStaged, op.get());
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    if (!captured) st.pending.fetch_sub(1);
    return cuda::cudaStatus(e, "cudaLaunchHostFunc");
  }
  if (captured)
    st.captured.push_back(std::move(op));
  else
    op.release();  // runStaged frees it
  for (const Copy& c : out)
    LOOM_CUDA_CHECK(cudaMemcpyAsync(const_cast<char*>(c.dev), st.stage + c.off, c.bytes,
                                    cudaMemcpyDefault, stream));
  return Status::ok();
}

}  // namespace

int currentDevice() {
  if (deviceCount() == 0) return -1;
  int dev = -1;
  if (cudaGetDevice(&dev) != cudaSuccess) {
    (void)cudaGetLastError();
    return -1;
  }
  return dev;
}

bool involvesDevice(const Call& c, int nranks) {
  if (deviceCount() == 0) return false;
  // Sizes do not matter here (rank 0 as a stand-in): only whether a buffer is used at all.
  const Extent e = extentOf(c, nranks, c.root >= 0 ? c.root : 0);
  return (e.send > 0 && isDevicePointer(c.sendbuff)) || (e.recv > 0 && isDevicePointer(c.recvbuff));
}

Status enqueue(Comm& comm, api::CallList calls) {
  if (calls.empty()) return Status::ok();
  DeviceState& st = stateOf(comm);
  std::lock_guard<std::mutex> lock(st.m);
  const auto stream = reinterpret_cast<cudaStream_t>(calls[0].stream);
  for (const Call& c : calls)
    if (c.stream != calls[0].stream)
      return LOOM_ERROR(loomInvalidUsage,
                        "stream: calls of one group on one communicator must use one stream");
  DeviceGuard guard(st.device);
  LOOM_CHECK(ipcError(comm, st));
  LOOM_CHECK(api::refuseIfFailed(comm));
  const Call& c = calls[0];
  // cuda_ipc's kernels have no bitwise operations: those calls are staged (reduced on the host).
  if (calls.size() == 1 && c.kind == Call::Collective && c.coll == algo::Coll::AllReduce &&
      comm.nranks() > 1 && !kernels::isBitwiseOp(c.op) && isDevicePointer(c.sendbuff) &&
      isDevicePointer(c.recvbuff)) {
    if (!st.ipcTried) {
      // Setting up allocates and opens peers' memory, which a graph capture forbids.
      cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
      LOOM_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
      if (capture != cudaStreamCaptureStatusNone)
        return LOOM_ERROR(loomInvalidUsage,
                          "stream: the first all-reduce on device buffers sets up cuda_ipc, "
                          "which cannot be captured in a graph: run one before capturing");
      LOOM_CHECK(setupIpc(comm, st));
    }
    if (st.ipc) {
      LOOM_ASSIGN(kernels::Reducer r, api::reducerFor(comm, c));
      return st.ipc->enqueue(r, c.sendbuff, c.recvbuff, c.count, comm.options().timeoutMs, stream);
    }
  }
  return enqueueStaged(comm, st, calls, stream);
}

Status drainState(Comm& comm, DeviceState* st) {
  if (st == nullptr) return Status::ok();
  const int64_t deadline = nowNs() + comm.options().timeoutMs * 1000000;
  while (st->pending.load() > 0) {
    if (nowNs() > deadline)
      return LOOM_ERROR(loomTimeout,
                        comm.describe() + ": " + std::to_string(st->pending.load()) +
                            " staged device calls did not run within the timeout (is their "
                            "stream blocked?)");
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  return Status::ok();
}

Status drain(Comm& comm) { return drainState(comm, findState(comm)); }

Status asyncError(Comm& comm) {
  DeviceState* st = findState(comm);
  if (st == nullptr) return Status::ok();
  return ipcError(comm, *st);
}

void abortTransfers(Comm& comm) {
  std::lock_guard<std::mutex> lock(gStatesMutex);
  auto it = states().find(&comm);
  if (it != states().end() && it->second->ipc) it->second->ipc->abort();
}

void release(Comm& comm, bool abort) {
  std::unique_ptr<DeviceState> st;
  {
    std::lock_guard<std::mutex> lock(gStatesMutex);
    auto it = states().find(&comm);
    if (it == states().end()) return;
    st = std::move(it->second);
    states().erase(it);
    gStateCount.fetch_sub(1, std::memory_order_release);
  }
  if (abort && st->ipc) st->ipc->abort();
  if (!drainState(comm, st.get()).isOk()) {
    // Host functions still queued would use the freed communicator: leak the state instead.
    LOOM_WARN(kExec, "%s: staged device calls still queued at destroy; keeping their buffers",
              comm.describe().c_str());
    (void)st.release();
    return;
  }
  DeviceGuard guard(st->device);
  if (st->ipc && abort) {
    st->ipc->abandonBuffer();  // peers' kernels may still read it
  } else if (st->ipc) {
    Status s = st->ipc->close(allGatherOf(comm));
    if (!s.isOk())
      LOOM_WARN(kTransport, "%s: cuda_ipc close: %s; its device buffer stays allocated",
                comm.describe().c_str(), s.message().c_str());
  }
  st->ipc.reset();                // waits for this rank's kernels
  (void)cudaDeviceSynchronize();  // copies out of the staging buffers
  if (st->stage != nullptr) (void)cudaFreeHost(st->stage);
  for (char* p : st->retired) (void)cudaFreeHost(p);
  (void)cudaGetLastError();
}

}  // namespace loom::device
