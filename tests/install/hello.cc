// Built out of tree against an installed Loom by tests/install/run.sh, which starts it as 2 ranks
// with LOOM_RANK, LOOM_WORLD_SIZE and LOOM_COMM_ID set: it joins the world communicator with
// loomCommInitFromEnv, all-reduces in place, and checks the result against a sum computed here.
#include <loom/loom.h>

#include <cstdio>
#include <string>
#include <vector>

namespace {

void check(loomResult_t r, const char* what, loomComm_t comm) {
  if (r == loomSuccess) return;
  std::fprintf(stderr, "hello_cc: %s: %s: %s\n", what, loomGetErrorString(r),
               loomGetLastError(comm));
  throw r;
}

}  // namespace

int main() try {
  loomComm_t comm = nullptr;
  check(loomCommInitFromEnv(&comm, nullptr), "loomCommInitFromEnv", nullptr);
  int rank = -1, nranks = 0;
  check(loomCommUserRank(comm, &rank), "loomCommUserRank", comm);
  check(loomCommCount(comm, &nranks), "loomCommCount", comm);
  // Small integers: every partial sum is exact in float, whatever the order of the additions.
  std::vector<float> data(100000);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<float>((rank + 1) * (i % 977));
  check(loomAllReduce(data.data(), data.data(), data.size(), loomFloat32, loomSum, comm, nullptr),
        "loomAllReduce", comm);
  for (size_t i = 0; i < data.size(); ++i) {
    float want = 0;
    for (int q = 0; q < nranks; ++q) want += static_cast<float>((q + 1) * (i % 977));
    if (data[i] != want) {
      std::fprintf(stderr, "hello_cc: rank %d: element %zu is %g, want %g\n", rank, i, data[i],
                   want);
      return 1;
    }
  }
  check(loomCommDestroy(comm), "loomCommDestroy", nullptr);
  std::printf("hello_cc: rank %d of %d: all-reduce of %zu floats OK\n", rank, nranks, data.size());
  return 0;
} catch (loomResult_t) {
  return 1;
}
