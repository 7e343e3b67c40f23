// Topology: detection on this machine, loading every fixture (NCCL and hwloc XML), paths
// and bandwidths checked against arithmetic done by hand from the fixture text, lossless
// dump/load, merging hosts, ring search, and clear errors for malformed files.
#include "topology/topology.h"

#include <dirent.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "algorithms/graph_links.h"
#include "contains.h"
#include "topology/search.h"

namespace loom::topo {
namespace {

const std::string kShared = LOOM_SHARED_TOPOLOGIES;
const std::string kData = LOOM_TEST_DATA;

bool exists(const std::string& p) { return std::ifstream(p).good(); }

std::vector<std::string> xmlFiles(const std::string& dir) {
  std::vector<std::string> out;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      std::string n = e->d_name;
      if (n.size() > 4 && n.compare(n.size() - 4, 4, ".xml") == 0) out.push_back(dir + "/" + n);
    }
    closedir(d);
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<std::string> sharedFixtures() {
  std::vector<std::string> all = xmlFiles(kShared);
  for (const std::string& f : xmlFiles(kShared + "/hwloc")) all.push_back(f);
  return all;
}

// Our own fixtures that must load (the malformed ones must not).
std::vector<std::string> goodOwnFixtures() {
  std::vector<std::string> out;
  for (const std::string& f : xmlFiles(kData))
    if (f.find("malformed") == std::string::npos && f.find("missing-") == std::string::npos &&
        f.find("bad-") == std::string::npos)
      out.push_back(f);
  return out;
}

#define SKIP_WITHOUT_SHARED()                                  \
  if (!exists(kShared + "/README.md"))                         \
  GTEST_SKIP() << "the shared fixtures are not at " << kShared \
               << " (CI has them at ${CMAKE_SOURCE_DIR}/../shared/topologies)"

System load(const std::string& path) {
  auto r = loadTopologyFile(path);
  EXPECT_TRUE(r.isOk()) << r.status().message();
  return r.take();
}

int gpuAt(const System& s, const std::string& busId) {
  for (int n : s.nodesOf(NodeType::Gpu))
    if (s.node(n).busId == busId) return n;
  ADD_FAILURE() << "no GPU " << busId;
  return -1;
}

int nodeAt(const System& s, NodeType t, const std::string& busId) {
  for (int n : s.nodesOf(t))
    if (s.node(n).busId == busId) return n;
  ADD_FAILURE() << "no " << nodeTypeName(t) << " " << busId;
  return -1;
}

using loomtest::Contains;

// ---- bandwidth figures ------------------------------------------------------------------

TEST(TopoBandwidth, PcieWidthTimesLaneRate) {
  // width x rate / 80, rate per lane in 100 Mb/s: Gen3 60, Gen4 120, Gen5 240.
  EXPECT_DOUBLE_EQ(pciBandwidth("16.0 GT/s PCIe", "16"), 24.0);  // 16 x 120 / 80
  EXPECT_DOUBLE_EQ(pciBandwidth("16 GT/s", "16"), 24.0);         // old kernels' spelling
  EXPECT_DOUBLE_EQ(pciBandwidth("8 GT/s", "16"), 12.0);          // 16 x 60 / 80
  EXPECT_DOUBLE_EQ(pciBandwidth("32 GT/s PCIe/s", "16"), 48.0);  // p5's spelling, 16 x 240 / 80
  EXPECT_DOUBLE_EQ(pciBandwidth("32.0 GT/s PCIe", "8"), 24.0);   // 8 x 240 / 80
  EXPECT_DOUBLE_EQ(pciBandwidth("2.5 GT/s", "4"), 0.75);         // 4 x 15 / 80
  EXPECT_DOUBLE_EQ(pciBandwidth("", "0"), 12.0);                 // unknown: Gen3 x16
  EXPECT_DOUBLE_EQ(pciBandwidth("Unknown", "4"), 3.0);           // 4 x 60 / 80
}

TEST(TopoBandwidth, NvlinkPerGenerationAndOthers) {
  EXPECT_DOUBLE_EQ(nvlinkBandwidth(60), 18.0);
  EXPECT_DOUBLE_EQ(nvlinkBandwidth(70), 20.0);
  EXPECT_DOUBLE_EQ(nvlinkBandwidth(80), 20.0);
  EXPECT_DOUBLE_EQ(nvlinkBandwidth(86), 12.0);
  EXPECT_DOUBLE_EQ(nvlinkBandwidth(90), 20.6);
  EXPECT_DOUBLE_EQ(nvlinkBandwidth(100), 40.1);
  EXPECT_DOUBLE_EQ(interCpuBandwidth("x86_64", "GenuineIntel", 6, 85), 10.0);   // Skylake
  EXPECT_DOUBLE_EQ(interCpuBandwidth("x86_64", "GenuineIntel", 6, 79), 6.0);    // Broadwell
  EXPECT_DOUBLE_EQ(interCpuBandwidth("x86_64", "GenuineIntel", 6, 143), 22.0);  // Sapphire Rapids
  EXPECT_DOUBLE_EQ(interCpuBandwidth("x86_64", "AuthenticAMD", 23, 49), 16.0);
  EXPECT_DOUBLE_EQ(interCpuBandwidth("ppc64le", "", 0, 0), 32.0);
  EXPECT_DOUBLE_EQ(netBandwidth(100000), 12.5);  // 100 Gb/s / 8000
  EXPECT_DOUBLE_EQ(netBandwidth(-1), 1.25);      // unknown: 10 Gb/s
}

// ---- detection -------------------------------------------------------------------------

TEST(TopoDetect, ThisHost) {
  auto r = detectHost();
  ASSERT_TRUE(r.isOk()) << r.status().message();
  const System& s = r.value();
  ASSERT_EQ(s.hosts().size(), 1u);
  std::vector<int> cpus = s.nodesOf(NodeType::Cpu);
  ASSERT_GE(cpus.size(), 1u);
  int pus = 0, cores = 0;
  for (int c : cpus) {
    pus += s.node(c).pus;
    cores += s.node(c).cores;
  }
  EXPECT_GT(pus, 0);
  EXPECT_GT(cores, 0);
  // Whatever was found (GPUs and NICs are optional), the dump reloads to the same tree.
  auto again = loadTopologyString(dumpTopology(s), "dump of this host");
  ASSERT_TRUE(again.isOk()) << again.status().message();
  EXPECT_EQ(again.value().tree(), s.tree());
}

TEST(TopoDetect, WithoutNvmlOrSysfs) {
  DetectOptions o;
  o.nvml = false;
  o.sysfs = false;
  auto r = detectHost(o);
  ASSERT_TRUE(r.isOk()) << r.status().message();
  EXPECT_GE(r.value().nodesOf(NodeType::Cpu).size(), 1u);
}

TEST(TopoDetect, NvmlAbsentIsNotAnError) {
  auto r = probeNvml();
  ASSERT_TRUE(r.isOk()) << r.status().message();  // empty on a machine without a driver
}

TEST(TopoDetect, SysfsNetsFromAFakeTree) {
  char tmpl[] = "/tmp/loom-topo-sysfsXXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  std::string root = tmpl;
  std::string ifc = root + "/class/net/ens1";
  ASSERT_EQ(system(("mkdir -p " + ifc + " " + root + "/class/net/lo").c_str()), 0);
  std::ofstream(ifc + "/operstate") << "up\n";
  std::ofstream(ifc + "/speed") << "25000\n";
  std::ofstream(ifc + "/type") << "1\n";
  std::ofstream(root + "/class/net/lo/operstate") << "unknown\n";
  std::vector<NetProbe> nets = probeSysfsNets(root);
  ASSERT_EQ(nets.size(), 1u);
  EXPECT_EQ(nets[0].name, "ens1");
  EXPECT_EQ(nets[0].speedMbps, 25000);
  EXPECT_TRUE(nets[0].busId.empty());  // no device link: a virtual interface
  EXPECT_EQ(system(("rm -rf " + root).c_str()), 0);
}

// ---- every fixture loads, and dump -> load is lossless --------------------------------

void expectLossless(const System& a, const std::string& name) {
  std::string text = dumpTopology(a);
  auto r = loadTopologyString(text, name + " (dumped)");
  ASSERT_TRUE(r.isOk()) << r.status().message();
  const System& b = r.value();
  EXPECT_EQ(b.tree(), a.tree()) << name;
  EXPECT_EQ(dumpTopology(b), text) << name;
  ASSERT_EQ(b.nodes().size(), a.nodes().size()) << name;
  for (size_t i = 0; i < a.nodes().size(); ++i) {
    EXPECT_EQ(b.node(static_cast<int>(i)).label(), a.node(static_cast<int>(i)).label()) << name;
    for (size_t j = 0; j < a.nodes().size(); ++j) {
      const Path& p = a.path(static_cast<int>(i), static_cast<int>(j));
      const Path& q = b.path(static_cast<int>(i), static_cast<int>(j));
      EXPECT_EQ(p.type, q.type) << name << " " << i << "->" << j;
      EXPECT_DOUBLE_EQ(p.bw, q.bw) << name << " " << i << "->" << j;
      EXPECT_EQ(p.nodes, q.nodes) << name << " " << i << "->" << j;
    }
  }
}

TEST(TopoFixtures, EverySharedFixtureLoadsAndDumpsLosslessly) {
  SKIP_WITHOUT_SHARED();
  std::vector<std::string> files = sharedFixtures();
  ASSERT_GE(files.size(), 13u);
  for (const std::string& f : files) {
    SCOPED_TRACE(f);
    if (f.find("graph") != std::string::npos) {
      auto g = loadNcclGraphs(f);
      ASSERT_TRUE(g.isOk()) << g.status().message();
      EXPECT_FALSE(g.value().empty());
      // As a topology it is refused with a reason.
      auto t = loadTopologyFile(f);
      ASSERT_FALSE(t.isOk());
      EXPECT_TRUE(Contains(t.status().message(), "graph file"));
      continue;
    }
    auto r = loadTopologyFile(f);
    ASSERT_TRUE(r.isOk()) << r.status().message();
    EXPECT_GE(r.value().nodesOf(NodeType::Cpu).size(), 1u);
    expectLossless(r.value(), f);
  }
}

TEST(TopoFixtures, OwnFixturesLoadAndDumpLosslessly) {
  std::vector<std::string> files = goodOwnFixtures();
  ASSERT_GE(files.size(), 2u);
  for (const std::string& f : files) {
    SCOPED_TRACE(f);
    auto r = loadTopologyFile(f);
    ASSERT_TRUE(r.isOk()) << r.status().message();
    expectLossless(r.value(), f);
  }
}

TEST(TopoFixtures, NcclGraphFile) {
  SKIP_WITHOUT_SHARED();
  auto g = loadNcclGraphs(kShared + "/azure-ncv4.nccl-graph.xml");
  ASSERT_TRUE(g.isOk()) << g.status().message();
  ASSERT_EQ(g.value().size(), 3u);
  EXPECT_EQ(g.value()[0].pattern, 4);
  EXPECT_DOUBLE_EQ(g.value()[0].speedIntra, 12.0);
  ASSERT_EQ(g.value()[0].channels.size(), 2u);
  EXPECT_EQ(g.value()[0].channels[1], (std::vector<int>{0, 3, 2, 1}));
}

// ---- paths and bandwidths by hand -------------------------------------------------------

TEST(TopoPaths, P4dPciTree) {
  SKIP_WITHOUT_SHARED();
  System s = load(kShared + "/aws-p4d.24xlarge.nccl.xml");
  // Every PCI link in the file is "8 GT/s" x16: 16 x 60 / 80 = 12 GB/s. Both CPUs are
  // GenuineIntel family 6 model 85 (Skylake): the inter-socket link is 10 GB/s.
  int g0 = gpuAt(s, "0000:10:1c.0"), g1 = gpuAt(s, "0000:10:1d.0");
  int g2 = gpuAt(s, "0000:20:1c.0"), g4 = gpuAt(s, "0000:90:1c.0");
  int nic0 = nodeAt(s, NodeType::Nic, "0000:10:1b.0"),
      nic2 = nodeAt(s, NodeType::Nic, "0000:90:1b.0");
  int cpu0 = s.cpu(0, 0);
  // GPU0 and GPU1 sit under switch ffff:ff:01.0: GPU0 -> switch -> GPU1, one switch: PIX, 12.
  EXPECT_EQ(s.path(g0, g1).type, PathType::Pix);
  EXPECT_DOUBLE_EQ(s.path(g0, g1).bw, 12.0);
  EXPECT_EQ(s.path(g0, g1).nodes.size(), 3u);
  // GPU0 -> switch 1 -> CPU0 -> switch 2 -> GPU2: through the host bridge: PHB, min 12.
  EXPECT_EQ(s.path(g0, g2).type, PathType::Phb);
  EXPECT_DOUBLE_EQ(s.path(g0, g2).bw, 12.0);
  // GPU0 -> ... -> CPU0 -> CPU1 -> ... -> GPU4: across sockets: SYS, min(12, 10) = 10.
  EXPECT_EQ(s.path(g0, g4).type, PathType::Sys);
  EXPECT_DOUBLE_EQ(s.path(g0, g4).bw, 10.0);
  // GPU0 and NIC0 share switch 0: PIX, 12; GPU0 to NIC2 on the other socket: SYS, 10.
  EXPECT_EQ(s.path(g0, nic0).type, PathType::Pix);
  EXPECT_DOUBLE_EQ(s.path(g0, nic0).bw, 12.0);
  EXPECT_EQ(s.path(g0, nic2).type, PathType::Sys);
  // CPU0 to NIC0: CPU0 -> switch -> NIC: a PCI link at the CPU: PHB, 12.
  EXPECT_EQ(s.path(cpu0, nic0).type, PathType::Phb);
  EXPECT_DOUBLE_EQ(s.path(cpu0, nic0).bw, 12.0);
  EXPECT_EQ(s.path(cpu0, nic2).type, PathType::Sys);
  EXPECT_DOUBLE_EQ(s.path(cpu0, nic2).bw, 10.0);
  // The file lists GPUs as PCI devices only: dev numbers follow file order, sm unknown.
  EXPECT_EQ(s.node(g0).dev, 0);
  EXPECT_EQ(s.node(g4).dev, 4);
  EXPECT_EQ(s.node(g0).sm, 0);
}

TEST(TopoPaths, Ndv5Gen5AndAzureNcv4Nvlink) {
  SKIP_WITHOUT_SHARED();
  System s = load(kShared + "/azure-ndv5.nccl.xml");
  // "32.0 GT/s PCIe" x16: 16 x 240 / 80 = 48 GB/s; family 6 model 143 (0x8F, Sapphire
  // Rapids): 22 GB/s between the sockets.
  int g0 = gpuAt(s, "0001:00:00.0"), g4 = gpuAt(s, "0009:00:00.0");
  int nic0 = nodeAt(s, NodeType::Nic, "0101:00:00.0");
  EXPECT_EQ(s.path(g0, nic0).type, PathType::Pix);
  EXPECT_DOUBLE_EQ(s.path(g0, nic0).bw, 48.0);
  EXPECT_EQ(s.path(g0, g4).type, PathType::Sys);
  EXPECT_DOUBLE_EQ(s.path(g0, g4).bw, 22.0);

  System n = load(kShared + "/azure-ncv4.nccl.xml");
  // Each GPU's 12 NVLinks name the GPU itself as target: ignored. link_width="0" counts
  // x16 and link_speed="" Gen3: 12 GB/s. AMD (AuthenticAMD): 16 GB/s between NUMA nodes.
  int a = gpuAt(n, "0001:00:00.0"), b = gpuAt(n, "0002:00:00.0");
  EXPECT_EQ(n.path(a, b).type, PathType::Sys);
  EXPECT_DOUBLE_EQ(n.path(a, b).bw, 12.0);
  // The eth0 <nic> sits under CPU0 itself (no PCI device): speed 100000 Mb/s = 12.5 GB/s.
  std::vector<int> nets = n.nodesOf(NodeType::Net);
  ASSERT_EQ(nets.size(), 1u);
  EXPECT_EQ(n.node(nets[0]).name, "eth0");
  EXPECT_EQ(n.path(a, nets[0]).type, PathType::Phb);
  EXPECT_DOUBLE_EQ(n.path(a, nets[0]).bw, 12.0);  // min(GPU link 12, CPU-NIC 5000, port 12.5)
}

TEST(TopoPaths, Dgx2NvswitchFromHwloc) {
  SKIP_WITHOUT_SHARED();
  System s = load(kShared + "/hwloc/nvidiaDGX2.xml");
  ASSERT_EQ(s.nodesOf(NodeType::Gpu).size(), 16u);
  ASSERT_EQ(s.nodesOf(NodeType::NvSwitch).size(), 1u);  // twelve switches, one crossbar
  ASSERT_EQ(s.nodesOf(NodeType::Cpu).size(), 2u);
  // GPUModel "Tesla V100-SXM3-32GB-H": sm70, 20 GB/s per link. NVLinkBandwidth gives each GPU
  // 25000 MB/s to six NVSwitches: 25000 / 25000 = 1 link each, 6 links x 20 = 120 GB/s.
  int g0 = gpuAt(s, "0000:34:00.0"), g1 = gpuAt(s, "0000:36:00.0");
  int g8 = s.gpu(0, 8);
  EXPECT_EQ(s.node(g0).sm, 70);
  EXPECT_EQ(s.path(g0, g1).type, PathType::Nvl);
  EXPECT_DOUBLE_EQ(s.path(g0, g1).bw, 120.0);
  EXPECT_EQ(s.path(g0, g8).type, PathType::Nvl);  // across baseboards, still one NVS hop
  EXPECT_DOUBLE_EQ(s.path(g0, g8).bw, 120.0);
  // Both GPUs also sit under PCIe switch 0000:32:00.0 (link 15.753846 GB/s = 8 GT/s x16 ->
  // 12 GB/s); the NVSwitch path is as short (two hops) and wider, so it wins.
  EXPECT_EQ(s.path(g0, g1).nodes.size(), 3u);
  EXPECT_EQ(s.node(s.path(g0, g1).nodes[1]).type, NodeType::NvSwitch);
  // CPU0 to GPU0: CPU0 -> 2c:00.0 -> 32:00.0 -> GPU: PHB at 12.
  EXPECT_EQ(s.path(s.cpu(0, 0), g0).type, PathType::Phb);
  EXPECT_DOUBLE_EQ(s.path(s.cpu(0, 0), g0).bw, 12.0);
}

TEST(TopoPaths, Power8NvlinkToCpu) {
  SKIP_WITHOUT_SHARED();
  System s = load(kShared + "/hwloc/power8gpudistances.xml");
  // P100 (sm60, 18 GB/s a link); NVLinkBandwidth 40000 MB/s at 20000 a first-generation
  // link = 2 links: 36 GB/s GPU-GPU and GPU-CPU. ppc64le: 32 GB/s between the sockets.
  int g0 = s.gpu(0, 0), g1 = s.gpu(0, 1), g2 = s.gpu(0, 2);
  EXPECT_EQ(s.path(g0, g1).type, PathType::Nvl);
  EXPECT_DOUBLE_EQ(s.path(g0, g1).bw, 36.0);
  // GPU0 -NVL-> CPU0 -SYS-> CPU1 -NVL-> GPU2: SYS, min(36, 32, 36) = 32.
  EXPECT_EQ(s.path(g0, g2).type, PathType::Sys);
  EXPECT_DOUBLE_EQ(s.path(g0, g2).bw, 32.0);
}

TEST(TopoPaths, NvbThroughOneGpu) {
  // GPU0 -NVL- GPU1 -NVL- GPU2 (no direct link 0-2): NVB through GPU1 at min(40, 40).
  const char* xml = R"(<system version="1">
  <cpu numaid="0" affinity="0000000f" arch="x86_64" vendor="GenuineIntel" familyid="6" modelid="85">
    <pci busid="0000:01:00.0" class="0x030200" link_speed="8 GT/s" link_width="16">
      <gpu dev="0" sm="70" rank="0" gdr="0"><nvlink target="0000:02:00.0" count="2" tclass="0x030200"/></gpu>
    </pci>
    <pci busid="0000:02:00.0" class="0x030200" link_speed="8 GT/s" link_width="16">
      <gpu dev="1" sm="70" rank="1" gdr="0">
        <nvlink target="0000:01:00.0" count="2" tclass="0x030200"/>
        <nvlink target="0000:03:00.0" count="2" tclass="0x030200"/>
      </gpu>
    </pci>
    <pci busid="0000:03:00.0" class="0x030200" link_speed="8 GT/s" link_width="16">
      <gpu dev="2" sm="70" rank="2" gdr="0"><nvlink target="0000:02:00.0" count="2" tclass="0x030200"/></gpu>
    </pci>
  </cpu>
</system>)";
  auto r = loadTopologyString(xml, "nvb");
  ASSERT_TRUE(r.isOk()) << r.status().message();
  const System& s = r.value();
  EXPECT_EQ(s.path(s.gpu(0, 0), s.gpu(0, 1)).type, PathType::Nvl);
  EXPECT_DOUBLE_EQ(s.path(s.gpu(0, 0), s.gpu(0, 1)).bw, 40.0);  // 2 x 20 (sm70)
  EXPECT_EQ(s.path(s.gpu(0, 0), s.gpu(0, 2)).type, PathType::Nvb);
  EXPECT_DOUBLE_EQ(s.path(s.gpu(0, 0), s.gpu(0, 2)).bw, 40.0);
}

TEST(TopoPaths, NvLinkCountOutOfRangeIsRefused) {
  // A count no device has (a corrupted file) is refused, naming the attribute: it sizes the
  // link's bandwidth and the ring search's repetitions.
  for (const char* count : {"0", "-1", "65", "999999999999"}) {
    std::string xml = R"(<system version="1">
  <cpu numaid="0" affinity="0000000f" arch="x86_64" vendor="GenuineIntel" familyid="6" modelid="85">
    <pci busid="0000:01:00.0" class="0x030200" link_speed="8 GT/s" link_width="16">
      <gpu dev="0" sm="70" rank="0" gdr="0"><nvlink target="0000:02:00.0" count="N" tclass="0x030200"/></gpu>
    </pci>
    <pci busid="0000:02:00.0" class="0x030200" link_speed="8 GT/s" link_width="16">
      <gpu dev="1" sm="70" rank="1" gdr="0"><nvlink target="0000:01:00.0" count="2" tclass="0x030200"/></gpu>
    </pci>
  </cpu>
</system>)";
    xml.replace(xml.find("count=\"N\""), 9, std::string("count=\"") + count + "\"");
    auto r = loadTopologyString(xml, "nvcount");
    ASSERT_FALSE(r.isOk()) << count;
    EXPECT_NE(r.status().message().find("count=\"" + std::string(count) + "\""), std::string::npos)
        << r.status().message();
  }
}

