/* A program written against NCCL's own header, as a user of NCCL writes one: it
 * forks N ranks, rank 0 makes the unique id and passes it down a pipe, and every
 * rank runs each collective on host buffers and checks the result against a
 * scalar reference computed here from every rank's inputs. Built with
 * `cc -I<cuda>/include nccl_host_test.c -lnccl`; it knows nothing of Loom, and
 * runs on whichever libnccl.so.2 the loader finds (tests/shim/run.sh points it
 * at Loom's shim).
 * usage: nccl_host_test NRANKS       exit 0 when every check passed on every rank */
#define _POSIX_C_SOURCE 200809L /* nanosleep under -std=c11 */
#include <math.h>
#include <nccl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static int gRank, gN, gFailures;

#define CHECK_OK(call)                                                                             \
  do {                                                                                             \
    ncclResult_t r_ = (call);                                                                      \
    if (r_ != ncclSuccess) {                                                                       \
      fprintf(stderr, "rank %d: %s:%d: %s -> %d (%s): %s\n", gRank, __FILE__, __LINE__, #call, r_, \
              ncclGetErrorString(r_), ncclGetLastError(NULL));                                     \
      gFailures++;                                                                                 \
    }                                                                                              \
  } while (0)

#define EXPECT(cond, ...)                                     \
  do {                                                        \
    if (!(cond)) {                                            \
      fprintf(stderr, "rank %d: line %d: ", gRank, __LINE__); \
      fprintf(stderr, __VA_ARGS__);                           \
      fprintf(stderr, "\n");                                  \
      gFailures++;                                            \
    }                                                         \
  } while (0)

/* ---- Values: small integers, exact in every type (half and bfloat16 too) ---- */

static int isSigned(ncclDataType_t t) {
  return t == ncclInt8 || t == ncclInt32 || t == ncclInt64 || t == ncclFloat16 ||
         t == ncclFloat32 || t == ncclFloat64 || t == ncclBfloat16;
}
static int isFloat(ncclDataType_t t) {
  return t == ncclFloat16 || t == ncclFloat32 || t == ncclFloat64 || t == ncclBfloat16;
}
static size_t sizeOf(ncclDataType_t t) {
  switch (t) {
    case ncclInt8:
    case ncclUint8:
      return 1;
    case ncclFloat16:
    case ncclBfloat16:
      return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32:
      return 4;
    default:
      return 8;
  }
}

/* Rank r's element i: in [-3, 3] for signed types, [0, 6] otherwise. */
static double value(int r, size_t i, ncclDataType_t t) {
  int v = (int)((r * 5 + i * 3 + 1) % 7);
  return isSigned(t) ? v - 3 : v;
}

