#include "algorithms/verifier.h"

#include <algorithm>
#include <cstdint>
#include <deque>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace loom::algo {
namespace {

// One symbolic element. Its contributor set lives beside it, in `words`
// 64-bit words per element (see Cells).
struct Val {
  uint32_t index = 0;  // element index in the contributors' send buffers
  uint16_t pre = 0;    // contributions pre-scaled (each at most once)
  uint8_t post = 0;    // times the post-op was applied
  uint8_t valid = 0;   // 0: undefined (never written)
};

// A run of symbolic elements with their contributor bitsets.
struct Cells {
  std::vector<Val> v;
  std::vector<uint64_t> bits;
  void resize(size_t n, size_t words) {
    v.assign(n, Val{});
    bits.assign(n * words, 0);
  }
};

// One piece in flight on a FIFO.
struct Msg {
  size_t len = 0;
  size_t step = 0;  // the sender's step and piece, for error messages
  size_t piece = 0;
  Cells data;
};

// The slots of one directed pair on one channel.
struct Fifo {
  int channel = 0, from = 0, to = 0;
  size_t head = 0, size = 0;
  std::vector<Msg> slots;
};

struct ChannelState {
  std::vector<std::pair<uint32_t, uint32_t>> order;  // (step, piece), round-major
  size_t pos = 0;                       // in order, repeated: operation pos / order.size()
  size_t sub = 0;                       // MemGather: the next rank (k of (rank + k) % n)
  std::vector<size_t> pieces;           // per step
  std::vector<int> recvFifo, sendFifo;  // per step, -1 if none
  bool queued = false;
};

// Who last wrote a location of shared memory, and who read it since: (rank, that rank's clock).
struct Access {
  int16_t writer = -1;
  uint32_t writeClock = 0;
  std::vector<std::pair<int16_t, uint32_t>> reads;
};

// A rank's flag: its value and, for each value published, the publisher's clock then.
struct Flag {
  uint64_t value = 0;
  std::vector<std::pair<uint64_t, std::vector<uint32_t>>> published;
};

struct RankState {
  Cells mem;  // the rank's buffers, aliased as the collective defines in place; per operation
  size_t sendBase = 0, sendSize = 0, recvBase = 0, recvSize = 0;
  size_t opStorage = 0;                     // elements of one operation's buffers
  std::vector<size_t> groupBase;            // SendRecv: each group buffer's start (operation 0)
  size_t groupCount = 0;                    // elements of one operation's group buffers
  size_t scratchBase = 0, scratchSize = 0;  // the schedule's scratch, after every operation's
  // Memory steps: the window (slots * count elements), who touched it and the rank's buffers
  // (peers read an exposed input in place), the flags, the clock, and each round's input
  // exposed in place (absolute round -> first element in mem, elements).
  Cells window;
  std::vector<Access> windowAccess, memAccess;
  Flag flags[kNumMemWords];
  std::vector<uint32_t> clock;
  struct Exposed {
    size_t first = 0, count = 0;  // in mem
    bool pre = false;             // read as pre-scaled (kPre)
  };
  std::map<uint64_t, Exposed> exposed;
  std::vector<ChannelState> ch;
  // Channel race tracking (only with several channels): per element, the
  // channel that wrote it and the channel that read it (-2: several), or -1.
  std::vector<int16_t> writer, reader;
};

enum class Fire { kFired, kBlocked, kDone, kError };

std::string rankSet(const uint64_t* bits, int n) {
  std::ostringstream o;
  o << "{";
  bool first = true;
  for (int r = 0; r < n;) {
    if (!(bits[r / 64] >> (r % 64) & 1)) {
      ++r;
      continue;
    }
    int e = r;
    while (e + 1 < n && (bits[(e + 1) / 64] >> ((e + 1) % 64) & 1)) ++e;
    o << (first ? "" : ",") << r;
    if (e > r) o << "-" << e;
    first = false;
    r = e + 1;
  }
  o << "}";
  return o.str();
}

class Simulator {
 public:
  Simulator(const std::vector<Schedule>& s, const VerifyOptions& o) : s_(s), opt_(o) {}

  VerifyResult run() {
    VerifyResult res;
    if (setup() && simulate() && checkFifos() && checkOutputs()) res.ok = true;
    res.error = error_;
    res.messages = messages_;
    return res;
  }

 private:
  bool fail(const std::string& e) {
    if (error_.empty()) error_ = e;
    return false;
  }

  std::string stepName(int r, size_t c, size_t i) const {
    const Step& st = s_[r].channels[c][i];
    std::ostringstream o;
    o << "rank " << r << " channel " << c << " step " << i << " (" << stepOpName(st.op);
    if (st.recvPeer >= 0) o << " from " << st.recvPeer;
    if (st.sendPeer >= 0) o << " to " << st.sendPeer;
    o << ", " << st.count << " elements)";
    return o.str();
  }

  std::string where(int r, size_t c, size_t i, size_t p) const {
    return stepName(r, c, i) + " piece " + std::to_string(p);
  }

  std::string describe(const Val& v, const uint64_t* bits) const {
    if (!v.valid) return "undefined";
    std::ostringstream o;
    o << "{index " << v.index << ", ranks " << rankSet(bits, n_) << ", pre-scaled " << v.pre
      << ", post-op " << static_cast<int>(v.post) << "}";
    return o.str();
  }