// ---- fusing NVML's and sysfs's view into a file, as detection does ------------------------

// What NVML and sysfs report on a p4d.24xlarge: eight A100 (sm80), each with 12 NVLinks,
// two to each of six NVSwitches; four EFA ports of 100 Gb/s, one per PCIe switch.
XmlNode p4dFused() {
  auto t = loadTopologyTree(kShared + "/aws-p4d.24xlarge.nccl.xml");
  EXPECT_TRUE(t.isOk()) << t.status().message();
  XmlNode tree = t.take();
  const char* gpus[] = {"0000:10:1c.0", "0000:10:1d.0", "0000:20:1c.0", "0000:20:1d.0",
                        "0000:90:1c.0", "0000:90:1d.0", "0000:a0:1c.0", "0000:a0:1d.0"};
  std::vector<GpuProbe> probes;
  for (int i = 0; i < 8; ++i) {
    GpuProbe g;
    g.busId = gpus[i];
    g.dev = i;
    g.rank = i;
    g.sm = 80;
    g.gdr = true;
    for (int sw = 0; sw < 6; ++sw)
      g.nvlinks.push_back(NvLinkProbe{"0000:c" + std::to_string(sw) + ":00.0", 2, "0x068000"});
    probes.push_back(g);
  }
  EXPECT_TRUE(fuseGpus(tree, probes).isOk());
  std::vector<NetProbe> nets;
  const char* nics[] = {"0000:10:1b.0", "0000:20:1b.0", "0000:90:1b.0", "0000:a0:1b.0"};
  const char* names[] = {"rdmap16s27", "rdmap32s27", "rdmap144s27", "rdmap160s27"};
  for (int i = 0; i < 4; ++i) {
    NetProbe p;
    p.busId = nics[i];
    p.name = names[i];
    p.speedMbps = 100000;
    p.port = 1;
    p.gdr = true;
    p.maxConn = 131072;
    nets.push_back(p);
  }
  EXPECT_TRUE(fuseNets(tree, nets).isOk());
  return tree;
}

