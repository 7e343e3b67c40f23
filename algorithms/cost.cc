#include "algorithms/cost.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <fstream>
#include <limits>
#include <queue>
#include <sstream>
#include <unordered_map>

namespace loom::algo {

const char* linkName(Link l) {
  switch (l) {
    case Link::Shm:
      return "shm";
    case Link::Tcp:
      return "tcp";
    case Link::NvLink:
      return "nvlink";
    case Link::Pcie:
      return "pcie";
    case Link::Net:
      return "net";
  }
  return "?";
}

CostModel defaultCostModel() {
  CostModel m;
  auto set = [&m](Link l, double alphaUs, double gbPerS) {
    m.links[static_cast<int>(l)] = {alphaUs, 1.0 / (gbPerS * 1e3)};  // 1 GB/s = 1e3 B/us
  };
  set(Link::Shm, 0.5, 10);
  set(Link::Tcp, 25, 1.5);
  set(Link::NvLink, 2, 150);
  set(Link::Pcie, 3, 20);
  set(Link::Net, 5, 12);
  m.reduce_us_per_byte = 1.0 / 20e3;
  m.memory = {0.15, 1.0 / 20e3, 0};
  // 2 vCPUs, 4 and 8 ranks, 8-byte all-reduces of every form: a wait where two ranks share a
  // core added 2-3.5 us, where four do 7-10 us.
  m.handover_us = 2.5;
  return m;
}

Link LinkMap::between(int a, int b) const {
  if (hostOf.empty()) return intra;
  return hostOf[static_cast<size_t>(a)] == hostOf[static_cast<size_t>(b)] ? intra : inter;
}

int LinkMap::hosts() const {
  std::vector<int> ids(hostOf);
  std::sort(ids.begin(), ids.end());
  return std::max<int>(1, static_cast<int>(std::unique(ids.begin(), ids.end()) - ids.begin()));
}

namespace {

bool reduces(StepOp op) {
  return op == StepOp::RecvReduceSend || op == StepOp::RecvReduceCopy ||
         op == StepOp::RecvReduceCopySend;
}

// One rank's run through its schedule on its own clock.
struct RankRun {
  // Memory steps: when each flag (MemWord) reached each round.
  std::vector<double> published[kNumMemWords];       // by round; -1: not yet
  std::vector<std::pair<uint32_t, uint32_t>> order;  // (step, piece), round-major per channel
  std::vector<uint32_t> channelOf;                   // per order entry
  std::vector<std::vector<size_t>> pieces;           // per channel, per step
  size_t pos = 0;
  double clock = 0;
  bool queued = false;
};

}  // namespace

// When rank q's flag `word` reached `round`, or -1 if it has not yet.
double publishedAt(const RankRun& q, int word, uint32_t round) {
  const std::vector<double>& at = q.published[word];
  return round < at.size() ? at[round] : -1;
}

// Takes memory step st of rank r on its clock; false when it must wait for a peer's publish.
template <typename Enqueue>
bool memoryStep(std::vector<RankRun>& runs, int r, const Step& st, double bytes,
                const CostModel& model, double handover, Enqueue&& enqueue) {
  RankRun& run = runs[static_cast<size_t>(r)];
  const int n = static_cast<int>(runs.size());
  const LinkCost& mem = model.memory;
  // The latest publish of `word` at `round` among the peers (kNoWait: none), or -1 when one
  // has not published yet.
  auto peersAt = [&](int word) {
    double last = 0;
    for (int q = 0; q < n; ++q) {
      if (q == r) continue;
      const double at = publishedAt(runs[static_cast<size_t>(q)], word, st.round);
      if (at < 0) return -1.0;
      last = std::max(last, at);
    }
    return last;
  };
  switch (st.op) {
    case StepOp::MemPut:
    case StepOp::MemPublish: {
      if (st.op == StepOp::MemPut) {
        run.clock += bytes * mem.beta_us_per_byte;
        if (!(st.flags & kWithFlag)) break;
      }
      std::vector<double>& at = run.published[st.word];
      if (at.size() <= st.round) at.resize(st.round + 1, -1);
      at[st.round] = run.clock;
      for (int q = 0; q < n; ++q)
        if (q != r) enqueue(q);
      break;
    }
    case StepOp::MemWait: {
      const double last = peersAt(st.word);
      if (last < 0) return false;
      run.clock = std::max(run.clock, last + mem.alpha_us) + handover;
      break;
    }
    case StepOp::MemReduce:
      // Every other rank's part read across, then combined.
      run.clock += bytes * (n - 1) * (mem.beta_us_per_byte + model.reduce_us_per_byte);
      break;
    case StepOp::MemGather: {
      if (!(st.flags & kNoWait)) {
        const double last = peersAt(static_cast<int>(MemWord::Reduced));
        if (last < 0) return false;
        run.clock = std::max(run.clock, last + mem.alpha_us) + handover;
      }
      run.clock += bytes * mem.beta_us_per_byte;
      break;
    }
    default:
      break;
  }
  return true;
}

double predictUs(const std::vector<Schedule>& schedules, size_t elemSize, const CostModel& model,
                 const LinkMap& links) {
  const int n = static_cast<int>(schedules.size());
  const double handover = links.handoverUs(model);
  std::vector<RankRun> runs(static_cast<size_t>(n));
  size_t steps = 0;
  for (const Schedule& s : schedules)
    for (const auto& ch : s.channels) steps += ch.size();
  const size_t maxPieces =
      std::max(kMaxSimulatedPieces, kMaxSimulatedPieceSteps / std::max<size_t>(steps, 1));
  for (int r = 0; r < n; ++r) {
    RankRun& run = runs[static_cast<size_t>(r)];
    const Schedule& s = schedules[static_cast<size_t>(r)];
    run.pieces.resize(s.channels.size());
    for (size_t c = 0; c < s.channels.size(); ++c) {
      const auto& steps = s.channels[c];
      size_t rounds = 0;
      for (const Step& st : steps) {
        size_t p = stepIsMemory(st.op)
                       ? 1
                       : std::min(numPieces(st.count, elemSize, model.slotBytes), maxPieces);
        run.pieces[c].push_back(p);
        rounds = std::max(rounds, p);
      }
      for (size_t p = 0; p < rounds; ++p)
        for (size_t i = 0; i < steps.size(); ++i)
          if (p < run.pieces[c][i]) {
            run.order.emplace_back(static_cast<uint32_t>(i), static_cast<uint32_t>(p));
            run.channelOf.push_back(static_cast<uint32_t>(c));
          }
    }
  }
  // Arrival times of pieces in flight, per (channel, from, to).
  std::unordered_map<uint64_t, std::deque<double>> fifos;
  auto key = [n](size_t c, int from, int to) {
    return (static_cast<uint64_t>(c) * n + static_cast<uint64_t>(from)) * n +
           static_cast<uint64_t>(to);
  };
  // Each host's port to the others, each way: when it is next free. Messages between hosts
  // queue there whichever of the host's ranks sends or receives them.
  std::unordered_map<int, double> egress, ingress;
  // Ranks take steps in order of their clocks (the earliest first), so that messages reach
  // a shared port in about the order they would in time.
  using Entry = std::pair<double, int>;
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> ready;
  auto enqueue = [&](int r) {
    RankRun& run = runs[static_cast<size_t>(r)];
    if (!run.queued && run.pos < run.order.size()) {
      run.queued = true;
      ready.push({run.clock, r});
    }
  };
  for (int r = 0; r < n; ++r) enqueue(r);
  while (!ready.empty()) {
    const auto [at, r] = ready.top();
    ready.pop();
    RankRun& run = runs[static_cast<size_t>(r)];
    run.queued = false;
    const auto [i, p] = run.order[run.pos];
    const size_t c = run.channelOf[run.pos];
    const Step& st = schedules[static_cast<size_t>(r)].channels[c][i];
    size_t start, len;
    pieceRange(st.count, run.pieces[c][i], p, &start, &len);
    const double bytes = static_cast<double>(len * elemSize);
    if (stepIsMemory(st.op)) {
      if (!memoryStep(runs, r, st, bytes, model, handover, enqueue))
        continue;  // a publish queues it
      ++run.pos;
      enqueue(r);
      continue;
    }
    if (stepRecvs(st.op)) {
      auto it = fifos.find(key(c, st.recvPeer, r));
      if (it == fifos.end() || it->second.empty()) continue;  // the sender queues it again
      // A message still in flight: take the step when it lands, after what happens before.
      const double lands = std::max(run.clock, it->second.front());
      if (lands > at && !ready.empty() && ready.top().first < lands) {
        run.queued = true;
        ready.push({lands, r});
        continue;
      }
      run.clock = std::max(run.clock, it->second.front()) +
                  model.link(links.between(st.recvPeer, r)).overhead_us + handover;
      it->second.pop_front();
      enqueue(st.recvPeer);
    }
    if (reduces(st.op) || st.op == StepOp::Copy) run.clock += bytes * model.reduce_us_per_byte;
    if (stepSends(st.op)) {
      const LinkCost& lc = model.link(links.between(r, st.sendPeer));
      const double wire = bytes * lc.beta_us_per_byte;
      run.clock += lc.overhead_us + wire;
      double sent = run.clock;
      const int from = links.hostOf.empty() ? 0 : links.hostOf[static_cast<size_t>(r)];
      const int to = links.hostOf.empty() ? 0 : links.hostOf[static_cast<size_t>(st.sendPeer)];
      if (from != to) {
        double& out = egress[from];
        double& in = ingress[to];
        sent = std::max({sent - wire, out, in}) + wire;
        out = in = sent;
      }
      fifos[key(c, r, st.sendPeer)].push_back(sent + lc.alpha_us);
      enqueue(st.sendPeer);
    }
    ++run.pos;
    enqueue(r);
  }
  double end = 0;
  for (const RankRun& run : runs) {
    if (run.pos < run.order.size()) return std::numeric_limits<double>::infinity();
    end = std::max(end, run.clock);
  }
  return end;
}

namespace {
// Recursive doubling's rounds among n: log2(n'), n' the largest power of two <= n, and two
// more (hand over, hand back) where ranks fold.
double rdRounds(double n) {
  const double pow2 = std::exp2(std::floor(std::log2(n)));
  return std::log2(pow2) + (pow2 < n ? 2 : 0);
}
}  // namespace

namespace {

// The waits for a peer's data each rank makes, as the closed forms below count rounds.
double waitsPerRank(Algo a, Coll coll, double n, double S, double hosts, double slot) {
  const double logn = std::ceil(std::log2(n));
  switch (a) {
    case Algo::Ring:
      return (coll == Coll::AllReduce ? 2 : 1) * (n - 1);
    case Algo::Tree:
      return std::max(1.0, std::ceil(S / 2 / slot)) * 2 * logn;
    case Algo::Rhd: {
      const double pow2 = std::exp2(std::floor(std::log2(n)));
      return (pow2 < n ? 2 : 0) + (coll == Coll::AllReduce ? 2 : 1) * std::log2(pow2);
    }
    case Algo::Rd:
      return rdRounds(n);
    case Algo::Hier:
    case Algo::HierRd: {
      const double m = std::ceil(n / hosts);
      const double inter = hosts <= 1 ? 0 : a == Algo::Hier ? 2 * (hosts - 1) : rdRounds(hosts);
      return 2 * (m - 1) + inter;
    }
    case Algo::Chain:
      return std::max(1.0, std::ceil(S / slot));
    case Algo::Direct:
      return 2;  // the peers' inputs, then (sliced) their reduced slices
  }
  return 0;
}

// The closed forms' time over the links, hand-overs of a shared core aside.
double linkTimeUs(Algo a, Coll coll, int nranks, size_t count, size_t elemSize,
                  const CostModel& model, const LinkMap& links) {
  const double n = nranks;
  if (nranks <= 1) return static_cast<double>(count * elemSize) * model.reduce_us_per_byte;
  const int hosts = links.hosts();
  const LinkCost& worst = model.link(hosts > 1 ? links.inter : links.intra);
  const LinkCost& local = model.link(links.intra);
  // A round's latency: the link's, plus the sender's and the receiver's overhead.
  const double al = worst.alpha_us + 2 * worst.overhead_us, be = worst.beta_us_per_byte,
               red = model.reduce_us_per_byte;
  const double perRank = static_cast<double>(count * elemSize);
  // The buffer a rank reduces or receives in all: count for all-reduce,
  // broadcast and reduce, n blocks of count for the others.
  const bool blocks =
      coll == Coll::AllGather || coll == Coll::ReduceScatter || coll == Coll::AllToAll;
  const double S = blocks ? perRank * n : perRank;
  const double logn = std::ceil(std::log2(n));
  const double slot = static_cast<double>(model.slotBytes);
  switch (a) {
    case Algo::Ring:
      if (coll == Coll::AllReduce) return 2 * (n - 1) * (al + S / n * be) + (n - 1) / n * S * red;
      return (n - 1) * (al + S / n * be) +
             (coll == Coll::ReduceScatter ? (n - 1) / n * S * red : 0);
    case Algo::Tree: {
      // Round-major: each round carries a piece of each half up and down.
      const double half = S / 2, rounds = std::max(1.0, std::ceil(half / slot));
      return rounds * 2 * logn * (al + std::min(half, slot) * be) + S * red;
    }
    case Algo::Rhd: {
      const double pow2 = std::exp2(std::floor(std::log2(n)));
      const double fold = pow2 < n ? 2 * (al + S * be) : 0;
      const double phases = coll == Coll::AllReduce ? 2 : 1;
      return fold + phases * (std::log2(pow2) * al + (pow2 - 1) / pow2 * S * be) +
             (coll == Coll::AllReduce ? S * red : 0);
    }
    case Algo::Rd:
      // log2(n') exchanges of the whole buffer, each reduced; two more where ranks fold.
      return rdRounds(n) * (al + S * be) + std::floor(std::log2(n)) * S * red;
    case Algo::Hier:
    case Algo::HierRd: {
      // Inside each host of m ranks a direct reduce-scatter and all-gather; across the H
      // hosts, each owner's slice (S / m) all-reduced by a ring or by recursive doubling.
      const double m = std::ceil(n / hosts), H = hosts;
      const double intra = 2 * ((m - 1) * (local.alpha_us + 2 * local.overhead_us) +
                                (m - 1) / m * S * local.beta_us_per_byte);
      double inter = 0;
      if (H > 1)
        inter =
            a == Algo::Hier ? 2 * (H - 1) * (al + S / m / H * be) : rdRounds(H) * (al + S / m * be);
      return intra + inter + S * red;
    }
    case Algo::Chain:
      return (n - 1) * al + (S + (n - 2) * std::min(S, slot)) * be +
             (coll == Coll::Reduce ? S * red : 0);
    case Algo::Direct:
      return (n - 1) * (al + S / n * be) + (coll == Coll::AllReduce ? S * red : 0);
  }
  return std::numeric_limits<double>::infinity();
}

}  // namespace

double closedFormUs(Algo a, Coll coll, int nranks, size_t count, size_t elemSize,
                    const CostModel& model, const LinkMap& links) {
  const double t = linkTimeUs(a, coll, nranks, count, elemSize, model, links);
  if (nranks <= 1) return t;
  const bool blocks =
      coll == Coll::AllGather || coll == Coll::ReduceScatter || coll == Coll::AllToAll;
  const double S = static_cast<double>(count * elemSize) * (blocks ? nranks : 1);
  return t + waitsPerRank(a, coll, nranks, S, links.hosts(), static_cast<double>(model.slotBytes)) *
                 links.handoverUs(model);
}

double estimateUs(Algo a, Coll coll, int nranks, size_t count, size_t elemSize,
                  const CostModel& model, const LinkMap& links) {
  if (nranks > kSimulateMaxRanks || !algoBuilds(a, coll))
    return closedFormUs(a, coll, nranks, count, elemSize, model, links);
  std::vector<Schedule> s;
  s.reserve(static_cast<size_t>(nranks));
  for (int r = 0; r < nranks; ++r)
    s.push_back(build(a, coll, r, nranks, 0, count, false, links.hostOf, links.ringOrder));
  return predictUs(s, elemSize, model, links);
}

LinkCost fitLinkCost(const std::vector<CostSample>& samples) {
  LinkCost out;
  if (samples.empty()) return out;
  const double k = static_cast<double>(samples.size());
  double sx = 0, sy = 0;
  for (const CostSample& s : samples) {
    sx += s.bytes;
    sy += s.us;
  }
  const double mx = sx / k, my = sy / k;
  double sxx = 0, sxy = 0;
  for (const CostSample& s : samples) {
    sxx += (s.bytes - mx) * (s.bytes - mx);
    sxy += (s.bytes - mx) * (s.us - my);
  }
  double beta = sxx > 0 ? sxy / sxx : 0;
  if (beta < 0) beta = 0;
  double alpha = my - beta * mx;
  if (alpha < 0) alpha = 0;
  out.alpha_us = alpha;
  out.beta_us_per_byte = beta;
  return out;
}

Status applyCostTable(const std::string& text, const std::string& source, CostModel* model) {
  int lineNo = 0;
  size_t from = 0;
  while (from <= text.size()) {
    size_t end = text.find('\n', from);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(from, end - from);
    from = end + 1;
    ++lineNo;
    const size_t hash = line.find('#');
    if (hash != std::string::npos) line.resize(hash);
    std::istringstream in(line);
    std::string name;
    if (!(in >> name)) continue;
    auto bad = [&](const std::string& why) {
      return LOOM_ERROR(loomInvalidArgument, source + ":" + std::to_string(lineNo) + ": " + why);
    };
    int link = -1;
    for (int l = 0; l < kNumLinks; ++l)
      if (name == linkName(static_cast<Link>(l))) link = l;
    double alpha = 0, gbps = 0, overhead = 0;
    if (name == "reduce") {
      if (!(in >> gbps) || gbps <= 0) return bad("reduce needs a rate in GB/s > 0");
      model->reduce_us_per_byte = 1.0 / (gbps * 1e3);
    } else if (link < 0) {
      return bad("unknown link '" + name + "' (known: shm, tcp, nvlink, pcie, net, reduce)");
    } else {
      if (!(in >> alpha >> gbps) || alpha < 0 || gbps <= 0)
        return bad(name + " needs alpha_us >= 0 and GB/s > 0");
      if (!(in >> overhead)) overhead = 0;
      if (overhead < 0) return bad(name + ": overhead_us must be >= 0");
      model->links[link] = {alpha, 1.0 / (gbps * 1e3), overhead};
    }
    std::string extra;
    if (in >> extra) return bad("unexpected '" + extra + "'");
  }
  return Status::ok();
}

Result<CostModel> tunerCostModel(const std::string& tablePath, int64_t slotBytes) {
  CostModel model = defaultCostModel();
  model.slotBytes = static_cast<size_t>(std::max<int64_t>(slotBytes, 64));
  if (tablePath.empty()) return model;
  std::ifstream in(tablePath);
  if (!in)
    return LOOM_ERROR(loomInvalidArgument, "LOOM_TUNER_TABLE=" + tablePath + ": cannot be read");
  std::ostringstream text;
  text << in.rdbuf();
  LOOM_CHECK(applyCostTable(text.str(), "LOOM_TUNER_TABLE=" + tablePath, &model));
  return model;
}

// ---------------------------------------------------------------------------
// LOOM_ALGO / LOOM_PROTO

Selection::Selection() {
  for (int c = 0; c < kColls; ++c) {
    allowed[c] = ~uint32_t{0};
    restricted[c] = false;
  }
}

namespace {

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t"), e = s.find_last_not_of(" \t");
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

std::string lower(std::string s) {
  for (char& ch : s)
    if (ch >= 'A' && ch <= 'Z') ch = static_cast<char>(ch - 'A' + 'a');
  return s;
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t from = 0;
  for (size_t at; (at = s.find(sep, from)) != std::string::npos; from = at + 1)
    out.push_back(s.substr(from, at - from));
  out.push_back(s.substr(from));
  return out;
}

std::string joined(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& nm : names) out += (out.empty() ? "" : ", ") + nm;
  return out;
}

}  // namespace

