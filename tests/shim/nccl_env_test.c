/* NCCL's environment as an NCCL program sets it: NCCL_COMM_ID set by the program itself
 * (setenv before its first NCCL call), every rank calling ncclGetUniqueId, as NCCL allows with
 * NCCL_COMM_ID; the shim must not write Loom's variables into the environment that a child
 * process inherits. Run by run.sh with NCCL_SOCKET_IFNAME and NCCL_DEBUG set, whose log it
 * checks. usage: nccl_env_test PORT */
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

int main(int argc, char** argv) {
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
