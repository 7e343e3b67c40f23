// One rank of the network-namespace fault test (tests/netns/faults.sh). Reads LOOM_RANK,
// LOOM_WORLD_SIZE and LOOM_COMM_ID, joins, prints "READY rank R pid P", then:
//
//   loom_fault_worker correct ROUNDS
//       the all-reduce cases of the compact suite ROUNDS times, then the whole compact suite
//       once, every result checked; "PASS rank R" (exit 0) or "FAIL rank R" (exit 1).
//   loom_fault_worker until-error
//       checked 1 MiB all-reduces until one fails (the script cuts the link or kills a rank),
//       then loomCommAbort. Prints "ERROR rank R at_ms=T code=C abort_ms=A: message" (T: the
//       CLOCK_REALTIME of the failure in ms; the script checks whom the message names). Exit 0
//       when the error is loomRemoteError or loomTimeout, no result was wrong before it, and
//       the abort took under 2 s.
#include <time.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "harness.h"

namespace {

using loomtest::Case;
using loomtest::Coll;

long long realtimeMs() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<long long>(ts.tv_sec) * 1000 + ts.tv_nsec / 1000000;
}

int correct(loomComm_t comm, int rank, int nranks, int rounds) {
  const std::vector<Case> suite = loomtest::buildCases(nranks, loomtest::SuiteLevel::kCompact);
  std::vector<Case> cases;
  for (int i = 0; i < rounds; ++i)
    for (const Case& c : suite)
      if (c.coll == Coll::kAllReduce) cases.push_back(c);
  const size_t allReduces = cases.size();
  cases.insert(cases.end(), suite.begin(), suite.end());
  loomtest::SuiteStats st = loomtest::runSuite(comm, rank, nranks, cases, nullptr);
  const loomResult_t r = loomCommDestroy(comm);
  const bool pass = st.failedCases == 0 && st.apiErrors == 0 && r == loomSuccess;
  printf("%s rank %d (%d cases of which %zu all-reduces, %d failed, %d API errors, %.1f s)\n",
         pass ? "PASS" : "FAIL", rank, st.cases, allReduces, st.failedCases, st.apiErrors,
         st.seconds);
  return pass ? 0 : 1;
}

int untilError(loomComm_t comm, int rank, int nranks) {
  Case c;
  c.coll = Coll::kAllReduce;
  c.dtype = loomFloat32;
  c.op = loomSum;
  c.count = size_t{1} << 18;
  c.pattern = loomtest::Pattern::kSmall;
  c.seed = 7;
  const std::vector<Case> batch(20, c);
  const long long start = realtimeMs();
  loomtest::SuiteStats st;
  while (st.apiErrors == 0 && st.failedCases == 0 && realtimeMs() - start < 120000)
    st = loomtest::runSuite(comm, rank, nranks, batch, nullptr);
  const long long at = realtimeMs();
  const std::string message = loomGetLastError(comm);
  loomResult_t code = loomSuccess;
  loomCommGetAsyncError(comm, &code);
  const long long t0 = realtimeMs();
  const loomResult_t aborted = loomCommAbort(comm);
  const long long abortMs = realtimeMs() - t0;
  printf("ERROR rank %d at_ms=%lld code=%s abort_ms=%lld: %s\n", rank, at, loomGetErrorString(code),
         abortMs, message.c_str());
  // runSuite counts the case that hit the API error as failed too; any other is a wrong result.
  const bool ok = st.apiErrors > 0 && st.failedCases == st.apiErrors && aborted == loomSuccess &&
                  abortMs < 2000 && (code == loomRemoteError || code == loomTimeout);
  printf("%s rank %d\n", ok ? "PASS" : "FAIL", rank);
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  const char* rankText = getenv("LOOM_RANK");
  const char* sizeText = getenv("LOOM_WORLD_SIZE");
  const std::string mode = argc > 1 ? argv[1] : "";
  if (rankText == nullptr || sizeText == nullptr || getenv("LOOM_COMM_ID") == nullptr ||
      (mode != "correct" && mode != "until-error")) {
    fprintf(stderr,
            "usage: LOOM_RANK=r LOOM_WORLD_SIZE=n LOOM_COMM_ID=host:port %s correct ROUNDS | "
            "until-error\n",
            argv[0]);
    return 2;
  }
  const int rank = atoi(rankText), nranks = atoi(sizeText);
  loomUniqueId id;
  loomComm_t comm = nullptr;
  loomResult_t r = loomGetUniqueId(&id);
  if (r == loomSuccess) r = loomCommInitRank(&comm, nranks, id, rank);
  if (r != loomSuccess) {
    printf("FAIL rank %d: init: %s: %s\n", rank, loomGetErrorString(r), loomGetLastError(nullptr));
    return 1;
  }
  printf("READY rank %d pid %d\n", rank, static_cast<int>(getpid()));
  fflush(stdout);
  if (mode == "correct") return correct(comm, rank, nranks, argc > 2 ? atoi(argv[2]) : 1);
  return untilError(comm, rank, nranks);
}
