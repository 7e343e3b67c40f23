#include "util/pages.h"

#include <unistd.h>

#include <cstdint>

namespace loom::pages {
namespace {

size_t pageBytes() {
  static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return page;
}

}  // namespace

void touchForRead(const void* p, size_t bytes) {
  const volatile char* c = static_cast<const volatile char*>(p);
  for (size_t off = 0; off < bytes; off += pageBytes()) (void)c[off];
}

void touchForWrite(void* p, size_t bytes) {
  char* c = static_cast<char*>(p);
  for (size_t off = 0; off < bytes; off += pageBytes())
    __atomic_fetch_or(reinterpret_cast<uint8_t*>(c + off), uint8_t{0}, __ATOMIC_RELAXED);
}

}  // namespace loom::pages