Result<Selection> parseSelection(const std::string& text, const char* variable,
                                 const std::vector<std::string>& names) {
  Selection sel;
  auto bad = [&](const std::string& why) {
    return LOOM_ERROR(loomInvalidArgument, std::string(variable) + "=" + text + ": " + why);
  };
  if (trim(text).empty()) return sel;
  for (const std::string& rawEntry : split(text, ';')) {
    std::string entry = trim(rawEntry);
    if (entry.empty()) continue;
    int coll = -1;  // -1: every collective
    const size_t colon = entry.find(':');
    if (colon != std::string::npos) {
      const std::string cn = lower(trim(entry.substr(0, colon)));
      for (int c = 0; c < Selection::kColls; ++c)
        if (cn == collName(static_cast<Coll>(c))) coll = c;
      if (coll < 0)
        return bad("unknown collective '" + cn +
                   "' (known: allreduce, broadcast, reduce, allgather, reducescatter, alltoall)");
      entry = trim(entry.substr(colon + 1));
    }
    const bool exclude = !entry.empty() && entry[0] == '^';
    if (exclude) entry = entry.substr(1);
    uint32_t mask = 0;
    for (const std::string& rawName : split(entry, ',')) {
      const std::string nm = lower(trim(rawName));
      auto it = std::find_if(names.begin(), names.end(),
                             [&](const std::string& k) { return lower(k) == nm; });
      if (it == names.end())
        return bad(nm.empty() ? std::string("empty name in a list")
                              : "unknown name '" + nm + "' (known: " + joined(names) + ")");
      mask |= uint32_t{1} << (it - names.begin());
    }
    if (exclude) mask = ~mask;
    for (int c = 0; c < Selection::kColls; ++c) {
      if (coll >= 0 && c != coll) continue;
      sel.allowed[c] = mask;
      sel.restricted[c] = true;
    }
  }
  return sel;
}

