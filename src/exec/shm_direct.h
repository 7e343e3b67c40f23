// Direct all-reduce for communicators whose ranks all share one host.
//
// No data passes through a FIFO or a socket: each rank copies its input once
// into its own direct buffer (transport/shm/shm_direct.h), which every peer
// maps, and reduces straight out of the peers' buffers.
//  * slice variant (large messages): rank r reduces slice r of every rank's
//    buffer into its own buffer, then every rank copies all reduced slices
//    out: each byte is reduced once and read n times. From streamBytes() (1 MiB
//    on AMD, else 64 MiB) what the peers read next is written with streaming
//    stores, and a rank's own slice goes from the reduction straight to its
//    output (shm_direct.cc).
//  * symmetric variant (small messages): every rank reduces the whole round
//    itself, in rank order, so results agree bit for bit; one synchronisation
//    instead of two.
//  * low-latency variant (up to 384 bytes, unless LOOM_PROTO rules out ll for
//    all-reduce): the input and the round number share each cache line (as
//    NCCL's LL and LL128), so a poll of a peer's line brings its data; up to
//    48 bytes take one line.
// Messages larger than a round go in rounds over three buffers in turn, so a
// rank can fill the next round while slow peers still read the last ones.
#pragma once

#include "exec/executor.h"

namespace loom::exec {

using algo::DirectForm;
using algo::directFormName;
// The form for an all-reduce of `bytes` among `nranks`: LL up to `llMax` bytes when `llAllowed`
// (LOOM_PROTO), symmetric up to symmetricMaxBytes(nranks), slices above. llMaxBytes(comm):
// transport::kShmLLMaxBytes where every rank has a core; transport::kShmLLBytes (one line) where
// ranks outnumber the cores, whose waits are decided by the scheduler and where the lines past the
// first measured slower than the symmetric form (8 ranks on 2 cores).
DirectForm directForm(size_t bytes, int nranks, bool llAllowed, size_t llMax);
// LOOM_DIRECT_SYM_MAX, else 64 KiB / nranks: each rank of the symmetric form reads every
// rank's input, nranks times the message.
size_t symmetricMaxBytes(int nranks);
size_t llMaxBytes(const Comm& comm);

// *doneNs: when the operation ended, where the path read the clock at its end anyway, else 0.
Status runDirectAllReduce(Comm& comm, const OpArgs& op, size_t count, DirectForm form,
                          int64_t* doneNs);

}  // namespace loom::exec
