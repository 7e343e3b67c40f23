// loom-env: prints every LOOM_* environment variable, its default, what it
// does and the NCCL (or PyTorch) variable it mirrors, as a markdown table.
// README.md embeds this output; a test keeps the two equal.
#include <cstdio>

#include "util/env.h"
#include "util/log.h"

int main() {
  loom::log::failExitWhenStdoutIsLost("loom-env");
  std::fputs(loom::env::markdownTable().c_str(), stdout);
  return 0;
}