  // Buffer sizes and aliasing per collective; initial values.
  bool setupRank(int r) {
    RankState& rs = ranks_[r];
    const size_t c = count_, n = static_cast<size_t>(n_);
    const bool isRoot = r == root_;
    switch (coll_) {
      case Coll::AllReduce:
      case Coll::Broadcast:
        rs.sendSize = rs.recvSize = c;
        break;
      case Coll::Reduce:
        rs.sendSize = c;
        rs.recvSize = isRoot ? c : 0;
        break;
      case Coll::AllGather:
        rs.sendSize = c;
        rs.recvSize = n * c;
        break;
      case Coll::ReduceScatter:
        rs.sendSize = n * c;
        rs.recvSize = c;
        break;
      case Coll::AllToAll:
        rs.sendSize = rs.recvSize = n * c;
        break;
      case Coll::SendRecv:
        rs.sendSize = rs.recvSize = 0;
        break;
    }
    size_t storage = rs.sendSize + rs.recvSize;
    // A group's buffers, one after the other.
    const std::vector<GroupBuf>& group = s_[r].group;
    rs.groupBase.clear();
    for (const GroupBuf& g : group) {
      rs.groupBase.push_back(storage);
      storage += g.count;
    }
    rs.groupCount = storage - rs.sendSize - rs.recvSize;
    rs.sendBase = 0;
    rs.recvBase = rs.sendSize;
    if (opt_.inPlace) {
      storage = std::max(rs.sendSize, rs.recvSize);
      rs.recvBase = 0;
      if (coll_ == Coll::AllGather) rs.sendBase = static_cast<size_t>(r) * c;
      if (coll_ == Coll::ReduceScatter) rs.recvBase = static_cast<size_t>(r) * c;
    }
    // Every operation has its own buffers, one after the other.
    rs.opStorage = storage;
    storage *= reps_;
    // Scratch: its own storage, undefined until written, never an output.
    rs.scratchBase = storage;
    rs.scratchSize = s_[r].scratchCount;
    storage += rs.scratchSize;
    if (storage > UINT32_MAX || rs.sendSize * reps_ > UINT32_MAX)
      return fail("buffers too large to verify");
    rs.mem.resize(storage, words_);
    for (size_t op = 0; op < reps_; ++op)
      for (size_t i = 0; i < group.size(); ++i)
        for (size_t k = 0; group[i].send && k < group[i].count; ++k) {
          const size_t at = op * rs.opStorage + rs.groupBase[i] + k;
          Val& v = rs.mem.v[at];
          v.valid = 1;
          v.index = groupIndex(rs, op, i, k);
          rs.mem.bits[at * words_ + r / 64] = uint64_t{1} << (r % 64);
        }
    if (coll_ != Coll::Broadcast || isRoot) {
      for (size_t op = 0; op < reps_; ++op) {
        for (size_t k = 0; k < rs.sendSize; ++k) {
          const size_t at = op * rs.opStorage + rs.sendBase + k;
          Val& v = rs.mem.v[at];
          v.valid = 1;
          v.index = static_cast<uint32_t>(op * rs.sendSize + k);
          rs.mem.bits[at * words_ + r / 64] = uint64_t{1} << (r % 64);
        }
      }
    }
    if (memory_) {
      rs.window.resize(static_cast<size_t>(win_.slots) * win_.count, words_);
      rs.windowAccess.assign(rs.window.v.size(), Access{});
      rs.memAccess.assign(storage, Access{});
      rs.clock.assign(static_cast<size_t>(n_), 0);
      rs.clock[static_cast<size_t>(r)] = 1;
    }
    if (multiChannel_) {
      rs.writer.assign(storage, -1);
      rs.reader.assign(storage, -1);
    }
    return true;
  }

  bool checkRange(int r, size_t c, size_t i, const char* what, BufRef ref, size_t count) {
    const RankState& rs = ranks_[r];
    if (ref.buf == Buf::Group) {
      const std::vector<GroupBuf>& g = s_[r].group;
      if (ref.offset < g.size() && count <= g[ref.offset].count) return true;
      return fail(stepName(r, c, i) + ": " + what + " group buffer " + std::to_string(ref.offset) +
                  (ref.offset < g.size()
                       ? " holds " + std::to_string(g[ref.offset].count) + " elements"
                       : " does not exist (the group has " + std::to_string(g.size()) + ")"));
    }
    const size_t size = ref.buf == Buf::Send      ? rs.sendSize
                        : ref.buf == Buf::Recv    ? rs.recvSize
                        : ref.buf == Buf::Scratch ? rs.scratchSize
                                                  : win_.count;
    if (ref.offset <= size && count <= size - ref.offset) return true;
    std::ostringstream o;
    o << stepName(r, c, i) << ": " << what << " " << bufName(ref.buf) << "[" << ref.offset << ", "
      << ref.offset + count << ") is outside the " << bufName(ref.buf) << " buffer (" << size
      << " elements";
    if (coll_ == Coll::Reduce && ref.buf == Buf::Recv && r != root_)
      o << "; a non-root rank of reduce has no receive buffer";
    o << ")";
    return fail(o.str());
  }

  int fifoIndex(size_t c, int from, int to) {
    // Independent channels share each pair's connection, so messages match by pair alone.
    if (independent_) c = 0;
    uint64_t key = (static_cast<uint64_t>(c) * n_ + from) * n_ + to;
    if (fifoOf_[key] >= 0) return fifoOf_[key];
    Fifo f;
    f.channel = static_cast<int>(c);
    f.from = from;
    f.to = to;
    f.slots.resize(opt_.fifoDepth);
    fifos_.push_back(std::move(f));
    int idx = static_cast<int>(fifos_.size() - 1);
    fifoOf_[key] = idx;
    return idx;
  }

  bool setupStep(int r, size_t c, size_t i) {
    const Step& st = s_[r].channels[c][i];
    ChannelState& cs = ranks_[r].ch[c];
    if (static_cast<int>(st.op) >= kNumStepOps)
      return fail("rank " + std::to_string(r) + " channel " + std::to_string(c) + " step " +
                  std::to_string(i) + ": invalid op");
    if (stepIsMemory(st.op)) return setupMemStep(r, c, i);
    const bool recvs = stepRecvs(st.op), sends = stepSends(st.op);
    auto badPeer = [&](const char* what, int peer, bool used) {
      std::ostringstream o;
      o << stepName(r, c, i) << ": " << what << " " << peer;
      if (!used)
        o << " is set on a step that does not " << (what[0] == 'r' ? "receive" : "send");
      else if (peer == r)
        o << " is the rank itself";
      else
        o << " is not a rank of the " << n_ << "-rank communicator";
      return fail(o.str());
    };
    if (recvs && (st.recvPeer < 0 || st.recvPeer >= n_ || st.recvPeer == r))
      return badPeer("recvPeer", st.recvPeer, true);
    if (!recvs && st.recvPeer != -1) return badPeer("recvPeer", st.recvPeer, false);
    if (sends && (st.sendPeer < 0 || st.sendPeer >= n_ || st.sendPeer == r))
      return badPeer("sendPeer", st.sendPeer, true);
    if (!sends && st.sendPeer != -1) return badPeer("sendPeer", st.sendPeer, false);
    if ((st.flags & ~(kPre | kPost)) != 0) return fail(stepName(r, c, i) + ": unknown flags");
    if ((st.flags & kPre) && !stepReads(st.op))
      return fail(stepName(r, c, i) + ": kPre on a step that has no src operand");
    if (st.src.buf == Buf::Window || st.dst.buf == Buf::Window)
      return fail(stepName(r, c, i) + ": only memory steps use the window");
    if (stepReads(st.op) && !checkRange(r, c, i, "src", st.src, st.count)) return false;
    if (stepWrites(st.op)) {
      if (st.dst.buf == Buf::Send)
        return fail(stepName(r, c, i) + ": writes the send buffer, which is read-only");
      if (!checkRange(r, c, i, "dst", st.dst, st.count)) return false;
      if (st.dst.buf == Buf::Group && s_[r].group[st.dst.offset].send)
        return fail(stepName(r, c, i) + ": writes group buffer " + std::to_string(st.dst.offset) +
                    ", which is sent (read-only)");
    }
    cs.pieces[i] = numPieces(st.count, opt_.elemSize, opt_.slotBytes);
    cs.recvFifo[i] = recvs ? fifoIndex(c, st.recvPeer, r) : -1;
    cs.sendFifo[i] = sends ? fifoIndex(c, r, st.sendPeer) : -1;
    return true;
  }

