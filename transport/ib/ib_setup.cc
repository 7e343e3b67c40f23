#include "transport/ib/ib_setup.h"

#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <mutex>

#include "transport/ib/gdr.h"
#include "transport/ib/ib_connection.h"
#include "util/env.h"
#include "util/log.h"
#include "util/wait.h"

namespace loom::transport::ib {
namespace {

std::string readSysfs(const std::string& path) {
  std::ifstream in(path);
  std::string s;
  std::getline(in, s);
  return s;
}

// The PCI function behind an RDMA device: the name its sysfs device link points at.
std::string pciBusId(const std::string& device) {
  char target[512];
  const std::string link = "/sys/class/infiniband/" + device + "/device";
  const ssize_t n = readlink(link.c_str(), target, sizeof(target) - 1);
  if (n <= 0) return "";
  target[n] = 0;
  const char* slash = std::strrchr(target, '/');
  return slash != nullptr ? slash + 1 : target;
}

bool zeroGid(const ibv_gid& g) {
  for (uint8_t b : g.raw)
    if (b != 0) return false;
  return true;
}

bool ipv4Gid(const ibv_gid& g) {
  for (int i = 0; i < 10; ++i)
    if (g.raw[i] != 0) return false;
  return g.raw[10] == 0xff && g.raw[11] == 0xff;
}

}  // namespace

double portGbps(uint8_t activeWidth, uint16_t activeSpeed) {
  int lanes = 0;
  switch (activeWidth) {
    case 1:
      lanes = 1;
      break;
    case 2:
      lanes = 4;
      break;
    case 4:
      lanes = 8;
      break;
    case 8:
      lanes = 12;
      break;
    case 16:
      lanes = 2;
      break;
    default:
      return 0;
  }
  double perLane = 0;
  switch (activeSpeed) {
    case 1:
      perLane = 2.5;
      break;  // SDR
    case 2:
      perLane = 5;
      break;  // DDR
    case 4:
      perLane = 10;
      break;  // QDR
    case 8:
      perLane = 10;
      break;  // FDR10
    case 16:
      perLane = 14;
      break;  // FDR
    case 32:
      perLane = 25;
      break;  // EDR
    case 64:
      perLane = 50;
      break;  // HDR
    case 128:
      perLane = 100;
      break;  // NDR
    case 256:
      perLane = 200;
      break;  // XDR
    default:
      return 0;
  }
  return lanes * perLane;
}

int pickGid(int wanted, const std::vector<std::string>& types, const std::vector<ibv_gid>& gids) {
  if (wanted >= 0) return wanted < static_cast<int>(gids.size()) ? wanted : -1;
  auto v2 = [&](size_t i) { return i < types.size() && types[i] == "RoCE v2"; };
  for (size_t i = 0; i < gids.size(); ++i)
    if (v2(i) && ipv4Gid(gids[i])) return static_cast<int>(i);
  for (size_t i = 0; i < gids.size(); ++i)
    if (v2(i) && !zeroGid(gids[i])) return static_cast<int>(i);
  for (size_t i = 0; i < gids.size(); ++i)
    if (!zeroGid(gids[i])) return static_cast<int>(i);
  return -1;
}

std::vector<PortChoice> listPorts(const Verbs& v, const net::NameFilter& filter, bool anyFilter,
                                  int numaNode) {
  std::vector<PortChoice> out;
  int n = 0;
  ibv_device** list = v.getDeviceList(&n);
  if (list == nullptr) return out;
  for (int d = 0; d < n; ++d) {
    const std::string name = v.getDeviceName(list[d]);
    ibv_context* ctx = v.openDevice(list[d]);
    if (ctx == nullptr) continue;
    ibv_device_attr da{};
    if (v.queryDevice(ctx, &da) == 0) {
      for (int p = 1; p <= da.phys_port_cnt; ++p) {
        if (anyFilter && !filter.matches(name, p)) continue;
        ibv_port_attr pa{};
        if (v.queryPort(ctx, static_cast<uint8_t>(p), &pa) != 0 || pa.state != IBV_PORT_ACTIVE)
          continue;
        PortChoice c;
        c.device = name;
        c.port = p;
        const std::string numa = readSysfs("/sys/class/infiniband/" + name + "/device/numa_node");
        c.numaNode = numa.empty() ? -1 : std::atoi(numa.c_str());
        c.busId = pciBusId(name);
        c.gbps = portGbps(pa.active_width, pa.active_speed);
        c.ethernet = pa.link_layer == IBV_LINK_LAYER_ETHERNET;
        out.push_back(c);
      }
    }
    v.closeDevice(ctx);
  }
  v.freeDeviceList(list);
  std::stable_sort(out.begin(), out.end(), [&](const PortChoice& a, const PortChoice& b) {
    const bool an = numaNode >= 0 && a.numaNode == numaNode;
    const bool bn = numaNode >= 0 && b.numaNode == numaNode;
    if (an != bn) return an;
    return std::tie(a.device, a.port) < std::tie(b.device, b.port);
  });
  return out;
}

bool available(std::string* why) {
  if (env::ibDisable()) {
    *why = "LOOM_IB_DISABLE=1";
    return false;
  }
  const Verbs* v = loadVerbs(why);
  if (v == nullptr) return false;
  static std::once_flag once;
  static bool any = false;
  std::call_once(once, [v] {
    any = !listPorts(*v, net::NameFilter::parse(env::ibHca(), true), !env::ibHca().empty(), -1)
               .empty();
  });
  if (!any)
    *why = env::ibHca().empty() ? "no active RDMA port"
                                : "no active RDMA port matches LOOM_IB_HCA=" + env::ibHca();
  return any;
}

Result<std::shared_ptr<Device>> Device::open(const Verbs& v, const PortChoice& choice,
                                             int gidIndex) {
  std::shared_ptr<Device> d(new Device());
  d->verbs_ = &v;
  d->choice_ = choice;
  int n = 0;
  ibv_device** list = v.getDeviceList(&n);
  for (int i = 0; list != nullptr && i < n && d->ctx_ == nullptr; ++i)
    if (choice.device == v.getDeviceName(list[i])) d->ctx_ = v.openDevice(list[i]);
  if (list != nullptr) v.freeDeviceList(list);
  if (d->ctx_ == nullptr)
    return LOOM_ERROR(loomSystemError, "cannot open RDMA device " + choice.device);
  const uint8_t port = static_cast<uint8_t>(choice.port);
  if (v.queryPort(d->ctx_, port, &d->attr_) != 0)
    return LOOM_ERROR(loomSystemError,
                      "cannot query " + choice.device + " port " + std::to_string(choice.port));
  if (choice.ethernet || gidIndex >= 0) {
    std::vector<std::string> types;
    std::vector<ibv_gid> gids;
    const std::string base = "/sys/class/infiniband/" + choice.device + "/ports/" +
                             std::to_string(choice.port) + "/gid_attrs/types/";
    for (int i = 0; i < d->attr_.gid_tbl_len && i < 256; ++i) {
      ibv_gid g{};
      if (v.queryGid(d->ctx_, port, i, &g) != 0) break;
      gids.push_back(g);
      types.push_back(readSysfs(base + std::to_string(i)));
    }
    d->gidIndex_ = pickGid(gidIndex, types, gids);
    if (d->gidIndex_ < 0)
      return LOOM_ERROR(loomInvalidArgument, gidIndex >= 0
                                                 ? "LOOM_IB_GID_INDEX=" + std::to_string(gidIndex) +
                                                       ": " + choice.device + " has no such GID"
                                                 : choice.device + " has no usable GID");
    d->gid_ = gids[static_cast<size_t>(d->gidIndex_)];
  }
  d->pd_ = v.allocPd(d->ctx_);
  if (d->pd_ == nullptr)
    return LOOM_ERROR(loomSystemError, "cannot allocate a protection domain on " + choice.device);
  return d;
}

Device::~Device() {
  if (pd_ != nullptr) verbs_->deallocPd(pd_);
  if (ctx_ != nullptr) verbs_->closeDevice(ctx_);
}

Result<std::shared_ptr<void>> Device::registerRegion(void* addr, size_t len) {
  // Which registration: host memory, or device memory by dma-buf, peer memory or not at all.
  std::string noDriver;
  const CudaDriver* cuda = CudaDriver::get(&noDriver);
  const DevicePointer dp = cuda != nullptr ? cuda->classify(addr) : DevicePointer{};
  GdrCaps caps;
  caps.device = dp.device;
  caps.disabled = env::gdrDisable();
  caps.driver = cuda != nullptr;
  if (dp.device) {
    caps.driverDmaBuf = cuda->exportsDmaBuf();
    caps.gpuDmaBuf = cuda->dmaBufSupported(dp.ordinal);
    caps.verbsDmaBuf = verbs_->regDmabufMr != nullptr;
    caps.peerMem = peerMemLoaded();
  }
  std::string why;
  Registration how = chooseRegistration(caps, &why);
  constexpr int kAccess = IBV_ACCESS_LOCAL_WRITE;
  ibv_mr* mr = nullptr;
  if (how == Registration::DmaBuf) {
    // The driver exports whole pages; the region starts at its offset in the first one.
    const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
    const uintptr_t a = reinterpret_cast<uintptr_t>(addr);
    const uintptr_t base = a & ~(page - 1), end = (a + len + page - 1) & ~(page - 1);
    const int fd = cuda->dmaBufFd(base, end - base, &why);
    if (fd >= 0) {
      mr = verbs_->regDmabufMr(pd_, a - base, len, a, fd, kAccess);
      if (mr == nullptr) why = std::string("ibv_reg_dmabuf_mr: ") + std::strerror(errno);
      close(fd);
    }
    if (mr == nullptr) how = fallbackAfter(how, caps);
  }
  if (how == Registration::PeerMem) {
    mr = verbs_->regMr(pd_, addr, len, kAccess);
    if (mr == nullptr) {
      why += (why.empty() ? "" : "; ") + std::string("ibv_reg_mr of device memory: ") +
             std::strerror(errno);
      how = Registration::Staged;
    }
  }
  if (how == Registration::Host) {
    mr = verbs_->regMr(pd_, addr, len, kAccess);
    if (mr == nullptr)
      return LOOM_ERROR(loomSystemError, "ibv_reg_mr of " + std::to_string(len) + " bytes on " +
                                             describe() + " failed: " + std::strerror(errno));
  } else if (how == Registration::Staged) {
    LOOM_INFO(kTransport,
              "ib: device buffer of %zu bytes on GPU %d stays staged through host "
              "memory on %s: %s",
              len, dp.ordinal, describe().c_str(), why.c_str());
  } else {
    LOOM_INFO(kTransport, "ib: device buffer of %zu bytes on GPU %d registered on %s with %s", len,
              dp.ordinal, describe().c_str(), registrationName(how));
  }
  auto* r = new Region{reinterpret_cast<uintptr_t>(addr), reinterpret_cast<uintptr_t>(addr) + len,
                       mr, how};
  {
    std::lock_guard<std::mutex> lock(regMutex_);
    regions_.push_back(r);
  }
  std::shared_ptr<Device> self = shared_from_this();
  return std::shared_ptr<void>(r, [self](void* p) {
    auto* region = static_cast<Region*>(p);
    {
      std::lock_guard<std::mutex> lock(self->regMutex_);
      auto& v = self->regions_;
      v.erase(std::remove(v.begin(), v.end(), region), v.end());
    }
    if (region->mr != nullptr) self->verbs_->deregMr(region->mr);
    delete region;
  });
}

Registration Device::registration(const void* addr, size_t len) const {
  const uintptr_t b = reinterpret_cast<uintptr_t>(addr), e = b + len;
  std::lock_guard<std::mutex> lock(regMutex_);
  for (const Region* r : regions_)
    if (r->begin <= b && e <= r->end) return r->how;
  return Registration::Staged;
}

uint32_t Device::lookup(const void* addr, size_t len) const {
  const uintptr_t b = reinterpret_cast<uintptr_t>(addr), e = b + len;
  std::lock_guard<std::mutex> lock(regMutex_);
  for (const Region* r : regions_)
    if (r->mr != nullptr && r->begin <= b && e <= r->end) return r->mr->lkey;
  return 0;
}

std::string Device::describe() const {
  std::string s = choice_.device + ":" + std::to_string(choice_.port) + " (" +
                  (choice_.ethernet ? "RoCE, GID " + std::to_string(gidIndex_)
                                    : "IB, LID " + std::to_string(attr_.lid));
  if (choice_.gbps > 0) s += ", " + std::to_string(static_cast<int>(choice_.gbps)) + " Gb/s";
  return s + ")";
}

Status exchangeOverLinks(const std::vector<Connection*>& links,
                         const std::vector<const void*>& mine, const std::vector<void*>& theirs,
                         size_t bytes, int64_t deadlineNs, const std::atomic<bool>* abortFlag) {
  const size_t n = links.size();
  std::vector<char> sent(n, 0), got(n, 0);
  std::vector<pollfd> fds;
  for (;;) {
    bool done = true;
    fds.clear();
    bool ready = false;  // something arrived between the last look and the arming
    for (size_t i = 0; i < n; ++i) {
      Connection* c = links[i];
      const std::string who = "rank " + std::to_string(c->peer()) + ": ";
      LOOM_CHECK(c->progress().prefix(who));
      if (!sent[i]) {
        if (void* slot = c->trySendSlot()) {
          std::memcpy(slot, mine[i], bytes);
          c->postSend(bytes);
          sent[i] = 1;
          LOOM_CHECK(c->progress().prefix(who));
        }
      }
      if (!got[i]) {
        size_t b = 0;
        if (const void* slot = c->tryRecvSlot(&b)) {
          if (b != bytes)
            return LOOM_ERROR(loomInternalError, who + "sent " + std::to_string(b) +
                                                     " bytes of connection data, expected " +
                                                     std::to_string(bytes));
          std::memcpy(theirs[i], slot, bytes);
          c->releaseRecv();
          got[i] = 1;
        } else {
          LOOM_CHECK(c->checkRecv().prefix(who));
        }
      }
      if (sent[i] && got[i] && c->flushed()) continue;
      done = false;
      if (c->prepareWait()) ready = true;
      fds.push_back({c->fd(), c->pollEvents(), 0});
    }
    if (done) return Status::ok();
    if (abortFlag != nullptr && abortFlag->load())
      return LOOM_ERROR(loomInvalidUsage, "ib connection exchange was aborted by loomCommAbort");
    if (nowNs() > deadlineNs) {
      for (size_t i = 0; i < n; ++i)
        if (!(sent[i] && got[i]))
          return LOOM_ERROR(loomTimeout, "ib connection exchange: timed out " +
                                             std::string(sent[i] ? "waiting for" : "sending to") +
                                             " rank " + std::to_string(links[i]->peer()));
      return LOOM_ERROR(loomTimeout, "ib connection exchange: timed out flushing");
    }
    if (!ready) poll(fds.data(), fds.size(), 10);
  }
}

Result<Links> IbTransport::connect(const SetupArgs& args) {
  const std::vector<int>& peers = args.peers;
  std::vector<std::unique_ptr<IbConnection>> conns;
  std::vector<QpInfo> mine(peers.size()), theirs(peers.size());
  std::vector<Connection*> via;
  std::vector<const void*> out;
  std::vector<void*> in;
  Status failed;
  for (size_t i = 0; i < peers.size(); ++i) {
    const size_t p = static_cast<size_t>(peers[i]);
    Connection* link = p < watches_.size() ? watches_[p].get() : nullptr;
    if (link == nullptr)
      return LOOM_ERROR(loomInternalError, "ib: no link to rank " + std::to_string(p) +
                                               " to exchange connection data over");
    if (failed.isOk()) {
      auto c = IbConnection::create(peers[i], device_, args.slotBytes, args.depth);
      if (c.isOk()) {
        mine[i] = c.value()->localInfo();
        conns.push_back(c.take());
      } else {
        failed = c.status();  // peers still get an (invalid) entry, so none waits on us
      }
    }
    via.push_back(link);
    out.push_back(&mine[i]);
    in.push_back(&theirs[i]);
  }
  LOOM_CHECK(exchangeOverLinks(via, out, in, sizeof(QpInfo), args.deadlineNs, args.abortFlag));
  LOOM_CHECK(failed);
  Links links;
  links.backing = device_;
  for (size_t i = 0; i < conns.size(); ++i) {
    IbConnection& c = *conns[i];
    LOOM_CHECK(c.connect(theirs[i]).prefix("ib link to rank " + std::to_string(c.peer()) + ": "));
    c.watch(std::move(watches_[static_cast<size_t>(c.peer())]));
    links.conns.push_back(std::move(conns[i]));
  }
  if (device_)
    LOOM_INFO(kTransport, "ib: %zu queue pairs on %s", links.conns.size(),
              device_->describe().c_str());
  return links;
}

}  // namespace loom::transport::ib
