// The executor's memory steps (algorithms/schedule.h): a schedule whose ranks read each other's
// windows (transport/memory.h) in place, as the direct all-reduce does on one host.
//
// Each step body is what the step says and no more; what is worth knowing about speed:
//  * Streaming stores (kStream, kStreamOut) are fenced once, before the next flag is published
//    (or the operation ends), not after each copy.
//  * A wait for the peers' flags records, in the flight recorder, when each peer's data of the
//    first round was first seen (one clock read for the peers ready at the first look), and
//    reads every peer's entry time from its window: the recorder learns who arrived last
//    without an extra message.
//  * Low-latency windows (Schedule::mem.lowLatency): the input and the round number share each
//    cache line, so a poll of a peer's line brings its data. Past the first line's 48 bytes the
//    input goes on in more lines, written first; the first line, published last, is what a
//    blocked peer sleeps on, and once it is seen every other line is too.
#include <algorithm>
#include <cstring>

#include "exec/executor.h"
#include "mem/mem.h"

namespace loom::exec {
namespace {

using algo::Step;
using algo::StepOp;
using transport::WindowHeader;

// counter has reached target (modulo 2^32).
bool reached(const std::atomic<uint32_t>& counter, uint32_t target) {
  return static_cast<int32_t>(counter.load(std::memory_order_acquire) - target) >= 0;
}

// [first, 0, 1, ..., first-1, first+1, ...]: src[first] in front, the rest in order, as
// kernels::reduceMany takes them (it rounds after each combine, as chained reduce() calls
// would).
const void* const* firstInFront(std::vector<const char*>& src, size_t first) {
  if (first != 0)
    std::rotate(src.begin(), src.begin() + static_cast<long>(first),
                src.begin() + static_cast<long>(first) + 1);
  return reinterpret_cast<const void* const*>(src.data());
}

uint32_t postFlag(uint16_t flags) { return (flags & algo::kPost) ? kernels::kPost : 0u; }

class MemoryRun {
 public:
  MemoryRun(Comm& comm, const algo::Schedule& s, const OpArgs& op)
      : comm_(comm),
        s_(s),
        op_(op),
        mc_(*comm.memory()),
        n_(comm.nranks()),
        me_(comm.rank()),
        es_(op.elemSize),
        red_(op.reducer),
        waiter_(comm, op),
        mine_(mc_.header(me_)),
        scratch_(comm.execScratch()),
        baseRound_(comm.memRound()),
        baseBuffer_(comm.memBuffer()),
        enterNs_(op.record != nullptr ? op.record->enterNs.get() : nowNs()) {
    comm.advanceMemRounds(s.mem.rounds);
    scratch_.bufs.resize(static_cast<size_t>(n_));
    if (s.mem.lowLatency) {
      llBytes_ = s.count * es_;
      llFirst_ = std::min(llBytes_, transport::kLLBytes);
      llMore_ = (llBytes_ - llFirst_ + transport::kLLMoreBytes - 1) / transport::kLLMoreBytes;
    }
  }

  Status run(int64_t* doneNs) {
    // The steps' bounds in locals: the flag stores below could alias members, not these.
    const Step* const end = s_.channels[0].data() + s_.channels[0].size();
    for (const Step* it = s_.channels[0].data(); it != end; ++it) {
      const Step& st = *it;
      const uint32_t g = baseRound_ + st.round;
      switch (st.op) {
        case StepOp::MemPut:
          put(st, g);
          if (st.flags & algo::kWithFlag) publish(st, g);
          break;
        case StepOp::MemExpose:
          LOOM_CHECK(expose(st));
          break;
        case StepOp::MemPublish:
          publish(st, g);
          break;
        case StepOp::MemWait:
          LOOM_CHECK(s_.mem.lowLatency ? waitLines(g) : waitPeers(st, g));
          break;
        case StepOp::MemReduce:
          if (s_.mem.lowLatency)
            reduceLines(st, g);
          else
            LOOM_CHECK(reduce(st, g));
          break;
        case StepOp::MemGather:
          LOOM_CHECK(gather(st, g));
          break;
        default:
          return LOOM_ERROR(loomInternalError, comm_.describe() + ": " + op_.name +
                                                   ": a FIFO step in a memory schedule");
      }
    }
    fence();
    // Low latency: the last line came in at lastSeenNs_ (the entry, where every line was in at
    // the first look); what follows it is a few nanoseconds' work, so that time serves as the
    // operation's end too (one clock read fewer).
    if (s_.mem.lowLatency) *doneNs = lastSeenNs_;
    return Status::ok();
  }

