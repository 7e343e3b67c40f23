#include "api/calibrate.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <vector>

#include "algorithms/kernels/cpu/reduce.h"
#include "api/api.h"
#include "exec/executor.h"
#include "util/env.h"
#include "util/log.h"
#include "util/wait.h"

namespace loom::api {
namespace {

constexpr size_t kSizes[] = {8, 16384, 131072};  // bytes: latency, then two bandwidth points
constexpr int kWarmup = 3, kTimed = 15;
constexpr size_t kTableBytes = 256;  // the all-gathered text, per rank

// One-way time of `bytes` between this rank and `peer`: the median of kTimed round trips, halved.
// The pinging side sends first; the other answers.
Result<double> pingPong(Comm& comm, int peer, bool pinger, std::vector<char>& buf, size_t bytes) {
  exec::OpArgs op;
  op.name = "calibration";
  op.deadlineNs = nowNs() + comm.options().timeoutMs * 1000000;
  char* const bufs[] = {buf.data()};
  op.group = bufs;
  auto one = [&](bool send) -> Status {
    exec::GroupOp p;
    p.isSend = send;
    p.peer = peer;
    p.buf = buf.data();
    p.bytes = bytes;
    LOOM_ASSIGN(const algo::Schedule* s, exec::groupSchedule(comm, {p}));
    return exec::run(comm, *s, op);
  };
  std::vector<double> us;
  for (int i = 0; i < kWarmup + kTimed; ++i) {
    const int64_t t0 = nowNs();
    LOOM_CHECK(one(pinger));
    LOOM_CHECK(one(!pinger));
    if (i >= kWarmup) us.push_back(static_cast<double>(nowNs() - t0) / 2e3);
  }
  std::nth_element(us.begin(), us.begin() + us.size() / 2, us.end());
  return us[us.size() / 2];
}

// Rank 0's side (pinger) or a partner's: fits the link to `peer` and appends its table line.
Status measure(Comm& comm, int peer, bool pinger, algo::Link link, std::string* table) {
  std::vector<char> buf(kSizes[std::size(kSizes) - 1], 1);
  std::vector<algo::CostSample> samples;
  for (size_t bytes : kSizes) {
    LOOM_ASSIGN(double us, pingPong(comm, peer, pinger, buf, bytes));
    samples.push_back({static_cast<double>(bytes), us});
  }
  if (!pinger) return Status::ok();
  const algo::LinkCost fit = algo::fitLinkCost(samples);
  // beta 0 (a flat fit) would be infinite bandwidth: keep the table's line parseable.
  const double gbps = fit.beta_us_per_byte > 0 ? 1.0 / (fit.beta_us_per_byte * 1e3) : 1000.0;
  char line[96];
  std::snprintf(line, sizeof(line), "%s %.3f %.3f\n", algo::linkName(link), fit.alpha_us, gbps);
  *table += line;
  LOOM_INFO(kTune,
            "calibrated %s with rank %d: %.3f us + %.3f GB/s (one-way: %.2f us at %zu B, %.2f us "
            "at %zu B)",
            algo::linkName(link), peer, fit.alpha_us, gbps, samples.front().us, kSizes[0],
            samples.back().us, kSizes[std::size(kSizes) - 1]);
  return Status::ok();
}

// Every rank pairs up, so that the links are timed under the load of a collective's round, in
// which all ranks send at once (on a host with more ranks than cores, the ranks' turns on the
// cores are part of every message's cost). Hosts are taken in order of their lowest rank and
// their ranks in ascending order: local ranks 2i and 2i + 1 time the host's link, and the
// ranks of local index i on hosts 2k and 2k + 1 the network. The even side pings. Rank 0
// (local 0 of host 0) thus times shared memory with the next rank of its host and the network
// with the lowest rank of the next host.
struct Pairing {
  int intra = -1, inter = -1;  // partners, -1 for none
  bool intraPings = false, interPings = false;
};

Pairing pairUp(const std::vector<int>& hostOf, int me) {
  const std::vector<std::vector<int>> members = algo::hostMembers(hostOf);
  Pairing p;
  for (size_t h = 0; h < members.size(); ++h) {
    auto it = std::find(members[h].begin(), members[h].end(), me);
    if (it == members[h].end()) continue;
    const size_t li = static_cast<size_t>(it - members[h].begin());
    const size_t lp = li ^ 1, hp = h ^ 1;
    if (lp < members[h].size()) p.intra = members[h][lp], p.intraPings = li % 2 == 0;
    if (hp < members.size() && li < members[hp].size())
      p.inter = members[hp][li], p.interPings = h % 2 == 0;
  }
  return p;
}

// ---- The direct all-reduce's forms ----
//
// Each limit is priced between two forms at fixed sizes: LL against symmetric up to the
// window's LL size; the slices form's copies cached against streamed (16-256 KiB, out of place
// and in place); symmetric against slices from 512 bytes, the slices streaming where that
// measure said. At every size the two forms take turns,
// kFormBatches batches of calls each; a form's time is the median of its batches' mean call
// times. Every rank runs the same calls in the same order (the counts are fixed, not taken from
// a rank's own clock); rank 0's times decide (algo::formLimit), and every rank takes its limits.
constexpr size_t kLLSizes[] = {8, 64, 128, 192, 256, 320, 384};
constexpr size_t kSymSizes[] = {512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072};
constexpr size_t kStreamSizes[] = {16384, 32768, 65536, 131072, 262144};
constexpr int kFormBatches = 5;
int callsPerBatch(size_t bytes) { return bytes <= 4096 ? 64 : 32; }
constexpr int kUntimedCalls = 4;

// Slices as the parameters say; Cached and Streamed: slices with every copy others read
// cached or streamed (DirectTuning::streamBytes).
enum class Forced { LL, Symmetric, Slices, Cached, Streamed };

algo::DirectParams forced(algo::DirectParams p, Forced f) {
  p.llMaxBytes = f == Forced::LL ? transport::kLLMaxBytes : 0;
  p.tuning.symmetricFixedBytes = f == Forced::Symmetric ? int64_t{1} << 40 : 0;
  if (f == Forced::Cached || f == Forced::Streamed)
    p.tuning.streamBytes = f == Forced::Streamed ? 0 : SIZE_MAX;
  return p;
}

// A float sum over the communicator, for the calibration's own all-reduces.
exec::OpArgs sumOp(const Comm& comm) {
  exec::OpArgs op;
  op.name = "calibration";
  op.elemSize = sizeof(float);
  op.reducer = kernels::makeReducer(loomFloat32, loomSum, comm.nranks());
  return op;
}

// Runs `calls` calls of `sched`, the communicator's timeout from now.
Status runCalls(Comm& comm, const algo::Schedule& sched, exec::OpArgs& op, int calls) {
  op.deadlineNs = nowNs() + comm.options().timeoutMs * 1000000;
  for (int i = 0; i < calls; ++i) LOOM_CHECK(exec::run(comm, sched, op));
  return Status::ok();
}

// Median per-call time (us) of `bytes` in forms a and b, taking turns.
Result<std::pair<double, double>> timeForms(Comm& comm, const algo::DirectParams& base,
                                            size_t bytes, Forced a, Forced b, const float* in,
                                            float* out) {
  const size_t count = bytes / sizeof(float);
  exec::OpArgs op = sumOp(comm);
  op.sendbuff = in;
  op.recvbuff = out;
  const algo::Schedule sa =
      algo::buildDirectAllReduce(comm.rank(), comm.nranks(), count, forced(base, a));
  const algo::Schedule sb =
      algo::buildDirectAllReduce(comm.rank(), comm.nranks(), count, forced(base, b));
  const int calls = callsPerBatch(bytes);
  std::vector<double> ta, tb;
  auto batch = [&](const algo::Schedule& sched, std::vector<double>* us) -> Status {
    // Untimed calls first: the lines the other form left in the caches move out.
    LOOM_CHECK(runCalls(comm, sched, op, kUntimedCalls));
    const int64_t t0 = nowNs();
    LOOM_CHECK(runCalls(comm, sched, op, calls));
    us->push_back(static_cast<double>(nowNs() - t0) / 1e3 / calls);
    return Status::ok();
  };
  for (int k = 0; k < kFormBatches; ++k) {
    LOOM_CHECK(batch(sa, &ta));
    LOOM_CHECK(batch(sb, &tb));
  }
  std::sort(ta.begin(), ta.end());
  std::sort(tb.begin(), tb.end());
  return std::make_pair(ta[ta.size() / 2], tb[tb.size() / 2]);
}

// The first calls after set-up can run many times slower for some tens of milliseconds
// (docs/journal/perf.md, stop 44: about 20 ms at 8 bytes; 51 us a call against 0.1 us in this
// calibration's first size). The timing starts once rank 0 has warmed up for kWarmupMinNs and
// its last three batches of 8-byte calls were within 1.5 times its best, or after kWarmupMaxNs.
// Its decision reaches every rank through an all-reduce of one word, which only rank 0 sets.
constexpr int64_t kWarmupMinNs = 40'000'000, kWarmupMaxNs = 300'000'000;

Status warmUp(Comm& comm, const algo::DirectParams& base) {
  exec::OpArgs op = sumOp(comm);
  const algo::Schedule sched =
      algo::buildDirectAllReduce(comm.rank(), comm.nranks(), 2, forced(base, Forced::Symmetric));
  float in[2] = {1, 1}, out[2] = {0, 0}, go[2] = {0, 0}, all[2] = {0, 0};
  const int64_t start = nowNs();
  double best = 1e30;
  int steady = 0;
  for (;;) {
    op.sendbuff = in;
    op.recvbuff = out;
    const int64_t t0 = nowNs();
    LOOM_CHECK(runCalls(comm, sched, op, callsPerBatch(8)));
    const double us = static_cast<double>(nowNs() - t0) / 1e3;
    best = std::min(best, us);
    steady = us <= 1.5 * best ? steady + 1 : 0;
    const int64_t spent = nowNs() - start;
    go[0] = comm.rank() == 0 && spent < kWarmupMaxNs && (spent < kWarmupMinNs || steady < 3);
    op.sendbuff = go;
    op.recvbuff = all;
    LOOM_CHECK(runCalls(comm, sched, op, 1));
    if (all[0] == 0) return Status::ok();
  }
}

std::string describe(const std::vector<algo::FormTimes>& times) {
  std::string out;
  char item[64];
  for (const algo::FormTimes& t : times) {
    std::snprintf(item, sizeof(item), " %zu:%.3f/%.3f", t.bytes, t.smallerUs, t.largerUs);
    out += item;
  }
  return out;
}

// Where the slices form's copies start to stream (out of place, or in place where `inPlace`):
// above the last size cached copies kept; at the first size timed where they kept none; at the
// table's size, or above the sizes timed, where they kept them all.
Result<size_t> streamFrom(Comm& comm, algo::DirectParams p, bool inPlace, const float* in,
                          float* out, std::vector<algo::FormTimes>* times) {
  p.inPlace = inPlace;
  for (size_t bytes : kStreamSizes) {
    LOOM_ASSIGN(auto t, timeForms(comm, p, bytes, Forced::Cached, Forced::Streamed,
                                  inPlace ? out : in, out));
    times->push_back({bytes, t.first, t.second});
  }
  const size_t largest = kStreamSizes[std::size(kStreamSizes) - 1];
  const size_t cachedUpTo = algo::formLimit(*times);
  return cachedUpTo == 0        ? kStreamSizes[0]
         : cachedUpTo < largest ? cachedUpTo + 1
                                : std::max(p.tuning.streamBytes, largest + 1);
}

// ---- The limits kept per host (LOOM_TUNER_CACHE) ----
//
// One file per key, "<dir>/direct-<key>.txt", holding the four limits on one line. The key is
// a hash of what the limits depend on: the CPU model, the rank count, the ranks a core, the
// window, the library's version and the parameters the timing starts from. Rank 0 reads it;
// the file is written (through a rename, whole) after a measurement.
std::string cpuModel() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 1);
  return "unknown";
}

