// Direct all-to-all: every pair exchanges its block on its own connection.
// Step d (1..n-1): send block (r+d) to rank r+d, receive block (r-d) from
// rank r-d. Shifting the peer with d spreads the load: at each step every rank
// sends to a different peer and receives from a different one.
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

}  // namespace loom::algo
