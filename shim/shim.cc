// NCCL's set-up, communicator and error entry points over Loom's C API, and
// the proof (static_asserts against NCCL's own header) that both APIs give
// every enum value and handle the same meaning.
#include "shim/shim.h"

#include <dlfcn.h>
#include <stdlib.h>

#include <cctype>
#include <cstddef>
#include <cstring>
#include <map>
#include <mutex>
#include <new>
#include <type_traits>
#include <vector>

namespace {

// ---- Same types, same values -------------------------------------------------
#define SAME(nccl, loom) \
  static_assert(static_cast<long long>(nccl) == static_cast<long long>(loom), #nccl " != " #loom)
static_assert(std::is_same<cudaStream_t, loomStream_t>::value,
              "cudaStream_t must be loomStream_t: streams pass through unchanged");
static_assert(NCCL_UNIQUE_ID_BYTES == LOOM_UNIQUE_ID_BYTES, "unique id size");
static_assert(sizeof(ncclUniqueId) == sizeof(loomUniqueId), "unique id layout");
static_assert(sizeof(ncclComm_t) == sizeof(loomComm_t), "communicator handle");

SAME(ncclSuccess, loomSuccess);
SAME(ncclUnhandledCudaError, loomUnhandledCudaError);
SAME(ncclSystemError, loomSystemError);
SAME(ncclInternalError, loomInternalError);
SAME(ncclInvalidArgument, loomInvalidArgument);
SAME(ncclInvalidUsage, loomInvalidUsage);
SAME(ncclRemoteError, loomRemoteError);
SAME(ncclInProgress, loomInProgress);
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 30, 0)
SAME(ncclTimeout, loomTimeout);  // NCCL 2.30 has Loom's timeout result too
constexpr ncclResult_t kTimeoutResult = ncclTimeout;
#else
// Loom has one result more than NCCL before 2.30 (loomTimeout); fromLoom() maps it.
SAME(ncclNumResults, loomTimeout);
constexpr ncclResult_t kTimeoutResult = ncclRemoteError;
#endif

static_assert(sizeof(ncclDataType_t) == sizeof(loomDataType_t), "datatype size");
SAME(ncclInt8, loomInt8);
SAME(ncclChar, loomChar);
SAME(ncclUint8, loomUint8);
SAME(ncclInt32, loomInt32);
SAME(ncclInt, loomInt);
SAME(ncclUint32, loomUint32);
SAME(ncclInt64, loomInt64);
SAME(ncclUint64, loomUint64);
SAME(ncclFloat16, loomFloat16);
SAME(ncclHalf, loomHalf);
SAME(ncclFloat32, loomFloat32);
SAME(ncclFloat, loomFloat);
SAME(ncclFloat64, loomFloat64);
SAME(ncclDouble, loomDouble);
SAME(ncclBfloat16, loomBfloat16);
SAME(ncclFloat8e4m3, loomFloat8e4m3);
SAME(ncclFloat8e5m2, loomFloat8e5m2);
SAME(ncclNumTypes, loomNumTypes);

static_assert(sizeof(ncclRedOp_t) == sizeof(loomRedOp_t), "reduction op size");
SAME(ncclSum, loomSum);
SAME(ncclProd, loomProd);
SAME(ncclMax, loomMax);
SAME(ncclMin, loomMin);
SAME(ncclAvg, loomAvg);
SAME(ncclNumOps, loomNumOps);
SAME(ncclMaxRedOp, loomMaxRedOp);

SAME(ncclScalarDevice, loomScalarDevice);
SAME(ncclScalarHostImmediate, loomScalarHostImmediate);

SAME(NCCL_SPLIT_NOCOLOR, LOOM_SPLIT_NOCOLOR);
SAME(NCCL_CONFIG_UNDEF_INT, LOOM_CONFIG_UNDEF_INT);
#undef SAME

thread_local std::string tLastError;

constexpr unsigned kNcclConfigMagic = 0xcafebeef;  // what NCCL_CONFIG_INITIALIZER writes

// True when config's struct, as the caller compiled it, reaches past field.
bool hasField(const ncclConfig_t* config, size_t offset, size_t size) {
  return config->size >= offset + size;
}

// NCCL's variables where Loom's are unset (NCCL_SOCKET_IFNAME for LOOM_SOCKET_IFNAME, ...),
// read when Loom first needs each, so that a program's setenv before its first call counts;
// nothing is written into the environment that child processes inherit.
__attribute__((constructor)) void mirrorNcclEnvironment() { loomUseNcclEnvironment(); }

}  // namespace