std::string cachePath(const Comm& comm, const algo::DirectParams& base) {
  const std::string& dir = env::tunerCache();
  if (dir.empty()) return "";
  char what[512];
  std::snprintf(what, sizeof(what), "%s|%d|%d|%zu|%d|%zu|%zu|%zu|%zu", cpuModel().c_str(),
                comm.nranks(), comm.ranksPerCore(), base.windowBytes, LOOM_VERSION_CODE,
                base.llMaxBytes, base.tuning.streamBytes, base.tuning.symmetricBytes,
                base.tuning.cachedRoundBytes);
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (const char* c = what; *c != 0; ++c)
    h = (h ^ static_cast<unsigned char>(*c)) * 1099511628211ull;
  char name[64];
  std::snprintf(name, sizeof(name), "/direct-%016llx.txt", static_cast<unsigned long long>(h));
  return dir + name;
}

// The four limits from `path`; false if it is missing or not four integers of -1 or more.
bool readLimits(const std::string& path, int64_t out[4]) {
  std::ifstream in(path);
  long long v[4];
  std::string rest;
  if (!(in >> v[0] >> v[1] >> v[2] >> v[3]) || (in >> rest)) return false;
  for (int i = 0; i < 4; ++i) {
    if (v[i] < -1) return false;
    out[i] = v[i];
  }
  return true;
}

