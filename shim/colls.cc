// NCCL's collectives, point-to-point calls and groups over Loom's C API.
// Gather and scatter, which Loom has no call for, are grouped sends and
// receives (a rank's part to or from itself is a send to itself, which Loom
// matches with its receive from itself).
#include <stdint.h>

#include <string>

#include "shim/shim.h"

using namespace loom::shim;

namespace {

loomDataType_t dt(ncclDataType_t t) { return static_cast<loomDataType_t>(t); }
loomRedOp_t op(ncclRedOp_t o) { return static_cast<loomRedOp_t>(o); }

// Refuses device memory in either buffer, then runs the Loom call.
template <class F>
ncclResult_t forward(const char* fn, const void* sendbuff, const void* recvbuff, F&& call) {
  return shimGuard(fn, [&] {
    ncclResult_t r = checkHost(fn, "sendbuff", sendbuff);
    if (r == ncclSuccess) r = checkHost(fn, "recvbuff", recvbuff);
    return r != ncclSuccess ? r : fromLoom(call());
  });
}

size_t typeSize(ncclDataType_t t) {
  switch (t) {
    case ncclInt8: case ncclUint8: case ncclFloat8e4m3: case ncclFloat8e5m2: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    default: return 8;
  }
}

// Checks shared by gather and scatter before any send is queued, so a bad
// argument never leaves half a group behind. Fills n and rank.
ncclResult_t checkRooted(const char* fn, ncclComm_t comm, ncclDataType_t datatype, int root,
                         size_t count, int* n, int* rank) {
  ncclResult_t r = fromLoom(loomCommCount(toLoom(comm), n));
  if (r == ncclSuccess) r = fromLoom(loomCommUserRank(toLoom(comm), rank));
  if (r != ncclSuccess) return r;
  if (static_cast<int>(datatype) < 0 || static_cast<int>(datatype) >= ncclNumTypes)
    return fail(ncclInvalidArgument, fn,
                "datatype: unknown data type " + std::to_string(static_cast<int>(datatype)));
  if (root < 0 || root >= *n)
    return fail(ncclInvalidArgument, fn, "root: " + std::to_string(root) + " is outside [0, " +
                                             std::to_string(*n) + ")");
  if (count > SIZE_MAX / static_cast<size_t>(*n) / typeSize(datatype))
    return fail(ncclInvalidArgument, fn, "count: " + std::to_string(count) +
                                             " elements overflow size_t across the ranks");
  return ncclSuccess;
}

// Runs sends/receives queued by queue() as one group; the group is always
// closed, and the first failure is the result.
template <class F>
ncclResult_t grouped(F&& queue) {
  loomResult_t r = loomGroupStart();
  if (r != loomSuccess) return fromLoom(r);
  loomResult_t q = queue();
  loomResult_t e = loomGroupEnd();
  return fromLoom(q != loomSuccess ? q : e);
}

}  // namespace

extern "C" {

ncclResult_t pncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                            ncclDataType_t datatype, ncclRedOp_t o, ncclComm_t comm,
                            cudaStream_t stream) {
  return forward("ncclAllReduce", sendbuff, recvbuff, [&] {
    return loomAllReduce(sendbuff, recvbuff, count, dt(datatype), op(o), toLoom(comm), stream);
  });
}

ncclResult_t pncclBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                            ncclDataType_t datatype, int root, ncclComm_t comm,
                            cudaStream_t stream) {
  return forward("ncclBroadcast", sendbuff, recvbuff, [&] {
    return loomBroadcast(sendbuff, recvbuff, count, dt(datatype), root, toLoom(comm), stream);
  });
}

ncclResult_t pncclBcast(void* buff, size_t count, ncclDataType_t datatype, int root,
                        ncclComm_t comm, cudaStream_t stream) {
  return forward("ncclBcast", buff, nullptr, [&] {
    return loomBroadcast(buff, buff, count, dt(datatype), root, toLoom(comm), stream);
  });
}

ncclResult_t pncclReduce(const void* sendbuff, void* recvbuff, size_t count,
                         ncclDataType_t datatype, ncclRedOp_t o, int root, ncclComm_t comm,
                         cudaStream_t stream) {
  return forward("ncclReduce", sendbuff, recvbuff, [&] {
    return loomReduce(sendbuff, recvbuff, count, dt(datatype), op(o), root, toLoom(comm), stream);
  });
}

ncclResult_t pncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                            ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  return forward("ncclAllGather", sendbuff, recvbuff, [&] {
    return loomAllGather(sendbuff, recvbuff, sendcount, dt(datatype), toLoom(comm), stream);
  });
}

ncclResult_t pncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                                ncclDataType_t datatype, ncclRedOp_t o, ncclComm_t comm,
                                cudaStream_t stream) {
  return forward("ncclReduceScatter", sendbuff, recvbuff, [&] {
    return loomReduceScatter(sendbuff, recvbuff, recvcount, dt(datatype), op(o), toLoom(comm),
                             stream);
  });
}