namespace loom::shim {

thread_local const char* tEntryPoint = nullptr;

ncclResult_t fromLoom(loomResult_t r) {
  if (r == loomSuccess) return ncclSuccess;
  // Not a failure: the last error (an earlier call's) is not this call's.
  if (r == loomInProgress) return ncclInProgress;
  const std::string text = loomGetLastError(nullptr);
  std::string msg;
  size_t i = 0;
  const size_t colon = text.find(':');
  if (tEntryPoint != nullptr && text.compare(0, 4, "loom") == 0 && colon != std::string::npos &&
      text.find(' ') > colon) {  // "loomCommInitRankConfig: ..." from ncclCommInitRank
    msg = tEntryPoint;
    i = colon;
  }
  while (i < text.size()) {  // loomX -> ncclX; LOOM_SHRINK_X -> NCCL_SHRINK_X
    const bool wordStart =
        i == 0 || !(std::isalnum(static_cast<unsigned char>(text[i - 1])) || text[i - 1] == '_');
    if (wordStart && text.compare(i, 4, "loom") == 0 && i + 4 < text.size() &&
        std::isupper(static_cast<unsigned char>(text[i + 4]))) {
      msg += "nccl";
      i += 4;
    } else if (wordStart && text.compare(i, 12, "LOOM_SHRINK_") == 0) {
      msg += "NCCL_SHRINK_";
      i += 12;
    } else {
      msg += text[i++];
    }
  }
  tLastError = msg;
  if (r == loomTimeout) return kTimeoutResult;
  int v = static_cast<int>(r);
  return v > 0 && v < ncclNumResults ? static_cast<ncclResult_t>(v) : ncclInternalError;
}

ncclResult_t fail(ncclResult_t code, const char* fn, const std::string& message) {
  tLastError = std::string(fn) + ": " + message;
  return code;
}

ncclResult_t checkHost(const char* fn, const char* arg, const void* p) {
  // The driver is looked for only among libraries already loaded: a process
  // that never loaded it cannot hold device memory, and the shim must not be
  // the one to start CUDA.
  using GetAttr = int (*)(void*, int, unsigned long long);
  static GetAttr getAttr = [] {
    void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    return h != nullptr ? reinterpret_cast<GetAttr>(dlsym(h, "cuPointerGetAttribute")) : nullptr;
  }();
  if (p == nullptr || getAttr == nullptr) return ncclSuccess;
  constexpr int kMemoryTypeAttr = 2;     // CU_POINTER_ATTRIBUTE_MEMORY_TYPE
  constexpr int kIsManagedAttr = 8;      // CU_POINTER_ATTRIBUTE_IS_MANAGED
  constexpr unsigned kDeviceMemory = 2;  // CU_MEMORYTYPE_DEVICE
  unsigned type = 0;
  int managed = 0;
  const auto addr = reinterpret_cast<unsigned long long>(p);
  if (getAttr(&type, kMemoryTypeAttr, addr) != 0 || type != kDeviceMemory) return ncclSuccess;
  if (getAttr(&managed, kIsManagedAttr, addr) == 0 && managed) return ncclSuccess;
  return fail(ncclInvalidArgument, fn,
              std::string(arg) +
                  ": points to CUDA device memory; Loom's NCCL shim moves host buffers only "
                  "(Loom has no CUDA transport yet)");
}

ncclResult_t toLoomConfig(const char* fn, const ncclConfig_t* config, loomConfig_t* out,
                          loomConfig_t** outPtr) {
  *outPtr = nullptr;
  if (config == nullptr) return ncclSuccess;
  if (config->magic != kNcclConfigMagic || config->size < offsetof(ncclConfig_t, blocking) + 4)
    return fail(ncclInvalidArgument, fn,
                "config: not initialised with NCCL_CONFIG_INITIALIZER (magic or size wrong)");
  // NCCL gives a field a config leaves undefined its default, where Loom's split and shrink
  // give it the parent's: the shim passes NCCL's defaults (blocking, no name) explicitly.
  *out = LOOM_CONFIG_INITIALIZER;
  out->blocking = config->blocking == NCCL_CONFIG_UNDEF_INT ? 1 : config->blocking;
  out->commName = "";
  if (hasField(config, offsetof(ncclConfig_t, commName), sizeof(config->commName)) &&
      config->commName != nullptr)
    out->commName = config->commName;
  *outPtr = out;
  return ncclSuccess;
}

}  // namespace loom::shim

