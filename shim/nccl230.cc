// The entry points NCCL 2.30 added, where the header has them. What Loom's shim has no use for
// on host memory is answered for what it is: no device memory to suspend or count (suspend and
// resume succeed, every statistic is 0), and growing communicators, one-sided signals and
// NCCL's parameter store are refused with ncclInvalidUsage and a message that says so.
#include <stdint.h>

#include "shim/shim.h"

#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 30, 0)

using namespace loom::shim;

namespace {

// comm must be a live communicator (the message names comm otherwise).
ncclResult_t checkComm(const char* fn, ncclComm_t comm) {
  int n = 0;
  return shimGuard(fn, [&] { return fromLoom(loomCommCount(toLoom(comm), &n)); });
}

ncclResult_t unsupported(const char* fn, const char* what) {
  return fail(ncclInvalidUsage, fn, std::string("not supported by Loom's NCCL shim: ") + what);
}

constexpr char kGrow[] = "growing a communicator (make a new one with ncclCommInitRank)";
constexpr char kSignal[] = "one-sided signals (use ncclSend and ncclRecv)";
constexpr char kParams[] =
    "NCCL's parameter store (Loom reads LOOM_* variables; loom-env lists them)";

}  // namespace

extern "C" {

ncclResult_t pncclCommGetUniqueId(ncclComm_t, ncclUniqueId*) {
  return unsupported("ncclCommGetUniqueId", kGrow);
}

ncclResult_t pncclCommGrow(ncclComm_t, int, const ncclUniqueId*, int, ncclComm_t*, ncclConfig_t*) {
  return unsupported("ncclCommGrow", kGrow);
}

ncclResult_t pncclCommSuspend(ncclComm_t comm, int flags) {
  if ((flags & ~NCCL_SUSPEND_MEM) != 0)
    return fail(ncclInvalidArgument, "ncclCommSuspend",
                "flags: " + std::to_string(flags) + " has bits beyond NCCL_SUSPEND_MEM");
  return checkComm("ncclCommSuspend", comm);  // no device memory to release
}

ncclResult_t pncclCommResume(ncclComm_t comm) { return checkComm("ncclCommResume", comm); }

ncclResult_t pncclCommMemStats(ncclComm_t comm, ncclCommMemStat_t stat, uint64_t* value) {
  ncclResult_t r = checkComm("ncclCommMemStats", comm);
  if (r != ncclSuccess) return r;
  if (value == nullptr) return fail(ncclInvalidArgument, "ncclCommMemStats", "value: NULL");
  if (stat < ncclStatGpuMemSuspend || stat > ncclStatGpuMemTotal)
    return fail(ncclInvalidArgument, "ncclCommMemStats",
                "stat: " + std::to_string(static_cast<int>(stat)) + " is not a ncclCommMemStat_t");
  *value = 0;  // the shim allocates no GPU memory
  return ncclSuccess;
}

ncclResult_t pncclPutSignal(const void*, size_t, ncclDataType_t, int, ncclWindow_t, size_t, int,
                            int, unsigned int, ncclComm_t, cudaStream_t) {
  return unsupported("ncclPutSignal", kSignal);
}

ncclResult_t pncclSignal(int, int, int, unsigned int, ncclComm_t, cudaStream_t) {
  return unsupported("ncclSignal", kSignal);
}

ncclResult_t pncclWaitSignal(int, ncclWaitSignalDesc_t*, ncclComm_t, cudaStream_t) {
  return unsupported("ncclWaitSignal", kSignal);
}

ncclResult_t pncclParamBind(ncclParamHandle_t*, const char*) {
  return unsupported("ncclParamBind", kParams);
}
#define LOOM_SHIM_PARAM_GET(name, type) \
  ncclResult_t p##name(ncclParamHandle_t, type*) { return unsupported(#name, kParams); }
LOOM_SHIM_PARAM_GET(ncclParamGetI8, int8_t)
LOOM_SHIM_PARAM_GET(ncclParamGetI16, int16_t)
LOOM_SHIM_PARAM_GET(ncclParamGetI32, int32_t)
LOOM_SHIM_PARAM_GET(ncclParamGetI64, int64_t)
LOOM_SHIM_PARAM_GET(ncclParamGetU8, uint8_t)
LOOM_SHIM_PARAM_GET(ncclParamGetU16, uint16_t)
LOOM_SHIM_PARAM_GET(ncclParamGetU32, uint32_t)
LOOM_SHIM_PARAM_GET(ncclParamGetU64, uint64_t)
LOOM_SHIM_PARAM_GET(ncclParamGetStr, const char*)
#undef LOOM_SHIM_PARAM_GET

ncclResult_t pncclParamGet(ncclParamHandle_t, void*, int, int*) {
  return unsupported("ncclParamGet", kParams);
}

ncclResult_t pncclParamGetParameter(const char*, const char**, int*) {
  return unsupported("ncclParamGetParameter", kParams);
}

ncclResult_t pncclParamGetAllParameterKeys(const char***, int*) {
  return unsupported("ncclParamGetAllParameterKeys", kParams);
}

void pncclParamDumpAll(void) {}  // no NCCL parameters to dump

}  // extern "C"

LOOM_SHIM_ALIAS(ncclCommGetUniqueId)
LOOM_SHIM_ALIAS(ncclCommGrow)
LOOM_SHIM_ALIAS(ncclCommSuspend)
LOOM_SHIM_ALIAS(ncclCommResume)
LOOM_SHIM_ALIAS(ncclCommMemStats)
LOOM_SHIM_ALIAS(ncclPutSignal)
LOOM_SHIM_ALIAS(ncclSignal)
LOOM_SHIM_ALIAS(ncclWaitSignal)
LOOM_SHIM_ALIAS(ncclParamBind)
LOOM_SHIM_ALIAS(ncclParamGetI8)
LOOM_SHIM_ALIAS(ncclParamGetI16)
LOOM_SHIM_ALIAS(ncclParamGetI32)
LOOM_SHIM_ALIAS(ncclParamGetI64)
LOOM_SHIM_ALIAS(ncclParamGetU8)
LOOM_SHIM_ALIAS(ncclParamGetU16)
LOOM_SHIM_ALIAS(ncclParamGetU32)
LOOM_SHIM_ALIAS(ncclParamGetU64)
LOOM_SHIM_ALIAS(ncclParamGetStr)
LOOM_SHIM_ALIAS(ncclParamGet)
LOOM_SHIM_ALIAS(ncclParamGetParameter)
LOOM_SHIM_ALIAS(ncclParamGetAllParameterKeys)
LOOM_SHIM_ALIAS(ncclParamDumpAll)

#endif  // NCCL 2.30
