// The cost model and the tuner's inputs.
//
// Every link type has an alpha-beta cost: a message of b bytes takes
// alpha + b * beta from the moment its sender starts it to the moment its
// receiver can use it, and keeps the sender busy for b * beta. Each message
// also costs its sender and its receiver `overhead` of their own time (LogP's
// o: the system call, the wake-up, the slot's bookkeeping), which latency
// does not hide: a schedule of many tiny messages (rhd of a few elements,
// where every unit is its own message) pays it on every one. The time of a
// collective is predicted from the schedules themselves: predictUs() runs all
// ranks' steps in the executor's order (channels in turn, pieces round-major,
// a step's receive before its send; memory steps whole, a wait ending a memory
// link's alpha after the last peer's publish; where ranks outnumber cores, every wait for a
// peer paying a hand-over of the core besides) on a clock per rank, with the link type
// between each pair from a host layout, and returns when the last rank ends.
// Messages between hosts also share their hosts' ports: each host sends and
// receives one stream at the link's bandwidth, however many of its ranks
// cross at once (ranks take their steps earliest clock first, so that they
// reach a port in about the order of time). FIFO depth is not modelled (a verified schedule does
// not deadlock; slot back-pressure only delays). closedFormUs() gives the textbook formulas for
// rank counts too large to simulate cheaply. fitLinkCost() calibrates a link
// from measured (bytes, time) samples by least squares.
//
// parseSelection() reads LOOM_ALGO / LOOM_PROTO text: per collective, which
// names are allowed. Everything here but tunerCostModel() is a pure function
// and does no I/O.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "algorithms/schedule.h"
#include "util/status.h"

