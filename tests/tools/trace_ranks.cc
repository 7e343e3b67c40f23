// Real ranks of the real library for loom-trace's end-to-end test: forks N
// processes that join one communicator over the public C API, run a scenario,
// and dump their flight recorders into a folder.
//
//   loom_trace_ranks straggler N DIR   40 all-reduces; rank 2 sleeps 20 ms before every 5th
//   loom_trace_ranks skip N DIR        6 all-reduces; rank N-1 skips its 4th, so the others'
//                                      6th times out with no partner (LOOM_ALGO=ring: on the
//                                      schedule path)
//   loom_trace_ranks mismatch N DIR    5 operations; at the 3rd, rank 1 calls a broadcast
//                                      where the others call an all-reduce
//   loom_trace_ranks direct N DIR      20 all-reduces on the direct path (ranks of one host);
//                                      LOOM_INJECT_DELAY=2:20000:2 makes rank 2 enter every
//                                      second one 20 ms late
//
// Every rank dumps with loomCommDumpTrace into DIR (LOOM_TRACE_DIR, which also
// makes a timeout and loomCommDestroy dump). LOOM_TIMEOUT_MS defaults to 2000
// for the scenarios that time out. Exit 0 when every rank saw what its
// scenario expects.
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "loom/loom.h"

namespace {

constexpr int kStragglerOps = 40, kStragglerRank = 2, kStragglerEvery = 5, kStragglerMs = 20;
constexpr int kSkipOps = 6, kSkipIndex = 3;
constexpr int kMismatchOps = 5, kMismatchIndex = 2;
constexpr int kDirectOps = 20;
constexpr size_t kCount = 256;

struct Shared {
  std::atomic<int> finished;  // ranks whose scenario is over (their waits have failed or ended)
};

double nowSec() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

loomResult_t allReduce(loomComm_t comm) {
  std::vector<float> in(kCount, 1.0f), out(kCount);
  return loomAllReduce(in.data(), out.data(), kCount, loomFloat32, loomSum, comm, nullptr);
}

int straggler(loomComm_t comm, int rank) {
  for (int i = 0; i < kStragglerOps; ++i) {
    if (rank == kStragglerRank && i % kStragglerEvery == kStragglerEvery - 1)
      usleep(kStragglerMs * 1000);
    if (allReduce(comm) != loomSuccess) {
      fprintf(stderr, "rank %d: all-reduce %d: %s\n", rank, i, loomGetLastError(comm));
      return 10;
    }
  }
  return 0;
}

// The skipping rank's calls all pair up with the others' (one sequence number
// behind from the skip on); the others' last call has no partner and times out
// (or, on a rank not waiting on the skipper itself, fails because a peer did).
int skip(loomComm_t comm, int rank, int nranks) {
  const bool skipper = rank == nranks - 1;
  for (int i = 0; i < kSkipOps; ++i) {
    if (skipper && i == kSkipIndex) continue;
    loomResult_t r = allReduce(comm);
    const bool expectTimeout = !skipper && i == kSkipOps - 1;
    // Rank 0 waits on the skipper itself (its ring predecessor, or one of the direct
    // all-reduce's peers) and times out; another rank may instead hear first that a peer
    // failed (on a ring it waits on rank 0).
    const bool told = expectTimeout && rank != 0 && r == loomRemoteError;
    if (r != (expectTimeout ? loomTimeout : loomSuccess) && !told) {
      fprintf(stderr, "rank %d: all-reduce %d returned %d: %s\n", rank, i, r,
              loomGetLastError(comm));
      return 20;
    }
  }
  return 0;
}

int mismatch(loomComm_t comm, int rank) {
  std::vector<float> buf(kCount, 1.0f);
  for (int i = 0; i < kMismatchOps; ++i) {
    loomResult_t r;
    if (i == kMismatchIndex && rank == 1)
      r = loomBroadcast(buf.data(), buf.data(), kCount, loomFloat32, 0, comm, nullptr);
    else
      r = allReduce(comm);
    if (i < kMismatchIndex && r != loomSuccess) return 30;
    // From the mismatch on, the communicator fails (a timeout, or a peer that failed).
    if (i >= kMismatchIndex && r == loomSuccess) return 31;
    if (i >= kMismatchIndex) break;
  }
  return 0;
}

int direct(loomComm_t comm, int rank) {
  for (int i = 0; i < kDirectOps; ++i)
    if (allReduce(comm) != loomSuccess) {
      fprintf(stderr, "rank %d: all-reduce %d: %s\n", rank, i, loomGetLastError(comm));
      return 40;
    }
  return 0;
}

int runRank(const std::string& mode, int rank, int nranks, const loomUniqueId& id, Shared* shared) {
  loomComm_t comm = nullptr;
  if (loomCommInitRank(&comm, nranks, id, rank) != loomSuccess) {
    fprintf(stderr, "rank %d: init: %s\n", rank, loomGetLastError(nullptr));
    return 2;
  }
  int code = 3;
  if (mode == "straggler") code = straggler(comm, rank);
  if (mode == "skip") code = skip(comm, rank, nranks);
  if (mode == "mismatch") code = mismatch(comm, rank);
  if (mode == "direct") code = direct(comm, rank);
  shared->finished.fetch_add(1);
  // The skipping rank stays alive until the others have timed out, so theirs
  // is a timeout and not a peer that exited.
  const double until = nowSec() + 30;
  while (mode == "skip" && rank == nranks - 1 && shared->finished.load() < nranks &&
         nowSec() < until)
    usleep(10000);
  if (loomCommDumpTrace(comm, nullptr) != loomSuccess) {
    fprintf(stderr, "rank %d: dump: %s\n", rank, loomGetLastError(comm));
    if (code == 0) code = 4;
  }
  loomCommDestroy(comm);
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: %s straggler|skip|mismatch|direct NRANKS DIR\n", argv[0]);
    return 1;
  }
  const std::string mode = argv[1];
  const int nranks = std::atoi(argv[2]);
  if ((mode != "straggler" && mode != "skip" && mode != "mismatch" && mode != "direct") ||
      nranks < 2 || ((mode == "straggler" || mode == "direct") && nranks <= kStragglerRank)) {
    fprintf(stderr, "bad mode or rank count\n");
    return 1;
  }
  // Loom reads its variables once, at the first call; the forked ranks inherit them.
  setenv("LOOM_TRACE_DIR", argv[3], 1);
  setenv("LOOM_SOCKET_IFNAME", "lo", 0);
  if (mode == "skip" || mode == "mismatch") setenv("LOOM_TIMEOUT_MS", "2000", 0);
  if (mode == "direct") setenv("LOOM_INJECT_DELAY", "2:20000:2", 1);
  auto* shared = static_cast<Shared*>(
      mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  if (shared == MAP_FAILED) return 1;
  new (shared) Shared();
  loomUniqueId id;
  if (loomGetUniqueId(&id) != loomSuccess) {
    fprintf(stderr, "loomGetUniqueId: %s\n", loomGetLastError(nullptr));
    return 1;
  }
  fflush(stdout);
  fflush(stderr);
  std::vector<pid_t> pids;
  for (int r = 0; r < nranks; ++r) {
    pid_t pid = fork();
    if (pid == 0) {
      int code = runRank(mode, r, nranks, id, shared);
      fflush(stdout);
      fflush(stderr);
      _exit(code);
    }
    pids.push_back(pid);
  }
  int failures = 0, running = nranks;
  std::vector<bool> reaped(static_cast<size_t>(nranks), false);
  const double deadline = nowSec() + 120;
  bool killed = false;
  while (running > 0) {
    for (int r = 0; r < nranks; ++r) {
      int status = 0;
      if (reaped[static_cast<size_t>(r)] ||
          waitpid(pids[static_cast<size_t>(r)], &status, WNOHANG) == 0)
        continue;
      reaped[static_cast<size_t>(r)] = true;
      --running;
      const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      if (code != 0) {
        fprintf(stderr, "rank %d exited with %d\n", r, code);
        ++failures;
      }
    }
    if (!killed && running > 0 && nowSec() > deadline) {
      fprintf(stderr, "ranks still running after 120 s: killing them\n");
      for (int r = 0; r < nranks; ++r)
        if (!reaped[static_cast<size_t>(r)]) kill(pids[static_cast<size_t>(r)], SIGKILL);
      killed = true;
    }
    usleep(10000);
  }
  return failures == 0 ? 0 : 1;
}