  // A memory step's operands, flags and round.
  bool setupMemStep(int r, size_t c, size_t i) {
    const Step& st = s_[r].channels[c][i];
    const std::string name = stepName(r, c, i);
    if (!memory_) return fail(name + ": a memory step in a schedule without a window");
    if (c != 0) return fail(name + ": memory steps run on channel 0 only");
    if (st.recvPeer != -1 || st.sendPeer != -1) return fail(name + ": a memory step has no peer");
    if (st.round < 1 || st.round > win_.rounds)
      return fail(name + ": round " + std::to_string(st.round) + " is not in 1.." +
                  std::to_string(win_.rounds));
    const uint16_t allowed =
        st.op == StepOp::MemPut      ? (kPre | kStream | kWithFlag)
        : st.op == StepOp::MemExpose ? kPre
        : st.op == StepOp::MemReduce
            ? (kPre | kPost | kOwnSrc | kAlsoOut | kStream | kStreamOut | kMayExpose)
        : st.op == StepOp::MemGather ? (kNoWait | kSkipOwn | kStreamOut)
                                     : 0;
    if ((st.flags & ~allowed) != 0) return fail(name + ": flags not allowed on this step");
    if (st.op == StepOp::MemReduce && (st.flags & kPre) && !(st.flags & kOwnSrc))
      return fail(name + ": kPre without kOwnSrc (a peer's input is pre-scaled by its owner)");
    auto window = [&](const char* what, BufRef ref) {
      if (ref.buf != Buf::Window) return fail(name + ": " + what + " must be the window");
      return checkRange(r, c, i, what, ref, st.count);
    };
    auto local = [&](const char* what, BufRef ref) {
      if (ref.buf == Buf::Window) return fail(name + ": " + what + " must be a buffer");
      return checkRange(r, c, i, what, ref, st.count);
    };
    auto writable = [&](const char* what, BufRef ref) {
      if (ref.buf == Buf::Send) return fail(name + ": writes the send buffer, which is read-only");
      return ref.buf == Buf::Window ? window(what, ref) : local(what, ref);
    };
    switch (st.op) {
      case StepOp::MemPut:
        if (!local("src", st.src) || !window("dst", st.dst)) return false;
        if (st.word >= kNumMemWords) return fail(name + ": no such flag");
        break;
      case StepOp::MemExpose:
        if (st.src.buf != Buf::Send) return fail(name + ": only the send buffer is exposed");
        if (!local("src", st.src)) return false;
        if (st.count > win_.count)
          return fail(name + ": exposes more than a round (" + std::to_string(win_.count) + ")");
        break;
      case StepOp::MemPublish:
      case StepOp::MemWait:
        if (st.word >= kNumMemWords) return fail(name + ": no such flag");
        break;
      case StepOp::MemReduce:
        if (!window("src", st.src) || !writable("dst", st.dst)) return false;
        if ((st.flags & kOwnSrc) && !local("own src", {Buf::Send, st.aux})) return false;
        if ((st.flags & kAlsoOut) && !local("second dst", {Buf::Recv, st.aux})) return false;
        break;
      case StepOp::MemGather:
        if (!window("src", st.src)) return false;
        if (st.dst.buf != Buf::Recv) return fail(name + ": gathers into the receive buffer only");
        if (!local("dst", st.dst)) return false;
        break;
      default:
        break;
    }
    ranks_[r].ch[c].pieces[i] = 1;  // never cut into pieces
    return true;
  }

  bool setup() {
    n_ = static_cast<int>(s_.size());
    if (n_ == 0) return fail("no schedules");
    if (opt_.elemSize == 0 || opt_.slotBytes == 0 || opt_.fifoDepth == 0 || opt_.repeat == 0)
      return fail("elemSize, slotBytes, fifoDepth and repeat must be positive");
    reps_ = opt_.repeat;
    const Schedule& s0 = s_[0];
    win_ = s0.mem;
    memory_ = win_.slots > 0;
    if (memory_ && win_.count * win_.slots > (size_t{1} << 24))
      return fail("windows too large to verify");
    coll_ = s0.coll;
    count_ = s0.count;
    root_ = s0.root;
    words_ = (static_cast<size_t>(n_) + 63) / 64;
    const bool rooted = coll_ == Coll::Broadcast || coll_ == Coll::Reduce;
    if (rooted && (root_ < 0 || root_ >= n_))
      return fail("root " + std::to_string(root_) + " is not a rank of the " + std::to_string(n_) +
                  "-rank communicator");
    if (opt_.inPlace && (coll_ == Coll::AllToAll || coll_ == Coll::SendRecv))
      return fail(std::string(collName(coll_)) + " has no in-place form");
    independent_ = true;
    for (const Schedule& s : s_) independent_ = independent_ && s.independent;
    for (int r = 0; r < n_; ++r) {
      const Schedule& s = s_[r];
      std::string who = "schedule " + std::to_string(r);
      if (s.rank != r) return fail(who + " has rank " + std::to_string(s.rank));
      if (s.nranks != n_)
        return fail(who + " has nranks " + std::to_string(s.nranks) + ", but there are " +
                    std::to_string(n_) + " schedules");
      if (s.coll != coll_)
        return fail(who + " is " + collName(s.coll) + ", not " + collName(coll_));
      if (s.count != count_) return fail(who + " has count " + std::to_string(s.count));
      if (rooted && s.root != root_) return fail(who + " has root " + std::to_string(s.root));
      if (s.mem.count != win_.count || s.mem.slots != win_.slots || s.mem.rounds != win_.rounds ||
          s.mem.lowLatency != win_.lowLatency)
        return fail(who + "'s window differs from schedule 0's");
      if (!independent_ && s.channels.size() != s0.channels.size())
        return fail(who + " has " + std::to_string(s.channels.size()) + " channels, schedule 0 " +
                    std::to_string(s0.channels.size()));
    }
    size_t channels = 0;
    for (const Schedule& s : s_) channels = std::max(channels, s.channels.size());
    multiChannel_ = channels > 1;
    if (independent_)
      for (const Schedule& s : s_)
        if (!channelsIndependent(s))
          return fail("schedule " + std::to_string(s.rank) +
                      " says its channels are independent, but a pair of ranks carries two "
                      "channels' messages");
    const uint64_t pairs = static_cast<uint64_t>(independent_ ? 1 : channels) * n_ * n_;
    if (pairs > (uint64_t{1} << 26)) return fail("too many ranks and channels to verify");
    fifoOf_.assign(pairs, -1);
    ranks_.resize(n_);
    for (int r = 0; r < n_; ++r) {
      if (!setupRank(r)) return false;
      RankState& rs = ranks_[r];
      rs.ch.resize(s_[r].channels.size());
      for (size_t c = 0; c < rs.ch.size(); ++c) {
        ChannelState& cs = rs.ch[c];
        const auto& steps = s_[r].channels[c];
        cs.pieces.assign(steps.size(), 0);
        cs.recvFifo.assign(steps.size(), -1);
        cs.sendFifo.assign(steps.size(), -1);
        for (size_t i = 0; i < steps.size(); ++i)
          if (!setupStep(r, c, i)) return false;
        // Round-major order: round p runs piece p of every step that has one.
        std::vector<uint32_t> active(steps.size());
        for (size_t i = 0; i < steps.size(); ++i) active[i] = static_cast<uint32_t>(i);
        for (uint32_t p = 0; !active.empty(); ++p) {
          size_t keep = 0;
          for (uint32_t i : active) {
            if (cs.pieces[i] <= p) continue;
            cs.order.emplace_back(i, p);
            active[keep++] = i;
          }
          active.resize(keep);
        }
      }
    }
    return true;
  }

