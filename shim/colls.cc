// NCCL's collectives, point-to-point calls and groups over Loom's C API.
#include <stdint.h>

#include <string>

#include "shim/shim.h"

using namespace loom::shim;

namespace {

loomDataType_t dt(ncclDataType_t t) { return static_cast<loomDataType_t>(t); }
loomRedOp_t op(ncclRedOp_t o) { return static_cast<loomRedOp_t>(o); }

// Refuses device memory in either buffer, and an operation NCCL does not have (Loom's bitwise
// ones), then runs the Loom call.
template <class F>
ncclResult_t forward(const char* fn, const void* sendbuff, const void* recvbuff, F&& call,
                     int64_t redOp = 0) {
  return shimGuard(fn, [&] {
    if (redOp >= loomBand && redOp <= loomBxor)
      return fail(ncclInvalidArgument, fn,
                  "op: " + std::to_string(redOp) + " is not an NCCL reduction operation");
    ncclResult_t r = checkHost(fn, "sendbuff", sendbuff);
    if (r == ncclSuccess) r = checkHost(fn, "recvbuff", recvbuff);
    return r != ncclSuccess ? r : fromLoom(call());
  });
}

}  // namespace

extern "C" {

ncclResult_t pncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                            ncclDataType_t datatype, ncclRedOp_t o, ncclComm_t comm,
                            cudaStream_t stream) {
  return forward(
      "ncclAllReduce", sendbuff, recvbuff,
      [&] {
        return loomAllReduce(sendbuff, recvbuff, count, dt(datatype), op(o), toLoom(comm), stream);
      },
      o);
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
  return forward(
      "ncclReduce", sendbuff, recvbuff,
      [&] {
        return loomReduce(sendbuff, recvbuff, count, dt(datatype), op(o), root, toLoom(comm),
                          stream);
      },
      o);
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
  return forward(
      "ncclReduceScatter", sendbuff, recvbuff,
      [&] {
        return loomReduceScatter(sendbuff, recvbuff, recvcount, dt(datatype), op(o), toLoom(comm),
                                 stream);
      },
      o);
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

ncclResult_t pncclGather(const void* sendbuff, void* recvbuff, size_t count,
                         ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream) {
  return forward("ncclGather", sendbuff, recvbuff, [&] {
    return loomGather(sendbuff, recvbuff, count, dt(datatype), root, toLoom(comm), stream);
  });
}

ncclResult_t pncclScatter(const void* sendbuff, void* recvbuff, size_t count,
                          ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream) {
  return forward("ncclScatter", sendbuff, recvbuff, [&] {
    return loomScatter(sendbuff, recvbuff, count, dt(datatype), root, toLoom(comm), stream);
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