using namespace loom::shim;

extern "C" {

ncclResult_t pncclGetVersion(int* version) {
  return shimGuard("ncclGetVersion", [&] {
    if (version == nullptr) return fail(ncclInvalidArgument, "ncclGetVersion", "version: NULL");
    // The shim implements the API of the header it was built against.
    *version = NCCL_VERSION_CODE;
    return ncclSuccess;
  });
}

ncclResult_t pncclGetUniqueId(ncclUniqueId* uniqueId) {
  return shimGuard("ncclGetUniqueId", [&] {
    return fromLoom(loomGetUniqueId(reinterpret_cast<loomUniqueId*>(uniqueId)));
  });
}

ncclResult_t pncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank,
                                     ncclConfig_t* config) {
  return shimGuard("ncclCommInitRankConfig", [&] {
    loomConfig_t lc;
    loomConfig_t* lcp;
    ncclResult_t r = toLoomConfig("ncclCommInitRankConfig", config, &lc, &lcp);
    if (r != ncclSuccess) return r;
    loomUniqueId id;
    std::memcpy(&id, &commId, sizeof(id));
    return fromLoom(
        loomCommInitRankConfig(reinterpret_cast<loomComm_t*>(comm), nranks, id, rank, lcp));
  });
}

ncclResult_t pncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank) {
  return pncclCommInitRankConfig(comm, nranks, commId, rank, nullptr);
}

ncclResult_t pncclCommInitRankScalable(ncclComm_t* newcomm, int nranks, int myrank, int nId,
                                       ncclUniqueId* commIds, ncclConfig_t* config) {
  // Loom's rendezvous has one root; every rank passes the same ids in the same
  // order, so the first one names it for all.
  if (nId < 1)
    return fail(ncclInvalidArgument, "ncclCommInitRankScalable",
                "nId: " + std::to_string(nId) + " < 1");
  if (commIds == nullptr)
    return fail(ncclInvalidArgument, "ncclCommInitRankScalable", "commIds: NULL");
  return pncclCommInitRankConfig(newcomm, nranks, commIds[0], myrank, config);
}

ncclResult_t pncclCommInitAll(ncclComm_t* comm, int ndev, const int* devlist) {
  return shimGuard("ncclCommInitAll", [&] {
    return fromLoom(loomCommInitAll(reinterpret_cast<loomComm_t*>(comm), ndev, devlist));
  });
}

ncclResult_t pncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
                            ncclConfig_t* config) {
  return shimGuard("ncclCommSplit", [&] {
    loomConfig_t lc;
    loomConfig_t* lcp;
    ncclResult_t r = toLoomConfig("ncclCommSplit", config, &lc, &lcp);
    if (r != ncclSuccess) return r;
    return fromLoom(
        loomCommSplit(toLoom(comm), color, key, reinterpret_cast<loomComm_t*>(newcomm), lcp));
  });
}

