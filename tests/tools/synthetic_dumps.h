// Synthetic flight-recorder dumps for loom-trace's tests: the test chooses
// every rank's entry times (in rank 0's clock), this writes them the way a rank
// would (its own clock = rank 0's minus its clockOffsetNs) into a temporary
// folder, so the expected results can be computed from the same inputs.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace loomtest {

struct SynthOp {
  uint64_t seq = 0;
  uint64_t tag = 0;  // written as "tag" when not 0
  std::string coll = "allreduce";
  uint64_t count = 1024;
  int dtype = 7;  // fp32
  int op = 0;     // sum
  int root = -1;
  std::string state = "completed";
  int64_t enterNs = 0;  // rank 0's clock
  int64_t endNs = 0;    // rank 0's clock; 0: not ended
  std::string error;
  // Written as "arrivals" when set (rank 0's clock): one entry per rank with
  // nullopt as null, or with pairForm as [rank, time] pairs of the known ones.
  std::optional<std::vector<std::optional<int64_t>>> arrivals;
  bool pairForm = false;
  // Written as "firstArrivalNs" pairs when not empty: (peer, time in rank 0's clock).
  std::vector<std::pair<int, int64_t>> firstArrivals;
  int waitPeer = -1;  // the peer of the longest single wait, and that wait
  int64_t maxWaitNs = 0;
};

struct SynthRank {
  int rank = 0;
  int nranks = 1;
  std::string comm = "synth";
  std::string hash = "00000000000000ab";
  std::string reason = "request";
  int64_t clockOffsetNs = 0;
  int64_t clockErrorNs = 0;
  bool writeClockFields = true;  // false: a dump from before the clock fields existed
  std::vector<SynthOp> ops;
};

inline nlohmann::json toJson(const SynthRank& r) {
  nlohmann::json ops = nlohmann::json::array();
  for (const SynthOp& o : r.ops) {
    nlohmann::json j = {{"seq", o.seq},
                        {"coll", o.coll},
                        {"algorithm", "direct"},
                        {"proto", "LL"},
                        {"count", o.count},
                        {"dtype", o.dtype},
                        {"op", o.op},
                        {"root", o.root},
                        {"state", o.state},
                        {"enterNs", o.enterNs - r.clockOffsetNs},
                        {"endNs", o.endNs == 0 ? 0 : o.endNs - r.clockOffsetNs},
                        {"waitNs", 0},
                        {"waitPeer", o.waitPeer},
                        {"maxWaitNs", o.maxWaitNs},
                        {"lastRank", -1},
                        {"lateNs", 0}};
    if (!o.error.empty()) j["error"] = o.error;
    if (o.tag != 0) j["tag"] = o.tag;
    if (!o.firstArrivals.empty()) {
      nlohmann::json f = nlohmann::json::array();
      for (const auto& [peer, t] : o.firstArrivals) f.push_back({peer, t});
      j["firstArrivalNs"] = f;
    }
    if (o.arrivals) {
      nlohmann::json a = nlohmann::json::array();
      for (size_t q = 0; q < o.arrivals->size(); ++q) {
        const auto& t = (*o.arrivals)[q];
        if (o.pairForm && t) a.push_back({q, *t});
        if (!o.pairForm) a.push_back(t ? nlohmann::json(*t) : nlohmann::json());
      }
      j["arrivals"] = a;
    }
    ops.push_back(j);
  }
  nlohmann::json d = {{"rank", r.rank},        {"nranks", r.nranks}, {"comm", r.comm},
                      {"commHash", r.hash},    {"reason", r.reason}, {"clock", "CLOCK_MONOTONIC"},
                      {"lastCompletedSeq", 0}, {"ops", ops}};
  if (r.writeClockFields) {
    d["clockOffsetNs"] = r.clockOffsetNs;
    d["clockErrorNs"] = r.clockErrorNs;
  }
  return d;
}

// A fresh temporary folder, removed by the destructor.
class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/loom-trace-tool-XXXXXX";
    const char* d = mkdtemp(tmpl);
    path_ = d != nullptr ? d : "/tmp";
  }
  ~TempDir() {
    if (path_ != "/tmp") std::system(("rm -rf '" + path_ + "'").c_str());
  }
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }
  std::string write(const std::string& name, const std::string& text) const {
    std::ofstream(file(name)) << text;
    return file(name);
  }
  // Writes rank r's dump as loom-trace-<hash>-rank<r>.json.
  std::string write(const SynthRank& r) const {
    return write("loom-trace-" + r.hash + "-rank" + std::to_string(r.rank) + ".json",
                 toJson(r).dump());
  }

 private:
  std::string path_;
};

}  // namespace loomtest
