// Chain algorithms: broadcast and reduce as pipelined chains.
//
// Broadcast from root over root -> root+1 -> ... -> root+n-1. Every step
// moves the whole buffer; the executor cuts it into slot-sized pieces and runs
// them round-major, so piece p leaves the root while piece p-1 is one hop
// further down: n-1+P piece-steps in all, not (n-1)*P.
//   root: send            middle: recv, copy, send on         last: recv
// Reduce to root runs the chain the other way: root+1 starts, each rank adds
// its own data and passes the partial sum on, root finishes.
//   first: send own       middle: recv, += own, send on       root: recv, += own
#include "algorithms/schedule.h"

namespace loom::algo {
namespace {

int mod(int a, int n) { return ringMod(a, n); }

Step wholeStep(StepOp op, int recvPeer, int sendPeer, Buf srcBuf, Buf dstBuf, size_t count,
               uint8_t flags) {
  return makeStep(op, recvPeer, sendPeer, {srcBuf, 0}, {dstBuf, 0}, count, flags);
}

Schedule empty(Coll coll, int rank, int nranks, int root, size_t count) {
  return emptySchedule(coll, "chain", rank, nranks, root, count);
}

}  // namespace

Schedule buildChainBroadcast(int rank, int n, int root, size_t count, bool inPlace) {
  Schedule s = empty(Coll::Broadcast, rank, n, root, count);
  auto& st = s.channels[0];
  const int pos = mod(rank - root, n);
  const int next = mod(rank + 1, n), prev = mod(rank - 1, n);
  if (pos == 0) {
    if (!inPlace) st.push_back(wholeStep(StepOp::Copy, -1, -1, Buf::Send, Buf::Recv, count, 0));
    if (n > 1) st.push_back(wholeStep(StepOp::Send, -1, next, Buf::Send, Buf::Recv, count, 0));
  } else if (pos < n - 1) {
    st.push_back(wholeStep(StepOp::RecvCopySend, prev, next, Buf::Recv, Buf::Recv, count, 0));
  } else {
    st.push_back(wholeStep(StepOp::Recv, prev, -1, Buf::Recv, Buf::Recv, count, 0));
  }
  return s;
}

Schedule buildChainReduce(int rank, int n, int root, size_t count) {
  Schedule s = empty(Coll::Reduce, rank, n, root, count);
  auto& st = s.channels[0];
  if (n == 1) {
    st.push_back(wholeStep(StepOp::Copy, -1, -1, Buf::Send, Buf::Recv, count, kPre | kPost));
    return s;
  }
  const int pos = mod(rank - root - 1, n);  // 0 starts the chain, n-1 is the root
  const int next = mod(rank + 1, n), prev = mod(rank - 1, n);
  if (pos == 0)
    st.push_back(wholeStep(StepOp::Send, -1, next, Buf::Send, Buf::Recv, count, kPre));
  else if (pos < n - 1)
    st.push_back(wholeStep(StepOp::RecvReduceSend, prev, next, Buf::Send, Buf::Recv, count, kPre));
  else
    st.push_back(
        wholeStep(StepOp::RecvReduceCopy, prev, -1, Buf::Send, Buf::Recv, count, kPre | kPost));
  return s;
}

}  // namespace loom::algo
