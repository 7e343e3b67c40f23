// Recursive halving-doubling (Rabenseifner): all-reduce as a reduce-scatter
// by recursive halving then an all-gather by recursive doubling; all-gather by
// recursive doubling alone. And recursive doubling of whole buffers ("rd"), the
// small-message all-reduce: log2(n') exchanges of the whole buffer, each rank
// reducing what its partner sent, so a 2-rank all-reduce is one exchange.
//
// Ranks that take part in the halving and doubling are the n' = 2^L "virtual
// ranks" (vranks). When n is not a power of two, the first 2e ranks
// (e = n - n') fold: even rank 2i sends its data to 2i+1, which plays vrank i;
// ranks from 2e on play vranks r - e. At the end 2i+1 sends 2i the result.
//
// The buffer is cut into units, and every step moves whole units, one step
// per unit. Both ends of a transfer compute the same pieces from the same
// count, and a unit's later steps have the same count as its earlier ones, so
// under round-major execution piece p of a step only ever reads what piece p
// of an earlier step wrote. (One step over two units would cut its pieces
// differently and read halves that the previous step has not written yet.)
//
// Halving on 4 vranks, units u0..u3 (vrank v keeps unit v in the end):
//   step 0 (distance 2):  v0 <-> v2, v1 <-> v3   each sends the other half
//                         v0,v1 keep u0,u1; v2,v3 keep u2,u3 (partial sums)
//   step 1 (distance 1):  v0 <-> v1, v2 <-> v3   v keeps u(v), complete
// Doubling runs the same exchanges in reverse order, sending finished units.
#include "algorithms/schedule.h"

