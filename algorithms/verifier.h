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
};

struct VerifyResult {
  bool ok = false;
  std::string error;    // first violation, naming rank, step, piece and element
  size_t messages = 0;  // pieces sent in total
};

// schedules[r] is rank r's schedule; all of one collective, root and count.
VerifyResult verify(const std::vector<Schedule>& schedules, const VerifyOptions& options);

}  // namespace loom::algo