namespace loom::algo {

enum class Link : uint8_t { Shm, Tcp, NvLink, Pcie, Net };
constexpr int kNumLinks = 5;
const char* linkName(Link l);

struct LinkCost {
  double alpha_us = 0;          // latency of one message
  double beta_us_per_byte = 0;  // inverse bandwidth
  double overhead_us = 0;       // busy time of each end per message
};

struct CostModel {
  LinkCost links[kNumLinks];
  // Memory steps (peers' windows read in place): alpha_us is a flag's trip to a peer (publish
  // to a waiting peer seeing it), beta_us_per_byte the rate of a copy into or out of a window.
  LinkCost memory;
  double reduce_us_per_byte = 0;  // combining a received byte with a local one
  // Where ranks outnumber cores (LinkMap::ranksPerCore > 1), what each wait for a peer's data
  // costs besides, per rank sharing the core: the peer must be run before the data exists, so
  // a schedule of many dependent steps pays for every hand-over of the core.
  double handover_us = 0;
  size_t slotBytes = 262144;  // the executor's piece (LOOM_SLOT_BYTES)
  const LinkCost& link(Link l) const { return links[static_cast<int>(l)]; }
};

// Defaults for a CPU host: shared memory, TCP over 10-25 GbE, NVLink, PCIe,
// and an RDMA network.
CostModel defaultCostModel();

// A measured table (LOOM_TUNER_TABLE) over the defaults: one line per link,
//   <link> <alpha_us> <GB/s> [<overhead_us>]    link: shm, tcp, nvlink, pcie, net
//   reduce <GB/s>                               the local reduction's rate
// '#' starts a comment. Links not named keep their figures. Errors name
// `source`, the line and the field.
Status applyCostTable(const std::string& text, const std::string& source, CostModel* model);

// The tuner's model: the defaults, the table file at `tablePath` over them (when not
// empty; the one function here that reads a file), pieces of `slotBytes` (at least 64).
Result<CostModel> tunerCostModel(const std::string& tablePath, int64_t slotBytes);

// Which link joins two ranks: `intra` on one host, `inter` across hosts.
struct LinkMap {
  std::vector<int> hostOf;  // empty: every rank on one host
  Link intra = Link::Shm;
  Link inter = Link::Tcp;
  std::vector<int> ringOrder;  // the ring algorithms' order (empty: rank order)
  int ranksPerCore = 1;        // ranks sharing each core of the machine (Comm::ranksPerCore)
  // What a wait for a peer costs besides the links: CostModel::handover_us times the ranks
  // a core runs, where they are more than one.
  double handoverUs(const CostModel& model) const {
    return ranksPerCore > 1 ? model.handover_us * ranksPerCore : 0;
  }
  Link between(int a, int b) const;
  int hosts() const;  // distinct hosts (1 when hostOf is empty)
};

// Predicted time of one collective from every rank's schedule (schedules[r]
// is rank r's). Steps are cut into pieces of model.slotBytes as the executor
// cuts them, but into at most max(kMaxSimulatedPieces, kMaxSimulatedPieceSteps /
// (all ranks' steps)) pieces a step (beyond that a step's pieces grow), so the
// simulation's work stays near kMaxSimulatedPieceSteps pieces: exact for 2 ranks
// up to gigabytes, 64 pieces a step at 32 ranks. Grown pieces undercount what each
// real piece pays in turn: capped at 64 a step, recursive doubling on 2 ranks at
// 32 MiB was priced 3% under the ring, and ran 35% slower. Returns +inf if the
// ranks cannot all finish (an unmatched receive).
constexpr size_t kMaxSimulatedPieces = 64;
constexpr size_t kMaxSimulatedPieceSteps = size_t{1} << 17;
double predictUs(const std::vector<Schedule>& schedules, size_t elemSize, const CostModel& model,
                 const LinkMap& links);

// Textbook estimates: rounds of latency plus bytes over the slowest link used.
double closedFormUs(Algo a, Coll coll, int nranks, size_t count, size_t elemSize,
                    const CostModel& model, const LinkMap& links);

// Builds every rank's schedule and predicts it up to kSimulateMaxRanks ranks;
// the closed form above that.
constexpr int kSimulateMaxRanks = 32;
double estimateUs(Algo a, Coll coll, int nranks, size_t count, size_t elemSize,
                  const CostModel& model, const LinkMap& links);

// Least-squares fit of time = alpha + beta * bytes. Fewer than two distinct
// sizes give beta = 0 and alpha = the mean time; negative results clamp to 0.
struct CostSample {
  double bytes = 0;
  double us = 0;
};
LinkCost fitLinkCost(const std::vector<CostSample>& samples);

// Which names (algorithms or protocols) each collective may use.
//   "ring,tree"                      every collective: ring or tree
//   "allreduce:ring,tree;allgather:ring"  per collective; others unrestricted
//   "^direct", "allreduce:^direct"   everything but direct
// Names and collectives are case-insensitive; later entries override earlier
// ones for the collectives they name.
struct Selection {
  static constexpr int kColls = 6;
  uint32_t allowed[kColls];  // per Coll, bit i: names[i] allowed
  bool restricted[kColls];   // whether the text said anything about Coll
  Selection();
  bool allows(Coll c, int nameIndex) const {
    return (allowed[static_cast<int>(c)] >> nameIndex) & 1;
  }
};
// `variable` names the setting in the error ("LOOM_ALGO=...: unknown ...").
Result<Selection> parseSelection(const std::string& text, const char* variable,
                                 const std::vector<std::string>& names);
// The names LOOM_ALGO knows (algoName order) and LOOM_PROTO knows.
std::vector<std::string> algoNames();
std::vector<std::string> protoNames();  // "ll", "simple": indices kProtoLL, kProtoSimple
constexpr int kProtoLL = 0, kProtoSimple = 1;

// Recursive doubling moves the whole buffer every round, every rank at once. Where ranks share
// a host's port (several ranks on a host of a multi-host layout) the model queues their
// messages at the port, which prices rd above hier or hierrd from a few KiB; the tuner still
// offers rd there only up to this size (a round's bytes then cost less than a TCP latency), as
// a bound that holds whatever the link figures; elsewhere (one host; one rank a host) at every
// size, priced by the model. LOOM_ALGO=rd forces it at any size.
constexpr size_t kRdMaxBytes = size_t{16} << 10;
// Whether `hostOf` spans several hosts and some host has more than one rank.
bool portsShared(const std::vector<int>& hostOf);

// The algorithms the tuner may pick for one call, in preference order on ties: those with a
// schedule for `coll` (direct first where `direct`, every rank on this host; hier only across
// hosts unless LOOM_ALGO names it; rd as above), narrowed by `sel`; all of them when `sel`
// allows none. hostOf[r] is rank r's host.
// Every algorithm coll can run somewhere (tunerCandidates picks among them by size and layout).
std::vector<Algo> algosOf(Coll coll);
std::vector<Algo> tunerCandidates(Coll coll, size_t bytes, bool direct,
                                  const std::vector<int>& hostOf, const Selection& sel);

}  // namespace loom::algo