static uint16_t toHalf(double v) { /* exact for integers of magnitude < 2048 */
  if (v == 0) return 0;
  uint16_t sign = v < 0 ? 0x8000 : 0;
  double a = fabs(v);
  int e = 0;
  while (a >= 2) {
    a /= 2;
    e++;
  }
  while (a < 1) {
    a *= 2;
    e--;
  }
  return (uint16_t)(sign | ((e + 15) << 10) | (uint16_t)lround((a - 1) * 1024));
}
static double fromHalf(uint16_t h) {
  int e = (h >> 10) & 0x1f;
  double m = h & 0x3ff;
  double v = e == 0 ? ldexp(m, -24) : ldexp(1 + m / 1024, e - 15);
  return (h & 0x8000) ? -v : v;
}
static uint16_t toBf16(double v) {
  float f = (float)v;
  uint32_t u;
  memcpy(&u, &f, 4);
  return (uint16_t)(u >> 16); /* exact: small integers need 8 bits of significand */
}
static double fromBf16(uint16_t b) {
  uint32_t u = (uint32_t)b << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static void put(void* buf, size_t i, ncclDataType_t t, double v) {
  switch (t) {
    case ncclInt8:
      ((int8_t*)buf)[i] = (int8_t)v;
      break;
    case ncclUint8:
      ((uint8_t*)buf)[i] = (uint8_t)v;
      break;
    case ncclInt32:
      ((int32_t*)buf)[i] = (int32_t)v;
      break;
    case ncclUint32:
      ((uint32_t*)buf)[i] = (uint32_t)v;
      break;
    case ncclInt64:
      ((int64_t*)buf)[i] = (int64_t)v;
      break;
    case ncclUint64:
      ((uint64_t*)buf)[i] = (uint64_t)v;
      break;
    case ncclFloat16:
      ((uint16_t*)buf)[i] = toHalf(v);
      break;
    case ncclBfloat16:
      ((uint16_t*)buf)[i] = toBf16(v);
      break;
    case ncclFloat32:
      ((float*)buf)[i] = (float)v;
      break;
    default:
      ((double*)buf)[i] = v;
      break;
  }
}
static double get(const void* buf, size_t i, ncclDataType_t t) {
  switch (t) {
    case ncclInt8:
      return ((const int8_t*)buf)[i];
    case ncclUint8:
      return ((const uint8_t*)buf)[i];
    case ncclInt32:
      return ((const int32_t*)buf)[i];
    case ncclUint32:
      return ((const uint32_t*)buf)[i];
    case ncclInt64:
      return (double)((const int64_t*)buf)[i];
    case ncclUint64:
      return (double)((const uint64_t*)buf)[i];
    case ncclFloat16:
      return fromHalf(((const uint16_t*)buf)[i]);
    case ncclBfloat16:
      return fromBf16(((const uint16_t*)buf)[i]);
    case ncclFloat32:
      return ((const float*)buf)[i];
    default:
      return ((const double*)buf)[i];
  }
}

/* The reference: op over ranks [0, n) of value(r, i), with scale applied first. */
static double reference(ncclRedOp_t op, size_t i, ncclDataType_t t, int n, double scale) {
  double acc = value(0, i, t) * scale;
  for (int r = 1; r < n; r++) {
    double v = value(r, i, t) * scale;
    if (op == ncclProd)
      acc *= v;
    else if (op == ncclMax)
      acc = v > acc ? v : acc;
    else if (op == ncclMin)
      acc = v < acc ? v : acc;
    else
      acc += v;
  }
  if (op == ncclAvg) acc = isFloat(t) ? acc / n : (double)((long long)acc / n); /* C division */
  return acc;
}

static int near(double got, double want, ncclDataType_t t) {
  if (!isFloat(t)) return got == want;
  double tol = (t == ncclFloat16 || t == ncclBfloat16) ? 1e-2 : 1e-6;
  return fabs(got - want) <= tol * (1 + fabs(want));
}

static void* fill(size_t count, ncclDataType_t t, int r) {
  void* b = malloc(count * sizeOf(t) + 1);
  for (size_t i = 0; i < count; i++) put(b, i, t, value(r, i, t));
  return b;
}

/* ---- The checks ---- */

static void checkAllReduce(ncclComm_t comm, size_t count) {
  const ncclDataType_t types[] = {ncclInt8,   ncclUint8,   ncclInt32,   ncclUint32,  ncclInt64,
                                  ncclUint64, ncclFloat16, ncclFloat32, ncclFloat64, ncclBfloat16};
  const ncclRedOp_t ops[] = {ncclSum, ncclProd, ncclMax, ncclMin, ncclAvg};
  for (size_t ti = 0; ti < sizeof(types) / sizeof(types[0]); ti++)
    for (size_t oi = 0; oi < sizeof(ops) / sizeof(ops[0]); oi++) {
      ncclDataType_t t = types[ti];
      ncclRedOp_t op = ops[oi];
      void* send = fill(count, t, gRank);
      void* recv = malloc(count * sizeOf(t) + 1);
      int inPlace = (ti + oi) % 2; /* half the cases run in place */
      CHECK_OK(ncclAllReduce(send, inPlace ? send : recv, count, t, op, comm, NULL));
      const void* out = inPlace ? send : recv;
      int bad = 0;
      for (size_t i = 0; i < count && !bad; i++) {
        double want = reference(op, i, t, gN, 1.0), got = get(out, i, t);
        if (!near(got, want, t)) {
          EXPECT(0, "allreduce type %d op %d [%zu]: got %g want %g", t, op, i, got, want);
          bad = 1;
        }
      }
      free(send);
      free(recv);
    }
}

static void checkPreMulSum(ncclComm_t comm, size_t count) {
  const ncclDataType_t types[] = {ncclFloat32, ncclFloat64};
  for (int k = 0; k < 2; k++) {
    ncclDataType_t t = types[k];
    float sf = 2.5f;
    double sd = 2.5;
    ncclRedOp_t op;
    CHECK_OK(ncclRedOpCreatePreMulSum(&op, t == ncclFloat32 ? (void*)&sf : (void*)&sd, t,
                                      ncclScalarHostImmediate, comm));
    EXPECT(op >= ncclNumOps, "PreMulSum op %d is a built-in value", op);
    void* send = fill(count, t, gRank);
    void* recv = malloc(count * sizeOf(t));
    CHECK_OK(ncclAllReduce(send, recv, count, t, op, comm, NULL));
    for (size_t i = 0; i < count; i++)
      if (!near(get(recv, i, t), reference(ncclSum, i, t, gN, 2.5), t)) {
        EXPECT(0, "premulsum type %d [%zu]: got %g want %g", t, i, get(recv, i, t),
               reference(ncclSum, i, t, gN, 2.5));
        break;
      }
    CHECK_OK(ncclRedOpDestroy(op, comm));
    free(send);
    free(recv);
  }
}

/* buf holds every rank's inputs, block r = rank r's count int64 values. */
static void expectRankBlocks(const int64_t* buf, size_t count, const char* what, int tag) {
  for (int r = 0; r < gN; r++)
    for (size_t i = 0; i < count; i++)
      if (buf[(size_t)r * count + i] != value(r, i, ncclInt64)) {
        EXPECT(0, "%s %d: block %d [%zu]: got %lld", what, tag, r, i,
               (long long)buf[(size_t)r * count + i]);
        return;
      }
}

static void checkRooted(ncclComm_t comm, size_t count) {
  for (int root = 0; root < gN; root++) {
    /* Broadcast, out of place and in place (ncclBcast). */
    int32_t* b = fill(count, ncclInt32, gRank);
    int32_t* out = calloc(count, 4);
    CHECK_OK(ncclBroadcast(b, out, count, ncclInt32, root, comm, NULL));
    CHECK_OK(ncclBcast(b, count, ncclInt32, root, comm, NULL));
    for (size_t i = 0; i < count; i++)
      if (out[i] != value(root, i, ncclInt32) || b[i] != value(root, i, ncclInt32)) {
        EXPECT(0, "broadcast root %d [%zu]: got %d/%d want %g", root, i, out[i], b[i],
               value(root, i, ncclInt32));
        break;
      }
    /* Reduce: only the root's output is defined. */
    double* s = fill(count, ncclFloat64, gRank);
    double* rr = calloc(count, 8);
    CHECK_OK(ncclReduce(s, rr, count, ncclFloat64, ncclSum, root, comm, NULL));
    for (size_t i = 0; gRank == root && i < count; i++)
      if (!near(rr[i], reference(ncclSum, i, ncclFloat64, gN, 1), ncclFloat64)) {
        EXPECT(0, "reduce root %d [%zu]: got %g", root, i, rr[i]);
        break;
      }
    /* Gather and scatter: rank r's block of the root's buffer. */
    int64_t* mine = fill(count, ncclInt64, gRank);
    int64_t* all = calloc(count * (size_t)gN, 8);
    CHECK_OK(ncclGather(mine, all, count, ncclInt64, root, comm, NULL));
    if (gRank == root) expectRankBlocks(all, count, "gather", root);
    if (gRank == root)
      for (int r = 0; r < gN; r++)
        for (size_t i = 0; i < count; i++) all[(size_t)r * count + i] = r * 1000 + (int64_t)i;
    CHECK_OK(ncclScatter(all, mine, count, ncclInt64, root, comm, NULL));
    for (size_t i = 0; i < count; i++)
      if (mine[i] != gRank * 1000 + (int64_t)i) {
        EXPECT(0, "scatter root %d [%zu]: got %lld", root, i, (long long)mine[i]);
        break;
      }
    free(b), free(out), free(s), free(rr), free(mine), free(all);
  }
}

static void checkGatherScatterFamily(ncclComm_t comm, size_t count) {
  const size_t n = (size_t)gN;
  /* AllGather: out of place, then in place (my block already in the output). */
  int64_t* s = fill(count, ncclInt64, gRank);
  int64_t* g = calloc(count * n, 8);
  CHECK_OK(ncclAllGather(s, g, count, ncclInt64, comm, NULL));
  for (int pass = 0; pass < 2; pass++) {
    expectRankBlocks(g, count, "allgather pass", pass);
    memset(g, 0, count * n * 8);
    for (size_t i = 0; i < count; i++) g[(size_t)gRank * count + i] = value(gRank, i, ncclInt64);
    if (pass == 0)
      CHECK_OK(ncclAllGather(g + (size_t)gRank * count, g, count, ncclInt64, comm, NULL));
  }
  /* ReduceScatter: rank r gets block r of the reduction of every rank's whole input. */
  const ncclRedOp_t ops[] = {ncclSum, ncclMax};
  for (int k = 0; k < 2; k++) {
    float* in = fill(count * n, ncclFloat32, gRank);
    float* o = calloc(count, 4);
    CHECK_OK(ncclReduceScatter(in, o, count, ncclFloat32, ops[k], comm, NULL));
    for (size_t i = 0; i < count; i++) {
      double want = reference(ops[k], (size_t)gRank * count + i, ncclFloat32, gN, 1);
      if (!near(o[i], want, ncclFloat32)) {
        EXPECT(0, "reducescatter op %d [%zu]: got %g want %g", ops[k], i, o[i], want);
        break;
      }
    }
    free(in), free(o);
  }
  /* AlltoAll: block j of rank i's input lands in block i of rank j's output. */
  int32_t* a = malloc(count * n * 4);
  int32_t* b = calloc(count * n, 4);
  for (size_t j = 0; j < n; j++)
    for (size_t i = 0; i < count; i++) a[j * count + i] = gRank * 100000 + (int)(j * count + i);
  CHECK_OK(ncclAlltoAll(a, b, count, ncclInt32, comm, NULL));
  for (int src = 0; src < gN; src++)
    for (size_t i = 0; i < count; i++)
      if (b[(size_t)src * count + i] != src * 100000 + (int)((size_t)gRank * count + i)) {
        EXPECT(0, "alltoall from %d [%zu]: got %d", src, i, b[(size_t)src * count + i]);
        src = gN;
        break;
      }
  free(s), free(g), free(a), free(b);
}

static void checkSendRecv(ncclComm_t comm, size_t count) {
  int next = (gRank + 1) % gN, prev = (gRank + gN - 1) % gN;
  double* s = fill(count, ncclFloat64, gRank);
  double* r = calloc(count, 8);
  double* self = calloc(count, 8);
  CHECK_OK(ncclGroupStart());
  CHECK_OK(ncclSend(s, count, ncclFloat64, next, comm, NULL));
  CHECK_OK(ncclRecv(r, count, ncclFloat64, prev, comm, NULL));
  CHECK_OK(ncclSend(s, count, ncclFloat64, gRank, comm, NULL));
  CHECK_OK(ncclRecv(self, count, ncclFloat64, gRank, comm, NULL));
  CHECK_OK(ncclGroupEnd());
  for (size_t i = 0; i < count; i++)
    if (r[i] != value(prev, i, ncclFloat64) || self[i] != value(gRank, i, ncclFloat64)) {
      EXPECT(0, "sendrecv [%zu]: from %d got %g, from self got %g", i, prev, r[i], self[i]);
      break;
    }
  free(s), free(r), free(self);
}

static void checkErrors(ncclComm_t comm) {
  int x = 1, y = 0;
  ncclResult_t r = ncclAllReduce(&x, &y, 1, ncclInt32, ncclSum, NULL, NULL);
  EXPECT(r == ncclInvalidArgument && strstr(ncclGetLastError(NULL), "comm"), "NULL comm: %d '%s'",
         r, ncclGetLastError(NULL));
  r = ncclAllReduce(&x, &y, 1, (ncclDataType_t)99, ncclSum, comm, NULL);
  EXPECT(r == ncclInvalidArgument && strstr(ncclGetLastError(NULL), "datatype"),
         "bad datatype: %d '%s'", r, ncclGetLastError(NULL));
  r = ncclAllReduce(&x, &y, 1, ncclInt32, (ncclRedOp_t)77, comm, NULL);
  EXPECT(r == ncclInvalidArgument && strstr(ncclGetLastError(NULL), "op"), "bad op: %d '%s'", r,
         ncclGetLastError(NULL));
  r = ncclBroadcast(&x, &y, 1, ncclInt32, gN, comm, NULL);
  EXPECT(r == ncclInvalidArgument && strstr(ncclGetLastError(NULL), "root"), "bad root: %d '%s'", r,
         ncclGetLastError(NULL));
  r = ncclGather(&x, &y, 1, ncclInt32, -1, comm, NULL);
  EXPECT(r == ncclInvalidArgument && strstr(ncclGetLastError(NULL), "root"),
         "gather bad root: %d '%s'", r, ncclGetLastError(NULL));
  r = ncclSend(NULL, 4, ncclInt32, 0, comm, NULL);
  EXPECT(r == ncclInvalidArgument && strstr(ncclGetLastError(NULL), "sendbuff"),
         "NULL sendbuff: %d '%s'", r, ncclGetLastError(NULL));
  EXPECT(strncmp(ncclGetLastError(NULL), "ncclSend", 8) == 0,
         "last error should name ncclSend: '%s'", ncclGetLastError(NULL));
  r = ncclGroupEnd();
  EXPECT(r == ncclInvalidUsage, "ncclGroupEnd without a start: %d", r);
  ncclConfig_t bad = NCCL_CONFIG_INITIALIZER;
  bad.magic = 0;
  ncclUniqueId id;
  memset(&id, 0, sizeof(id));
  ncclComm_t c;
  r = ncclCommInitRankConfig(&c, 1, id, 0, &bad);
  EXPECT(r == ncclInvalidArgument && strstr(ncclGetLastError(NULL), "config"),
         "bad config: %d '%s'", r, ncclGetLastError(NULL));
  EXPECT(strlen(ncclGetErrorString(ncclInvalidArgument)) > 0, "empty error string");
  ncclResult_t async = ncclInternalError;
  CHECK_OK(ncclCommGetAsyncError(comm, &async));
  EXPECT(async == ncclSuccess, "async error %d on a healthy communicator", async);
  /* Loom's own bitwise operations (0x40000000..2) are not NCCL's. */
  r = ncclAllReduce(&x, &y, 1, ncclInt32, (ncclRedOp_t)0x40000000, comm, NULL);
  EXPECT(r == ncclInvalidArgument && strstr(ncclGetLastError(NULL), "op"),
         "Loom's bitwise and: %d '%s'", r, ncclGetLastError(NULL));
  /* The error names the NCCL call made, and no Loom function. */
  r = ncclBcast(&x, 1, ncclInt32, gN, comm, NULL);
  EXPECT(r == ncclInvalidArgument && strncmp(ncclGetLastError(NULL), "ncclBcast:", 10) == 0 &&
             strstr(ncclGetLastError(NULL), "loom") == NULL,
         "ncclBcast's error: '%s'", ncclGetLastError(NULL));
  /* A NULL communicator (ncclCommSplit's with NCCL_SPLIT_NOCOLOR) is nothing to end. */
  EXPECT(ncclCommDestroy(NULL) == ncclSuccess, "ncclCommDestroy(NULL)");
  EXPECT(ncclCommAbort(NULL) == ncclSuccess, "ncclCommAbort(NULL)");
  r = ncclCommRevoke(NULL, 0);
  EXPECT(r == ncclInvalidArgument && strstr(ncclGetLastError(NULL), "comm"),
         "ncclCommRevoke(NULL): %d '%s'", r, ncclGetLastError(NULL));
  /* Windows: registered once, deregistered once; a second deregister is refused, not freed. */
  ncclWindow_t win;
  CHECK_OK(ncclCommWindowRegister(comm, &x, sizeof(x), &win, 0));
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 30, 0)
  void* base = NULL;
  CHECK_OK(ncclWinGetUserPtr(comm, win, &base));
  EXPECT(base == &x, "ncclWinGetUserPtr gave %p, not %p", base, (void*)&x);
  uint64_t bytes = 1;
  CHECK_OK(ncclCommMemStats(comm, ncclStatGpuMemTotal, &bytes));
  EXPECT(bytes == 0, "host-only shim reports %llu bytes of GPU memory", (unsigned long long)bytes);
  r = ncclCommGrow(comm, gN + 1, NULL, -1, &c, NULL);
  EXPECT(r == ncclInvalidUsage && strstr(ncclGetLastError(NULL), "not supported"),
         "ncclCommGrow: %d '%s'", r, ncclGetLastError(NULL));
#endif
  CHECK_OK(ncclCommWindowDeregister(comm, win));
  r = ncclCommWindowDeregister(comm, win);
  EXPECT(r == ncclInvalidArgument && strstr(ncclGetLastError(NULL), "win"),
         "second deregister: %d '%s'", r, ncclGetLastError(NULL));
}