ncclResult_t pncclAlltoAll(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  return forward("ncclAlltoAll", sendbuff, recvbuff, [&] {
    return loomAllToAll(sendbuff, recvbuff, count, dt(datatype), toLoom(comm), stream);
  });
}

ncclResult_t pncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                       ncclComm_t comm, cudaStream_t stream) {
  return forward("ncclSend", sendbuff, nullptr, [&] {
    return loomSend(sendbuff, count, dt(datatype), peer, toLoom(comm), stream);
  });
}

ncclResult_t pncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
                       ncclComm_t comm, cudaStream_t stream) {
  return forward("ncclRecv", nullptr, recvbuff, [&] {
    return loomRecv(recvbuff, count, dt(datatype), peer, toLoom(comm), stream);
  });
}

// Every rank sends count elements to root; root receives rank i's into
// recvbuff + i * count.
ncclResult_t pncclGather(const void* sendbuff, void* recvbuff, size_t count,
                         ncclDataType_t datatype, int root, ncclComm_t comm,
                         cudaStream_t stream) {
  static const char* fn = "ncclGather";
  return shimGuard(fn, [&]() -> ncclResult_t {
    int n = 0, rank = 0;
    ncclResult_t r = checkRooted(fn, comm, datatype, root, count, &n, &rank);
    if (r == ncclSuccess) r = checkHost(fn, "sendbuff", sendbuff);
    if (r == ncclSuccess && rank == root) r = checkHost(fn, "recvbuff", recvbuff);
    if (r != ncclSuccess) return r;
    if (rank == root && recvbuff == nullptr && count > 0)
      return fail(ncclInvalidArgument, fn, "recvbuff: NULL on the root");
    const size_t bytes = count * typeSize(datatype);
    return grouped([&] {
      loomResult_t q = loomSend(sendbuff, count, dt(datatype), root, toLoom(comm), stream);
      for (int i = 0; rank == root && i < n && q == loomSuccess; ++i)
        q = loomRecv(static_cast<char*>(recvbuff) + static_cast<size_t>(i) * bytes, count,
                     dt(datatype), i, toLoom(comm), stream);
      return q;
    });
  });
}

// Root sends sendbuff + i * count to rank i; every rank receives count elements.
ncclResult_t pncclScatter(const void* sendbuff, void* recvbuff, size_t count,
                          ncclDataType_t datatype, int root, ncclComm_t comm,
                          cudaStream_t stream) {
  static const char* fn = "ncclScatter";
  return shimGuard(fn, [&]() -> ncclResult_t {
    int n = 0, rank = 0;
    ncclResult_t r = checkRooted(fn, comm, datatype, root, count, &n, &rank);
    if (r == ncclSuccess && rank == root) r = checkHost(fn, "sendbuff", sendbuff);
    if (r == ncclSuccess) r = checkHost(fn, "recvbuff", recvbuff);
    if (r != ncclSuccess) return r;
    if (rank == root && sendbuff == nullptr && count > 0)
      return fail(ncclInvalidArgument, fn, "sendbuff: NULL on the root");
    const size_t bytes = count * typeSize(datatype);
    return grouped([&] {
      loomResult_t q = loomSuccess;
      for (int i = 0; rank == root && i < n && q == loomSuccess; ++i)
        q = loomSend(static_cast<const char*>(sendbuff) + static_cast<size_t>(i) * bytes, count,
                     dt(datatype), i, toLoom(comm), stream);
      if (q == loomSuccess)
        q = loomRecv(recvbuff, count, dt(datatype), root, toLoom(comm), stream);
      return q;
    });
  });
}

ncclResult_t pncclGroupStart() {
  return shimGuard("ncclGroupStart", [] { return fromLoom(loomGroupStart()); });
}

ncclResult_t pncclGroupEnd() {
  return shimGuard("ncclGroupEnd", [] { return fromLoom(loomGroupEnd()); });
}

// Loom has no dry run of a group; the group stays open, so the caller can
// still end it with ncclGroupEnd.
ncclResult_t pncclGroupSimulateEnd(ncclSimInfo_t* simInfo) {
  return fail(ncclInvalidUsage, "ncclGroupSimulateEnd",
              "not supported by Loom's NCCL shim; the group is still open (end it with "
              "ncclGroupEnd)");
}

}  // extern "C"

LOOM_SHIM_ALIAS(ncclAllReduce)
LOOM_SHIM_ALIAS(ncclBroadcast)
LOOM_SHIM_ALIAS(ncclBcast)
LOOM_SHIM_ALIAS(ncclReduce)
LOOM_SHIM_ALIAS(ncclAllGather)
LOOM_SHIM_ALIAS(ncclReduceScatter)
LOOM_SHIM_ALIAS(ncclAlltoAll)
LOOM_SHIM_ALIAS(ncclSend)
LOOM_SHIM_ALIAS(ncclRecv)
LOOM_SHIM_ALIAS(ncclGather)
LOOM_SHIM_ALIAS(ncclScatter)
LOOM_SHIM_ALIAS(ncclGroupStart)
LOOM_SHIM_ALIAS(ncclGroupEnd)
LOOM_SHIM_ALIAS(ncclGroupSimulateEnd)