TEST(TopoFuse, P4dWithNvmlAndEfa) {
  SKIP_WITHOUT_SHARED();
  XmlNode tree = p4dFused();
  // The checked-in fixture is this fused tree (regenerate with LOOM_TOPO_REGEN=1).
  std::string fixture = kData + "/aws-p4d-fused.nccl.xml";
  if (std::getenv("LOOM_TOPO_REGEN")) {
    std::ofstream(fixture)
        << "<!-- aws-p4d.24xlarge.nccl.xml with what NVML and sysfs report fused in "
           "(8x A100 sm80, 12 NVLinks to NVSwitches, 4x EFA 100 Gb/s); written by "
           "topology_test with LOOM_TOPO_REGEN=1 -->\n"
        << writeXml(tree);
  }
  auto fromFile = loadTopologyTree(fixture);
  ASSERT_TRUE(fromFile.isOk()) << fromFile.status().message();
  EXPECT_EQ(fromFile.value(), tree);

  auto r = System::build(tree, "p4d fused");
  ASSERT_TRUE(r.isOk()) << r.status().message();
  const System& s = r.value();
  int g0 = s.gpu(0, 0), g1 = s.gpu(0, 1), g7 = s.gpu(0, 7);
  // 12 links x 20 GB/s (sm80) = 240 GB/s to the NVSwitch; GPU0 -> NVS -> GPU1: NVL 240.
  EXPECT_EQ(s.path(g0, g1).type, PathType::Nvl);
  EXPECT_DOUBLE_EQ(s.path(g0, g1).bw, 240.0);
  EXPECT_EQ(s.path(g0, g7).type, PathType::Nvl);
  // GPU0 -> switch -> NIC0 -> NET0: PIX, min(12 PCI, 12.5 port) = 12.
  std::vector<int> nets = s.nodesOf(NodeType::Net);
  ASSERT_EQ(nets.size(), 4u);
  EXPECT_EQ(s.path(g0, nets[0]).type, PathType::Pix);
  EXPECT_DOUBLE_EQ(s.path(g0, nets[0]).bw, 12.0);
  EXPECT_EQ(s.nearestNet(g0), nets[0]);
  EXPECT_EQ(s.nearestNet(g7), nets[3]);
}