ncclResult_t pncclCommShrink(ncclComm_t comm, int* excludeRanksList, int excludeRanksCount,
                             ncclComm_t* newcomm, ncclConfig_t* config, int shrinkFlags) {
  static const char* fn = "ncclCommShrink";
  return shimGuard(fn, [&]() -> ncclResult_t {
    loomConfig_t lc;
    loomConfig_t* lcp;
    ncclResult_t r = toLoomConfig(fn, config, &lc, &lcp);
    if (r != ncclSuccess) return r;
    static_assert(
        NCCL_SHRINK_DEFAULT == LOOM_SHRINK_DEFAULT && NCCL_SHRINK_ABORT == LOOM_SHRINK_ABORT,
        "shrink flags");
    return fromLoom(loomCommShrink(toLoom(comm), excludeRanksList, excludeRanksCount,
                                   reinterpret_cast<loomComm_t*>(newcomm), lcp, shrinkFlags));
  });
}

ncclResult_t pncclCommFinalize(ncclComm_t comm) {
  return shimGuard("ncclCommFinalize", [&] { return fromLoom(loomCommFinalize(toLoom(comm))); });
}

// A NULL communicator (ncclCommSplit's with NCCL_SPLIT_NOCOLOR, say) is nothing to end, as in
// NCCL.
ncclResult_t pncclCommDestroy(ncclComm_t comm) {
  if (comm == nullptr) return ncclSuccess;
  return shimGuard("ncclCommDestroy", [&] { return fromLoom(loomCommDestroy(toLoom(comm))); });
}

ncclResult_t pncclCommAbort(ncclComm_t comm) {
  if (comm == nullptr) return ncclSuccess;
  return shimGuard("ncclCommAbort", [&] { return fromLoom(loomCommAbort(toLoom(comm))); });
}

// Loom's calls on host buffers finish before they return, so nothing is ever
// in flight to revoke; a revoked communicator would still have to refuse new
// work, which Loom cannot mark, so the call is refused rather than half done.
ncclResult_t pncclCommRevoke(ncclComm_t comm, int revokeFlags) {
  if (comm == nullptr) return fail(ncclInvalidArgument, "ncclCommRevoke", "comm: NULL");
  return fail(ncclInvalidUsage, "ncclCommRevoke",
              "not supported by Loom's NCCL shim (use ncclCommAbort or ncclCommDestroy)");
}

ncclResult_t pncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
  return shimGuard("ncclCommGetAsyncError", [&] {
    if (asyncError == nullptr)
      return fail(ncclInvalidArgument, "ncclCommGetAsyncError", "asyncError: NULL");
    loomResult_t e = loomSuccess;
    ncclResult_t r = fromLoom(loomCommGetAsyncError(toLoom(comm), &e));
    if (r != ncclSuccess) return r;
    // A failure maps as a call's does (a timeout is ncclTimeout where the header has it), and its
    // text becomes ncclGetLastError's.
    *asyncError =
        e == loomSuccess || e == loomInProgress ? static_cast<ncclResult_t>(e) : fromLoom(e);
    return ncclSuccess;
  });
}

ncclResult_t pncclCommCount(const ncclComm_t comm, int* count) {
  return shimGuard("ncclCommCount", [&] { return fromLoom(loomCommCount(toLoom(comm), count)); });
}

ncclResult_t pncclCommCuDevice(const ncclComm_t comm, int* device) {
  return shimGuard("ncclCommCuDevice",
                   [&] { return fromLoom(loomCommCuDevice(toLoom(comm), device)); });
}

ncclResult_t pncclCommUserRank(const ncclComm_t comm, int* rank) {
  return shimGuard("ncclCommUserRank",
                   [&] { return fromLoom(loomCommUserRank(toLoom(comm), rank)); });
}

