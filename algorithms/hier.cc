// Hierarchical all-reduce over a host layout: reduce-scatter inside each
// host, all-reduce across hosts between the ranks that hold the same slice,
// all-gather inside each host. Only phase 2 crosses hosts, and there each
// host sends every byte once.
//
// Hosts may hold different numbers of ranks. The buffer is cut into S slices,
// S = the largest host's rank count; a host of m ranks gives local rank i the
// slices j with floor(j * m / S) == i (so on a host of S ranks each rank owns
// one slice, on a host of one rank that rank owns all S). Slice j's owners, one
// per host, form a ring in host order for phase 2.
//
//   2 hosts of 2 ranks, slices A B:      host 0: r0 owns A, r1 owns B
//                                        host 1: r2 owns A, r3 owns B
//   phase 1  r0 <-> r1, r2 <-> r3: each sends the slice it does not own, and
//            adds the peer's copy of its own slice (partial sums per host)
//   phase 2  ring r0 - r2 over A, ring r1 - r3 over B (complete sums)
//   phase 3  r0 <-> r1, r2 <-> r3: each sends its finished slice
//
// Every step moves one unit: slice j is cut into H units, the chunks of its
// phase-2 ring (hierrd keeps each slice one unit: a round of recursive doubling
// sends it whole, one message), so a unit's steps in all three phases have the
// same count and the executor's pieces line up under round-major execution.
// Phases 1 and 3 exchange directly between the ranks of a host (step d pairs
// local rank i with i + d and i - d); phase 2 is the ring all-reduce of
// ring.cc over the slice's owners, reading the host's partial sums ("hier"),
// or their recursive doubling ("hierrd": log2(H') exchanges of the whole slice,
// H' the largest power of two <= H, hosts beyond it folded as rhd.cc folds
// ranks): 2 (H - 1) latencies across hosts become log2(H'), for log2(H') / 2
// slices' bytes per owner instead of (H - 1) / H.
#include <algorithm>

#include "algorithms/schedule.h"

namespace loom::algo {
namespace {

struct Layout {
  std::vector<std::vector<int>> members;  // per host (order of first appearance), ranks ascending
  int slices = 1;                         // S
  int hosts() const { return static_cast<int>(members.size()); }
  int owner(int h, int j) const {
    const auto& m = members[static_cast<size_t>(h)];
    const size_t i = static_cast<size_t>(j) * m.size() / static_cast<size_t>(slices);
    return m[i];
  }
};

Layout makeLayout(int n, const std::vector<int>& hostOf) {
  Layout l;
  l.members = hostMembers(hostOf.empty() ? std::vector<int>(static_cast<size_t>(n), 0) : hostOf);
  for (const auto& m : l.members) l.slices = std::max(l.slices, static_cast<int>(m.size()));
  return l;
}

class HierBuilder {
 public:
  HierBuilder(int rank, int n, size_t count, const std::vector<int>& hostOf, bool rdAcross,
              Schedule& s)
      : rank_(rank), l_(makeLayout(n, hostOf)), rdAcross_(rdAcross), st_(s.channels[0]) {
    const int H = l_.hosts();
    perSlice_ = rdAcross ? 1 : H;
    units_.resize(static_cast<size_t>(l_.slices * perSlice_));
    for (int j = 0; j < l_.slices; ++j) {
      size_t so, sl;
      chunkRange(count, l_.slices, j, &so, &sl);
      for (int c = 0; c < perSlice_; ++c) {
        Unit& u = units_[static_cast<size_t>(j * perSlice_ + c)];
        chunkRange(sl, perSlice_, c, &u.offset, &u.len);
        u.offset += so;
      }
    }
    inRecv_.assign(units_.size(), false);
    for (int h = 0; h < H; ++h) {
      const auto& m = l_.members[static_cast<size_t>(h)];
      auto it = std::find(m.begin(), m.end(), rank);
      if (it != m.end()) {
        host_ = h;
        local_ = static_cast<int>(it - m.begin());
      }
    }
  }

  void build() {
    const int H = l_.hosts();
    const auto& m = l_.members[static_cast<size_t>(host_)];
    const int lm = static_cast<int>(m.size());
    if (lm == 1 && H == 1) {
      for (size_t u = 0; u < units_.size(); ++u) step(StepOp::Copy, -1, -1, u, kPre | kPost);
      return;
    }
    // Phase 1: direct reduce-scatter inside the host.
    for (int d = 1; d < lm; ++d) {
      const int to = m[static_cast<size_t>((local_ + d) % lm)];
      const int from = m[static_cast<size_t>((local_ - d + lm) % lm)];
      const uint8_t post = (H == 1 && d == lm - 1) ? kPost : 0;
      exchange(
          unitsOf(to), unitsOf(rank_), [&](size_t u) { step(StepOp::Send, -1, to, u, 0); },
          [&](size_t u) { step(StepOp::RecvReduceCopy, from, -1, u, post); });
    }
    // Phase 2: per owned slice, an all-reduce across hosts.
    if (H > 1)
      for (int j = 0; j < l_.slices; ++j)
        if (l_.owner(host_, j) == rank_) rdAcross_ ? rdAllReduce(j) : ringAllReduce(j);
    // Phase 3: direct all-gather inside the host.
    for (int d = 1; d < lm; ++d) {
      const int to = m[static_cast<size_t>((local_ + d) % lm)];
      const int from = m[static_cast<size_t>((local_ - d + lm) % lm)];
      exchange(
          unitsOf(rank_), unitsOf(from), [&](size_t u) { step(StepOp::Send, -1, to, u, 0); },
          [&](size_t u) { step(StepOp::Recv, from, -1, u, 0); });
    }
  }

