// The NCCL-compatible shim: libnccl.so.2 whose every entry point forwards to
// Loom's C API, so a program built against NCCL's own header runs on Loom by
// library path alone (LD_LIBRARY_PATH, an rpath, or LD_PRELOAD).
//
// Contract: the shim is compiled against NCCL's header (nccl.h), never a copy
// of it; the static_asserts in shim.cc prove that every enum value, handle and
// struct that crosses the boundary means the same in both APIs, so arguments
// pass through unchanged. No exception leaves an entry point (shimGuard).
// Buffers must be host memory: Loom has no CUDA path yet, and a device pointer
// is refused with ncclInvalidArgument and a message naming the argument.
//
// Thread safety is Loom's: a communicator is used by one thread at a time; the
// last-error text is per thread.
#ifndef LOOM_SHIM_SHIM_H_
#define LOOM_SHIM_SHIM_H_

// NCCL 2.30's header declares ncclResetDebugInit only for Linux (else a macro); the shim is
// built for Linux, as NCCL's library is, and exports it.
#ifndef NCCL_OS_LINUX
#define NCCL_OS_LINUX 1
#endif
#include <nccl.h>

#include <string>

#include "loom/loom.h"

namespace loom::shim {

/// Converts handles: an ncclComm_t is a loomComm_t under another name.
inline loomComm_t toLoom(ncclComm_t c) { return reinterpret_cast<loomComm_t>(c); }
inline ncclComm_t toNccl(loomComm_t c) { return reinterpret_cast<ncclComm_t>(c); }

/// Maps a Loom result to NCCL's; on failure copies Loom's last-error text into the shim's, in
/// NCCL's words: its leading "loomX:" becomes the NCCL entry point that shimGuard runs, and
/// every other loomX ncclX. loomTimeout is ncclTimeout from NCCL 2.30 on, and ncclRemoteError
/// before (a peer did not answer in time).
ncclResult_t fromLoom(loomResult_t r);

/// The NCCL entry point that shimGuard runs on this thread, the outermost where one entry
/// point calls another (nullptr outside one).
extern thread_local const char* tEntryPoint;

/// Records a failure found by the shim itself: "fn: message".
ncclResult_t fail(ncclResult_t code, const char* fn, const std::string& message);

/// ncclInvalidArgument when p is CUDA device memory (only knowable when the
/// process has already loaded the CUDA driver); ncclSuccess otherwise.
ncclResult_t checkHost(const char* fn, const char* arg, const void* p);

/// Translates an NCCL config to Loom's: blocking and commName (read only when
/// config->size says the caller's struct has them). NULL stays NULL (out).
ncclResult_t toLoomConfig(const char* fn, const ncclConfig_t* config, loomConfig_t* out,
                          loomConfig_t** outPtr);

/// Runs f (returning ncclResult_t); any exception becomes ncclInternalError.
template <class F>
ncclResult_t shimGuard(const char* fn, F&& f) {
  struct Entered {  // restored on the way out, whichever way that is
    const char* outer = tEntryPoint;
    ~Entered() { tEntryPoint = outer; }
  } entered;
  if (tEntryPoint == nullptr) tEntryPoint = fn;  // the call the user made (ncclCommInitRank)
  try {
    return f();
  } catch (...) {
    return fail(ncclInternalError, fn, "internal error in the NCCL shim");
  }
}

}  // namespace loom::shim

/// Defines pnccl<name> (the profiling entry point NCCL also exports) and
/// ncclname as a weak alias of it, as NCCL's own library does, so a profiler
/// that wraps ncclX and calls pncclX finds it here too.
#define LOOM_SHIM_ALIAS(name) \
  extern "C" __attribute__((weak, alias("p" #name))) decltype(p##name) name;

#endif  // LOOM_SHIM_SHIM_H_
