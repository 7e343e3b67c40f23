// Direct all-reduce for communicators whose ranks all share one host.
//
// No data passes through a FIFO or a socket: each rank copies its input once
// into its own direct buffer (transport/shm/shm_direct.h), which every peer
// maps, and reduces straight out of the peers' buffers.
//  * slice variant (large messages): rank r reduces slice r of every rank's
//    buffer into its own buffer, then every rank copies all reduced slices
//    out: each byte is reduced once and read n times.
//  * symmetric variant (small messages): every rank reduces the whole round
//    itself, in rank order, so results agree bit for bit; one synchronisation
//    instead of two.
//  * low-latency variant (up to 56 bytes, unless LOOM_PROTO=simple): the
//    input and the round number share one cache line (as NCCL's LL), so one
//    poll of a peer's line brings its data.
// Messages larger than a buffer go in rounds; the two buffers alternate so a
// rank can fill the next round while slow peers still read the last one.
#pragma once

#include "exec/executor.h"

namespace loom::exec {

Status runDirectAllReduce(Comm& comm, const OpArgs& op, size_t count, bool symmetric);
// Whether an all-reduce of `bytes` takes the low-latency path.
bool directUsesLL(size_t bytes);

}  // namespace loom::exec
