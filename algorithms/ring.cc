// Ring algorithms: all-reduce (reduce-scatter then all-gather), all-gather
// and reduce-scatter over the ring 0 -> 1 -> ... -> n-1 -> 0.
//
// All-reduce on 4 ranks; the buffer is cut into 4 chunks, c(k) = chunk k mod n.
// Rank r, reduce-scatter phase (n-1 steps, partial sums move forward):
//   step 0      send c(r)                     to r+1
//   step 1..n-2 recv c(r-s), += own, send on
//   step n-1    recv c(r+1), += own, final -> keep in recv, send on
// all-gather phase (n-1 steps, finished chunks move forward):
//   step 1..n-2 recv c(r+1-s), copy to recv, send on
//   last        recv c(r+2)
//         r0      r1      r2      r3
//   s0   c0->    c1->    c2->    c3->      (each sends its own chunk)
//   s1   c3+->   c0+->   c1+->   c2+->
//   s2   c2++    c3++    c0++    c1++      (rank r now owns c(r+1), complete)
#include <algorithm>

#include "algorithms/schedule.h"

namespace loom::algo {
namespace {

int mod(int a, int n) { return ringMod(a, n); }

// A step over chunk `chunk` of n near-equal chunks of `count` elements.
Step chunkStep(StepOp op, int recvPeer, int sendPeer, Buf srcBuf, Buf dstBuf, size_t count, int n,
               int chunk, size_t srcBase, size_t dstBase, uint8_t flags) {
  size_t off, len;
  chunkRange(count, n, chunk, &off, &len);
  return makeStep(op, recvPeer, sendPeer, {srcBuf, srcBase + off}, {dstBuf, dstBase + off}, len,
                  flags);
}

Schedule empty(Coll coll, int rank, int nranks, size_t count) {
  return emptySchedule(coll, "ring", rank, nranks, -1, count);
}

}  // namespace

Schedule buildRingAllReduce(int rank, int n, size_t count) {
  Schedule s = empty(Coll::AllReduce, rank, n, count);
  auto& st = s.channels[0];
  if (n == 1) {
    st.push_back(
        chunkStep(StepOp::Copy, -1, -1, Buf::Send, Buf::Recv, count, 1, 0, 0, 0, kPre | kPost));
    return s;
  }
  const int next = mod(rank + 1, n), prev = mod(rank - 1, n);
  // Reduce-scatter: partial sums of chunk c(r-s) travel forward.
  st.push_back(chunkStep(StepOp::Send, -1, next, Buf::Send, Buf::Recv, count, n, rank, 0, 0, kPre));
  for (int k = 1; k < n - 1; ++k)
    st.push_back(chunkStep(StepOp::RecvReduceSend, prev, next, Buf::Send, Buf::Recv, count, n,
                           mod(rank - k, n), 0, 0, kPre));
  // Last reduction: chunk c(r+1) is complete here; keep it and pass it on.
  st.push_back(chunkStep(StepOp::RecvReduceCopySend, prev, next, Buf::Send, Buf::Recv, count, n,
                         mod(rank + 1, n), 0, 0, kPre | kPost));
  // All-gather: complete chunks travel forward.
  for (int k = 1; k < n - 1; ++k)
    st.push_back(chunkStep(StepOp::RecvCopySend, prev, next, Buf::Recv, Buf::Recv, count, n,
                           mod(rank + 1 - k, n), 0, 0, 0));
  st.push_back(
      chunkStep(StepOp::Recv, prev, -1, Buf::Recv, Buf::Recv, count, n, mod(rank + 2, n), 0, 0, 0));
  return s;
}

// All-gather: step 0 places and sends the own block; n-2 steps copy the
// arriving block into place and forward it; the last step only receives.
Schedule buildRingAllGather(int rank, int n, size_t count) {
  Schedule s = empty(Coll::AllGather, rank, n, count);
  auto& st = s.channels[0];
  const size_t total = count * static_cast<size_t>(n);
  Step own;
  own.op = StepOp::Copy;
  own.src = {Buf::Send, 0};
  own.dst = {Buf::Recv, static_cast<size_t>(rank) * count};
  own.count = count;
  st.push_back(own);
  if (n == 1) return s;
  const int next = mod(rank + 1, n), prev = mod(rank - 1, n);
  Step first = own;
  first.op = StepOp::Send;
  first.sendPeer = next;
  st.push_back(first);
  for (int k = 1; k < n - 1; ++k)
    st.push_back(chunkStep(StepOp::RecvCopySend, prev, next, Buf::Recv, Buf::Recv, total, n,
                           mod(rank - k, n), 0, 0, 0));
  st.push_back(
      chunkStep(StepOp::Recv, prev, -1, Buf::Recv, Buf::Recv, total, n, mod(rank + 1, n), 0, 0, 0));
  return s;
}

// Reduce-scatter: the partial sum of block c(r-1-k) moves forward at step k;
// after n-1 steps rank r receives its own block, complete.
Schedule buildRingReduceScatter(int rank, int n, size_t count) {
  Schedule s = empty(Coll::ReduceScatter, rank, n, count);
  auto& st = s.channels[0];
  const size_t total = count * static_cast<size_t>(n);
  if (n == 1) {
    st.push_back(
        chunkStep(StepOp::Copy, -1, -1, Buf::Send, Buf::Recv, total, 1, 0, 0, 0, kPre | kPost));
    return s;
  }
  const int next = mod(rank + 1, n), prev = mod(rank - 1, n);
  st.push_back(chunkStep(StepOp::Send, -1, next, Buf::Send, Buf::Recv, total, n, mod(rank - 1, n),
                         0, 0, kPre));
  for (int k = 1; k < n - 1; ++k)
    st.push_back(chunkStep(StepOp::RecvReduceSend, prev, next, Buf::Send, Buf::Recv, total, n,
                           mod(rank - 1 - k, n), 0, 0, kPre));
  Step last = chunkStep(StepOp::RecvReduceCopy, prev, -1, Buf::Send, Buf::Recv, total, n, rank, 0,
                        0, kPre | kPost);
  last.dst.offset = 0;  // the block lands at the start of recvbuff
  st.push_back(last);
  return s;
}

Schedule buildRingInOrder(Coll coll, int rank, int n, size_t count, const std::vector<int>& order) {
  auto plain = [&](int r) {
    return coll == Coll::AllGather       ? buildRingAllGather(r, n, count)
           : coll == Coll::ReduceScatter ? buildRingReduceScatter(r, n, count)
                                         : buildRingAllReduce(r, n, count);
  };
  if (order.empty()) return plain(rank);
  const int pos = static_cast<int>(std::find(order.begin(), order.end(), rank) - order.begin());
  Schedule s = plain(pos);
  s.rank = rank;
  // Block p of the n-block buffer (all-gather's recv, reduce-scatter's send) is rank
  // order[p]'s block.
  const bool blocked = coll == Coll::AllGather || coll == Coll::ReduceScatter;
  const Buf blockBuf = coll == Coll::AllGather ? Buf::Recv : Buf::Send;
  auto move = [&](BufRef& ref) {
    if (!blocked || count == 0 || ref.buf != blockBuf) return;
    const size_t p = ref.offset / count;
    ref.offset = static_cast<size_t>(order[p]) * count + ref.offset % count;
  };
  for (auto& steps : s.channels)
    for (Step& st : steps) {
      if (st.recvPeer >= 0) st.recvPeer = order[static_cast<size_t>(st.recvPeer)];
      if (st.sendPeer >= 0) st.sendPeer = order[static_cast<size_t>(st.sendPeer)];
      if (stepReads(st.op)) move(st.src);
      if (stepWrites(st.op)) move(st.dst);
    }
  return s;
}

std::vector<std::vector<int>> hostMembers(const std::vector<int>& hostOf) {
  std::vector<int> ids;  // hosts in order of their lowest rank
  std::vector<std::vector<int>> members;
  for (size_t r = 0; r < hostOf.size(); ++r) {
    auto it = std::find(ids.begin(), ids.end(), hostOf[r]);
    if (it == ids.end()) {
      ids.push_back(hostOf[r]);
      members.emplace_back();
      it = ids.end() - 1;
    }
    members[static_cast<size_t>(it - ids.begin())].push_back(static_cast<int>(r));
  }
  return members;
}

std::vector<int> hostMajorOrder(const std::vector<int>& hostOf) {
  std::vector<int> order;
  for (const std::vector<int>& m : hostMembers(hostOf))
    order.insert(order.end(), m.begin(), m.end());
  for (size_t r = 0; r < order.size(); ++r)
    if (order[r] != static_cast<int>(r)) return order;
  return {};
}

}  // namespace loom::algo