 private:
  char* at(const algo::BufRef& ref) const { return bufferAt(op_, ref, 0); }
  // The window buffer of the step's round.
  uint32_t bufferOf(const Step& st) const {
    return (baseBuffer_ + st.round) % transport::kWindowBuffers;
  }
  void fence() {
    if (!fenced_) kernels::streamFence();
    fenced_ = true;
  }
  // Copies bytes, with streaming stores where `stream` (fenced before the next publish).
  void copy(char* dst, const char* src, size_t bytes, bool stream) {
    if (stream) {
      kernels::streamCopy(dst, src, bytes);
      fenced_ = false;
    } else {
      std::memcpy(dst, src, bytes);
    }
  }
  // dst = src, pre-scaled where the step asks and the op has a pre-scale.
  void load(char* dst, const char* src, size_t bytes, const Step& st) {
    if ((st.flags & algo::kPre) && red_.hasScale)
      kernels::reduce(red_, dst, nullptr, src, bytes / es_, kernels::kPre);
    else
      copy(dst, src, bytes, (st.flags & algo::kStream) != 0);
  }

  void put(const Step& st, uint32_t g) {
    const char* src = at(st.src);
    if (!s_.mem.lowLatency) {
      load(mc_.window(me_, bufferOf(st)) + st.dst.offset * es_, src, st.count * es_, st);
      return;
    }
    // Low latency: the more lines first, each with its round; the first line's round is the
    // flag (kWithFlag), published last. Full lines are copied by a constant size (inline
    // moves, not a call).
    const bool scaled = (st.flags & algo::kPre) && red_.hasScale;
    for (size_t i = 0; i < llMore_; ++i) {
      transport::LLMoreLine& more = mine_->llMore[g & 1][i];
      size_t off, len;
      moreRange(i, &off, &len);
      if (!scaled && len == transport::kLLMoreBytes)
        std::memcpy(more.data, src + off, transport::kLLMoreBytes);
      else
        load(more.data, src + off, len, st);
      more.round.store(g, std::memory_order_release);
    }
    transport::LLLine& line = mine_->ll[g & 1];
    line.enterNs = enterNs_;
    if (!scaled && llFirst_ == transport::kLLBytes)
      std::memcpy(line.data, src, transport::kLLBytes);
    else
      load(line.data, src, llFirst_, st);
  }

  void moreRange(size_t i, size_t* off, size_t* len) const {
    *off = llFirst_ + i * transport::kLLMoreBytes;
    *len = std::min(transport::kLLMoreBytes, llBytes_ - *off);
  }

  Status expose(const Step& st) {
    const char* src = at(st.src);
    const mem::Ref in = mem::lookup(src, st.count * es_);
    if (in.token == 0)
      return LOOM_ERROR(loomInternalError, comm_.describe() + ": " + op_.name + " #" +
                                               std::to_string(op_.seq) +
                                               ": the input to expose is not loomMemAlloc memory");
    inputToken_ = in.token;
    inputOffset_ = in.offset;
    return Status::ok();
  }

  void publish(const Step& st, uint32_t g) {
    fence();  // streamed stores land before the flag that says they are there
    if (s_.mem.lowLatency) {
      mc_.publish(mine_->ll[g & 1].round, g);
      return;
    }
    if (st.word == static_cast<uint8_t>(algo::MemWord::Reduced)) {
      mc_.publish(mine_->reduced, g);
      return;
    }
    // Where this round's input is (token 0: in the window), and when this rank entered.
    mine_->inputToken[g & 1] = inputToken_;
    mine_->inputOffset[g & 1] = inputOffset_;
    mine_->enterNs[g & 1] = enterNs_;
    inputToken_ = inputOffset_ = 0;
    mc_.publish(mine_->ready, g);
  }

  // Waits until every peer's counter wordOf(q) reaches target. With `note`, records when each
  // peer's data was first seen here: the peers ready at the first look share one clock read,
  // taken after every look (so never before a peer published), or with `atEntry` this rank's
  // entry time (the low-latency form, whose first look follows its entry by the few stores of
  // its own lines: a rank that finds every peer ready reads no clock after its entry); a peer
  // waited for is timed when its wait ends. With the recorder off, no clock is read.
  template <typename WordOf, typename What>
  Status waitAll(WordOf wordOf, uint32_t target, What what, bool note, bool atEntry = false) {
    std::vector<int>& pending = scratch_.pending;
    pending.clear();
    for (int q = 0; q < n_; ++q)
      if (q != me_ && !reached(*wordOf(q), target)) pending.push_back(q);
    note = note && op_.record != nullptr;
    if (note && pending.size() + 1 < static_cast<size_t>(n_)) {
      const int64_t seenNs = lastSeenNs_ = atEntry ? enterNs_ : nowNs();
      for (int q = 0, k = 0; q < n_; ++q) {
        if (k < static_cast<int>(pending.size()) && pending[static_cast<size_t>(k)] == q) {
          ++k;
          continue;
        }
        if (q != me_) trace::FlightRecorder::noteFirstArrivalAt(op_.record, q, seenNs);
      }
    }
    for (int q : pending) {
      std::atomic<uint32_t>* word = wordOf(q);
      LOOM_CHECK(waiter_.untilWord(
          q, word, &mc_.header(q)->sleepers, [&] { return reached(*word, target); }, what));
      if (note) trace::FlightRecorder::noteFirstArrivalAt(op_.record, q, lastSeenNs_ = nowNs());
    }
    return Status::ok();
  }

