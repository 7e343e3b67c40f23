// A group of sends and receives as a schedule (schedule.h, buildGroup).
#include <map>

#include "algorithms/schedule.h"

namespace loom::algo {

Schedule buildGroup(int rank, int nranks, const std::vector<GroupBuf>& ops) {
  Schedule s = emptySchedule(Coll::SendRecv, "group", rank, nranks, -1, 0);
  s.group = ops;
  s.channels.clear();
  // Channel 0: the copies of sends to this rank into its receives from it, paired in order.
  std::vector<size_t> selfSends, selfRecvs;
  // Per peer, a channel for its sends and one for its receives, created in call order.
  std::map<std::pair<int, bool>, size_t> channelOf;
  std::vector<std::vector<Step>> channels(1);
  for (size_t i = 0; i < ops.size(); ++i) {
    const GroupBuf& o = ops[i];
    if (o.peer == rank) {
      (o.send ? selfSends : selfRecvs).push_back(i);
      continue;
    }
    if (o.count == 0) continue;
    auto it = channelOf.emplace(std::make_pair(o.peer, o.send), channels.size()).first;
    if (it->second == channels.size()) channels.emplace_back();
    const BufRef buf{Buf::Group, i};
    channels[it->second].push_back(o.send ? makeStep(StepOp::Send, -1, o.peer, buf, {}, o.count)
                                          : makeStep(StepOp::Recv, o.peer, -1, {}, buf, o.count));
  }
  for (size_t k = 0; k < selfSends.size() && k < selfRecvs.size(); ++k)
    channels[0].push_back(makeStep(StepOp::Copy, -1, -1, {Buf::Group, selfSends[k]},
                                   {Buf::Group, selfRecvs[k]}, ops[selfSends[k]].count));
  s.channels = std::move(channels);
  s.independent = true;  // a channel per directed pair, by construction
  return s;
}

}  // namespace loom::algo
