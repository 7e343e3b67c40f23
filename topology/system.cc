#include "topology/system.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>

#include "util/log.h"

namespace loom::topo {

const char* nodeTypeName(NodeType t) {
  static const char* const kNames[] = {"GPU", "PCI", "NVS", "CPU", "NIC", "NET"};
  return kNames[static_cast<int>(t)];
}

const char* linkTypeName(LinkType t) {
  static const char* const kNames[] = {"LOC", "NVL", "PCI", "SYS", "NET"};
  return kNames[static_cast<int>(t)];
}

const char* pathTypeName(PathType t) {
  static const char* const kNames[] = {"LOC", "NVL", "NVB", "PIX", "PXB",
                                       "PHB", "SYS", "NET", "DIS"};
  return kNames[static_cast<int>(t)];
}

int pciLaneRate(const std::string& linkSpeed) {
  // sysfs writes "8 GT/s" (kernels up to 5.6) or "8.0 GT/s PCIe"; files in the wild also
  // carry suffixes ("32 GT/s PCIe/s"), so the leading number decides.
  const char* s = linkSpeed.c_str();
  char* end = nullptr;
  double gts = std::strtod(s, &end);
  if (end == s || std::strncmp(end, " GT/s", 5) != 0) return 60;  // unknown: Gen3
  if (gts == 2.5) return 15;
  if (gts == 5.0) return 30;
  if (gts == 8.0) return 60;
  if (gts == 16.0) return 120;
  if (gts == 32.0) return 240;
  if (gts == 64.0) return 480;
  return 60;
}

double pciBandwidth(const std::string& linkSpeed, const std::string& linkWidth) {
  int width = std::atoi(linkWidth.c_str());
  if (width <= 0) width = 16;
  return width * pciLaneRate(linkSpeed) / 80.0;
}

double nvlinkBandwidth(int sm) {
  if (sm >= 100) return 40.1;
  if (sm >= 90) return 20.6;
  if (sm == 86) return 12.0;
  if (sm >= 80) return 20.0;
  if (sm >= 70) return 20.0;
  if (sm >= 60) return 18.0;
  return 20.0;  // unknown: as sm80
}

double interCpuBandwidth(const std::string& arch, const std::string& vendor, int familyId,
                         int modelId) {
  // Architecture names match by prefix, as NCCL's tables do ("ppc64le" is POWER).
  if (arch.rfind("ppc64", 0) == 0) return 32.0;
  if (arch.rfind("arm64", 0) == 0 || arch.rfind("aarch64", 0) == 0) return 6.0;
  if (arch == "x86_64") {
    if (vendor == "GenuineIntel") {
      if (familyId == 6 && modelId >= 0xCF) return 40.0;  // Emerald Rapids
      if (familyId == 6 && modelId >= 0x8F) return 22.0;  // Sapphire Rapids
      if (familyId == 6 && modelId >= 0x55) return 10.0;  // Skylake
      return 6.0;                                         // Broadwell and older
    }
    if (vendor == "AuthenticAMD") return 16.0;
    if (vendor == "CentaurHauls" || vendor == "  Shanghai  ")
      return (familyId == 7 && modelId == 0x5B) ? 9.0 : 6.0;
  }
  return kLocBw;
}

double netBandwidth(int64_t mbps) {
  if (mbps <= 0) mbps = 10000;
  return static_cast<double>(mbps) / 8000.0;
}

int64_t parseBusId(const std::string& busId) {
  // [domain:]bus:device.function, all hex.
  unsigned dom = 0, bus = 0, dev = 0, fn = 0;
  char tail = 0;
  if (std::sscanf(busId.c_str(), "%x:%x:%x.%x%c", &dom, &bus, &dev, &fn, &tail) == 4)
    return (int64_t(dom) << 20) | (int64_t(bus & 0xff) << 12) | (int64_t(dev & 0xff) << 4) |
           int64_t(fn & 0xf);
  if (std::sscanf(busId.c_str(), "%x:%x.%x%c", &bus, &dev, &fn, &tail) == 3)
    return (int64_t(bus & 0xff) << 12) | (int64_t(dev & 0xff) << 4) | int64_t(fn & 0xf);
  return -1;
}

std::string Node::label() const {
  switch (type) {
    case NodeType::Gpu:
      return "GPU" + std::to_string(dev);
    case NodeType::Cpu:
      return "CPU" + std::to_string(numa);
    case NodeType::Pci:
      return "PCI " + busId;
    case NodeType::NvSwitch:
      return "NVS";
    case NodeType::Nic:
      return busId.empty() ? "NIC cpu" + std::to_string(numa) : "NIC " + busId;
    case NodeType::Net:
      return "NET" + std::to_string(dev) + (name.empty() ? "" : " " + name);
  }
  return "?";
}

namespace {

// Reads an integer attribute; absent -> deflt (or an error when required).
Status intAttr(const XmlNode& n, const char* key, const std::string& source, bool required,
               int64_t deflt, int64_t* out) {
  const std::string* v = n.attr(key);
  if (v == nullptr) {
    if (required)
      return LOOM_ERROR(loomInvalidArgument,
                        where(source, n) + " lacks the required attribute " + key);
    *out = deflt;
    return Status::ok();
  }
  const char* s = v->c_str();
  char* end = nullptr;
  long long x = std::strtoll(s, &end, 0);
  while (end && *end == ' ') ++end;
  if (end == s || *end != '\0')
    return LOOM_ERROR(loomInvalidArgument, where(source, n) + ": attribute " + key + "=\"" + *v +
                                               "\" is not an integer");
  *out = x;
  return Status::ok();
}

int popcountMask(const std::string& mask) {
  int n = 0;
  for (char c : mask) {
    if (c >= '0' && c <= '9')
      n += __builtin_popcount(static_cast<unsigned>(c - '0'));
    else if (c >= 'a' && c <= 'f')
      n += __builtin_popcount(static_cast<unsigned>(c - 'a' + 10));
    else if (c >= 'A' && c <= 'F')
      n += __builtin_popcount(static_cast<unsigned>(c - 'A' + 10));
  }
  return n;
}

// Device kind of a pci element by its class, as NCCL's class table does (prefix match).
enum class PciKind { Bridge, NvSwitch, CpuLink, Gpu, Nic };
PciKind pciKind(const std::string& cls) {
  auto starts = [&](const char* p) { return cls.compare(0, std::strlen(p), p) == 0; };
  if (starts("0x060400")) return PciKind::Bridge;
  if (starts("0x068000")) return PciKind::NvSwitch;
  if (starts("0x068001")) return PciKind::CpuLink;
  if (starts("0x03")) return PciKind::Gpu;
  if (starts("0x02")) return PciKind::Nic;
  return PciKind::Bridge;
}

struct BuildState {
  std::map<uint64_t, int> hostByHash;
  std::vector<double> cpuBw;  // by node index, for Cpu nodes
};

}  // namespace

int System::connect(int a, int b, LinkType type, double bw) {
  Node& n = nodes_[static_cast<size_t>(a)];
  for (size_t i = 0; i < n.links.size(); ++i) {
    if (n.links[i].to == b && n.links[i].type == type) {
      n.links[i].bw += bw;  // NVLinks to one peer add up
      return static_cast<int>(i);
    }
  }
  n.links.push_back(Link{b, type, bw});
  return static_cast<int>(n.links.size() - 1);
}

int System::addNode(NodeType type, int host, int numa, const std::string& busId) {
  Node n;
  n.type = type;
  n.host = host;
  n.numa = numa;
  n.busId = busId;
  nodes_.push_back(n);
  int idx = static_cast<int>(nodes_.size() - 1);
  hosts_[static_cast<size_t>(host)].nodes.push_back(idx);
  return idx;
}

Status System::addNic(const XmlNode& nic, int nicNode, int host, int numa) {
  for (const XmlNode& net : nic.children) {
    if (net.name != "net") continue;
    // A net without dev is not a usable port (NCCL skips it too).
    if (!net.has("dev")) continue;
    int64_t dev = 0, speed = 0, port = 0, gdr = 0;
    LOOM_CHECK(intAttr(net, "dev", source_, true, 0, &dev));
    LOOM_CHECK(intAttr(net, "speed", source_, false, 0, &speed));
    LOOM_CHECK(intAttr(net, "port", source_, false, 0, &port));
    LOOM_CHECK(intAttr(net, "gdr", source_, false, 0, &gdr));
    int idx = addNode(NodeType::Net, host, numa, "");
    Node& n = nodes_[static_cast<size_t>(idx)];
    n.dev = static_cast<int>(dev);
    n.speedMbps = speed;
    n.port = static_cast<int>(port);
    n.gdr = gdr != 0;
    n.name = net.attrOr("name", "");
    n.guid = net.attrOr("guid", "");
    double bw = netBandwidth(speed);
    connect(nicNode, idx, LinkType::Net, bw);
    connect(idx, nicNode, LinkType::Net, bw);
  }
  return Status::ok();
}

Status System::addPci(const XmlNode& pci, int parent, int host, int numa) {
  const std::string* busIdText = pci.attr("busid");
  if (busIdText == nullptr)
    return LOOM_ERROR(loomInvalidArgument,
                      where(source_, pci) + " lacks the required attribute busid");
  int64_t busId = parseBusId(*busIdText);
  if (busId < 0)
    return LOOM_ERROR(loomInvalidArgument,
                      where(source_, pci) + ": busid \"" + *busIdText + "\" is not a PCI bus id");
  PciKind kind = pciKind(pci.attrOr("class", ""));
  const XmlNode* gpu = pci.child("gpu");
  const XmlNode* nic = pci.child("nic");
  int node = -1;
  if (gpu != nullptr || kind == PciKind::Gpu) {
    // Loom keeps a GPU-class device without a <gpu> element (cloud files list the PCI tree
    // only) as a GPU of unknown compute capability; its dev is assigned after loading.
    node = addNode(NodeType::Gpu, host, numa, *busIdText);
    Node& n = nodes_[static_cast<size_t>(node)];
    if (gpu != nullptr) {
      int64_t dev = -1, sm = 0, rank = -1, gdr = 0;
      LOOM_CHECK(intAttr(*gpu, "dev", source_, false, -1, &dev));
      LOOM_CHECK(intAttr(*gpu, "sm", source_, false, 0, &sm));
      LOOM_CHECK(intAttr(*gpu, "rank", source_, false, -1, &rank));
      LOOM_CHECK(intAttr(*gpu, "gdr", source_, false, 0, &gdr));
      n.dev = static_cast<int>(dev);
      n.sm = static_cast<int>(sm);
      n.rank = static_cast<int>(rank);
      n.gdr = gdr != 0;
    }
  } else if (nic != nullptr || kind == PciKind::Nic) {
    // Ports of one multi-function NIC share its PCI link: merge them by bus id sans function.
    std::string base = busIdText->substr(0, busIdText->size() - 1);
    int existing = -1;
    for (int i : hosts_[static_cast<size_t>(host)].nodes) {
      const Node& o = nodes_[static_cast<size_t>(i)];
      if (o.type == NodeType::Nic && o.busId.size() == busIdText->size() &&
          o.busId.compare(0, base.size(), base) == 0)
        existing = i;
    }
    if (existing < 0) node = addNode(NodeType::Nic, host, numa, *busIdText);
    if (nic != nullptr) LOOM_CHECK(addNic(*nic, existing >= 0 ? existing : node, host, numa));
    if (existing >= 0) return Status::ok();
  } else if (kind == PciKind::Bridge) {
    node = addNode(NodeType::Pci, host, numa, *busIdText);
    for (const XmlNode& c : pci.children)
      if (c.name == "pci") LOOM_CHECK(addPci(c, node, host, numa));
  } else {
    return Status::ok();  // NVSwitch or CPU-link functions: reached through NVLinks only
  }
  double bw = pciBandwidth(pci.attrOr("link_speed", ""), pci.attrOr("link_width", ""));
  connect(node, parent, LinkType::Pci, bw);
  connect(parent, node, LinkType::Pci, bw);
  return Status::ok();
}

Status System::addCpu(const XmlNode& cpu, int host) {
  int64_t numa = 0, family = 0, model = 0, cores = 0;
  LOOM_CHECK(intAttr(cpu, "numaid", source_, true, 0, &numa));
  LOOM_CHECK(intAttr(cpu, "familyid", source_, false, 0, &family));
  LOOM_CHECK(intAttr(cpu, "modelid", source_, false, 0, &model));
  LOOM_CHECK(intAttr(cpu, "cores", source_, false, 0, &cores));
  for (int i : hosts_[static_cast<size_t>(host)].nodes) {
    const Node& o = nodes_[static_cast<size_t>(i)];
    if (o.type == NodeType::Cpu && o.numa == numa)
      return LOOM_ERROR(loomInvalidArgument, where(source_, cpu) + ": numaid " +
                                                 std::to_string(numa) + " appears twice");
  }
  int idx = addNode(NodeType::Cpu, host, static_cast<int>(numa), "");
  {
    Node& n = nodes_[static_cast<size_t>(idx)];
    n.name = cpu.attrOr("vendor", "");
    n.pus = popcountMask(cpu.attrOr("affinity", ""));
    n.cores = static_cast<int>(cores);
  }
  for (const XmlNode& c : cpu.children) {
    if (c.name == "pci") {
      LOOM_CHECK(addPci(c, idx, host, static_cast<int>(numa)));
    } else if (c.name == "nic") {
      // A NIC without a PCI device (a virtual or socket interface) hangs from the CPU itself.
      int nic = -1;
      for (int i : hosts_[static_cast<size_t>(host)].nodes) {
        const Node& o = nodes_[static_cast<size_t>(i)];
        if (o.type == NodeType::Nic && o.busId.empty() && o.numa == numa) nic = i;
      }
      if (nic < 0) {
        nic = addNode(NodeType::Nic, host, static_cast<int>(numa), "");
        connect(idx, nic, LinkType::Pci, kLocBw);
        connect(nic, idx, LinkType::Pci, kLocBw);
      }
      LOOM_CHECK(addNic(c, nic, host, static_cast<int>(numa)));
    }
  }
  return Status::ok();
}

// Walks the tree for <nvlink> elements under each GPU's <gpu> element.
Status System::addNvLinks(const XmlNode& node, int host, int gpuNode) {
  if (node.name == "nvlink") {
    if (gpuNode < 0)
      return LOOM_ERROR(loomInvalidArgument, where(source_, node) + " is not inside a <gpu>");
    int64_t count = 0;
    LOOM_CHECK(intAttr(node, "count", source_, true, 0, &count));
    constexpr int64_t kMaxNvLinks = 64;  // links between two devices (18 on an H100)
    if (count < 1 || count > kMaxNvLinks)
      return LOOM_ERROR(loomInvalidArgument, where(source_, node) + ": attribute count=\"" +
                                                 std::to_string(count) + "\" is outside [1, " +
                                                 std::to_string(kMaxNvLinks) + "]");
    const std::string* tclass = node.attr("tclass");
    if (tclass == nullptr)
      return LOOM_ERROR(loomInvalidArgument,
                        where(source_, node) + " lacks the required attribute tclass");
    const Node& g = nodes_[static_cast<size_t>(gpuNode)];
    PciKind kind = pciKind(*tclass);
    int remote = -1;
    if (kind == PciKind::Gpu) {
      std::string target = node.attrOr("target", "");
      int64_t id = parseBusId(target);
      if (id < 0)
        return LOOM_ERROR(loomInvalidArgument,
                          where(source_, node) + ": target \"" + target + "\" is not a PCI bus id");
      for (int i : hosts_[static_cast<size_t>(host)].nodes) {
        const Node& o = nodes_[static_cast<size_t>(i)];
        if (o.type == NodeType::Gpu && parseBusId(o.busId) == id) remote = i;
      }
      if (remote == gpuNode) {
        LOOM_INFO(kTopo, "%s: NVLink of %s to itself ignored", where(source_, node).c_str(),
                  g.busId.c_str());
        return Status::ok();
      }
    } else if (kind == PciKind::CpuLink) {
      remote = cpu(host, g.numa);
    } else {
      // Every NVSwitch of a host is one node, as in NCCL: the switches are a crossbar.
      for (int i : hosts_[static_cast<size_t>(host)].nodes)
        if (nodes_[static_cast<size_t>(i)].type == NodeType::NvSwitch) remote = i;
      if (remote < 0) remote = addNode(NodeType::NvSwitch, host, g.numa, "");
    }
    if (remote < 0) return Status::ok();  // the peer is not in this system
    double bw =
        static_cast<double>(count) * nvlinkBandwidth(nodes_[static_cast<size_t>(gpuNode)].sm);
    connect(gpuNode, remote, LinkType::NvLink, bw);
    if (nodes_[static_cast<size_t>(remote)].type != NodeType::Gpu)
      connect(remote, gpuNode, LinkType::NvLink, bw);
    return Status::ok();
  }
  if (node.name == "pci") {
    const std::string* b = node.attr("busid");
    if (b != nullptr && node.child("gpu") != nullptr) {
      int64_t id = parseBusId(*b);
      for (int i : hosts_[static_cast<size_t>(host)].nodes) {
        const Node& o = nodes_[static_cast<size_t>(i)];
        if (o.type == NodeType::Gpu && parseBusId(o.busId) == id) gpuNode = i;
      }
    }
  }
  for (const XmlNode& c : node.children) LOOM_CHECK(addNvLinks(c, host, gpuNode));
  return Status::ok();
}

Result<System> System::build(const XmlNode& root, const std::string& source) {
  if (root.name == "graphs")
    return LOOM_ERROR(loomInvalidArgument,
                      source +
                          ": is an NCCL graph file (NCCL_GRAPH_FILE), not a topology; "
                          "read it with loadNcclGraphs");
  if (root.name != "system")
    return LOOM_ERROR(loomInvalidArgument,
                      where(source, root) + ": expected <system> as the root element");
  System s;
  s.tree_ = root;
  s.source_ = source;
  BuildState st;
  // Hosts in order of first appearance of their host_hash.
  for (const XmlNode& c : root.children) {
    if (c.name != "cpu") {
      if (c.name != "nic" && c.name != "pci")
        LOOM_INFO(kTopo, "%s ignored (not part of the topology schema)", where(source, c).c_str());
      continue;
    }
    uint64_t hash = std::strtoull(c.attrOr("host_hash", "0").c_str(), nullptr, 16);
    auto it = st.hostByHash.find(hash);
    int host;
    if (it == st.hostByHash.end()) {
      host = static_cast<int>(s.hosts_.size());
      st.hostByHash[hash] = host;
      Host h;
      h.hash = hash;
      h.name = c.attrOr("hostname", "");
      s.hosts_.push_back(h);
    } else {
      host = it->second;
    }
    LOOM_CHECK(s.addCpu(c, host));
  }
  if (s.hosts_.empty())
    return LOOM_ERROR(loomInvalidArgument, where(source, root) + " has no <cpu> element");
  for (size_t h = 0; h < s.hosts_.size(); ++h) {
    for (const XmlNode& c : root.children) {
      if (c.name != "cpu") continue;
      uint64_t hash = std::strtoull(c.attrOr("host_hash", "0").c_str(), nullptr, 16);
      if (st.hostByHash[hash] == static_cast<int>(h))
        LOOM_CHECK(s.addNvLinks(c, static_cast<int>(h), -1));
    }
  }
  // CPUs of a host are all joined by the inter-socket link.
  for (const XmlNode& c : root.children) {
    if (c.name != "cpu") continue;
    uint64_t hash = std::strtoull(c.attrOr("host_hash", "0").c_str(), nullptr, 16);
    int host = st.hostByHash[hash];
    int64_t family = 0, model = 0, numa = 0;
    LOOM_CHECK(intAttr(c, "numaid", source, true, 0, &numa));
    LOOM_CHECK(intAttr(c, "familyid", source, false, 0, &family));
    LOOM_CHECK(intAttr(c, "modelid", source, false, 0, &model));
    double bw = interCpuBandwidth(c.attrOr("arch", ""), c.attrOr("vendor", ""),
                                  static_cast<int>(family), static_cast<int>(model));
    int self = s.cpu(host, static_cast<int>(numa));
    for (int other : s.nodesOf(NodeType::Cpu, host))
      if (other != self) s.connect(self, other, LinkType::Sys, bw);
  }
  // GPUs listed without a device index get the next free ones, in file order.
  for (size_t h = 0; h < s.hosts_.size(); ++h) {
    int next = 0;
    for (int i : s.hosts_[h].nodes)
      if (s.nodes_[static_cast<size_t>(i)].type == NodeType::Gpu)
        next = std::max(next, s.nodes_[static_cast<size_t>(i)].dev + 1);
    for (int i : s.hosts_[h].nodes) {
      Node& n = s.nodes_[static_cast<size_t>(i)];
      if (n.type == NodeType::Gpu && n.dev < 0) n.dev = next++;
    }
  }
  s.computePaths();
  return s;
}

std::vector<int> System::nodesOf(NodeType type, int host) const {
  std::vector<int> out;
  for (size_t i = 0; i < nodes_.size(); ++i)
    if (nodes_[i].type == type && (host < 0 || nodes_[i].host == host))
      out.push_back(static_cast<int>(i));
  std::stable_sort(out.begin(), out.end(), [&](int a, int b) {
    const Node& x = nodes_[static_cast<size_t>(a)];
    const Node& y = nodes_[static_cast<size_t>(b)];
    if (x.host != y.host) return x.host < y.host;
    switch (type) {
      case NodeType::Gpu:
      case NodeType::Net:
        return x.dev < y.dev;
      case NodeType::Cpu:
        return x.numa < y.numa;
      default:
        return parseBusId(x.busId) < parseBusId(y.busId);
    }
  });
  return out;
}

int System::gpu(int host, int dev) const {
  for (size_t i = 0; i < nodes_.size(); ++i)
    if (nodes_[i].type == NodeType::Gpu && nodes_[i].host == host && nodes_[i].dev == dev)
      return static_cast<int>(i);
  return -1;
}

int System::cpu(int host, int numa) const {
  for (size_t i = 0; i < nodes_.size(); ++i)
    if (nodes_[i].type == NodeType::Cpu && nodes_[i].host == host && nodes_[i].numa == numa)
      return static_cast<int>(i);
  return -1;
}

const Path& System::path(int a, int b) const {
  if (a < 0 || b < 0 || nodes_[static_cast<size_t>(a)].host != nodes_[static_cast<size_t>(b)].host)
    return noPath_;
  return paths_[static_cast<size_t>(a)][static_cast<size_t>(local_[static_cast<size_t>(b)])];
}

void System::computePaths() {
  local_.assign(nodes_.size(), -1);
  for (const Host& h : hosts_)
    for (size_t i = 0; i < h.nodes.size(); ++i)
      local_[static_cast<size_t>(h.nodes[i])] = static_cast<int>(i);
  paths_.assign(nodes_.size(), {});
  for (size_t a = 0; a < nodes_.size(); ++a) {
    paths_[a].assign(hosts_[static_cast<size_t>(nodes_[a].host)].nodes.size(), Path{});
    setPathsFrom(static_cast<int>(a));
  }
  noPath_.type = PathType::Net;
}

// Breadth-first from `base`, level by level. A node's path is replaced when it has none
// yet, or when the new one is no longer in hops and strictly wider. The type of a path
// is the worst of its steps: a PCI link counts PIX, PCI switch to PCI switch PXB, any
// PCI link touching a CPU PHB, an NVLink step out of an intermediate GPU NVB; a network
// port link counts LOC (GPU-to-NIC paths care about the PCI part only). Paths may cross
// a GPU only as one NVLink hop between two GPUs.
void System::setPathsFrom(int base) {
  std::vector<Path>& out = paths_[static_cast<size_t>(base)];
  auto at = [&](int n) -> Path& {
    return out[static_cast<size_t>(local_[static_cast<size_t>(n)])];
  };
  Path& self = at(base);
  self.type = PathType::Loc;
  self.bw = kLocBw;
  self.nodes = {base};
  std::vector<int> level = {base};
  while (!level.empty()) {
    std::vector<int> next;
    for (int u : level) {
      const Node& nu = nodes_[static_cast<size_t>(u)];
      for (size_t l = 0; l < nu.links.size(); ++l) {
        const Link& link = nu.links[l];
        int v = link.to;
        const Node& nv = nodes_[static_cast<size_t>(v)];
        const Path pu = at(u);  // copy: at(v) may alias when u == v
        if (u != base && nu.type == NodeType::Gpu &&
            (link.type != LinkType::NvLink || nv.type != NodeType::Gpu || pu.links.size() > 1))
          continue;
        Path& pv = at(v);
        double bw = std::min(pu.bw, link.bw);
        if (!((pv.bw == 0 || pv.links.size() > pu.links.size()) && pv.bw < bw)) continue;
        PathType step;
        switch (link.type) {
          case LinkType::Loc:
          case LinkType::Net:
            step = PathType::Loc;
            break;
          case LinkType::NvLink:
            step = PathType::Nvl;
            break;
          case LinkType::Pci:
            step = PathType::Pix;
            break;
          default:
            step = PathType::Sys;
            break;
        }
        if (nu.type == NodeType::Pci && nv.type == NodeType::Pci) step = PathType::Pxb;
        if (link.type == LinkType::Pci && (nu.type == NodeType::Cpu || nv.type == NodeType::Cpu))
          step = PathType::Phb;
        if (nu.type == NodeType::Gpu && pu.type == PathType::Nvl && step == PathType::Nvl &&
            u != base)
          step = PathType::Nvb;
        pv.bw = bw;
        pv.type = std::max(pu.type, step);
        pv.nodes = pu.nodes;
        pv.nodes.push_back(v);
        pv.links = pu.links;
        pv.links.emplace_back(u, static_cast<int>(l));
        if (std::find(next.begin(), next.end(), v) == next.end()) next.push_back(v);
      }
    }
    level.swap(next);
  }
}

int System::nearestNet(int a) const {
  int best = -1;
  for (int n : nodesOf(NodeType::Net, nodes_[static_cast<size_t>(a)].host)) {
    const Path& p = path(a, n);
    if (p.type == PathType::Dis) continue;
    if (best < 0 || p.bw > path(a, best).bw ||
        (p.bw == path(a, best).bw && p.type < path(a, best).type))
      best = n;
  }
  return best;
}

System::NetRoute System::netRoute(int a, int b) const {
  NetRoute r;
  int ha = nodes_[static_cast<size_t>(a)].host, hb = nodes_[static_cast<size_t>(b)].host;
  for (int na : nodesOf(NodeType::Net, ha)) {
    for (int nb : nodesOf(NodeType::Net, hb)) {
      const Path& pa = path(a, na);
      const Path& pb = path(nb, b);
      if (pa.type == PathType::Dis || pb.type == PathType::Dis) continue;
      double bw = std::min(pa.bw, pb.bw);
      PathType worst = std::max(pa.type, pb.type);
      if (r.netOut < 0 || bw > r.bw || (bw == r.bw && worst < r.worst)) {
        r.netOut = na;
        r.netIn = nb;
        r.bw = bw;
        r.worst = worst;
      }
    }
  }
  return r;
}

}  // namespace loom::topo
