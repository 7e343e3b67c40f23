// Files, dumps and merging of topology trees (topology.h).
#include <cstdio>
#include <fstream>
#include <sstream>

#include "topology/topology.h"
#include "util/env.h"
#include "util/log.h"

namespace loom::topo {
namespace {

Result<XmlNode> toNcclTree(const XmlNode& root, const std::string& source) {
  if (root.name == "topology") return hwlocToNccl(root, source);
  if (root.name == "system") return root;
  if (root.name == "graphs")
    return LOOM_ERROR(loomInvalidArgument,
                      source +
                          ": is an NCCL graph file (NCCL_GRAPH_FILE), not a topology; "
                          "read it with loadNcclGraphs");
  return LOOM_ERROR(loomInvalidArgument,
                    where(source, root) + ": not a topology (expected <system> or <topology>)");
}

void stripHostAttrs(XmlNode& tree) {
  for (XmlNode& c : tree.children) {
    c.erase("host_hash");
    c.erase("hostname");
  }
}

}  // namespace

Result<XmlNode> loadTopologyTree(const std::string& path) {
  LOOM_ASSIGN(XmlNode root, parseXmlFile(path));
  return toNcclTree(root, path);
}

Result<System> loadTopologyFile(const std::string& path) {
  LOOM_ASSIGN(XmlNode tree, loadTopologyTree(path));
  return System::build(tree, path);
}

Result<System> loadTopologyString(const std::string& xml, const std::string& source) {
  LOOM_ASSIGN(XmlNode root, parseXmlString(xml, source));
  LOOM_ASSIGN(XmlNode tree, toNcclTree(root, source));
  return System::build(tree, source);
}

std::string dumpTopology(const System& system) { return writeXml(system.tree()); }

Status dumpTopologyFile(const System& system, const std::string& path) {
  std::ofstream f(path, std::ios::trunc);
  if (!f) return LOOM_ERROR(loomSystemError, path + ": cannot write the topology dump");
  f << dumpTopology(system);
  f.close();
  if (!f) return LOOM_ERROR(loomSystemError, path + ": writing the topology dump failed");
  return Status::ok();
}

Result<std::vector<NcclGraph>> loadNcclGraphs(const std::string& path) {
  LOOM_ASSIGN(XmlNode root, parseXmlFile(path));
  if (root.name != "graphs")
    return LOOM_ERROR(loomInvalidArgument,
                      where(path, root) + ": expected <graphs> (NCCL graph file)");
  std::vector<NcclGraph> out;
  for (const XmlNode& g : root.children) {
    if (g.name != "graph") continue;
    NcclGraph ng;
    ng.id = std::atoi(g.attrOr("id", "0").c_str());
    ng.pattern = std::atoi(g.attrOr("pattern", "0").c_str());
    ng.crossNic = std::atoi(g.attrOr("crossnic", "0").c_str()) != 0;
    ng.speedIntra = std::atof(g.attrOr("speedintra", "0").c_str());
    ng.speedInter = std::atof(g.attrOr("speedinter", "0").c_str());
    ng.typeIntra = g.attrOr("typeintra", "");
    ng.typeInter = g.attrOr("typeinter", "");
    for (const XmlNode& ch : g.children) {
      if (ch.name != "channel") continue;
      std::vector<int> order;
      for (const XmlNode& d : ch.children) {
        const std::string* dev = d.attr("dev");
        if (dev == nullptr)
          return LOOM_ERROR(loomInvalidArgument,
                            where(path, d) + " lacks the required attribute dev");
        int v = std::atoi(dev->c_str());
        if (d.name == "gpu")
          order.push_back(v);
        else if (d.name == "net")
          order.push_back(-1 - v);
        else
          return LOOM_ERROR(loomInvalidArgument,
                            where(path, d) + ": expected <gpu> or <net> in a channel");
      }
      ng.channels.push_back(order);
    }
    out.push_back(ng);
  }
  return out;
}

std::string serializeHost(const System& host) {
  XmlNode t = host.tree();
  stripHostAttrs(t);
  return writeXml(t);
}

Result<System> mergeHosts(const std::vector<HostBlob>& blobs) {
  XmlNode merged;
  merged.name = "system";
  merged.set("version", "1");
  std::vector<uint64_t> seen;
  for (size_t i = 0; i < blobs.size(); ++i) {
    const HostBlob& b = blobs[i];
    bool dup = false;
    for (uint64_t h : seen) dup |= h == b.hostHash;
    if (dup) continue;
    seen.push_back(b.hostHash);
    std::string source = "host " + (b.hostName.empty() ? std::to_string(i) : b.hostName);
    LOOM_ASSIGN(XmlNode root, parseXmlString(b.xml, source));
    LOOM_ASSIGN(XmlNode tree, toNcclTree(root, source));
    char hash[32];
    std::snprintf(hash, sizeof(hash), "0x%llx", static_cast<unsigned long long>(b.hostHash));
    for (XmlNode& c : tree.children) {
      if (c.name != "cpu") continue;
      c.set("host_hash", hash);
      if (!b.hostName.empty()) c.set("hostname", b.hostName);
      merged.children.push_back(c);
    }
  }
  if (merged.children.empty())
    return LOOM_ERROR(loomInvalidArgument, "mergeHosts: no host has a <cpu> element");
  return System::build(merged, "merged system");
}

Result<System> replicateHost(const System& host, int count) {
  std::vector<HostBlob> blobs;
  std::string xml = serializeHost(host);
  for (int i = 0; i < count; ++i)
    blobs.push_back(HostBlob{static_cast<uint64_t>(i + 1), "host" + std::to_string(i), xml});
  return mergeHosts(blobs);
}

Result<System> localTopology() {
  const std::string& file = env::topoFile();
  if (!file.empty()) LOOM_INFO(kTopo, "loading the topology from LOOM_TOPO_FILE=%s", file.c_str());
  LOOM_ASSIGN(System sys, file.empty() ? detectHost() : loadTopologyFile(file));
  if (!env::topoDumpFile().empty()) LOOM_CHECK(dumpTopologyFile(sys, env::topoDumpFile()));
  return sys;
}

}  // namespace loom::topo
