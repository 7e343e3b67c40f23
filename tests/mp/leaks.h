// What a rank process owns, for the fault tests to prove that nothing is left behind after a
// failure, an abort or a destroy: open file descriptors, threads, and the shared-memory
// segments of a communicator (/dev/shm/loom-<hash>-<rank>).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "loom/loom.h"

namespace loomtest {

struct Footprint {
  int fds = 0;
  int threads = 0;
};

// This process's open fds and threads now.
Footprint footprint();

// The communicator's hash, which names its segments (learnt from a flight-recorder dump, the
// public way); 0 when it cannot be learnt.
uint64_t commHash(loomComm_t comm);

// Segments of the communicator with this hash that still exist.
std::vector<std::string> segmentsOf(uint64_t hash, int nranks);

// Problems with what this rank still holds, against `before` (taken before its first init):
// extra fds or threads (given up to 2 s to go: a rendezvous root thread ends once every rank
// joined), and remaining segments of the communicators in `hashes`.
std::vector<std::string> leaks(const Footprint& before, const std::vector<uint64_t>& hashes,
                               int nranks);

}  // namespace loomtest
