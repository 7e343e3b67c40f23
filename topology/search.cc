#include "topology/search.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>

namespace loom::topo {
namespace {

constexpr int kMaxExact = 16;  // devices per host searched exactly (bitmask DP)

using LinkKey = std::pair<int, int>;  // (node, link index)

struct HostPart {
  int host = 0;
  std::vector<int> devices;             // distinct device nodes, in order of first rank
  std::vector<std::vector<int>> ranks;  // ranks on each device
  std::vector<int> nets;                // NET nodes of the host
};

struct Search {
  const System& sys;
  std::map<LinkKey, double> residual;

  double res(const LinkKey& k) const {
    auto it = residual.find(k);
    if (it != residual.end()) return it->second;
    return sys.node(k.first).links[static_cast<size_t>(k.second)].bw;
  }
  // Narrowest remaining bandwidth along the path a -> b (same host).
  double pathRes(int a, int b) const {
    if (a == b) return kLocBw;
    const Path& p = sys.path(a, b);
    if (p.type == PathType::Dis) return 0;
    double bw = p.bw;
    for (const LinkKey& k : p.links) bw = std::min(bw, res(k));
    return bw;
  }

  // A Hamiltonian path over `dev` starting at dev[start] whose every hop has >= s left,
  // ending anywhere in `ends` (bit mask); cycle: must also close back to the start.
  // Returns the order (indices into dev), preferring the widest hops when backtracking.
  std::optional<std::vector<int>> hamilton(const std::vector<int>& dev, int start, uint32_t ends,
                                           bool cycle, double s) const {
    int k = static_cast<int>(dev.size());
    if (k == 1) return std::vector<int>{0};
    std::vector<std::vector<double>> w(static_cast<size_t>(k),
                                       std::vector<double>(static_cast<size_t>(k)));
    for (int i = 0; i < k; ++i)
      for (int j = 0; j < k; ++j) w[i][j] = i == j ? 0 : pathRes(dev[i], dev[j]);
    if (k > kMaxExact) return greedy(w, start, cycle, s);
    uint32_t full = (1u << k) - 1;
    // reach[mask]: devices that can end a valid path from start covering mask.
    std::vector<uint32_t> reach(size_t(1) << k, 0);
    reach[1u << start] = 1u << start;
    std::vector<uint32_t> adj(static_cast<size_t>(k), 0);  // hops of >= s out of each device
    for (int i = 0; i < k; ++i)
      for (int j = 0; j < k; ++j)
        if (i != j && w[i][j] >= s) adj[i] |= 1u << j;
    for (uint32_t mask = 0; mask <= full; ++mask) {
      for (uint32_t r = reach[mask]; r != 0; r &= r - 1) {
        int last = __builtin_ctz(r);
        for (uint32_t nx = adj[last] & ~mask; nx != 0; nx &= nx - 1)
          reach[mask | (nx & -nx)] |= nx & -nx;
      }
    }
    int end = -1;
    double endBw = -1;
    for (int x = 0; x < k; ++x) {
      if (!(reach[full] >> x & 1) || !(ends >> x & 1)) continue;
      double bw = cycle ? w[x][start] : 1;
      if (cycle && bw < s) continue;
      if (bw > endBw) {
        end = x;
        endBw = bw;
      }
    }
    if (end < 0) return std::nullopt;
    std::vector<int> order = {end};
    uint32_t mask = full;
    int cur = end;
    while (cur != start) {
      uint32_t prevMask = mask & ~(1u << cur);
      int best = -1;
      for (int y = 0; y < k; ++y)
        if ((reach[prevMask] >> y & 1) && w[y][cur] >= s && (best < 0 || w[y][cur] > w[best][cur]))
          best = y;
      mask = prevMask;
      cur = best;
      order.push_back(cur);
    }
    std::reverse(order.begin(), order.end());
    return order;
  }

