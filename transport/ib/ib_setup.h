// Setting up the ib transport: choosing a device and port, and linking
// reliable-connected queue pairs with every peer through the bootstrap.
//
// Device choice: the active ports LOOM_IB_HCA selects (NCCL's syntax:
// "mlx5_0:1,mlx5_1:1", "^" excludes, "=" exact names). A rank that uses a GPU
// takes the nearest to that GPU in the host's topology (topology/nic_rank.h:
// a NIC under the GPU's PCIe switch first), ranks sharing a GPU spreading over
// the equally near ones; otherwise ports on this process's NUMA node come
// first, spread over the ranks of one host by their local index. RoCE ports take the GID
// LOOM_IB_GID_INDEX names, else the first RoCE v2 IPv4 GID; InfiniBand ports are addressed by LID.
//
// Connection data (queue pair number, address, the receive FIFO's address and
// key) goes point to point, over each ib peer's TCP watch link: per rank, one
// record per peer, never a table of the whole communicator.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "transport/ib/gdr.h"
#include "transport/ib/verbs.h"
#include "transport/transport.h"
#include "util/net.h"

namespace loom::transport::ib {

struct PortChoice {
  std::string device;
  int port = 1;
  int numaNode = -1;  // of the device, -1 unknown
  std::string busId;  // PCI bus id of the device's function, empty unknown
  double gbps = 0;    // active link rate
  bool ethernet = false;
};

// Active ports of the devices `filter` selects (an empty filter text selects
// all), nearest to `numaNode` first (-1: no preference), in name order.
std::vector<PortChoice> listPorts(const Verbs& v, const net::NameFilter& filter, bool anyFilter,
                                  int numaNode);

// Whether this process can use the ib transport, and why not. Reads
// LOOM_IB_DISABLE and LOOM_IB_HCA; the reason is logged once at INFO.
bool available(std::string* why);

// One opened port, shared by a communicator's ib connections.
class Device : public std::enable_shared_from_this<Device> {
 public:
  static Result<std::shared_ptr<Device>> open(const Verbs& v, const PortChoice& choice,
                                              int gidIndex);
  ~Device();
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  const Verbs& verbs() const { return *verbs_; }
  ibv_context* context() const { return ctx_; }
  ibv_pd* pd() const { return pd_; }
  const PortChoice& choice() const { return choice_; }
  int port() const { return choice_.port; }
  const ibv_port_attr& portAttr() const { return attr_; }
  int gidIndex() const { return gidIndex_; }
  const ibv_gid& gid() const { return gid_; }
  std::string describe() const;  // "rxe0:1 (RoCE, GID 1, 10 Gb/s)"

  // Registers [addr, addr + len) so this device's sends read it in place; it
  // stays registered while the returned handle lives. Host memory takes
  // ibv_reg_mr; device memory GPUDirect RDMA where every condition holds, else
  // nothing (it stays staged, said at INFO; gdr.h). lookup() gives the key of a
  // registration covering a whole range, 0 when none does; registration() how
  // it was registered (Staged when not).
  Result<std::shared_ptr<void>> registerRegion(void* addr, size_t len);
  uint32_t lookup(const void* addr, size_t len) const;
  Registration registration(const void* addr, size_t len) const;

 private:
  Device() = default;
  const Verbs* verbs_ = nullptr;
  ibv_context* ctx_ = nullptr;
  ibv_pd* pd_ = nullptr;
  PortChoice choice_;
  ibv_port_attr attr_{};
  int gidIndex_ = 0;
  ibv_gid gid_{};
  struct Region {
    uintptr_t begin, end;
    ibv_mr* mr;  // nullptr for a device buffer left to staging
    Registration how;
  };
  mutable std::mutex regMutex_;
  std::vector<Region*> regions_;
};

// The GID index to use on a RoCE port: `wanted` when >= 0, else the first
// RoCE v2 GID holding an IPv4 address, else the first RoCE v2, else the first
// non-zero one. `types[i]` is sysfs's gid type text ("RoCE v2"), gids[i] the
// entry. -1 when none is usable.
int pickGid(int wanted, const std::vector<std::string>& types, const std::vector<ibv_gid>& gids);

// Link rate in Gb/s from ibv_port_attr's active_width and active_speed codes (0 unknown).
double portGbps(uint8_t activeWidth, uint16_t activeSpeed);

// Sends mine[i] to links[i]'s peer and receives theirs[i] from it, `bytes`
// (at most one slot) each way, on every link at once: all sends are posted
// before any wait, so no order between ranks can deadlock. Fails on a link
// error (naming the peer), at deadlineNs (loomTimeout), or once *abortFlag is
// raised.
Status exchangeOverLinks(const std::vector<Connection*>& links,
                         const std::vector<const void*>& mine, const std::vector<void*>& theirs,
                         size_t bytes, int64_t deadlineNs, const std::atomic<bool>* abortFlag);

// ib among ranks: connects this rank with every rank in SetupArgs::peers over `device`. The
// queue pair data for peer p travels over watches[p] (indexed by rank: an authenticated
// point-to-point link, the communicator's TCP watch link), so each rank sends and receives one
// QpInfo per peer: O(peers) per rank, whatever the communicator's size. Each watch link then
// goes into its ib connection, whose peer's exit it reports. Peers must be symmetric (a in b's
// list iff b in a's). A rank that cannot create a queue pair still sends every peer an invalid
// entry, so they fail at once with a message rather than at the deadline.
class IbTransport final : public Transport {
 public:
  IbTransport(std::shared_ptr<Device> device, std::vector<std::unique_ptr<Connection>> watches)
      : device_(std::move(device)), watches_(std::move(watches)) {}
  Kind kind() const override { return Kind::Ib; }
  Result<Links> connect(const SetupArgs& args) override;

 private:
  std::shared_ptr<Device> device_;
  std::vector<std::unique_ptr<Connection>> watches_;
};

}  // namespace loom::transport::ib