  // Channel race bookkeeping for element `idx` of rank r.
  bool touch(int r, size_t c, size_t i, size_t p, size_t idx, bool write) {
    RankState& rs = ranks_[r];
    const int16_t ch = static_cast<int16_t>(c);
    int16_t& w = rs.writer[idx];
    int16_t& rd = rs.reader[idx];
    bool race = (w != -1 && w != ch) || (write && rd != -1 && rd != ch);
    if (race) {
      std::ostringstream o;
      o << where(r, static_cast<size_t>(c), i, p) << ": " << (write ? "writes" : "reads")
        << " element " << idx << " of the rank's buffers, which channel "
        << (w != -1 && w != ch ? w : rd) << " also uses (channels race)";
      return fail(o.str());
    }
    if (write)
      w = ch;
    else
      rd = (rd == -1 || rd == ch) ? ch : -2;
    return true;
  }

  // Where buffer b of the operation being run (op_) starts in rs.mem.
  size_t base(const RankState& rs, Buf b) const {
    const size_t op = op_ * rs.opStorage;
    return b == Buf::Send ? op + rs.sendBase : b == Buf::Recv ? op + rs.recvBase : rs.scratchBase;
  }
  // Where `ref` starts in rs.mem (a group buffer, whole, or an offset into a buffer).
  size_t addr(const RankState& rs, BufRef ref) const {
    if (ref.buf == Buf::Group) return op_ * rs.opStorage + rs.groupBase[ref.offset];
    return base(rs, ref.buf) + ref.offset;
  }
  // The symbolic index of element k of group buffer i in operation op: unique in the rank.
  static uint32_t groupIndex(const RankState& rs, size_t op, size_t i, size_t k) {
    return static_cast<uint32_t>(op * rs.groupCount + rs.groupBase[i] - rs.sendSize - rs.recvSize +
                                 k);
  }

  // scratch = src piece, applying kPre.
  bool load(int r, size_t c, size_t i, size_t p, const Step& st, size_t start, size_t len) {
    RankState& rs = ranks_[r];
    const size_t b = addr(rs, st.src) + start;
    const size_t W = words_;
    scratch_.v.resize(len);
    scratch_.bits.resize(len * W);
    for (size_t k = 0; k < len; ++k) {
      const Val& v = rs.mem.v[b + k];
      if (!v.valid) {
        std::ostringstream o;
        o << where(r, c, i, p) << ": reads src " << bufName(st.src.buf) << "["
          << st.src.offset + start + k << "], which is undefined";
        return fail(o.str());
      }
      if (multiChannel_ && !touch(r, c, i, p, b + k, false)) return false;
      scratch_.v[k] = v;
      const uint64_t* from = &rs.mem.bits[(b + k) * W];
      uint64_t* to = &scratch_.bits[k * W];
      for (size_t w = 0; w < W; ++w) to[w] = from[w];
      if (st.flags & kPre) {
        Val& s = scratch_.v[k];
        bool own = s.pre == 0 && s.post == 0 && (to[r / 64] >> (r % 64) & 1);
        for (size_t w = 0; own && w < W; ++w)
          own = to[w] == (w == static_cast<size_t>(r) / 64 ? uint64_t{1} << (r % 64) : 0);
        if (!own) {
          std::ostringstream o;
          o << where(r, c, i, p) << ": kPre on src " << bufName(st.src.buf) << "["
            << st.src.offset + start + k << "] = " << describe(s, to)
            << ", which is not this rank's own unscaled input"
            << (s.pre ? " (a contribution would be pre-scaled twice)" : "");
          return fail(o.str());
        }
        s.pre = 1;
      }
    }
    return true;
  }

  // Why value a (bits ab) cannot be reduced into b (bits bb), or null when it can.
  const char* cannotCombine(const Val& a, const uint64_t* ab, const Val& b,
                            const uint64_t* bb) const {
    if (!a.valid) return "the value is undefined";
    if (a.index != b.index) return "the values have different source indices";
    if (a.post || b.post) return "a value already has the post-op applied";
    for (size_t w = 0; w < words_; ++w)
      if (ab[w] & bb[w]) return "the contributor sets overlap (a contribution is reduced twice)";
    return nullptr;
  }

  // into (+)= from, element-wise; error(k, why) words a failure at element k.
  template <typename Error>
  bool combine(Cells& into, const Cells& from, Error&& error) {
    const size_t W = words_;
    for (size_t k = 0; k < into.v.size(); ++k) {
      Val& b = into.v[k];
      uint64_t* bb = &into.bits[k * W];
      const Val& a = from.v[k];
      const uint64_t* ab = &from.bits[k * W];
      if (const char* why = cannotCombine(a, ab, b, bb)) return fail(error(k, why));
      b.pre = static_cast<uint16_t>(b.pre + a.pre);
      for (size_t w = 0; w < W; ++w) bb[w] |= ab[w];
    }
    return true;
  }

