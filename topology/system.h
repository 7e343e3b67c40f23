// The system graph: nodes (CPU sockets/NUMA domains, PCI switches, GPUs,
// NVSwitches, NICs, network ports), directed links with bandwidths, and the
// path between every pair of nodes of one host, typed as NCCL types them.
//
// A System is built from a topology tree in NCCL's XML schema (xml.h); the tree
// is the source of truth, kept inside the System so dump/merge are lossless.
// Bandwidths follow NCCL's conventions (GB/s, conservative "achievable" figures):
//   PCIe    width x per-lane rate / 80, the rate in units of 100 Mb/s per lane
//           ("8 GT/s" -> 60, "16 GT/s" -> 120, "32 GT/s" -> 240; Gen4 x16 = 24 GB/s)
//   NVLink  links x per-link rate by compute capability (sm60 18, sm70 20, sm80 20,
//           sm86 12, sm90 20.6, sm100 40.1)
//   CPU-CPU by CPU family (Intel BDW 6, SKL 10, SRP 22, ERP 40; AMD 16; POWER 32; ARM 6)
//   NIC     port speed in Mb/s / 8000 (unknown or <= 0: 10 Gb/s)
//   local   5000
// A path's bandwidth is the minimum over its links; its type is the worst step:
//   LOC same node; NVL over NVLink (directly or through NVSwitches); NVB NVLink
//   through one intermediate GPU; PIX through at most one PCIe switch; PXB through
//   several PCIe switches without the host bridge; PHB through a CPU's host
//   bridge; SYS across the inter-CPU link; NET between hosts, over the network.
// Immutable once built: safe to share between threads.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "topology/xml.h"
#include "util/status.h"

namespace loom::topo {

enum class NodeType : uint8_t { Gpu, Pci, NvSwitch, Cpu, Nic, Net };
enum class LinkType : uint8_t { Loc, NvLink, Pci, Sys, Net };
enum class PathType : uint8_t { Loc, Nvl, Nvb, Pix, Pxb, Phb, Sys, Net, Dis };

const char* nodeTypeName(NodeType t);
const char* linkTypeName(LinkType t);
const char* pathTypeName(PathType t);

// NCCL's bandwidth constants (GB/s).
constexpr double kLocBw = 5000.0;
constexpr double kPciGen3x16Bw = 12.0;

// PCIe link bandwidth in GB/s from sysfs-style strings ("16.0 GT/s PCIe", "16").
// An unknown speed counts as 8 GT/s and a width of 0 as x16, as NCCL does.
double pciBandwidth(const std::string& linkSpeed, const std::string& linkWidth);
// Per-lane rate in units of 100 Mb/s for a link_speed string (the prefix decides).
int pciLaneRate(const std::string& linkSpeed);
// Bandwidth of one NVLink for a GPU of this compute capability (e.g. 80 for sm_80).
double nvlinkBandwidth(int sm);
// Inter-socket bandwidth for a CPU described by NCCL's cpu attributes.
double interCpuBandwidth(const std::string& arch, const std::string& vendor, int familyId,
                         int modelId);
// Network port bandwidth in GB/s from a speed in Mb/s.
double netBandwidth(int64_t mbps);

struct Link {
  int to = -1;  // node index
  LinkType type = LinkType::Loc;
  double bw = 0;  // GB/s
};

struct Node {
  NodeType type = NodeType::Pci;
  int host = 0;           // index into System::hosts()
  std::string busId;      // PCI bus id ("0000:10:1c.0") of GPUs, PCI switches, NICs
  int numa = -1;          // Cpu: numaid; others: the NUMA domain they hang from
  int dev = -1;           // Gpu: device index; Net: network device index
  int sm = 0;             // Gpu: compute capability x10 (0: unknown)
  int rank = -1;          // Gpu: the rank NCCL's file assigns it (-1: none)
  bool gdr = false;       // Gpu/Net: GPUDirect RDMA support
  std::string name;       // Net: interface name; Cpu: vendor
  int port = 0;           // Net
  int64_t speedMbps = 0;  // Net
  std::string guid;       // Net
  int pus = 0;            // Cpu: hardware threads in its affinity mask
  int cores = 0;          // Cpu: physical cores (0: unknown)
  std::vector<Link> links;
  std::string label() const;  // "GPU0", "CPU1", "NIC 0000:10:1b.0", "NET2 mlx5_2", ...
};

struct Path {
  PathType type = PathType::Dis;
  double bw = 0;           // GB/s, minimum along the path
  std::vector<int> nodes;  // from source to destination, both included
  // The links traversed, as (node, index into node's links).
  std::vector<std::pair<int, int>> links;
};

struct Host {
  uint64_t hash = 0;
  std::string name;
  std::vector<int> nodes;  // node indices of this host
};

class System {
 public:
  // Builds the graph from a tree in NCCL's schema (<system> root). `source` names
  // the tree in error messages (a file name). Cpu elements may carry host_hash
  // (hex) to put several hosts in one tree, as NCCL's fused systems do.
  static Result<System> build(const XmlNode& root, const std::string& source);

  const XmlNode& tree() const { return tree_; }
  const std::string& source() const { return source_; }
  const std::vector<Node>& nodes() const { return nodes_; }
  const std::vector<Host>& hosts() const { return hosts_; }
  const Node& node(int i) const { return nodes_[static_cast<size_t>(i)]; }

  // Nodes of one type on one host (host -1: every host), in a stable order
  // (GPUs by dev, CPUs by numaid, nets by dev, others by bus id).
  std::vector<int> nodesOf(NodeType type, int host = -1) const;
  int gpu(int host, int dev) const;   // node index or -1
  int cpu(int host, int numa) const;  // node index or -1

  // The path from a to b. Nodes on different hosts: type NET, no links (see netPath).
  const Path& path(int a, int b) const;
  // The best route a -> network -> b between hosts: a's path to one of its host's
  // NET nodes, the two ports, and that NET's path to b, minimum bandwidth. Ports are
  // chosen for bandwidth, then for the better worst path type; -1 when a host has none.
  struct NetRoute {
    int netOut = -1, netIn = -1;
    double bw = 0;
    PathType type = PathType::Net;
    PathType worst = PathType::Dis;  // the worse of the two host-side paths
  };
  NetRoute netRoute(int a, int b) const;
  // The NET node closest to node `a` on its host (bandwidth, then path type), or -1.
  int nearestNet(int a) const;

 private:
  Status addCpu(const XmlNode& cpu, int host);
  Status addPci(const XmlNode& pci, int parent, int host, int numa);
  Status addNic(const XmlNode& nic, int nicNode, int host, int numa);
  Status addNvLinks(const XmlNode& node, int host, int gpuNode);
  int addNode(NodeType type, int host, int numa, const std::string& busId);  // registers it
  int connect(int a, int b, LinkType type, double bw);  // a -> b, adding to a same-type link
  void computePaths();
  void setPathsFrom(int base);

  XmlNode tree_;
  std::string source_;
  std::vector<Node> nodes_;
  std::vector<Host> hosts_;
  std::vector<int> local_;                // node -> index within its host
  std::vector<std::vector<Path>> paths_;  // [a][local_[b]], b on a's host
  Path noPath_;
};

// Parses a PCI bus id ("0000:10:1c.0", also "10:1c.0") into a number; -1 when malformed.
int64_t parseBusId(const std::string& busId);

}  // namespace loom::topo