 private:
  struct Unit {
    size_t offset = 0, len = 0;
  };

  // Units of the slices that `owner` (a rank of this host) holds.
  std::vector<size_t> unitsOf(int owner) const {
    std::vector<size_t> out;
    for (int j = 0; j < l_.slices; ++j)
      if (l_.owner(host_, j) == owner)
        for (int c = 0; c < perSlice_; ++c) out.push_back(static_cast<size_t>(j * perSlice_ + c));
    return out;
  }

  // One step over unit u. The local operand is the partial sum in recv once
  // this rank has one, else its own input (pre-scaled on the way).
  void step(StepOp op, int from, int to, size_t u, uint8_t flags) {
    const Unit& x = units_[u];
    const bool partial = inRecv_[u];
    uint8_t f = flags;
    BufRef src{Buf::Recv, x.offset};
    if (stepReads(op) && !partial) {
      src.buf = Buf::Send;
      f |= kPre;
    }
    if (stepWrites(op)) inRecv_[u] = true;
    if (x.len > 0) st_.push_back(makeStep(op, from, to, src, {Buf::Recv, x.offset}, x.len, f));
  }

  template <typename SendFn, typename RecvFn>
  static void exchange(const std::vector<size_t>& out, const std::vector<size_t>& in, SendFn send,
                       RecvFn recv) {
    for (size_t i = 0; i < out.size() || i < in.size(); ++i) {
      if (i < out.size()) send(out[i]);
      if (i < in.size()) recv(in[i]);
    }
  }

  // The ring all-reduce of ring.cc over slice j's owners, chunk c = unit (j, c).
  void ringAllReduce(int j) {
    const int H = l_.hosts(), q = host_;
    const int next = l_.owner(ringMod(q + 1, H), j), prev = l_.owner(ringMod(q - 1, H), j);
    auto unit = [&](int c) { return static_cast<size_t>(j * H + ringMod(c, H)); };
    step(StepOp::Send, -1, next, unit(q), 0);
    for (int k = 1; k < H - 1; ++k) step(StepOp::RecvReduceSend, prev, next, unit(q - k), 0);
    step(StepOp::RecvReduceCopySend, prev, next, unit(q + 1), kPost);
    for (int k = 1; k < H - 1; ++k) step(StepOp::RecvCopySend, prev, next, unit(q + 1 - k), 0);
    step(StepOp::Recv, prev, -1, unit(q + 2), 0);
  }

  // Recursive doubling of slice j (one unit, u = j) among its owners, host q playing index q,
  // the H indices folded onto a power of two (Fold, schedule.h): a folded index hands its sums
  // to its successor and gets the result back; the others swap and add at distances 1, 2, ...
  void rdAllReduce(int j) {
    const int q = host_;
    const size_t u = static_cast<size_t>(j);
    const Fold f = makeFold(l_.hosts());
    auto ownerAt = [&](int index) { return l_.owner(index, j); };
    const int v = f.vrankOf(q);
    if (v < 0) {  // folded: hand over, get the result back
      step(StepOp::Send, -1, ownerAt(q + 1), u, 0);
      step(StepOp::Recv, ownerAt(q + 1), -1, u, 0);
      return;
    }
    const bool takesFold = q < 2 * f.extra;
    if (takesFold) step(StepOp::RecvReduceCopy, ownerAt(q - 1), -1, u, 0);
    for (int d = 1; d < f.pow2; d *= 2) {
      const int peer = ownerAt(f.rankOf(v ^ d));
      step(StepOp::Send, -1, peer, u, 0);
      step(StepOp::RecvReduceCopy, peer, -1, u, 2 * d == f.pow2 ? kPost : 0);
    }
    if (takesFold) step(StepOp::Send, -1, ownerAt(q - 1), u, 0);
  }

  const int rank_;
  const Layout l_;
  const bool rdAcross_;
  std::vector<Step>& st_;
  std::vector<Unit> units_;
  std::vector<bool> inRecv_;
  int host_ = 0, local_ = 0;
  int perSlice_ = 1;  // units a slice: the ring's H chunks, or the slice whole for hierrd
};

}  // namespace

Schedule buildHierAllReduce(int rank, int n, size_t count, const std::vector<int>& hostOf,
                            bool rdAcross) {
  Schedule s = emptySchedule(Coll::AllReduce, rdAcross ? "hierrd" : "hier", rank, n, -1, count);
  HierBuilder(rank, n, count, hostOf, rdAcross, s).build();
  return s;
}

}  // namespace loom::algo
