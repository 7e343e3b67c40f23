/// Loom: a collective communication runtime.
///
/// The public C API. It follows NCCL's shape (same argument order, same enum
/// values) with the `loom` prefix, so a thin NCCL-compatible shim can forward
/// to it. Usable from C and C++; needs no CUDA header.
///
/// Thread safety: a communicator may be used by one thread at a time, except
/// loomCommAbort and loomCommGetAsyncError, which may be called from any
/// thread at any moment. Group state (loomGroupStart/End) is per thread.
///
/// Host buffers passed with a NULL stream are complete when the call returns.
#ifndef LOOM_LOOM_H_
#define LOOM_LOOM_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define LOOM_MAJOR 0
#define LOOM_MINOR 1
#define LOOM_PATCH 0
/// Version as an integer: major * 10000 + minor * 100 + patch.
#define LOOM_VERSION_CODE (LOOM_MAJOR * 10000 + LOOM_MINOR * 100 + LOOM_PATCH)

/// Opaque communicator handle.
typedef struct loomComm* loomComm_t;

/// A CUDA stream; a cudaStream_t converts without a cast. Host buffers take NULL.
typedef struct CUstream_st* loomStream_t;

#define LOOM_UNIQUE_ID_BYTES 128
/// Identifies one communicator's rendezvous: the root's address and a random secret.
typedef struct {
  char internal[LOOM_UNIQUE_ID_BYTES];
} loomUniqueId;

typedef enum {
  loomSuccess = 0,
  loomUnhandledCudaError = 1,
  loomSystemError = 2,
  loomInternalError = 3,
  loomInvalidArgument = 4,
  loomInvalidUsage = 5,
  loomRemoteError = 6,
  loomInProgress = 7,
  loomTimeout = 8,
  loomNumResults = 9
} loomResult_t;

typedef enum {
  loomInt8 = 0,
  loomChar = 0,
  loomUint8 = 1,
  loomInt32 = 2,
  loomInt = 2,
  loomUint32 = 3,
  loomInt64 = 4,
  loomUint64 = 5,
  loomFloat16 = 6,
  loomHalf = 6,
  loomFloat32 = 7,
  loomFloat = 7,
  loomFloat64 = 8,
  loomDouble = 8,
  loomBfloat16 = 9,
  loomFloat8e4m3 = 10,
  loomFloat8e5m2 = 11,
  loomNumTypes = 12,
  /* Not types: they make every int a valid value of the enum in C++, so a
     bad argument is checked and reported, never undefined behaviour. */
  loomDataTypeIntMin_ = -2147483647 - 1,
  loomDataTypeIntMax_ = 2147483647
} loomDataType_t;

typedef enum {
  loomSum = 0,
  loomProd = 1,
  loomMax = 2,
  loomMin = 3,
  loomAvg = 4,
  loomNumOps = 5,
  /// Operations made by loomRedOpCreatePreMulSum take values from loomNumOps up (below
  /// loomBand), as NCCL's do.
  /// Bitwise and, or and exclusive or of the integer types (as MPI_BAND, MPI_BOR, MPI_BXOR and
  /// torch's ReduceOp.BAND, BOR, BXOR): Loom's own operations, which NCCL does not have, so
  /// their values lie above every PreMulSum operation's. Any other type is refused.
  loomBand = 0x40000000,
  loomBor = 0x40000001,
  loomBxor = 0x40000002,
  loomMaxRedOp = 0x7fffffff,
  loomRedOpIntMin_ = -2147483647 - 1 /* not an op: see loomDataTypeIntMin_ */
} loomRedOp_t;

/// Where the scalar of loomRedOpCreatePreMulSum lives (only host is supported).
typedef enum { loomScalarDevice = 0, loomScalarHostImmediate = 1 } loomScalarResidence_t;

#define LOOM_CONFIG_MAGIC 0x4c4f4f4du /* "LOOM" */
#define LOOM_CONFIG_UNDEF_INT (-2147483647 - 1)
#define LOOM_CONFIG_UNDEF_PTR NULL