std::vector<std::string> algoNames() {
  std::vector<std::string> out;
  for (int i = 0; i < kNumAlgos; ++i) out.push_back(algoName(static_cast<Algo>(i)));
  return out;
}

std::vector<std::string> protoNames() { return {"ll", "simple"}; }

namespace {
bool spansHosts(const std::vector<int>& hostOf) {
  return std::any_of(hostOf.begin(), hostOf.end(), [&](int h) { return h != hostOf.front(); });
}
}  // namespace

bool portsShared(const std::vector<int>& hostOf) {
  if (!spansHosts(hostOf)) return false;
  std::vector<int> hosts = hostOf;
  std::sort(hosts.begin(), hosts.end());
  return std::adjacent_find(hosts.begin(), hosts.end()) != hosts.end();
}

std::vector<Algo> algosOf(Coll coll) {
  switch (coll) {
    case Coll::AllReduce:
      return {Algo::Direct, Algo::Ring, Algo::Tree, Algo::Rhd, Algo::Rd, Algo::Hier, Algo::HierRd};
    case Coll::AllGather:
    case Coll::ReduceScatter:
      return {Algo::Ring, Algo::Rhd};
    case Coll::Broadcast:
    case Coll::Reduce:
      return {Algo::Chain};
    case Coll::AllToAll:
    case Coll::SendRecv:
      break;
  }
  return {Algo::Direct};
}

