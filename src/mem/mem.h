// Shared-memory-backed user buffers (loomMemAlloc), which peers on the same
// host can read in place: the direct all-reduce then reduces straight out of
// a rank's own buffer instead of first copying it into Loom's.
//
// Each allocation is a POSIX shared-memory segment of its own, named from a
// random 64-bit token ("/loom-mem-<token>", mode 0600, created exclusively),
// mapped and pre-faulted once. A peer that sees the token in a rank's direct
// header maps the segment once (cached per process) and reads the bytes at the
// published offset. The name is unlinked at loomMemFree and at process exit;
// a peer's mapping keeps the memory alive until that peer exits. The allocating
// process holds each segment's lock while it is named, so the buffers of a
// process that was killed are removed by a later first loomMemAlloc or set-up
// on the host (util/shm.h).
#pragma once

#include <cstddef>
#include <cstdint>

#include "util/status.h"

namespace loom::mem {

// Allocates `bytes` (> 0) of shared memory, every page touched.
Result<void*> alloc(size_t bytes);
// Frees what alloc() returned; loomInvalidArgument for any other pointer.
Status free(void* ptr);

// Where [ptr, ptr + bytes) lies in an allocation of this process.
struct Ref {
  uint64_t token = 0;  // 0: not in any allocation
  uint64_t offset = 0;
};
Ref lookup(const void* ptr, size_t bytes);

// The base of another process's allocation `token` (at least `minBytes` long), mapped into this
// process on first use.
Result<const char*> mapPeer(uint64_t token, size_t minBytes);

}  // namespace loom::mem
