// loom-call-cost (and, built with LOOM_CALL_COST_MPI, mpi-call-cost): CALLS sum all-reduces
// of BYTES bytes of floats, back to back on pre-faulted buffers, for bench/call_cost.sh's
// per-call account. Only those calls run under valgrind's instrumentation (callgrind's client
// requests, no-ops outside valgrind): start-up, the warm-up calls and the check stay out of
// the count. The result of the last call is checked against the sum of the ranks' inputs
// computed here, and the time per call printed:
//   calls <CALLS> bytes <BYTES> us_per_call <t> [wrong <n>]
// Loom's ranks come from the environment (loomCommInitFromEnv: LOOM_RANK, LOOM_WORLD_SIZE,
// LOOM_COMM_ID, or torchrun's, Open MPI's or Slurm's); the MPI build runs under mpirun.
// Exit status: 0 when every element is right, 1 when one is not, 2 on bad usage or errors.
#include <valgrind/callgrind.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#ifdef LOOM_CALL_COST_MPI
#include <mpi.h>
#else
#include "loom/loom.h"
#endif

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

long parse(const char* text, long lo, long hi) {
  char* end = nullptr;
  const long v = std::strtol(text, &end, 10);
  return end == text || *end != '\0' || v < lo || v > hi ? -1 : v;
}

}  // namespace

int main(int argc, char** argv) {
  const long bytes = argc == 3 ? parse(argv[1], 4, 1L << 30) : -1;
  const long calls = argc == 3 ? parse(argv[2], 1, 1L << 30) : -1;
  if (bytes < 0 || calls < 0) {
    std::fprintf(stderr, "usage: %s BYTES CALLS (BYTES from 4, CALLS from 1)\n", argv[0]);
    return 2;
  }
  const size_t count = static_cast<size_t>(bytes) / sizeof(float);
  int rank = 0, nranks = 1;
#ifdef LOOM_CALL_COST_MPI
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &nranks);
  auto allReduce = [&](const float* in, float* out) {
    return MPI_Allreduce(in, out, static_cast<int>(count), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD) ==
           MPI_SUCCESS;
  };
#else
  loomComm_t comm = nullptr;
  if (loomCommInitFromEnv(&comm, nullptr) != loomSuccess) {
    std::fprintf(stderr, "loom-call-cost: %s\n", loomGetLastError(comm));
    return 2;
  }
  loomCommUserRank(comm, &rank);
  loomCommCount(comm, &nranks);
  auto allReduce = [&](const float* in, float* out) {
    return loomAllReduce(in, out, count, loomFloat, loomSum, comm, nullptr) == loomSuccess;
  };
#endif
  // Small integers, so every order of summing gives the same floats. Buffers on a cache line of
  // their own, so that the kernels' alignment head (and so the count) does not depend on where
  // the heap happened to put them.
  struct Aligned {
    float* p;
    explicit Aligned(size_t n)
        : p(static_cast<float*>(std::aligned_alloc(64, (n * sizeof(float) + 63) / 64 * 64 + 64))) {}
    ~Aligned() { std::free(p); }
    float& operator[](size_t i) { return p[i]; }
    float* data() { return p; }
  } send(count), recv(count);
  for (size_t i = 0; i < count; ++i) send[i] = static_cast<float>((rank + 1) * (i % 7 + 1));
  std::memset(recv.data(), 0, count * sizeof(float));
  bool ok = true;
  for (int i = 0; i < 200 && ok; ++i) ok = allReduce(send.data(), recv.data());
  std::memset(recv.data(), 0, count * sizeof(float));

  CALLGRIND_START_INSTRUMENTATION;
  const double t0 = now();
  for (long i = 0; i < calls && ok; ++i) ok = allReduce(send.data(), recv.data());
  const double t1 = now();
  CALLGRIND_STOP_INSTRUMENTATION;

  long wrong = 0;
  const double ranksSum = nranks * (nranks + 1) / 2.0;
  for (size_t i = 0; i < count; ++i)
    if (recv[i] != static_cast<float>(ranksSum * static_cast<double>(i % 7 + 1))) ++wrong;
  if (!ok) {
#ifdef LOOM_CALL_COST_MPI
    std::fprintf(stderr, "mpi-call-cost: MPI_Allreduce failed\n");
#else
    std::fprintf(stderr, "loom-call-cost: %s\n", loomGetLastError(comm));
#endif
  } else if (rank == 0 || wrong > 0) {
    std::printf("calls %ld bytes %ld us_per_call %.4f%s%ld\n", calls, bytes,
                (t1 - t0) * 1e6 / static_cast<double>(calls), wrong ? " wrong " : "",
                wrong ? wrong : 0L);
  }
#ifdef LOOM_CALL_COST_MPI
  MPI_Finalize();
#else
  loomCommDestroy(comm);
#endif
  return !ok ? 2 : wrong > 0 ? 1 : 0;
}
