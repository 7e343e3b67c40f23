// Direct all-to-all: every pair exchanges its block on its own connection.
// Step d (1..n-1): send block (r+d) to rank r+d, receive block (r-d) from
// rank r-d. Shifting the peer with d spreads the load: at each step every rank
// sends to a different peer and receives from a different one.
#include "algorithms/schedule.h"

namespace loom::algo {

Schedule buildDirectAllToAll(int rank, int n, size_t count) {
  Schedule s;
  s.coll = Coll::AllToAll;
  s.algorithm = "direct";
  s.rank = rank;
  s.nranks = n;
  s.count = count;
  s.channels.resize(1);
  auto& st = s.channels[0];
  Step own;
  own.op = StepOp::Copy;
  own.src = {Buf::Send, static_cast<size_t>(rank) * count};
  own.dst = {Buf::Recv, static_cast<size_t>(rank) * count};
  own.count = count;
  st.push_back(own);
  for (int d = 1; d < n; ++d) {
    const int to = (rank + d) % n, from = (rank - d + n) % n;
    Step send;
    send.op = StepOp::Send;
    send.sendPeer = to;
    send.src = {Buf::Send, static_cast<size_t>(to) * count};
    send.count = count;
    st.push_back(send);
    Step recv;
    recv.op = StepOp::Recv;
    recv.recvPeer = from;
    recv.dst = {Buf::Recv, static_cast<size_t>(from) * count};
    recv.count = count;
    st.push_back(recv);
  }
  return s;
}

}  // namespace loom::algo
