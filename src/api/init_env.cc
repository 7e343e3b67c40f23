// loomCommInitFromEnv: the world communicator from the variables a launcher sets.
//
// The launchers are checked in the order of kLaunchers; the first with its rank or size variable
// set is taken, and then each of its variables must be valid. Where the rendezvous root listens
// (rank 0 hosts it inside the join, at an address every rank derives alike):
//   - LOOM_COMM_ID=host:port when set, whatever the launcher;
//   - torchrun, Open MPI: MASTER_ADDR at port MASTER_PORT + 1, because MASTER_PORT itself is taken
//     by torchrun's store (and by torch.distributed's, in a job that also uses PyTorch). Open MPI
//     names no such address, so there LOOM_COMM_ID (or MASTER_ADDR and MASTER_PORT) must be set;
//   - Slurm: the first node of the step's node list, at port LOOM_COMM_PORT, else at
//     kSlurmBasePort + (SLURM_JOB_ID + SLURM_STEP_ID) % kSlurmPortSpan (init_env.h).
// A missing or malformed variable is loomInvalidArgument naming it.
#include "api/init_env.h"

#include <climits>
#include <cstdlib>
#include <string>

#include "api/api.h"
#include "bootstrap/unique_id.h"
#include "util/env.h"
#include "util/log.h"

