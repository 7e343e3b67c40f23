// hwloc XML (what `lstopo --of xml` writes, any format version) -> NCCL's topology schema.
//
// Read with our own walker rather than hwloc's importer: hwloc 2.x refuses files written
// by hwloc 3.x, and files from hwloc 1.x differ in object names. The walker knows:
//  * v1: Socket instead of Package, NUMANode as an ordinary parent object, osdev_type
//    as an enumeration (0 block, 1 GPU, 2 network, 3 OpenFabrics, 4 DMA, 5 coprocessor);
//  * v2: NUMANode as a memory child of Package/Group/Machine, same enumeration;
//  * v3: osdev_type as a bit mask (1 storage, 2 memory, 4 GPU, 8 coprocessor,
//    16 network, 32 OpenFabrics, 64 DMA).
// What is kept: one <cpu> per NUMA node (affinity, vendor, family, model, cores), and the
// PCI tree leading to GPUs (NVIDIA, or any with a GPU OS device), NICs (network class,
// InfiniBand class, or any device with a network OS device) and their nets. PCIe switch
// upstream ports become <pci> elements; root ports and downstream ports are dropped, as
// NCCL's own sysfs walk does. NVLinks come from the NVLinkBandwidth distance matrix.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>

#include "topology/topology.h"

namespace loom::topo {
namespace {

struct Obj {
  const XmlNode* x = nullptr;
  const Obj* parent = nullptr;
  std::vector<Obj> kids;
  std::string type;
};

std::string infoOf(const XmlNode& x, const std::string& name) {
  for (const XmlNode& c : x.children)
    if (c.name == "info" && c.attrOr("name", "") == name) return c.attrOr("value", "");
  return "";
}

void buildObjs(const XmlNode& x, const Obj* parent, Obj& out) {
  out.x = &x;
  out.parent = parent;
  out.type = x.attrOr("type", "");
  if (out.type == "Socket") out.type = "Package";
  for (const XmlNode& c : x.children) {
    if (c.name != "object") continue;
    out.kids.emplace_back();
  }
  size_t k = 0;
  for (const XmlNode& c : x.children) {
    if (c.name != "object") continue;
    buildObjs(c, &out, out.kids[k++]);
  }
}

// hwloc bitmap text ("0x00000303,0x03030000,,0x0") -> 32-bit words, most significant first.
std::vector<uint32_t> bitmapWords(const std::string& s) {
  std::vector<uint32_t> w;
  size_t start = 0;
  while (start <= s.size()) {
    size_t comma = s.find(',', start);
    std::string part =
        s.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    w.push_back(static_cast<uint32_t>(std::strtoul(part.c_str(), nullptr, 16)));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return w;
}

bool intersects(const std::string& a, const std::string& b) {
  std::vector<uint32_t> x = bitmapWords(a), y = bitmapWords(b);
  for (size_t i = 0; i < x.size() && i < y.size(); ++i)
    if (x[x.size() - 1 - i] & y[y.size() - 1 - i]) return true;
  return false;
}

bool subset(const std::string& a, const std::string& b) {  // a within b
  std::vector<uint32_t> x = bitmapWords(a), y = bitmapWords(b);
  for (size_t i = 0; i < x.size(); ++i) {
    uint32_t yy = i < y.size() ? y[y.size() - 1 - i] : 0;
    if (x[x.size() - 1 - i] & ~yy) return false;
  }
  return true;
}

// sysfs cpumap style: "000000ff,ffff0000" (words of 8 hex digits, leading zero words dropped).
std::string cpumap(const std::string& hw) {
  std::vector<uint32_t> w = bitmapWords(hw);
  size_t first = 0;
  while (first + 1 < w.size() && w[first] == 0) ++first;
  std::string out;
  char buf[16];
  for (size_t i = first; i < w.size(); ++i) {
    std::snprintf(buf, sizeof(buf), "%08x", w[i]);
    if (!out.empty()) out += ',';
    out += buf;
  }
  return out;
}

void collect(const Obj& o, const std::string& type, std::vector<const Obj*>& out) {
  if (o.type == type) out.push_back(&o);
  for (const Obj& k : o.kids) collect(k, type, out);
}

bool isIo(const std::string& t) { return t == "Bridge" || t == "PCIDev" || t == "OSDev"; }

// PCIe bandwidth in GB/s (hwloc's pci_link_speed) -> (link_speed, link_width) strings: the
// widest width whose per-lane rate matches a PCIe generation within 1%.
std::pair<std::string, std::string> speedWidth(double gbs) {
  struct Gen {
    double lane;
    const char* name;
  };
  static const Gen gens[] = {{0.25, "2.5 GT/s PCIe"},
                             {0.5, "5.0 GT/s PCIe"},
                             {8.0 * 128 / 130 / 8, "8.0 GT/s PCIe"},
                             {16.0 * 128 / 130 / 8, "16.0 GT/s PCIe"},
                             {32.0 * 128 / 130 / 8, "32.0 GT/s PCIe"},
                             {64.0 * 128 / 130 / 8, "64.0 GT/s PCIe"}};
  if (gbs > 0) {
    for (int width : {16, 8, 4, 2, 1}) {
      double lane = gbs / width;
      for (const Gen& g : gens)
        if (std::fabs(lane - g.lane) <= 0.01 * g.lane) return {g.name, std::to_string(width)};
    }
  }
  return {"", "0"};
}

struct PciType {
  std::string cls, vendor, device, subVendor, subDevice;
};

// "0302 [10de:1db8] [10de:131d] a1 00"
PciType parsePciType(const std::string& t) {
  PciType p;
  unsigned cls = 0, v = 0, d = 0, sv = 0, sd = 0;
  if (std::sscanf(t.c_str(), "%x [%x:%x] [%x:%x]", &cls, &v, &d, &sv, &sd) >= 3) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "0x%04x00", cls);
    p.cls = buf;
    std::snprintf(buf, sizeof(buf), "0x%04x", v);
    p.vendor = buf;
    std::snprintf(buf, sizeof(buf), "0x%04x", d);
    p.device = buf;
    std::snprintf(buf, sizeof(buf), "0x%04x", sv);
    p.subVendor = buf;
    std::snprintf(buf, sizeof(buf), "0x%04x", sd);
    p.subDevice = buf;
  }
  return p;
}

enum OsKind { kOsOther, kOsGpu, kOsNet, kOsFabric };

OsKind osKind(const Obj& o, int version) {
  int t = std::atoi(o.x->attrOr("osdev_type", "-1").c_str());
  std::string name = o.x->attrOr("name", "");
  std::string sub = o.x->attrOr("subtype", "");
  if (version >= 3) {
    if (t >= 0 && (t & 32)) return kOsFabric;
    if (t >= 0 && (t & 16)) return kOsNet;
    if (t >= 0 && (t & 12)) return kOsGpu;
  } else {
    if (t == 3) return kOsFabric;
    if (t == 2) return kOsNet;
    if (t == 1 || t == 5) return kOsGpu;
  }
  if (sub == "CUDA" || sub == "NVML" || name.rfind("nvml", 0) == 0 || name.rfind("cuda", 0) == 0)
    return kOsGpu;
  return kOsOther;
}

// Compute capability from the GPU model name NVML reports (0: unknown).
int smFromModel(const std::string& model) {
  static const std::pair<const char*, int> table[] = {
      {"GB200", 100}, {"B200", 100}, {"B100", 100}, {"GH200", 90}, {"H200", 90}, {"H100", 90},
      {"H800", 90},   {"L40", 89},   {"L4", 89},    {"A100", 80},  {"A800", 80}, {"A30", 80},
      {"A40", 86},    {"A10", 86},   {"T4", 75},    {"V100", 70},  {"P100", 60}, {"P40", 61}};
  for (const auto& e : table)
    if (model.find(e.first) != std::string::npos) return e.second;
  return 0;
}

struct Converter {
  std::string source;
  int version = 2;
  std::vector<const Obj*> numas, packages, cores;
  int nextNet = 0;
  int nextGpu = 0;
  std::map<const Obj*, int> gpuDev;           // GPU PCIDev -> dev
  std::map<std::string, const Obj*> byGp;     // "gp_index" -> object
  std::map<const Obj*, XmlNode*> gpuElement;  // GPU PCIDev -> its <gpu> element
  std::map<const Obj*, int> gpuSm;

