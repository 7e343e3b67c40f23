#include "util/env.h"

#include <atomic>
#include <cstdlib>
#include <mutex>

#include "util/log.h"

namespace loom::env {
namespace {

struct Var {
  const char* name;
  const char* deflt;
  const char* doc;
  const char* nccl = "";  // the NCCL (or PyTorch) variable it mirrors
  // Under the NCCL shim (readNcclNames), `nccl` is read where `name` is unset: same values.
  bool ncclValues = false;
};

// The one table of Loom's environment variables.
constexpr Var kVars[] = {
    {"LOOM_DEBUG", "WARN", "log level: WARN, INFO or TRACE (NONE silences warnings)", "NCCL_DEBUG",
     true},
    {"LOOM_DEBUG_SUBSYS", "ALL",
     "subsystems to log: INIT,BOOTSTRAP,TOPO,TUNE,TRANSPORT,EXEC,TRACE,ENV; ^ inverts",
     "NCCL_DEBUG_SUBSYS"},
    {"LOOM_DEBUG_FILE", "", "log to this file instead of stderr; %h is the host, %p the pid",
     "NCCL_DEBUG_FILE", true},
    {"LOOM_COMM_ID", "", "host:port where rank 0 hosts the rendezvous root", "NCCL_COMM_ID", true},
    {"LOOM_COMM_SECRET", "", "shared secret for LOOM_COMM_ID rendezvous (else derived from it)"},
    {"LOOM_RANK", "",
     "loomCommInitFromEnv: this process's rank (with LOOM_WORLD_SIZE and LOOM_COMM_ID)", "RANK"},
    {"LOOM_WORLD_SIZE", "", "loomCommInitFromEnv: the number of ranks", "WORLD_SIZE"},
    {"LOOM_COMM_PORT", "",
     "loomCommInitFromEnv under Slurm: the root's port on the first node of the step "
     "(default 28500 + (SLURM_JOB_ID + SLURM_STEP_ID) % 1000)"},
    {"LOOM_SOCKET_IFNAME", "", "network interfaces to use: prefix list, ^ excludes, = exact",
     "NCCL_SOCKET_IFNAME", true},
    {"LOOM_SOCKET_BUFFER_BYTES", "4194304",
     "TCP transport: each connection's send and receive socket buffer (SO_SNDBUF, SO_RCVBUF; "
     "0: the kernel's autotuning)"},
    {"LOOM_TIMEOUT_MS", "300000",
     "every wait fails with loomTimeout after this many ms (0 or less: ignored; at most 2^31-1)"},
    {"LOOM_SHM_DISABLE", "0", "1: ranks of one host talk over TCP instead of shared memory",
     "NCCL_SHM_DISABLE", true},
    {"LOOM_NET", "",
     "network transport across hosts: IB (fail if no RDMA port is usable), Socket (TCP), or "
     "empty: ib where every pair of ranks has an active port, else TCP",
     "NCCL_NET"},
    {"LOOM_IB_DISABLE", "0", "1: never use the ib transport", "NCCL_IB_DISABLE", true},
    {"LOOM_IB_HCA", "",
     "RDMA devices and ports to use: mlx5_0:1,mlx5_1 (prefixes), ^ excludes, = exact names; "
     "ranks of one host spread over the ports chosen",
     "NCCL_IB_HCA", true},
    {"LOOM_IB_GID_INDEX", "-1", "RoCE GID index (-1: the first RoCE v2 GID with an IPv4 address)",
     "NCCL_IB_GID_INDEX", true},
    {"LOOM_IB_TIMEOUT", "14", "ib retransmission timeout exponent: 4.096 us x 2^N per try",
     "NCCL_IB_TIMEOUT", true},
    {"LOOM_IB_RETRY_CNT", "7", "ib retransmissions before a link is declared lost",
     "NCCL_IB_RETRY_CNT", true},
    {"LOOM_GDR_DISABLE", "0",
     "1: never register device buffers for GPUDirect RDMA (dma-buf or peer memory); "
     "they stage through host memory",
     "NCCL_NET_GDR_LEVEL"},
    {"LOOM_SLOT_BYTES", "262144",
     "bytes in one transport FIFO slot (the pipelining unit; 4096..2^26: each connection holds "
     "LOOM_FIFO_DEPTH of them each way)",
     "NCCL_BUFFSIZE"},
    {"LOOM_FIFO_DEPTH", "4", "slots in each direction of a connection (2..16)"},
    {"LOOM_SPIN_COUNT", "-1",
     "polls of a wait before it yields (-1: 2000, or none when the ranks on this machine "
     "outnumber its cores; on a socket at most 32)"},
    {"LOOM_YIELD_COUNT", "-1",
     "yields of a wait, after its polls, before it blocks (-1: 1000 where every rank on this "
     "machine has a core, 200 where two share each core, else 16)"},
    {"LOOM_SCHEDULE_DUMP", "", "write every schedule built to this file (JSON lines)"},
    {"LOOM_ALGO", "",
     "algorithms the tuner may pick: ring, tree, rhd, rd, hier, hierrd, chain, direct; a list for "
     "every "
     "collective or per collective (allreduce:ring,tree;allgather:ring); ^ excludes",
     "NCCL_ALGO"},
    {"LOOM_TUNER_TABLE", "",
     "a measured cost table for the tuner (lines: link alpha_us GB/s [overhead_us]; "
     "links shm, tcp, nvlink, pcie, net; reduce GB/s) over its defaults"},
    {"LOOM_TUNER_CALIBRATE", "0",
     "1: at start-up rank 0 times ping-pongs over each kind of link it has and every rank's "
     "tuner prices with that fit (over LOOM_TUNER_TABLE); where all ranks share a host the ranks "
     "also time the direct all-reduce's forms against each other (LL, symmetric, slices, copies "
     "cached or streamed, in and out of place) and take rank 0's limits (LOOM_DIRECT_SYM_MAX and "
     "LOOM_DIRECT_STREAM_BYTES rule over them); about 0.05-0.5 s"},
    {"LOOM_TUNER_CACHE", "",
     "a directory where LOOM_TUNER_CALIBRATE keeps the direct all-reduce's limits per CPU "
     "model, rank count and ranks a core: a later start-up on the host takes them from there "
     "instead of timing the forms again"},
    {"LOOM_PROTO", "",
     "protocols: LL (input and round number in each cache line; up to 384 B, 48 B where "
     "ranks outnumber cores) or simple; same syntax as LOOM_ALGO",
     "NCCL_PROTO"},
    {"LOOM_KERNEL_ISA", "",
     "force the reduction kernels' level, and the streaming copy's: scalar, avx2 or avx512 (read "
     "by algorithms/kernels, which links nothing else)"},
    {"LOOM_INJECT_DELAY", "",
     "tests only: RANK:US[:EVERY] delays RANK's entry into every EVERY-th operation (default "
     "each) by US microseconds, as a late caller would (needs the flight recorder)"},
    {"LOOM_CHECK_CALLS", "0",
     "1: before each collective the ranks compare what they call (collective, count, type, op, "
     "root) over the bootstrap ring, and every rank refuses a call that differs on any rank "
     "(loomInvalidArgument naming the argument and both ranks' calls); tens of microseconds a "
     "call, for debugging"},
    {"LOOM_FLIGHT_RECORDER", "2000", "operations kept per communicator for traces (0: off)",
     "TORCH_NCCL_TRACE_BUFFER_SIZE"},
    {"LOOM_TRACE_DIR", "",
     "dump each rank's flight recorder here (a folder, made if missing) on timeout, abort, "
     "SIGUSR1 and destroy",
     "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"},
    {"LOOM_DIRECT_BYTES", "1048576", "bytes per direct buffer (three per rank, one host only)"},
    {"LOOM_DIRECT_STREAM_BYTES", "0",
     "direct all-reduce: copies with streaming (non-temporal) stores from this many bytes (0: 64 "
     "KiB on AMD CPUs, 64 MiB on others); the output streams from 8 MiB where this is 1 MiB or "
     "less, else 16 MiB, divided by the ranks a core runs (out of place only)"},
    {"LOOM_DIRECT_STREAM_OUTPUT_BYTES", "0",
     "direct all-reduce: the output (out of place) streams from this many bytes, counted over "
     "the ranks a core runs (0: by LOOM_DIRECT_STREAM_BYTES, as above)"},
    {"LOOM_DIRECT_SYM_MAX", "-1",
     "direct all-reduce: every rank reduces the whole message up to this many bytes (-1: 64 KiB "
     "divided by the number of ranks)"},
    {"LOOM_TOPO_FILE", "",
     "read this host's topology from this file (NCCL topology XML or hwloc XML) instead of "
     "detecting it",
     "NCCL_TOPO_FILE", true},
    {"LOOM_TOPO_DUMP_FILE", "",
     "write the topology detected (or loaded) to this file, in NCCL's schema",
     "NCCL_TOPO_DUMP_FILE", true},
    {"LOOM_TOPO_DISABLE", "0",
     "1: communicators neither detect nor merge the hosts' topology (no system graph)"},
    {"LOOM_CUDA_IPC_DISABLE", "0",
     "1: all-reduces on device buffers stage through host memory even when every rank shares "
     "the host (no cuda_ipc kernels)",
     "NCCL_P2P_DISABLE", true},
    {"LOOM_CUDA_IPC_BYTES", "67108864",
     "bytes of GPU memory per rank for the cuda_ipc all-reduce (two halves; larger messages go "
     "in chunks)"},
};

std::atomic<bool> gNcclNames{false};

const char* raw(const char* name) {
  const char* v = std::getenv(name);
  if (v != nullptr && *v != '\0') return v;
  for (const Var& var : kVars) {
    if (std::string(var.name) != name) continue;
    if (var.ncclValues && gNcclNames.load(std::memory_order_relaxed)) {
      v = std::getenv(var.nccl);
      if (v != nullptr && *v != '\0') return v;
    }
    return var.deflt;
  }
  return "";
}

int64_t defaultInt(const char* name) {
  for (const Var& var : kVars)
    if (std::string(var.name) == name) return std::strtoll(var.deflt, nullptr, 0);
  return 0;
}

int64_t toInt(const char* name) {
  const char* v = raw(name);
  char* end = nullptr;
  long long x = std::strtoll(v, &end, 0);
  if (end == v || *end != '\0') {
    LOOM_WARN(kEnv, "%s=%s is not an integer; ignoring it", name, v);
    return defaultInt(name);
  }
  return x;
}

// name's value, taken into [lo, hi] with a warning where it lies outside.
int64_t toIntIn(const char* name, int64_t lo, int64_t hi) {
  const int64_t v = toInt(name);
  if (v >= lo && v <= hi) return v;
  const int64_t taken = v < lo ? lo : hi;
  LOOM_WARN(kEnv, "%s=%lld is outside [%lld, %lld]; taking %lld", name, static_cast<long long>(v),
            static_cast<long long>(lo), static_cast<long long>(hi), static_cast<long long>(taken));
  return taken;
}

}  // namespace

#define LOOM_ENV_STRING(fn, name)               \
  const std::string& fn() {                     \
    static const std::string value = raw(name); \
    return value;                               \
  }
#define LOOM_ENV_INT(fn, name)                \
  int64_t fn() {                              \
    static const int64_t value = toInt(name); \
    return value;                             \
  }

LOOM_ENV_STRING(debugLevel, "LOOM_DEBUG")
LOOM_ENV_STRING(debugSubsys, "LOOM_DEBUG_SUBSYS")
LOOM_ENV_STRING(debugFile, "LOOM_DEBUG_FILE")
LOOM_ENV_STRING(commId, "LOOM_COMM_ID")
LOOM_ENV_STRING(commSecret, "LOOM_COMM_SECRET")
LOOM_ENV_STRING(rankText, "LOOM_RANK")
LOOM_ENV_STRING(worldSizeText, "LOOM_WORLD_SIZE")
LOOM_ENV_STRING(commPort, "LOOM_COMM_PORT")
LOOM_ENV_STRING(socketIfname, "LOOM_SOCKET_IFNAME")
LOOM_ENV_INT(socketBufferBytes, "LOOM_SOCKET_BUFFER_BYTES")
LOOM_ENV_STRING(scheduleDump, "LOOM_SCHEDULE_DUMP")
LOOM_ENV_STRING(algo, "LOOM_ALGO")
LOOM_ENV_STRING(proto, "LOOM_PROTO")
LOOM_ENV_INT(directBytes, "LOOM_DIRECT_BYTES")
LOOM_ENV_INT(flightRecorder, "LOOM_FLIGHT_RECORDER")
LOOM_ENV_STRING(traceDir, "LOOM_TRACE_DIR")
LOOM_ENV_STRING(injectDelay, "LOOM_INJECT_DELAY")
LOOM_ENV_INT(directSymMax, "LOOM_DIRECT_SYM_MAX")
LOOM_ENV_INT(directStreamBytes, "LOOM_DIRECT_STREAM_BYTES")
LOOM_ENV_INT(directStreamOutputBytes, "LOOM_DIRECT_STREAM_OUTPUT_BYTES")
LOOM_ENV_STRING(topoFile, "LOOM_TOPO_FILE")
LOOM_ENV_STRING(tunerTable, "LOOM_TUNER_TABLE")
LOOM_ENV_STRING(tunerCache, "LOOM_TUNER_CACHE")
LOOM_ENV_STRING(topoDumpFile, "LOOM_TOPO_DUMP_FILE")
bool topoDisable() {
  static const bool value = toInt("LOOM_TOPO_DISABLE") != 0;
  return value;
}
int64_t timeoutMs() {
  // Deadlines are nanoseconds in 64 bits, and a configuration's timeout is an int: a longer
  // wait (about 24.8 days) is taken as that, not overflowed into none. No wait at all is not a
  // timeout either (every rendezvous would fail, saying something else): it is ignored.
  static const int64_t value = [] {
    const int64_t v = toInt("LOOM_TIMEOUT_MS");
    if (v <= 0) {
      LOOM_WARN(kEnv, "LOOM_TIMEOUT_MS=%lld is not a positive number of ms; ignoring it",
                static_cast<long long>(v));
      return defaultInt("LOOM_TIMEOUT_MS");
    }
    if (v <= INT32_MAX) return v;
    LOOM_WARN(kEnv, "LOOM_TIMEOUT_MS=%lld is more than %d ms; taking %d", static_cast<long long>(v),
              INT32_MAX, INT32_MAX);
    return static_cast<int64_t>(INT32_MAX);
  }();
  return value;
}
bool cudaIpcDisable() {
  static const bool value = toInt("LOOM_CUDA_IPC_DISABLE") != 0;
  return value;
}
LOOM_ENV_INT(cudaIpcBytes, "LOOM_CUDA_IPC_BYTES")
// The transport and the tuner's cost model read the same value.
int64_t slotBytes() {
  static const int64_t value = toIntIn("LOOM_SLOT_BYTES", 4096, int64_t{1} << 26);
  return value;
}
int64_t fifoDepth() {
  // Rings need two slots per link (the verifier proves depth 1 deadlocks).
  static const int64_t value = toIntIn("LOOM_FIFO_DEPTH", 2, 16);
  return value;
}
LOOM_ENV_INT(spinCount, "LOOM_SPIN_COUNT")
LOOM_ENV_INT(yieldCount, "LOOM_YIELD_COUNT")
LOOM_ENV_STRING(net, "LOOM_NET")
LOOM_ENV_STRING(ibHca, "LOOM_IB_HCA")
LOOM_ENV_INT(ibGidIndex, "LOOM_IB_GID_INDEX")
LOOM_ENV_INT(ibTimeout, "LOOM_IB_TIMEOUT")
LOOM_ENV_INT(ibRetryCnt, "LOOM_IB_RETRY_CNT")
bool ibDisable() {
  static const bool value = toInt("LOOM_IB_DISABLE") != 0;
  return value;
}
bool gdrDisable() {
  static const bool value = toInt("LOOM_GDR_DISABLE") != 0;
  return value;
}
bool shmDisable() {
  static const bool value = toInt("LOOM_SHM_DISABLE") != 0;
  return value;
}
bool tunerCalibrate() {
  static const bool value = toInt("LOOM_TUNER_CALIBRATE") != 0;
  return value;
}
bool checkCalls() {
  static const bool value = toInt("LOOM_CHECK_CALLS") != 0;
  return value;
}

std::string markdownTable() {
  std::string t = "| variable | default | meaning | mirrors |\n|---|---|---|---|\n";
  for (const Var& var : kVars) {
    t += std::string("| `") + var.name + "` | " +
         (*var.deflt ? std::string("`") + var.deflt + "`" : "") + " | " + var.doc + " | " +
         (*var.nccl ? std::string("`") + var.nccl + "`" +
                          (var.ncclValues ? " (the NCCL shim reads it)" : "")
                    : "") +
         " |\n";
  }
  return t;
}

void readNcclNames() { gNcclNames.store(true, std::memory_order_relaxed); }

void printAll() {
  static std::once_flag once;
  std::call_once(once, [] {
    for (const Var& var : kVars) LOOM_INFO(kEnv, "%s=%s (%s)", var.name, raw(var.name), var.doc);
  });
}

}  // namespace loom::env
