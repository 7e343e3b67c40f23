#include "exec/shm_direct.h"

#include <algorithm>
#include <cstring>

#include "algorithms/schedule.h"
#include "mem/mem.h"
#include "transport/shm/shm_setup.h"
#include "util/env.h"

namespace loom::exec {
namespace {

using transport::ShmDirectHeader;

// counter has reached target (modulo 2^32).
bool reached(const std::atomic<uint32_t>& counter, uint32_t target) {
  return static_cast<int32_t>(counter.load(std::memory_order_acquire) - target) >= 0;
}

void publish(std::atomic<uint32_t>& word, ShmDirectHeader* h, uint32_t value) {
  word.store(value, std::memory_order_seq_cst);
  if (h->sleepers.load(std::memory_order_seq_cst) != 0) futexWakeAll(&word);
}

// [first, 0, 1, ..., first-1, first+1, ...]: src[first] in front, the rest in order, as
// kernels::reduceMany takes them (it rounds after each combine, as chained reduce() calls
// would).
const void* const* firstInFront(std::vector<const char*>& src, size_t first) {
  std::rotate(src.begin(), src.begin() + static_cast<long>(first),
              src.begin() + static_cast<long>(first) + 1);
  return reinterpret_cast<const void* const*>(src.data());
}

// dst = post(src[first] (+) every other src, in index order), in one pass. dst may alias
// src[first] but no other source. Reorders src.
void reduceAll(const kernels::Reducer& red, char* dst, std::vector<const char*>& src, size_t first,
               size_t len) {
  kernels::reduceMany(red, dst, firstInFront(src, first), src.size(), len, kernels::kPost);
}

}  // namespace

// The slices form streams its copies from streamBytes(), and its reduction from registers to
// its buffer (kernels::reduceManyStream); from streamOutputBytes() the output streams too.
//
// streamBytes(): LOOM_DIRECT_STREAM_BYTES, else by CPU. On an AMD EPYC guest a line another
// core had just written was slower to read than memory, and streaming from 1 MiB made 2 to 32
// MiB 25-60% faster; since the own slice is reduced straight from the send buffer, plain
// rounds there are slower still, and streaming from 64 KiB made 2 ranks 27-36% faster at 64
// and 256 KiB (loomMemAlloc inputs 77-90%), 4 ranks 24% at 256 KiB, 8 ranks within the noise.
// On an Intel Xeon guest whose two cores share the last-level cache, streaming lost 15-20% at
// 2 and 8 MiB (2 ranks and 4) and gained 5% from 64 MiB (docs/journal/perf.md, stops 18, 24
// and 30).
static size_t streamBytes() {
  static const size_t bytes = [] {
    const int64_t set = env::directStreamBytes();
    if (set > 0) return static_cast<size_t>(set);
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    if (__builtin_cpu_is("amd")) return size_t{64} << 10;
#endif
    return size_t{64} << 20;
  }();
  return bytes;
}
// A round with plain stores leaves the input, the output and every rank's buffers of the
// last rounds in the caches; on the Intel Xeon guest (2 MiB of L2 a core), 256 KiB rounds
// against the 1 MiB buffers whole: 2 ranks 10-12% faster at 2 and 8 MiB (docs/journal/perf.md,
// stop 24). Streamed rounds go through memory and take the whole buffer.
// Where two ranks share each core (4 ranks on 2 cores), each takes rounds of half that, so
// that both ranks' rounds stay in the core's caches: alternating runs, medians of 8, 4 ranks
// 512 KiB +8-11%, 2 MiB +6-14%, 8 MiB +4-10%. With more ranks a core the extra rounds' waits,
// each a switch between the core's ranks, cost what the caches gain (8 ranks on 2 cores, 128
// KiB rounds: 512 KiB +7%, 2 MiB -15%); with a core each, 2 ranks lost 3-4% at 2 and 8 MiB
// (docs/journal/perf.md, stop 26).
constexpr size_t kCachedRoundBytes = size_t{256} << 10;
static size_t cachedRoundBytes(const Comm& comm) {
  return comm.ranksPerCore() == 2 ? kCachedRoundBytes / 2 : kCachedRoundBytes;
}
// streamOutputBytes(): the output, which the caches could not keep, goes to memory with
// streaming stores from this size, counted over the ranks that share a core (their outputs
// take turns in its caches), where it is not the input (out of place). 8 MiB where the copies
// stream from 1 MiB or less (the AMD guest), else 16 MiB: on the Intel Xeon guest, whose
// copies stay plain, 2 ranks 32 MiB 3.9 -> 4.9 GB/s, 4 ranks on 2 cores 16 MiB 2.3 -> 2.8 and
// 32 MiB 2.2 -> 3.1, 8 ranks 8 MiB 1.4 -> 1.9; but 2 ranks 8 MiB 7% slower
// (docs/journal/perf.md, stop 25).
static size_t streamOutputBytes() {
  static const size_t bytes = [] {
    const int64_t set = env::directStreamOutputBytes();
    if (set > 0) return static_cast<size_t>(set);
    return streamBytes() <= (size_t{1} << 20) ? size_t{8} << 20 : size_t{16} << 20;
  }();
  return bytes;
}

size_t llMaxBytes(const Comm& comm) {
  return comm.outnumbered() ? transport::kShmLLBytes : transport::kShmLLMaxBytes;
}

// The symmetric form saves the slices form's second wait and gather, and reads nranks times
// the message; on the Intel Xeon guest it was faster up to 32 KiB with 2 ranks, 16 KiB with 4
// and 8 KiB with 8 (2 cores), and slower from twice those (2 ranks 64 KiB 6.7 -> 8.5 GB/s with
// slices, 4 ranks 32 KiB 3.7 -> 4.1, 8 ranks 64 KiB 1.6 -> 2.6; docs/journal/perf.md, stop 25).
size_t symmetricMaxBytes(int nranks) {
  const int64_t set = env::directSymMax();
  if (set >= 0) return static_cast<size_t>(set);
  return (size_t{64} << 10) / static_cast<size_t>(std::max(nranks, 1));
}

DirectForm directForm(size_t bytes, int nranks, bool llAllowed, size_t llMax) {
  if (bytes > 0 && bytes <= llMax && llAllowed) return DirectForm::LL;
  return bytes <= symmetricMaxBytes(nranks) ? DirectForm::Symmetric : DirectForm::Slices;
}

Status runDirectAllReduce(Comm& comm, const OpArgs& op, size_t count, DirectForm form,
                          int64_t* doneNs) {
  const bool symmetric = form != DirectForm::Slices;
  const transport::ShmLinks& shm = *comm.shm();
  const int n = comm.nranks();
  const int me = comm.rank();
  const size_t es = op.elemSize;
  const kernels::Reducer& red = op.reducer;
  const bool scale = red.hasScale;
  Waiter waiter(comm, op);
  auto header = [&](int q) { return shm.direct[static_cast<size_t>(q)].header(); };
  ShmDirectHeader* mine = header(me);
  const char* send = static_cast<const char*>(op.sendbuff);
  char* recv = static_cast<char*>(op.recvbuff);
  // Scratch for source pointers, kept by the communicator so the fast path does not allocate.
  Comm::ExecScratch& scratch = comm.execScratch();
  std::vector<const char*>& bufs = scratch.bufs;
  std::vector<const char*>& slice = scratch.slice;
  std::vector<const char*>& inputs = scratch.inputs;
  bufs.resize(static_cast<size_t>(n));
  slice.resize(static_cast<size_t>(n));
  inputs.resize(static_cast<size_t>(n));

  // Waits until every peer's counter wordOf(q) (in its header) reaches target. With `note`, records
  // when each peer's data was first seen here: the peers ready at the first look share one clock
  // read, taken after every look (so never before a peer published); a peer waited for is timed
  // when its wait ends. With the recorder off, no clock is read. lastSeenNs: the last clock read.
  std::vector<int>& pending = scratch.pending;
  int64_t lastSeenNs = 0;
  auto waitAll = [&](auto wordOf, uint32_t target, auto what, bool note) -> Status {
    pending.clear();
    for (int q = 0; q < n; ++q)
      if (q != me && !reached(*wordOf(q), target)) pending.push_back(q);
    note = note && op.record != nullptr;
    if (note && pending.size() + 1 < static_cast<size_t>(n)) {
      const int64_t seenNs = lastSeenNs = nowNs();
      for (int q = 0, k = 0; q < n; ++q) {
        if (k < static_cast<int>(pending.size()) && pending[static_cast<size_t>(k)] == q) {
          ++k;
          continue;
        }
        if (q != me) trace::FlightRecorder::noteFirstArrivalAt(op.record, q, seenNs);
      }
    }
    for (int q : pending) {
      std::atomic<uint32_t>* word = wordOf(q);
      LOOM_CHECK(waiter.untilWord(
          q, word, &header(q)->sleepers, [&] { return reached(*word, target); }, what));
      if (note) trace::FlightRecorder::noteFirstArrivalAt(op.record, q, lastSeenNs = nowNs());
    }
    return Status::ok();
  };
  // Every rank's entry time, read once its first round's input is in: the
  // flight recorder learns who arrived last without an extra message.
  const int64_t enterNs = op.record != nullptr ? op.record->enterNs.get() : nowNs();
  auto noteArrivals = [&](auto enterOf) {
    if (op.record == nullptr) return;
    std::vector<int64_t>& enters = scratch.enters;
    enters.resize(static_cast<size_t>(n));
    for (int q = 0; q < n; ++q) enters[static_cast<size_t>(q)] = enterOf(q);
    comm.recorder().noteArrivals(op.record, enters);
  };

  if (form == DirectForm::LL) {
    // Low-latency path: input and round number share each cache line. Past the first line's
    // 48 bytes the input goes on in more lines, written first; the first line, published
    // last, is what a blocked peer sleeps on, and once it is seen every other line is too.
    const uint32_t g = comm.nextDirectRound();
    transport::ShmLLLine& line = mine->ll[g & 1];
    const size_t bytes = count * es;
    const size_t firstBytes = std::min(bytes, transport::kShmLLBytes);
    const size_t moreLines =
        (bytes - firstBytes + transport::kShmLLMoreBytes - 1) / transport::kShmLLMoreBytes;
    auto put = [&](char* dst, const char* src, size_t b) {
      if (scale)
        kernels::reduce(red, dst, nullptr, src, b / es, kernels::kPre);
      else
        std::memcpy(dst, src, b);
    };
    auto moreRange = [&](size_t i, size_t* off, size_t* len) {
      *off = firstBytes + i * transport::kShmLLMoreBytes;
      *len = std::min(transport::kShmLLMoreBytes, bytes - *off);
    };
    for (size_t i = 0; i < moreLines; ++i) {
      transport::ShmLLMoreLine& more = mine->llMore[g & 1][i];
      size_t off, len;
      moreRange(i, &off, &len);
      put(more.data, send + off, len);
      more.round.store(g, std::memory_order_release);
    }
    line.enterNs = enterNs;
    put(line.data, send, firstBytes);
    publish(line.round, mine, g);
    // Follow each peer's more lines as they land, for at most one wait's polls in all: the
    // wait on the first line below is the one that yields, blocks and times out.
    uint64_t polls = comm.spinCount();
    for (int q = 0; q < n && moreLines > 0; ++q)
      for (size_t i = 0; q != me && i < moreLines; ++i)
        while (!reached(header(q)->llMore[g & 1][i].round, g) && polls > 0) {
          --polls;
          cpuRelax();
        }
    LOOM_CHECK(waitAll([&](int q) { return &header(q)->ll[g & 1].round; }, g,
                       [] { return std::string("low-latency all-reduce"); }, true));
    noteArrivals([&](int q) { return header(q)->ll[g & 1].enterNs; });
    // Every peer has published round g, so each is done reading this rank's lines of round g - 1:
    // they are round g + 1's, taken for writing now, off the next call's critical path.
    prefetchForWrite(&mine->ll[(g + 1) & 1]);
    for (size_t i = 0; i < moreLines; ++i) prefetchForWrite(&mine->llMore[(g + 1) & 1][i]);
    if (moreLines == 0) {
      for (int q = 0; q < n; ++q) bufs[static_cast<size_t>(q)] = header(q)->ll[g & 1].data;
    } else {
      // Each rank's lines gathered into one run, for one reduction over all of them.
      std::vector<char>& runs = scratch.llRuns;
      runs.resize(static_cast<size_t>(n) * transport::kShmLLMaxBytes);
      for (int q = 0; q < n; ++q) {
        char* run = runs.data() + static_cast<size_t>(q) * transport::kShmLLMaxBytes;
        const ShmDirectHeader* h = header(q);
        std::memcpy(run, h->ll[g & 1].data, firstBytes);
        for (size_t i = 0; i < moreLines; ++i) {
          size_t off, len;
          moreRange(i, &off, &len);
          std::memcpy(run + off, h->llMore[g & 1][i].data, len);
        }
        bufs[static_cast<size_t>(q)] = run;
      }
    }
    reduceAll(red, recv, bufs, 0, count);
    // The last line came in at lastSeenNs: what follows it is a few nanoseconds' work, so
    // that time serves as the operation's end too (one clock read fewer).
    *doneNs = lastSeenNs;
    return Status::ok();
  }

  // Streaming stores (slices form) from streamBytes(), and to the output from
  // streamOutputBytes(), where it is larger than the caches would keep.
  const bool stream = !symmetric && count * es >= streamBytes();
  // In place, the output's lines are the input's, which this rank has just read: they are in
  // its caches, and streaming stores would only evict them (2 ranks in place, 16 and 32 MiB:
  // 7.16 and 6.92 GB/s plain against 4.53 and 4.47 streamed; docs/journal/perf.md, stop 26).
  const bool streamOutput =
      !symmetric && send != recv &&
      count * es * static_cast<size_t>(comm.ranksPerCore()) >= streamOutputBytes();
  // Rounds that stay in the caches take at most cachedRoundBytes() of each direct buffer.
  const size_t perRound =
      (stream ? shm.directBytes : std::min(shm.directBytes, cachedRoundBytes(comm))) / es;
  auto toOutput = [streamOutput](char* dst, const char* src, size_t bytes) {
    if (streamOutput)
      kernels::streamCopy(dst, src, bytes);
    else
      std::memcpy(dst, src, bytes);
  };
  auto bufferOf = [&](int q, uint32_t slot) {
    return shm.direct[static_cast<size_t>(q)].buffer(slot, shm.directBytes);
  };

  // Slices form: one wait per round. Round g's input is published, every peer's is waited
  // for, and only then are round g-1's reduced slices gathered: a peer publishes round g's
  // input after its round g-1 slice, so that wait covers both. The last round's gather
  // waits for the slices themselves. Three buffers make this safe: round g fills the
  // buffer of round g-3, whose slices every peer gathered before it published round g-1's
  // input (this rank waited for that in round g-1); the inputs there were read earlier
  // still. (With two, round g would fill round g-2's buffer, which a peer gathers only
  // after it has seen round g's input.) The symmetric form has no gather: a peer is done
  // with round g's buffers before it publishes round g+1's input.
  struct Gather {
    uint32_t g = 0, slot = 0;
    size_t off = 0, len = 0;
    bool due = false;
  } pendingGather;
  auto gather = [&](const Gather& r, bool wait) -> Status {
    for (int k = stream ? 1 : 0; k < n; ++k) {
      const int q = (me + k) % n;
      size_t qo, ql;
      algo::chunkRange(r.len, n, q, &qo, &ql);
      if (q != me && wait) {
        ShmDirectHeader* h = header(q);
        if (!reached(h->reduced, r.g))
          LOOM_CHECK(waiter.untilWord(
              q, &h->reduced, &h->sleepers, [&] { return reached(h->reduced, r.g); },
              [] { return std::string("direct all-reduce, gathering"); }));
      }
      toOutput(recv + (r.off + qo) * es, bufferOf(q, r.slot) + qo * es, ql * es);
    }
    return Status::ok();
  };

  for (size_t off = 0; off < count; off += perRound) {
    const size_t len = std::min(perRound, count - off);
    const uint32_t g = comm.nextDirectRound();
    const uint32_t slot = comm.directSlot();
    char* myBuf = bufferOf(me, slot);
    // An input in loomMemAlloc memory is read in place by the peers (slices only: a rank
    // returns only once every peer has published its last slice, which it does after reading
    // every input; the symmetric form has no such point).
    const mem::Ref in = symmetric || scale ? mem::Ref{} : mem::lookup(send + off * es, len * es);
    // Slices form: this rank's own slice is reduced straight from its send buffer, so only
    // the peers' slices are copied in (on the Intel guest 10-17% faster from 512 KiB). From
    // streamBytes() with streaming stores: the lines go to memory rather than to this core's
    // cache, and the peers read them from there faster than from another core's cache on
    // the AMD guest (docs/journal/perf.md). Below that, the copies are plain and stay in the
    // caches.
    size_t so = 0, sl = 0;
    if (!symmetric) algo::chunkRange(len, n, me, &so, &sl);
    const bool ownInPlace = !symmetric && !scale;
    if (in.token == 0) {
      if (scale) {
        kernels::reduce(red, myBuf, nullptr, send + off * es, len, kernels::kPre);
      } else if (ownInPlace && stream) {
        kernels::streamCopy(myBuf, send + off * es, so * es);
        kernels::streamCopy(myBuf + (so + sl) * es, send + (off + so + sl) * es,
                            (len - so - sl) * es);
        kernels::streamFence();
      } else if (ownInPlace) {
        std::memcpy(myBuf, send + off * es, so * es);
        std::memcpy(myBuf + (so + sl) * es, send + (off + so + sl) * es, (len - so - sl) * es);
      } else {
        std::memcpy(myBuf, send + off * es, len * es);
      }
    }
    mine->inputToken[g & 1] = in.token;
    mine->inputOffset[g & 1] = in.offset;
    mine->enterNs[g & 1] = enterNs;
    publish(mine->ready, mine, g);
    for (int q = 0; q < n; ++q) bufs[static_cast<size_t>(q)] = bufferOf(q, slot);
    LOOM_CHECK(waitAll([&](int q) { return &header(q)->ready; }, g,
                       [] { return std::string("direct all-reduce, waiting for peers' input"); },
                       off == 0));
    if (pendingGather.due) LOOM_CHECK(gather(pendingGather, false));
    // Each rank's input: its region's buffer, or its loomMemAlloc buffer mapped here. (The
    // symmetric form reads every region's buffer: no rank reads another's input in place, so
    // the peers' tokens, a cache line each, are not read.)
    for (int q = 0; q < n && !symmetric; ++q) {
      const ShmDirectHeader* h = header(q);
      const uint64_t token = q == me ? in.token : h->inputToken[g & 1];
      const uint64_t offset = q == me ? in.offset : h->inputOffset[g & 1];
      const char*& src = inputs[static_cast<size_t>(q)];
      src = bufs[static_cast<size_t>(q)];
      if (token == 0 && !(q == me && ownInPlace)) continue;
      if (q == me) {
        src = send + off * es;
        continue;
      }
      Result<const char*> base = mem::mapPeer(token, offset + len * es);
      if (!base.isOk())
        return base.status().prefix(comm.describe() + ": rank " + std::to_string(q) + "'s input: ");
      src = base.value() + offset;
    }
    if (off == 0) noteArrivals([&](int q) { return header(q)->enterNs[g & 1]; });

    if (symmetric) {
      reduceAll(red, recv + off * es, bufs, 0, len);
      continue;
    }
    for (size_t q = 0; q < slice.size(); ++q) slice[q] = inputs[q] + so * es;
    if (stream) {
      // My slice in one pass, streamed from registers to my buffer (for the peers) and to the
      // output: with streaming stores where the output streams, else with plain ones (in
      // place, the output's lines are the input's, just read). Against a tile in L1 copied
      // out to both, one call after the other in the same run, medians: 2 ranks 1 MiB 24%
      // (out of place) and 30% (in place) faster, 4 MiB 30-41%, 64 MiB 15% out of place and
      // 20-25% in place (docs/journal/perf.md, stop 33).
      const uint32_t copyFlag = streamOutput ? 0u : uint32_t{kernels::kCopyCached};
      kernels::reduceManyStream(red, myBuf + so * es, recv + (off + so) * es,
                                firstInFront(slice, static_cast<size_t>(me)), slice.size(), sl,
                                kernels::kPost | copyFlag);
      kernels::streamFence();
    } else {
      reduceAll(red, myBuf + so * es, slice, static_cast<size_t>(me), sl);
      // The gather above may have streamed to the output: its stores, too, are ordered before
      // what this rank publishes.
      if (streamOutput) kernels::streamFence();
    }
    publish(mine->reduced, mine, g);
    pendingGather = Gather{g, slot, off, len, true};
  }
  if (pendingGather.due) LOOM_CHECK(gather(pendingGather, true));
  if (streamOutput) kernels::streamFence();
  return Status::ok();
}

}  // namespace loom::exec
