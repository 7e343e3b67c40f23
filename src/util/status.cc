#include "util/status.h"

#include "util/log.h"

namespace loom {

void logTrail(const Status& s, const char* file, int line) {
  LOOM_TRACE(kAll, "%s:%d -> %d (%s)", file, line, static_cast<int>(s.code()), s.message().c_str());
}

}  // namespace loom
