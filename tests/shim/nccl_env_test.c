/* NCCL's environment as an NCCL program sets it: NCCL_COMM_ID set by the program itself
 * (setenv before its first NCCL call), every rank calling ncclGetUniqueId, as NCCL allows with
 * NCCL_COMM_ID; the shim must not write Loom's variables into the environment that a child
 * process inherits. Run by run.sh with NCCL_SOCKET_IFNAME and NCCL_DEBUG set, whose log it
 * checks. usage: nccl_env_test PORT; nccl_env_test PORT timeout: timeoutMain below. */
#define _GNU_SOURCE
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define N 2
#define COUNT 1000

static int rankMain(int rank) {
  ncclUniqueId id;
  ncclComm_t comm;
  if (ncclGetUniqueId(&id) != ncclSuccess) {
    fprintf(stderr, "rank %d: ncclGetUniqueId: %s\n", rank, ncclGetLastError(NULL));
    return 1;
  }
  if (ncclCommInitRank(&comm, N, id, rank) != ncclSuccess) {
    fprintf(stderr, "rank %d: ncclCommInitRank: %s\n", rank, ncclGetLastError(NULL));
    return 1;
  }
  float x[COUNT], y[COUNT];
  for (int i = 0; i < COUNT; i++) x[i] = (float)(rank + 1) * (float)(i % 13);
  if (ncclAllReduce(x, y, COUNT, ncclFloat, ncclSum, comm, NULL) != ncclSuccess) {
    fprintf(stderr, "rank %d: ncclAllReduce: %s\n", rank, ncclGetLastError(comm));
    return 1;
  }
  int bad = 0;
  for (int i = 0; i < COUNT; i++) bad += y[i] != 3.0f * (float)(i % 13);
  ncclCommDestroy(comm);
  const char* leaked[] = {"LOOM_COMM_ID", "LOOM_DEBUG", "LOOM_SOCKET_IFNAME", "LOOM_DEBUG_SUBSYS"};
  for (int i = 0; i < 4; i++)
    if (getenv(leaked[i]) != NULL) {
      fprintf(stderr, "rank %d: %s=%s is in the environment children inherit\n", rank, leaked[i],
              getenv(leaked[i]));
      bad++;
    }
  if (bad) fprintf(stderr, "rank %d: %d wrong\n", rank, bad);
  return bad != 0;
}

/* Non-blocking: rank 1 never joins rank 0's all-reduce. The timeout reaches rank 0 through
 * ncclCommGetAsyncError as a blocking call's result would (ncclTimeout where the header has it),
 * with its text in ncclGetLastError. Run with LOOM_TIMEOUT_MS=1500. */
static int timeoutMain(int rank) {
  ncclUniqueId id;
  ncclComm_t comm;
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  ncclResult_t st = ncclInProgress;
  if (ncclGetUniqueId(&id) != ncclSuccess) return 1;
  ncclResult_t r = ncclCommInitRankConfig(&comm, N, id, rank, &cfg);
  if (r != ncclSuccess && r != ncclInProgress) return 1;
  while (st == ncclInProgress)
    if (ncclCommGetAsyncError(comm, &st) != ncclSuccess) return 1;
  if (st != ncclSuccess) return 1;
  if (rank == 1) {
    sleep(4);
    return 0;
  }
  int x = 1, y = 0;
  r = ncclAllReduce(&x, &y, 1, ncclInt32, ncclSum, comm, NULL);
  if (r != ncclSuccess && r != ncclInProgress) return 1;
  st = ncclInProgress;
  while (st == ncclInProgress)
    if (ncclCommGetAsyncError(comm, &st) != ncclSuccess) return 1;
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 30, 0)
  const ncclResult_t want = ncclTimeout;
#else
  const ncclResult_t want = ncclRemoteError;
#endif
  const char* text = ncclGetLastError(comm);
  if (st != want || strstr(text, "timed out") == NULL) {
    fprintf(stderr, "rank 0: asyncError %d (want %d), last error \"%s\"\n", (int)st, (int)want,
            text);
    return 1;
  }
  ncclCommAbort(comm);
  return 0;
}

int main(int argc, char** argv) {
  if (argc == 3 && strcmp(argv[2], "timeout") == 0) {
    char commId[64];
    snprintf(commId, sizeof(commId), "127.0.0.1:%s", argv[1]);
    setenv("NCCL_COMM_ID", commId, 1);
    pid_t pids[N];
    int failed = 0;
    for (int r = 0; r < N; r++)
      if ((pids[r] = fork()) == 0) {
        alarm(60);
        _exit(timeoutMain(r));
      }
    for (int r = 0; r < N; r++) {
      int st = 0;
      waitpid(pids[r], &st, 0);
      failed += !WIFEXITED(st) || WEXITSTATUS(st) != 0;
    }
    printf("%s: a non-blocking all-reduce's timeout through ncclCommGetAsyncError, %d failed\n",
           failed ? "FAIL" : "PASS", failed);
    return failed != 0;
  }
  if (argc != 2) return 2;
  char commId[64];
  snprintf(commId, sizeof(commId), "127.0.0.1:%s", argv[1]);
  setenv("NCCL_COMM_ID", commId, 1);
  pid_t pids[N];
  for (int r = 0; r < N; r++) {
    pids[r] = fork();
    if (pids[r] == 0) {
      alarm(60);
      _exit(rankMain(r));
    }
  }
  int failed = 0;
  for (int r = 0; r < N; r++) {
    int st = 0;
    waitpid(pids[r], &st, 0);
    failed += !WIFEXITED(st) || WEXITSTATUS(st) != 0;
  }
  printf("%s: NCCL_COMM_ID from setenv, %d ranks, %d failed\n", failed ? "FAIL" : "PASS", N,
         failed);
  return failed != 0;
}
