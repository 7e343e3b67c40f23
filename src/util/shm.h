// Named POSIX shared-memory segments that a killed process does not leave behind for good.
//
// A process that creates a segment holds an flock() lock on it for as long as the name
// exists; the kernel drops the lock when the process ends, however it ends. A segment named
// "loom-*" in /dev/shm that is this user's, has a size, and whose lock anyone can take was
// left by a process that died before it could unlink it: removeAbandoned() unlinks those.
// (Creators size a segment only once they hold its lock, so a segment seen at size 0 may be
// one being created and is left alone.)
#pragma once

#include <string>

#include "util/status.h"

namespace loom::shm {

// Creates `name` ("/loom-..."), exclusively, mode 0600, holds its lock, sizes it to `bytes`.
// Returns the open descriptor (O_CLOEXEC), which keeps the lock: close it only once the
// name is unlinked. `what` starts the error message. An existing segment of that name is
// replaced when no live process holds it or it is another user's; when a live process of
// this user holds it, the error says so.
Result<int> createHeld(const std::string& name, size_t bytes, const char* what);

// Unlinks this user's abandoned "loom-*" segments (see above); returns how many.
int removeAbandoned();

}  // namespace loom::shm
