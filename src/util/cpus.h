// Which CPUs the ranks of one machine may run on: each rank's affinity mask travels in its
// peer information, so that a rank counts the cores its machine's ranks share (all of them),
// not only those its own mask allows. A launcher that binds each rank to a core of its own
// (mpirun does for two ranks, srun with --cpu-bind) gives every rank a one-CPU mask; counted
// alone, that would make two ranks on two cores look like two ranks on one.
#pragma once

#include <sched.h>

#include <string>
#include <vector>

namespace loom::cpus {

// This process's affinity mask; the online CPUs where it cannot be read.
cpu_set_t allowed();

// A mask as hexadecimal digits, most significant first, without leading zeros ("3": CPUs 0
// and 1; "0": none). parseMask takes the same form back; false on an empty string, a digit
// that is not hexadecimal, or a CPU beyond CPU_SETSIZE.
std::string formatMask(const cpu_set_t& mask);
bool parseMask(const std::string& text, cpu_set_t* mask);

// Ranks a core: the ranks of one machine (`masks`, one per rank, this rank's among them) over
// the CPUs in the union of their masks, rounded up; at least 1.
int ranksPerCore(const std::vector<cpu_set_t>& masks);

}  // namespace loom::cpus