// ---- merging hosts ------------------------------------------------------------------------

TEST(TopoMerge, HostsByHashWithCompactBlobs) {
  SKIP_WITHOUT_SHARED();
  System a = load(kData + "/aws-p4d-fused.nccl.xml");
  System b = load(kShared + "/azure-ndv4.nccl.xml");
  std::string blobA = serializeHost(a), blobB = serializeHost(b);
  // Every rank sends its host's blob; ranks of one host send the same one.
  auto m = mergeHosts({{0xa1, "nodeA", blobA}, {0xb2, "nodeB", blobB}, {0xa1, "nodeA", blobA}});
  ASSERT_TRUE(m.isOk()) << m.status().message();
  const System& s = m.value();
  ASSERT_EQ(s.hosts().size(), 2u);
  EXPECT_EQ(s.hosts()[0].hash, 0xa1u);
  EXPECT_EQ(s.hosts()[1].name, "nodeB");
  EXPECT_EQ(s.nodesOf(NodeType::Gpu, 0).size(), 8u);
  EXPECT_EQ(s.nodesOf(NodeType::Gpu, 1).size(), 8u);
  // Paths stay within a host; between hosts the route goes through the ports.
  int ga = s.gpu(0, 0), gb = s.gpu(1, 0);
  EXPECT_EQ(s.path(ga, gb).type, PathType::Net);
  System::NetRoute none = s.netRoute(ga, gb);
  EXPECT_LT(none.netIn, 0);  // ndv4's NICs list no ports
  auto twins = mergeHosts({{1, "a", blobA}, {2, "b", blobA}});
  ASSERT_TRUE(twins.isOk()) << twins.status().message();
  const System& t = twins.value();
  // GPU7 of host a to GPU0 of host b: out through NET3 (PIX to GPU7), in through NET0 (PIX to
  // GPU0): min(12, 12) = 12 GB/s.
  System::NetRoute route = t.netRoute(t.gpu(0, 7), t.gpu(1, 0));
  ASSERT_GE(route.netOut, 0);
  EXPECT_EQ(t.node(route.netOut).dev, 3);
  EXPECT_EQ(t.node(route.netIn).dev, 0);
  EXPECT_DOUBLE_EQ(route.bw, 12.0);
  // The merged system dumps with host_hash on every <cpu> and reloads to the same graph.
  expectLossless(s, "merged");
  EXPECT_TRUE(Contains(dumpTopology(s), "host_hash=\"0xa1\""));
  // A blob is the host's own tree, without host attributes.
  auto back = loadTopologyString(blobA, "blob");
  ASSERT_TRUE(back.isOk());
  EXPECT_EQ(back.value().tree(), a.tree());
}

