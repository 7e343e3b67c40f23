// mpi-allreduce-perf: MPI_Allreduce measured with loom-perf's sweep, table and checks, so that
// bench/peers/compare.sh can put Open MPI beside Loom. In-place runs pass MPI_IN_PLACE.
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
#include <string>

#include "perf_common.h"

namespace {

using peerperf::Op;
using peerperf::Type;
using peerperf::TypeInfo;

MPI_Datatype MpiType(Type t) {
  switch (t) {
    case Type::kUint8: return MPI_UINT8_T;
    case Type::kInt32: return MPI_INT32_T;
    case Type::kInt64: return MPI_INT64_T;
    case Type::kFloat: return MPI_FLOAT;
    case Type::kDouble: return MPI_DOUBLE;
  }
  return MPI_DATATYPE_NULL;
}

MPI_Op MpiOp(Op op) {
  switch (op) {
    case Op::kSum: return MPI_SUM;
    case Op::kProd: return MPI_PROD;
    case Op::kMax: return MPI_MAX;
    case Op::kMin: return MPI_MIN;
  }
  return MPI_OP_NULL;
}

class MpiComm : public peerperf::PeerComm {
 public:
  void AllReduce(const void* send, void* recv, size_t count, const TypeInfo& t, Op op) override {
    if (count > static_cast<size_t>(INT_MAX)) {
      std::fprintf(stderr, "mpi-allreduce-perf: count %zu exceeds MPI's int counts\n", count);
      MPI_Abort(MPI_COMM_WORLD, 2);
    }
    // MPI_ERRORS_ARE_FATAL (the default) aborts the job on any error.
    MPI_Allreduce(send == recv ? MPI_IN_PLACE : send, recv, static_cast<int>(count),
                  MpiType(t.type), MpiOp(op), MPI_COMM_WORLD);
  }
  void Barrier() override { MPI_Barrier(MPI_COMM_WORLD); }
};

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, nranks = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &nranks);
  // Flags are parsed after MPI_Init (which may rewrite argv); a bad flag ends every rank alike.
  const peerperf::Options o = peerperf::ParseFlags(argc, argv, "mpi-allreduce-perf", false);

  char version[MPI_MAX_LIBRARY_VERSION_STRING] = "";
  int len = 0;
  MPI_Get_library_version(version, &len);
  std::string peer = std::string("MPI_Allreduce, ") + version;
  if (peer.find('\n') != std::string::npos) peer.resize(peer.find('\n'));
  if (peer.find(',', 15) != std::string::npos) peer.resize(peer.find(',', 15));

  MpiComm comm;
  const int rc = peerperf::RunSweep(comm, o, rank, nranks, peer.c_str());
  int worst = 0;
  MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return worst;
}