/// Per-communicator options. Start from LOOM_CONFIG_INITIALIZER; unset fields
/// take their defaults (from the environment where a variable exists).
typedef struct {
  size_t size;           ///< sizeof(loomConfig_t), set by the initializer
  unsigned int magic;    ///< LOOM_CONFIG_MAGIC
  unsigned int version;  ///< LOOM_VERSION_CODE
  int blocking;          ///< 1 (default): calls return when done; 0: non-blocking (below)
  const char* commName;  ///< a name shown in logs and error messages
  int timeoutMs;         ///< every wait fails with loomTimeout after this long (LOOM_TIMEOUT_MS)
} loomConfig_t;

#define LOOM_CONFIG_INITIALIZER                                                        \
  {                                                                                    \
    sizeof(loomConfig_t), LOOM_CONFIG_MAGIC, LOOM_VERSION_CODE, LOOM_CONFIG_UNDEF_INT, \
        LOOM_CONFIG_UNDEF_PTR, LOOM_CONFIG_UNDEF_INT                                   \
  }

/// Colour that leaves a rank out of every communicator made by loomCommSplit.
#define LOOM_SPLIT_NOCOLOR (-1)

/// From this call on, each of Loom's variables that is unset takes the value of the NCCL
/// variable it mirrors where that has the same values (NCCL_SOCKET_IFNAME, NCCL_COMM_ID,
/// NCCL_DEBUG and others: README.md's table of variables names them). A variable is read when
/// Loom first needs it, so call this first. For programs ported from NCCL; the NCCL shim
/// (libnccl.so.2) calls it as it loads.
loomResult_t loomUseNcclEnvironment(void);

/// @param version receives LOOM_VERSION_CODE.
/// @return loomSuccess, or loomInvalidArgument when version is NULL.
loomResult_t loomGetVersion(int* version);

/// Makes a new unique id and starts its rendezvous root in this process (a
/// background thread that ends once every rank has joined). With
/// LOOM_COMM_ID=host:port set, rank 0 hosts the root there instead.
/// @param uniqueId receives the id; pass it to every rank out of band.
loomResult_t loomGetUniqueId(loomUniqueId* uniqueId);

/// Creates this rank's communicator; blocks until all nranks ranks have joined.
/// @param comm receives the communicator.
/// @param nranks number of ranks (>= 1).
/// @param commId the id from loomGetUniqueId, the same on every rank.
/// @param rank this rank, in [0, nranks).
loomResult_t loomCommInitRank(loomComm_t* comm, int nranks, loomUniqueId commId, int rank);

/// As loomCommInitRank, with options.
/// Non-blocking (config->blocking = 0): returns loomInProgress at once with *comm set; the
/// initialisation and then every collective, send/receive and group end on comm run in the
/// background in call order (those calls check their arguments, queue the work and return
/// loomInProgress). Poll loomCommGetAsyncError: loomInProgress until everything queued is done,
/// then loomSuccess (host buffers are complete) or the first error. Other calls on comm before
/// the initialisation completed return loomInvalidUsage. loomCommAbort ends the
/// initialisation or the running call and drops the queue; loomCommDestroy lets it finish.
/// @param config options, or NULL for the defaults.
loomResult_t loomCommInitRankConfig(loomComm_t* comm, int nranks, loomUniqueId commId, int rank,
                                    loomConfig_t* config);

/// Creates ndev communicators, one per rank, as ranks of this one process.
/// @param comms array of ndev communicators to fill.
/// @param ndev number of ranks (>= 1).
/// @param devlist CUDA devices, or NULL (rank i takes device i, or none without a GPU).
loomResult_t loomCommInitAll(loomComm_t* comms, int ndev, const int* devlist);

