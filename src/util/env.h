// Every environment variable Loom reads is declared once, in env.cc, with a
// one-line description and a typed accessor that caches its first reading.
// LOOM_DEBUG=INFO prints every variable and its value once per process.
#pragma once

#include <cstdint>
#include <string>

namespace loom::env {

// Accessors (cached after the first call; thread safe).
const std::string& debugLevel();     // LOOM_DEBUG
const std::string& debugSubsys();    // LOOM_DEBUG_SUBSYS
const std::string& debugFile();      // LOOM_DEBUG_FILE
const std::string& commId();         // LOOM_COMM_ID
const std::string& commSecret();     // LOOM_COMM_SECRET
const std::string& rankText();       // LOOM_RANK (parsed by loomCommInitFromEnv)
const std::string& worldSizeText();  // LOOM_WORLD_SIZE (parsed by loomCommInitFromEnv)
const std::string& commPort();       // LOOM_COMM_PORT (parsed by loomCommInitFromEnv)
const std::string& socketIfname();   // LOOM_SOCKET_IFNAME
int64_t socketBufferBytes();         // LOOM_SOCKET_BUFFER_BYTES (0: autotuned)
int64_t timeoutMs();                 // LOOM_TIMEOUT_MS
bool shmDisable();                   // LOOM_SHM_DISABLE
bool tunerCalibrate();               // LOOM_TUNER_CALIBRATE
bool checkCalls();                   // LOOM_CHECK_CALLS
int64_t slotBytes();                 // LOOM_SLOT_BYTES
int64_t fifoDepth();                 // LOOM_FIFO_DEPTH
int64_t spinCount();                 // LOOM_SPIN_COUNT
int64_t yieldCount();                // LOOM_YIELD_COUNT
const std::string& net();            // LOOM_NET ("", "IB" or "Socket")
bool ibDisable();                    // LOOM_IB_DISABLE
const std::string& ibHca();          // LOOM_IB_HCA
int64_t ibGidIndex();                // LOOM_IB_GID_INDEX
int64_t ibTimeout();                 // LOOM_IB_TIMEOUT
int64_t ibRetryCnt();                // LOOM_IB_RETRY_CNT
bool gdrDisable();                   // LOOM_GDR_DISABLE
const std::string& scheduleDump();   // LOOM_SCHEDULE_DUMP
const std::string& algo();           // LOOM_ALGO
const std::string& proto();          // LOOM_PROTO
int64_t directBytes();               // LOOM_DIRECT_BYTES
int64_t flightRecorder();            // LOOM_FLIGHT_RECORDER
const std::string& traceDir();       // LOOM_TRACE_DIR
const std::string& injectDelay();    // LOOM_INJECT_DELAY (parsed by src/trace)
int64_t directSymMax();              // LOOM_DIRECT_SYM_MAX (-1: by rank count)
int64_t directStreamBytes();         // LOOM_DIRECT_STREAM_BYTES (0: by CPU)
int64_t directStreamOutputBytes();   // LOOM_DIRECT_STREAM_OUTPUT_BYTES (0: by directStreamBytes)
const std::string& topoFile();       // LOOM_TOPO_FILE
const std::string& tunerTable();     // LOOM_TUNER_TABLE
const std::string& tunerCache();     // LOOM_TUNER_CACHE
const std::string& topoDumpFile();   // LOOM_TOPO_DUMP_FILE
bool topoDisable();                  // LOOM_TOPO_DISABLE
bool cudaIpcDisable();               // LOOM_CUDA_IPC_DISABLE
int64_t cudaIpcBytes();              // LOOM_CUDA_IPC_BYTES

// From here on, a variable that is unset is read from the NCCL variable it mirrors where that
// takes the same values (NCCL_SOCKET_IFNAME for LOOM_SOCKET_IFNAME, and so on; README.md's
// table says which). The NCCL shim calls it as it loads, so that NCCL programs' settings
// apply, read as late as Loom's own (a program's setenv before its first call counts).
void readNcclNames();

// Every declared variable as a markdown table (README.md embeds it).
std::string markdownTable();

// Prints every declared variable at INFO (once per process).
void printAll();

}  // namespace loom::env
