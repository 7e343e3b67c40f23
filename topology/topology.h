// Topology: what this host is made of, and how every rank's host joins the others.
//
// Every source ends in one tree in NCCL's topology schema (<system>, <cpu>, <pci>,
// <gpu>, <nvlink>, <nic>, <net>), from which System (system.h) builds the graph:
//  * detection (detectHost): hwloc for sockets, NUMA nodes, cores and the PCI tree,
//    sysfs for NIC ports and their speeds, NVML (dlopen'd; absent is normal) for GPUs
//    and their NVLinks;
//  * files (loadTopologyFile): NCCL's schema as NCCL_TOPO_FILE reads it, or hwloc
//    XML of any hwloc version; LOOM_TOPO_FILE replaces detection;
//  * several hosts (mergeHosts): each rank's host tree, serialized as NCCL XML, merged
//    into one system whose <cpu> elements carry host_hash, as NCCL's fused systems do.
// dumpTopology writes the tree back in NCCL's schema (NCCL users' files work
// unchanged both ways); loading a dump gives the same tree and the same graph.
// Loom keeps two things NCCL drops: GPU-class PCI devices without a <gpu> element
// (cloud files list the PCI tree only) become GPUs of unknown compute capability,
// and NIC-class devices without <nic> become NICs without ports.
// All functions are thread safe; none throws.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "topology/system.h"
#include "topology/xml.h"
#include "util/status.h"

namespace loom::topo {

// ---- files ---------------------------------------------------------------------------

// Reads NCCL topology XML or hwloc XML (told apart by the root element) into a tree in
// NCCL's schema. Errors name the file, the line and the element.
Result<XmlNode> loadTopologyTree(const std::string& path);
Result<System> loadTopologyFile(const std::string& path);
// The same from text; `source` names it in errors.
Result<System> loadTopologyString(const std::string& xml, const std::string& source);
// hwloc XML (a <topology> tree) -> NCCL's schema (hwloc_xml.cc says what is kept).
Result<XmlNode> hwlocToNccl(const XmlNode& hwlocRoot, const std::string& source);

// The system's tree in NCCL's schema, as text / into a file.
std::string dumpTopology(const System& system);
Status dumpTopologyFile(const System& system, const std::string& path);

// An NCCL graph file (NCCL_GRAPH_FILE: <graphs><graph><channel><gpu dev>...).
struct NcclGraph {
  int id = 0;
  int pattern = 0;
  bool crossNic = false;
  double speedIntra = 0, speedInter = 0;
  std::string typeIntra, typeInter;
  std::vector<std::vector<int>> channels;  // GPU devs (and NET devs as -1 - dev), in order
};
Result<std::vector<NcclGraph>> loadNcclGraphs(const std::string& path);

// ---- detection -----------------------------------------------------------------------

// What NVML reports of one GPU, and what sysfs reports of one network port; detection
// fuses these into a tree (a detected one, or one loaded from a file, as NCCL fuses
// NVML's view into NCCL_TOPO_FILE's).
struct NvLinkProbe {
  std::string target;  // remote PCI bus id
  int count = 0;       // active links to it
  std::string tclass;  // 0x030200 GPU, 0x068000 NVSwitch, 0x068001 CPU
};
struct GpuProbe {
  std::string busId;
  int numa = -1;  // where to hang it when the tree lacks its PCI device
  int dev = 0;
  int sm = 0;
  int rank = -1;
  bool gdr = false;
  std::vector<NvLinkProbe> nvlinks;
};
struct NetProbe {
  std::string busId;  // empty: a virtual interface, hung from its CPU
  int numa = -1;
  std::string name;  // mlx5_0, eth0
  int64_t speedMbps = 0;
  int port = 0;
  std::string guid;
  bool gdr = false;
  int maxConn = 0;  // 0: leave out
};
Status fuseGpus(XmlNode& tree, const std::vector<GpuProbe>& gpus);
Status fuseNets(XmlNode& tree, const std::vector<NetProbe>& nets);

// GPUs through NVML (dlopen("libnvidia-ml.so.1")); empty where no driver is installed.
Result<std::vector<GpuProbe>> probeNvml();
// Network ports from sysfs under `sysRoot` (InfiniBand ports, then network interfaces
// that are up; loopback and IPoIB interfaces left out).
std::vector<NetProbe> probeSysfsNets(const std::string& sysRoot = "/sys");

struct DetectOptions {
  bool nvml = true;
  bool sysfs = true;
};
Result<XmlNode> detectHostTree(const DetectOptions& options = {});
Result<System> detectHost(const DetectOptions& options = {});

// This process's host: LOOM_TOPO_FILE if set, else detection; written to
// LOOM_TOPO_DUMP_FILE when that is set.
Result<System> localTopology();

// ---- several hosts -------------------------------------------------------------------

// One host as the communicator all-gathers it.
struct HostBlob {
  uint64_t hostHash = 0;
  std::string hostName;
  std::string xml;  // serializeHost()
};
// A host's compact form: its NCCL XML, without host_hash attributes.
std::string serializeHost(const System& host);
// One system of every distinct host (blobs of one hash are one host; the first wins),
// in order of first appearance. Each host's <cpu> elements get host_hash and hostname.
Result<System> mergeHosts(const std::vector<HostBlob>& blobs);
// `count` copies of a single-host system as hosts 0..count-1 (for planning and tools).
Result<System> replicateHost(const System& host, int count);

}  // namespace loom::topo