  int bridgeDepth(const Obj& o) const {
    const std::string* d = o.x->attr("depth");
    if (d != nullptr) return std::atoi(d->c_str());
    int n = 0;
    for (const Obj* p = o.parent; p && p->type == "Bridge"; p = p->parent) ++n;
    return n;
  }

  bool isGpu(const Obj& o) const {
    PciType t = parsePciType(o.x->attrOr("pci_type", ""));
    if (t.cls.compare(0, 4, "0x03") != 0) return false;
    if (t.vendor == "0x10de") return true;
    for (const Obj& k : o.kids)
      if (k.type == "OSDev" && osKind(k, version) == kOsGpu) return true;
    return false;
  }

  bool isNic(const Obj& o) const {
    PciType t = parsePciType(o.x->attrOr("pci_type", ""));
    if (t.cls.compare(0, 4, "0x02") == 0) return true;
    bool fabric = false;
    for (const Obj& k : o.kids)
      if (k.type == "OSDev" && (osKind(k, version) == kOsNet || osKind(k, version) == kOsFabric))
        fabric = true;
    return fabric;
  }

  void pciAttrs(const Obj& o, XmlNode& e, bool bridge) const {
    PciType t = parsePciType(o.x->attrOr("pci_type", ""));
    e.set("busid", o.x->attrOr("pci_busid", ""));
    e.set("class", bridge ? "0x060400" : t.cls);
    if (!t.vendor.empty()) {
      e.set("vendor", t.vendor);
      e.set("device", t.device);
      e.set("subsystem_vendor", t.subVendor);
      e.set("subsystem_device", t.subDevice);
    }
    auto sw = speedWidth(std::atof(o.x->attrOr("pci_link_speed", "0").c_str()));
    e.set("link_speed", sw.first);
    e.set("link_width", sw.second);
  }