  // scratch = in (+) scratch, element-wise.
  bool reduce(int r, size_t c, size_t i, size_t p, const Msg& in) {
    return combine(scratch_, in.data, [&](size_t k, const char* why) {
      std::ostringstream o;
      o << where(r, c, i, p) << ": element " << k << " of the piece: cannot reduce received "
        << describe(in.data.v[k], &in.data.bits[k * words_]) << " (from rank "
        << s_[r].channels[c][i].recvPeer << " step " << in.step << ") with local "
        << describe(scratch_.v[k], &scratch_.bits[k * words_]) << ": " << why;
      return o.str();
    });
  }

  bool applyPost(int r, size_t c, size_t i, size_t p) {
    for (size_t k = 0; k < scratch_.v.size(); ++k) {
      Val& v = scratch_.v[k];
      if (v.post) {
        std::ostringstream o;
        o << where(r, c, i, p) << ": element " << k << " of the piece: post-op applied twice to "
          << describe(v, &scratch_.bits[k * words_]);
        return fail(o.str());
      }
      v.post = 1;
    }
    return true;
  }

  bool store(int r, size_t c, size_t i, size_t p, const Step& st, size_t start) {
    RankState& rs = ranks_[r];
    const size_t b = addr(rs, st.dst) + start;
    const size_t W = words_;
    for (size_t k = 0; k < scratch_.v.size(); ++k) {
      if (multiChannel_ && !touch(r, c, i, p, b + k, true)) return false;
      rs.mem.v[b + k] = scratch_.v[k];
      for (size_t w = 0; w < W; ++w) rs.mem.bits[(b + k) * W + w] = scratch_.bits[k * W + w];
    }
    return true;
  }

  // A FIFO of rank r's changed: its channel c runs again, or, where channels are independent
  // (the peer's channel on that pair may have another number), every channel of r.
  void wake(int r, size_t c) {
    if (!independent_) return enqueue(r, c);
    for (size_t k = 0; k < ranks_[r].ch.size(); ++k) enqueue(r, k);
  }

  void enqueue(int r, size_t c) {
    ChannelState& cs = ranks_[r].ch[c];
    if (cs.queued || cs.pos == cs.order.size() * reps_) return;
    cs.queued = true;
    queue_.emplace_back(r, c);
  }

  // Runs the next piece of rank r's channel c if both its FIFOs allow.
  Fire fire(int r, size_t c) {
    ChannelState& cs = ranks_[r].ch[c];
    if (cs.pos == cs.order.size() * reps_) return Fire::kDone;
    op_ = cs.pos / cs.order.size();
    const auto [i, p] = cs.order[cs.pos % cs.order.size()];
    const Step& st = s_[r].channels[c][i];
    if (stepIsMemory(st.op)) {
      const Fire f = fireMem(r, c, i, st);
      if (f == Fire::kFired && !endOfOperation(r, c)) return Fire::kError;
      return f;
    }
    size_t start, len;
    pieceRange(st.count, cs.pieces[i], p, &start, &len);
    Fifo* in = cs.recvFifo[i] >= 0 ? &fifos_[cs.recvFifo[i]] : nullptr;
    Fifo* out = cs.sendFifo[i] >= 0 ? &fifos_[cs.sendFifo[i]] : nullptr;
    if (in && in->size == 0) return Fire::kBlocked;
    if (out && out->size == opt_.fifoDepth) return Fire::kBlocked;
    Msg* m = in ? &in->slots[in->head] : nullptr;
    if (m && m->len != len) {
      std::ostringstream o;
      o << where(r, c, i, p) << " expects " << len << " elements, but the piece from rank "
        << st.recvPeer << " (" << stepName(st.recvPeer, c, m->step) << " piece " << m->piece
        << ") has " << m->len << " (size mismatch)";
      fail(o.str());
      return Fire::kError;
    }
    bool ok = true;
    switch (st.op) {
      case StepOp::Send:
      case StepOp::Copy:
        ok = load(r, c, i, p, st, start, len);
        break;
      case StepOp::Recv:
      case StepOp::RecvCopySend:
        // Sent values were all defined when loaded: take the piece as it is.
        std::swap(scratch_, m->data);
        break;
      case StepOp::RecvReduceSend:
      case StepOp::RecvReduceCopy:
      case StepOp::RecvReduceCopySend:
        ok = load(r, c, i, p, st, start, len) && reduce(r, c, i, p, *m);
        break;
      default:  // memory steps: fireMem
        break;
    }
    if (ok && (st.flags & kPost)) ok = applyPost(r, c, i, p);
    if (ok && stepWrites(st.op)) ok = store(r, c, i, p, st, start);
    if (!ok) return Fire::kError;
    if (in) {
      in->head = (in->head + 1) % opt_.fifoDepth;
      --in->size;
      wake(in->from, c);
    }
    if (out) {
      Msg& slot = out->slots[(out->head + out->size) % opt_.fifoDepth];
      slot.len = len;
      slot.step = i;
      slot.piece = p;
      std::swap(slot.data, scratch_);
      ++out->size;
      ++messages_;
      wake(out->to, c);
    }
    ++cs.pos;
    if (!endOfOperation(r, c)) return Fire::kError;
    return Fire::kFired;
  }

  // --- memory steps ---

  bool before(int r, int q, uint32_t clock) const {
    return q == r || ranks_[r].clock[static_cast<size_t>(q)] >= clock;
  }

  std::string windowName(int q, uint64_t round, size_t at) const {
    return "rank " + std::to_string(q) + "'s window[" + std::to_string(at % win_.count) +
           "] (buffer " + std::to_string(at / win_.count) + ", round " + std::to_string(round) +
           ")";
  }

  // Rank r reads a location that `a` tracks: what it reads must have been written before.
  bool readShared(int r, Access& a, const std::string& where, const std::string& what) {
    if (a.writer >= 0 && !before(r, a.writer, a.writeClock))
      return fail(where + ": reads " + what + " while rank " + std::to_string(a.writer) +
                  " may still be writing it (no flag wait orders the write before the read: a "
                  "race)");
    const uint32_t now = ranks_[r].clock[static_cast<size_t>(r)];
    for (auto& rd : a.reads)
      if (rd.first == r) {
        rd.second = now;
        return true;
      }
    a.reads.emplace_back(static_cast<int16_t>(r), now);
    return true;
  }