/* Ranks of one parity form a communicator; its all-reduce sums their inputs. */
static void checkSplit(ncclComm_t comm, size_t count) {
  ncclComm_t sub;
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.commName = "parity";
  CHECK_OK(ncclCommSplit(comm, gRank % 2, gRank, &sub, &cfg));
  int n = 0, me = -1;
  CHECK_OK(ncclCommCount(sub, &n));
  CHECK_OK(ncclCommUserRank(sub, &me));
  EXPECT(n == (gN + 1 - gRank % 2) / 2 && me == gRank / 2, "split: size %d rank %d", n, me);
  int32_t* s = fill(count, ncclInt32, gRank);
  int32_t* o = calloc(count, 4);
  CHECK_OK(ncclAllReduce(s, o, count, ncclInt32, ncclSum, sub, NULL));
  for (size_t i = 0; i < count; i++) {
    double want = 0;
    for (int r = gRank % 2; r < gN; r += 2) want += value(r, i, ncclInt32);
    if (o[i] != want) {
      EXPECT(0, "split allreduce [%zu]: got %d want %g", i, o[i], want);
      break;
    }
  }
  CHECK_OK(ncclCommDestroy(sub));
  free(s), free(o);
}

/* A config that leaves blocking undefined makes a blocking communicator, as NCCL's does, even
 * split from a non-blocking one: the split returns ncclSuccess and the child works at once. */