/// Creates this process's rank of the world communicator from the variables its
/// launcher set; no id is passed around. Blocks until every rank has joined.
/// Launchers are checked in this order, the first one found being used:
///   Loom:     LOOM_RANK, LOOM_WORLD_SIZE, LOOM_COMM_ID=host:port.
///   torchrun: RANK, WORLD_SIZE; the root at MASTER_ADDR, port MASTER_PORT + 1
///             (torchrun's own store holds MASTER_PORT).
///   Open MPI: OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE; the root at
///             LOOM_COMM_ID, or as for torchrun when MASTER_ADDR is set.
///   Slurm:    SLURM_PROCID, SLURM_NTASKS, SLURM_STEP_ID (ranks started by srun);
///             the root on the first node of SLURM_STEP_NODELIST (or
///             SLURM_JOB_NODELIST) at port LOOM_COMM_PORT, by default
///             28500 + (SLURM_JOB_ID + SLURM_STEP_ID) % 1000.
/// LOOM_COMM_ID, when set, names the root under every launcher; rank 0 hosts it.
/// @param comm receives the communicator.
/// @param config options, or NULL for the defaults.
/// @return loomInvalidArgument naming the variable that is missing or malformed.
loomResult_t loomCommInitFromEnv(loomComm_t* comm, loomConfig_t* config);

/// Splits comm by colour; ranks of one colour form a new communicator ordered
/// by key, then by old rank. Collective over comm.
/// @param color non-negative colour, or LOOM_SPLIT_NOCOLOR (newcomm gets NULL).
/// @param key ordering key.
/// @param newcomm receives the new communicator.
/// @param config options for the new communicator, or NULL to take comm's; a field the
///        config leaves undefined (LOOM_CONFIG_INITIALIZER's value) takes comm's too.
loomResult_t loomCommSplit(loomComm_t comm, int color, int key, loomComm_t* newcomm,
                           loomConfig_t* config);

/// Flags of loomCommShrink (NCCL's values).
#define LOOM_SHRINK_DEFAULT 0x00
#define LOOM_SHRINK_ABORT 0x01

/// Makes a communicator of comm's ranks without those in excludeRanksList, in old rank
/// order, for instance after ranks died (no id is passed: every rank that stays derives the
/// same one from comm's secret, and the lowest of them hosts its rendezvous at the address of
/// its old transport listener). Works on a failed communicator. Collective over the ranks
/// that stay; excluded ranks must not call it. comm stays valid and must still be destroyed.
/// @param excludeRanksList ranks of comm to leave out (NULL when excludeRanksCount is 0).
/// @param excludeRanksCount entries in excludeRanksList.
/// @param newcomm receives the new communicator.
/// @param config options for it, or NULL to take comm's; a field it leaves undefined takes
///        comm's too.
/// @param shrinkFlags LOOM_SHRINK_DEFAULT (comm's queued operations finish first) or
///        LOOM_SHRINK_ABORT (comm's outstanding operations are aborted first).
loomResult_t loomCommShrink(loomComm_t comm, int* excludeRanksList, int excludeRanksCount,
                            loomComm_t* newcomm, loomConfig_t* config, int shrinkFlags);

/// Completes outstanding operations; the communicator can then only be destroyed: operations,
/// splits, shrinks and registrations started after it fail with loomInvalidUsage.
loomResult_t loomCommFinalize(loomComm_t comm);

/// Frees the communicator. comm must not be used afterwards.
loomResult_t loomCommDestroy(loomComm_t comm);

/// Aborts outstanding operations (from any thread) and frees the communicator.
/// Peers waiting on this rank see loomRemoteError.
loomResult_t loomCommAbort(loomComm_t comm);

/// Names the next operation issued on comm with the caller's own number for it (a framework's
/// sequence number: the torch backend passes its process group's): the operation's flight-
/// recorder entry and trace dump carry `tag`, and loom-trace shows it beside Loom's own number.
/// The next collective, send or receive issued on comm takes the tag (in a group, the group's
/// operation does); 0 clears it. Set it from the thread that issues the operation.
loomResult_t loomCommSetOpTag(loomComm_t comm, uint64_t tag);

/// May be called from any thread, also while loomCommAbort runs on another one (then, once the
/// abort has freed comm, it returns loomInvalidArgument).
/// @param asyncError receives the communicator's stored error (loomSuccess if none), or
///        loomInProgress while a non-blocking communicator has work queued or running.
loomResult_t loomCommGetAsyncError(loomComm_t comm, loomResult_t* asyncError);

