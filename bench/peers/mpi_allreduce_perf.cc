// mpi-allreduce-perf: MPI's collectives measured with loom-perf's sweep, table and checks
// (bench/perf), so that bench/peers/compare.sh can put Open MPI beside Loom. -C picks the
// collective as in loom-perf (default all_reduce); in-place runs pass MPI_IN_PLACE.
//
// Run it under the MPI launcher, e.g.
//   mpirun --allow-run-as-root --oversubscribe -np 2 ./mpi-allreduce-perf -b 8 -e 1M
// and pick Open MPI's path with its MCA flags: shared memory (--mca pml ob1 --mca btl vader,self)
// or TCP over loopback (--mca pml ob1 --mca btl tcp,self --mca btl_tcp_if_include lo).
//
// Exit status: 0 on success, 1 when a result was wrong, 2 on bad usage; MPI errors abort.

#include <mpi.h>

#include <climits>
#include <cstdio>
#include <cstring>
#include <string>

#include "perf/perf.h"

namespace {

MPI_Datatype MpiType(loomDataType_t t) {
  switch (t) {
    case loomUint8:
      return MPI_UINT8_T;
    case loomInt32:
      return MPI_INT32_T;
    case loomInt64:
      return MPI_INT64_T;
    case loomFloat:
      return MPI_FLOAT;
    case loomDouble:
      return MPI_DOUBLE;
    default:
      return MPI_DATATYPE_NULL;
  }
}

MPI_Op MpiOp(loomRedOp_t op) {
  switch (op) {
    case loomSum:
      return MPI_SUM;
    case loomProd:
      return MPI_PROD;
    case loomMax:
      return MPI_MAX;
    case loomMin:
      return MPI_MIN;
    default:
      return MPI_OP_NULL;
  }
}

class MpiBackend : public perf::Backend {
 public:
  MpiBackend(int rank, int nranks) : rank_(rank), nranks_(nranks) {}

  bool Supports(perf::Coll, const perf::TypeInfo& t, loomRedOp_t op) const override {
    return MpiType(t.type) != MPI_DATATYPE_NULL && MpiOp(op) != MPI_OP_NULL;
  }

  // MPI_ERRORS_ARE_FATAL (the default) aborts the job on any error.
  void Run(perf::Coll c, const void* send, void* recv, size_t count, const perf::TypeInfo& t,
           loomRedOp_t op, int root) override {
    if (count > static_cast<size_t>(INT_MAX)) {
      std::fprintf(stderr, "mpi-allreduce-perf: count %zu exceeds MPI's int counts\n", count);
      MPI_Abort(MPI_COMM_WORLD, 2);
    }
    const int n = static_cast<int>(count);
    const MPI_Datatype ty = MpiType(t.type);
    const MPI_Comm w = MPI_COMM_WORLD;
    const char* own = static_cast<char*>(recv) + static_cast<size_t>(rank_) * count * t.size;
    switch (c) {
      case perf::Coll::kAllReduce:
        MPI_Allreduce(send == recv ? MPI_IN_PLACE : send, recv, n, ty, MpiOp(op), w);
        break;
      case perf::Coll::kAllGather:
        MPI_Allgather(send == own ? MPI_IN_PLACE : send, n, ty, recv, n, ty, w);
        break;
      case perf::Coll::kReduceScatter: {
        const bool in_place = recv == static_cast<const char*>(send) + rank_ * count * t.size;
        // In place, MPI takes the whole input in recvbuf: the send buffer itself.
        MPI_Reduce_scatter_block(in_place ? MPI_IN_PLACE : send,
                                 in_place ? const_cast<void*>(send) : recv, n, ty, MpiOp(op), w);
        if (in_place && rank_ != 0)  // MPI leaves this rank's block at the buffer's start
          std::memmove(recv, send, count * t.size);
        break;
      }
      case perf::Coll::kBroadcast:
        if (rank_ == root && send != recv) std::memcpy(recv, send, count * t.size);
        MPI_Bcast(recv, n, ty, root, w);
        break;
      case perf::Coll::kReduce:
        MPI_Reduce(send == recv && rank_ == root ? MPI_IN_PLACE : send, recv, n, ty, MpiOp(op),
                   root, w);
        break;
      case perf::Coll::kAllToAll:
        MPI_Alltoall(send, n, ty, recv, n, ty, w);
        break;
      case perf::Coll::kGather:
        MPI_Gather(rank_ == root && send == own ? MPI_IN_PLACE : send, n, ty, recv, n, ty, root, w);
        break;
      case perf::Coll::kScatter: {
        const char* part =
            static_cast<const char*>(send) + static_cast<size_t>(rank_) * count * t.size;
        MPI_Scatter(send, n, ty, rank_ == root && recv == part ? MPI_IN_PLACE : recv, n, ty, root,
                    w);
        break;
      }
      case perf::Coll::kSendRecv:
        MPI_Sendrecv(send, n, ty, (rank_ + 1) % nranks_, 0, recv, n, ty,
                     (rank_ + nranks_ - 1) % nranks_, 0, w, MPI_STATUS_IGNORE);
        break;
    }
  }
  void Barrier() override { MPI_Barrier(MPI_COMM_WORLD); }

 private:
  int rank_, nranks_;
};

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, nranks = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &nranks);
  // Flags are parsed after MPI_Init (which may rewrite argv); a bad flag ends every rank alike.
  perf::FlagSet flags;
  flags.prog = "mpi-allreduce-perf";
  flags.all_types = false;
  const perf::Options o = perf::ParseFlags(argc, argv, flags);

  char version[MPI_MAX_LIBRARY_VERSION_STRING] = "";
  int len = 0;
  MPI_Get_library_version(version, &len);
  std::string title = version;
  if (title.find('\n') != std::string::npos) title.resize(title.find('\n'));
  if (title.find(',') != std::string::npos) title.resize(title.find(','));

  MpiBackend backend(rank, nranks);
  const int rc = perf::RunSweep(backend, o, rank, nranks, title);
  int worst = 0;
  MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return worst;
}