static void checkSplitOfNonBlocking(ncclComm_t comm) {
  ncclConfig_t nb = NCCL_CONFIG_INITIALIZER;
  nb.blocking = 0;
  ncclComm_t parent = NULL, child = NULL;
  ncclResult_t r = ncclCommSplit(comm, 0, gRank, &parent, &nb), state = ncclInProgress;
  EXPECT(r == ncclSuccess || r == ncclInProgress, "non-blocking split: %d '%s'", r,
         ncclGetLastError(NULL));
  for (int i = 0; i < 30000 && state == ncclInProgress; i++) {
    if (ncclCommGetAsyncError(parent, &state) != ncclSuccess) break;
    const struct timespec ms = {0, 1000000};
    if (state == ncclInProgress) nanosleep(&ms, NULL);
  }
  EXPECT(state == ncclSuccess, "non-blocking split: state %d", state);
  ncclConfig_t named = NCCL_CONFIG_INITIALIZER;
  named.commName = "named-only";
  r = ncclCommSplit(parent, 0, gRank, &child, &named);
  EXPECT(r == ncclSuccess && child != NULL, "split of a non-blocking comm, blocking undefined: %d",
         r);
  if (r == ncclSuccess && child != NULL) {
    int32_t x = gRank + 1, sum = 0;
    r = ncclAllReduce(&x, &sum, 1, ncclInt32, ncclSum, child, NULL);
    EXPECT(r == ncclSuccess && sum == gN * (gN + 1) / 2, "child allreduce: %d, sum %d", r, sum);
    CHECK_OK(ncclCommDestroy(child));
  }
  CHECK_OK(ncclCommDestroy(parent));
}