void writeLimits(const std::string& path, const int64_t v[4]) {
  mkdir(env::tunerCache().c_str(), 0700);  // the directory, where it does not exist yet
  const std::string tmp = path + ".tmp" + std::to_string(getpid());
  {
    std::ofstream out(tmp);
    out << v[0] << ' ' << v[1] << ' ' << v[2] << ' ' << v[3] << '\n';
    if (!out) {
      LOOM_WARN(kTune, "LOOM_TUNER_CACHE: cannot write %s", tmp.c_str());
      std::remove(tmp.c_str());
      return;
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    LOOM_WARN(kTune, "LOOM_TUNER_CACHE: cannot rename %s to %s: %s", tmp.c_str(), path.c_str(),
              std::strerror(errno));
    std::remove(tmp.c_str());
  }
}

// Installs the limits rank 0 sent (every rank has them) and says so.
void install(Comm& comm, const int64_t v[4], const char* source) {
  Comm::DirectLimits limits;
  limits.llMaxBytes = v[0];
  limits.symmetricMaxBytes = v[1];
  limits.streamBytes = v[2];
  limits.streamInPlaceBytes = v[3];
  comm.setDirectLimits(limits);
  LOOM_INFO(kTune,
            "calibrated direct forms: LL up to %lld B, symmetric up to %lld B, streamed from "
            "%lld B (in place %lld B)%s",
            static_cast<long long>(v[0]), static_cast<long long>(v[1]),
            static_cast<long long>(v[2]), static_cast<long long>(v[3]), source);
}

// Measures the limits on every rank and installs rank 0's (Comm::setDirectLimits), or takes
// them from the host's cache where rank 0 finds them there.
Status calibrateDirect(Comm& comm) {
  const algo::DirectParams base = directBase(comm);
  // Whether rank 0 has them cached: every rank learns it (and them) from one all-gather.
  const std::string path = comm.rank() == 0 ? cachePath(comm, base) : "";
  int64_t cached[5] = {0, -1, -1, -1, -1};  // [0]: 1 when found
  if (!path.empty()) {
    if (readLimits(path, cached + 1))
      cached[0] = 1;
    else if (access(path.c_str(), F_OK) == 0)
      LOOM_WARN(kTune, "LOOM_TUNER_CACHE: %s does not hold four limits; timing the forms again",
                path.c_str());
  }
  std::vector<int64_t> found(5 * static_cast<size_t>(comm.nranks()));
  LOOM_CHECK(comm.bootstrap().allGather(cached, found.data(), sizeof(cached)));
  if (found[0] == 1) {
    install(comm, &found[1], comm.rank() == 0 ? (" (from " + path + ")").c_str() : " (cached)");
    return Status::ok();
  }
  const size_t largest = kStreamSizes[std::size(kStreamSizes) - 1];
  std::vector<float> in(largest / sizeof(float), 1.0f), out(largest / sizeof(float), 0.0f);
  LOOM_CHECK(warmUp(comm, base));
  std::vector<algo::FormTimes> ll, sym, stream, streamInPlace;
  // LL is timed unless LOOM_PROTO rules it out for all-reduce (then no size takes it).
  for (size_t bytes : kLLSizes) {
    if (base.llMaxBytes == 0) break;
    LOOM_ASSIGN(auto t,
                timeForms(comm, base, bytes, Forced::LL, Forced::Symmetric, in.data(), out.data()));
    ll.push_back({bytes, t.first, t.second});
  }
  LOOM_ASSIGN(const size_t from, streamFrom(comm, base, false, in.data(), out.data(), &stream));
  LOOM_ASSIGN(const size_t fromInPlace,
              streamFrom(comm, base, true, in.data(), out.data(), &streamInPlace));
  // The slices form as it will run out of place: streamed from there.
  algo::DirectParams slices = base;
  slices.tuning.streamBytes = from;
  for (size_t bytes : kSymSizes) {
    LOOM_ASSIGN(auto t, timeForms(comm, slices, bytes, Forced::Symmetric, Forced::Slices, in.data(),
                                  out.data()));
    sym.push_back({bytes, t.first, t.second});
  }
  int64_t mine[4] = {static_cast<int64_t>(algo::formLimit(ll)),
                     static_cast<int64_t>(algo::formLimit(sym)), static_cast<int64_t>(from),
                     static_cast<int64_t>(fromInPlace)};
  std::vector<int64_t> all(4 * static_cast<size_t>(comm.nranks()));
  LOOM_CHECK(comm.bootstrap().allGather(mine, all.data(), sizeof(mine)));
  if (comm.rank() == 0) {
    LOOM_INFO(kTune,
              "direct forms timed (bytes:smaller/larger us): LL/symmetric%s; "
              "cached/streamed%s; in place%s; symmetric/slices%s",
              describe(ll).c_str(), describe(stream).c_str(), describe(streamInPlace).c_str(),
              describe(sym).c_str());
    if (!path.empty()) writeLimits(path, mine);
  }
  install(comm, all.data(), "");
  return Status::ok();
}

}  // namespace

