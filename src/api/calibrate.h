// Start-up calibration of the tuner's cost model (LOOM_TUNER_CALIBRATE=1).
//
// Rank 0 times ping-pongs with one peer per kind of link it has: the lowest other rank of its
// host (shared memory, or TCP under LOOM_SHM_DISABLE=1) and the lowest rank of another host
// (the network). It fits each link's latency and bandwidth to the one-way times
// (algo::fitLinkCost), writes the fit as a LOOM_TUNER_TABLE text, and every rank takes rank 0's
// text from an all-gather: the tuner's choices must agree on every rank, so no rank uses its
// own measurement. Ranks that take part in no ping-pong only join the all-gather.
//
// Where every rank shares the host (the direct all-reduce runs), the ranks then time its forms
// against each other at fixed sizes, taking turns (LL against symmetric up to 384 bytes,
// symmetric against slices from 512 bytes to 128 KiB), after a warm-up; rank 0's times give
// the limits (algo::formLimit), which every rank takes (Comm::setDirectLimits).
#pragma once

#include <string>

#include "comm/comm.h"

namespace loom::api {

// Measures and installs the communicator's cost table (Comm::setCostTable); a no-op unless
// LOOM_TUNER_CALIBRATE=1 and the communicator has two ranks or more.
Status calibrate(Comm& comm);

}  // namespace loom::api
