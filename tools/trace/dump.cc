#include "dump.h"

#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

namespace loom::tracetool {
namespace {

using nlohmann::json;

constexpr int64_t kI64Max = std::numeric_limits<int64_t>::max();
// Times and clock offsets: within +-2^61 ns (73 years), so that sums and
// differences of two never overflow.
constexpr int64_t kTimeMax = int64_t{1} << 61;
constexpr int64_t kIntMax = std::numeric_limits<int>::max();
constexpr int64_t kIntMin = std::numeric_limits<int>::min();
constexpr int64_t kMaxRanks = 1 << 20;

// Field readers: `where` names the file and the object, for the error text.
[[noreturn]] void bad(const std::string& where, const std::string& key, const std::string& what) {
  throw TraceInputError(where + ": \"" + key + "\" " + what);
}

const json* optionalField(const json& obj, const std::string& key) {
  auto it = obj.find(key);
  return it == obj.end() || it->is_null() ? nullptr : &*it;
}

const json& requiredField(const json& obj, const std::string& key, const std::string& where) {
  const json* v = optionalField(obj, key);
  if (v == nullptr) bad(where, key, "is missing");
  return *v;
}

int64_t asInt64(const json& v, const std::string& where, const std::string& key) {
  if (v.is_number_unsigned()) {
    if (v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      bad(where, key, "is out of range");
    return static_cast<int64_t>(v.get<uint64_t>());
  }
  if (v.is_number_integer()) return v.get<int64_t>();
  bad(where, key, "must be an integer, not " + std::string(v.type_name()));
}

int64_t intField(const json& obj, const std::string& key, const std::string& where,
                 std::optional<int64_t> def, int64_t lo, int64_t hi) {
  const json* v = optionalField(obj, key);
  if (v == nullptr) {
    if (!def) bad(where, key, "is missing");
    return *def;
  }
  int64_t x = asInt64(*v, where, key);
  if (x < lo || x > hi)
    bad(where, key,
        "is " + std::to_string(x) + ", outside " + std::to_string(lo) + ".." + std::to_string(hi));
  return x;
}

std::string stringField(const json& obj, const std::string& key, const std::string& where,
                        const char* def) {
  const json* v = optionalField(obj, key);
  if (v == nullptr) {
    if (def == nullptr) bad(where, key, "is missing");
    return def;
  }
  if (!v->is_string()) bad(where, key, "must be a string, not " + std::string(v->type_name()));
  return v->get<std::string>();
}

int64_t asTime(const json& v, const std::string& where, const std::string& key) {
  const int64_t t = asInt64(v, where, key);
  if (t < -kTimeMax || t > kTimeMax) bad(where, key, "holds a time out of range");
  return t;
}

// Per-rank times, in either form a dump may use: one entry per rank (a time
// or null), or a list of [rank, time] pairs for the ranks known (where a rank
// appears twice, its last time wins). Only the known times are held.
RankTimes timesField(const json& obj, const std::string& key, const std::string& where,
                     int nranks) {
  const json* v = optionalField(obj, key);
  if (v == nullptr) return {};
  if (!v->is_array()) bad(where, key, "must be an array or null");
  // An empty list is the pair form with no rank known.
  const bool pairs =
      v->empty() || std::any_of(v->begin(), v->end(), [](const json& e) { return e.is_array(); });
  std::vector<RankTimes::Entry> out;
  if (!pairs) {
    if (v->size() != static_cast<size_t>(nranks))
      bad(where, key,
          "has " + std::to_string(v->size()) + " entries for " + std::to_string(nranks) + " ranks");
    int r = 0;
    for (const json& t : *v) {
      if (!t.is_null()) out.emplace_back(r, asTime(t, where, key));
      ++r;
    }
    return RankTimes(std::move(out));
  }
  out.reserve(v->size());  // one per pair: the file holds them
  for (const json& e : *v) {
    if (!e.is_array() || e.size() != 2)
      bad(where, key, "mixes [rank, time] pairs with other entries");
    const int64_t r = asInt64(e[0], where, key);
    if (r < 0 || r >= nranks)
      bad(where, key, "names rank " + std::to_string(r) + " of " + std::to_string(nranks));
    if (!e[1].is_null()) out.emplace_back(static_cast<int>(r), asTime(e[1], where, key));
  }
  return RankTimes(std::move(out));
}

bool knownState(const std::string& s) {
  return s == "enqueued" || s == "started" || s == "completed" || s == "failed";
}

OpEntry parseOp(const json& o, const std::string& where, int nranks) {
  if (!o.is_object()) throw TraceInputError(where + ": must be an object");
  OpEntry e;
  e.seq = static_cast<uint64_t>(intField(o, "seq", where, std::nullopt, 0, kI64Max));
  e.tag = static_cast<uint64_t>(intField(o, "tag", where, 0, 0, kI64Max));
  e.coll = stringField(o, "coll", where, nullptr);
  e.algorithm = stringField(o, "algorithm", where, "");
  e.proto = stringField(o, "proto", where, "");
  e.count = static_cast<uint64_t>(intField(o, "count", where, 0, 0, kI64Max));
  e.dtype = static_cast<int>(intField(o, "dtype", where, -1, kIntMin, kIntMax));
  e.op = static_cast<int>(intField(o, "op", where, -1, kIntMin, kIntMax));
  e.root = static_cast<int>(intField(o, "root", where, -1, -1, nranks - 1));
  e.state = stringField(o, "state", where, nullptr);
  e.enterNs = intField(o, "enterNs", where, std::nullopt, -kTimeMax, kTimeMax);
  e.endNs = intField(o, "endNs", where, 0, -kTimeMax, kTimeMax);
  e.waitNs = intField(o, "waitNs", where, 0, 0, kI64Max);
  e.waitPeer = static_cast<int>(intField(o, "waitPeer", where, -1, -1, nranks - 1));
  e.maxWaitNs = intField(o, "maxWaitNs", where, 0, 0, kI64Max);
  e.error = stringField(o, "error", where, "");
  e.arrivals = timesField(o, "arrivals", where, nranks);
  e.firstArrivalNs = timesField(o, "firstArrivalNs", where, nranks);
  return e;
}

bool isRegularFile(const std::string& path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::string readWhole(const std::string& path) {
  // A pipe or device would block the read or never end.
  struct stat st {};
  if (stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode))
    throw TraceInputError(path + ": not a regular file (a dump or a folder of dumps)");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw TraceInputError(path + ": cannot open: " + std::strerror(errno));
  std::stringstream s;
  s << in.rdbuf();
  if (in.bad()) throw TraceInputError(path + ": read error");
  return s.str();
}

bool isDirectory(const std::string& path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

std::vector<std::string> jsonFilesIn(const std::string& dir) {
  std::vector<std::string> out;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) throw TraceInputError(dir + ": cannot open folder: " + std::strerror(errno));
  while (dirent* ent = readdir(d)) {
    std::string n = ent->d_name;
    if (n.size() > 5 && n.compare(n.size() - 5, 5, ".json") == 0 && n[0] != '.' &&
        isRegularFile(dir + "/" + n))
      out.push_back(dir + "/" + n);
  }
  closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

RankDump parseDocument(const std::string& text, const std::string& file);

// Of two dumps of one rank (an explicit dump and an automatic one in the same
// folder), keep the one that saw further, then the one with more operations.
bool better(const RankDump& a, const RankDump& b) {
  uint64_t lastA = a.ops.empty() ? 0 : a.ops.back().seq;
  uint64_t lastB = b.ops.empty() ? 0 : b.ops.back().seq;
  if (lastA != lastB) return lastA > lastB;
  return a.ops.size() > b.ops.size();
}

}  // namespace

RankTimes::RankTimes(std::vector<Entry> entries) : entries_(std::move(entries)) {
  // Ascending rank, the last entry of a rank kept: stable sort, then keep each run's last.
  if (std::adjacent_find(entries_.begin(), entries_.end(), [](const Entry& a, const Entry& b) {
        return a.first >= b.first;
      }) == entries_.end())
    return;  // the usual case: strictly ascending already
  std::stable_sort(entries_.begin(), entries_.end(),
                   [](const Entry& a, const Entry& b) { return a.first < b.first; });
  size_t out = 0;
  for (size_t i = 0; i < entries_.size(); ++i) {
    if (i + 1 < entries_.size() && entries_[i + 1].first == entries_[i].first) continue;
    entries_[out++] = entries_[i];
  }
  entries_.resize(out);
}

MaybeNs RankTimes::at(int rank) const {
  auto it = std::lower_bound(entries_.begin(), entries_.end(), rank,
                             [](const Entry& e, int r) { return e.first < r; });
  return it != entries_.end() && it->first == rank ? MaybeNs(it->second) : std::nullopt;
}

const OpEntry* RankDump::find(uint64_t seq) const {
  auto it = std::lower_bound(ops.begin(), ops.end(), seq,
                             [](const OpEntry& e, uint64_t s) { return e.seq < s; });
  return it != ops.end() && it->seq == seq ? &*it : nullptr;
}

std::string CommTrace::label() const {
  const std::string h = "hash " + (hash.empty() ? std::string("?") : hash);
  return name.empty() ? h : "\"" + name + "\" (" + h + ")";
}

RankDump parseDump(const std::string& text, const std::string& file) {
  try {
    return parseDocument(text, file);
  } catch (const json::exception& e) {  // a check above missed a case: still name the file
    throw TraceInputError(file + ": " + e.what());
  }
}

namespace {
RankDump parseDocument(const std::string& text, const std::string& file) {
  json doc;
  try {
    doc = json::parse(text);
  } catch (const json::parse_error& e) {
    throw NotJsonError(file + ": not valid JSON: " + e.what());
  }
  if (!doc.is_object() || !doc.contains("ops") || !doc.contains("rank"))
    throw NotADumpError(file + ": not a Loom trace dump (no \"rank\" and \"ops\")");
  RankDump d;
  d.file = file;
  d.nranks = static_cast<int>(intField(doc, "nranks", file, std::nullopt, 1, kMaxRanks));
  d.rank = static_cast<int>(intField(doc, "rank", file, std::nullopt, 0, d.nranks - 1));
  d.comm = stringField(doc, "comm", file, "");
  if (const json* h = optionalField(doc, "commHash"); h != nullptr && h->is_number_unsigned()) {
    std::ostringstream o;
    o << std::hex << h->get<uint64_t>();
    d.commHash = o.str();
  } else {
    d.commHash = stringField(doc, "commHash", file, "");
  }
  d.reason = stringField(doc, "reason", file, "");
  d.clockOffsetNs = intField(doc, "clockOffsetNs", file, 0, -kTimeMax, kTimeMax);
  d.clockErrorNs = intField(doc, "clockErrorNs", file, 0, 0, kTimeMax);
  d.lastCompletedSeq =
      static_cast<uint64_t>(intField(doc, "lastCompletedSeq", file, 0, 0, kI64Max));
  const json& ops = requiredField(doc, "ops", file);
  if (!ops.is_array()) bad(file, "ops", "must be an array");
  d.ops.reserve(ops.size());
  size_t unknownState = ops.size();  // the first operation whose state is none of the four
  for (size_t i = 0; i < ops.size(); ++i) {
    d.ops.push_back(parseOp(ops[i], file + ": ops[" + std::to_string(i) + "]", d.nranks));
    if (unknownState == ops.size() && !knownState(d.ops.back().state)) unknownState = i;
  }
  std::stable_sort(d.ops.begin(), d.ops.end(),
                   [](const OpEntry& a, const OpEntry& b) { return a.seq < b.seq; });
  for (size_t i = 1; i < d.ops.size(); ++i)
    if (d.ops[i].seq == d.ops[i - 1].seq)
      throw TraceInputError(file + ": seq " + std::to_string(d.ops[i].seq) + " appears twice");
  // Checked last, so that any other fault of a file is named first. A state the tool does not
  // know is no finding (not "stuck"): the file is from a newer library or is damaged.
  if (unknownState < ops.size())
    bad(file + ": ops[" + std::to_string(unknownState) + "]", "state",
        "is \"" + ops[unknownState]["state"].get<std::string>() +
            "\", not enqueued, started, completed or failed");
  return d;
}
}  // namespace

LoadResult loadDumps(const std::vector<std::string>& paths) {
  LoadResult res;
  std::vector<RankDump> dumps;
  // What the dumps hold: an entry per operation and per known rank time. Each file's share is
  // bounded by its size; this bounds their sum.
  uint64_t held = 0;
  auto keep = [&](RankDump d) {
    for (const OpEntry& e : d.ops) held += 1 + e.arrivals.size() + e.firstArrivalNs.size();
    if (held > kMaxHeldEntries)
      throw TraceInputError(d.file + ": with this dump, the dumps read hold more than " +
                            std::to_string(kMaxHeldEntries) +
                            " operations and per-rank times, more than this tool holds");
    dumps.push_back(std::move(d));
  };
  for (const std::string& p : paths) {
    if (isDirectory(p)) {
      std::vector<std::string> files = jsonFilesIn(p);
      size_t before = dumps.size();
      for (const std::string& f : files) {
        try {
          keep(parseDump(readWhole(f), f));
        } catch (const NotADumpError& e) {
          res.notes.push_back(std::string("skipped ") + e.what());
        } catch (const NotJsonError& e) {
          const std::string name = f.substr(f.rfind('/') + 1);
          if (name.rfind("loom-trace-", 0) == 0) throw;
          res.notes.push_back(std::string("skipped ") + e.what());
        }
      }
      if (dumps.size() == before) throw TraceInputError(p + ": no Loom trace dumps in this folder");
    } else {
      keep(parseDump(readWhole(p), p));
    }
  }
  if (dumps.empty()) throw TraceInputError("no trace dumps given");

  std::map<std::pair<std::string, std::string>, CommTrace> byComm;  // (name, hash)
  std::map<std::string, std::string> nameOfHash;
  // The analysis holds a cell per rank and sequence number any rank recorded (analysis.h):
  // each communicator's sequence numbers so far, ascending.
  std::map<std::string, std::vector<uint64_t>> seqsOfHash;
  for (RankDump& d : dumps) {
    // One communicator is one hash; its name is taken from the first dump.
    auto known = nameOfHash.emplace(d.commHash, d.comm).first;
    CommTrace& c = byComm[{known->second, d.commHash}];
    if (c.nranks == 0) {
      c.name = known->second;
      c.hash = d.commHash;
      c.nranks = d.nranks;
    } else if (c.nranks != d.nranks) {
      throw TraceInputError(d.file + ": says " + std::to_string(d.nranks) + " ranks, but " +
                            "other dumps of communicator " + c.label() + " say " +
                            std::to_string(c.nranks));
    }
    std::vector<uint64_t>& seqs = seqsOfHash[d.commHash];
    std::vector<uint64_t> merged;
    merged.reserve(seqs.size() + d.ops.size());
    std::vector<uint64_t> own;
    own.reserve(d.ops.size());
    for (const OpEntry& e : d.ops) own.push_back(e.seq);
    std::set_union(seqs.begin(), seqs.end(), own.begin(), own.end(), std::back_inserter(merged));
    seqs.swap(merged);
    if (static_cast<uint64_t>(seqs.size()) * static_cast<uint64_t>(c.nranks) > kMaxAnalysisCells)
      throw TraceInputError(d.file + ": with this dump, communicator " + c.label() + " has " +
                            std::to_string(seqs.size()) + " operations x " +
                            std::to_string(c.nranks) + " ranks, more than this tool analyses (" +
                            std::to_string(kMaxAnalysisCells) + " rank-operation cells)");
    if (c.ranks.empty()) c.ranks.resize(static_cast<size_t>(c.nranks));  // checked first
    std::optional<RankDump>& slot = c.ranks[static_cast<size_t>(d.rank)];
    if (slot) {
      const bool replace = better(d, *slot);
      const RankDump& kept = replace ? d : *slot;
      const RankDump& dropped = replace ? *slot : d;
      res.notes.push_back("rank " + std::to_string(d.rank) + " of " + c.label() +
                          " has two dumps; using " + kept.file + ", not " + dropped.file);
      if (replace) slot = std::move(d);
    } else {
      slot = std::move(d);
    }
  }
  for (auto& kv : byComm) res.comms.push_back(std::move(kv.second));
  return res;
}

size_t dtypeSize(int dtype) {
  static const size_t kSizes[] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};
  return dtype >= 0 && dtype < 12 ? kSizes[dtype] : 0;
}

std::string dtypeName(int dtype) {
  static const char* const kNames[] = {"int8", "uint8", "int32", "uint32", "int64",   "uint64",
                                       "fp16", "fp32",  "fp64",  "bf16",   "fp8e4m3", "fp8e5m2"};
  return dtype >= 0 && dtype < 12 ? kNames[dtype] : "dtype" + std::to_string(dtype);
}

std::string redOpName(int op) {
  static const char* const kNames[] = {"sum", "prod", "max", "min", "avg"};
  static const char* const kBitwise[] = {"band", "bor", "bxor"};
  // loomNumOps and loomBand: the tool reads dumps without the library's header.
  constexpr int kNumOps = 5, kBand = 0x40000000;
  if (op >= 0 && op < kNumOps) return kNames[op];
  if (op >= kBand && op < kBand + 3) return kBitwise[op - kBand];
  return op >= kNumOps && op < kBand ? "premulsum" : "op" + std::to_string(op);
}

}  // namespace loom::tracetool
