#include "transport/shm/shm_setup.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "transport/shm/shm_connection.h"
#include "util/log.h"
#include "util/pages.h"
#include "util/shm.h"

namespace loom::transport {
namespace {

std::string segmentName(uint64_t commHash, int rank) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "/loom-%016llx-%d", static_cast<unsigned long long>(commHash),
                rank);
  return buf;
}

Status sysError(const std::string& what) {
  return LOOM_ERROR(loomSystemError, what + ": " + std::strerror(errno));
}

}  // namespace

Result<std::unique_ptr<ShmSegment>> ShmSegment::create(const std::string& name, size_t bytes) {
  LOOM_ASSIGN(const int fd, shm::createHeld(name, bytes, "shared-memory transport"));
  // MAP_POPULATE faults every page in now, not on the data path.
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  if (p == MAP_FAILED) {
    Status s = sysError("mmap(" + name + ")");
    shm_unlink(name.c_str());
    close(fd);
    return s;
  }
  return std::unique_ptr<ShmSegment>(new ShmSegment(name, p, bytes, fd));
}

Result<std::unique_ptr<ShmSegment>> ShmSegment::open(const std::string& name, size_t bytes) {
  int fd = shm_open(name.c_str(), O_RDWR, 0600);
  if (fd < 0) return sysError("shm_open(" + name + ") of a peer");
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  close(fd);
  if (p == MAP_FAILED) return sysError("mmap(" + name + ") of a peer");
  return std::unique_ptr<ShmSegment>(new ShmSegment(name, p, bytes, -1));
}

void ShmSegment::unlink() {
  if (heldFd_ >= 0 && !name_.empty()) shm_unlink(name_.c_str());
  name_.clear();
  if (heldFd_ >= 0) close(heldFd_);  // the lock goes only once the name is gone
  heldFd_ = -1;
}

ShmSegment::~ShmSegment() {
  unlink();
  if (ptr_ != nullptr) munmap(ptr_, bytes_);
}

Result<Links> ShmTransport::connect(const SetupArgs& args) {
  std::vector<int> localRanks = args.peers;
  localRanks.push_back(args.rank);
  std::sort(localRanks.begin(), localRanks.end());
  auto segments = std::make_shared<std::vector<std::unique_ptr<ShmSegment>>>();
  Links links;
  links.backing = segments;
  const size_t nlocal = localRanks.size();
  const size_t fifoBytes = shmFifoBytes(args.slotBytes, args.depth);
  const size_t regionBytes = directBytes_ > 0 ? windowRegionBytes(directBytes_) : 0;
  // Segment layout: nlocal FIFOs, then this rank's window region. The FIFO that local rank i
  // writes into lives at i * fifoBytes of the receiver's segment.
  const size_t segBytes = nlocal * fifoBytes + regionBytes;
  const size_t myIndex = static_cast<size_t>(
      std::find(localRanks.begin(), localRanks.end(), args.rank) - localRanks.begin());
  if (nlocal > 1) {
    shm::removeAbandoned();  // segments of processes killed during an earlier set-up
    LOOM_ASSIGN(auto mine, ShmSegment::create(segmentName(args.commHash, args.rank), segBytes));
    segments->push_back(std::move(mine));
  }
  LOOM_CHECK(barrier_());
  if (nlocal > 1) {
    char* own = (*segments)[0]->data();
    std::vector<WindowRegion> windows(nlocal);
    windows[myIndex].base = own + nlocal * fifoBytes;
    for (size_t i = 0; i < nlocal; ++i) {
      if (i == myIndex) continue;
      LOOM_ASSIGN(auto peerSeg,
                  ShmSegment::open(segmentName(args.commHash, localRanks[i]), segBytes));
      windows[i].base = peerSeg->data() + nlocal * fifoBytes;
      auto* out = reinterpret_cast<ShmFifo*>(peerSeg->data() + myIndex * fifoBytes);
      auto* in = reinterpret_cast<ShmFifo*>(own + i * fifoBytes);
      links.conns.push_back(
          std::make_unique<ShmConnection>(localRanks[i], out, in, args.slotBytes, args.depth));
      segments->push_back(std::move(peerSeg));
    }
    // The pages this rank will touch, faulted in now rather than in the first collectives:
    // for writing, its own window region and its FIFO in each peer's segment; for reading, the
    // FIFOs in its own segment and the peers' window regions. (Not the FIFOs between two
    // other ranks, which this rank never touches.) Only once every segment is mapped: pages
    // touched while the segments were still being mapped (each peer's as it was opened) left
    // the first collectives as slow as untouched pages do.
    for (size_t i = 0, k = 1; i < nlocal; ++i) {
      if (i == myIndex) {
        pages::touchForWrite(own + nlocal * fifoBytes, regionBytes);
        continue;
      }
      char* peer = (*segments)[k++]->data();
      pages::touchForWrite(peer + myIndex * fifoBytes, fifoBytes);
      pages::touchForRead(peer + nlocal * fifoBytes, regionBytes);
      pages::touchForRead(own + i * fifoBytes, fifoBytes);
    }
    if (directBytes_ > 0)
      links.memory = std::make_unique<MemoryChannel>(std::move(windows), directBytes_,
                                                     static_cast<int>(myIndex));
  }
  // Everyone has mapped everything: the names are no longer needed.
  Status s = barrier_();
  if (nlocal > 1) (*segments)[0]->unlink();
  LOOM_CHECK(s);
  if (nlocal > 1)
    LOOM_INFO(kTransport, "shm: %zu local peers, %zu slots of %zu bytes each way", nlocal - 1,
              args.depth, args.slotBytes);
  return links;
}

}  // namespace loom::transport