/// Per-operation completion on a non-blocking communicator (config->blocking = 0). Each
/// operation queued on it has a ticket, 1, 2, ... in the order they run (its initialisation
/// is 1); operations finish in ticket order, except a tagged receive (loomRecvTagged) whose
/// message has not come when its turn runs: it waits aside, finishing when its message
/// arrives, and the operations after it go on (so a receive posted before the send that
/// answers it does not wait on that send). May be called from any thread.
/// @param ticket receives the ticket of the last operation queued on comm: called right after
///        a call that returned loomInProgress (a collective, a send or receive outside a group,
///        or loomGroupEnd for a group's calls on comm), it names that call's operation. 0 on a
///        blocking communicator.
loomResult_t loomCommLastTicket(loomComm_t comm, uint64_t* ticket);

/// Waits for one operation of a non-blocking communicator. May be called from any thread, also
/// while loomCommAbort runs on another one (then a dropped operation fails with
/// loomRemoteError).
/// @param ticket from loomCommLastTicket.
/// @param timeoutMs 0 tests without waiting; a negative value waits up to the communicator's
///        timeout and a tenth more (0.5-5 s), so that an operation that times out itself
///        reports its own error (naming the rank it waited for) first, and then the calling
///        thread runs the operations up to ticket itself where the communicator's thread has not
///        taken them yet (no hand-over to pay).
/// @return the operation's own result: loomSuccess, or its error (loomGetLastError names the
///         peer or argument at fault); loomInProgress when it has not finished within
///         timeoutMs.
loomResult_t loomCommWaitTicket(loomComm_t comm, uint64_t ticket, int timeoutMs);

/// @param count receives the number of ranks.
loomResult_t loomCommCount(const loomComm_t comm, int* count);

/// @param device receives the CUDA device of this rank, -1 without a GPU.
loomResult_t loomCommCuDevice(const loomComm_t comm, int* device);

/// @param rank receives this rank.
loomResult_t loomCommUserRank(const loomComm_t comm, int* rank);

/// @return a static text for a result code.
const char* loomGetErrorString(loomResult_t result);

/// @return the message of the last error on this thread (naming the argument or
/// peer at fault), or "" when there was none. comm may be NULL.
const char* loomGetLastError(loomComm_t comm);

/// Makes a reduction that multiplies each input by *scalar, then sums.
/// @param op receives the new operation.
/// @param scalar points to one value of datatype, on the host.
/// @param datatype the type of the scalar and of the data it will reduce.
/// @param residence must be loomScalarHostImmediate.
/// @param comm the communicator the operation belongs to.
loomResult_t loomRedOpCreatePreMulSum(loomRedOp_t* op, void* scalar, loomDataType_t datatype,
                                      loomScalarResidence_t residence, loomComm_t comm);

/// Frees an operation made by loomRedOpCreatePreMulSum. As soon as the last call given the
/// operation has returned, it may be freed: each call copies it, so a call still queued on a
/// non-blocking communicator (or in an open group) runs with the scalar it was given.
loomResult_t loomRedOpDestroy(loomRedOp_t op, loomComm_t comm);

/// The collectives below: a call's send and receive buffers must not overlap other than in its
/// in-place form, given with each (a root's gather in place when sendbuff == recvbuff + root *
/// sendcount, its scatter when recvbuff == sendbuff + root * recvcount; all-to-all and
/// loomAllToAllv have none). Any other overlap, which would read bytes the call had already
/// written, is refused with loomInvalidArgument naming recvbuff.

/// recvbuff[i] = op over ranks of sendbuff[i]. In place when sendbuff == recvbuff.
/// @param count elements in each buffer.
loomResult_t loomAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                           loomDataType_t datatype, loomRedOp_t op, loomComm_t comm,
                           loomStream_t stream);

/// Copies root's sendbuff to every rank's recvbuff.
loomResult_t loomBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                           loomDataType_t datatype, int root, loomComm_t comm, loomStream_t stream);

