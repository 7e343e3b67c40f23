// Direct algorithms: every pair of ranks exchanges without intermediaries.
//
// All-to-all: every pair exchanges its block on its own connection. Step d (1..n-1): send
// block (r+d) to rank r+d, receive block (r-d) from rank r-d. Shifting the peer with d spreads
// the load: at each step every rank sends to a different peer and receives from a different one.
//
// All-reduce: the ranks of one host read each other's windows (schedule.h, DirectForm).
#include <algorithm>

#include "algorithms/schedule.h"

namespace loom::algo {

Schedule buildDirectAllToAll(int rank, int n, size_t count) {
  Schedule s = emptySchedule(Coll::AllToAll, "direct", rank, n, -1, count);
  auto& st = s.channels[0];
  auto block = [count](int r) { return static_cast<size_t>(r) * count; };
  st.push_back(
      makeStep(StepOp::Copy, -1, -1, {Buf::Send, block(rank)}, {Buf::Recv, block(rank)}, count));
  for (int d = 1; d < n; ++d) {
    const int to = (rank + d) % n, from = (rank - d + n) % n;
    st.push_back(makeStep(StepOp::Send, -1, to, {Buf::Send, block(to)}, {}, count));
    st.push_back(makeStep(StepOp::Recv, from, -1, {}, {Buf::Recv, block(from)}, count));
  }
  return s;
}

const char* directFormName(DirectForm f) {
  switch (f) {
    case DirectForm::LL:
      return "LL";
    case DirectForm::Symmetric:
      return "symmetric";
    case DirectForm::Slices:
      return "slices";
  }
  return "?";
}

// Why each threshold is what it is (the measurements are in docs/journal/perf.md):
//  * streamBytes: on AMD EPYC a line another core has just written is slower to read than
//    memory, so what the peers read next goes with streaming stores from 64 KiB; where the
//    cores share the last-level cache (the Intel Xeon guests) that only pays for the largest
//    messages.
//  * streamOutputBytes: an output the caches could not keep goes to memory with streaming
//    stores; earlier where the copies stream early.
//  * cachedRoundBytes: rounds small enough that every rank's buffers of a round stay in the
//    caches; two ranks sharing a core take half each.
//  * symmetricBytes: the symmetric form saves the slices form's second wait and gather but
//    reads every input on every rank, so it wins only while nranks times the message is small
//    (measured on an Intel Xeon guest, and on AMD EPYC where ranks share cores: there the
//    second wait hands the core over). On the AMD EPYC guest with a core for each of 2 ranks
//    the slices form ran 10-15% faster at 2-32 KiB in most runs, but the symmetric form ran
//    30% faster than that in some (docs/journal/perf.md, stop 48): the table keeps the rule,
//    and the start-up calibration (LOOM_TUNER_CALIBRATE) prices the forms on the host.
DirectTuning directTuning(CpuVendor vendor) {
  DirectTuning t;
  t.streamBytes = vendor == CpuVendor::Amd ? size_t{64} << 10 : size_t{64} << 20;
  t.streamOutputBytes = streamOutputBytesFor(t.streamBytes);
  t.cachedRoundBytes = size_t{256} << 10;
  t.symmetricBytes = size_t{64} << 10;
  return t;
}

size_t streamOutputBytesFor(size_t streamBytes) {
  return streamBytes <= (size_t{1} << 20) ? size_t{8} << 20 : size_t{16} << 20;
}

DirectForm directForm(size_t bytes, int nranks, const DirectParams& p) {
  if (bytes > 0 && bytes <= p.llMaxBytes) return DirectForm::LL;
  const size_t symmetricMax =
      p.tuning.symmetricFixedBytes >= 0
          ? static_cast<size_t>(p.tuning.symmetricFixedBytes)
          : p.tuning.symmetricBytes / static_cast<size_t>(std::max(nranks, 1));
  return bytes <= symmetricMax ? DirectForm::Symmetric : DirectForm::Slices;
}

size_t formLimit(const std::vector<FormTimes>& times) {
  auto loses = [&](size_t i) {
    return !(times[i].smallerUs <= times[i].largerUs * kFormTolerance);
  };
  size_t limit = 0;
  for (size_t i = 0; i < times.size(); ++i) {
    if (loses(i) && (i + 1 == times.size() || loses(i + 1))) break;
    limit = times[i].bytes;
  }
  return limit;
}

DirectParams defaultDirectParams() {
  DirectParams p;
  p.windowBytes = kDirectWindowBytes;
  p.llMaxBytes = kDirectLLMaxBytes;
  p.tuning = directTuning(CpuVendor::Other);
  return p;
}

Schedule buildDirectAllReduce(int rank, int n, size_t count, const DirectParams& p) {
  Schedule s = emptySchedule(Coll::AllReduce, "direct", rank, n, -1, count);
  std::vector<Step>& st = s.channels[0];
  const size_t es = std::max<size_t>(p.elemSize, 1);
  const size_t bytes = count * es;
  const DirectForm form = directForm(bytes, n, p);
  // kPre marks where each rank's own input is first read: the executor pre-scales there when
  // the op has a pre-scale (an exposed input or one reduced from the send buffer has none:
  // with a pre-scale, every input is put, scaled).
  const uint16_t pre = kPre;
  auto ready = [&](StepOp op, uint32_t g) { st.push_back(makeFlagStep(op, MemWord::Ready, g)); };

  if (form == DirectForm::LL) {
    s.mem = {count, kDirectLLSlots, 1, true};
    // The lines carry their round: the put is the publish.
    Step put = makeMemStep(StepOp::MemPut, 1, {Buf::Send, 0}, {Buf::Window, 0}, count,
                           static_cast<uint16_t>(pre | kWithFlag));
    put.word = static_cast<uint8_t>(MemWord::Ready);
    st.push_back(put);
    ready(StepOp::MemWait, 1);
    // This rank's own contribution is read from its send buffer (the same bytes as its lines,
    // without gathering them) where the op has no pre-scale (kPre then marks that first read
    // for the verifier, as in the slices' reduce); in place too, where the output is that
    // source exactly (kernels::reduceMany allows it).
    const bool ownSrc = !p.scale;
    st.push_back(makeMemStep(StepOp::MemReduce, 1, {Buf::Window, 0}, {Buf::Recv, 0}, count,
                             static_cast<uint16_t>(kPost | (ownSrc ? kOwnSrc | kPre : 0)), 0));
    return s;
  }

  const bool symmetric = form == DirectForm::Symmetric;
  const DirectTuning& t = p.tuning;
  const bool stream = !symmetric && bytes >= t.streamBytes;
  // In place, the output's lines are the input's, just read: in the caches, where streaming
  // stores would only evict them.
  const bool streamOutput =
      !symmetric && !p.inPlace &&
      bytes * static_cast<size_t>(std::max(p.ranksPerCore, 1)) >= t.streamOutputBytes;
  const size_t cached = p.ranksPerCore == 2 ? t.cachedRoundBytes / 2 : t.cachedRoundBytes;
  const size_t perRound =
      std::max<size_t>((stream ? p.windowBytes : std::min(p.windowBytes, cached)) / es, 1);
  const uint32_t rounds = static_cast<uint32_t>((count + perRound - 1) / perRound);
  s.mem = {perRound, kDirectSlots, rounds, false};
  // Slices: this rank's own slice is reduced straight from its send buffer, so only the
  // peers' slices are put (unless the op pre-scales, which every input needs).
  const bool ownInPlace = !symmetric && !p.scale;
  const bool exposed = !symmetric && !p.scale && p.exposed;
  const uint16_t streamFlag = stream ? kStream : 0;
  const uint16_t outFlag = streamOutput ? kStreamOut : 0;
  size_t prevOff = 0, prevLen = 0;
  for (uint32_t g = 1; g <= rounds; ++g) {
    const size_t off = (g - 1) * perRound, len = std::min(perRound, count - off);
    size_t so = 0, sl = 0;
    if (!symmetric) chunkRange(len, n, rank, &so, &sl);
    auto put = [&](size_t from, size_t k) {
      if (k > 0)
        st.push_back(makeMemStep(StepOp::MemPut, g, {Buf::Send, off + from}, {Buf::Window, from}, k,
                                 static_cast<uint16_t>(pre | streamFlag)));
    };
    if (exposed) {
      st.push_back(makeMemStep(StepOp::MemExpose, g, {Buf::Send, off}, {}, len, kPre));
    } else if (ownInPlace) {
      put(0, so);
      put(so + sl, len - so - sl);
    } else {
      put(0, len);
    }
    ready(StepOp::MemPublish, g);
    ready(StepOp::MemWait, g);
    if (symmetric) {
      st.push_back(
          makeMemStep(StepOp::MemReduce, g, {Buf::Window, 0}, {Buf::Recv, off}, len, kPost));
      continue;
    }
    if (g > 1)
      st.push_back(makeMemStep(StepOp::MemGather, g - 1, {Buf::Window, 0}, {Buf::Recv, prevOff},
                               prevLen,
                               static_cast<uint16_t>(kNoWait | (stream ? kSkipOwn : 0) | outFlag)));
    const uint16_t flags = static_cast<uint16_t>(kPost | (ownInPlace ? kOwnSrc | kPre : 0) |
                                                 (ownInPlace ? kMayExpose : 0) |
                                                 (stream ? kAlsoOut | kStream : 0) | outFlag);
    st.push_back(makeMemStep(StepOp::MemReduce, g, {Buf::Window, so}, {Buf::Window, so}, sl, flags,
                             off + so));
    st.push_back(makeFlagStep(StepOp::MemPublish, MemWord::Reduced, g));
    prevOff = off;
    prevLen = len;
  }
  if (!symmetric && rounds > 0)
    st.push_back(makeMemStep(StepOp::MemGather, rounds, {Buf::Window, 0}, {Buf::Recv, prevOff},
                             prevLen, static_cast<uint16_t>((stream ? kSkipOwn : 0) | outFlag)));
  return s;
}

}  // namespace loom::algo
