#include "algorithms/schedule.h"

#include <map>
#include <sstream>
#include <utility>

namespace loom::algo {

const char* collName(Coll c) {
  switch (c) {
    case Coll::AllReduce:
      return "allreduce";
    case Coll::Broadcast:
      return "broadcast";
    case Coll::Reduce:
      return "reduce";
    case Coll::AllGather:
      return "allgather";
    case Coll::ReduceScatter:
      return "reducescatter";
    case Coll::AllToAll:
      return "alltoall";
    case Coll::SendRecv:
      return "sendrecv";
  }
  return "?";
}

const char* stepOpName(StepOp op) {
  switch (op) {
    case StepOp::Send:
      return "send";
    case StepOp::Recv:
      return "recv";
    case StepOp::RecvReduceSend:
      return "recvReduceSend";
    case StepOp::RecvReduceCopy:
      return "recvReduceCopy";
    case StepOp::RecvReduceCopySend:
      return "recvReduceCopySend";
    case StepOp::RecvCopySend:
      return "recvCopySend";
    case StepOp::Copy:
      return "copy";
    case StepOp::MemPut:
      return "memPut";
    case StepOp::MemExpose:
      return "memExpose";
    case StepOp::MemPublish:
      return "memPublish";
    case StepOp::MemWait:
      return "memWait";
    case StepOp::MemReduce:
      return "memReduce";
    case StepOp::MemGather:
      return "memGather";
  }
  return "?";
}

const char* memWordName(MemWord w) {
  switch (w) {
    case MemWord::Ready:
      return "ready";
    case MemWord::Reduced:
      return "reduced";
  }
  return "?";
}

bool stepIsMemory(StepOp op) { return op >= StepOp::MemPut; }
bool stepRecvs(StepOp op) { return op <= StepOp::RecvCopySend && op != StepOp::Send; }
bool stepSends(StepOp op) {
  return op == StepOp::Send || op == StepOp::RecvReduceSend || op == StepOp::RecvReduceCopySend ||
         op == StepOp::RecvCopySend;
}
bool stepReads(StepOp op) {
  return op == StepOp::Send || op == StepOp::RecvReduceSend || op == StepOp::RecvReduceCopy ||
         op == StepOp::RecvReduceCopySend || op == StepOp::Copy || op == StepOp::MemPut ||
         op == StepOp::MemExpose || op == StepOp::MemReduce || op == StepOp::MemGather;
}
bool stepWrites(StepOp op) {
  return op == StepOp::Recv || op == StepOp::RecvReduceCopy || op == StepOp::RecvReduceCopySend ||
         op == StepOp::RecvCopySend || op == StepOp::Copy || op == StepOp::MemPut ||
         op == StepOp::MemReduce || op == StepOp::MemGather;
}

size_t numPieces(size_t count, size_t elemSize, size_t slotBytes) {
  if (count == 0) return 0;
  size_t perSlot = slotBytes / elemSize;
  if (perSlot == 0) perSlot = 1;
  return (count + perSlot - 1) / perSlot;
}

void pieceRange(size_t count, size_t pieces, size_t p, size_t* start, size_t* len) {
  // Equal pieces, the remainder spread over the first ones: every piece of a
  // step is within one element of the others, so all fit one slot.
  size_t base = count / pieces, rem = count % pieces;
  *start = p * base + (p < rem ? p : rem);
  *len = base + (p < rem ? 1 : 0);
}

void chunkRange(size_t count, int n, int c, size_t* offset, size_t* len) {
  pieceRange(count, static_cast<size_t>(n), static_cast<size_t>(c), offset, len);
}

const char* bufName(Buf b) {
  switch (b) {
    case Buf::Send:
      return "send";
    case Buf::Recv:
      return "recv";
    case Buf::Scratch:
      return "scratch";
    case Buf::Window:
      return "window";
    case Buf::Group:
      return "group";
  }
  return "?";
}

std::string toJson(const Schedule& s) {
  std::ostringstream o;
  o << "{\"coll\":\"" << collName(s.coll) << "\",\"algorithm\":\"" << s.algorithm
    << "\",\"rank\":" << s.rank << ",\"nranks\":" << s.nranks << ",\"root\":" << s.root
    << ",\"count\":" << s.count;
  if (s.scratchCount > 0) o << ",\"scratchCount\":" << s.scratchCount;
  if (!s.group.empty()) {
    o << ",\"group\":[";
    for (size_t i = 0; i < s.group.size(); ++i)
      o << (i ? "," : "") << "{\"" << (s.group[i].send ? "send" : "recv")
        << "\":" << s.group[i].peer << ",\"count\":" << s.group[i].count << "}";
    o << "]";
  }
  if (s.mem.slots > 0)
    o << ",\"window\":{\"count\":" << s.mem.count << ",\"slots\":" << s.mem.slots
      << ",\"rounds\":" << s.mem.rounds
      << ",\"lowLatency\":" << (s.mem.lowLatency ? "true" : "false") << "}";
  o << ",\"channels\":[";
  for (size_t c = 0; c < s.channels.size(); ++c) {
    o << (c ? "," : "") << "[";
    for (size_t i = 0; i < s.channels[c].size(); ++i) {
      const Step& st = s.channels[c][i];
      o << (i ? "," : "") << "{\"op\":\"" << stepOpName(st.op) << "\"";
      if (st.recvPeer >= 0) o << ",\"recvPeer\":" << st.recvPeer;
      if (st.sendPeer >= 0) o << ",\"sendPeer\":" << st.sendPeer;
      if (stepReads(st.op))
        o << ",\"src\":[\"" << bufName(st.src.buf) << "\"," << st.src.offset << "]";
      if (stepWrites(st.op))
        o << ",\"dst\":[\"" << bufName(st.dst.buf) << "\"," << st.dst.offset << "]";
      if (st.op != StepOp::MemPublish && st.op != StepOp::MemWait) o << ",\"count\":" << st.count;
      if (stepIsMemory(st.op)) o << ",\"round\":" << st.round;
      if (st.op == StepOp::MemPublish || st.op == StepOp::MemWait ||
          (st.op == StepOp::MemPut && (st.flags & kWithFlag)))
        o << ",\"word\":\"" << memWordName(static_cast<MemWord>(st.word)) << "\"";
      if (st.flags & (kOwnSrc | kAlsoOut)) o << ",\"aux\":" << st.aux;
      if (st.flags) o << ",\"flags\":" << static_cast<int>(st.flags);
      o << "}";
    }
    o << "]";
  }
  o << "]}";
  return o.str();
}

bool channelsIndependent(const Schedule& s) {
  std::map<std::pair<int, int>, size_t> owner;  // (from, to) -> channel
  for (size_t c = 0; c < s.channels.size(); ++c)
    for (const Step& st : s.channels[c]) {
      for (const auto& pair :
           {std::make_pair(st.recvPeer, s.rank), std::make_pair(s.rank, st.sendPeer)}) {
        if (pair.first < 0 || pair.second < 0) continue;
        auto it = owner.emplace(pair, c).first;
        if (it->second != c) return false;
      }
    }
  return true;
}

Schedule emptySchedule(Coll coll, const char* algorithm, int rank, int nranks, int root,
                       size_t count) {
  Schedule s;
  s.coll = coll;
  s.algorithm = algorithm;
  s.rank = rank;
  s.nranks = nranks;
  s.root = root;
  s.count = count;
  s.channels.resize(1);
  return s;
}

Step makeMemStep(StepOp op, uint32_t round, BufRef src, BufRef dst, size_t count, uint16_t flags,
                 size_t aux) {
  Step s = makeStep(op, -1, -1, src, dst, count, flags);
  s.round = round;
  s.aux = aux;
  return s;
}

Step makeFlagStep(StepOp op, MemWord word, uint32_t round) {
  Step s = makeStep(op, -1, -1, {}, {}, 0);
  s.round = round;
  s.word = static_cast<uint8_t>(word);
  return s;
}

Step makeStep(StepOp op, int recvPeer, int sendPeer, BufRef src, BufRef dst, size_t count,
              uint16_t flags) {
  Step s;
  s.op = op;
  s.recvPeer = recvPeer;
  s.sendPeer = sendPeer;
  s.src = src;
  s.dst = dst;
  s.count = count;
  s.flags = flags;
  return s;
}

Schedule build(Coll coll, int rank, int nranks, int root, size_t count, bool inPlace) {
  switch (coll) {
    case Coll::AllReduce:
      return buildRingAllReduce(rank, nranks, count);
    case Coll::AllGather:
      return buildRingAllGather(rank, nranks, count);
    case Coll::ReduceScatter:
      return buildRingReduceScatter(rank, nranks, count);
    case Coll::Broadcast:
      return buildChainBroadcast(rank, nranks, root, count, inPlace);
    case Coll::Reduce:
      return buildChainReduce(rank, nranks, root, count);
    case Coll::AllToAll:
      return buildDirectAllToAll(rank, nranks, count);
    case Coll::SendRecv:
      break;
  }
  return Schedule{};
}

const char* algoName(Algo a) {
  switch (a) {
    case Algo::Ring:
      return "ring";
    case Algo::Tree:
      return "tree";
    case Algo::Rhd:
      return "rhd";
    case Algo::Hier:
      return "hier";
    case Algo::Chain:
      return "chain";
    case Algo::Direct:
      return "direct";
    case Algo::Rd:
      return "rd";
    case Algo::HierRd:
      return "hierrd";
  }
  return "?";
}

bool parseAlgo(const std::string& name, Algo* out) {
  std::string lower;
  for (char ch : name) lower += static_cast<char>(ch >= 'A' && ch <= 'Z' ? ch - 'A' + 'a' : ch);
  for (int i = 0; i < kNumAlgos; ++i) {
    if (lower == algoName(static_cast<Algo>(i))) {
      *out = static_cast<Algo>(i);
      return true;
    }
  }
  return false;
}

bool algoBuilds(Algo a, Coll coll) {
  switch (a) {
    case Algo::Ring:
      return coll == Coll::AllReduce || coll == Coll::AllGather || coll == Coll::ReduceScatter;
    case Algo::Tree:
    case Algo::Hier:
    case Algo::HierRd:
    case Algo::Rd:
      return coll == Coll::AllReduce;
    case Algo::Rhd:
      return coll == Coll::AllReduce || coll == Coll::AllGather || coll == Coll::ReduceScatter;
    case Algo::Chain:
      return coll == Coll::Broadcast || coll == Coll::Reduce;
    case Algo::Direct:
      return coll == Coll::AllToAll || coll == Coll::AllReduce;
  }
  return false;
}

Schedule build(Algo a, Coll coll, int rank, int nranks, int root, size_t count, bool inPlace,
               const std::vector<int>& hostOf, const std::vector<int>& ringOrder) {
  if (a == Algo::Ring && algoBuilds(a, coll) && !ringOrder.empty())
    return buildRingInOrder(coll, rank, nranks, count, ringOrder);
  if (algoBuilds(a, coll)) {
    switch (a) {
      case Algo::Tree:
        return buildTreeAllReduce(rank, nranks, count, hostOf);
      case Algo::Hier:
        return buildHierAllReduce(rank, nranks, count, hostOf);
      case Algo::HierRd:
        return buildHierAllReduce(rank, nranks, count, hostOf, true);
      case Algo::Rd:
        return buildRdAllReduce(rank, nranks, count);
      case Algo::Direct:
        if (coll == Coll::AllReduce)
          return buildDirectAllReduce(rank, nranks, count, defaultDirectParams());
        break;
      case Algo::Rhd:
        return coll == Coll::AllReduce   ? buildRhdAllReduce(rank, nranks, count)
               : coll == Coll::AllGather ? buildRhdAllGather(rank, nranks, count)
                                         : buildRhdReduceScatter(rank, nranks, count);
      default:
        break;
    }
  }
  return build(coll, rank, nranks, root, count, inPlace);
}

}  // namespace loom::algo