TEST(TopoMerge, BadBlobNamesTheHost) {
  auto m = mergeHosts({{1, "good", "<system version=\"1\"><cpu numaid=\"0\"/></system>"},
                       {2, "broken", "<system><cpu numaid=\"0\">"}});
  ASSERT_FALSE(m.isOk());
  EXPECT_TRUE(Contains(m.status().message(), "host broken"));
}

// ---- ring search ------------------------------------------------------------------------

void expectRingCoversAll(const Channel& ch, size_t n) {
  std::vector<int> sorted = ch.ring;
  std::sort(sorted.begin(), sorted.end());
  ASSERT_EQ(sorted.size(), n);
  for (size_t i = 0; i < n; ++i) EXPECT_EQ(sorted[i], static_cast<int>(i));
  EXPECT_EQ(ch.hops.size(), n);
}

// Ranks placed host-major, one per GPU (or NUMA domain), and the rings for them.
Result<RingPlan> planFor(const System& s, int ranksPerHost) {
  LOOM_ASSIGN(std::vector<RankPlace> ranks, placeRanks(s, ranksPerHost));
  return searchRings(s, ranks);
}

// `hosts` copies of the machine a fixture describes.
Result<System> loadHosts(const std::string& path, int hosts) {
  return replicateHost(load(path), hosts);
}

TEST(TopoRings, Dgx2SingleHostIsAllNvlink) {
  SKIP_WITHOUT_SHARED();
  System s = load(kShared + "/hwloc/nvidiaDGX2.xml");
  auto plan = planFor(s, 16);
  ASSERT_TRUE(plan.isOk()) << plan.status().message();
  ASSERT_GE(plan.value().channels.size(), 1u);
  // Every GPU sends and receives 120 GB/s through the NVSwitch: one ring takes it all.
  EXPECT_DOUBLE_EQ(plan.value().totalBw(), 120.0);
  for (const Channel& ch : plan.value().channels) {
    expectRingCoversAll(ch, 16);
    for (const Hop& h : ch.hops) EXPECT_EQ(h.type, PathType::Nvl);
  }
}

TEST(TopoRings, Dgx2TwoHostsWithoutNicsStayNvlinkInside) {
  SKIP_WITHOUT_SHARED();
  auto s = loadHosts(kShared + "/hwloc/nvidiaDGX2.xml", 2);
  ASSERT_TRUE(s.isOk()) << s.status().message();
  auto plan = planFor(s.value(), 16);
  ASSERT_TRUE(plan.isOk()) << plan.status().message();
  for (const Channel& ch : plan.value().channels) {
    expectRingCoversAll(ch, 32);
    int net = 0;
    for (const Hop& h : ch.hops) {
      if (h.type == PathType::Net)
        ++net;
      else
        EXPECT_EQ(h.type, PathType::Nvl);
    }
    EXPECT_EQ(net, 2);  // each host entered once and left once
  }
}