  // Emits the kept part of an I/O subtree under `parent`; returns whether anything was kept.
  bool emitIo(const Obj& o, XmlNode& parent) {
    if (o.type == "Bridge") {
      bool keep = o.x->has("pci_busid") && bridgeDepth(o) >= 2 && bridgeDepth(o) % 2 == 0;
      if (keep) {
        XmlNode e;
        e.name = "pci";
        pciAttrs(o, e, true);
        bool any = false;
        for (const Obj& k : o.kids) any |= emitIo(k, e);
        if (any) parent.children.push_back(std::move(e));
        return any;
      }
      bool any = false;
      for (const Obj& k : o.kids) any |= emitIo(k, parent);
      return any;
    }
    if (o.type != "PCIDev") return false;
    if (isGpu(o)) {
      XmlNode& e = parent.add("pci");
      pciAttrs(o, e, false);
      std::string model;
      int dev = -1;
      bool hasOs = false;
      for (const Obj& k : o.kids) {
        if (k.type != "OSDev" || osKind(k, version) != kOsGpu) continue;
        hasOs = true;
        std::string name = k.x->attrOr("name", "");
        if (model.empty()) model = infoOf(*k.x, "GPUModel");
        if (dev < 0 && name.rfind("nvml", 0) == 0) dev = std::atoi(name.c_str() + 4);
        if (dev < 0 && name.rfind("cuda", 0) == 0) dev = std::atoi(name.c_str() + 4);
      }
      int sm = smFromModel(model);
      gpuSm[&o] = sm;
      if (hasOs || sm > 0) {
        if (dev < 0) dev = nextGpu;
        nextGpu = std::max(nextGpu, dev + 1);
        XmlNode& g = e.add("gpu");
        g.set("dev", std::to_string(dev));
        g.set("sm", std::to_string(sm));
        g.set("rank", std::to_string(dev));
        g.set("gdr", "0");
        gpuDev[&o] = dev;
      }
      return true;
    }
    if (isNic(o)) {
      XmlNode e;
      e.name = "pci";
      pciAttrs(o, e, false);
      XmlNode nic;
      nic.name = "nic";
      bool fabric = false;
      for (const Obj& k : o.kids)
        if (k.type == "OSDev" && osKind(k, version) == kOsFabric) fabric = true;
      for (const Obj& k : o.kids) {
        if (k.type != "OSDev") continue;
        OsKind kind = osKind(k, version);
        if (fabric ? kind != kOsFabric : kind != kOsNet) continue;
        XmlNode& n = nic.add("net");
        n.set("name", k.x->attrOr("name", ""));
        n.set("dev", std::to_string(nextNet++));
        n.set("port", fabric ? "1" : "0");
      }
      PciType t = parsePciType(o.x->attrOr("pci_type", ""));
      if (nic.children.empty() && t.cls.compare(0, 4, "0x02") != 0) return false;
      if (!nic.children.empty()) e.children.push_back(std::move(nic));
      parent.children.push_back(std::move(e));
      return true;
    }
    return false;
  }

