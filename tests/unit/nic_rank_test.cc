// The NIC nearest a rank's GPU or CPU (topology/nic_rank.h), on real machines'
// topology files and on small trees written here. Expected orders are read off
// the XML by hand: which PCIe switch and which CPU each GPU and NIC hangs from.
#include "topology/nic_rank.h"

#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include "topology/topology.h"

namespace loom::topo {
namespace {

const std::string kShared = LOOM_SHARED_TOPOLOGIES;

#define SKIP_WITHOUT(file)                                     \
  if (!std::ifstream(kShared + "/" + (file)).good())           \
  GTEST_SKIP() << "the shared fixtures are not at " << kShared \
               << " (CI has them at ${CMAKE_SOURCE_DIR}/../shared/topologies)"

System load(const std::string& file) {
  auto r = loadTopologyFile(kShared + "/" + file);
  EXPECT_TRUE(r.isOk()) << r.status().message();
  return r.take();
}

std::vector<NicPort> ports(const std::vector<std::string>& busIds) {
  std::vector<NicPort> out;
  for (size_t i = 0; i < busIds.size(); ++i) out.push_back({"dev" + std::to_string(i), busIds[i]});
  return out;
}

// The bus ids in ranked order.
std::vector<std::string> order(const std::vector<NicRank>& ranked, const std::vector<NicPort>& p) {
  std::vector<std::string> out;
  for (const NicRank& r : ranked) out.push_back(p[r.port].busId);
  return out;
}

// AWS p4d.24xlarge: four PCIe switches, two per CPU; each holds two GPUs and one EFA NIC.
//   CPU0: switch 01 {GPU 10:1c, 10:1d, NIC 10:1b}, switch 02 {GPU 20:1c, 20:1d, NIC 20:1b}
//   CPU1: switch 03 {GPU 90:1c, 90:1d, NIC 90:1b}, switch 04 {GPU a0:1c, a0:1d, NIC a0:1b}
TEST(NicRank, P4dEachGpuTakesTheNicUnderItsSwitch) {
  SKIP_WITHOUT("aws-p4d.24xlarge.nccl.xml");
  System s = load("aws-p4d.24xlarge.nccl.xml");
  // Ports listed in an order unrelated to any GPU.
  auto p = ports({"0000:a0:1b.0", "0000:90:1b.0", "0000:20:1b.0", "0000:10:1b.0"});
  struct Case {
    std::string gpu, pix, phb;
    std::vector<std::string> sys;  // the other CPU's NICs, in the order given
  };
  const std::vector<Case> cases = {
      {"0000:10:1c.0", "0000:10:1b.0", "0000:20:1b.0", {"0000:a0:1b.0", "0000:90:1b.0"}},
      {"0000:10:1d.0", "0000:10:1b.0", "0000:20:1b.0", {"0000:a0:1b.0", "0000:90:1b.0"}},
      {"0000:20:1c.0", "0000:20:1b.0", "0000:10:1b.0", {"0000:a0:1b.0", "0000:90:1b.0"}},
      {"0000:90:1d.0", "0000:90:1b.0", "0000:a0:1b.0", {"0000:20:1b.0", "0000:10:1b.0"}},
      {"0000:a0:1c.0", "0000:a0:1b.0", "0000:90:1b.0", {"0000:20:1b.0", "0000:10:1b.0"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.gpu);
    const int gpu = nicRankSource(s, 0, c.gpu, 1);  // the GPU wins over the NUMA node
    ASSERT_GE(gpu, 0);
    EXPECT_EQ(s.node(gpu).type, NodeType::Gpu);
    auto ranked = rankNics(s, gpu, p);
    ASSERT_EQ(ranked.size(), 4u);
    EXPECT_EQ(order(ranked, p), (std::vector<std::string>{c.pix, c.phb, c.sys[0], c.sys[1]}));
    EXPECT_EQ(ranked[0].type, PathType::Pix);
    EXPECT_EQ(ranked[1].type, PathType::Phb);
    EXPECT_EQ(ranked[2].type, PathType::Sys);
    EXPECT_EQ(ranked[3].type, PathType::Sys);
    EXPECT_EQ(nearestTier(ranked), 1u);
    // Gen3 x16 links everywhere: 16 lanes x 60 (8 GT/s) / 80 = 12 GB/s.
    EXPECT_DOUBLE_EQ(ranked[0].bw, kPciGen3x16Bw);
  }
}

TEST(NicRank, P4dWithoutGpuTheCpusNicsComeFirst) {
  SKIP_WITHOUT("aws-p4d.24xlarge.nccl.xml");
  System s = load("aws-p4d.24xlarge.nccl.xml");
  auto p = ports({"0000:10:1b.0", "0000:20:1b.0", "0000:90:1b.0", "0000:a0:1b.0"});
  // No GPU (or one the graph lacks): NUMA node 1's CPU is the source.
  const int cpu = nicRankSource(s, 0, "", 1);
  ASSERT_GE(cpu, 0);
  EXPECT_EQ(s.node(cpu).type, NodeType::Cpu);
  EXPECT_EQ(nicRankSource(s, 0, "0000:99:00.0", 1), cpu);
  auto ranked = rankNics(s, cpu, p);
  EXPECT_EQ(order(ranked, p), (std::vector<std::string>{"0000:90:1b.0", "0000:a0:1b.0",
                                                        "0000:10:1b.0", "0000:20:1b.0"}));
  EXPECT_EQ(ranked[0].type, PathType::Phb);
  EXPECT_EQ(ranked[2].type, PathType::Sys);
  EXPECT_EQ(nearestTier(ranked), 2u);  // both of its NICs are as near: ranks spread over them
}

// Azure ND A100 v4: four NUMA nodes, one switch each with two GPUs and two InfiniBand NICs.
//   NUMA0: GPU 0003, 0004, NIC 0103, 0104   NUMA1: GPU 0001, 0002, NIC 0101, 0102
//   NUMA2: GPU 000d, 000e, NIC 0107, 0108   NUMA3: GPU 000b, 000c, NIC 0105, 0106
TEST(NicRank, NdV4GpuHasTwoNicsUnderItsSwitch) {
  SKIP_WITHOUT("azure-ndv4.nccl.xml");
  System s = load("azure-ndv4.nccl.xml");
  std::vector<std::string> all;
  for (int i = 1; i <= 8; ++i) all.push_back("010" + std::to_string(i) + ":00:00.0");
  auto p = ports(all);
  const int gpu = nicRankSource(s, 0, "000d:00:00.0", -1);
  ASSERT_GE(gpu, 0);
  auto ranked = rankNics(s, gpu, p);
  ASSERT_EQ(nearestTier(ranked), 2u);
  EXPECT_EQ(order(ranked, p)[0], "0107:00:00.0");
  EXPECT_EQ(order(ranked, p)[1], "0108:00:00.0");
  for (size_t i = 2; i < ranked.size(); ++i) EXPECT_EQ(ranked[i].type, PathType::Sys) << i;
}

// Azure ND H100 v5: one GPU and one NIC per switch, four switches per CPU.
TEST(NicRank, NdV5EveryGpuHasItsOwnNic) {
  SKIP_WITHOUT("azure-ndv5.nccl.xml");
  System s = load("azure-ndv5.nccl.xml");
  const std::vector<std::pair<std::string, std::string>> pairs = {
      {"0001:00:00.0", "0101:00:00.0"}, {"0002:00:00.0", "0102:00:00.0"},
      {"0003:00:00.0", "0103:00:00.0"}, {"0008:00:00.0", "0104:00:00.0"},
      {"0009:00:00.0", "0105:00:00.0"}, {"000a:00:00.0", "0106:00:00.0"}};
  std::vector<std::string> nics;
  for (auto it = pairs.rbegin(); it != pairs.rend(); ++it) nics.push_back(it->second);
  auto p = ports(nics);
  for (const auto& [gpu, nic] : pairs) {
    SCOPED_TRACE(gpu);
    auto ranked = rankNics(s, nicRankSource(s, 0, gpu, -1), p);
    EXPECT_EQ(order(ranked, p)[0], nic);
    EXPECT_EQ(ranked[0].type, PathType::Pix);
    EXPECT_EQ(nearestTier(ranked), 1u);
    // The three others of its CPU cross the host bridge; the other CPU's cross the SMP link.
    const bool cpu0 = gpu < "0009";
    size_t phb = 0, sys = 0;
    for (const NicRank& r : ranked) {
      const bool same = (p[r.port].busId < "0105") == cpu0;
      if (r.type == PathType::Phb) {
        ++phb;
        EXPECT_TRUE(same) << p[r.port].busId;
      } else if (r.type == PathType::Sys) {
        ++sys;
        EXPECT_FALSE(same) << p[r.port].busId;
      }
    }
    EXPECT_EQ(phb + sys, ranked.size() - 1);
  }
}

// A small host written here: names, functions of a multi-port NIC, bandwidth as the tie
// breaker, and ports the graph does not know.
//   CPU0: switch 01 {GPU 10:00.0}, NIC 20:00.0 at Gen3 x8 (mlx5_0), NIC 30:00.0 at Gen3 x16
//         with two functions, <net name="mlx5_1">
//   CPU1: NIC 40:00.0 (no net element)
const char* kSmallHost = R"(<system version="1">
  <cpu numaid="0" affinity="0000ffff" arch="x86_64" vendor="GenuineIntel" familyid="6" modelid="85">
    <pci busid="0000:01:00.0" class="0x060400" link_speed="8 GT/s" link_width="16">
      <pci busid="0000:10:00.0" class="0x030200" link_speed="8 GT/s" link_width="16"/>
    </pci>
    <pci busid="0000:20:00.0" class="0x020700" link_speed="8 GT/s" link_width="8">
      <nic><net name="mlx5_0" dev="0" speed="100000" port="1"/></nic>
    </pci>
    <pci busid="0000:30:00.0" class="0x020700" link_speed="8 GT/s" link_width="16">
      <nic><net name="mlx5_1" dev="1" speed="100000" port="1"/></nic>
    </pci>
  </cpu>
  <cpu numaid="1" affinity="ffff0000" arch="x86_64" vendor="GenuineIntel" familyid="6" modelid="85">
    <pci busid="0000:40:00.0" class="0x020700" link_speed="8 GT/s" link_width="16"/>
  </cpu>
</system>)";

TEST(NicRank, BandwidthBreaksTiesAndUnknownPortsGoLast) {
  auto r = loadTopologyString(kSmallHost, "small host");
  ASSERT_TRUE(r.isOk()) << r.status().message();
  const System& s = r.value();
  const int gpu = nicRankSource(s, 0, "0000:10:00.0", -1);
  ASSERT_GE(gpu, 0);
  std::vector<NicPort> p = {
      {"mlx5_9", "0000:77:00.0"},  // not in the graph
      {"mlx5_0", "0000:20:00.0"},  // PHB, x8: 6 GB/s
      {"mlx5_2", "0000:40:00.0"},  // SYS
      {"mlx5_1", ""},              // by name: PHB, x16: 12 GB/s
      {"mlx5_3", "0000:30:00.1"},  // second function of the x16 NIC
  };
  auto ranked = rankNics(s, gpu, p);
  std::vector<std::string> names;
  for (const NicRank& x : ranked) names.push_back(p[x.port].name);
  EXPECT_EQ(names, (std::vector<std::string>{"mlx5_1", "mlx5_3", "mlx5_0", "mlx5_2", "mlx5_9"}));
  EXPECT_EQ(ranked[0].type, PathType::Phb);
  EXPECT_DOUBLE_EQ(ranked[0].bw, kPciGen3x16Bw);
  EXPECT_DOUBLE_EQ(ranked[2].bw, kPciGen3x16Bw / 2);
  EXPECT_EQ(ranked[3].type, PathType::Sys);
  EXPECT_EQ(ranked[4].type, PathType::Dis);
  EXPECT_EQ(ranked[4].node, -1);
  EXPECT_EQ(nearestTier(ranked), 2u);

  // No source (no GPU, no NUMA node known): nothing is known, the given order stays.
  auto none = rankNics(s, nicRankSource(s, 0, "", -1), p);
  for (size_t i = 0; i < none.size(); ++i) EXPECT_EQ(none[i].port, i);
  EXPECT_EQ(nearestTier(none), 0u);
  EXPECT_EQ(nearestTier({}), 0u);
}

}  // namespace
}  // namespace loom::topo