std::vector<Algo> tunerCandidates(Coll coll, size_t bytes, bool direct,
                                  const std::vector<int>& hostOf, const Selection& sel) {
  const int ci = static_cast<int>(coll);
  const bool multiHost = spansHosts(hostOf);
  std::vector<Algo> all;
  switch (coll) {
    case Coll::AllReduce:
      if (direct) all.push_back(Algo::Direct);
      all.insert(all.end(), {Algo::Ring, Algo::Tree, Algo::Rhd});
      if (bytes <= kRdMaxBytes || !portsShared(hostOf) ||
          (sel.restricted[ci] && sel.allows(coll, static_cast<int>(Algo::Rd))))
        all.push_back(Algo::Rd);
      // On one host hier is a direct reduce-scatter and all-gather: only when asked for.
      for (Algo h : {Algo::Hier, Algo::HierRd})
        if (multiHost || (sel.restricted[ci] && sel.allows(coll, static_cast<int>(h))))
          all.push_back(h);
      break;
    case Coll::AllGather:
      all = {Algo::Ring, Algo::Rhd};
      break;
    case Coll::ReduceScatter:
      all = {Algo::Ring, Algo::Rhd};
      break;
    case Coll::Broadcast:
    case Coll::Reduce:
      all = {Algo::Chain};
      break;
    case Coll::AllToAll:
    case Coll::SendRecv:  // a group has one schedule (buildGroup)
      all = {Algo::Direct};
      break;
  }
  std::vector<Algo> cands;
  for (Algo a : all)
    if (sel.allows(coll, static_cast<int>(a))) cands.push_back(a);
  return cands.empty() ? all : cands;
}

}  // namespace loom::algo
