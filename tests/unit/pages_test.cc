// Pre-faulting shared mappings: neither touch changes what the pages hold, so both may run
// over memory that peers are using. (What the touches save, the hypervisor's first mapping
// of each page, shows in no count a process can read: docs/journal/perf.md, stop 31, times it.)
#include "util/pages.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

namespace loom {
namespace {

constexpr size_t kPages = 256;

class SharedMapping {
 public:
  SharedMapping() : page_(static_cast<size_t>(sysconf(_SC_PAGESIZE))) {
    fd_ = memfd_create("loom-pages-test", 0);
    EXPECT_GE(fd_, 0);
    EXPECT_EQ(ftruncate(fd_, static_cast<off_t>(bytes())), 0);
    p_ = static_cast<char*>(
        mmap(nullptr, bytes(), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd_, 0));
    EXPECT_NE(p_, MAP_FAILED);
  }
  ~SharedMapping() {
    munmap(p_, bytes());
    close(fd_);
  }
  size_t bytes() const { return kPages * page_; }
  char* data() const { return p_; }

 private:
  size_t page_;
  int fd_ = -1;
  char* p_ = nullptr;
};

TEST(Pages, TouchesKeepTheContents) {
  SharedMapping m;
  for (size_t i = 0; i < m.bytes(); ++i) m.data()[i] = static_cast<char>(i * 7 + 3);
  pages::touchForWrite(m.data(), m.bytes());
  pages::touchForRead(m.data(), m.bytes());
  for (size_t i = 0; i < m.bytes(); ++i)
    ASSERT_EQ(m.data()[i], static_cast<char>(i * 7 + 3)) << "byte " << i;
}

TEST(Pages, EmptyRangesTouchNothing) {
  pages::touchForWrite(nullptr, 0);
  pages::touchForRead(nullptr, 0);
}

}  // namespace
}  // namespace loom
