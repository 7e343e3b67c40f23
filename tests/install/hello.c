/* Built out of tree against an installed Loom by tests/install/run.sh, which starts it as 2
 * ranks with LOOM_RANK, LOOM_WORLD_SIZE and LOOM_COMM_ID set: it joins the world communicator
 * with loomCommInitFromEnv, all-reduces, and checks the result against a sum computed here. */
#include <loom/loom.h>
#include <stdint.h>
#include <stdio.h>

#define COUNT 1000

static int fail(const char* what, loomResult_t r, loomComm_t comm) {
  fprintf(stderr, "hello_c: %s: %s: %s\n", what, loomGetErrorString(r), loomGetLastError(comm));
  return 1;
}

int main(void) {
  int version = 0, rank = -1, nranks = 0, i, q;
  int32_t send[COUNT], recv[COUNT];
  loomComm_t comm = NULL;
  loomResult_t r = loomGetVersion(&version);
  if (r != loomSuccess) return fail("loomGetVersion", r, NULL);
  if (version != LOOM_VERSION_CODE) {
    fprintf(stderr, "hello_c: library version %d, header %d\n", version, LOOM_VERSION_CODE);
    return 1;
  }
  r = loomCommInitFromEnv(&comm, NULL);
  if (r != loomSuccess) return fail("loomCommInitFromEnv", r, NULL);
  if ((r = loomCommUserRank(comm, &rank)) != loomSuccess) return fail("loomCommUserRank", r, comm);
  if ((r = loomCommCount(comm, &nranks)) != loomSuccess) return fail("loomCommCount", r, comm);
  for (i = 0; i < COUNT; ++i) send[i] = (rank + 1) * 1000 + i;
  r = loomAllReduce(send, recv, COUNT, loomInt32, loomSum, comm, NULL);
  if (r != loomSuccess) return fail("loomAllReduce", r, comm);
  for (i = 0; i < COUNT; ++i) {
    int32_t want = 0;
    for (q = 0; q < nranks; ++q) want += (q + 1) * 1000 + i;
    if (recv[i] != want) {
      fprintf(stderr, "hello_c: rank %d: element %d is %d, want %d\n", rank, i, (int)recv[i],
              (int)want);
      return 1;
    }
  }
  if ((r = loomCommDestroy(comm)) != loomSuccess) return fail("loomCommDestroy", r, NULL);
  printf("hello_c: rank %d of %d: all-reduce of %d int32 OK (Loom %d)\n", rank, nranks, COUNT,
         version);
  return 0;
}
