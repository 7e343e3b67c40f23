// loom-trace: merges the flight-recorder dumps of a communicator's ranks and
// reports stragglers, skew and hangs; optionally writes a Chrome/Perfetto trace
// and an HTML page. See docs/TRACE.md for the output and the exit codes.
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "analysis.h"
#include "dump.h"
#include "report.h"
#include "util/log.h"

namespace {

using namespace loom::tracetool;

constexpr const char kUsage[] =
    "usage: loom-trace DIR_OR_FILE... [--html OUT.html] [--perfetto OUT.json] [--comm NAME]\n"
    "\n"
    "Reads every rank's flight-recorder dump (a folder contributes its *.json files),\n"
    "groups them by communicator and prints, for each: a straggler table, skew per\n"
    "operation kind and a hang analysis (missing ranks, mismatched operations, ranks\n"
    "stuck in an operation others completed).\n"
    "\n"
    "  --html FILE       also write a self-contained HTML page with a lateness heatmap\n"
    "  --perfetto FILE   also write a Chrome trace-event JSON (ui.perfetto.dev, chrome://tracing)\n"
    "  --comm NAME       only the communicator of this name or hash (or hash prefix)\n"
    "  --max-findings N  print at most N findings of each kind (default 20)\n"
    "\n"
    "exit: 0 consistent, 1 usage or output error, 2 unreadable or malformed input,\n"
    "      3 missing ranks, 4 mismatched operations, 5 stuck or failed operations,\n"
    "      6 ranks without a dump (the most specific finding wins: 4, 3, 5, 6)\n";

struct Options {
  std::vector<std::string> inputs;
  std::string html, perfetto, comm;
  size_t maxFindings = 20;
};

// Parses argv; returns false (after printing why) on a usage error.
bool parseArgs(int argc, char** argv, Options& o, bool& help) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    std::string value;
    const size_t eq = a.find('=');
    const std::string name = a.rfind("--", 0) == 0 && eq != std::string::npos ? a.substr(0, eq) : a;
    auto takeValue = [&]() -> bool {
      if (eq != std::string::npos && name != a) {
        value = a.substr(eq + 1);
      } else if (i + 1 < argc) {
        value = argv[++i];
      } else {
        std::cerr << "loom-trace: " << name << " needs a value\n";
        return false;
      }
      return true;
    };
    if (a == "-h" || a == "--help") {
      help = true;
    } else if (name == "--html" || name == "--perfetto" || name == "--comm" ||
               name == "--max-findings") {
      if (!takeValue()) return false;
      // An empty value would silently mean "no file" or "every communicator".
      if (value.empty() && name != "--max-findings") {
        std::cerr << "loom-trace: " << name << " takes "
                  << (name == "--comm" ? "a communicator name or hash" : "a file name")
                  << ", not an empty one\n";
        return false;
      }
      if (name == "--html") o.html = value;
      if (name == "--perfetto") o.perfetto = value;
      if (name == "--comm") o.comm = value;
      if (name == "--max-findings") {
        // strtoul would take "-1" (and " 1", "+1") and wrap it to the largest number.
        char* end = nullptr;
        errno = 0;
        unsigned long n = std::strtoul(value.c_str(), &end, 10);
        if (value.empty() || !std::isdigit(static_cast<unsigned char>(value[0])) || *end != '\0' ||
            errno == ERANGE) {
          std::cerr << "loom-trace: --max-findings takes a whole number, not \"" << value << "\"\n";
          return false;
        }
        o.maxFindings = n;
      }
    } else if (a.size() > 1 && a[0] == '-') {
      std::cerr << "loom-trace: unknown option " << a << "\n";
      return false;
    } else {
      o.inputs.push_back(a);
    }
  }
  if (!help && o.inputs.empty()) {
    std::cerr << "loom-trace: no dump folder or file given\n";
    return false;
  }
  return true;
}

bool writeFile(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  if (!out) {
    std::cerr << "loom-trace: cannot write " << path << ": " << std::strerror(errno) << "\n";
    return false;
  }
  return true;
}

bool matches(const CommTrace& c, const std::string& want) {
  return c.name == want || (!c.hash.empty() && c.hash.rfind(want, 0) == 0);
}

// The exit code over several communicators: the most specific finding of any.
int combine(int a, int b) {
  static const int kOrder[] = {kExitMismatch, kExitMissing, kExitStuck, kExitIncomplete};
  for (int code : kOrder)
    if (a == code || b == code) return code;
  return kExitConsistent;
}

int run(int argc, char** argv) {
  Options opt;
  bool help = false;
  if (!parseArgs(argc, argv, opt, help)) {
    std::cerr << kUsage;
    return kExitUsage;
  }
  if (help) {
    std::cout << kUsage;
    return kExitConsistent;
  }
  LoadResult loaded;
  try {
    loaded = loadDumps(opt.inputs);
  } catch (const TraceInputError& e) {
    std::cerr << "loom-trace: " << e.what() << "\n";
    return kExitBadInput;
  }
  for (const std::string& n : loaded.notes) std::cerr << "loom-trace: note: " << n << "\n";
  std::vector<CommReport> reports;
  for (const CommTrace& c : loaded.comms)
    if (opt.comm.empty() || matches(c, opt.comm)) reports.push_back({&c, analyze(c)});
  if (reports.empty()) {
    std::cerr << "loom-trace: no communicator named \"" << opt.comm << "\"; the dumps hold:";
    for (const CommTrace& c : loaded.comms) std::cerr << " " << c.label();
    std::cerr << "\n";
    return kExitUsage;
  }
  writeText(std::cout, reports, opt.maxFindings);
  std::cout.flush();
  if (!opt.perfetto.empty() && !writeFile(opt.perfetto, perfettoJson(reports))) return kExitUsage;
  if (!opt.html.empty() && !writeFile(opt.html, htmlReport(reports))) return kExitUsage;
  int code = kExitConsistent;
  for (const CommReport& r : reports) code = combine(code, r.analysis.verdict());
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  loom::log::failExitWhenStdoutIsLost("loom-trace");  // exit status 1: an output error
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "loom-trace: internal error: " << e.what() << "\n";
  } catch (...) {
    std::cerr << "loom-trace: internal error\n";
  }
  return kExitBadInput;
}