  // Rank r writes a location that `a` tracks: every earlier access by a peer must be ordered
  // before it.
  bool writeShared(int r, Access& a, const std::string& where, const std::string& what) {
    if (a.writer >= 0 && !before(r, a.writer, a.writeClock))
      return fail(where + ": writes " + what + " while rank " + std::to_string(a.writer) +
                  " may still be writing it (a race)");
    for (const auto& rd : a.reads)
      if (!before(r, rd.first, rd.second))
        return fail(where + ": overwrites " + what + " while rank " + std::to_string(rd.first) +
                    " may still be reading it (no flag wait orders the read before the write: a "
                    "race)");
    a.writer = static_cast<int16_t>(r);
    a.writeClock = ranks_[r].clock[static_cast<size_t>(r)];
    a.reads.clear();
    return true;
  }

  uint64_t absRound(const Step& st) const { return op_ * win_.rounds + st.round; }
  size_t windowAt(uint64_t round, size_t offset) const {
    return static_cast<size_t>(round % win_.slots) * win_.count + offset;
  }

  // Copies `len` values into a run of cells.
  static void copyCells(Cells& to, size_t at, const Cells& from, size_t fromAt, size_t len,
                        size_t W) {
    for (size_t k = 0; k < len; ++k) {
      to.v[at + k] = from.v[fromAt + k];
      for (size_t w = 0; w < W; ++w) to.bits[(at + k) * W + w] = from.bits[(fromAt + k) * W + w];
    }
  }

  // scratch_ = rank q's input of `round` at [offset, +len), as rank r reads it: from q's window,
  // or in place where q exposed it.
  bool readInput(int r, int q, uint64_t round, size_t offset, size_t len, const std::string& at,
                 bool mayExpose) {
    RankState& qs = ranks_[q];
    auto ex = qs.exposed.find(round);
    if (ex != qs.exposed.end() && !mayExpose)
      return fail(at + ": reads rank " + std::to_string(q) + "'s window of round " +
                  std::to_string(round) + ", but rank " + std::to_string(q) +
                  " exposed its input in place (the step has no kMayExpose)");
    Cells& from = ex != qs.exposed.end() ? qs.mem : qs.window;
    std::vector<Access>& acc = ex != qs.exposed.end() ? qs.memAccess : qs.windowAccess;
    const size_t first =
        ex != qs.exposed.end() ? ex->second.first + offset : windowAt(round, offset);
    if (ex != qs.exposed.end() && offset + len > ex->second.count)
      return fail(at + ": reads past rank " + std::to_string(q) + "'s input exposed for round " +
                  std::to_string(round));
    for (size_t k = 0; k < len; ++k) {
      const std::string what = ex != qs.exposed.end()
                                   ? "rank " + std::to_string(q) + "'s input in place [" +
                                         std::to_string(offset + k) + "] (round " +
                                         std::to_string(round) + ")"
                                   : windowName(q, round, first + k);
      if (q != r && !readShared(r, acc[first + k], at, what)) return false;
      if (!from.v[first + k].valid) return fail(at + ": reads " + what + ", which is undefined");
    }
    scratch_.resize(len, words_);
    copyCells(scratch_, 0, from, first, len, words_);
    if (ex != qs.exposed.end() && ex->second.pre)
      for (Val& v : scratch_.v) {
        if (v.pre != 0) return fail(at + ": a contribution would be pre-scaled twice");
        v.pre = 1;
      }
    return true;
  }

  // Writes scratch_ to rank r's window of `round` at offset, or to its buffer `ref`.
  bool writeOut(int r, uint64_t round, BufRef ref, const std::string& at) {
    RankState& rs = ranks_[r];
    const size_t len = scratch_.v.size();
    if (ref.buf != Buf::Window) {
      copyCells(rs.mem, base(rs, ref.buf) + ref.offset, scratch_, 0, len, words_);
      return true;
    }
    const size_t first = windowAt(round, ref.offset);
    for (size_t k = 0; k < len; ++k)
      if (!writeShared(r, rs.windowAccess[first + k], at, windowName(r, round, first + k)))
        return false;
    copyCells(rs.window, first, scratch_, 0, len, words_);
    return true;
  }

  // acc (+)= scratch_ (rank q's input), element-wise.
  bool combineInput(Cells& acc, const std::string& at, int q) {
    return combine(acc, scratch_, [&](size_t k, const char* why) {
      std::ostringstream o;
      o << at << ": element " << k << ": cannot reduce rank " << q << "'s "
        << describe(scratch_.v[k], &scratch_.bits[k * words_]) << " into "
        << describe(acc.v[k], &acc.bits[k * words_]) << ": " << why;
      return o.str();
    });
  }

  // Whether rank q's flag `word` has reached `round`; if so rank r acquires q's clock of then.
  bool acquire(int r, int q, int word, uint64_t round) {
    const Flag& f = ranks_[q].flags[word];
    if (f.value < round) return false;
    for (const auto& pub : f.published) {
      if (pub.first < round) continue;
      std::vector<uint32_t>& mine = ranks_[r].clock;
      for (size_t k = 0; k < mine.size(); ++k) mine[k] = std::max(mine[k], pub.second[k]);
      break;
    }
    return true;
  }

  // Rank r's flag st.word reaches `round`, releasing r's clock.
  bool publish(int r, const Step& st, uint64_t round, const std::string& at) {
    RankState& rs = ranks_[r];
    Flag& f = rs.flags[st.word];
    if (round <= f.value)
      return fail(at + ": publishes round " + std::to_string(round) + " of its " +
                  memWordName(static_cast<MemWord>(st.word)) + " flag, which is at " +
                  std::to_string(f.value) + " already (flags only grow)");
    f.value = round;
    f.published.emplace_back(round, rs.clock);
    ++rs.clock[static_cast<size_t>(r)];
    for (int q = 0; q < n_; ++q)
      if (q != r) enqueue(q, 0);
    return true;
  }