/// Reduces every rank's sendbuff into root's recvbuff.
loomResult_t loomReduce(const void* sendbuff, void* recvbuff, size_t count, loomDataType_t datatype,
                        loomRedOp_t op, int root, loomComm_t comm, loomStream_t stream);

/// recvbuff[r * sendcount ...] = rank r's sendbuff. In place when
/// sendbuff == recvbuff + rank * sendcount.
loomResult_t loomAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                           loomDataType_t datatype, loomComm_t comm, loomStream_t stream);

/// recvbuff = op over ranks of sendbuff[rank * recvcount ...]. In place when
/// recvbuff == sendbuff + rank * recvcount.
loomResult_t loomReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                               loomDataType_t datatype, loomRedOp_t op, loomComm_t comm,
                               loomStream_t stream);

/// recvbuff[r * count ...] = rank r's sendbuff[rank * count ...].
loomResult_t loomAllToAll(const void* sendbuff, void* recvbuff, size_t count,
                          loomDataType_t datatype, loomComm_t comm, loomStream_t stream);

/// Unequal blocks: sendcounts[r] elements from sendbuff + sdispls[r] go to rank r, which
/// receives them at recvbuff + rdispls[rank] (recvcounts[rank] elements, which must equal
/// what this rank sends it). Counts and displacements are in elements, one entry per rank;
/// NULL displacements put the blocks end to end. Issued as one group of loomSend and loomRecv
/// (within an enclosing loomGroupStart/End, it joins that group); counts that do not match
/// between two ranks fail on both with loomInvalidUsage, not a hang.
loomResult_t loomAllToAllv(const void* sendbuff, const size_t sendcounts[], const size_t sdispls[],
                           void* recvbuff, const size_t recvcounts[], const size_t rdispls[],
                           loomDataType_t datatype, loomComm_t comm, loomStream_t stream);

/// recvbuff[r * sendcount ...] on root = rank r's sendbuff; recvbuff is not used on the
/// other ranks (NULL there is fine). Sends and receives in one group, as loomAllToAllv.
loomResult_t loomGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                        loomDataType_t datatype, int root, loomComm_t comm, loomStream_t stream);

/// recvbuff = root's sendbuff[rank * recvcount ...]; sendbuff is not used on the other ranks
/// (NULL there is fine). Sends and receives in one group, as loomAllToAllv.
loomResult_t loomScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                         loomDataType_t datatype, int root, loomComm_t comm, loomStream_t stream);

/// Sends count elements to peer; matched in order with peer's loomRecv.
loomResult_t loomSend(const void* sendbuff, size_t count, loomDataType_t datatype, int peer,
                      loomComm_t comm, loomStream_t stream);

/// Receives count elements from peer.
loomResult_t loomRecv(void* recvbuff, size_t count, loomDataType_t datatype, int peer,
                      loomComm_t comm, loomStream_t stream);

/// loomRecvTagged's peer for a receive from any rank.
#define LOOM_ANY_SOURCE (-1)

/// Sends count elements of host memory to peer as a message tagged tag (any int), matched with
/// a loomRecvTagged of peer's with that tag from this rank (or from LOOM_ANY_SOURCE); messages
/// of one tag from one rank are received in the order sent, other tags in any order. Unlike
/// loomSend's, a message needs no receive posted yet: the send returns once its bytes have left
/// this process, and the peer keeps a message that comes before its receive (even while the
/// peer runs collectives) until a receive takes it. A message larger than the connection's
/// FIFO (LOOM_SLOT_BYTES times its depth) waits until the peer reads, in any operation. Sends
/// and receives of one loomGroupStart/End run at once, so that pairs exchanging large
/// messages do not wait on each other. Tagged messages and loomSend/loomRecv do not match each
/// other. Device memory: loomInvalidArgument.
loomResult_t loomSendTagged(const void* sendbuff, size_t count, loomDataType_t datatype, int peer,
                            int tag, loomComm_t comm, loomStream_t stream);