const char* pncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess:
      return "no error";
    case ncclUnhandledCudaError:
      return "unhandled cuda error (ncclGetLastError says more)";
    case ncclSystemError:
      return "unhandled system error (ncclGetLastError says more)";
    case ncclInternalError:
      return "internal error (ncclGetLastError says more)";
    case ncclInvalidArgument:
      return "invalid argument (ncclGetLastError names it)";
    case ncclInvalidUsage:
      return "invalid usage (ncclGetLastError says why)";
    case ncclRemoteError:
      return "remote process exited, timed out, or there was a network error";
    case ncclInProgress:
      return "NCCL operation in progress";
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 30, 0)
    case ncclTimeout:
      return "timed out waiting for a peer (ncclGetLastError names it)";
#endif
    default:
      return "unknown result code";
  }
}

const char* pncclGetLastError(ncclComm_t comm) { return tLastError.c_str(); }

void pncclResetDebugInit() {}

ncclResult_t pncclRedOpCreatePreMulSum(ncclRedOp_t* op, void* scalar, ncclDataType_t datatype,
                                       ncclScalarResidence_t residence, ncclComm_t comm) {
  return shimGuard("ncclRedOpCreatePreMulSum", [&] {
    ncclResult_t r = checkHost("ncclRedOpCreatePreMulSum", "scalar", scalar);
    if (r != ncclSuccess) return r;
    return fromLoom(loomRedOpCreatePreMulSum(
        reinterpret_cast<loomRedOp_t*>(op), scalar, static_cast<loomDataType_t>(datatype),
        static_cast<loomScalarResidence_t>(residence), toLoom(comm)));
  });
}

ncclResult_t pncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm) {
  return shimGuard("ncclRedOpDestroy", [&] {
    return fromLoom(loomRedOpDestroy(static_cast<loomRedOp_t>(op), toLoom(comm)));
  });
}

// Host memory, page-aligned: what Loom moves today. A program that hands this
// to CUDA kernels needs the real NCCL.
ncclResult_t pncclMemAlloc(void** ptr, size_t size) {
  if (ptr == nullptr) return fail(ncclInvalidArgument, "ncclMemAlloc", "ptr: NULL");
  *ptr = nullptr;
  if (size == 0) return fail(ncclInvalidArgument, "ncclMemAlloc", "size: 0");
  if (posix_memalign(ptr, 4096, size) != 0)
    return fail(ncclSystemError, "ncclMemAlloc",
                "size: out of host memory for " + std::to_string(size) + " bytes");
  return ncclSuccess;
}

ncclResult_t pncclMemFree(void* ptr) {
  free(ptr);
  return ncclSuccess;
}

// Registration lets the ib transport send from the buffer in place.
ncclResult_t pncclCommRegister(const ncclComm_t comm, void* buff, size_t size, void** handle) {
  return fromLoom(loomCommRegister(toLoom(comm), buff, size, handle));
}

ncclResult_t pncclCommDeregister(const ncclComm_t comm, void* handle) {
  return fromLoom(loomCommDeregister(toLoom(comm), handle));
}

}  // extern "C"

struct ncclWindow_vidmem {
  void* base;
  size_t size;
};