namespace loom::api {
namespace {

enum class Kind { kLoom, kTorchrun, kOpenMpi, kSlurm };

struct Launcher {
  Kind kind;
  const char* name;
  const char* rank;       // this process's rank
  const char* size;       // the number of ranks
  const char* localRank;  // the rank among this host's ranks: checked when set, then logged
};

// The launcher variables read here, in the order the launchers are checked. Loom's own (LOOM_*)
// are declared in util/env.cc and read through its accessors; every other name belongs to its
// launcher and is read with getenv.
constexpr Launcher kLaunchers[] = {
    {Kind::kLoom, "Loom", "LOOM_RANK", "LOOM_WORLD_SIZE", nullptr},
    {Kind::kTorchrun, "torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK"},
    {Kind::kOpenMpi, "Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
     "OMPI_COMM_WORLD_LOCAL_RANK"},
    {Kind::kSlurm, "Slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"},
};
constexpr char kMasterAddr[] = "MASTER_ADDR";  // torchrun: rank 0's host
constexpr char kMasterPort[] = "MASTER_PORT";  // torchrun: its store's port (Loom takes the next)
// srun sets it for the tasks of a step; a salloc or sbatch shell has SLURM_PROCID=0 without it.
constexpr char kSlurmStepId[] = "SLURM_STEP_ID";
constexpr char kSlurmJobId[] = "SLURM_JOB_ID";
// Task 0 runs on the first node of its step; the job's lists stand in for older versions.
constexpr const char* kSlurmNodeLists[] = {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST",
                                           "SLURM_NODELIST"};

// What the environment says.
struct Launch {
  const Launcher* launcher = nullptr;
  int rank = 0;
  int size = 0;
  int localRank = -1;             // -1: not given
  std::string hostPort;           // where the root listens
  std::string source;             // the variables that named it, for messages
  const char* addrVar = nullptr;  // the variable to name when hostPort is no address
};

// A variable's value; unset and empty read alike.
std::string value(const char* name) {
  const std::string n = name;
  if (n == "LOOM_RANK") return env::rankText();
  if (n == "LOOM_WORLD_SIZE") return env::worldSizeText();
  const char* v = std::getenv(name);
  return v != nullptr ? v : "";
}

Status invalid(const std::string& name, const std::string& text, const std::string& why) {
  return LOOM_ERROR(loomInvalidArgument, name + "=" + text + " " + why);
}

Status notSet(const std::string& name, const std::string& found, const std::string& hint = "") {
  return LOOM_ERROR(loomInvalidArgument,
                    name + " is not set (found " + found + ")" + (hint.empty() ? "" : "; " + hint));
}

// A decimal number in [lo, hi].
Result<long long> parseNumber(const char* name, const std::string& text, long long lo,
                              long long hi) {
  const bool negative = !text.empty() && text[0] == '-';
  const std::string digits = negative ? text.substr(1) : text;
  if (!detail::allDigits(digits) || digits.size() > 18)
    return invalid(name, text, "is not an integer");
  const long long v = std::strtoll(text.c_str(), nullptr, 10);
  if (v < lo || v > hi)
    return invalid(name, text,
                   "is outside [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return v;
}

Status readRanks(const Launcher& l, Launch* out) {
  const std::string rank = value(l.rank), size = value(l.size);
  if (rank.empty()) return notSet(l.rank, l.size);
  if (size.empty()) return notSet(l.size, l.rank);
  LOOM_ASSIGN(long long n, parseNumber(l.size, size, 1, INT_MAX));
  out->size = static_cast<int>(n);
  const std::string range = "[0, " + std::string(l.size) + "=" + size + ")";
  LOOM_ASSIGN(long long r, parseNumber(l.rank, rank, LLONG_MIN / 10, LLONG_MAX / 10));
  if (r < 0 || r >= n) return invalid(l.rank, rank, "is outside " + range);
  out->rank = static_cast<int>(r);
  const std::string local = l.localRank != nullptr ? value(l.localRank) : "";
  if (!local.empty()) {
    LOOM_ASSIGN(long long lr, parseNumber(l.localRank, local, LLONG_MIN / 10, LLONG_MAX / 10));
    if (lr < 0 || lr >= n) return invalid(l.localRank, local, "is outside " + range);
    out->localRank = static_cast<int>(lr);
  }
  if (l.kind == Kind::kSlurm && value(kSlurmStepId).empty()) {
    return notSet(kSlurmStepId, std::string(l.rank) + " and " + l.size,
                  "this process was not started by srun (a salloc or sbatch shell sets " +
                      std::string(l.rank) + " too); start every rank with srun");
  }
  return Status::ok();
}

// MASTER_ADDR:MASTER_PORT+1, or "" when neither is set.
Result<std::string> masterAddress() {
  const std::string addr = value(kMasterAddr), port = value(kMasterPort);
  if (addr.empty() && port.empty()) return std::string();
  if (addr.empty()) return notSet(kMasterAddr, kMasterPort);
  if (port.empty()) return notSet(kMasterPort, kMasterAddr);
  // The root takes the next port, so the largest usable MASTER_PORT is 65534.
  LOOM_ASSIGN(long long p, parseNumber(kMasterPort, port, 1, 65534));
  return addr + ":" + std::to_string(p + 1);
}

Status slurmAddress(const Launcher& l, Launch* out) {
  const char* listVar = nullptr;
  std::string list;
  for (const char* name : kSlurmNodeLists) {
    list = value(name);
    if (!list.empty()) {
      listVar = name;
      break;
    }
  }
  const std::string found = std::string(l.rank) + " and " + l.size;
  if (listVar == nullptr) {
    return notSet("SLURM_JOB_NODELIST", found,
                  "set LOOM_COMM_ID=host:port, where host is where task 0 runs");
  }
  std::string why;
  const std::string host = firstSlurmHost(list, &why);
  if (host.empty()) return invalid(listVar, list, "is not a Slurm node list: " + why);
  long long port = 0;
  if (!env::commPort().empty()) {
    LOOM_ASSIGN(port, parseNumber("LOOM_COMM_PORT", env::commPort(), 1, 65535));
    out->source = std::string("the first node of ") + listVar + " and LOOM_COMM_PORT";
  } else {
    const std::string job = value(kSlurmJobId), step = value(kSlurmStepId);
    // Step ids of special steps (batch, extern) are near 2^32, so both are read as unsigned.
    if (!job.empty() && (!detail::allDigits(job) || job.size() > 18))
      return invalid(kSlurmJobId, job, "is not a non-negative integer");
    if (!detail::allDigits(step) || step.size() > 18)
      return invalid(kSlurmStepId, step, "is not a non-negative integer");
    const unsigned long long sum = (job.empty() ? 0 : std::strtoull(job.c_str(), nullptr, 10)) +
                                   std::strtoull(step.c_str(), nullptr, 10);
    port = kSlurmBasePort + static_cast<long long>(sum % kSlurmPortSpan);
    out->source = std::string("the first node of ") + listVar + " and the default port " +
                  std::to_string(kSlurmBasePort) + " + (SLURM_JOB_ID + SLURM_STEP_ID) % " +
                  std::to_string(kSlurmPortSpan);
  }
  out->hostPort = host + ":" + std::to_string(port);
  out->addrVar = listVar;
  return Status::ok();
}

Status locateRoot(const Launcher& l, Launch* out) {
  if (!env::commId().empty()) {
    out->hostPort = env::commId();
    out->source = "LOOM_COMM_ID";
    out->addrVar = "LOOM_COMM_ID";
    return Status::ok();
  }
  const std::string found = std::string(l.rank) + " and " + l.size;
  switch (l.kind) {
    case Kind::kLoom:
      return notSet("LOOM_COMM_ID", found,
                    "set it to host:port, where rank 0 hosts the rendezvous, on every rank");
    case Kind::kTorchrun:
    case Kind::kOpenMpi: {
      LOOM_ASSIGN(out->hostPort, masterAddress());
      out->source = "MASTER_ADDR and MASTER_PORT + 1";
      out->addrVar = kMasterAddr;
      if (!out->hostPort.empty()) return Status::ok();
      if (l.kind == Kind::kTorchrun) {
        return notSet(kMasterAddr, found,
                      "set MASTER_ADDR and MASTER_PORT (as torchrun does), or LOOM_COMM_ID");
      }
      return notSet("LOOM_COMM_ID", found,
                    "mpirun names no rendezvous address: set LOOM_COMM_ID=host:port (a free port "
                    "on the host of rank 0) for every rank, or MASTER_ADDR and MASTER_PORT");
    }
    case Kind::kSlurm:
      return slurmAddress(l, out);
  }
  return LOOM_ERROR(loomInternalError, "unknown launcher");
}

Result<Launch> detect() {
  for (const Launcher& l : kLaunchers) {
    if (value(l.rank).empty() && value(l.size).empty()) continue;
    Launch out;
    out.launcher = &l;
    LOOM_CHECK(readRanks(l, &out));
    LOOM_CHECK(locateRoot(l, &out));
    return out;
  }
  return LOOM_ERROR(loomInvalidArgument,
                    "no launcher found: set LOOM_RANK, LOOM_WORLD_SIZE and LOOM_COMM_ID, or start "
                    "the ranks with torchrun (RANK, WORLD_SIZE), mpirun (OMPI_COMM_WORLD_RANK, "
                    "OMPI_COMM_WORLD_SIZE) or srun (SLURM_PROCID, SLURM_NTASKS)");
}

Status initFromEnv(loomComm_t* comm, loomConfig_t* config) {
  if (comm == nullptr) return LOOM_ERROR(loomInvalidArgument, "comm: NULL output pointer");
  *comm = nullptr;
  LOOM_ASSIGN(Launch l, detect());
  loomUniqueId id;
  LOOM_CHECK(bootstrap::makeUniqueIdFor(l.hostPort, l.addrVar, &id));
  const std::string who = l.launcher->name + std::string(" rank ") + std::to_string(l.rank) +
                          " of " + std::to_string(l.size);
  LOOM_INFO(kInit, "%s (local rank %d): root at %s, from %s", who.c_str(), l.localRank,
            l.hostPort.c_str(), l.source.c_str());
  const loomResult_t r = loomCommInitRankConfig(comm, l.size, id, l.rank, config);
  if (r == loomSuccess) return Status::ok();
  std::string why = loomGetLastError(nullptr);
  const std::string inner = "loomCommInitRankConfig: ";
  if (why.compare(0, inner.size(), inner) == 0) why.erase(0, inner.size());
  return LOOM_ERROR(r, who + ", root at " + l.hostPort + " (from " + l.source + "): " + why);
}

}  // namespace
}  // namespace loom::api

extern "C" loomResult_t loomCommInitFromEnv(loomComm_t* comm, loomConfig_t* config) {
  return loom::api::guard("loomCommInitFromEnv",
                          [&] { return loom::api::initFromEnv(comm, config); });
}
