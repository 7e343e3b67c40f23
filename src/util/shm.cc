#include "util/shm.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>

#include "util/log.h"

namespace loom::shm {
namespace {

// Whether the segment `name`, open on `fd`, may be removed: held by no process, and the name
// still its own (another process may have removed it and a new one taken the name since it
// was opened). In a sweep only this user's sized segments qualify. A name this process is
// about to create is its own by construction: there a segment of another user (planted, or
// left by a process of another user) is removed whatever holds it, and one of this user's of
// any size if no one holds it. Takes the lock to find out; the caller closes fd, which drops
// it.
bool removable(const std::string& name, int fd, bool sweep) {
  struct stat st {};
  struct stat now {};
  if (fstat(fd, &st) != 0) return false;
  const bool mine = st.st_uid == geteuid();
  if (sweep && (!mine || st.st_size == 0)) return false;
  if (mine && flock(fd, LOCK_EX | LOCK_NB) != 0) return false;
  return stat(("/dev/shm" + name).c_str(), &now) == 0 && now.st_ino == st.st_ino &&
         now.st_dev == st.st_dev;
}

// Unlinks `name` if removable; true if it did.
bool unlinkIfRemovable(const std::string& name, bool sweep) {
  const int fd = shm_open(name.c_str(), O_RDONLY | O_CLOEXEC, 0);
  if (fd < 0) return false;
  const bool gone = removable(name, fd, sweep) && shm_unlink(name.c_str()) == 0;
  close(fd);
  if (gone)
    LOOM_WARN(kTransport,
              "removed shared-memory segment %s (no live process held it, or another user's)",
              name.c_str());
  return gone;
}

// The bytes a new segment on fd can have and still be touched: the file system's free space, and
// the memory and swap the kernel counts as available. A larger segment would be created without
// complaint and then end the process (SIGBUS, or the OOM killer) as its pages were touched.
uint64_t room(int fd) {
  uint64_t bytes = UINT64_MAX;
  struct statvfs vfs {};
  // A tmpfs without a size limit reports no blocks at all: memory is then its only bound.
  if (fstatvfs(fd, &vfs) == 0 && vfs.f_blocks != 0)
    bytes = static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize;
  if (FILE* f = std::fopen("/proc/meminfo", "r")) {
    char line[128];
    unsigned long long kb = 0, memory = 0, swap = 0;
    bool found = false;
    while (std::fgets(line, sizeof(line), f) != nullptr) {
      if (std::sscanf(line, "MemAvailable: %llu kB", &kb) == 1) {
        memory = kb;
        found = true;
      } else if (std::sscanf(line, "SwapFree: %llu kB", &kb) == 1) {
        swap = kb;
      }
    }
    std::fclose(f);
    if (found) bytes = std::min<uint64_t>(bytes, (memory + swap) * 1024);
  }
  return bytes;
}

}  // namespace

Result<int> createHeld(const std::string& name, size_t bytes, const char* what) {
  int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  int err = errno;
  if (fd < 0 && err == EEXIST && unlinkIfRemovable(name, false)) {
    fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    err = errno;
  }
  if (fd < 0) {
    return LOOM_ERROR(loomSystemError,
                      std::string(what) + ": shm_open(" + name + "): " + std::strerror(err) +
                          (err == EEXIST ? " (a live process holds a segment of that name)" : ""));
  }
  if (const uint64_t can = room(fd); bytes > can) {
    close(fd);
    shm_unlink(name.c_str());
    return LOOM_ERROR(loomSystemError, std::string(what) + ": size " + std::to_string(bytes) +
                                           " bytes is more than shared memory can hold now (" +
                                           std::to_string(can) +
                                           " bytes: the free space of /dev/shm, or the memory "
                                           "and swap available, whichever is less)");
  }
  if (flock(fd, LOCK_EX | LOCK_NB) != 0 || ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    const int err = errno;
    close(fd);
    shm_unlink(name.c_str());
    return LOOM_ERROR(loomSystemError,
                      std::string(what) + ": cannot lock or size " + name + " to " +
                          std::to_string(bytes) +
                          " bytes (is /dev/shm large enough?): " + std::strerror(err));
  }
  return fd;
}

int removeAbandoned() {
  DIR* d = opendir("/dev/shm");
  if (d == nullptr) return 0;
  int n = 0;
  while (dirent* e = readdir(d))
    if (std::strncmp(e->d_name, "loom-", 5) == 0 &&
        unlinkIfRemovable(std::string("/") + e->d_name, true))
      ++n;
  closedir(d);
  return n;
}

}  // namespace loom::shm
