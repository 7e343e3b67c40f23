#include "util/log.h"

#include <fcntl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include "util/env.h"

namespace loom::log {
namespace {

thread_local int tRank = -1;

struct Config {
  Level level = Level::kWarn;
  unsigned mask = kAll;
  int fd = 2;
  char host[64] = "?";
};

unsigned parseSubsys(const std::string& s) {
  static const struct {
    const char* name;
    unsigned bit;
  } kNames[] = {{"INIT", kInit},
                {"BOOTSTRAP", kBootstrap},
                {"TOPO", kTopo},
                {"TUNE", kTune},
                {"TRANSPORT", kTransport},
                {"EXEC", kExec},
                {"TRACE", kTrace},
                {"ENV", kEnv},
                {"ALL", kAll}};
  bool invert = !s.empty() && s[0] == '^';
  unsigned mask = 0;
  size_t pos = invert ? 1 : 0;
  while (pos <= s.size()) {
    size_t comma = s.find(',', pos);
    std::string tok = s.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    for (auto& n : kNames)
      if (strcasecmp(tok.c_str(), n.name) == 0) mask |= n.bit;
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return invert ? ~mask : mask;
}

const Config& config() {
  static const Config cfg = [] {
    Config c;
    const std::string& lvl = env::debugLevel();
    if (strcasecmp(lvl.c_str(), "NONE") == 0)
      c.level = Level::kNone;
    else if (strcasecmp(lvl.c_str(), "INFO") == 0)
      c.level = Level::kInfo;
    else if (strcasecmp(lvl.c_str(), "TRACE") == 0)
      c.level = Level::kTrace;
    else if (strcasecmp(lvl.c_str(), "VERSION") == 0)  // NCCL_DEBUG's level below WARN
      c.level = Level::kNone;
    else if (strcasecmp(lvl.c_str(), "ABORT") == 0)  // NCCL_DEBUG's level above INFO
      c.level = Level::kInfo;
    else if (strcasecmp(lvl.c_str(), "WARN") != 0)  // the default level stays
      std::fprintf(stderr, "loom: LOOM_DEBUG=%s is not NONE, WARN, INFO or TRACE; taking WARN\n",
                   lvl.c_str());
    c.mask = parseSubsys(env::debugSubsys());
    gethostname(c.host, sizeof(c.host) - 1);
    const std::string& file = env::debugFile();
    if (!file.empty()) {
      std::string path;
      for (size_t i = 0; i < file.size(); ++i) {
        if (file[i] == '%' && i + 1 < file.size() && file[i + 1] == 'h') {
          path += c.host;
          ++i;
        } else if (file[i] == '%' && i + 1 < file.size() && file[i + 1] == 'p') {
          path += std::to_string(getpid());
          ++i;
        } else {
          path += file[i];
        }
      }
      int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
      if (fd >= 0)
        c.fd = fd;
      else
        std::fprintf(stderr, "loom: LOOM_DEBUG_FILE: cannot open %s (%s); logging to stderr\n",
                     path.c_str(), std::strerror(errno));
    }
    return c;
  }();
  return cfg;
}

const char* levelName(Level l) {
  switch (l) {
    case Level::kWarn:
      return "WARN";
    case Level::kInfo:
      return "INFO";
    case Level::kTrace:
      return "TRACE";
    default:
      return "";
  }
}

const char* subsysName(unsigned s) {
  switch (s) {
    case kInit:
      return "INIT";
    case kBootstrap:
      return "BOOTSTRAP";
    case kTopo:
      return "TOPO";
    case kTune:
      return "TUNE";
    case kTransport:
      return "TRANSPORT";
    case kExec:
      return "EXEC";
    case kTrace:
      return "TRACE";
    case kEnv:
      return "ENV";
    default:
      return "ALL";
  }
}

}  // namespace

bool enabled(Level level, unsigned subsys) {
  const Config& c = config();
  return level <= c.level && (c.mask & subsys) != 0;
}

void setThreadRank(int rank) { tRank = rank; }

void write(Level level, unsigned subsys, const char* fmt, ...) {
  const Config& c = config();
  char line[2048];
  int n = std::snprintf(line, sizeof(line), "%s:%d:%ld [%d] %s %s ", c.host, getpid(),
                        static_cast<long>(syscall(SYS_gettid)), tRank, levelName(level),
                        subsysName(subsys));
  va_list ap;
  va_start(ap, fmt);
  int m = std::vsnprintf(line + n, sizeof(line) - n - 1, fmt, ap);
  va_end(ap);
  size_t len = static_cast<size_t>(n) + (m < 0 ? 0 : static_cast<size_t>(m));
  if (len > sizeof(line) - 2) len = sizeof(line) - 2;
  line[len++] = '\n';
  ssize_t w = ::write(c.fd, line, len);
  (void)w;
}

bool flushStdout(const char* prog) {
  const int flushed = std::fflush(stdout);
  const int err = errno;
  if (flushed == 0 && std::ferror(stdout) == 0) return true;
  std::fprintf(stderr, "%s: writing standard output: %s\n", prog,
               flushed != 0 ? std::strerror(err) : "an earlier write failed");
  return false;
}

namespace {
const char* gStdoutProg = nullptr;
}  // namespace

void failExitWhenStdoutIsLost(const char* prog) {
  if (gStdoutProg == nullptr)
    std::atexit([] {
      if (!flushStdout(gStdoutProg)) std::_Exit(1);
    });
  gStdoutProg = prog;
}

}  // namespace loom::log