extern "C" {

// The windows registered and not yet deregistered, and their communicators: a window is
// refused by name once gone or on another communicator (not freed twice).
std::mutex& windowsMutex() {
  static std::mutex m;
  return m;
}
std::map<ncclWindow_t, ncclComm_t>& windows() {
  static auto* w = new std::map<ncclWindow_t, ncclComm_t>;  // outlives exit-time calls
  return *w;
}

ncclResult_t pncclCommWindowRegister(ncclComm_t comm, void* buff, size_t size, ncclWindow_t* win,
                                     int winFlags) {
  return shimGuard("ncclCommWindowRegister", [&] {
    int n = 0;
    ncclResult_t r = fromLoom(loomCommCount(toLoom(comm), &n));
    if (r != ncclSuccess) return r;
    if (win == nullptr) return fail(ncclInvalidArgument, "ncclCommWindowRegister", "win: NULL");
    if (buff == nullptr && size > 0)
      return fail(ncclInvalidArgument, "ncclCommWindowRegister", "buff: NULL");
    *win = new ncclWindow_vidmem{buff, size};
    std::lock_guard<std::mutex> lock(windowsMutex());
    windows()[*win] = comm;
    return ncclSuccess;
  });
}

ncclResult_t pncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win) {
  return shimGuard("ncclCommWindowDeregister", [&] {
    std::lock_guard<std::mutex> lock(windowsMutex());
    auto it = windows().find(win);
    if (it == windows().end())
      return fail(ncclInvalidArgument, "ncclCommWindowDeregister",
                  "win: not a registered window (NULL, or deregistered already)");
    if (it->second != comm)
      return fail(ncclInvalidArgument, "ncclCommWindowDeregister",
                  "comm: not the communicator the window was registered on");
    delete win;
    windows().erase(it);
    return ncclSuccess;
  });
}

#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 30, 0)
ncclResult_t pncclWinGetUserPtr(ncclComm_t comm, ncclWindow_t win, void** outUserPtr) {
  return shimGuard("ncclWinGetUserPtr", [&] {
    if (outUserPtr == nullptr)
      return fail(ncclInvalidArgument, "ncclWinGetUserPtr", "outUserPtr: NULL");
    std::lock_guard<std::mutex> lock(windowsMutex());
    auto it = windows().find(win);
    if (it == windows().end() || it->second != comm)
      return fail(ncclInvalidArgument, "ncclWinGetUserPtr", "win: not a window registered on comm");
    *outUserPtr = win->base;
    return ncclSuccess;
  });
}
#endif

}  // extern "C"

LOOM_SHIM_ALIAS(ncclGetVersion)
LOOM_SHIM_ALIAS(ncclGetUniqueId)
LOOM_SHIM_ALIAS(ncclCommInitRankConfig)
LOOM_SHIM_ALIAS(ncclCommInitRank)
LOOM_SHIM_ALIAS(ncclCommInitRankScalable)
LOOM_SHIM_ALIAS(ncclCommInitAll)
LOOM_SHIM_ALIAS(ncclCommSplit)
LOOM_SHIM_ALIAS(ncclCommShrink)
LOOM_SHIM_ALIAS(ncclCommFinalize)
LOOM_SHIM_ALIAS(ncclCommDestroy)
LOOM_SHIM_ALIAS(ncclCommAbort)
LOOM_SHIM_ALIAS(ncclCommRevoke)
LOOM_SHIM_ALIAS(ncclCommGetAsyncError)
LOOM_SHIM_ALIAS(ncclCommCount)
LOOM_SHIM_ALIAS(ncclCommCuDevice)
LOOM_SHIM_ALIAS(ncclCommUserRank)
LOOM_SHIM_ALIAS(ncclGetErrorString)
LOOM_SHIM_ALIAS(ncclGetLastError)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"  // NCCL marks it deprecated
LOOM_SHIM_ALIAS(ncclResetDebugInit)
#pragma GCC diagnostic pop
LOOM_SHIM_ALIAS(ncclRedOpCreatePreMulSum)
LOOM_SHIM_ALIAS(ncclRedOpDestroy)
LOOM_SHIM_ALIAS(ncclMemAlloc)
LOOM_SHIM_ALIAS(ncclMemFree)
LOOM_SHIM_ALIAS(ncclCommRegister)
LOOM_SHIM_ALIAS(ncclCommDeregister)
LOOM_SHIM_ALIAS(ncclCommWindowRegister)
LOOM_SHIM_ALIAS(ncclCommWindowDeregister)
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 30, 0)
LOOM_SHIM_ALIAS(ncclWinGetUserPtr)
#endif
