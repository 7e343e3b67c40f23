// One rank of the multi-host test (tests/netns/run.sh): reads LOOM_RANK,
// LOOM_WORLD_SIZE and LOOM_COMM_ID, joins, runs the compact collective suite
// of harness.cc and prints "PASS rank N" (exit 0) or "FAIL rank N" (exit 1).
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "harness.h"

int main() {
  const char* rankText = getenv("LOOM_RANK");
  const char* sizeText = getenv("LOOM_WORLD_SIZE");
  const char* commId = getenv("LOOM_COMM_ID");
  if (rankText == nullptr || sizeText == nullptr || commId == nullptr) {
    fprintf(stderr, "loom_mp_worker: set LOOM_RANK, LOOM_WORLD_SIZE and LOOM_COMM_ID\n");
    return 2;
  }
  const int rank = atoi(rankText), nranks = atoi(sizeText);
  if (nranks < 1 || rank < 0 || rank >= nranks) {
    fprintf(stderr, "loom_mp_worker: bad LOOM_RANK=%s LOOM_WORLD_SIZE=%s\n", rankText, sizeText);
    return 2;
  }
  loomUniqueId id;
  loomComm_t comm = nullptr;
  loomResult_t r = loomGetUniqueId(&id);
  if (r == loomSuccess) r = loomCommInitRank(&comm, nranks, id, rank);
  if (r != loomSuccess) {
    fprintf(stderr, "FAIL rank %d: init (LOOM_COMM_ID=%s): %s: %s\n", rank, commId,
            loomGetErrorString(r), loomGetLastError(nullptr));
    return 1;
  }
  std::vector<loomtest::Case> cases = loomtest::buildCases(nranks, loomtest::SuiteLevel::kCompact);
  loomtest::SuiteStats st = loomtest::runSuite(comm, rank, nranks, cases, nullptr);
  r = loomCommDestroy(comm);
  bool pass = st.failedCases == 0 && st.apiErrors == 0 && r == loomSuccess;
  printf("%s rank %d (%d cases, %.2f s)\n", pass ? "PASS" : "FAIL", rank, st.cases, st.seconds);
  return pass ? 0 : 1;
}
