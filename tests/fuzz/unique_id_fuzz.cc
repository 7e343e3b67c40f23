// Fuzzes parseUniqueId (src/bootstrap/unique_id.cc): the 128 bytes every rank is handed and
// must not trust. The input is padded or cut to 128 bytes; when its first byte is odd, the
// checksum field (bytes [120, 128): FNV-1a 64 of bytes [0, 120), as unique_id.cc lays the id
// out) is filled in here, so the fuzzer gets past the checksum to the fields behind it.
//
// Checked besides crashes: an id that parses re-encodes (encodeUniqueId) to an id that parses
// to the same contents.
#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "bootstrap/unique_id.h"

using namespace loom::bootstrap;

namespace {
uint64_t fnv1a64(const unsigned char* p, size_t n) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}
bool same(const IdContents& a, const IdContents& b) {
  return a.root.sin_addr.s_addr == b.root.sin_addr.s_addr && a.root.sin_port == b.root.sin_port &&
         a.secret == b.secret && a.rootOnRank0 == b.rootOnRank0;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  loomUniqueId id;
  std::memset(&id, 0, sizeof(id));
  std::memcpy(id.internal, data, std::min<size_t>(size, LOOM_UNIQUE_ID_BYTES));
  auto* p = reinterpret_cast<unsigned char*>(id.internal);
  if (size > 0 && (data[0] & 1)) {
    uint64_t h = fnv1a64(p, 120);
    for (int i = 0; i < 8; ++i) p[120 + i] = static_cast<unsigned char>(h >> (8 * i));
  }
  auto parsed = parseUniqueId(id);
  if (!parsed.isOk()) {
    if (parsed.status().code() != loomInvalidArgument ||
        parsed.status().message().rfind("commId: ", 0) != 0) {
      fprintf(stderr, "a bad id gave: %s\n", parsed.status().message().c_str());
      abort();  // the contract: loomInvalidArgument naming the argument
    }
    return 0;
  }
  loomUniqueId again;
  encodeUniqueId(parsed.value(), &again);
  auto reparsed = parseUniqueId(again);
  if (!reparsed.isOk() || !same(parsed.value(), reparsed.value())) {
    fprintf(stderr, "an id does not survive encode(parse(id))\n");
    abort();
  }
  return 0;
}
