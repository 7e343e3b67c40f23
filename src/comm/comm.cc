#include "comm/comm.h"

#include <poll.h>
#include <sched.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "bootstrap/unique_id.h"
#include "comm/topo_setup.h"
#include "transport/shm/shm_setup.h"
#include "transport/tcp/tcp_setup.h"
#ifdef LOOM_HAVE_IB
#include "transport/ib/ib_connection.h"
#include "transport/ib/ib_setup.h"
#endif
#ifdef LOOM_HAVE_TOPOLOGY
#include "topology/nic_rank.h"
#include "topology/topology.h"
#endif
#include "util/cpus.h"
#include "util/env.h"
#include "util/log.h"
#include "util/net.h"
#include "util/proc.h"
#include "util/wait.h"

namespace loom {

Result<CommOptions> resolveConfig(const loomConfig_t* config, const CommOptions* parent) {
  CommOptions o;
  if (parent != nullptr) {
    o = *parent;
  } else {
    o.timeoutMs = env::timeoutMs();
    o.checkCalls = env::checkCalls();
  }
  if (config != nullptr) {
    if (config->magic != LOOM_CONFIG_MAGIC || config->size < sizeof(loomConfig_t))
      return LOOM_ERROR(loomInvalidArgument,
                        "config: not initialised with LOOM_CONFIG_INITIALIZER (bad magic or size)");
    if (config->blocking != LOOM_CONFIG_UNDEF_INT) {
      if (config->blocking != 0 && config->blocking != 1)
        return LOOM_ERROR(loomInvalidArgument, "config.blocking: must be 0 or 1");
      o.blocking = config->blocking == 1;
    }
    if (config->timeoutMs != LOOM_CONFIG_UNDEF_INT) {
      if (config->timeoutMs <= 0)
        return LOOM_ERROR(loomInvalidArgument, "config.timeoutMs: must be positive");
      o.timeoutMs = config->timeoutMs;
    }
    if (config->commName != nullptr) o.name = config->commName;
  }
  if (o.timeoutMs <= 0) o.timeoutMs = 300000;
  return o;
}

namespace {

// Small blocking messages over a connection, for set-up (the executor owns waiting later).
Status sendSmall(transport::Connection* c, const void* p, size_t n, int64_t deadline) {
  for (;;) {
    LOOM_CHECK(c->progress());
    if (void* slot = c->trySendSlot()) {
      std::memcpy(slot, p, n);
      c->postSend(n);
      break;
    }
    if (nowNs() > deadline)
      return LOOM_ERROR(loomTimeout,
                        "clock sync: timed out sending to rank " + std::to_string(c->peer()));
    c->wait(true, 1000);
  }
  while (!c->flushed()) {
    LOOM_CHECK(c->progress());
    if (nowNs() > deadline)
      return LOOM_ERROR(loomTimeout,
                        "clock sync: timed out sending to rank " + std::to_string(c->peer()));
    c->wait(true, 1000);
  }
  return Status::ok();
}

Status recvSmall(transport::Connection* c, void* p, size_t n, int64_t deadline) {
  for (;;) {
    LOOM_CHECK(c->progress());
    size_t got = 0;
    if (const void* slot = c->tryRecvSlot(&got)) {
      if (got != n)
        return LOOM_ERROR(loomInternalError, "clock sync: rank " + std::to_string(c->peer()) +
                                                 " sent " + std::to_string(got) + " bytes");
      std::memcpy(p, slot, n);
      c->releaseRecv();
      return Status::ok();
    }
    LOOM_CHECK(c->checkRecv());
    if (nowNs() > deadline)
      return LOOM_ERROR(loomTimeout,
                        "clock sync: timed out waiting for rank " + std::to_string(c->peer()));
    c->wait(false, 1000);
  }
}

}  // namespace

// Aligns clocks to rank 0's. Ranks of rank 0's host share its CLOCK_MONOTONIC (offset 0). With
// every other rank, rank 0 exchanges kRounds pings over their connection: it sends its clock t0,
// the rank answers with its own clock tr, and rank 0 reads t1. The round with the shortest round
// trip gives offset = (t0 + t1) / 2 - tr, within +-rtt / 2; rank 0 sends both to the rank.
Status syncClock(Comm& c, int64_t deadline) {
  constexpr int kRounds = 8;
  const std::string& host0 = c.peer(0).host;
  if (c.rank() != 0) {
    if (c.peer(c.rank()).host == host0) return Status::ok();
    transport::Connection* conn = c.conn(0);
    for (int i = 0; i < kRounds; ++i) {
      int64_t t0 = 0;
      LOOM_CHECK(recvSmall(conn, &t0, sizeof(t0), deadline));
      const int64_t tr = nowNs();
      LOOM_CHECK(sendSmall(conn, &tr, sizeof(tr), deadline));
    }
    int64_t result[2];
    LOOM_CHECK(recvSmall(conn, result, sizeof(result), deadline));
    c.recorder().setClock(result[0], result[1]);
    LOOM_INFO(kInit, "%s: clock offset to rank 0 %lld ns (+-%lld ns)", c.describe().c_str(),
              static_cast<long long>(result[0]), static_cast<long long>(result[1]));
    return Status::ok();
  }
  for (int r = 1; r < c.nranks(); ++r) {
    if (c.peer(r).host == host0) continue;
    transport::Connection* conn = c.conn(r);
    int64_t best[2] = {0, INT64_MAX};  // offset, round trip
    for (int i = 0; i < kRounds; ++i) {
      const int64_t t0 = nowNs();
      LOOM_CHECK(sendSmall(conn, &t0, sizeof(t0), deadline));
      int64_t tr = 0;
      LOOM_CHECK(recvSmall(conn, &tr, sizeof(tr), deadline));
      const int64_t t1 = nowNs();
      if (t1 - t0 < best[1]) best[0] = t0 + (t1 - t0) / 2 - tr, best[1] = t1 - t0;
    }
    const int64_t result[2] = {best[0], (best[1] + 1) / 2};
    LOOM_CHECK(sendSmall(conn, result, sizeof(result), deadline));
  }
  return Status::ok();
}

Result<std::unique_ptr<Comm>> Comm::create(const loomUniqueId& id, int nranks, int rank,
                                           const CommOptions& options,
                                           const std::atomic<bool>* externalAbort) {
  env::printAll();
  std::unique_ptr<Comm> c(new Comm());
  c->rank_ = rank;
  c->nranks_ = nranks;
  c->options_ = options;
  log::setThreadRank(rank);
  c->recorder_ = std::make_unique<trace::FlightRecorder>(
      static_cast<size_t>(std::max<int64_t>(0, env::flightRecorder())), rank, nranks,
      /*oneWriter=*/options.blocking);
  if (!env::traceDir().empty()) trace::installSignalHandler();
  c->dumpRequestsSeen_ = trace::dumpRequests();
  const int64_t deadline = nowNs() + options.timeoutMs * 1000000;
  const size_t slotBytes = static_cast<size_t>(env::slotBytes());  // 4096..2^26
  // Rings need two slots per link: a recv-reduce-send holds the incoming slot
  // while it waits for an outgoing one (the verifier proves depth 1 deadlocks). 2..16.
  const size_t depth = static_cast<size_t>(env::fifoDepth());

  LOOM_ASSIGN(std::string ip, net::localAddress());
  LOOM_ASSIGN(c->listener_, transport::TcpListener::open(ip));
  PeerInfo mine;
  mine.host = net::hostIdentity();
  mine.pid = getpid();
  mine.tcpAddr = c->listener_->address();
  mine.cudaDev = options.cudaDev;
  mine.cpuMask = cpus::allowed();
  LOOM_ASSIGN(mine.ib, wantIb());

  // A non-blocking communicator's initialisation runs on its worker; loomCommAbort raises
  // externalAbort, which every wait of the set-up honours.
  const std::atomic<bool>* abortFlag = externalAbort != nullptr ? externalAbort : &c->aborted_;
  LOOM_ASSIGN(c->bootstrap_, bootstrap::Bootstrap::join(id, rank, nranks, mine.encode(),
                                                        options.timeoutMs, abortFlag));
  for (const std::string& blob : c->bootstrap_->peerInfo()) {
    LOOM_ASSIGN(PeerInfo p, PeerInfo::decode(blob));
    c->peers_.push_back(std::move(p));
  }
  std::vector<const std::string*> hosts;
  for (const PeerInfo& p : c->peers_) {
    auto same = [&p](const std::string* h) { return *h == p.host; };
    auto it = std::find_if(hosts.begin(), hosts.end(), same);
    if (it == hosts.end()) it = hosts.insert(hosts.end(), &p.host);
    c->hostOf_.push_back(static_cast<int>(it - hosts.begin()));
  }

  // Ranks of this host talk over shared memory (unless disabled); others over ib where both
  // ends have a port, else TCP.
  std::vector<int> local, ibPeers, tcpPeers;
  std::vector<transport::TcpPeer> addresses;
  auto viaNet = [&](int a, int b) {
    return a != b && (env::shmDisable() || c->peers_[static_cast<size_t>(a)].host !=
                                               c->peers_[static_cast<size_t>(b)].host);
  };
  for (int r = 0; r < nranks; ++r) {
    if (r == rank) continue;
    const PeerInfo& p = c->peers_[static_cast<size_t>(r)];
    if (!viaNet(rank, r)) {
      local.push_back(r);
      continue;
    }
    (mine.ib && p.ib ? ibPeers : tcpPeers).push_back(r);
    // Every ib peer also gets an idle TCP link, whose closing tells that its process is gone.
    addresses.push_back({r, p.tcpAddr, mine.ib && p.ib});
  }
  c->conns_.resize(static_cast<size_t>(nranks));
  {
    // Ranks that share this machine's cores: those of this host and of other network
    // namespaces of the same machine (the same name before "/net:" in the host identity).
    // More of them than cores: a spinning rank holds a core another rank needs.
    // Their cores: the union of their affinity masks, so that ranks bound to a core each
    // are not taken for ranks crowded onto one.
    const std::string machine = net::machineOf(mine.host);
    std::vector<cpu_set_t> masks;
    for (const PeerInfo& p : c->peers_)
      if (net::machineOf(p.host) == machine) masks.push_back(p.cpuMask);
    c->ranksPerCore_ = cpus::ranksPerCore(masks);
    const bool outnumbered = c->outnumbered();
    if (env::spinCount() >= 0) {
      c->spinCount_ = static_cast<uint64_t>(env::spinCount());
      c->netSpinCount_ = std::min<uint64_t>(c->spinCount_, 32);
    } else {
      // Where ranks outnumber cores a poll only delays the rank it waits for, which needs the
      // core: there a wait yields without polling first (docs/journal/perf.md).
      c->spinCount_ = outnumbered ? 0 : 2000;
      c->netSpinCount_ = outnumbered ? 0 : 32;
    }
    // Two ranks a core: 200, which each wait mostly spends handing the core to the other
    // rank; more ranks a core: 16, since each yield then goes round them all and so takes
    // longer before the rank blocks (docs/journal/perf.md).
    c->yieldCount_ = env::yieldCount() >= 0  ? static_cast<uint64_t>(env::yieldCount())
                     : !outnumbered          ? 1000
                     : c->ranksPerCore_ == 2 ? 200
                                             : 16;
  }
  // Direct buffers when every rank shares this host (the direct all-reduce).
  const size_t directBytes =
      local.size() + 1 == static_cast<size_t>(nranks) && nranks > 1
          ? static_cast<size_t>(std::max<int64_t>(4096, env::directBytes()) / 4096 * 4096)
          : 0;
  // Every transport is set up the same way, each with its own peers.
  transport::SetupArgs setup;
  setup.rank = rank;
  setup.commHash = c->bootstrap_->commHash();
  setup.slotBytes = slotBytes;
  setup.depth = depth;
  setup.deadlineNs = deadline;
  setup.abortFlag = abortFlag;
  {
    transport::ShmTransport shm(directBytes, [&c] { return c->bootstrap_->barrier(); });
    setup.peers = local;
    LOOM_ASSIGN(transport::Links links, shm.connect(setup));
    c->adopt(std::move(links));
  }
  {
    transport::TcpTransport tcp(*c->listener_, c->bootstrap_->secret(), addresses);
    setup.peers.clear();
    for (const transport::TcpPeer& p : addresses) setup.peers.push_back(p.rank);
    LOOM_ASSIGN(transport::Links links, tcp.connect(setup));
    // The links of ib peers only watch: they go to the ib transport.
    std::vector<std::unique_ptr<transport::Connection>> watches(static_cast<size_t>(nranks));
    for (auto& conn : links.conns)
      if (std::find(ibPeers.begin(), ibPeers.end(), conn->peer()) != ibPeers.end())
        watches[static_cast<size_t>(conn->peer())] = std::move(conn);
    links.conns.erase(std::remove(links.conns.begin(), links.conns.end(), nullptr),
                      links.conns.end());
    c->adopt(std::move(links));
    if (!ibPeers.empty()) {
      LOOM_ASSIGN(auto ib, c->ibTransport(std::move(watches)));
      setup.peers = ibPeers;
      LOOM_ASSIGN(transport::Links ibLinks, ib->connect(setup));
      c->adopt(std::move(ibLinks));
    }
  }
  // Every TCP peer has connected: stop listening, so a stranger's connection queued there is
  // reset rather than left open, and no port stays open for the communicator's lifetime.
  c->listener_.reset();
  c->stampsSent_.assign(static_cast<size_t>(nranks), {0, 0});
  c->inbox_.resize(nranks);
  LOOM_CHECK(syncClock(*c, deadline));
  LOOM_ASSIGN(c->system_, gatherSystem(*c));
  {
    std::vector<int> devs;
    for (const PeerInfo& p : c->peers_) devs.push_back(p.cudaDev);
    std::string how;
    c->ringOrder_ = commRingOrder(c->system_.get(), c->hostOf_, devs, &how);
    std::string text;
    for (int r : c->ringOrder_) text += (text.empty() ? "" : " ") + std::to_string(r);
    if (text.empty()) text = "rank order";
    LOOM_INFO(kTopo, "%s: ring order %s: %s", c->describe().c_str(), text.c_str(), how.c_str());
  }
  LOOM_CHECK(c->bootstrap_->barrier());
  // externalAbort (the handle's, or a split's parent's) watched the set-up only: from now on
  // the communicator's own abort ends the ring's waits.
  c->bootstrap_->setAbortFlag(&c->aborted_);
  LOOM_INFO(kInit, "%s ready: %zu shm peers, %zu ib peers, %zu tcp peers, slot %zu B x %zu",
            c->describe().c_str(), local.size(), ibPeers.size(), tcpPeers.size(), slotBytes, depth);
  return c;
}

Comm::~Comm() = default;

Result<bool> Comm::wantIb() {
#ifdef LOOM_HAVE_IB
  const std::string& net = env::net();
  if (strcasecmp(net.c_str(), "socket") == 0) return false;
  std::string why;
  const bool ok = transport::ib::available(&why);
  if (strcasecmp(net.c_str(), "ib") == 0 && !ok)
    return LOOM_ERROR(loomSystemError, "LOOM_NET=IB: the ib transport is unavailable: " + why);
  if (!net.empty() && strcasecmp(net.c_str(), "ib") != 0)
    return LOOM_ERROR(loomInvalidArgument, "LOOM_NET=" + net + ": expected IB or Socket");
  if (!ok) LOOM_INFO(kTransport, "ib transport off: %s", why.c_str());
  return ok;
#else
  if (strcasecmp(env::net().c_str(), "ib") == 0)
    return LOOM_ERROR(loomSystemError, "LOOM_NET=IB: this build has no ib transport");
  return false;
#endif
}

Result<void*> Comm::registerBuffer(void* buff, size_t size) {
  auto reg = std::make_unique<Registration>(Registration{buff, size, nullptr});
#ifdef LOOM_HAVE_IB
  if (ibDevice_) {
    auto* device = static_cast<transport::ib::Device*>(ibDevice_.get());
    LOOM_ASSIGN(reg->region, device->registerRegion(buff, size));
  }
#endif
  std::lock_guard<std::mutex> lock(regMutex_);
  registrations_.push_back(std::move(reg));
  return static_cast<void*>(registrations_.back().get());
}

Status Comm::deregisterBuffer(void* handle) {
  std::lock_guard<std::mutex> lock(regMutex_);
  for (size_t i = 0; i < registrations_.size(); ++i) {
    if (registrations_[i].get() != handle) continue;
    registrations_.erase(registrations_.begin() + static_cast<long>(i));
    return Status::ok();
  }
  return LOOM_ERROR(loomInvalidArgument,
                    "handle: not a registration of this communicator (or already deregistered)");
}

#ifdef LOOM_HAVE_IB
namespace {

// The port of `ports` (listPorts order) this rank takes. With a GPU and the host's topology:
// one of the ports nearest that GPU (topology/nic_rank.h), spread by localIndex over equally
// near ones; otherwise ports[localIndex % size], as listPorts put this NUMA node's first.
size_t pickIbPort(const std::vector<transport::ib::PortChoice>& ports, int cudaDev,
                  int localIndex) {
  const size_t fallback = static_cast<size_t>(localIndex) % ports.size();
#ifdef LOOM_HAVE_TOPOLOGY
  if (cudaDev < 0) return fallback;
  std::string why;
  const transport::ib::CudaDriver* cuda = transport::ib::CudaDriver::get(&why);
  const std::string gpu = cuda != nullptr ? cuda->busId(cudaDev) : "";
  Result<std::string> blob =
      gpu.empty() ? Result<std::string>(LOOM_ERROR(loomInternalError, "no PCI bus id: " + why))
                  : localHostBlob();
  Result<topo::System> sys = blob.isOk() ? topo::loadTopologyString(blob.value(), "this host")
                                         : Result<topo::System>(blob.status());
  if (!sys.isOk()) {
    LOOM_INFO(kTransport, "ib: GPU %d: no topology to find its nearest NIC (%s); by NUMA node",
              cudaDev, sys.status().message().c_str());
    return fallback;
  }
  std::vector<topo::NicPort> named;
  for (const auto& p : ports) named.push_back({p.device, p.busId});
  const int source = topo::nicRankSource(sys.value(), 0, gpu, -1);
  const auto ranked = topo::rankNics(sys.value(), source, named);
  const size_t tier = topo::nearestTier(ranked);
  if (source < 0 || tier == 0) {
    LOOM_INFO(kTransport, "ib: GPU %d (%s) or its NICs are not in the topology; by NUMA node",
              cudaDev, gpu.c_str());
    return fallback;
  }
  const auto& best = ranked[static_cast<size_t>(localIndex) % tier];
  LOOM_INFO(kTransport, "ib: GPU %d (%s) takes %s:%d, path %s, %.1f GB/s (%zu as near)", cudaDev,
            gpu.c_str(), ports[best.port].device.c_str(), ports[best.port].port,
            topo::pathTypeName(best.type), best.bw, tier);
  return best.port;
#else
  (void)cudaDev;
  return fallback;
#endif
}

}  // namespace
#endif

Result<std::unique_ptr<transport::Transport>> Comm::ibTransport(
    std::vector<std::unique_ptr<transport::Connection>> watches) {
#ifdef LOOM_HAVE_IB
  namespace ib = transport::ib;
  std::string why;
  const ib::Verbs* verbs = ib::loadVerbs(&why);
  // Ranks of one host spread over its ports, nearest first.
  int localIndex = 0;
  for (int r = 0; r < rank_; ++r)
    localIndex += peers_[static_cast<size_t>(r)].host == peers_[static_cast<size_t>(rank_)].host;
  const auto ports = ib::listPorts(*verbs, net::NameFilter::parse(env::ibHca(), true),
                                   !env::ibHca().empty(), net::currentNumaNode());
  if (ports.empty()) return LOOM_ERROR(loomSystemError, "ib: the active ports have gone");
  const ib::PortChoice& choice = ports[pickIbPort(ports, options_.cudaDev, localIndex)];
  LOOM_ASSIGN(auto device, ib::Device::open(*verbs, choice, static_cast<int>(env::ibGidIndex())));
  netGbps_ = choice.gbps;
  netLink_ = algo::Link::Net;
  ibDevice_ = device;
  return std::unique_ptr<transport::Transport>(
      std::make_unique<ib::IbTransport>(std::move(device), std::move(watches)));
#else
  (void)watches;
  return LOOM_ERROR(loomInternalError, "a peer offered ib, which this build lacks");
#endif
}

void Comm::adopt(transport::Links links) {
  for (auto& conn : links.conns) {
    if (conn->wakeup() != transport::Wakeup::Self) netConns_.push_back(conn.get());
    conns_[static_cast<size_t>(conn->peer())] = std::move(conn);
  }
  if (links.memory) memory_ = std::move(links.memory);
  if (links.backing) backings_.push_back(std::move(links.backing));
}

Status Comm::progressNet() {
  for (transport::Connection* c : netConns_) LOOM_CHECK(c->progress());
  return Status::ok();
}

Status Comm::progressNetReady() {
  constexpr size_t kMax = 64;
  // One or two sockets: a receive on each costs what poll() does, and a ready one then needs
  // no second system call.
  constexpr size_t kAskEach = 2;
  if (netConns_.size() > kMax || netConns_.size() <= kAskEach) return progressNet();
  // Only connections whose descriptor shows news are asked (Wakeup::Readable); the others
  // are moved on every look.
  pollfd fds[kMax];
  for (size_t i = 0; i < netConns_.size(); ++i) {
    transport::Connection* c = netConns_[i];
    fds[i] = {c->wakeup() == transport::Wakeup::Readable ? c->fd() : -1, c->pollEvents(), 0};
  }
  const bool any = poll(fds, netConns_.size(), 0) > 0;
  // A socket whose connection holds read-ahead bytes (prepareWait) has news poll() cannot see.
  for (size_t i = 0; i < netConns_.size(); ++i)
    if (fds[i].fd < 0 || (any && fds[i].revents != 0) || netConns_[i]->prepareWait())
      LOOM_CHECK(netConns_[i]->progress());
  return Status::ok();
}

void Comm::abort() {
  aborted_.store(true);
  for (auto& c : conns_)
    if (c) c->markBroken();
  if (bootstrap_) bootstrap_->abort();
}

Status Comm::asyncError() const {
  if (!failed_.load(std::memory_order_acquire)) return Status::ok();
  std::lock_guard<std::mutex> lock(errorMutex_);
  return asyncError_;
}

void Comm::fail(const Status& s) {
  {
    std::lock_guard<std::mutex> lock(errorMutex_);
    if (!asyncError_.isOk()) return;
    asyncError_ = s;
    failed_.store(true, std::memory_order_release);
  }
  dumpTraceIfConfigured(s.code() == loomTimeout ? "timeout" : "error");
  // The rank lost first: as noted by the wait that failed, else the first broken link's.
  for (auto& c : conns_)
    if (c && lostRank_.load() < 0 && c->lostRank() >= 0) noteLost(c->lostRank());
  const int lost = lostRank_.load();
  for (auto& c : conns_)
    if (c) c->markBrokenBecause(lost >= 0 ? lost : rank_);
}

void Comm::noteLost(int r) {
  int none = -1;
  lostRank_.compare_exchange_strong(none, r);
}

Status Comm::checkPeerAlive(int r) const {
  const PeerInfo& p = peers_[static_cast<size_t>(r)];
  if (p.host != peers_[static_cast<size_t>(rank_)].host || p.pid == getpid()) return Status::ok();
  if (proc::alive(p.pid)) return Status::ok();
  return LOOM_ERROR(loomRemoteError, "rank " + std::to_string(r) + " (pid " +
                                         std::to_string(p.pid) + ") has exited");
}

Status Comm::dumpTrace(const std::string& path, const std::string& reason) {
  std::string p = path;
  if (p.empty()) {
    if (env::traceDir().empty())
      return LOOM_ERROR(loomInvalidArgument, "path: NULL and LOOM_TRACE_DIR is not set");
    char name[96];
    std::snprintf(name, sizeof(name), "/loom-trace-%016llx-rank%d.json",
                  static_cast<unsigned long long>(bootstrap_ ? bootstrap_->commHash() : 0), rank_);
    p = env::traceDir() + name;
    // The folder and those above it, where they do not exist yet (umask applies).
    const std::string& dir = env::traceDir();
    for (size_t at = dir.find('/', 1); at != std::string::npos; at = dir.find('/', at + 1))
      ::mkdir(dir.substr(0, at).c_str(), 0777);
    ::mkdir(dir.c_str(), 0777);
  }
  return recorder_->dump(p, options_.name, bootstrap_ ? bootstrap_->commHash() : 0, reason);
}

void Comm::dumpTraceIfConfigured(const std::string& reason) {
  if (env::traceDir().empty() || !recorder_->enabled()) return;
  Status s = dumpTrace("", reason);
  if (!s.isOk()) LOOM_WARN(kTrace, "%s", s.message().c_str());
}

void Comm::pollDumpRequest() {
  uint64_t n = trace::dumpRequests();
  if (n == dumpRequestsSeen_) return;
  dumpRequestsSeen_ = n;
  dumpTraceIfConfigured("SIGUSR1");
}

void Comm::publishCompleted(uint64_t seq) {
  if (memory_ != nullptr) memory_->header(rank_)->lastSeq.store(seq, std::memory_order_relaxed);
}

uint64_t Comm::peerLastSeq(int r) const {
  if (memory_ == nullptr) return 0;
  return memory_->header(r)->lastSeq.load(std::memory_order_relaxed);
}

std::string Comm::describe() const {
  std::string s = "rank " + std::to_string(rank_) + " of " + std::to_string(nranks_);
  if (!options_.name.empty()) s += " (" + options_.name + ")";
  return s;
}

}  // namespace loom