  Fire fireMem(int r, size_t c, size_t i, const Step& st) {
    RankState& rs = ranks_[r];
    ChannelState& cs = rs.ch[c];
    const std::string at = where(r, c, i, 0) + " of operation " + std::to_string(op_);
    const uint64_t round = absRound(st);
    const bool ok = [&]() -> bool {
      switch (st.op) {
        case StepOp::MemPut:
          return load(r, c, i, 0, st, 0, st.count) && writeOut(r, round, st.dst, at) &&
                 (!(st.flags & kWithFlag) || publish(r, st, round, at));
        case StepOp::MemExpose:
          rs.exposed[round] = {base(rs, Buf::Send) + st.src.offset, st.count,
                               (st.flags & kPre) != 0};
          return true;
        case StepOp::MemPublish:
          return publish(r, st, round, at);
        default:
          return true;
      }
    }();
    if (!ok) return Fire::kError;
    switch (st.op) {
      case StepOp::MemWait: {
        bool all = true;
        for (int q = 0; q < n_ && all; ++q) all = q == r || ranks_[q].flags[st.word].value >= round;
        if (!all) return Fire::kBlocked;
        for (int q = 0; q < n_; ++q)
          if (q != r) acquire(r, q, st.word, round);
        break;
      }
      case StepOp::MemReduce: {
        Cells acc;
        const int first = st.dst.buf == Buf::Window ? r : 0;
        for (int k = 0; k < n_; ++k) {
          const int q = (first + k) % n_;
          bool ok2;
          if (q == r && (st.flags & kOwnSrc)) {
            BufRef own{Buf::Send, st.aux};
            Step view = st;
            view.src = own;
            view.flags = st.flags & kPre;
            ok2 = load(r, c, i, 0, view, 0, st.count);
          } else {
            ok2 = readInput(r, q, round, st.src.offset, st.count, at, (st.flags & kMayExpose) != 0);
          }
          if (!ok2) return Fire::kError;
          if (k == 0) {
            std::swap(acc, scratch_);
          } else if (!combineInput(acc, at, q)) {
            return Fire::kError;
          }
        }
        std::swap(acc, scratch_);
        if ((st.flags & kPost) && !applyPost(r, c, i, 0)) return Fire::kError;
        if (!writeOut(r, round, st.dst, at)) return Fire::kError;
        if ((st.flags & kAlsoOut) && !writeOut(r, round, {Buf::Recv, st.aux}, at))
          return Fire::kError;
        break;
      }
      case StepOp::MemGather: {
        for (; cs.sub < static_cast<size_t>(n_); ++cs.sub) {
          const int q = (r + static_cast<int>(cs.sub)) % n_;
          if (q == r && (st.flags & kSkipOwn)) continue;
          if (q != r && !(st.flags & kNoWait) &&
              !acquire(r, q, static_cast<int>(MemWord::Reduced), round))
            return Fire::kBlocked;
          size_t qo, ql;
          chunkRange(st.count, n_, q, &qo, &ql);
          RankState& qs = ranks_[q];
          const size_t first = windowAt(round, st.src.offset + qo);
          for (size_t k = 0; k < ql; ++k) {
            const std::string what = windowName(q, round, first + k);
            if (q != r && !readShared(r, qs.windowAccess[first + k], at, what)) return Fire::kError;
            if (!qs.window.v[first + k].valid) {
              fail(at + ": reads " + what + ", which is undefined");
              return Fire::kError;
            }
          }
          scratch_.resize(ql, words_);
          copyCells(scratch_, 0, qs.window, first, ql, words_);
          if (!writeOut(r, round, {Buf::Recv, st.dst.offset + qo}, at)) return Fire::kError;
        }
        cs.sub = 0;
        break;
      }
      default:
        break;
    }
    ++cs.pos;
    return Fire::kFired;
  }

  // Once rank r's channel c has finished an operation, its caller may write the send buffer:
  // that counts as a write of each input it exposed, so a peer's read not ordered before the
  // return (or made after it) is a race.
  bool endOfOperation(int r, size_t c) {
    ChannelState& cs = ranks_[r].ch[c];
    if (!memory_ || cs.pos % cs.order.size() != 0) return true;
    RankState& rs = ranks_[r];
    const size_t op = cs.pos / cs.order.size() - 1;
    for (auto it = rs.exposed.begin(); it != rs.exposed.end(); ++it) {
      if (it->first <= op * win_.rounds || it->first > (op + 1) * win_.rounds) continue;
      const std::string at = "rank " + std::to_string(r) + " returns from operation " +
                             std::to_string(op) + ", and its caller may write the send buffer";
      for (size_t k = 0; k < it->second.count; ++k)
        if (!writeShared(r, rs.memAccess[it->second.first + k], at,
                         "its input exposed in place for round " + std::to_string(it->first)))
          return false;
    }
    return true;
  }

  bool simulate() {
    for (int r = 0; r < n_; ++r)
      for (size_t c = 0; c < ranks_[r].ch.size(); ++c) enqueue(r, c);
    while (!queue_.empty()) {
      auto [r, c] = queue_.front();
      queue_.pop_front();
      ranks_[r].ch[c].queued = false;
      Fire f;
      while ((f = fire(r, c)) == Fire::kFired) {
      }
      if (f == Fire::kError) return false;
    }
    std::ostringstream o;
    size_t stuck = 0;
    for (int r = 0; r < n_; ++r)
      for (size_t c = 0; c < ranks_[r].ch.size(); ++c) {
        const ChannelState& cs = ranks_[r].ch[c];
        if (cs.pos == cs.order.size() * reps_) continue;
        const auto [i, p] = cs.order[cs.pos % cs.order.size()];
        const Step& st = s_[r].channels[c][i];
        o << (stuck++ ? "; " : "") << where(r, c, i, p);
        if (reps_ > 1) o << " of operation " << cs.pos / cs.order.size();
        if (stepIsMemory(st.op)) {
          const int word = st.op == StepOp::MemGather ? static_cast<int>(MemWord::Reduced)
                                                      : static_cast<int>(st.word);
          const uint64_t round = (cs.pos / cs.order.size()) * win_.rounds + st.round;
          for (int q = 0; q < n_; ++q)
            if (q != r && ranks_[q].flags[word].value < round)
              o << " waits for rank " << q << "'s " << memWordName(static_cast<MemWord>(word))
                << " flag to reach round " << round << " (it is at " << ranks_[q].flags[word].value
                << ")";
        } else if (cs.recvFifo[i] >= 0 && fifos_[cs.recvFifo[i]].size == 0) {
          o << " waits for a piece from rank " << st.recvPeer;
          for (const Fifo& f : fifos_)
            if (f.to == r && f.channel == static_cast<int>(c) && f.size > 0)
              o << " (while " << f.size << " piece(s) from rank " << f.from << ", first sent by "
                << "its step " << f.slots[f.head].step << ", wait unreceived)";
        } else {
          o << " waits for a free slot to rank " << st.sendPeer << " (" << opt_.fifoDepth
            << " full)";
        }
      }
    if (stuck) return fail("deadlock: " + o.str());
    return true;
  }

  bool checkFifos() {
    for (const Fifo& f : fifos_) {
      if (f.size == 0) continue;
      const Msg& m = f.slots[f.head];
      std::ostringstream o;
      o << f.size << " piece(s) sent by rank " << f.from << " to rank " << f.to << " on channel "
        << f.channel << " are never received (first: " << stepName(f.from, f.channel, m.step)
        << " piece " << m.piece << ")";
      return fail(o.str());
    }
    return true;
  }

