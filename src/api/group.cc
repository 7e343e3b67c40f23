// Groups and the running of queued calls.
//
// loomGroupStart/End nest per thread. Calls made inside a group are queued
// and run at the outermost loomGroupEnd: per communicator, its sends and
// receives progress together (so a ring of sends and receives cannot
// deadlock), then its collectives run in call order. Calls on several
// communicators (loomCommInitAll's ranks) run on one thread each, so one
// thread can drive every rank of the process.
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <thread>
#include <tuple>
#include <utility>

#include "algorithms/cost.h"
#include "api/api.h"
#include "api/device.h"
#include "exec/executor.h"
#include "mem/mem.h"
#include "util/env.h"
#include "util/log.h"
#include "util/wait.h"

namespace loom::api {
namespace {

struct GroupState {
  int depth = 0;
  std::vector<Call> calls;
  Status failed;  // the first call of the open group that failed: the group runs none
  std::vector<DeferredInit> inits;  // deferInit's
};
thread_local GroupState tGroup;
// Threads whose group is open: while none is, a call need not look at its thread's group (a
// thread-local's address costs a call into the dynamic linker from a shared library).
std::atomic<int> gThreadsInGroups{0};

void openGroupLevel(GroupState& g) {
  if (g.depth++ == 0) gThreadsInGroups.fetch_add(1, std::memory_order_relaxed);
}
void closeGroupLevel(GroupState& g) {
  if (--g.depth == 0) gThreadsInGroups.fetch_sub(1, std::memory_order_relaxed);
}

bool reduces(algo::Coll coll) {
  return coll == algo::Coll::AllReduce || coll == algo::Coll::Reduce ||
         coll == algo::Coll::ReduceScatter;
}

bool isInPlace(const Comm& comm, const Call& c, size_t esize) {
  const char* s = static_cast<const char*>(c.sendbuff);
  const char* r = static_cast<const char*>(c.recvbuff);
  const size_t rk = static_cast<size_t>(comm.rank());
  switch (c.coll) {
    case algo::Coll::AllGather:
      return s == r + rk * c.count * esize;
    case algo::Coll::ReduceScatter:
      return r == s + rk * c.count * esize;
    default:
      return s == r;
  }
}

void dumpSchedule(const algo::Schedule& s) {
  const std::string& path = env::scheduleDump();
  if (path.empty()) return;
  static std::mutex m;
  std::lock_guard<std::mutex> lock(m);
  if (FILE* f = std::fopen(path.c_str(), "a")) {
    std::fprintf(f, "%s\n", algo::toJson(s).c_str());
    std::fclose(f);
    return;
  }
  static bool warned = false;  // under m
  if (!warned)
    LOOM_WARN(kEnv, "LOOM_SCHEDULE_DUMP: cannot open %s (%s); schedules are not written",
              path.c_str(), std::strerror(errno));
  warned = true;
}

// ---- Tuner ----
//
// Per (collective, size) the tuner picks among the algorithms valid for the
// communicator (algo::tunerCandidates): direct (all-reduce with every rank on this host: no
// FIFO hop, each byte reduced once; the default wherever it exists), ring, tree, rhd, rd
// (small messages), hier (ranks on more than one host), chain (broadcast, reduce) and direct
// all-to-all. LOOM_ALGO narrows the candidates (algo::parseSelection); among
// several, the cost model's prediction for this communicator's host layout
// decides. Decisions are cached per layout (hosts and ring order), collective and power-of-two
// size.

const algo::Selection& selectionFrom(const std::string& text, const char* variable,
                                     const std::vector<std::string>& names) {
  static std::mutex m;
  static std::map<std::string, algo::Selection> parsed;
  std::lock_guard<std::mutex> lock(m);
  auto it = parsed.find(variable);
  if (it != parsed.end()) return it->second;
  Result<algo::Selection> r = algo::parseSelection(text, variable, names);
  if (!r.isOk()) {
    LOOM_WARN(kTune, "%s; ignoring it", r.status().message().c_str());
    return parsed.emplace(variable, algo::Selection()).first->second;
  }
  return parsed.emplace(variable, r.take()).first->second;
}

// Parsed once per process (the variables are read once); no lock after the first call.
const algo::Selection& algoSelection() {
  static const algo::Selection& s = []() -> const algo::Selection& {
    const algo::Selection& sel = selectionFrom(env::algo(), "LOOM_ALGO", algo::algoNames());
    // A collective left none of its algorithms is not narrowed at all: say so (where it has a
    // choice: LOOM_ALGO=ring leaves broadcast its one algorithm, chain, without a word).
    for (int c = 0; c < algo::Selection::kColls; ++c) {
      const auto coll = static_cast<algo::Coll>(c);
      if (algo::algosOf(coll).size() < 2) continue;
      std::string runs;
      bool any = false;
      for (algo::Algo a : algo::algosOf(coll)) {
        any = any || sel.allows(coll, static_cast<int>(a));
        runs += (runs.empty() ? "" : ", ") + std::string(algo::algoName(a));
      }
      if (!any)
        LOOM_WARN(kTune,
                  "LOOM_ALGO=%s leaves %s none of the algorithms it runs (%s); choosing "
                  "among all of them",
                  env::algo().c_str(), algo::collName(coll), runs.c_str());
    }
    return sel;
  }();
  return s;
}
const algo::Selection& protoSelection() {
  static const algo::Selection& s = selectionFrom(env::proto(), "LOOM_PROTO", algo::protoNames());
  return s;
}

// The cost model: defaults, or LOOM_TUNER_TABLE over them (read once; a bad table is
// reported once and the defaults used).
const algo::CostModel& tunerModel() {
  static const algo::CostModel model = [] {
    Result<algo::CostModel> m = algo::tunerCostModel(env::tunerTable(), env::slotBytes());
    if (m.isOk()) return m.take();
    LOOM_WARN(kTune, "%s; using the default costs", m.status().message().c_str());
    return algo::tunerCostModel("", env::slotBytes()).take();
  }();
  return model;
}

// Every candidate priced by the cost model, the direct schedule among them. Choices are kept
// per communicator by (collective, power-of-two size, element size), so a call of a shape seen
// before takes no lock and allocates nothing here; and across communicators of one layout.
algo::Algo chooseAlgo(Comm& comm, algo::Coll coll, size_t count, size_t elemSize,
                      const std::vector<int>& hostOf) {
  using algo::Algo;
  const int ci = static_cast<int>(coll);
  const size_t bytes = count * elemSize;
  int bucket = 0;
  while (bucket < 63 && (size_t{1} << bucket) < bytes) ++bucket;
  const uint64_t mineKey = (static_cast<uint64_t>(ci) << 56) |
                           (static_cast<uint64_t>(bucket) << 48) | (elemSize & 0xffffffffffff);
  auto& mine = comm.choices();
  if (auto it = mine.find(mineKey); it != mine.end()) return it->second;
  const std::vector<Algo> cands =
      algo::tunerCandidates(coll, bytes, comm.hasDirect(), hostOf, algoSelection());
  if (cands.size() == 1) return mine.emplace(mineKey, cands[0]).first->second;
  using Key = std::tuple<int, int, size_t, std::vector<Algo>, int, std::vector<int>,
                         std::vector<int>, std::string, int>;
  const Key key{ci,
                bucket,
                elemSize,
                cands,
                (env::shmDisable() ? 1 : 0) | (comm.netLink() == algo::Link::Net ? 2 : 0),
                hostOf,
                comm.ringOrder(),
                comm.costTable(),
                comm.ranksPerCore()};
  static std::mutex m;
  static std::map<Key, Algo> cache;
  {
    std::lock_guard<std::mutex> lock(m);
    auto it = cache.find(key);
    if (it != cache.end()) return mine.emplace(mineKey, it->second).first->second;
  }
  algo::CostModel model = tunerModel();
  algo::LinkMap links;
  links.hostOf = hostOf;
  links.ringOrder = comm.ringOrder();
  links.intra = env::shmDisable() ? comm.netLink() : algo::Link::Shm;
  links.inter = comm.netLink();
  links.ranksPerCore = comm.ranksPerCore();
  if (comm.netLink() == algo::Link::Net && comm.netGbps() > 0)  // priced from the port's rate
    model.links[static_cast<int>(algo::Link::Net)].beta_us_per_byte =
        1.0 / (comm.netGbps() / 8 * 1e3);
  // Measured at start-up (checked when installed), over everything else.
  if (!comm.costTable().empty())
    (void)algo::applyCostTable(comm.costTable(), "the start-up calibration", &model);
  Algo best = cands[0];
  double bestUs = 0;
  for (Algo a : cands) {
    const double us = algo::estimateUs(a, coll, comm.nranks(), count, elemSize, model, links);
    LOOM_INFO(kTune, "%s of %zu bytes: %s predicted %.1f us", algo::collName(coll), bytes,
              algo::algoName(a), us);
    if (a == cands[0] || us < bestUs) {
      best = a;
      bestUs = us;
    }
  }
  std::lock_guard<std::mutex> lock(m);
  cache.emplace(key, best);
  return mine.emplace(mineKey, best).first->second;
}

// Numbers the operation and starts its record: the one made when a non-blocking communicator
// queued the call (`from` carries it; the timeout then runs from now), else a new one, whose
// entry time also starts the timeout (one clock read for both).
void startOp(Comm& comm, const Call& from, exec::OpArgs& op, size_t count, loomDataType_t dtype,
             int redOp, int root) {
  trace::FlightRecorder& rec = comm.recorder();
  const int64_t timeoutNs = comm.options().timeoutMs * 1000000;
  if (from.seq != 0) {
    op.seq = from.seq;
    op.record = rec.start(from.queued, op.seq, op.name, count, dtype, redOp, root);
    if (from.tag != 0 && op.record != nullptr) op.record->tag = from.tag;
    op.deadlineNs = nowNs() + timeoutNs;
    return;
  }
  op.seq = comm.nextSeq();
  op.record = rec.begin(op.seq, op.name, count, dtype, redOp, root);
  if (from.tag != 0 && op.record != nullptr) op.record->tag = from.tag;
  op.deadlineNs = (op.record != nullptr ? op.record->enterNs.get() : nowNs()) + timeoutNs;
}

// The direct all-reduce's thresholds: the table for this CPU (algorithms/direct.cc), with
// LOOM_DIRECT_STREAM_BYTES, LOOM_DIRECT_STREAM_OUTPUT_BYTES and LOOM_DIRECT_SYM_MAX over it.
const algo::DirectTuning& directTuning() {
  static const algo::DirectTuning tuning = [] {
    algo::CpuVendor vendor = algo::CpuVendor::Other;
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    if (__builtin_cpu_is("amd")) vendor = algo::CpuVendor::Amd;
    if (__builtin_cpu_is("intel")) vendor = algo::CpuVendor::Intel;
#endif
    algo::DirectTuning t = algo::directTuning(vendor);
    if (env::directStreamBytes() > 0) {
      t.streamBytes = static_cast<size_t>(env::directStreamBytes());
      t.streamOutputBytes = algo::streamOutputBytesFor(t.streamBytes);
    }
    if (env::directStreamOutputBytes() > 0)
      t.streamOutputBytes = static_cast<size_t>(env::directStreamOutputBytes());
    t.symmetricFixedBytes = env::directSymMax();
    return t;
  }();
  return tuning;
}

// What the direct all-reduce's schedule depends on. The low-latency form takes up to 384 bytes
// (transport::kLLMaxBytes) where every rank has a core, one line (kLLBytes) where ranks
// outnumber the cores, whose waits are decided by the scheduler and where the lines past the
// first measured slower than the symmetric form (8 ranks on 2 cores); none when LOOM_PROTO
// rules LL out for all-reduce. Limits measured at start-up (Comm::directLimits) replace these
// and the CPU table's symmetric and streaming limits; LOOM_DIRECT_SYM_MAX and
// LOOM_DIRECT_STREAM_BYTES still rule over them.
static_assert(algo::kDirectLLMaxBytes == transport::kLLMaxBytes,
              "the IR's LL size is the window's");
static_assert(algo::kDirectSlots == transport::kWindowBuffers, "the IR's buffers are the window's");

}  // namespace

algo::DirectParams directBase(const Comm& comm) {
  static const bool llAllowed = protoSelection().allows(algo::Coll::AllReduce, algo::kProtoLL);
  algo::DirectParams p;
  p.windowBytes = comm.memory()->windowBytes();
  p.llMaxBytes = !llAllowed ? 0 : comm.outnumbered() ? transport::kLLBytes : transport::kLLMaxBytes;
  p.ranksPerCore = comm.ranksPerCore();
  p.tuning = directTuning();
  const Comm::DirectLimits& measured = comm.directLimits();
  if (llAllowed && measured.llMaxBytes >= 0)
    p.llMaxBytes = std::min(static_cast<size_t>(measured.llMaxBytes), transport::kLLMaxBytes);
  if (p.tuning.symmetricFixedBytes < 0)  // LOOM_DIRECT_SYM_MAX, when set, rules
    p.tuning.symmetricFixedBytes = measured.symmetricMaxBytes;
  return p;
}

namespace {

algo::DirectParams directParams(const Comm& comm, const Call& c, const exec::OpArgs& op,
                                bool inPlace) {
  algo::DirectParams p = directBase(comm);
  p.elemSize = op.elemSize;
  p.scale = op.reducer.hasScale;
  p.inPlace = inPlace;
  // The streaming limit measured at start-up (LOOM_DIRECT_STREAM_BYTES rules).
  const int64_t measuredStream =
      inPlace ? comm.directLimits().streamInPlaceBytes : comm.directLimits().streamBytes;
  if (measuredStream >= 0 && env::directStreamBytes() <= 0) {
    p.tuning.streamBytes = static_cast<size_t>(measuredStream);
    if (env::directStreamOutputBytes() <= 0)
      p.tuning.streamOutputBytes = algo::streamOutputBytesFor(p.tuning.streamBytes);
  }
  // An input in loomMemAlloc memory is read in place by the peers (slices form only).
  const size_t bytes = c.count * op.elemSize;
  if (!p.scale && algo::directForm(bytes, comm.nranks(), p) == algo::DirectForm::Slices)
    p.exposed = mem::lookup(c.sendbuff, bytes).token != 0;
  return p;
}

// Keeps `schedule` as the plan of calls of c's shape (and dumps it where LOOM_SCHEDULE_DUMP
// asks).
void setPlan(Comm& comm, const Call& c, const exec::OpArgs& op, bool inPlace, algo::Algo chosen,
             algo::Schedule schedule, const char* proto) {
  Comm::LastPlan& plan = comm.lastPlan();
  plan.schedule = std::move(schedule);
  dumpSchedule(plan.schedule);
  plan.coll = c.coll;
  plan.count = c.count;
  plan.elemSize = op.elemSize;
  plan.root = c.root;
  plan.inPlace = inPlace;
  plan.scale = plan.exposed = plan.mayExpose = false;
  plan.algo = chosen;
  plan.proto = proto;
  plan.valid = true;
}

// LOOM_CHECK_CALLS: what a rank calls, as the ranks compare it. op is the built-in operation's
// value, kAnyPreMulSum for any PreMulSum one (each rank holds its own handles), -1 where the
// collective reduces nothing; root is -1 where it has none.
struct CallPrint {
  int32_t coll, dtype, op, root;
  uint64_t count;
};
constexpr int32_t kAnyPreMulSum = -2;

CallPrint printOf(const Call& c) {
  CallPrint p{};
  p.coll = static_cast<int32_t>(c.coll);
  p.dtype = c.dtype;
  p.op = !reduces(c.coll) ? -1 : kernels::isBuiltInOp(c.op) ? c.op : kAnyPreMulSum;
  p.root = c.coll == algo::Coll::Broadcast || c.coll == algo::Coll::Reduce ? c.root : -1;
  p.count = c.count;
  return p;
}

std::string describe(const CallPrint& p) {
  std::string s = std::string(algo::collName(static_cast<algo::Coll>(p.coll))) + "(count " +
                  std::to_string(p.count) + ", datatype " + std::to_string(p.dtype);
  if (p.op != -1) s += ", op " + (p.op == kAnyPreMulSum ? "PreMulSum" : std::to_string(p.op));
  if (p.root != -1) s += ", root " + std::to_string(p.root);
  return s + ")";
}

// Every rank learns every rank's call (over the bootstrap ring, apart from the data path) and
// so decides alike: a call that differs from rank 0's on any rank is refused on every rank,
// naming the first argument that differs, and the communicator stays usable.
[[gnu::cold, gnu::noinline]] Status checkCallsAgree(Comm& comm, const Call& c) {
  const int n = comm.nranks();
  const CallPrint mine = printOf(c);
  std::vector<CallPrint> all(static_cast<size_t>(n));
  LOOM_CHECK(comm.bootstrap().allGather(&mine, all.data(), sizeof mine));
  const CallPrint& a = all[0];
  for (int r = 1; r < n; ++r) {
    const CallPrint& b = all[static_cast<size_t>(r)];
    const char* arg = a.coll != b.coll     ? "collective"
                      : a.count != b.count ? "count"
                      : a.dtype != b.dtype ? "datatype"
                      : a.op != b.op       ? "op"
                      : a.root != b.root   ? "root"
                                           : nullptr;
    if (arg != nullptr)
      return LOOM_ERROR(loomInvalidArgument, std::string(arg) +
                                                 ": the ranks' calls differ (LOOM_CHECK_CALLS): "
                                                 "rank 0 calls " +
                                                 describe(a) + ", rank " + std::to_string(r) +
                                                 " calls " + describe(b));
  }
  return Status::ok();
}

Status runCollective(Comm& comm, const Call& c) {
  exec::OpArgs op;
  op.name = algo::collName(c.coll);
  op.sendbuff = c.sendbuff;
  op.recvbuff = c.recvbuff;
  op.elemSize = kernels::typeSize(c.dtype);
  Comm::LastPlan& plan = comm.lastPlan();
  const bool builtIn = reduces(c.coll) && kernels::isBuiltInOp(static_cast<int>(c.op));
  if (builtIn && plan.reducerDtype == static_cast<int>(c.dtype) &&
      plan.reducerOp == static_cast<int>(c.op)) {
    op.reducer = plan.reducer;
  } else {
    LOOM_ASSIGN(op.reducer, reducerFor(comm, c));
    if (builtIn) {
      plan.reducer = op.reducer;
      plan.reducerDtype = static_cast<int>(c.dtype);
      plan.reducerOp = static_cast<int>(c.op);
    }
  }
  trace::FlightRecorder& rec = comm.recorder();
  startOp(comm, c, op, c.count, c.dtype, c.op, c.root);
  // Inside the operation's record, so that a late rank still shows as the late one.
  if (comm.options().checkCalls && comm.nranks() > 1 && !c.staged) {
    Status checked = checkCallsAgree(comm, c);
    if (!checked.isOk()) {
      rec.end(op.record, checked);
      return checked;
    }
  }
  Status s;
  int64_t doneNs = 0;      // the path's own reading of the end time, if it took one
  (void)protoSelection();  // warns once about invalid LOOM_PROTO text
  const std::vector<int>& hostOf = comm.hostLayout();
  // A call of the last call's shape reuses its choice and schedule.
  const bool inPlace = isInPlace(comm, c, op.elemSize);
  const bool same = plan.valid && plan.coll == c.coll && plan.count == c.count &&
                    plan.elemSize == op.elemSize && plan.root == c.root && plan.inPlace == inPlace;
  const algo::Algo chosen =
      same ? plan.algo : chooseAlgo(comm, c.coll, c.count, op.elemSize, hostOf);
  const bool directAllReduce = c.coll == algo::Coll::AllReduce && chosen == algo::Algo::Direct;
  bool rebuild = !same || plan.algo != chosen;
  // The direct schedule also depends on the op's pre-scale and, in the slices form, on
  // whether the input is loomMemAlloc memory; the rest is the call's shape.
  if (directAllReduce && (rebuild || plan.scale != op.reducer.hasScale || plan.mayExpose)) {
    const algo::DirectParams dp = directParams(comm, c, op, inPlace);
    if (rebuild || plan.scale != dp.scale || plan.exposed != dp.exposed) {
      const algo::DirectForm form = algo::directForm(c.count * op.elemSize, comm.nranks(), dp);
      setPlan(comm, c, op, inPlace, chosen,
              algo::buildDirectAllReduce(comm.rank(), comm.nranks(), c.count, dp),
              algo::directFormName(form));
      plan.scale = dp.scale;
      plan.exposed = dp.exposed;
      plan.mayExpose = !dp.scale && form == algo::DirectForm::Slices;
    }
  } else if (rebuild) {
    setPlan(comm, c, op, inPlace, chosen,
            algo::build(chosen, c.coll, comm.rank(), comm.nranks(), c.root, c.count, inPlace,
                        hostOf, comm.ringOrder()),
            "simple");
  }
  const algo::Schedule& sched = plan.schedule;
  if (sched.scratchCount > 0) op.scratch = comm.scratch(sched.scratchCount * op.elemSize);
  if (op.record != nullptr) {
    op.record->algorithm = sched.algorithm;
    op.record->channels = static_cast<int>(sched.channels.size());
    op.record->proto = plan.proto;
  }
  s = exec::run(comm, sched, op, &doneNs);
  rec.end(op.record, s, doneNs);
  if (s.isOk()) comm.publishCompleted(op.seq);
  return s;
}

// A run's failure, other than a refused argument, fails the communicator (its peers learn of it
// through the broken connections).
Status settle(Comm& comm, Status s) {
  if (!s.isOk() && s.code() != loomInvalidArgument) {
    LOOM_WARN(kExec, "%s", s.message().c_str());
    comm.fail(s);
  }
  return s;
}

// Moves a non-blocking communicator's kept receives (exec::progressKept) until untilNs, under
// the operation lock: each that ends ends its operation's record and ticket; a failure fails
// the communicator, as it would have had the operation waited.
void progressKept(Comm& comm, loomComm* h, int64_t untilNs) {
  AsyncWorker* worker = h->worker.get();
  exec::progressKept(comm, untilNs, [&](const Inbox::Receive& r, const Status& s) {
    if (r.record != nullptr && r.record->seq.get() == r.seq) comm.recorder().end(r.record, s);
    worker->finishKept(r.ticket, s);
    (void)settle(comm, s);
  });
}

// The receives runMessages just kept take the running task's ticket; from now on the worker
// (and whoever waits for that ticket) moves them.
void keepReceives(Comm& comm, loomComm* h) {
  int parts = 0;
  for (const Inbox::Receive& r : comm.inbox().kept()) parts += r.ticket == 0;
  const uint64_t ticket = AsyncWorker::keepCurrent(parts);
  for (Inbox::Receive& r : comm.inbox().kept())
    if (r.ticket == 0) r.ticket = ticket;
  h->worker->setProgress([&comm, h](int64_t untilNs) {
    std::unique_lock<FutexMutex> lock(comm.opMutex(), std::defer_lock);
    if (untilNs > nowNs())
      lock.lock();  // a waiter: after the operation that runs
    else if (!lock.try_lock())
      return;  // the worker's look: an operation runs, and looks itself when it ends
    progressKept(comm, h, untilNs);
  });
}

Status runLocked(Comm& comm, CallList calls) {
  LOOM_CHECK(refuseIfFailed(comm));
  std::vector<exec::GroupOp> p2p;
  std::vector<exec::MessageOp> messages;
  const Call* firstP2P = nullptr;
  size_t p2pCalls = 0;
  for (const Call& c : calls) {
    if (c.kind == Call::Collective) continue;
    if (firstP2P == nullptr) firstP2P = &c;
    ++p2pCalls;
    if (c.message) {
      exec::MessageOp m;
      m.isSend = c.kind == Call::Send;
      m.peer = c.root;
      m.tag = c.messageTag;
      m.buf = m.isSend ? const_cast<char*>(static_cast<const char*>(c.sendbuff))
                       : static_cast<char*>(c.recvbuff);
      m.bytes = c.count * kernels::typeSize(c.dtype);
      m.source = c.source;
      messages.push_back(m);
      continue;
    }
    exec::GroupOp o;
    o.isSend = c.kind == Call::Send;
    o.peer = c.root;
    o.buf = o.isSend ? const_cast<char*>(static_cast<const char*>(c.sendbuff))
                     : static_cast<char*>(c.recvbuff);
    o.bytes = c.count * kernels::typeSize(c.dtype);
    p2p.push_back(o);
  }
  Status s;
  if (firstP2P != nullptr) {
    // The group's messages, then its plain sends and receives: one operation in the record.
    exec::OpArgs op;
    op.name = "sendrecv";
    startOp(comm, *firstP2P, op, p2pCalls, loomUint8, 0, -1);
    bool kept = false;
    if (!messages.empty()) {
      s = exec::runMessages(comm, messages, op, AsyncWorker::inTask());
      if (s.code() == loomInProgress) {  // receives kept: the operation ends when they do
        keepReceives(comm, firstP2P->comm);
        kept = true;
        s = Status::ok();
      }
    }
    if (!p2p.empty() && s.isOk()) {
      bool built = false;
      Result<const algo::Schedule*> sched = exec::groupSchedule(comm, p2p, &built);
      if (sched.isOk()) {
        const algo::Schedule& g = *sched.value();
        if (built) dumpSchedule(g);
        std::vector<char*>& bufs = comm.execScratch().groupBufs;
        bufs.clear();
        for (const exec::GroupOp& o : p2p) bufs.push_back(o.buf);
        op.group = bufs.data();
        if (op.record != nullptr) {
          op.record->algorithm = g.algorithm;
          op.record->channels = static_cast<int>(g.channels.size());
        }
        s = exec::run(comm, g, op);
      } else {
        s = sched.status();
      }
    } else if (op.record != nullptr) {
      op.record->algorithm = "messages";
    }
    if (!kept || !s.isOk()) comm.recorder().end(op.record, s);
    if (s.isOk() && !kept) comm.publishCompleted(op.seq);
  }
  for (const Call& c : calls) {
    if (!s.isOk()) break;
    if (c.kind == Call::Collective) s = runCollective(comm, c);
  }
  // Receives kept earlier may have got their messages meanwhile (the executor hands messages to
  // the inbox): their operations end now.
  if (exec::hasKept(comm) && AsyncWorker::inTask()) progressKept(comm, calls[0].comm, 0);
  return settle(comm, std::move(s));
}

}  // namespace

Status refuseIfFailed(const Comm& comm) {
  if (!comm.hasFailed()) return Status::ok();
  Status prior = comm.asyncError();
  return Status(prior.code(),
                comm.describe() + ": communicator failed earlier: " + prior.message());
}

Result<kernels::Reducer> reducerFor(Comm& comm, const Call& c) {
  if (!reduces(c.coll)) return kernels::Reducer{};
  if (kernels::isBuiltInOp(static_cast<int>(c.op)))
    return kernels::makeReducer(c.dtype, c.op, comm.nranks());
  if (c.ownReducer) return c.reducer;
  size_t idx = static_cast<size_t>(c.op) - loomNumOps;
  if (idx >= comm.userOps().size() || !comm.userOps()[idx])
    return LOOM_ERROR(loomInvalidArgument, "op: reduction operation was destroyed");
  kernels::Reducer r = *comm.userOps()[idx];
  if (r.dtype != c.dtype)
    return LOOM_ERROR(loomInvalidArgument, "op: PreMulSum operation was made for another datatype");
  return r;
}

bool inGroup() { return gThreadsInGroups.load(std::memory_order_relaxed) != 0 && tGroup.depth > 0; }

Status runOnComm(Comm& comm, CallList calls) {
  std::lock_guard<FutexMutex> lock(comm.opMutex());
  log::setThreadRank(comm.rank());
  return runLocked(comm, calls);
}

// Calls of one communicator: enqueued on their stream when one involves device memory (after
// which the caller's thread returns at once), else run now, after any staged device calls.
Status runCalls(Comm& comm, CallList calls) {
  for (const Call& c : calls)
    if (device::involvesDevice(c, comm.nranks())) return device::enqueue(comm, calls);
  LOOM_CHECK(device::drain(comm));
  return runOnComm(comm, calls);
}

namespace {

// Non-blocking communicators: the calls run on the communicator's worker, after those queued
// before them. The handle outlives its worker (loomCommDestroy/Abort stop it first).
Status post(loomComm* h, Comm* comm, std::vector<Call> calls) {
  // Numbered and recorded (Enqueued) now, in the order the worker runs them: the group's
  // sends and receives first, as one operation, then its collectives.
  trace::FlightRecorder& rec = comm->recorder();
  size_t p2pCount = 0;
  Call* firstP2P = nullptr;
  for (Call& c : calls)
    if (c.kind != Call::Collective && p2pCount++ == 0) firstP2P = &c;
  if (firstP2P != nullptr) {
    firstP2P->seq = comm->nextSeq();
    firstP2P->queued = rec.enqueue(firstP2P->seq, "sendrecv", p2pCount, loomUint8, 0, -1);
    if (firstP2P->queued != nullptr) firstP2P->queued->tag = firstP2P->tag;
  }
  for (Call& c : calls) {
    if (c.kind != Call::Collective) continue;
    c.seq = comm->nextSeq();
    c.queued = rec.enqueue(c.seq, algo::collName(c.coll), c.count, c.dtype, c.op, c.root);
    if (c.queued != nullptr) c.queued->tag = c.tag;
  }
  h->worker->post([comm, calls = std::move(calls)] { return runCalls(*comm, calls); });
  return inProgress();
}

// One collective of a blocking communicator outside a group: what runCalls and runLocked do
// for a list of it, without walking a list (the per-call account, docs/PERFORMANCE.md).
Status runOne(Comm& comm, const Call& c) {
  if (device::involvesDevice(c, comm.nranks())) return device::enqueue(comm, CallList(c));
  LOOM_CHECK(device::drain(comm));
  std::lock_guard<FutexMutex> lock(comm.opMutex());
  log::setThreadRank(comm.rank());
  LOOM_CHECK(refuseIfFailed(comm));
  return settle(comm, runCollective(comm, c));
}

}  // namespace

namespace {
Status checkSelfPairs(const Comm& comm, CallList calls);
}  // namespace

Status submit(Call& call, Comm* comm) {
  LOOM_CHECK(checkNotFinalized(call.comm));
  call.tag = comm->takeNextTag();
  if (call.kind == Call::Collective && !kernels::isBuiltInOp(static_cast<int>(call.op)) &&
      reduces(call.coll)) {
    LOOM_ASSIGN(call.reducer, reducerFor(*comm, call));
    call.ownReducer = true;
  }
  if (inGroup()) {
    tGroup.calls.push_back(call);
    return Status::ok();
  }
  if (call.kind != Call::Collective) LOOM_CHECK(checkSelfPairs(*comm, CallList(call)));
  if (call.comm->worker) return post(call.comm, comm, std::vector<Call>{call});
  if (call.kind == Call::Collective) return runOne(*comm, call);
  return runCalls(*comm, CallList(call));
}

namespace {

// A rank's untagged sends to itself are its receives from itself, in order: their number and
// sizes must match. Checked for every communicator of a group before any of its calls runs, so
// the refusal is an argument error that leaves the communicators as they were.
Status checkSelfPairs(const Comm& comm, CallList calls) {
  std::vector<size_t> sends, recvs;
  for (const Call& c : calls)
    if ((c.kind == Call::Send || c.kind == Call::Recv) && !c.message && c.root == comm.rank())
      (c.kind == Call::Send ? sends : recvs).push_back(c.count * kernels::typeSize(c.dtype));
  if (sends.size() != recvs.size())
    return LOOM_ERROR(loomInvalidArgument,
                      "peer: " + comm.describe() + ": the group sends " +
                          std::to_string(sends.size()) + " message(s) to this rank itself but " +
                          "receives " + std::to_string(recvs.size()) + " from it");
  for (size_t i = 0; i < sends.size(); ++i)
    if (sends[i] != recvs[i])
      return LOOM_ERROR(loomInvalidArgument,
                        "peer: " + comm.describe() + ": send " + std::to_string(i + 1) +
                            " to this rank itself has " + std::to_string(sends[i]) +
                            " bytes, its receive from itself " + std::to_string(recvs[i]) +
                            " (count * type size)");
  return Status::ok();
}

Status runGroup(std::vector<Call> calls) {
  std::vector<loomComm*> order;
  std::map<loomComm*, std::vector<Call>> byComm;
  for (const Call& c : calls) {
    if (byComm.count(c.comm) == 0) order.push_back(c.comm);
    byComm[c.comm].push_back(c);
  }
  std::vector<Comm*> comms;
  std::vector<PinnedComm> pins;  // held to the end: the calls run on these communicators
  pins.reserve(order.size());
  bool posted = false;
  for (loomComm* h : order) {
    LOOM_ASSIGN(PinnedComm c, lookup(h));
    LOOM_CHECK(checkNotFinalized(h));  // finalized while the group was open
    LOOM_CHECK(checkSelfPairs(*c, byComm[h]));
    comms.push_back(c);
    pins.push_back(std::move(c));
  }
  // Non-blocking communicators take their share to their workers; the rest run here.
  for (size_t i = comms.size(); i-- > 0;) {
    if (!order[i]->worker) continue;
    (void)post(order[i], comms[i], std::move(byComm[order[i]]));
    posted = true;
    comms.erase(comms.begin() + static_cast<long>(i));
    order.erase(order.begin() + static_cast<long>(i));
  }
  if (comms.empty()) return inProgress();
  if (comms.size() == 1) {
    Status s = runCalls(*comms[0], byComm[order[0]]);
    return !s.isOk() || !posted ? s : inProgress();
  }
  std::vector<Status> results(comms.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < comms.size(); ++i)
    threads.emplace_back([&, i] { results[i] = runCalls(*comms[i], byComm[order[i]]); });
  for (auto& t : threads) t.join();
  for (const Status& s : results)
    if (!s.isOk()) return s;
  return posted ? inProgress() : Status::ok();
}

}  // namespace

namespace {

// Runs a group's deferred creations at once, one thread each (they are ranks of one
// communicator that rendezvous with each other), except that those made from one parent run on
// one thread in call order, as every rank calls them (two splits of one communicator pair their
// exchanges in that order); a failed one is marked on its handle. Returns the first failure.
Status runInits(std::vector<DeferredInit>& inits) {
  std::vector<Status> results(inits.size());
  auto run = [&](size_t i) {
    try {
      results[i] = inits[i].init();
    } catch (const std::exception& e) {
      results[i] = LOOM_ERROR(loomInternalError, std::string("initialisation: ") + e.what());
    } catch (...) {
      results[i] = LOOM_ERROR(loomInternalError, "initialisation: unknown exception");
    }
  };
  std::vector<std::vector<size_t>> lanes;  // the creations each thread runs, in call order
  for (size_t i = 0; i < inits.size(); ++i) {
    size_t lane = lanes.size();
    if (inits[i].parent != nullptr)
      for (size_t l = 0; l < lanes.size() && lane == lanes.size(); ++l)
        if (inits[lanes[l][0]].parent == inits[i].parent) lane = l;
    if (lane == lanes.size()) lanes.emplace_back();
    lanes[lane].push_back(i);
  }
  auto runLane = [&](size_t l) {
    for (size_t i : lanes[l]) run(i);
  };
  if (lanes.size() == 1) {
    runLane(0);
  } else {
    std::vector<std::thread> threads;
    for (size_t l = 0; l < lanes.size(); ++l) {
      try {
        threads.emplace_back(runLane, l);
      } catch (const std::exception& e) {  // the started ones time out waiting for these
        for (size_t i : lanes[l])
          results[i] =
              LOOM_ERROR(loomSystemError, std::string("initialisation thread: ") + e.what());
      }
    }
    for (auto& t : threads) t.join();
  }
  Status first;
  for (size_t i = 0; i < inits.size(); ++i) {
    if (results[i].isOk()) continue;
    failInit(inits[i].handle, results[i]);
    if (first.isOk()) first = results[i];
  }
  return first;
}

// Closes one level of this thread's group; the outermost runs the calls queued in it.
Status endGroupLevel() {
  auto& g = tGroup;
  closeGroupLevel(g);
  if (g.depth > 0) return Status::ok();
  std::vector<Call> calls;
  calls.swap(g.calls);
  auto inits = std::move(g.inits);
  g.inits.clear();
  if (!inits.empty()) {
    if (!g.failed.isOk()) {
      for (DeferredInit& d : inits)
        failInit(d.handle, Status(g.failed.code(), "not initialised: a call in its group failed: " +
                                                       g.failed.message()));
    } else if (Status s = runInits(inits); !s.isOk()) {
      if (calls.empty()) return s;
      return Status(s.code(), "a communicator the group made failed, so none of its " +
                                  std::to_string(calls.size()) +
                                  " queued calls ran: " + s.message());
    }
  }
  if (!g.failed.isOk()) {
    Status f = std::move(g.failed);
    g.failed = Status::ok();
    return Status(f.code(), "a call in the group failed, so none of its " +
                                std::to_string(calls.size()) + " queued calls ran: " + f.message());
  }
  if (calls.empty()) return Status::ok();
  return runGroup(std::move(calls));
}

}  // namespace

void deferInit(loomComm* h, std::function<Status()> init, const loomComm* parent) {
  tGroup.inits.push_back(DeferredInit{h, parent, std::move(init)});
}

void failGroup(const Status& s) {
  auto& g = tGroup;
  if (g.depth > 0 && g.failed.isOk()) g.failed = s;
}

loomResult_t callFailed(const char* fn, const Status& s) {
  if (gThreadsInGroups.load(std::memory_order_relaxed) != 0 && s.code() != loomInProgress)
    failGroup(Status(s).prefix(std::string(fn) + ": "));
  return guardFailed(fn, s);
}

Status runAsGroup(const std::function<Status()>& issue) {
  auto& g = tGroup;
  const size_t mark = g.calls.size();
  openGroupLevel(g);
  Status s = issue();
  if (!s.isOk()) {
    g.calls.resize(mark);
    closeGroupLevel(g);
    return s;
  }
  return endGroupLevel();
}

}  // namespace loom::api

using loom::Status;
using loom::api::guard;

extern "C" loomResult_t loomGroupStart(void) {
  return guard("loomGroupStart", [] {
    loom::api::openGroupLevel(loom::api::tGroup);
    return Status::ok();
  });
}

extern "C" loomResult_t loomGroupEnd(void) {
  return guard("loomGroupEnd", [] {
    auto& g = loom::api::tGroup;
    if (g.depth == 0) return LOOM_ERROR(loomInvalidUsage, "no matching loomGroupStart");
    return loom::api::endGroupLevel();
  });
}