namespace loom::algo {
namespace {

struct Unit {
  size_t offset = 0;
  size_t len = 0;
};

void push(std::vector<Step>& st, const Step& s) {
  if (s.count > 0) st.push_back(s);
}

// Interleaves the sends of `out` (to peer) with the receives of `in` (from
// peer): out[0], in[0], out[1], in[1], ... The peer builds the mirror image,
// so every piece finds the one slot of a depth-1 FIFO free.
template <typename SendFn, typename RecvFn>
void exchange(const std::vector<int>& out, const std::vector<int>& in, SendFn send, RecvFn recv) {
  for (size_t i = 0; i < out.size() || i < in.size(); ++i) {
    if (i < out.size()) send(out[i]);
    if (i < in.size()) recv(in[i]);
  }
}

std::vector<int> range(int lo, int hi) {
  std::vector<int> v;
  for (int u = lo; u < hi; ++u) v.push_back(u);
  return v;
}

// The halving step at distance d for vrank v: the partner rank, the units v keeps (the half
// of its 2d-group that holds v) and the units it gives.
struct Halving {
  int peer;
  std::vector<int> keep, give;
};
Halving halving(const Fold& f, int v, int d) {
  const int lo = v & ~(2 * d - 1);
  const bool upper = (v & d) != 0;
  return {f.rankOf(v ^ d), upper ? range(lo + d, lo + 2 * d) : range(lo, lo + d),
          upper ? range(lo, lo + d) : range(lo + d, lo + 2 * d)};
}

}  // namespace

Schedule buildRhdAllReduce(int rank, int n, size_t count) {
  Schedule s = emptySchedule(Coll::AllReduce, "rhd", rank, n, -1, count);
  auto& st = s.channels[0];
  if (n == 1) {
    push(st, makeStep(StepOp::Copy, -1, -1, {Buf::Send, 0}, {Buf::Recv, 0}, count, kPre | kPost));
    return s;
  }
  const Fold f = makeFold(n);
  // Unit u of n' near-equal units; vrank v ends the halving owning unit v.
  std::vector<Unit> units(static_cast<size_t>(f.pow2));
  for (int u = 0; u < f.pow2; ++u) chunkRange(count, f.pow2, u, &units[u].offset, &units[u].len);
  auto unitStep = [&](StepOp op, int from, int to, Buf srcBuf, int u, uint8_t flags) {
    const Unit& x = units[static_cast<size_t>(u)];
    push(st, makeStep(op, from, to, {srcBuf, x.offset}, {Buf::Recv, x.offset}, x.len, flags));
  };
  const int v = f.vrankOf(rank);
  const std::vector<int> all = range(0, f.pow2);
  if (v < 0) {
    // Folded rank: hand the input over, receive the result.
    for (int u : all) unitStep(StepOp::Send, -1, rank + 1, Buf::Send, u, kPre);
    for (int u : all) unitStep(StepOp::Recv, rank + 1, -1, Buf::Recv, u, 0);
    return s;
  }
  // inRecv[u]: this rank's partial sum of unit u is in recv (else its own
  // input, still to be pre-scaled, is in send).
  std::vector<bool> inRecv(units.size(), false);
  const int folded = rank < 2 * f.extra ? rank - 1 : -1;
  if (folded >= 0) {
    for (int u : all) unitStep(StepOp::RecvReduceCopy, folded, -1, Buf::Send, u, kPre);
    inRecv.assign(units.size(), true);
  }
  // Halving: at distance d, keep the half of the 2d-group that holds v.
  for (int d = f.pow2 / 2; d >= 1; d /= 2) {
    const Halving h = halving(f, v, d);
    const int peer = h.peer;
    const std::vector<int>& keep = h.keep;
    const std::vector<int>& give = h.give;
    const uint8_t last = d == 1 ? kPost : 0;
    exchange(
        give, keep,
        [&](int u) {
          unitStep(StepOp::Send, -1, peer, inRecv[u] ? Buf::Recv : Buf::Send, u,
                   inRecv[u] ? 0 : kPre);
        },
        [&](int u) {
          unitStep(StepOp::RecvReduceCopy, peer, -1, inRecv[u] ? Buf::Recv : Buf::Send, u,
                   static_cast<uint8_t>((inRecv[u] ? 0 : kPre) | last));
          inRecv[u] = true;
        });
  }
  // Doubling: at distance d, swap the finished units of the two d-groups.
  for (int d = 1; d < f.pow2; d *= 2) {
    const int peer = f.rankOf(v ^ d);
    const int mine = v & ~(d - 1), theirs = (v ^ d) & ~(d - 1);
    exchange(
        range(mine, mine + d), range(theirs, theirs + d),
        [&](int u) { unitStep(StepOp::Send, -1, peer, Buf::Recv, u, 0); },
        [&](int u) { unitStep(StepOp::Recv, peer, -1, Buf::Recv, u, 0); });
  }
  if (folded >= 0)
    for (int u : all) unitStep(StepOp::Send, -1, folded, Buf::Recv, u, 0);
  return s;
}

// Reduce-scatter: the halving of the all-reduce over blocks, where unit u is the blocks of the
// ranks vrank u plays for (its own, and its folded partner's), partial sums kept in scratch
// (block b at b * count). In the last exchange each rank receives its own unit: its own block
// goes straight to recv, finished; a folded partner's block is finished in scratch and handed
// back.
Schedule buildRhdReduceScatter(int rank, int n, size_t count) {
  Schedule s = emptySchedule(Coll::ReduceScatter, "rhd", rank, n, -1, count);
  auto& st = s.channels[0];
  auto block = [count](int b) { return static_cast<size_t>(b) * count; };
  if (n == 1) {
    push(st, makeStep(StepOp::Copy, -1, -1, {Buf::Send, 0}, {Buf::Recv, 0}, count, kPre | kPost));
    return s;
  }
  s.scratchCount = static_cast<size_t>(n) * count;
  const Fold f = makeFold(n);
  const int v = f.vrankOf(rank);
  if (v < 0) {
    // Folded rank: hand every block over, receive its own finished block.
    for (int b = 0; b < n; ++b)
      push(st, makeStep(StepOp::Send, -1, rank + 1, {Buf::Send, block(b)}, {Buf::Recv, 0}, count,
                        kPre));
    push(st, makeStep(StepOp::Recv, rank + 1, -1, {Buf::Recv, 0}, {Buf::Recv, 0}, count));
    return s;
  }
  // The blocks of unit u, in rank order.
  auto blocksOf = [&f](int u) {
    const int r = f.rankOf(u);
    return u < f.extra ? std::vector<int>{r - 1, r} : std::vector<int>{r};
  };
  std::vector<bool> inScratch(static_cast<size_t>(n), false);
  const int folded = rank < 2 * f.extra ? rank - 1 : -1;
  if (folded >= 0) {
    for (int b = 0; b < n; ++b)
      push(st, makeStep(StepOp::RecvReduceCopy, folded, -1, {Buf::Send, block(b)},
                        {Buf::Scratch, block(b)}, count, kPre));
    inScratch.assign(inScratch.size(), true);
  }
  auto src = [&](int b) {
    return BufRef{inScratch[static_cast<size_t>(b)] ? Buf::Scratch : Buf::Send, block(b)};
  };
  auto pre = [&](int b) -> uint8_t { return inScratch[static_cast<size_t>(b)] ? 0 : kPre; };
  for (int d = f.pow2 / 2; d >= 1; d /= 2) {
    const Halving h = halving(f, v, d);
    const int peer = h.peer;
    const std::vector<int>& keep = h.keep;
    const std::vector<int>& give = h.give;
    std::vector<int> out, in;
    for (int u : give)
      for (int b : blocksOf(u)) out.push_back(b);
    for (int u : keep)
      for (int b : blocksOf(u)) in.push_back(b);
    exchange(
        out, in,
        [&](int b) { push(st, makeStep(StepOp::Send, -1, peer, src(b), src(b), count, pre(b))); },
        [&](int b) {
          // The last exchange finishes this rank's unit: its own block into recv.
          const bool last = d == 1;
          const BufRef dst =
              last && b == rank ? BufRef{Buf::Recv, 0} : BufRef{Buf::Scratch, block(b)};
          push(st, makeStep(StepOp::RecvReduceCopy, peer, -1, src(b), dst, count,
                            static_cast<uint8_t>(pre(b) | (last ? kPost : 0))));
          inScratch[static_cast<size_t>(b)] = true;
        });
  }
  if (folded >= 0)
    push(st,
         makeStep(StepOp::Send, -1, folded, {Buf::Scratch, block(folded)}, {Buf::Recv, 0}, count));
  return s;
}

// Recursive doubling: at distance d, vrank v swaps its partial sum of the d-group it is in
// with v ^ d's and adds the two; after log2(n') rounds every vrank holds the sum. Both
// partners add the same two values (in + own), so every rank ends with the same bits.
Schedule buildRdAllReduce(int rank, int n, size_t count) {
  Schedule s = emptySchedule(Coll::AllReduce, "rd", rank, n, -1, count);
  auto& st = s.channels[0];
  auto whole = [&](StepOp op, int from, int to, Buf src, uint8_t flags) {
    push(st, makeStep(op, from, to, {src, 0}, {Buf::Recv, 0}, count, flags));
  };
  if (n == 1) {
    whole(StepOp::Copy, -1, -1, Buf::Send, kPre | kPost);
    return s;
  }
  const Fold f = makeFold(n);
  const int v = f.vrankOf(rank);
  if (v < 0) {
    whole(StepOp::Send, -1, rank + 1, Buf::Send, kPre);
    whole(StepOp::Recv, rank + 1, -1, Buf::Recv, 0);
    return s;
  }
  bool inRecv = false;  // this rank's partial sum is in recv (else its own input is in send)
  const int folded = rank < 2 * f.extra ? rank - 1 : -1;
  if (folded >= 0) {
    whole(StepOp::RecvReduceCopy, folded, -1, Buf::Send, kPre);
    inRecv = true;
  }
  for (int d = 1; d < f.pow2; d *= 2) {
    const int peer = f.rankOf(v ^ d);
    const Buf src = inRecv ? Buf::Recv : Buf::Send;
    const uint8_t pre = inRecv ? 0 : kPre;
    whole(StepOp::Send, -1, peer, src, pre);
    whole(StepOp::RecvReduceCopy, peer, -1, src,
          static_cast<uint8_t>(pre | (2 * d == f.pow2 ? kPost : 0)));
    inRecv = true;
  }
  if (folded >= 0) whole(StepOp::Send, -1, folded, Buf::Recv, 0);
  return s;
}

// All-gather: units are the ranks' blocks; vrank v holds the blocks of the
// ranks it plays for (its own, and its folded partner's), [first(v), first(v+1)).
Schedule buildRhdAllGather(int rank, int n, size_t count) {
  Schedule s = emptySchedule(Coll::AllGather, "rhd", rank, n, -1, count);
  auto& st = s.channels[0];
  auto block = [count](int u) { return static_cast<size_t>(u) * count; };
  push(st, makeStep(StepOp::Copy, -1, -1, {Buf::Send, 0}, {Buf::Recv, block(rank)}, count));
  if (n == 1) return s;
  const Fold f = makeFold(n);
  auto first = [&f](int v) { return v < f.extra ? 2 * v : v + f.extra; };
  auto blocks = [&](int v0, int v1) {
    return range(first(v0), v1 == f.pow2 ? f.nranks : first(v1));
  };
  auto sendBlock = [&](int to, int u) {
    push(st, makeStep(StepOp::Send, -1, to, {Buf::Recv, block(u)}, {Buf::Recv, block(u)}, count));
  };
  auto recvBlock = [&](int from, int u) {
    push(st, makeStep(StepOp::Recv, from, -1, {Buf::Recv, block(u)}, {Buf::Recv, block(u)}, count));
  };
  const int v = f.vrankOf(rank);
  if (v < 0) {
    push(st, makeStep(StepOp::Send, -1, rank + 1, {Buf::Send, 0}, {Buf::Recv, 0}, count));
    for (int u = 0; u < n; ++u)
      if (u != rank) recvBlock(rank + 1, u);
    return s;
  }
  const int folded = rank < 2 * f.extra ? rank - 1 : -1;
  if (folded >= 0) recvBlock(folded, folded);
  for (int d = 1; d < f.pow2; d *= 2) {
    const int peer = f.rankOf(v ^ d);
    const int mine = v & ~(d - 1), theirs = (v ^ d) & ~(d - 1);
    exchange(
        blocks(mine, mine + d), blocks(theirs, theirs + d), [&](int u) { sendBlock(peer, u); },
        [&](int u) { recvBlock(peer, u); });
  }
  if (folded >= 0)
    for (int u = 0; u < n; ++u)
      if (u != folded) sendBlock(folded, u);
  return s;
}

}  // namespace loom::algo