  // Every rank's entry time, read from its window once its first round is in.
  template <typename EnterOf>
  void noteArrivals(EnterOf enterOf) {
    if (op_.record == nullptr) return;
    std::vector<int64_t>& enters = scratch_.enters;
    enters.resize(static_cast<size_t>(n_));
    for (int q = 0; q < n_; ++q) enters[static_cast<size_t>(q)] = enterOf(q);
    comm_.recorder().noteArrivals(op_.record, enters);
  }

  // Low latency: waits for every peer's first line of round g.
  Status waitLines(uint32_t g) {
    // Follow each peer's more lines as they land, for at most one wait's polls in all: the
    // wait on the first line below is the one that yields, blocks and times out.
    if (llMore_ > 0) {
      uint64_t polls = comm_.spinCount();
      for (int q = 0; q < n_; ++q)
        for (size_t i = 0; q != me_ && i < llMore_; ++i)
          while (!reached(mc_.header(q)->llMore[g & 1][i].round, g) && polls > 0) {
            --polls;
            cpuRelax();
          }
    }
    LOOM_CHECK(waitAll([&](int q) { return &mc_.header(q)->ll[g & 1].round; }, g,
                       [] { return std::string("low-latency all-reduce"); }, true,
                       /*atEntry=*/true));
    noteArrivals([&](int q) { return mc_.header(q)->ll[g & 1].enterNs; });
    // Every peer has published round g, so each is done reading this rank's lines of round
    // g - 1: they are round g + 1's, taken for writing now, off the next call's critical path.
    prefetchForWrite(&mine_->ll[(g + 1) & 1]);
    for (size_t i = 0; i < llMore_; ++i) prefetchForWrite(&mine_->llMore[(g + 1) & 1][i]);
    return Status::ok();
  }

  Status waitPeers(const Step& st, uint32_t g) {
    const bool ready = st.word == static_cast<uint8_t>(algo::MemWord::Ready);
    const bool first = st.round == 1 && ready;
    LOOM_CHECK(
        waitAll([&](int q) { return ready ? &mc_.header(q)->ready : &mc_.header(q)->reduced; }, g,
                [ready] {
                  return std::string(ready ? "direct all-reduce, waiting for peers' input"
                                           : "direct all-reduce, waiting for peers' slices");
                },
                first));
    if (first) noteArrivals([&](int q) { return mc_.header(q)->enterNs[g & 1]; });
    return Status::ok();
  }

  // Low latency: every rank's lines of round g, reduced in rank order; this rank's own from
  // its send buffer where the step says so (kOwnSrc).
  void reduceLines(const Step& st, uint32_t g) {
    std::vector<const char*>& src = scratch_.bufs;
    const bool ownSrc = (st.flags & algo::kOwnSrc) != 0;
    if (llMore_ == 0) {
      for (int q = 0; q < n_; ++q) src[static_cast<size_t>(q)] = mc_.header(q)->ll[g & 1].data;
    } else {
      // Each rank's lines gathered into one run, for one reduction over all of them. Whole
      // lines are copied (constant sizes, inline moves): the run has room, and the bytes past
      // the count are not reduced.
      std::vector<char>& runs = scratch_.llRuns;
      runs.resize(static_cast<size_t>(n_) * transport::kLLMaxBytes);
      for (int q = 0; q < n_; ++q) {
        if (q == me_ && ownSrc) continue;
        char* run = runs.data() + static_cast<size_t>(q) * transport::kLLMaxBytes;
        const WindowHeader* h = mc_.header(q);
        std::memcpy(run, h->ll[g & 1].data, transport::kLLBytes);
        for (size_t i = 0; i < llMore_; ++i)
          std::memcpy(run + transport::kLLBytes + i * transport::kLLMoreBytes,
                      h->llMore[g & 1][i].data, transport::kLLMoreBytes);
        src[static_cast<size_t>(q)] = run + st.src.offset * es_;
      }
    }
    if (ownSrc) src[static_cast<size_t>(me_)] = bufferAt(op_, {algo::Buf::Send, st.aux}, 0);
    kernels::reduceMany(red_, at(st.dst), firstInFront(src, 0), src.size(), st.count,
                        postFlag(st.flags));
  }

