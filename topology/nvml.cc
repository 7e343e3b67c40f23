// GPUs and NVLinks through NVML, loaded at run time so Loom runs where no driver exists.
#include <dlfcn.h>

#include <cstring>
#include <map>

#include "topology/topology.h"
#include "util/log.h"

namespace loom::topo {
namespace {

// The subset of NVML's ABI used here (nvml.h, stable since the _v2/_v3 entry points).
using nvmlDevice_t = void*;
using nvmlReturn_t = int;
constexpr nvmlReturn_t kNvmlSuccess = 0;
constexpr unsigned kNvmlMaxLinks = 18;
struct NvmlPciInfo {
  char busIdLegacy[16];
  unsigned domain, bus, device, pciDeviceId, pciSubSystemId;
  char busId[32];
};
enum { kRemoteGpu = 0, kRemoteIbmNpu = 1, kRemoteSwitch = 2 };

struct Nvml {
  void* lib = nullptr;
  nvmlReturn_t (*init)() = nullptr;
  nvmlReturn_t (*shutdown)() = nullptr;
  nvmlReturn_t (*count)(unsigned*) = nullptr;
  nvmlReturn_t (*byIndex)(unsigned, nvmlDevice_t*) = nullptr;
  nvmlReturn_t (*pciInfo)(nvmlDevice_t, NvmlPciInfo*) = nullptr;
  nvmlReturn_t (*cc)(nvmlDevice_t, int*, int*) = nullptr;
  nvmlReturn_t (*linkState)(nvmlDevice_t, unsigned, int*) = nullptr;
  nvmlReturn_t (*remotePci)(nvmlDevice_t, unsigned, NvmlPciInfo*) = nullptr;
  nvmlReturn_t (*remoteType)(nvmlDevice_t, unsigned, int*) = nullptr;  // optional
  ~Nvml() {
    if (lib) dlclose(lib);
  }
  template <typename F>
  bool sym(F& f, const char* name) {
    f = reinterpret_cast<F>(dlsym(lib, name));
    return f != nullptr;
  }
};

std::string lowerBusId(const char* s) {
  std::string b = s;
  for (char& c : b) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  // NVML writes an 8-digit domain ("00000000:10:1C.0"); keep the usual 4 digits.
  if (b.size() == 16 && b.compare(0, 4, "0000") == 0) b = b.substr(4);
  return b;
}

}  // namespace

Result<std::vector<GpuProbe>> probeNvml() {
  std::vector<GpuProbe> out;
  Nvml n;
  n.lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (n.lib == nullptr) {
    LOOM_INFO(kTopo, "NVML not found (%s): no GPUs detected", dlerror());
    return out;
  }
  if (!n.sym(n.init, "nvmlInit_v2") || !n.sym(n.shutdown, "nvmlShutdown") ||
      !n.sym(n.count, "nvmlDeviceGetCount_v2") ||
      !n.sym(n.byIndex, "nvmlDeviceGetHandleByIndex_v2") ||
      !n.sym(n.pciInfo, "nvmlDeviceGetPciInfo_v3") ||
      !n.sym(n.cc, "nvmlDeviceGetCudaComputeCapability")) {
    LOOM_WARN(kTopo, "libnvidia-ml.so.1 lacks an entry point Loom needs; GPUs not detected");
    return out;
  }
  n.sym(n.linkState, "nvmlDeviceGetNvLinkState");
  n.sym(n.remotePci, "nvmlDeviceGetNvLinkRemotePciInfo_v2");
  n.sym(n.remoteType, "nvmlDeviceGetNvLinkRemoteDeviceType");
  if (n.init() != kNvmlSuccess) {
    LOOM_INFO(kTopo, "nvmlInit failed (no GPU driver loaded?): no GPUs detected");
    return out;
  }
  unsigned count = 0;
  if (n.count(&count) != kNvmlSuccess) count = 0;
  std::vector<nvmlDevice_t> devs;
  for (unsigned i = 0; i < count; ++i) {
    nvmlDevice_t d = nullptr;
    NvmlPciInfo pci{};
    if (n.byIndex(i, &d) != kNvmlSuccess || n.pciInfo(d, &pci) != kNvmlSuccess) continue;
    GpuProbe g;
    g.busId = lowerBusId(pci.busId);
    g.dev = static_cast<int>(i);
    g.rank = static_cast<int>(i);
    int major = 0, minor = 0;
    if (n.cc(d, &major, &minor) == kNvmlSuccess) g.sm = major * 10 + minor;
    std::string numa = "/sys/bus/pci/devices/" + g.busId + "/numa_node";
    if (FILE* f = std::fopen(numa.c_str(), "r")) {
      if (std::fscanf(f, "%d", &g.numa) != 1) g.numa = -1;
      std::fclose(f);
    }
    out.push_back(g);
    devs.push_back(d);
  }
  for (size_t i = 0; i < out.size(); ++i) {
    if (!n.linkState || !n.remotePci) break;
    std::map<std::string, NvLinkProbe> byTarget;
    for (unsigned l = 0; l < kNvmlMaxLinks; ++l) {
      int active = 0;
      if (n.linkState(devs[i], l, &active) != kNvmlSuccess || !active) continue;
      NvmlPciInfo rp{};
      if (n.remotePci(devs[i], l, &rp) != kNvmlSuccess) continue;
      std::string target = lowerBusId(rp.busId);
      std::string tclass = "0x068000";  // NVSwitch unless it is a known GPU or a CPU
      bool isGpu = false;
      for (const GpuProbe& o : out) isGpu |= parseBusId(o.busId) == parseBusId(target);
      int type = -1;
      if (n.remoteType && n.remoteType(devs[i], l, &type) == kNvmlSuccess) {
        if (type == kRemoteGpu) isGpu = true;
        if (type == kRemoteIbmNpu) tclass = "0x068001";
      }
      if (isGpu) tclass = "0x030200";
      NvLinkProbe& p = byTarget[target];
      p.target = target;
      p.tclass = tclass;
      p.count++;
    }
    for (auto& kv : byTarget) out[i].nvlinks.push_back(kv.second);
  }
  // GPUDirect RDMA needs the peer-memory module.
  bool gdr = false;
  for (const char* p :
       {"/sys/kernel/mm/memory_peers/nv_mem/version", "/sys/module/nvidia_peermem/version"})
    if (FILE* f = std::fopen(p, "r")) {
      gdr = true;
      std::fclose(f);
    }
  for (GpuProbe& g : out) g.gdr = gdr;
  n.shutdown();
  LOOM_INFO(kTopo, "NVML: %zu GPU(s)", out.size());
  return out;
}

}  // namespace loom::topo
