// gloo-allreduce-perf: gloo::allreduce (Gloo's ring, as PyTorch's Gloo backend calls it) measured
// with loom-perf's sweep, table and checks, so that bench/peers/compare.sh can put Gloo beside Loom.
//
// Like loom-perf it starts -np ranks on this host by fork. The ranks meet through a
// gloo::rendezvous::FileStore in a fresh /tmp directory and connect a full mesh with Gloo's TCP
// transport on 127.0.0.1 (Gloo has no shared-memory transport). In-place runs pass only an output
// buffer, which Gloo then reduces in place.
//
// Exit status: 0 on success, 1 when a Gloo call failed or a result was wrong, 2 on bad usage.

#include <dirent.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>

#include <chrono>
#include <cstdio>
#include <exception>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "perf_common.h"

namespace {

using peerperf::Op;
using peerperf::Type;
using peerperf::TypeInfo;

constexpr char kProg[] = "gloo-allreduce-perf";

template <typename T>
gloo::AllreduceOptions::Func ReduceFunc(Op op) {
  using Fn = void (*)(void*, const void*, const void*, size_t);
  switch (op) {
    case Op::kProd: return static_cast<Fn>(&gloo::product<T>);
    case Op::kMax: return static_cast<Fn>(&gloo::max<T>);
    case Op::kMin: return static_cast<Fn>(&gloo::min<T>);
    default: return static_cast<Fn>(&gloo::sum<T>);
  }
}

class GlooComm : public peerperf::PeerComm {
 public:
  explicit GlooComm(std::shared_ptr<gloo::Context> ctx) : ctx_(std::move(ctx)) {}

  void AllReduce(const void* send, void* recv, size_t count, const TypeInfo& t, Op op) override {
    switch (t.type) {
      case Type::kUint8: Run<uint8_t>(send, recv, count, op); break;
      case Type::kInt32: Run<int32_t>(send, recv, count, op); break;
      case Type::kInt64: Run<int64_t>(send, recv, count, op); break;
      case Type::kFloat: Run<float>(send, recv, count, op); break;
      case Type::kDouble: Run<double>(send, recv, count, op); break;
    }
  }
  void Barrier() override {
    gloo::BarrierOptions opts(ctx_);
    gloo::barrier(opts);
  }

 private:
  template <typename T>
  void Run(const void* send, void* recv, size_t count, Op op) {
    gloo::AllreduceOptions opts(ctx_);
    if (send != recv) opts.setInput(const_cast<T*>(static_cast<const T*>(send)), count);
    opts.setOutput(static_cast<T*>(recv), count);
    opts.setReduceFunction(ReduceFunc<T>(op));
    gloo::allreduce(opts);
  }
  std::shared_ptr<gloo::Context> ctx_;
};

int RunRank(const peerperf::Options& o, int rank, const std::string& store_dir) {
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = "127.0.0.1";
    auto dev = gloo::transport::tcp::CreateDevice(attr);
    gloo::rendezvous::FileStore store(store_dir);
    auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, o.nranks);
    // Large sizes on oversubscribed cores take long; the deadline is the parent's (-T).
    ctx->setTimeout(std::chrono::milliseconds(std::max(o.timeout_s, 60) * 1000L));
    ctx->connectFullMesh(store, dev);
    GlooComm comm(ctx);
    const std::string peer = "gloo::allreduce (ring), Gloo 0.5.0 (" + dev->str() + ")";
    return peerperf::RunSweep(comm, o, rank, o.nranks, peer.c_str());
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

// Starts -np ranks and waits for them; once one fails, or at the -T deadline, kills the rest.
int Launch(const peerperf::Options& o) {
  char tmpl[] = "/tmp/gloo-perf.XXXXXX";
  if (mkdtemp(tmpl) == nullptr) {
    std::perror("gloo-allreduce-perf: mkdtemp");
    return 1;
  }
  const std::string dir = tmpl;
  const pid_t parent = getpid();
  std::fflush(nullptr);
  std::vector<pid_t> pids(o.nranks, -1);
  int rc = 0;
  for (int r = 0; r < o.nranks && rc == 0; ++r) {
    const pid_t pid = fork();
    if (pid < 0) {
      std::perror("gloo-allreduce-perf: fork");
      rc = 1;
    } else if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(1);
      const int status = RunRank(o, r, dir);
      std::fflush(nullptr);
      _exit(status);
    }
    pids[r] = pid;
  }
  constexpr double kGraceS = 15;
  double kill_at = o.timeout_s > 0 ? peerperf::Now() + o.timeout_s : HUGE_VAL;
  if (rc != 0) kill_at = peerperf::Now();
  int running = 0;
  for (pid_t p : pids) running += p > 0;
  bool killed = false;
  while (running > 0) {
    int status = 0;
    const pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid > 0) {
      const int r = static_cast<int>(std::find(pids.begin(), pids.end(), pid) - pids.begin());
      if (r >= o.nranks) continue;
      pids[r] = -1;
      --running;
      if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        if (!killed)
          std::fprintf(stderr, "%s: rank %d %s %d\n", kProg, r,
                       WIFEXITED(status) ? "exited with status" : "killed by signal",
                       WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
        rc = 1;
        kill_at = std::min(kill_at, peerperf::Now() + kGraceS);
      }
      continue;
    }
    if (!killed && peerperf::Now() >= kill_at) {
      std::fprintf(stderr, "%s: %s; killing the %d rank(s) still running\n", kProg,
                   rc != 0 ? "a rank failed" : "deadline (-T) reached", running);
      for (pid_t p : pids)
        if (p > 0) kill(p, SIGKILL);
      killed = true;
      rc = 1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  RemoveDir(dir);
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  const peerperf::Options o = peerperf::ParseFlags(argc, argv, kProg, true);
  return Launch(o);
}