  // Beyond kMaxExact devices: nearest (widest) neighbour first.
  static std::optional<std::vector<int>> greedy(const std::vector<std::vector<double>>& w,
                                                int start, bool cycle, double s) {
    size_t k = w.size();
    std::vector<int> order = {start};
    std::vector<bool> used(k, false);
    used[static_cast<size_t>(start)] = true;
    for (size_t step = 1; step < k; ++step) {
      int cur = order.back(), best = -1;
      for (size_t j = 0; j < k; ++j)
        if (!used[j] && w[cur][j] >= s && (best < 0 || w[cur][j] > w[cur][best]))
          best = static_cast<int>(j);
      if (best < 0) return std::nullopt;
      used[static_cast<size_t>(best)] = true;
      order.push_back(best);
    }
    if (cycle && w[order.back()][start] < s) return std::nullopt;
    return order;
  }
};

struct Candidate {
  std::vector<std::vector<int>> hostOrder;  // per host part: device indices in order
  std::vector<int> hostNet;                 // per host part: NET node or -1
};

// One ring at share s with the current residuals, or nothing.
std::optional<Candidate> findRing(const Search& se, const std::vector<HostPart>& parts, double s) {
  Candidate c;
  if (parts.size() == 1) {
    const HostPart& h = parts[0];
    auto order = se.hamilton(h.devices, 0, ~0u, true, s);
    if (!order) return std::nullopt;
    c.hostOrder.push_back(*order);
    c.hostNet.push_back(-1);
    return c;
  }
  for (const HostPart& h : parts) {
    int k = static_cast<int>(h.devices.size());
    if (h.nets.empty()) {
      std::optional<std::vector<int>> found;
      for (int e = 0; e < k && !found; ++e) found = se.hamilton(h.devices, e, ~0u, false, s);
      if (!found) return std::nullopt;
      c.hostOrder.push_back(*found);
      c.hostNet.push_back(-1);
      continue;
    }
    // Ports in order of how close they are to this host's devices, then by dev.
    std::vector<int> nets = h.nets;
    auto closeness = [&](int n) {
      int best = static_cast<int>(PathType::Dis);
      for (int d : h.devices) best = std::min(best, static_cast<int>(se.sys.path(d, n).type));
      return best;
    };
    std::stable_sort(nets.begin(), nets.end(),
                     [&](int a, int b) { return closeness(a) < closeness(b); });
    bool done = false;
    for (int n : nets) {
      // Entries and exits: devices with >= s to and from the port, nearest first.
      std::vector<int> entries;
      uint32_t exits = 0;
      for (int i = 0; i < k; ++i) {
        if (se.pathRes(n, h.devices[i]) >= s) entries.push_back(i);
        if (se.pathRes(h.devices[i], n) >= s) exits |= 1u << i;
      }
      std::stable_sort(entries.begin(), entries.end(), [&](int a, int b) {
        return se.sys.path(n, h.devices[a]).type < se.sys.path(n, h.devices[b]).type;
      });
      for (int e : entries) {
        uint32_t ends = k == 1 ? exits : exits & ~(1u << e);
        if (ends == 0) continue;
        // Prefer exits as near the port as the entry: try the nearest class first.
        PathType bestType = PathType::Dis;
        for (int i = 0; i < k; ++i)
          if (ends >> i & 1) bestType = std::min(bestType, se.sys.path(h.devices[i], n).type);
        uint32_t nearEnds = 0;
        for (int i = 0; i < k; ++i)
          if ((ends >> i & 1) && se.sys.path(h.devices[i], n).type == bestType) nearEnds |= 1u << i;
        auto order = se.hamilton(h.devices, e, nearEnds, false, s);
        if (!order) order = se.hamilton(h.devices, e, ends, false, s);
        if (order) {
          c.hostOrder.push_back(*order);
          c.hostNet.push_back(n);
          done = true;
          break;
        }
      }
      if (done) break;
    }
    if (!done) return std::nullopt;
  }
  return c;
}

// Links each hop of the candidate crosses, with multiplicity.
std::map<LinkKey, int> usage(const Search& se, const std::vector<HostPart>& parts,
                             const Candidate& c) {
  std::map<LinkKey, int> u;
  auto addPath = [&](int a, int b) {
    if (a == b) return;
    for (const LinkKey& k : se.sys.path(a, b).links) u[k]++;
  };
  for (size_t h = 0; h < parts.size(); ++h) {
    const auto& o = c.hostOrder[h];
    for (size_t i = 0; i + 1 < o.size(); ++i)
      addPath(parts[h].devices[o[i]], parts[h].devices[o[i + 1]]);
    if (parts.size() == 1) {
      addPath(parts[h].devices[o.back()], parts[h].devices[o.front()]);
    } else if (c.hostNet[h] >= 0) {
      addPath(c.hostNet[h], parts[h].devices[o.front()]);
      addPath(parts[h].devices[o.back()], c.hostNet[h]);
    }
  }
  return u;
}

// Packs up to maxChannels rings at share s; returns the candidates.
std::vector<Candidate> pack(const System& sys, const std::vector<HostPart>& parts, double s,
                            int maxChannels) {
  Search se{sys, {}};
  std::vector<Candidate> out;
  while (static_cast<int>(out.size()) < maxChannels) {
    auto c = findRing(se, parts, s);
    if (!c) break;
    auto u = usage(se, parts, *c);
    bool fits = true;
    for (const auto& kv : u) fits &= se.res(kv.first) / kv.second >= s * (1 - 1e-9);
    if (!fits) break;
    if (u.empty()) {  // every rank on one device: one ring says it all
      out.push_back(*c);
      break;
    }
    // The same ring again as long as every link it crosses has room for another share.
    int reps = maxChannels - static_cast<int>(out.size());
    for (const auto& kv : u)
      reps = std::min(reps, static_cast<int>(se.res(kv.first) / (s * kv.second) + 1e-9));
    for (const auto& kv : u) se.residual[kv.first] = se.res(kv.first) - s * kv.second * reps;
    for (int i = 0; i < reps; ++i) out.push_back(*c);
  }
  return out;
}

}  // namespace

Result<std::vector<RankPlace>> placeRanks(const System& system, int ranksPerHost) {
  if (ranksPerHost <= 0)
    return LOOM_ERROR(loomInvalidArgument, "placeRanks: ranksPerHost must be > 0");
  std::vector<RankPlace> out;
  for (size_t h = 0; h < system.hosts().size(); ++h) {
    std::vector<int> gpus = system.nodesOf(NodeType::Gpu, static_cast<int>(h));
    std::vector<int> cpus = system.nodesOf(NodeType::Cpu, static_cast<int>(h));
    for (int r = 0; r < ranksPerHost; ++r) {
      RankPlace p;
      p.host = static_cast<int>(h);
      if (!gpus.empty()) {
        p.kind = NodeType::Gpu;
        p.index = system.node(gpus[static_cast<size_t>(r) % gpus.size()]).dev;
      } else {
        p.kind = NodeType::Cpu;
        size_t c = static_cast<size_t>(r) * cpus.size() / static_cast<size_t>(ranksPerHost);
        p.index = system.node(cpus[c]).numa;
      }
      out.push_back(p);
    }
  }
  return out;
}

Result<RingPlan> searchRings(const System& system, const std::vector<RankPlace>& ranks,
                             const SearchOptions& options) {
  if (ranks.empty()) return LOOM_ERROR(loomInvalidArgument, "searchRings: no ranks");
  // Devices of each rank, grouped by host.
  std::vector<int> rankNode(ranks.size());
  std::vector<HostPart> parts;
  std::map<int, size_t> partOf;
  for (size_t r = 0; r < ranks.size(); ++r) {
    const RankPlace& p = ranks[r];
    if (p.host < 0 || p.host >= static_cast<int>(system.hosts().size()))
      return LOOM_ERROR(loomInvalidArgument, "searchRings: rank " + std::to_string(r) +
                                                 " is on host " + std::to_string(p.host) +
                                                 ", which the system lacks");
    int node = p.kind == NodeType::Gpu ? system.gpu(p.host, p.index) : system.cpu(p.host, p.index);
    if (node < 0)
      return LOOM_ERROR(loomInvalidArgument, "searchRings: rank " + std::to_string(r) + ": host " +
                                                 std::to_string(p.host) + " has no " +
                                                 nodeTypeName(p.kind) + std::to_string(p.index));
    rankNode[r] = node;
    auto it = partOf.find(p.host);
    if (it == partOf.end()) {
      it = partOf.emplace(p.host, parts.size()).first;
      HostPart hp;
      hp.host = p.host;
      hp.nets = system.nodesOf(NodeType::Net, p.host);
      parts.push_back(hp);
    }
    HostPart& hp = parts[it->second];
    auto d = std::find(hp.devices.begin(), hp.devices.end(), node);
    if (d == hp.devices.end()) {
      hp.devices.push_back(node);
      hp.ranks.push_back({});
      d = hp.devices.end() - 1;
    }
    hp.ranks[static_cast<size_t>(d - hp.devices.begin())].push_back(static_cast<int>(r));
  }
  std::sort(parts.begin(), parts.end(),
            [](const HostPart& a, const HostPart& b) { return a.host < b.host; });

  // The best single ring: the largest share any ring sustains, from the link figures present.
  std::vector<double> shares = {kLocBw};
  for (const HostPart& h : parts)
    for (int n : system.hosts()[static_cast<size_t>(h.host)].nodes)
      for (const Link& l : system.node(n).links)
        for (int div = 1; div <= 4; ++div) shares.push_back(l.bw / div);  // links shared by hops
  std::sort(shares.begin(), shares.end(), std::greater<double>());
  shares.erase(std::unique(shares.begin(), shares.end()), shares.end());
  // No ring is wider than the narrowest "widest way out" of any device.
  double bound = kLocBw;
  for (const HostPart& h : parts) {
    if (parts.size() == 1 && h.devices.size() == 1) continue;
    for (int d : h.devices) {
      double out = 0;
      for (int o : h.devices)
        if (o != d) out = std::max(out, system.path(d, o).bw);
      for (int n : h.nets) out = std::max(out, system.path(d, n).bw);
      if (parts.size() > 1 && h.nets.empty()) out = kLocBw;  // leaves through an unknown network
      bound = std::min(bound, out);
    }
  }
  double best1 = 0;
  for (double s : shares) {
    if (s > bound) continue;
    if (!pack(system, parts, s, 1).empty()) {
      best1 = s;
      break;
    }
  }
  if (best1 <= 0)
    return LOOM_ERROR(loomInvalidArgument, "searchRings: the ranks' devices are not connected");

  // Channels: share best1 / j for j = minChannels.., keep the largest channels x share.
  std::vector<Candidate> chosen;
  double share = 0, bestTotal = 0;
  int maxCh = std::max(1, options.maxChannels);
  for (int j = std::max(1, options.minChannels); j <= maxCh; ++j) {
    double s = best1 / j;
    if (s * maxCh <= bestTotal * (1 + 1e-9)) break;
    std::vector<Candidate> got = pack(system, parts, s, maxCh);
    if (static_cast<int>(got.size()) < options.minChannels) continue;
    double total = s * static_cast<double>(got.size());
    if (total > bestTotal * (1 + 1e-9)) {
      bestTotal = total;
      share = s;
      chosen = got;
    }
  }
  if (chosen.empty())
    return LOOM_ERROR(loomInvalidArgument, "searchRings: no ring fits the channel bounds");

  RingPlan plan;
  plan.bwPerChannel = share;
  for (const Candidate& c : chosen) {
    Channel ch;
    for (size_t h = 0; h < parts.size(); ++h) {
      const HostPart& hp = parts[h];
      HostRoute route;
      route.host = hp.host;
      route.net = c.hostNet[h];
      for (int di : c.hostOrder[h])
        for (int r : hp.ranks[static_cast<size_t>(di)]) ch.ring.push_back(r);
      route.entryRank = hp.ranks[static_cast<size_t>(c.hostOrder[h].front())].front();
      route.exitRank = hp.ranks[static_cast<size_t>(c.hostOrder[h].back())].back();
      if (parts.size() > 1) ch.routes.push_back(route);
      TreeHint t;
      t.host = hp.host;
      t.net =
          route.net >= 0 ? route.net : (hp.nets.empty() ? -1 : system.nearestNet(hp.devices[0]));
      t.headRank = route.entryRank;
      if (t.net >= 0) {
        PathType bestType = PathType::Dis;
        for (size_t d = 0; d < hp.devices.size(); ++d) {
          PathType pt = system.path(hp.devices[d], t.net).type;
          if (pt < bestType) {
            bestType = pt;
            t.headRank = hp.ranks[d].front();
          }
        }
      }
      ch.tree.push_back(t);
    }
    size_t n = ch.ring.size();
    for (size_t i = 0; i < n; ++i) {
      Hop hop;
      hop.from = ch.ring[i];
      hop.to = ch.ring[(i + 1) % n];
      int a = rankNode[static_cast<size_t>(hop.from)], b = rankNode[static_cast<size_t>(hop.to)];
      if (a == b) {
        hop.type = PathType::Loc;
        hop.bw = kLocBw;
      } else if (system.node(a).host == system.node(b).host) {
        hop.type = system.path(a, b).type;
        hop.bw = system.path(a, b).bw;
      } else {
        hop.type = PathType::Net;
        for (const HostRoute& r : ch.routes) {
          if (r.host == system.node(a).host) hop.netOut = r.net;
          if (r.host == system.node(b).host) hop.netIn = r.net;
        }
        if (hop.netOut >= 0 && hop.netIn >= 0)
          hop.bw = std::min(system.path(a, hop.netOut).bw, system.path(hop.netIn, b).bw);
      }
      ch.hops.push_back(hop);
    }
    plan.channels.push_back(ch);
  }
  return plan;
}

}  // namespace loom::topo
