// Faulting a mapping's pages in before any collective reaches them. On some virtual
// machines a page's first access by a process costs microseconds even once
// MAP_POPULATE has filled the page tables (the hypervisor maps the page for the process only
// then; no fault counter shows it). Touching the pages once, at set-up, takes that cost there
// rather than in the first collectives (docs/journal/perf.md).
#pragma once

#include <cstddef>

namespace loom::pages {

// Reads one byte of every page in [p, p + bytes): for what this process only reads.
void touchForRead(const void* p, size_t bytes);

// Stores to every page in [p, p + bytes) without changing its contents (an atomic or of
// zero), so peers may be using the memory meanwhile: for what this process writes.
void touchForWrite(void* p, size_t bytes);

}  // namespace loom::pages
