// Logging: LOOM_DEBUG=WARN|INFO|TRACE, LOOM_DEBUG_SUBSYS=INIT,BOOTSTRAP,...
// (a leading ^ inverts), LOOM_DEBUG_FILE=path with %h (host) and %p (pid).
// Each line is "host:pid:tid [rank] LEVEL SUBSYS message", written with one
// write() so lines from many ranks do not interleave. Thread safe.
#pragma once

#include <cstdarg>

namespace loom::log {

enum class Level { kNone = 0, kWarn = 1, kInfo = 2, kTrace = 3 };
enum Subsys : unsigned {
  kInit = 1u << 0,
  kBootstrap = 1u << 1,
  kTopo = 1u << 2,
  kTune = 1u << 3,
  kTransport = 1u << 4,
  kExec = 1u << 5,
  kTrace = 1u << 6,
  kEnv = 1u << 7,
  kAll = ~0u
};

bool enabled(Level level, unsigned subsys);
void write(Level level, unsigned subsys, const char* fmt, ...)
    __attribute__((format(printf, 3, 4)));
// The rank shown in this thread's log lines (-1: none).
void setThreadRank(int rank);

// Flushes standard output; false, after saying so on standard error ("prog: writing standard
// output: why"), when what was written to it was lost (a full disk, a closed descriptor).
bool flushStdout(const char* prog);
// For a command-line tool: at exit, after main's own output, the process's status becomes 1
// when its standard output was lost (flushStdout); the status main returned stands otherwise.
void failExitWhenStdoutIsLost(const char* prog);

}  // namespace loom::log

#define LOOM_LOG(level, subsys, ...)                                                   \
  do {                                                                                 \
    if (::loom::log::enabled(::loom::log::Level::level, ::loom::log::subsys))          \
      ::loom::log::write(::loom::log::Level::level, ::loom::log::subsys, __VA_ARGS__); \
  } while (0)
#define LOOM_WARN(subsys, ...) LOOM_LOG(kWarn, subsys, __VA_ARGS__)
#define LOOM_INFO(subsys, ...) LOOM_LOG(kInfo, subsys, __VA_ARGS__)
#define LOOM_TRACE(subsys, ...) LOOM_LOG(kTrace, subsys, __VA_ARGS__)