TEST(TopoRings, P4dFourHostsNvlinkInsideNicAlignedBetween) {
  SKIP_WITHOUT_SHARED();
  System one = load(kData + "/aws-p4d-fused.nccl.xml");
  auto s = replicateHost(one, 4);
  ASSERT_TRUE(s.isOk()) << s.status().message();
  const System& sys = s.value();
  auto ranks = placeRanks(sys, 8);
  ASSERT_TRUE(ranks.isOk());
  auto plan = searchRings(sys, ranks.value());
  ASSERT_TRUE(plan.isOk()) << plan.status().message();
  const RingPlan& p = plan.value();
  // The slowest hop is GPU -> PCIe switch -> NIC (12 GB/s, below the 12.5 GB/s port); each
  // of the four NICs carries one ring: 4 channels x 12 GB/s.
  EXPECT_DOUBLE_EQ(p.bwPerChannel, 12.0);
  EXPECT_EQ(p.channels.size(), 4u);
  std::set<int> netDevs;
  for (const Channel& ch : p.channels) {
    expectRingCoversAll(ch, 32);
    ASSERT_EQ(ch.routes.size(), 4u);
    for (const HostRoute& r : ch.routes) {
      ASSERT_GE(r.net, 0);
      netDevs.insert(sys.node(r.net).dev);
      // Entered and left at GPUs under the port's own PCIe switch.
      int entry = sys.gpu(r.host, ranks.value()[static_cast<size_t>(r.entryRank)].index);
      int exit = sys.gpu(r.host, ranks.value()[static_cast<size_t>(r.exitRank)].index);
      EXPECT_EQ(sys.path(r.net, entry).type, PathType::Pix);
      EXPECT_EQ(sys.path(exit, r.net).type, PathType::Pix);
      EXPECT_NE(entry, exit);
    }
    int net = 0;
    for (const Hop& h : ch.hops) {
      if (h.type == PathType::Net) {
        ++net;
        EXPECT_DOUBLE_EQ(h.bw, 12.0);
      } else {
        EXPECT_EQ(h.type, PathType::Nvl);
      }
    }
    EXPECT_EQ(net, 4);
    ASSERT_EQ(ch.tree.size(), 4u);
    for (const TreeHint& t : ch.tree) EXPECT_GE(t.net, 0);
  }
  EXPECT_EQ(netDevs.size(), 4u);  // every NIC used
}

// The tuner's choices on the fixtures, from the links the graph gives it.
algo::Algo cheapest(const algo::GraphLinks& g, size_t bytes, double* us = nullptr) {
  const int n = static_cast<int>(g.links.hostOf.size());
  std::vector<algo::Algo> cands = {algo::Algo::Ring, algo::Algo::Tree, algo::Algo::Rhd};
  if (g.links.hosts() > 1) cands.push_back(algo::Algo::Hier);
  algo::Algo best = cands[0];
  double bestUs = 0;
  for (algo::Algo a : cands) {
    const double t = algo::estimateUs(a, algo::Coll::AllReduce, n, bytes / 4, 4, g.model, g.links);
    if (a == cands[0] || t < bestUs) best = a, bestUs = t;
  }
  if (us != nullptr) *us = bestUs;
  return best;
}

TEST(TopoTuner, Dgx2RingsOverNvlink) {
  SKIP_WITHOUT_SHARED();
  System s = load(kShared + "/hwloc/nvidiaDGX2.xml");
  auto ranks = placeRanks(s, 16);
  ASSERT_TRUE(ranks.isOk());
  auto g = algo::linksFromGraph(s, ranks.value(), algo::defaultCostModel());
  ASSERT_TRUE(g.isOk()) << g.status().message();
  // Inside the host every hop is NVLink through the NVSwitch: 6 links x 20 GB/s (sm70).
  EXPECT_EQ(g.value().links.intra, algo::Link::NvLink);
  EXPECT_DOUBLE_EQ(g.value().intraGBps, 120.0);
  EXPECT_EQ(g.value().links.hosts(), 1);
  EXPECT_EQ(g.value().links.ringOrder.size(), 16u);
  // 256 MiB: a bandwidth-optimal schedule, never the tree (which sends the whole buffer
  // up and down). Each rank sends 2 x 15/16 of the buffer at 120 GB/s (2 * 15/16 *
  // 268435456 B / 120e3 B/us = 4194 us) and reduces 15/16 of it at the model's 20 GB/s
  // (12583 us; the graph says nothing of reduction rates); pipeline fill adds under 30%.
  double us = 0;
  const algo::Algo big = cheapest(g.value(), size_t{256} << 20, &us);
  EXPECT_TRUE(big == algo::Algo::Ring || big == algo::Algo::Rhd) << algo::algoName(big);
  const double byHand = 2 * 15.0 / 16 * 268435456 / 120e3 + 15.0 / 16 * 268435456 / 20e3;
  EXPECT_GT(us, byHand);
  EXPECT_LT(us, 1.3 * byHand);
  // 8 B: a logarithmic schedule, not the 30-step ring.
  EXPECT_NE(cheapest(g.value(), 8), algo::Algo::Ring);
}

TEST(TopoTuner, P4dFourHostsNicAlignedRingAndHierForLargeMessages) {
  SKIP_WITHOUT_SHARED();
  auto s = loadHosts(kData + "/aws-p4d-fused.nccl.xml", 4);
  ASSERT_TRUE(s.isOk()) << s.status().message();
  auto ranks = placeRanks(s.value(), 8);
  ASSERT_TRUE(ranks.isOk());
  auto g = algo::linksFromGraph(s.value(), ranks.value(), algo::defaultCostModel());
  ASSERT_TRUE(g.isOk()) << g.status().message();
  const algo::GraphLinks& gl = g.value();
  // NVLink inside each host (12 links x 20 GB/s = 240 GB/s, sm80), the network between
  // them: 4 rings, one per EFA port, 12 GB/s each (the GPU -> switch -> NIC PCIe hop).
  EXPECT_EQ(gl.links.intra, algo::Link::NvLink);
  EXPECT_DOUBLE_EQ(gl.intraGBps, 240.0);
  EXPECT_EQ(gl.links.inter, algo::Link::Net);
  EXPECT_EQ(gl.channels, 4);
  EXPECT_DOUBLE_EQ(gl.interGBps, 48.0);
  // The ring keeps each host's 8 ranks together: 4 crossings between hosts.
  const std::vector<int>& order = gl.links.ringOrder;
  ASSERT_EQ(order.size(), 32u);
  int crossings = 0;
  for (size_t p = 0; p < order.size(); ++p)
    crossings += gl.links.hostOf[static_cast<size_t>(order[p])] !=
                 gl.links.hostOf[static_cast<size_t>(order[(p + 1) % order.size()])];
  EXPECT_EQ(crossings, 4);
  // Large messages: across hosts each host sends 2 x 3/4 of its share through 48 GB/s
  // with hier, 2 x 31/32 of the buffer with the flat ring; hier or the ring, never the
  // tree. Small ones: not the 62-step flat ring.
  const algo::Algo big = cheapest(gl, size_t{256} << 20);
  EXPECT_TRUE(big == algo::Algo::Hier || big == algo::Algo::Ring) << algo::algoName(big);
  EXPECT_NE(cheapest(gl, 8), algo::Algo::Ring);
}

