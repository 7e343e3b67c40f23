// Collectives on CUDA device buffers, in stream order (src/api/device.cc; built where nvcc is
// found, LOOM_HAVE_CUDA).
//
// A call whose buffers are device memory (cudaPointerGetAttributes: device or managed) is
// enqueued on the caller's stream and returns at once; nothing in the enqueue path waits for the
// device or for peers, so the calls can be captured in a CUDA graph. Two paths:
//   - cuda_ipc (transport/cuda_ipc): an all-reduce whose ranks all share this host runs as one
//     kernel reading the peers' GPU memory.
//   - staging (every other call, every collective, ranks on other hosts): cudaMemcpyAsync into
//     pinned host buffers kept per communicator, a host function (cudaLaunchHostFunc) that runs
//     the host collective on them, cudaMemcpyAsync back. A failure there becomes the
//     communicator's asynchronous error (loomCommGetAsyncError).
// Rules: calls of one communicator are issued on one stream at a time (as ordered calls); every
// rank passes the same kind of memory to a collective; a group's calls on one communicator use
// one stream. A host-buffer call waits until the communicator's staged calls have run.
//
// Without CUDA the functions below are stubs: no pointer is a device pointer.
#pragma once

#include <vector>

#include "api/api.h"

namespace loom::device {

#if defined(LOOM_HAVE_CUDA)
// The current CUDA device, or -1 when there is none (no driver, no GPU).
int currentDevice();
// Whether a buffer of the call is device (or managed) memory.
bool involvesDevice(const api::Call& c, int nranks);
// Enqueues calls of one communicator (at least one involving device memory) on their stream.
Status enqueue(Comm& comm, api::CallList calls);
// Waits (up to the communicator's timeout) until the staged calls enqueued so far have run.
Status drain(Comm& comm);
// The device side's asynchronous error (a cuda_ipc kernel timed out or was aborted); also
// recorded on the communicator.
Status asyncError(Comm& comm);
// Before the communicator is freed: with abort, makes waiting kernels return; then waits for
// the communicator's queued device work and frees its device resources.
void release(Comm& comm, bool abort);
// An abort's first step, before it waits for the calls in flight: makes the communicator's
// waiting device kernels return (release, with abort, does it again).
void abortTransfers(Comm& comm);
#else
inline int currentDevice() { return -1; }
inline bool involvesDevice(const api::Call&, int) { return false; }
inline Status enqueue(Comm&, api::CallList) {
  return LOOM_ERROR(loomInternalError, "device call in a build without CUDA");
}
inline Status drain(Comm&) { return Status::ok(); }
inline Status asyncError(Comm&) { return Status::ok(); }
inline void release(Comm&, bool) {}
inline void abortTransfers(Comm&) {}
#endif

}  // namespace loom::device