Status calibrate(Comm& comm) {
  if (!env::tunerCalibrate() || comm.nranks() < 2) return Status::ok();
  const int n = comm.nranks(), me = comm.rank();
  const Pairing pair = pairUp(comm.hostLayout(), me);
  const algo::Link intra = env::shmDisable() ? comm.netLink() : algo::Link::Shm;
  std::string table;
  // Every pair measures; rank 0's figures become the table.
  if (pair.intra >= 0) LOOM_CHECK(measure(comm, pair.intra, pair.intraPings, intra, &table));
  if (pair.inter >= 0)
    LOOM_CHECK(measure(comm, pair.inter, pair.interPings, comm.netLink(), &table));
  if (me != 0) table.clear();
  // Everyone takes rank 0's table.
  std::vector<char> mine(kTableBytes, 0), all(kTableBytes * static_cast<size_t>(n), 0);
  std::memcpy(mine.data(), table.data(), std::min(table.size(), kTableBytes - 1));
  LOOM_CHECK(comm.bootstrap().allGather(mine.data(), all.data(), kTableBytes));
  const std::string agreed(all.data(), strnlen(all.data(), kTableBytes));
  LOOM_CHECK(comm.setCostTable(agreed));
  // The direct all-reduce's forms, on a communicator whose ranks all share a host.
  return comm.hasDirect() ? calibrateDirect(comm) : Status::ok();
}

}  // namespace loom::api