TEST(TopoRings, P4dSingleHostNvlinkRing) {
  SKIP_WITHOUT_SHARED();
  System s = load(kData + "/aws-p4d-fused.nccl.xml");
  auto plan = planFor(s, 8);
  ASSERT_TRUE(plan.isOk()) << plan.status().message();
  EXPECT_DOUBLE_EQ(plan.value().totalBw(), 240.0);
  for (const Hop& h : plan.value().channels[0].hops) EXPECT_EQ(h.type, PathType::Nvl);
}

TEST(TopoRings, PcieOnlyRingCrossesSocketsTwice) {
  SKIP_WITHOUT_SHARED();
  System s = load(kShared + "/aws-p4d.24xlarge.nccl.xml");  // no NVLink information
  auto plan = planFor(s, 8);
  ASSERT_TRUE(plan.isOk()) << plan.status().message();
  // Any ring over both sockets crosses the 10 GB/s inter-socket link: the best ring's slowest
  // hop is SYS at 10, and the other hops stay PIX or PHB.
  EXPECT_DOUBLE_EQ(plan.value().bwPerChannel, 10.0);
  int sys = 0;
  for (const Hop& h : plan.value().channels[0].hops) {
    if (h.type == PathType::Sys)
      ++sys;
    else
      EXPECT_LE(h.type, PathType::Phb);
  }
  EXPECT_EQ(sys, 2);
}

TEST(TopoRings, CpuRanksBySocket) {
  SKIP_WITHOUT_SHARED();
  System s = load(kShared + "/aws-g5.48xlarge.nccl.xml");  // 2 CPUs, no GPU attributes
  // Ranks 0..3: sockets 0, 1, 0, 1. Ranks of one socket end up next to each other.
  std::vector<RankPlace> ranks = {
      {0, NodeType::Cpu, 0}, {0, NodeType::Cpu, 1}, {0, NodeType::Cpu, 0}, {0, NodeType::Cpu, 1}};
  auto plan = searchRings(s, ranks);
  ASSERT_TRUE(plan.isOk()) << plan.status().message();
  const Channel& ch = plan.value().channels[0];
  expectRingCoversAll(ch, 4);
  int loc = 0, sysHops = 0;
  for (const Hop& h : ch.hops) {
    if (h.type == PathType::Loc) ++loc;
    if (h.type == PathType::Sys) ++sysHops;
  }
  EXPECT_EQ(loc, 2);
  EXPECT_EQ(sysHops, 2);
}

TEST(TopoRings, BadPlacementIsAnError) {
  SKIP_WITHOUT_SHARED();
  System s = load(kShared + "/aws-p4d.24xlarge.nccl.xml");
  auto plan = searchRings(s, {{0, NodeType::Gpu, 0}, {0, NodeType::Gpu, 9}});
  ASSERT_FALSE(plan.isOk());
  EXPECT_TRUE(Contains(plan.status().message(), "GPU9"));
  auto other = searchRings(s, {{3, NodeType::Gpu, 0}});
  ASSERT_FALSE(other.isOk());
  EXPECT_TRUE(Contains(other.status().message(), "host 3"));
}

// ---- hwloc tolerance and errors -----------------------------------------------------------

TEST(TopoHwloc, Version1File) {
  System s = load(kData + "/hwloc-v1-2socket.xml");
  ASSERT_EQ(s.nodesOf(NodeType::Cpu).size(), 2u);
  ASSERT_EQ(s.nodesOf(NodeType::Gpu).size(), 2u);
  std::vector<int> nets = s.nodesOf(NodeType::Net);
  ASSERT_EQ(nets.size(), 1u);
  EXPECT_EQ(s.node(nets[0]).name, "mlx5_0");  // the OpenFabrics device, not ib0
  int cpu0 = s.cpu(0, 0);
  EXPECT_EQ(s.node(cpu0).cores, 2);
  EXPECT_EQ(s.node(cpu0).pus, 4);
  // "Tesla P100-PCIE-16GB": sm60. GPU0 and the NIC share switch 0000:01:00.0 (the upstream
  // port; root port 00:01.0 and downstream ports 02:xx are dropped): PIX; 15.753846 GB/s is
  // 8 GT/s x16 = 12 GB/s. Family 6 model 79 (Broadwell): 6 GB/s between sockets.
  int g0 = s.gpu(0, 0), g1 = s.gpu(0, 1);
  EXPECT_EQ(s.node(g0).sm, 60);
  EXPECT_EQ(s.path(g0, nets[0]).type, PathType::Pix);
  EXPECT_EQ(s.path(g0, g1).type, PathType::Sys);
  EXPECT_DOUBLE_EQ(s.path(g0, g1).bw, 6.0);
}

TEST(TopoErrors, MalformedFilesNameFileLineAndElement) {
  struct Case {
    const char* file;
    std::vector<const char*> parts;
  };
  const Case cases[] = {
      {"malformed-unclosed.nccl.xml", {"malformed-unclosed.nccl.xml:", "malformed XML", "system"}},
      {"missing-busid.nccl.xml", {"missing-busid.nccl.xml:3", "<pci", "busid"}},
      {"bad-numaid.nccl.xml", {"bad-numaid.nccl.xml:2", "<cpu", "numaid=\"zero\""}},
      {"bad-nvlink-matrix.hwloc.xml",
       {"bad-nvlink-matrix.hwloc.xml:6", "distances2hetero", "4 values"}},
  };
  for (const Case& c : cases) {
    auto r = loadTopologyFile(kData + "/" + c.file);
    ASSERT_FALSE(r.isOk()) << c.file;
    EXPECT_EQ(r.status().code(), loomInvalidArgument);
    for (const char* part : c.parts) EXPECT_TRUE(Contains(r.status().message(), part));
  }
  auto missing = loadTopologyFile(kData + "/no-such-file.xml");
  ASSERT_FALSE(missing.isOk());
  EXPECT_TRUE(Contains(missing.status().message(), "no-such-file.xml"));
  auto wrongRoot = loadTopologyString("<foo/>", "text");
  ASSERT_FALSE(wrongRoot.isOk());
  EXPECT_TRUE(Contains(wrongRoot.status().message(), "<foo>"));
  auto nvl = loadTopologyString(
      "<system><cpu numaid=\"0\"><pci busid=\"0000:01:00.0\" class=\"0x030200\"><gpu dev=\"0\">"
      "<nvlink target=\"0000:02:00.0\" count=\"many\" "
      "tclass=\"0x030200\"/></gpu></pci></cpu></system>",
      "text");
  ASSERT_FALSE(nvl.isOk());
  EXPECT_TRUE(Contains(nvl.status().message(), "<nvlink"));
  EXPECT_TRUE(Contains(nvl.status().message(), "count"));
  auto bus =
      loadTopologyString("<system><cpu numaid=\"0\"><pci busid=\"zz\"/></cpu></system>", "text");
  ASSERT_FALSE(bus.isOk());
  EXPECT_TRUE(Contains(bus.status().message(), "\"zz\" is not a PCI bus id"));
}