  // Checks recv[at] of rank r against {index, contributors (all ranks or just
  // `only`), pre-scaled, post-op} as the collective defines it.
  bool expect(int r, size_t at, size_t index, int only) {
    const RankState& rs = ranks_[r];
    const size_t cell = op_ * rs.opStorage + rs.recvBase + at;
    index += op_ * rs.sendSize;
    const Val& v = rs.mem.v[cell];
    const uint64_t* bits = &rs.mem.bits[cell * words_];
    const bool reduced = only < 0;
    bool ok =
        v.valid && v.index == index && v.pre == (reduced ? n_ : 0) && v.post == (reduced ? 1 : 0);
    for (size_t w = 0; ok && w < words_; ++w) {
      uint64_t want;
      if (reduced) {
        size_t lo = w * 64, hi = std::min(lo + 64, static_cast<size_t>(n_));
        want = hi - lo == 64 ? ~uint64_t{0} : (uint64_t{1} << (hi - lo)) - 1;
      } else {
        want = static_cast<size_t>(only) / 64 == w ? uint64_t{1} << (only % 64) : 0;
      }
      ok = bits[w] == want;
    }
    if (ok) return true;
    std::ostringstream o;
    o << collName(coll_) << ": rank " << r;
    if (reps_ > 1) o << " operation " << op_;
    o << " recv[" << at << "] is " << describe(v, bits) << ", but should be {index " << index
      << ", ranks ";
    if (reduced)
      o << "{0-" << n_ - 1 << "}, pre-scaled " << n_ << ", post-op 1}";
    else
      o << "{" << only << "}, pre-scaled 0, post-op 0}";
    if (v.valid && reduced) {
      std::vector<uint64_t> missing(words_);
      for (int q = 0; q < n_; ++q)
        if (!(bits[q / 64] >> (q % 64) & 1)) missing[q / 64] |= uint64_t{1} << (q % 64);
      std::string m = rankSet(missing.data(), n_);
      if (m != "{}") o << " (missing contributions of ranks " << m << ")";
    }
    return fail(o.str());
  }

  bool checkOutputs() {
    for (op_ = 0; op_ < reps_; ++op_)
      if (!checkOutputsOf()) return false;
    return true;
  }

  // SendRecv: the m-th receive of rank r from rank p holds p's m-th send to r (a send to
  // itself pairs with its receive from itself the same way), untouched by any reduction.
  bool checkGroupOutputs() {
    for (int r = 0; r < n_; ++r) {
      const RankState& rs = ranks_[r];
      const std::vector<GroupBuf>& group = s_[r].group;
      std::map<int, size_t> seen;  // receives so far, by peer
      for (size_t j = 0; j < group.size(); ++j) {
        if (group[j].send) continue;
        const int p = group[j].peer;
        const size_t m = seen[p]++;  // zero-length receives count: they pair up too
        if (group[j].count == 0) continue;
        const std::vector<GroupBuf>& theirs = s_[p].group;
        size_t i = 0, sends = 0;
        for (; i < theirs.size(); ++i)
          if (theirs[i].send && theirs[i].peer == r && sends++ == m) break;
        const std::string where = "sendrecv: rank " + std::to_string(r) + " operation " +
                                  std::to_string(op_) + " group buffer " + std::to_string(j) +
                                  " (receive " + std::to_string(m) + " from rank " +
                                  std::to_string(p) + ")";
        if (i == theirs.size())
          return fail(where + ": rank " + std::to_string(p) + " sends no match");
        for (size_t k = 0; k < group[j].count; ++k) {
          const size_t cell = op_ * rs.opStorage + rs.groupBase[j] + k;
          const Val& v = rs.mem.v[cell];
          const uint64_t* bits = &rs.mem.bits[cell * words_];
          bool ok =
              v.valid && v.pre == 0 && v.post == 0 && v.index == groupIndex(ranks_[p], op_, i, k);
          for (size_t w = 0; ok && w < words_; ++w)
            ok = bits[w] == (static_cast<size_t>(p) / 64 == w ? uint64_t{1} << (p % 64) : 0);
          if (!ok)
            return fail(where + ": element " + std::to_string(k) + " is " + describe(v, bits) +
                        ", not element " + std::to_string(k) + " of rank " + std::to_string(p) +
                        "'s group buffer " + std::to_string(i));
        }
      }
    }
    return true;
  }

  bool checkOutputsOf() {
    if (coll_ == Coll::SendRecv) return checkGroupOutputs();
    const size_t c = count_, n = static_cast<size_t>(n_);
    for (int r = 0; r < n_; ++r) {
      for (size_t k = 0; k < c; ++k) {
        bool ok = true;
        switch (coll_) {
          case Coll::AllReduce:
            ok = expect(r, k, k, -1);
            break;
          case Coll::Broadcast:
            ok = expect(r, k, k, root_);
            break;
          case Coll::Reduce:
            ok = r != root_ || expect(r, k, k, -1);
            break;
          case Coll::ReduceScatter:
            ok = expect(r, k, static_cast<size_t>(r) * c + k, -1);
            break;
          case Coll::AllGather:
            for (size_t j = 0; ok && j < n; ++j) ok = expect(r, j * c + k, k, static_cast<int>(j));
            break;
          case Coll::SendRecv:
            break;
          case Coll::AllToAll:
            for (size_t j = 0; ok && j < n; ++j)
              ok = expect(r, j * c + k, static_cast<size_t>(r) * c + k, static_cast<int>(j));
            break;
        }
        if (!ok) return false;
      }
    }
    return true;
  }

  const std::vector<Schedule>& s_;
  const VerifyOptions opt_;
  int n_ = 0;
  Coll coll_ = Coll::AllReduce;
  size_t count_ = 0;
  int root_ = -1;
  size_t words_ = 1;
  bool multiChannel_ = false;
  bool independent_ = false;  // every schedule's channels are independent (pairs match FIFOs)
  bool memory_ = false;
  MemWindow win_;
  size_t reps_ = 1;
  size_t op_ = 0;  // the operation being run or checked (of reps_)
  std::vector<RankState> ranks_;
  std::vector<Fifo> fifos_;
  std::vector<int> fifoOf_;  // by (channel * n + from) * n + to; -1 until used
  std::deque<std::pair<int, size_t>> queue_;
  Cells scratch_;
  size_t messages_ = 0;
  std::string error_;
};

}  // namespace

VerifyResult verify(const std::vector<Schedule>& schedules, const VerifyOptions& options) {
  return Simulator(schedules, options).run();
}

}  // namespace loom::algo