  // The NUMA node an object's I/O belongs to: the first NUMA node sharing its cpus.
  int localNuma(const Obj* o) const {
    for (const Obj* p = o; p != nullptr; p = p->parent) {
      if (isIo(p->type)) continue;
      if (p->type == "NUMANode") return std::atoi(p->x->attrOr("os_index", "0").c_str());
      std::string cs = p->x->attrOr("cpuset", "");
      for (const Obj* n : numas)
        if (!cs.empty() && intersects(n->x->attrOr("cpuset", ""), cs))
          return std::atoi(n->x->attrOr("os_index", "0").c_str());
      break;
    }
    return numas.empty() ? 0 : std::atoi(numas[0]->x->attrOr("os_index", "0").c_str());
  }

  // I/O subtree roots (I/O objects whose parent is not an I/O object), in document order.
  void ioRoots(const Obj& o, std::vector<const Obj*>& out) const {
    for (const Obj& k : o.kids) {
      if (isIo(k.type))
        out.push_back(&k);
      else
        ioRoots(k, out);
    }
  }

  void index(const Obj& o) {
    const std::string* gp = o.x->attr("gp_index");
    if (gp) byGp[*gp] = &o;
    for (const Obj& k : o.kids) index(k);
  }

  const Obj* pciParentOf(const Obj* o) const {
    if (o && o->type == "OSDev") return o->parent;
    return o;
  }
};

void numbers(const XmlNode& d, const char* elem, std::vector<std::string>& out) {
  for (const XmlNode& c : d.children) {
    if (c.name != elem) continue;
    size_t i = 0;
    const std::string& t = c.text;
    while (i < t.size()) {
      while (i < t.size() && t[i] == ' ') ++i;
      size_t j = t.find(' ', i);
      if (j == std::string::npos) j = t.size();
      if (j > i) out.push_back(t.substr(i, j - i));
      i = j;
    }
  }
}

XmlNode* findGpuPci(XmlNode& n, const std::string& busId) {
  if (n.name == "pci" && n.attrOr("busid", "") == busId) return &n;
  for (XmlNode& c : n.children)
    if (XmlNode* f = findGpuPci(c, busId)) return f;
  return nullptr;
}

}  // namespace

