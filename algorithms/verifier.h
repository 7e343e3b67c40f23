// The schedule verifier: runs every rank's schedule of one collective
// symbolically and proves that it is correct and cannot deadlock.
//
// Values are symbolic: each element holds (source index, set of contributing
// ranks, pre-scaled flags, post-op count). The simulation follows the
// execution model of schedule.h exactly (pieces, round-major order, a step's
// receive before its send) over FIFOs of `fifoDepth` slots per directed pair,
// and checks: every receive matches a send of the same piece size from the
// named peer; no step reads an undefined value or reduces values of different
// source indices or overlapping contributor sets; no rank gets stuck while
// another still has work (deadlock); at the end every output element holds
// exactly what the collective defines, each contribution pre-scaled once and
// the post-op applied once; all FIFOs are empty.
// In-place runs alias the buffers as the C API defines them.
//
// Memory steps (schedule.h) are simulated over each rank's window and flags, with a vector
// clock per rank: publishing a flag releases the rank's clock, a wait that sees it acquires
// it. Every read of a peer's window (or of its input exposed in place) must be ordered after
// the write of what it reads, and every write after the peers' earlier reads of what it
// overwrites; a rank must not return while a peer may still read its input in place. These
// hold for every interleaving, not only the one simulated, so a missing or wrong flag wait is
// found even when the simulated order happens to read the right values. `repeat` runs each
// schedule that many times back to back (fresh buffers each time, the same windows and flags
// with rounds going on), so that buffers reused across operations are checked too.
#pragma once

#include <string>
#include <vector>

#include "algorithms/schedule.h"

namespace loom::algo {

struct VerifyOptions {
  size_t elemSize = 4;    // bytes per element (sets how steps cut into pieces)
  size_t slotBytes = 16;  // small slots force many pieces per step
  size_t fifoDepth = 1;   // slots per directed pair; 1 is the hardest case
  bool inPlace = false;
  size_t repeat = 1;  // operations run back to back (each with its own buffers)
};

struct VerifyResult {
  bool ok = false;
  std::string error;    // first violation, naming rank, step, piece and element
  size_t messages = 0;  // pieces sent in total
};

// schedules[r] is rank r's schedule; all of one collective, root and count.
VerifyResult verify(const std::vector<Schedule>& schedules, const VerifyOptions& options);

}  // namespace loom::algo
