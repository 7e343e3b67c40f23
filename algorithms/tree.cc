// Double binary tree all-reduce: two trees, each carrying half of the buffer;
// in each tree the partial sums flow up to the root (reduce), then the result
// flows down (broadcast). Latency grows with the depth, log2(n), not with n.
//
// Tree 0 is a balanced in-order binary tree over positions 0..n-1 (the root
// of [lo, hi) is (lo + hi) / 2); tree 1 is the same tree over positions shifted
// by one, so about half the leaves of one tree are inner nodes of the other
// and the two halves load different links.
//        tree 0 (n = 7)          tree 1 (position p holds rank p + 1)
//              3                          4
//          1       5                  2       6
//        0   2   4   6              1   3   5   0
// With a host layout the trees join hosts, not ranks: inside a host the
// ranks form a chain (tree 1 runs it backwards), and the chain's head is the
// host's node in a double binary tree over hosts. (A layout of a single host
// is taken as no layout.)
//
// Per node and tree, all steps cover the tree's half of the buffer, so the
// executor's pieces of every step line up (round-major execution pipelines
// each tree level by level):
//   reduce:    first child: recv + own (pre-scaled) -> recv; next children:
//              recv + recv -> recv; last child: recv + partial, sent straight
//              on to the parent (a leaf just sends its input)
//   root:      the last child's sum is final (post-op) and kept
//   broadcast: recv from parent, keep, send to child 0; send to the others
//              (the root sends to every child)
// Every node's steps run in the order: tree 0 reduce, tree 1 reduce, tree 0
// broadcast, tree 1 broadcast, so two ranks that are linked in both trees
// send and receive their pieces in the same order.
#include <algorithm>

#include "algorithms/schedule.h"

namespace loom::algo {
namespace {

struct Node {
  int parent = -1;
  std::vector<int> children;
};

// Links the in-order binary tree over positions [lo, hi) under `parent`;
// `at(pos)` names the member at a position. Returns the subtree's root.
template <typename At>
int linkBst(int lo, int hi, int parent, const At& at, std::vector<Node>& nodes) {
  if (lo >= hi) return -1;
  const int mid = (lo + hi) / 2;
  const int self = at(mid);
  nodes[static_cast<size_t>(self)].parent = parent;
  for (int child : {linkBst(lo, mid, self, at, nodes), linkBst(mid + 1, hi, self, at, nodes)})
    if (child >= 0) nodes[static_cast<size_t>(self)].children.push_back(child);
  return self;
}

// Tree t (0 or 1) over all ranks: per host a chain, a binary tree over the hosts' heads.
// A layout of one host is no layout: one chain through every rank would not be a tree.
std::vector<Node> makeTree(int n, const std::vector<int>& hostOf, int t) {
  const bool oneHost =
      std::all_of(hostOf.begin(), hostOf.end(), [&](int h) { return h == hostOf[0]; });
  std::vector<int> hostIds;               // hosts in order of first appearance
  std::vector<std::vector<int>> members;  // ranks per host, in chain order
  for (int r = 0; r < n; ++r) {
    const int h = oneHost ? r : hostOf[static_cast<size_t>(r)];
    auto it = std::find(hostIds.begin(), hostIds.end(), h);
    if (it == hostIds.end()) {
      hostIds.push_back(h);
      members.emplace_back();
      it = hostIds.end() - 1;
    }
    members[static_cast<size_t>(it - hostIds.begin())].push_back(r);
  }
  const int hosts = static_cast<int>(members.size());
  if (t == 1)
    for (auto& m : members) std::reverse(m.begin(), m.end());
  std::vector<Node> hostTree(static_cast<size_t>(hosts));
  linkBst(
      0, hosts, -1, [&](int pos) { return (pos + t) % hosts; }, hostTree);
  std::vector<Node> nodes(static_cast<size_t>(n));
  for (int h = 0; h < hosts; ++h) {
    const std::vector<int>& m = members[static_cast<size_t>(h)];
    const Node& hn = hostTree[static_cast<size_t>(h)];
    for (size_t i = 0; i < m.size(); ++i) {
      Node& node = nodes[static_cast<size_t>(m[i])];
      if (i > 0)
        node.parent = m[i - 1];
      else if (hn.parent >= 0)
        node.parent = members[static_cast<size_t>(hn.parent)][0];
      if (i + 1 < m.size()) node.children.push_back(m[i + 1]);
      if (i == 0)
        for (int ch : hn.children) node.children.push_back(members[static_cast<size_t>(ch)][0]);
    }
  }
  return nodes;
}

void push(std::vector<Step>& st, const Step& s) {
  if (s.count > 0) st.push_back(s);
}

// The reduce half of one tree for one node over [off, off + len).
void reduceUp(std::vector<Step>& st, const Node& node, size_t off, size_t len) {
  const BufRef own{Buf::Send, off}, acc{Buf::Recv, off};
  const size_t k = node.children.size();
  if (k == 0) {
    if (node.parent >= 0)
      push(st, makeStep(StepOp::Send, -1, node.parent, own, acc, len, kPre));
    else
      push(st, makeStep(StepOp::Copy, -1, -1, own, acc, len, kPre | kPost));
    return;
  }
  for (size_t i = 0; i < k; ++i) {
    const int child = node.children[i];
    const BufRef src = i == 0 ? own : acc;
    const uint8_t pre = i == 0 ? kPre : 0;
    if (i + 1 < k)
      push(st, makeStep(StepOp::RecvReduceCopy, child, -1, src, acc, len, pre));
    else if (node.parent >= 0)
      push(st, makeStep(StepOp::RecvReduceSend, child, node.parent, src, acc, len, pre));
    else  // the root: the sum is complete
      push(st, makeStep(StepOp::RecvReduceCopy, child, -1, src, acc, len,
                        static_cast<uint8_t>(pre | kPost)));
  }
}

// The broadcast half of one tree for one node over [off, off + len).
void broadcastDown(std::vector<Step>& st, const Node& node, size_t off, size_t len) {
  const BufRef acc{Buf::Recv, off};
  const size_t k = node.children.size();
  if (node.parent >= 0) {
    if (k == 0)
      push(st, makeStep(StepOp::Recv, node.parent, -1, acc, acc, len));
    else
      push(st, makeStep(StepOp::RecvCopySend, node.parent, node.children[0], acc, acc, len));
  }
  for (size_t i = node.parent >= 0 ? 1 : 0; i < k; ++i)
    push(st, makeStep(StepOp::Send, -1, node.children[i], acc, acc, len));
}

}  // namespace

Schedule buildTreeAllReduce(int rank, int n, size_t count, const std::vector<int>& hostOf) {
  Schedule s = emptySchedule(Coll::AllReduce, "tree", rank, n, -1, count);
  auto& st = s.channels[0];
  Node nodes[2];
  size_t off[2], len[2];
  for (int t = 0; t < 2; ++t) {
    nodes[t] = makeTree(n, hostOf, t)[static_cast<size_t>(rank)];
    chunkRange(count, 2, t, &off[t], &len[t]);
  }
  // Both trees' reductions first, then both broadcasts: in every round the
  // two halves travel at once.
  for (int t = 0; t < 2; ++t) reduceUp(st, nodes[t], off[t], len[t]);
  for (int t = 0; t < 2; ++t) broadcastDown(st, nodes[t], off[t], len[t]);
  return s;
}

}  // namespace loom::algo