/// Receives the message tagged tag from peer (or the earliest to arrive from any rank, with
/// peer LOOM_ANY_SOURCE) into count elements at recvbuff. A message of another size than
/// count elements fails with loomInvalidUsage (and is dropped). source (may be NULL) receives
/// the sender's rank; on a non-blocking communicator it is written when the operation ends, so
/// it must stay valid until then, as recvbuff must.
loomResult_t loomRecvTagged(void* recvbuff, size_t count, loomDataType_t datatype, int peer,
                            int tag, int* source, loomComm_t comm, loomStream_t stream);

/// Returns once every rank of comm has entered the barrier.
loomResult_t loomBarrier(loomComm_t comm, loomStream_t stream);

/// One rank's lateness over the operations a communicator has timed so far
/// (operations whose peers' entry times are known: all-reduces of a
/// communicator whose ranks share one host).
typedef struct {
  int rank;                      ///< the rank described
  unsigned long long ops;        ///< operations counted
  unsigned long long timesLast;  ///< how often this rank entered last
  double meanLateUs;             ///< mean time after the first rank's entry
  double maxLateUs;              ///< largest time after the first rank's entry
  double waitCausedUs;           ///< total time other ranks waited for it when it was last
} loomStragglerStat_t;

/// Writes this rank's flight recorder (the last LOOM_FLIGHT_RECORDER
/// operations: what, state, entry and end times, waits) as JSON.
/// @param path the file, or NULL for LOOM_TRACE_DIR/loom-trace-<comm>-rank<r>.json.
loomResult_t loomCommDumpTrace(loomComm_t comm, const char* path);

/// Fills a per-rank straggler summary, as this rank has observed it.
/// @param stats array of nstats entries; entry r describes rank r.
/// @param nstats at least the communicator's rank count.
loomResult_t loomCommGetStragglerSummary(loomComm_t comm, loomStragglerStat_t* stats, int nstats);

/// Allocates size bytes of host memory that the communicator's ranks on this
/// host can read in place (shared memory, every page touched now). An
/// all-reduce whose send buffer lies in such memory skips copying it into
/// Loom's buffers. Free it with loomMemFree.
/// @return loomInvalidArgument when ptr is NULL or size is 0.
loomResult_t loomMemAlloc(void** ptr, size_t size);

/// Registers [buff, buff + size) with the communicator's RDMA devices, so that
/// sends from it over the ib transport read it in place instead of copying it
/// into Loom's buffers first (as ncclCommRegister). Optional: unregistered
/// buffers work too. Keep the memory allocated until loomCommDeregister.
/// Without ib peers it succeeds and registers nothing.
/// @param handle receives the handle for loomCommDeregister.
loomResult_t loomCommRegister(const loomComm_t comm, void* buff, size_t size, void** handle);

/// Undoes loomCommRegister. Operations using the buffer must have completed.
/// @return loomInvalidArgument for a handle this communicator did not return.
loomResult_t loomCommDeregister(const loomComm_t comm, void* handle);

/// Frees memory from loomMemAlloc.
/// @return loomInvalidArgument for a pointer loomMemAlloc did not return.
loomResult_t loomMemFree(void* ptr);

/// Starts a group: the calls up to the matching loomGroupEnd are issued together.
loomResult_t loomGroupStart(void);

/// Ends a group and runs its operations (on host buffers, to completion). When a call inside
/// the group was refused (it returned an error), the outermost loomGroupEnd runs none of the
/// group's calls and returns the first refusal, as NCCL's group does; the communicators stay
/// usable. Blocking communicators that loomCommInitRank(Config), loomCommSplit or
/// loomCommShrink made inside the group are created here, all at once, before its operations
/// (so one thread can create or split several ranks' communicators, as with NCCL): their
/// handles, returned by those calls, can be used once it returns; it returns the first failed
/// creation, whose handle then refuses every call but destroy.
loomResult_t loomGroupEnd(void);

#ifdef __cplusplus
}  // extern "C"
#endif

#endif  // LOOM_LOOM_H_
