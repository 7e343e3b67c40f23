// Detection of this host: hwloc for the CPU and PCI structure, sysfs for network ports
// and PCIe link speeds, NVML (nvml.cc) for GPUs; and fusing probes into a tree.
#include <dirent.h>
#include <hwloc.h>
#include <limits.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>

#include "topology/topology.h"
#include "util/log.h"

namespace loom::topo {
namespace {

std::string readLine(const std::string& path) {
  std::ifstream f(path);
  std::string s;
  if (!f || !std::getline(f, s)) return "";
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ' || s.back() == '\r')) s.pop_back();
  return s;
}

std::vector<std::string> listDir(const std::string& path) {
  std::vector<std::string> out;
  DIR* d = opendir(path.c_str());
  if (d == nullptr) return out;
  while (dirent* e = readdir(d)) {
    std::string n = e->d_name;
    if (n != "." && n != "..") out.push_back(n);
  }
  closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

// The PCI bus id a sysfs "device" link points to ("" when not a PCI device).
std::string pciOf(const std::string& deviceLink) {
  char buf[PATH_MAX];
  if (realpath(deviceLink.c_str(), buf) == nullptr) return "";
  std::string p = buf;
  std::string base = p.substr(p.rfind('/') + 1);
  return parseBusId(base) >= 0 && base.size() == 12 ? base : "";
}

XmlNode* findPci(XmlNode& n, int64_t id) {
  if (n.name == "pci" && parseBusId(n.attrOr("busid", "")) == id) return &n;
  for (XmlNode& c : n.children)
    if (XmlNode* f = findPci(c, id)) return f;
  return nullptr;
}

XmlNode* cpuFor(XmlNode& tree, int numa) {
  XmlNode* first = nullptr;
  for (XmlNode& c : tree.children) {
    if (c.name != "cpu") continue;
    if (!first) first = &c;
    if (std::atoi(c.attrOr("numaid", "-1").c_str()) == numa) return &c;
  }
  return first;
}

// The <pci> element of a device, added under its NUMA domain's <cpu> when the tree lacks
// it (link figures unknown: NCCL's defaults apply). nullptr when the tree has no <cpu>.
XmlNode* ensurePci(XmlNode& tree, const std::string& busId, int64_t id, int numa, const char* cls) {
  if (XmlNode* pci = findPci(tree, id)) return pci;
  XmlNode* cpu = cpuFor(tree, numa);
  if (cpu == nullptr) return nullptr;
  XmlNode* pci = &cpu->add("pci");
  pci->set("busid", busId);
  pci->set("class", cls);
  pci->set("link_speed", "");
  pci->set("link_width", "0");
  return pci;
}

void maxNetDev(const XmlNode& n, int& next) {
  if (n.name == "net" && n.has("dev"))
    next = std::max(next, std::atoi(n.attrOr("dev", "0").c_str()) + 1);
  for (const XmlNode& c : n.children) maxNetDev(c, next);
}

XmlNode* findNet(XmlNode& n, const std::string& name) {
  if (n.name == "net" && n.attrOr("name", "") == name) return &n;
  for (XmlNode& c : n.children)
    if (XmlNode* f = findNet(c, name)) return f;
  return nullptr;
}

// PCIe link figures of a device as sysfs gives them (NCCL reads the max_ pair).
void sysfsLink(XmlNode& n) {
  if (n.name == "pci") {
    std::string dir = "/sys/bus/pci/devices/" + n.attrOr("busid", "");
    std::string speed = readLine(dir + "/max_link_speed");
    std::string width = readLine(dir + "/max_link_width");
    if (!speed.empty()) n.set("link_speed", speed);
    if (!width.empty()) n.set("link_width", width);
  }
  for (XmlNode& c : n.children) sysfsLink(c);
}

}  // namespace

Status fuseGpus(XmlNode& tree, const std::vector<GpuProbe>& gpus) {
  for (const GpuProbe& g : gpus) {
    int64_t id = parseBusId(g.busId);
    if (id < 0)
      return LOOM_ERROR(loomInvalidArgument, "fuseGpus: bad PCI bus id \"" + g.busId + "\"");
    XmlNode* pci = ensurePci(tree, g.busId, id, g.numa, "0x030200");
    if (pci == nullptr) return LOOM_ERROR(loomInvalidArgument, "fuseGpus: the tree has no <cpu>");
    XmlNode* gpu = pci->child("gpu");
    if (gpu == nullptr) gpu = &pci->add("gpu");
    gpu->set("dev", std::to_string(g.dev));
    gpu->set("sm", std::to_string(g.sm));
    gpu->set("rank", std::to_string(g.rank));
    gpu->set("gdr", g.gdr ? "1" : "0");
    gpu->children.clear();
    for (const NvLinkProbe& l : g.nvlinks) {
      XmlNode& e = gpu->add("nvlink");
      e.set("target", l.target);
      e.set("count", std::to_string(l.count));
      e.set("tclass", l.tclass);
    }
  }
  return Status::ok();
}

Status fuseNets(XmlNode& tree, const std::vector<NetProbe>& nets) {
  int next = 0;
  maxNetDev(tree, next);
  for (const NetProbe& p : nets) {
    XmlNode* net = p.name.empty() ? nullptr : findNet(tree, p.name);
    if (net == nullptr) {
      XmlNode* parent = nullptr;
      if (!p.busId.empty()) {
        int64_t id = parseBusId(p.busId);
        if (id < 0)
          return LOOM_ERROR(loomInvalidArgument, "fuseNets: bad PCI bus id \"" + p.busId + "\"");
        parent = ensurePci(tree, p.busId, id, p.numa, "0x020000");
        if (parent == nullptr)
          return LOOM_ERROR(loomInvalidArgument, "fuseNets: the tree has no <cpu>");
      } else {
        parent = cpuFor(tree, p.numa);
        if (parent == nullptr)
          return LOOM_ERROR(loomInvalidArgument, "fuseNets: the tree has no <cpu>");
      }
      XmlNode* nic = parent->child("nic");
      if (nic == nullptr) nic = &parent->add("nic");
      net = &nic->add("net");
      net->set("name", p.name);
      net->set("dev", std::to_string(next++));
    }
    net->set("speed", std::to_string(p.speedMbps));
    net->set("port", std::to_string(p.port));
    net->set("latency", "0.000000");
    if (!p.guid.empty()) net->set("guid", p.guid);
    if (p.maxConn > 0) net->set("maxconn", std::to_string(p.maxConn));
    net->set("gdr", p.gdr ? "1" : "0");
  }
  return Status::ok();
}

std::vector<NetProbe> probeSysfsNets(const std::string& sysRoot) {
  std::vector<NetProbe> out;
  // InfiniBand / RoCE ports: one net per active port.
  std::string ib = sysRoot + "/class/infiniband";
  for (const std::string& dev : listDir(ib)) {
    std::string devDir = ib + "/" + dev;
    std::string busId = pciOf(devDir + "/device");
    int numa = std::atoi(readLine(devDir + "/device/numa_node").c_str());
    std::string guid = readLine(devDir + "/node_guid");
    std::string hex;
    for (char c : guid)
      if (c != ':') hex += c;
    for (const std::string& port : listDir(devDir + "/ports")) {
      std::string state = readLine(devDir + "/ports/" + port + "/state");
      if (state.find("ACTIVE") == std::string::npos) continue;
      // "100 Gb/sec (4X EDR)"
      double gbs = std::atof(readLine(devDir + "/ports/" + port + "/rate").c_str());
      NetProbe p;
      p.busId = busId;
      p.numa = numa;
      p.name = dev;
      p.port = std::atoi(port.c_str());
      p.speedMbps = static_cast<int64_t>(gbs * 1000);
      p.guid = hex.empty() ? "" : "0x" + hex;
      p.maxConn = 131072;
      out.push_back(p);
    }
  }
  // Network interfaces that are up, for sockets.
  std::string net = sysRoot + "/class/net";
  for (const std::string& ifc : listDir(net)) {
    std::string dir = net + "/" + ifc;
    if (ifc == "lo" || readLine(dir + "/type") == "32") continue;  // loopback, IPoIB
    std::string state = readLine(dir + "/operstate");
    if (state != "up" && state != "unknown") continue;
    NetProbe p;
    p.name = ifc;
    p.busId = pciOf(dir + "/device");
    p.numa = p.busId.empty() ? -1 : std::atoi(readLine(dir + "/device/numa_node").c_str());
    std::string speed = readLine(dir + "/speed");  // Mb/s; -1 or unreadable when unknown
    p.speedMbps = speed.empty() ? 0 : std::max<int64_t>(0, std::atoll(speed.c_str()));
    p.maxConn = 65536;
    out.push_back(p);
  }
  return out;
}

// hwloc loads its plugins (PCI, XML) with each topology and unloads them with the last one.
// One topology kept for the process's life keeps them loaded: no reload per communicator, and a
// leak checker can still name what the PCI plugin's libpciaccess keeps allocated
// (tests/sanitizer/lsan.supp). It is never destroyed (reachable from here, so not a leak).
static hwloc_topology_t volatile gKeptTopology = nullptr;  // volatile: the store must stay

static void keepHwlocPluginsLoaded() {
  static const bool once = [] {
    hwloc_topology_t t = nullptr;
    if (hwloc_topology_init(&t) == 0) gKeptTopology = t;
    return true;
  }();
  (void)once;
}

Result<XmlNode> detectHostTree(const DetectOptions& options) {
  keepHwlocPluginsLoaded();
  hwloc_topology_t topo;
  if (hwloc_topology_init(&topo) != 0)
    return LOOM_ERROR(loomSystemError, "hwloc_topology_init failed");
  std::unique_ptr<hwloc_topology, void (*)(hwloc_topology_t)> guard(topo, hwloc_topology_destroy);
  hwloc_topology_set_type_filter(topo, HWLOC_OBJ_BRIDGE, HWLOC_TYPE_FILTER_KEEP_ALL);
  hwloc_topology_set_type_filter(topo, HWLOC_OBJ_PCI_DEVICE, HWLOC_TYPE_FILTER_KEEP_ALL);
  hwloc_topology_set_type_filter(topo, HWLOC_OBJ_OS_DEVICE, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
  if (hwloc_topology_load(topo) != 0)
    return LOOM_ERROR(loomSystemError,
                      std::string("hwloc_topology_load failed: ") + strerror(errno));
  char* buf = nullptr;
  int len = 0;
  if (hwloc_topology_export_xmlbuffer(topo, &buf, &len, 0) != 0)
    return LOOM_ERROR(loomSystemError, "hwloc could not export this host's topology");
  std::string xml(buf, static_cast<size_t>(len > 0 ? len - 1 : 0));
  hwloc_free_xmlbuffer(topo, buf);
  LOOM_ASSIGN(XmlNode root, parseXmlString(xml, "hwloc (this host)"));
  LOOM_ASSIGN(XmlNode tree, hwlocToNccl(root, "hwloc (this host)"));
  sysfsLink(tree);
  if (options.sysfs) LOOM_CHECK(fuseNets(tree, probeSysfsNets("/sys")));
  if (options.nvml) {
    LOOM_ASSIGN(std::vector<GpuProbe> gpus, probeNvml());
    LOOM_CHECK(fuseGpus(tree, gpus));
  }
  return tree;
}

Result<System> detectHost(const DetectOptions& options) {
  LOOM_ASSIGN(XmlNode tree, detectHostTree(options));
  return System::build(tree, "this host");
}

}  // namespace loom::topo