  Status reduce(const Step& st, uint32_t g) {
    std::vector<const char*>& src = scratch_.bufs;
    const uint32_t buffer = bufferOf(st);
    // Each rank's round input: its window, its send buffer (kOwnSrc), or, where it exposed
    // its input (kMayExpose), its loomMemAlloc memory mapped here.
    const size_t from = st.src.offset * es_;
    for (int q = 0; q < n_; ++q) {
      const char*& p = src[static_cast<size_t>(q)];
      if (q == me_ && (st.flags & algo::kOwnSrc)) {
        p = bufferAt(op_, {algo::Buf::Send, st.aux}, 0);
        continue;
      }
      p = mc_.window(q, buffer) + from;
      if (!(st.flags & algo::kMayExpose) || q == me_) continue;
      const WindowHeader* h = mc_.header(q);
      const uint64_t token = h->inputToken[g & 1];
      if (token == 0) continue;
      const uint64_t offset = h->inputOffset[g & 1];
      Result<const char*> base = mem::mapPeer(token, offset + from + st.count * es_);
      if (!base.isOk())
        return base.status().prefix(comm_.describe() + ": rank " + std::to_string(q) +
                                    "'s input: ");
      p = base.value() + offset + from;
    }
    // Into the window, this rank's own contribution first (it may be the destination);
    // elsewhere every rank reduces in rank order, so that all results agree bit for bit.
    const size_t first = st.dst.buf == algo::Buf::Window ? static_cast<size_t>(me_) : 0;
    char* dst = st.dst.buf == algo::Buf::Window ? mc_.window(me_, buffer) + st.dst.offset * es_
                                                : at(st.dst);
    const uint32_t post = postFlag(st.flags);
    if ((st.flags & algo::kStream) && (st.flags & algo::kAlsoOut)) {
      // One pass, streamed from registers to the window (for the peers) and to the output:
      // with streaming stores where the output streams, else with plain ones (in place, the
      // output's lines are the input's, just read). It saves copying a reduced tile out
      // twice.
      const uint32_t copyFlag = (st.flags & algo::kStreamOut) ? 0u : kernels::kCopyCached;
      kernels::reduceManyStream(red_, dst, bufferAt(op_, {algo::Buf::Recv, st.aux}, 0),
                                firstInFront(src, first), src.size(), st.count, post | copyFlag);
      fenced_ = false;
      return Status::ok();
    }
    kernels::reduceMany(red_, dst, firstInFront(src, first), src.size(), st.count, post);
    if (st.flags & algo::kAlsoOut)
      std::memcpy(bufferAt(op_, {algo::Buf::Recv, st.aux}, 0), dst, st.count * es_);
    return Status::ok();
  }

  Status gather(const Step& st, uint32_t g) {
    const bool stream = (st.flags & algo::kStreamOut) != 0;
    const uint32_t buffer = bufferOf(st);
    for (int k = (st.flags & algo::kSkipOwn) ? 1 : 0; k < n_; ++k) {
      const int q = (me_ + k) % n_;
      size_t qo, ql;
      algo::chunkRange(st.count, n_, q, &qo, &ql);
      if (q != me_ && !(st.flags & algo::kNoWait)) {
        WindowHeader* h = mc_.header(q);
        if (!reached(h->reduced, g))
          LOOM_CHECK(waiter_.untilWord(
              q, &h->reduced, &h->sleepers, [&] { return reached(h->reduced, g); },
              [] { return std::string("direct all-reduce, gathering"); }));
      }
      copy(bufferAt(op_, st.dst, qo), mc_.window(q, buffer) + (st.src.offset + qo) * es_, ql * es_,
           stream);
    }
    return Status::ok();
  }

  Comm& comm_;
  const algo::Schedule& s_;
  const OpArgs& op_;
  const transport::MemoryChannel& mc_;
  const int n_, me_;
  const size_t es_;
  const kernels::Reducer& red_;
  Waiter waiter_;
  WindowHeader* mine_;
  Comm::ExecScratch& scratch_;
  const uint32_t baseRound_, baseBuffer_;
  const int64_t enterNs_;
  int64_t lastSeenNs_ = 0;
  bool fenced_ = true;  // no streaming store since the last fence
  uint64_t inputToken_ = 0, inputOffset_ = 0;
  size_t llBytes_ = 0, llFirst_ = 0, llMore_ = 0;
};

}  // namespace

Status runMemory(Comm& comm, const algo::Schedule& schedule, const OpArgs& op, int64_t* doneNs) {
  if (comm.memory() == nullptr)
    return LOOM_ERROR(loomInvalidUsage, comm.describe() + ": " + op.name +
                                            ": a schedule of memory steps needs every rank on "
                                            "this host");
  return MemoryRun(comm, schedule, op).run(doneNs);
}

}  // namespace loom::exec
