// gloo-allreduce-perf: gloo::allreduce (Gloo's ring, as PyTorch's Gloo backend calls it) measured
// with loom-perf's sweep, table and checks (bench/perf), so that bench/peers/compare.sh can put
// Gloo beside Loom.
//
// Like loom-perf it starts -np ranks on this host by fork. The ranks meet through a
// gloo::rendezvous::FileStore in a fresh /tmp directory and connect a full mesh with Gloo's TCP
// transport on 127.0.0.1 (Gloo has no shared-memory transport). In-place runs pass only an output
// buffer, which Gloo then reduces in place.
//
// Exit status: 0 on success, 1 when a Gloo call failed or a result was wrong, 2 on bad usage.

#include <dirent.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <exception>
#include <memory>
#include <string>

#include "perf/perf.h"

namespace {

constexpr char kProg[] = "gloo-allreduce-perf";

template <typename T>
gloo::AllreduceOptions::Func ReduceFunc(loomRedOp_t op) {
  using Fn = void (*)(void*, const void*, const void*, size_t);
  switch (op) {
    case loomProd:
      return static_cast<Fn>(&gloo::product<T>);
    case loomMax:
      return static_cast<Fn>(&gloo::max<T>);
    case loomMin:
      return static_cast<Fn>(&gloo::min<T>);
    default:
      return static_cast<Fn>(&gloo::sum<T>);
  }
}

class GlooBackend : public perf::Backend {
 public:
  explicit GlooBackend(std::shared_ptr<gloo::Context> ctx) : ctx_(std::move(ctx)) {}

  bool Supports(perf::Coll c, const perf::TypeInfo& t, loomRedOp_t op) const override {
    return c == perf::Coll::kAllReduce && op != loomAvg;
  }

  // Gloo throws on failure; RunRank reports it.
  void Run(perf::Coll, const void* send, void* recv, size_t count, const perf::TypeInfo& t,
           loomRedOp_t op, int) override {
    switch (t.type) {
      case loomUint8:
        Run<uint8_t>(send, recv, count, op);
        break;
      case loomInt32:
        Run<int32_t>(send, recv, count, op);
        break;
      case loomInt64:
        Run<int64_t>(send, recv, count, op);
        break;
      case loomFloat:
        Run<float>(send, recv, count, op);
        break;
      default:
        Run<double>(send, recv, count, op);
        break;
    }
  }
  void Barrier() override {
    gloo::BarrierOptions opts(ctx_);
    gloo::barrier(opts);
  }

 private:
  template <typename T>
  void Run(const void* send, void* recv, size_t count, loomRedOp_t op) {
    gloo::AllreduceOptions opts(ctx_);
    if (send != recv) opts.setInput(const_cast<T*>(static_cast<const T*>(send)), count);
    opts.setOutput(static_cast<T*>(recv), count);
    opts.setReduceFunction(ReduceFunc<T>(op));
    gloo::allreduce(opts);
  }
  std::shared_ptr<gloo::Context> ctx_;
};

int RunRank(const perf::Options& o, int rank, const std::string& store_dir) {
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = "127.0.0.1";
    auto dev = gloo::transport::tcp::CreateDevice(attr);
    gloo::rendezvous::FileStore store(store_dir);
    auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, o.nranks);
    // Large sizes on oversubscribed cores take long; the deadline is the parent's (-T).
    ctx->setTimeout(std::chrono::milliseconds(std::max(o.timeout_s, 60) * 1000L));
    ctx->connectFullMesh(store, dev);
    GlooBackend backend(ctx);
    const std::string title = "gloo::allreduce (ring), Gloo 0.5.0 (" + dev->str() + ")";
    return perf::RunSweep(backend, o, rank, o.nranks, title);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: rank %d: %s\n", kProg, rank, e.what());
    return 1;
  }
}

void RemoveDir(const std::string& dir) {
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d))
      if (e->d_name[0] != '.') unlink((dir + "/" + e->d_name).c_str());
    closedir(d);
  }
  rmdir(dir.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  const perf::FlagSet flags{kProg, true, false, {perf::Coll::kAllReduce}};
  const perf::Options o = perf::ParseFlags(argc, argv, flags);
  char tmpl[] = "/tmp/gloo-perf.XXXXXX";
  if (mkdtemp(tmpl) == nullptr) {
    std::perror("gloo-allreduce-perf: mkdtemp");
    return 1;
  }
  const std::string dir = tmpl;
  const int rc =
      perf::Launch(kProg, o.nranks, o.timeout_s, [&](int rank) { return RunRank(o, rank, dir); });
  RemoveDir(dir);
  return rc;
}
