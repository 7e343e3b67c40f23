// Faulting a mapping's pages in before any collective reaches them. On this project's
// virtual machines a page's first access by a process costs microseconds, whatever the
// kernel has populated: MAP_POPULATE fills a shared mapping's page tables for reading only,
// so the first store to each page still faults, and the hypervisor maps a page for the
// process only at its first access. Touching the pages once, at set-up, takes those costs
// there rather than in the first collectives (docs/PERFORMANCE.md, stop 31).
#pragma once

#include <cstddef>

namespace loom::pages {

// Reads one byte of every page in [p, p + bytes): for what this process only reads.
void touchForRead(const void* p, size_t bytes);

// Stores to every page in [p, p + bytes) without changing its contents (an atomic or of
// zero), so peers may be using the memory meanwhile: for what this process writes.
void touchForWrite(void* p, size_t bytes);

}  // namespace loom::pages
