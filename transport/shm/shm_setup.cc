#include "transport/shm/shm_setup.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "transport/shm/shm_connection.h"
#include "util/log.h"
#include "util/pages.h"

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
  int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd < 0 && errno == EEXIST) {
    LOOM_WARN(kTransport, "removing stale shared-memory segment %s", name.c_str());
    shm_unlink(name.c_str());
    fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  }
  if (fd < 0) return sysError("shm_open(" + name + ")");
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    Status s = sysError("ftruncate(" + name + ", " + std::to_string(bytes) +
                        ") (is /dev/shm large enough?)");
    close(fd);
    shm_unlink(name.c_str());
    return s;
  }
  // MAP_POPULATE faults every page in now, not on the data path.
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  close(fd);
  if (p == MAP_FAILED) {
    Status s = sysError("mmap(" + name + ")");
    shm_unlink(name.c_str());
    return s;
  }
  return std::unique_ptr<ShmSegment>(new ShmSegment(name, p, bytes, true));
}

Result<std::unique_ptr<ShmSegment>> ShmSegment::open(const std::string& name, size_t bytes) {
  int fd = shm_open(name.c_str(), O_RDWR, 0600);
  if (fd < 0) return sysError("shm_open(" + name + ") of a peer");
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  close(fd);
  if (p == MAP_FAILED) return sysError("mmap(" + name + ") of a peer");
  return std::unique_ptr<ShmSegment>(new ShmSegment(name, p, bytes, false));
}

void ShmSegment::unlink() {
  if (owner_ && !name_.empty()) shm_unlink(name_.c_str());
  name_.clear();
}

ShmSegment::~ShmSegment() {
  unlink();
  if (ptr_ != nullptr) munmap(ptr_, bytes_);
}

Result<ShmLinks> setupShm(int rank, const std::vector<int>& localRanks, uint64_t commHash,
                          size_t slotBytes, size_t depth, size_t directBytes,
                          const std::function<Status()>& barrier) {
  ShmLinks links;
  links.localRanks = localRanks;
  const size_t nlocal = localRanks.size();
  const size_t fifoBytes = shmFifoBytes(slotBytes, depth);
  // Segment layout: nlocal FIFOs, then this rank's window region.
  const size_t segBytes =
      nlocal * fifoBytes + (directBytes > 0 ? windowRegionBytes(directBytes) : 0);
  // The FIFO that local rank i writes into lives at i * fifoBytes of the
  // receiver's segment.
  size_t myIndex = 0;
  for (size_t i = 0; i < nlocal; ++i)
    if (localRanks[i] == rank) myIndex = i;
  if (nlocal > 1) {
    LOOM_ASSIGN(auto mine, ShmSegment::create(segmentName(commHash, rank), segBytes));
    links.segments.push_back(std::move(mine));
  }
  LOOM_CHECK(barrier());
  if (nlocal <= 1) return links;
  char* own = links.segments[0]->data();
  std::vector<WindowRegion> windows(nlocal);
  windows[myIndex].base = own + nlocal * fifoBytes;
  for (size_t i = 0; i < nlocal; ++i) {
    if (i == myIndex) continue;
    LOOM_ASSIGN(auto peerSeg, ShmSegment::open(segmentName(commHash, localRanks[i]), segBytes));
    windows[i].base = peerSeg->data() + nlocal * fifoBytes;
    auto* out = reinterpret_cast<ShmFifo*>(peerSeg->data() + myIndex * fifoBytes);
    auto* in = reinterpret_cast<ShmFifo*>(own + i * fifoBytes);
    links.conns.push_back(
        std::make_unique<ShmConnection>(localRanks[i], out, in, slotBytes, depth));
    links.segments.push_back(std::move(peerSeg));
  }
  // The pages this rank will touch, faulted in now rather than in the first collectives:
  // for writing, its own window region and its FIFO in each peer's segment; for reading, the
  // FIFOs in its own segment and the peers' window regions. (Not the FIFOs between two
  // other ranks, which this rank never touches.) Only once every segment is mapped: pages
  // touched while the segments were still being mapped (each peer's as it was opened) left
  // the first collectives as slow as untouched pages do.
  const size_t regionBytes = directBytes > 0 ? windowRegionBytes(directBytes) : 0;
  for (size_t i = 0, k = 1; i < nlocal; ++i) {
    if (i == myIndex) {
      pages::touchForWrite(own + nlocal * fifoBytes, regionBytes);
      continue;
    }
    char* peer = links.segments[k++]->data();
    pages::touchForWrite(peer + myIndex * fifoBytes, fifoBytes);
    pages::touchForRead(peer + nlocal * fifoBytes, regionBytes);
    pages::touchForRead(own + i * fifoBytes, fifoBytes);
  }
  if (directBytes > 0)
    links.memory =
        std::make_unique<MemoryChannel>(std::move(windows), directBytes, static_cast<int>(myIndex));
  // Everyone has mapped everything: the names are no longer needed.
  Status s = barrier();
  links.segments[0]->unlink();
  LOOM_CHECK(s);
  LOOM_INFO(kTransport, "shm: %zu local peers, %zu slots of %zu bytes each way", nlocal - 1, depth,
            slotBytes);
  return links;
}

}  // namespace loom::transport