/* The last rank leaves; the others shrink and sum their inputs. */
static void checkShrink(ncclComm_t comm) {
  if (gRank == gN - 1) return;
  int leave = gN - 1;
  ncclComm_t small;
  CHECK_OK(ncclCommShrink(comm, &leave, 1, &small, NULL, NCCL_SHRINK_DEFAULT));
  int n = 0;
  CHECK_OK(ncclCommCount(small, &n));
  EXPECT(n == gN - 1, "shrink: size %d", n);
  int32_t x = gRank + 1, sum = 0;
  CHECK_OK(ncclAllReduce(&x, &sum, 1, ncclInt32, ncclSum, small, NULL));
  EXPECT(sum == (gN - 1) * gN / 2, "shrink allreduce: got %d", sum);
  CHECK_OK(ncclCommDestroy(small));
}

/* One process, two ranks, one thread: ncclCommInitAll (or, grouped, ncclCommInitRank for each
 * rank between ncclGroupStart and ncclGroupEnd, as NCCL's guide has one thread initialise
 * several devices) and a grouped all-reduce. */
static void checkInitAll(int grouped) {
  ncclComm_t comms[2];
  if (grouped) {
    ncclUniqueId id;
    CHECK_OK(ncclGetUniqueId(&id));
    CHECK_OK(ncclGroupStart());
    for (int i = 0; i < 2; i++) CHECK_OK(ncclCommInitRank(&comms[i], 2, id, i));
    CHECK_OK(ncclGroupEnd());
  } else {
    CHECK_OK(ncclCommInitAll(comms, 2, NULL));
  }
  int32_t in[2][3] = {{1, 2, 3}, {10, 20, 30}}, out[2][3];
  CHECK_OK(ncclGroupStart());
  for (int i = 0; i < 2; i++)
    CHECK_OK(ncclAllReduce(in[i], out[i], 3, ncclInt32, ncclSum, comms[i], NULL));
  CHECK_OK(ncclGroupEnd());
  for (int i = 0; i < 2; i++)
    EXPECT(out[i][0] == 11 && out[i][1] == 22 && out[i][2] == 33, "initall rank %d: %d %d %d", i,
           out[i][0], out[i][1], out[i][2]);
  for (int i = 0; i < 2; i++) CHECK_OK(ncclCommDestroy(comms[i]));
}