Result<XmlNode> hwlocToNccl(const XmlNode& root, const std::string& source) {
  if (root.name != "topology")
    return LOOM_ERROR(loomInvalidArgument,
                      where(source, root) + ": expected <topology> (hwloc XML)");
  Converter cv;
  cv.source = source;
  cv.version = std::atoi(root.attrOr("version", "1.0").c_str());
  Obj top;
  top.type = "root";
  top.x = &root;
  for (const XmlNode& c : root.children)
    if (c.name == "object") top.kids.emplace_back();
  {
    size_t k = 0;
    for (const XmlNode& c : root.children)
      if (c.name == "object") buildObjs(c, &top, top.kids[k++]);
  }
  if (top.kids.empty())
    return LOOM_ERROR(loomInvalidArgument, where(source, root) + " has no <object> element");
  for (const Obj& k : top.kids) {
    collect(k, "NUMANode", cv.numas);
    collect(k, "Package", cv.packages);
    collect(k, "Core", cv.cores);
  }
  cv.index(top);
  std::sort(cv.numas.begin(), cv.numas.end(), [](const Obj* a, const Obj* b) {
    return std::atoi(a->x->attrOr("os_index", "0").c_str()) <
           std::atoi(b->x->attrOr("os_index", "0").c_str());
  });
  std::string arch = infoOf(root, "Architecture");
  if (arch.empty())
    for (const Obj& k : top.kids)
      if (arch.empty()) arch = infoOf(*k.x, "Architecture");

  XmlNode sys;
  sys.name = "system";
  sys.set("version", "1");
  std::map<int, XmlNode*> cpuByNuma;
  std::vector<const Obj*> numaList = cv.numas;
  Obj machineOnly;
  if (numaList.empty()) numaList.push_back(&top.kids[0]);  // no NUMA information: one domain
  for (const Obj* n : numaList) {
    int numa = n->type == "NUMANode" ? std::atoi(n->x->attrOr("os_index", "0").c_str()) : 0;
    std::string cs = n->x->attrOr("cpuset", "");
    XmlNode& cpu = sys.add("cpu");
    cpu.set("numaid", std::to_string(numa));
    if (!cs.empty()) cpu.set("affinity", cpumap(cs));
    if (!arch.empty()) cpu.set("arch", arch);
    const Obj* pkg = nullptr;
    for (const Obj* p : cv.packages)
      if (!cs.empty() && intersects(p->x->attrOr("cpuset", ""), cs)) pkg = pkg ? pkg : p;
    if (pkg) {
      std::string vendor = infoOf(*pkg->x, "CPUVendor");
      if (!vendor.empty()) cpu.set("vendor", vendor);
      std::string fam = infoOf(*pkg->x, "CPUFamilyNumber");
      std::string mod = infoOf(*pkg->x, "CPUModelNumber");
      if (!fam.empty()) cpu.set("familyid", fam);
      if (!mod.empty()) cpu.set("modelid", mod);
    }
    int ncores = 0;
    for (const Obj* c : cv.cores)
      if (!cs.empty() && subset(c->x->attrOr("cpuset", ""), cs)) ++ncores;
    if (ncores > 0) cpu.set("cores", std::to_string(ncores));
  }
  for (XmlNode& c : sys.children) cpuByNuma[std::atoi(c.attrOr("numaid", "0").c_str())] = &c;

  std::vector<const Obj*> roots;
  cv.ioRoots(top, roots);
  for (const Obj* r : roots) {
    int numa = cv.localNuma(r->parent);
    auto it = cpuByNuma.find(numa);
    XmlNode* cpu = it != cpuByNuma.end() ? it->second : &sys.children.front();
    cv.emitIo(*r, *cpu);
  }

  // NVLinks from the NVLinkBandwidth matrix (MB/s). hwloc reports 20000 MB/s per link for
  // first-generation NVLink (sm60) and 25000 for later generations.
  for (const XmlNode& d : root.children) {
    if ((d.name != "distances2" && d.name != "distances2hetero") ||
        d.attrOr("name", "") != "NVLinkBandwidth")
      continue;
    std::vector<std::string> idx, vals;
    numbers(d, "indexes", idx);
    numbers(d, "u64values", vals);
    size_t n = idx.size();
    if (n == 0 || vals.size() != n * n)
      return LOOM_ERROR(loomInvalidArgument,
                        where(source, d) + ": expected " + std::to_string(n * n) + " values for " +
                            std::to_string(n) + " objects, found " + std::to_string(vals.size()));
    std::vector<const Obj*> objs(n, nullptr);
    for (size_t i = 0; i < n; ++i) {
      std::string key = idx[i];
      size_t colon = key.find(':');
      if (colon != std::string::npos) key = key.substr(colon + 1);
      auto it = cv.byGp.find(key);
      objs[i] = it == cv.byGp.end() ? nullptr : cv.pciParentOf(it->second);
    }
    for (size_t i = 0; i < n; ++i) {
      const Obj* g = objs[i];
      if (g == nullptr || cv.gpuDev.find(g) == cv.gpuDev.end()) continue;
      XmlNode* pci = findGpuPci(sys, g->x->attrOr("pci_busid", ""));
      XmlNode* gpu = pci ? pci->child("gpu") : nullptr;
      if (gpu == nullptr) continue;
      int sm = cv.gpuSm[g];
      double perLink = (sm > 0 && sm < 70) ? 20000.0 : 25000.0;
      for (size_t j = 0; j < n; ++j) {
        if (i == j || objs[j] == nullptr) continue;
        double v = std::atof(vals[i * n + j].c_str());
        if (v <= 0) continue;
        int count = std::max(1, static_cast<int>(std::lround(v / perLink)));
        const Obj* t = objs[j];
        XmlNode& l = gpu->add("nvlink");
        if (t->type == "Package" || t->type == "NUMANode" || t->type == "Machine") {
          l.set("target", "0000:00:00.0");  // NVLink to the CPU: NCCL locates the CPU itself
          l.set("count", std::to_string(count));
          l.set("tclass", "0x068001");
        } else if (cv.gpuDev.count(t)) {
          l.set("target", t->x->attrOr("pci_busid", ""));
          l.set("count", std::to_string(count));
          l.set("tclass", "0x030200");
        } else {
          l.set("target", t->x->attrOr("pci_busid", ""));
          l.set("count", std::to_string(count));
          l.set("tclass", "0x068000");  // NVSwitch
        }
      }
    }
  }
  return sys;
}

}  // namespace loom::topo
