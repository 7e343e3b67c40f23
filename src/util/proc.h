// Whether a process of this host is still running, from /proc.
#pragma once

namespace loom::proc {

// False once process `pid` has exited (gone, or a zombie not yet reaped); true while it runs
// and where /proc cannot tell (pid <= 0).
bool alive(int pid);

}  // namespace loom::proc