static int runRank(ncclUniqueId id) {
  int version = 0;
  CHECK_OK(ncclGetVersion(&version));
  EXPECT(version == NCCL_VERSION_CODE, "version %d, header %d", version, NCCL_VERSION_CODE);
  ncclComm_t comm;
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 1;
  cfg.commName = "nccl-host-test";
  CHECK_OK(ncclCommInitRankConfig(&comm, gN, id, gRank, &cfg));
  if (gFailures) return 1;
  int n = 0, me = -1, dev = -2;
  CHECK_OK(ncclCommCount(comm, &n));
  CHECK_OK(ncclCommUserRank(comm, &me));
  CHECK_OK(ncclCommCuDevice(comm, &dev));
  EXPECT(n == gN && me == gRank && dev >= -1, "count %d rank %d device %d", n, me, dev);

  checkAllReduce(comm, 1031);
  checkAllReduce(comm, 1);
  checkPreMulSum(comm, 517);
  checkRooted(comm, 301);
  checkGatherScatterFamily(comm, 257);
  checkSendRecv(comm, 4099);
  checkSplit(comm, 129);
  checkSplitOfNonBlocking(comm);
  checkShrink(comm);
  checkErrors(comm);
  checkInitAll(0);
  checkInitAll(1);
  /* A large all-reduce: many transport slots, pipelined. */
  {
    size_t count = 1 << 18;
    float* s = fill(count, ncclFloat32, gRank);
    CHECK_OK(ncclAllReduce(s, s, count, ncclFloat32, ncclSum, comm, NULL));
    for (size_t i = 0; i < count; i += 97)
      if (!near(s[i], reference(ncclSum, i, ncclFloat32, gN, 1), ncclFloat32)) {
        EXPECT(0, "large allreduce [%zu]: got %g", i, s[i]);
        break;
      }
    free(s);
  }
  void* mem = NULL;
  void* handle = NULL;
  CHECK_OK(ncclMemAlloc(&mem, 1 << 16));
  CHECK_OK(ncclCommRegister(comm, mem, 1 << 16, &handle));
  CHECK_OK(ncclCommDeregister(comm, handle));
  CHECK_OK(ncclMemFree(mem));
  CHECK_OK(ncclCommFinalize(comm));
  CHECK_OK(ncclCommDestroy(comm));
  return gFailures ? 1 : 0;
}

