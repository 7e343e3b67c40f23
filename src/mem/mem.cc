#include "mem/mem.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "util/shm.h"

namespace loom::mem {
namespace {

struct Segment {
  uint64_t token;
  char* base;
  size_t bytes;
  int fd = -1;  // an owned segment's descriptor, holding its lock while it is named (util/shm.h)
  pid_t creator = 0;  // the process that made it: a forked child inherits it, but never names it
};

std::mutex gMutex;
std::vector<Segment>& owned() {
  static auto* v = new std::vector<Segment>();  // outlives static destructors
  return *v;
}
std::vector<Segment>& mapped() {
  static auto* v = new std::vector<Segment>();
  return *v;
}

std::string nameOf(uint64_t token) {
  char buf[40];
  std::snprintf(buf, sizeof(buf), "/loom-mem-%016llx", static_cast<unsigned long long>(token));
  return buf;
}

uint64_t randomToken() {
  static std::random_device rd;
  uint64_t t = 0;
  while (t == 0) t = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  return t;
}

// Unlinks every name this process made and still owns when it exits (the mappings die with
// it); a forked child's exit leaves its parent's buffers alone.
void unlinkAtExit() {
  std::lock_guard<std::mutex> lock(gMutex);
  const pid_t self = getpid();
  for (const Segment& s : owned())
    if (s.creator == self) shm_unlink(nameOf(s.token).c_str());
}

}  // namespace

Result<void*> alloc(size_t bytes) {
  if (bytes == 0) return LOOM_ERROR(loomInvalidArgument, "size: 0 bytes");
  static std::once_flag once;
  std::call_once(once, [] { std::atexit(unlinkAtExit); });
  // Buffers of processes that were killed, once in each process (a forked child too).
  static std::atomic<pid_t> sweptBy{0};
  if (const pid_t self = getpid(); sweptBy.exchange(self) != self) shm::removeAbandoned();
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t len = (bytes + page - 1) / page * page;
  const uint64_t token = randomToken();  // 64 random bits: names do not collide
  const std::string name = nameOf(token);
  LOOM_ASSIGN(const int fd, shm::createHeld(name, len, "loomMemAlloc"));
  void* p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  const int err = errno;
  if (p == MAP_FAILED) {
    shm_unlink(name.c_str());
    close(fd);
    return LOOM_ERROR(loomSystemError, std::string("loomMemAlloc: mmap: ") + std::strerror(err));
  }
  std::memset(p, 0, len);  // every page touched now, never in a collective
  std::lock_guard<std::mutex> lock(gMutex);
  owned().push_back({token, static_cast<char*>(p), len, fd, getpid()});
  return p;
}

Status free(void* ptr) {
  std::lock_guard<std::mutex> lock(gMutex);
  auto& v = owned();
  for (size_t i = 0; i < v.size(); ++i) {
    if (v[i].base != ptr) continue;
    if (v[i].creator == getpid()) shm_unlink(nameOf(v[i].token).c_str());  // not a parent's
    close(v[i].fd);
    munmap(v[i].base, v[i].bytes);
    v.erase(v.begin() + static_cast<long>(i));
    return Status::ok();
  }
  return LOOM_ERROR(loomInvalidArgument, "ptr: not a buffer from loomMemAlloc (or freed already)");
}

Ref lookup(const void* ptr, size_t bytes) {
  const char* p = static_cast<const char*>(ptr);
  std::lock_guard<std::mutex> lock(gMutex);
  for (const Segment& s : owned())
    if (p >= s.base && p + bytes <= s.base + s.bytes)
      return {s.token, static_cast<uint64_t>(p - s.base)};
  return {};
}

Result<const char*> mapPeer(uint64_t token, size_t minBytes) {
  std::lock_guard<std::mutex> lock(gMutex);
  for (const Segment& s : mapped())
    if (s.token == token && s.bytes >= minBytes) return static_cast<const char*>(s.base);
  for (const Segment& s : owned())  // this process's own buffer
    if (s.token == token && s.bytes >= minBytes) return static_cast<const char*>(s.base);
  const std::string name = nameOf(token);
  const int fd = shm_open(name.c_str(), O_RDONLY | O_CLOEXEC, 0);
  if (fd < 0)
    return LOOM_ERROR(loomSystemError, "cannot open a peer's loomMemAlloc buffer " + name + ": " +
                                           std::strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0 || st.st_uid != geteuid() || static_cast<size_t>(st.st_size) < minBytes) {
    close(fd);
    return LOOM_ERROR(loomSystemError, "a peer's loomMemAlloc buffer " + name +
                                           " is not this user's or is too small");
  }
  void* p = mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_SHARED, fd, 0);
  const int err = errno;
  close(fd);
  if (p == MAP_FAILED)
    return LOOM_ERROR(loomSystemError, "cannot map a peer's loomMemAlloc buffer " + name + ": " +
                                           std::strerror(err));
  mapped().push_back({token, static_cast<char*>(p), static_cast<size_t>(st.st_size)});
  return static_cast<const char*>(p);
}

}  // namespace loom::mem