TEST(TopoEnv, DumpFileAndTopoFileRoundTrip) {
  SKIP_WITHOUT_SHARED();
  System s = load(kShared + "/azure-ndv5.nccl.xml");
  std::string path = "/tmp/loom-topo-dump-" + std::to_string(getpid()) + ".xml";
  ASSERT_TRUE(dumpTopologyFile(s, path).isOk());
  System back = load(path);
  EXPECT_EQ(back.tree(), s.tree());
  std::remove(path.c_str());
}

// ---- The communicator's ring order (algo::commRingOrder) ----

// The path types between consecutive ranks of `order` (ring closed), from the graph's own
// paths between the ranks' GPUs.
std::vector<PathType> ringHopTypes(const System& s, const std::vector<int>& order,
                                   const std::vector<int>& hostOf, const std::vector<int>& dev) {
  std::vector<PathType> types;
  for (size_t i = 0; i < order.size(); ++i) {
    const size_t a = static_cast<size_t>(order[i]);
    const size_t b = static_cast<size_t>(order[(i + 1) % order.size()]);
    types.push_back(s.path(s.gpu(hostOf[a], dev[a]), s.gpu(hostOf[b], dev[b])).type);
  }
  return types;
}

// An order as the ring builders take it: empty is rank order.
std::vector<int> asOrder(std::vector<int> order, size_t n) {
  if (order.empty())
    for (size_t r = 0; r < n; ++r) order.push_back(static_cast<int>(r));
  return order;
}

bool isPermutation(std::vector<int> order, size_t n) {
  std::sort(order.begin(), order.end());
  for (size_t r = 0; r < order.size(); ++r)
    if (order[r] != static_cast<int>(r)) return false;
  return order.size() == n;
}

// p4d without NVLink information: 8 GPUs behind 4 PCIe switches on 2 sockets. Ranks hold the
// GPUs of the two sockets alternately, so rank order crosses between the sockets at every
// hop; the communicator's ring crosses twice, as the best ring over both sockets must.
TEST(CommRingOrder, GpuRanksFollowTheGraphNotRankOrder) {
  SKIP_WITHOUT_SHARED();
  System s = load(kShared + "/aws-p4d.24xlarge.nccl.xml");
  const std::vector<int> hostOf(8, 0), dev = {0, 4, 1, 5, 2, 6, 3, 7};
  auto count = [](const std::vector<PathType>& t, PathType x) {
    return std::count(t.begin(), t.end(), x);
  };
  std::vector<int> rankOrder = {0, 1, 2, 3, 4, 5, 6, 7};
  ASSERT_EQ(count(ringHopTypes(s, rankOrder, hostOf, dev), PathType::Sys), 8);

  algo::RingOrderChoice c = algo::commRingOrder(&s, hostOf, dev);
  EXPECT_TRUE(c.fromGraph) << c.how;
  const std::vector<int> order = asOrder(c.order, 8);
  ASSERT_TRUE(isPermutation(order, 8));
  const std::vector<PathType> hops = ringHopTypes(s, order, hostOf, dev);
  EXPECT_EQ(count(hops, PathType::Sys), 2);
  for (PathType t : hops) EXPECT_TRUE(t == PathType::Sys || t <= PathType::Phb);
  EXPECT_NE(c.how.find("ring search"), std::string::npos) << c.how;
}

// Two DGX-2s: inside each host every hop is NVLink, and the ring leaves each host once.
TEST(CommRingOrder, TwoDgx2HostsStayOnNvlinkInside) {
  SKIP_WITHOUT_SHARED();
  auto s = loadHosts(kShared + "/hwloc/nvidiaDGX2.xml", 2);
  ASSERT_TRUE(s.isOk()) << s.status().message();
  // 32 ranks dealt round-robin onto the hosts, each host's ranks on its GPUs in reverse.
  std::vector<int> hostOf, dev;
  for (int r = 0; r < 32; ++r) {
    hostOf.push_back(r % 2);
    dev.push_back(15 - r / 2);
  }
  algo::RingOrderChoice c = algo::commRingOrder(&s.value(), hostOf, dev);
  EXPECT_TRUE(c.fromGraph) << c.how;
  const std::vector<int> order = asOrder(c.order, 32);
  ASSERT_TRUE(isPermutation(order, 32));
  int crossings = 0;
  for (size_t i = 0; i < order.size(); ++i) {
    const size_t a = static_cast<size_t>(order[i]);
    const size_t b = static_cast<size_t>(order[(i + 1) % order.size()]);
    if (hostOf[a] != hostOf[b]) {
      ++crossings;
      continue;
    }
    const PathType t =
        s.value().path(s.value().gpu(hostOf[a], dev[a]), s.value().gpu(hostOf[b], dev[b])).type;
    EXPECT_EQ(t, PathType::Nvl) << "ranks " << a << " -> " << b;
  }
  EXPECT_EQ(crossings, 2);
}

// Where the graph cannot place every rank, the order is host-major (hosts in order of their
// lowest rank, ranks in order inside a host), and `how` says why.
TEST(CommRingOrder, FallsBackToHostMajorAndSaysWhy) {
  SKIP_WITHOUT_SHARED();
  System s = load(kShared + "/aws-p4d.24xlarge.nccl.xml");
  const std::vector<int> hostOf = {0, 0, 0, 0};
  const std::vector<int> hostMajor = {0, 1, 2, 3};
  struct Case {
    const System* system;
    std::vector<int> dev;
    const char* why;
  } cases[] = {
      {nullptr, {0, 1, 2, 3}, "no system graph"},
      {&s, {0, 1, -1, 3}, "rank 2 has no GPU"},
      {&s, {0, 1, 2, 9}, "has no GPU 9, rank 3's device"},
  };
  for (const Case& k : cases) {
    algo::RingOrderChoice c = algo::commRingOrder(k.system, hostOf, k.dev);
    EXPECT_FALSE(c.fromGraph);
    EXPECT_EQ(asOrder(c.order, 4), hostMajor);
    EXPECT_NE(c.how.find(k.why), std::string::npos) << c.how;
  }
  // Ranks dealt onto two hosts: each host's ranks together.
  algo::RingOrderChoice c = algo::commRingOrder(nullptr, {0, 1, 0, 1}, {-1, -1, -1, -1});
  EXPECT_EQ(c.order, (std::vector<int>{0, 2, 1, 3}));
}

}  // namespace
}  // namespace loom::topo