int main(int argc, char** argv) {
  gN = argc > 1 ? atoi(argv[1]) : 2;
  if (gN < 2 || gN > 16) {
    fprintf(stderr, "usage: %s NRANKS (2..16)\n", argv[0]);
    return 2;
  }
  int pipes[16][2];
  for (int r = 1; r < gN; r++)
    if (pipe(pipes[r]) != 0) return perror("pipe"), 1;
  pid_t pids[16];
  for (int r = 0; r < gN; r++) {
    pids[r] = fork();
    if (pids[r] < 0) return perror("fork"), 1;
    if (pids[r] > 0) continue;
    alarm(240); /* a hang becomes a failure, never a stuck test */
    gRank = r;
    ncclUniqueId id;
    if (r == 0) {
      CHECK_OK(ncclGetUniqueId(&id));
      for (int p = 1; p < gN; p++)
        if (write(pipes[p][1], &id, sizeof(id)) != (ssize_t)sizeof(id)) _exit(1);
    } else if (read(pipes[r][0], &id, sizeof(id)) != (ssize_t)sizeof(id)) {
      _exit(1);
    }
    _exit(gFailures ? 1 : runRank(id));
  }
  int failed = 0;
  for (int r = 0; r < gN; r++) {
    int st = 0;
    waitpid(pids[r], &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
      fprintf(stderr, "rank %d failed (%s %d)\n", r, WIFSIGNALED(st) ? "signal" : "exit",
              WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
      failed++;
    }
  }
  printf("%s: %d ranks, %d failed\n", failed ? "FAIL" : "PASS", gN, failed);
  return failed ? 1 : 0;
}
