// loomCommInitFromEnv: forked ranks that see only one launcher's variables (Loom's own,
// torchrun's, Open MPI's, Slurm's) init, check their rank and count and run one all-reduce; every
// missing or malformed variable fails with a message naming it; and the Slurm node-list parser.
//
// Loom caches its variables at their first reading, so each case runs in fresh processes: the
// harness forks the ranks with initComm and setCommId off, and beforeInit clears every launcher
// variable (the test itself may run under srun or mpirun) before setting the case's own.
#include "api/init_env.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "harness.h"

namespace loomtest {
namespace {

// Every variable loomCommInitFromEnv reads.
constexpr const char* kLauncherVars[] = {"LOOM_RANK",
                                         "LOOM_WORLD_SIZE",
                                         "LOOM_COMM_ID",
                                         "LOOM_COMM_PORT",
                                         "LOOM_COMM_SECRET",
                                         "RANK",
                                         "WORLD_SIZE",
                                         "LOCAL_RANK",
                                         "MASTER_ADDR",
                                         "MASTER_PORT",
                                         "OMPI_COMM_WORLD_RANK",
                                         "OMPI_COMM_WORLD_SIZE",
                                         "OMPI_COMM_WORLD_LOCAL_RANK",
                                         "SLURM_PROCID",
                                         "SLURM_NTASKS",
                                         "SLURM_LOCALID",
                                         "SLURM_STEP_ID",
                                         "SLURM_JOB_ID",
                                         "SLURM_STEP_NODELIST",
                                         "SLURM_JOB_NODELIST",
                                         "SLURM_NODELIST"};

using Vars = std::vector<std::pair<std::string, std::string>>;
using VarsFn = std::function<Vars(const RankContext&)>;

void setOnly(const Vars& vars) {
  for (const char* name : kLauncherVars) unsetenv(name);
  for (const auto& kv : vars) setenv(kv.first.c_str(), kv.second.c_str(), 1);
}

std::string str(int v) { return std::to_string(v); }

// Init from the environment, then check rank, count and one all-reduce against a sum made here.
int initAndReduce(RankContext& ctx, bool withConfig) {
  loomComm_t comm = nullptr;
  loomConfig_t config = LOOM_CONFIG_INITIALIZER;
  config.commName = "init-env";
  loomResult_t r = loomCommInitFromEnv(&comm, withConfig ? &config : nullptr);
  if (r != loomSuccess) {
    fprintf(stderr, "rank %d: loomCommInitFromEnv: %s: %s\n", ctx.rank, loomGetErrorString(r),
            loomGetLastError(nullptr));
    return 1;
  }
  int rank = -1, count = -1;
  if (loomCommUserRank(comm, &rank) != loomSuccess || loomCommCount(comm, &count) != loomSuccess ||
      rank != ctx.rank || count != ctx.nranks) {
    fprintf(stderr, "rank %d: communicator says rank %d of %d\n", ctx.rank, rank, count);
    return 2;
  }
  const size_t n = 4099;
  std::vector<int64_t> send(n), recv(n, -1);
  for (size_t i = 0; i < n; ++i) send[i] = (rank + 1) * static_cast<int64_t>(i + 7);
  r = loomAllReduce(send.data(), recv.data(), n, loomInt64, loomSum, comm, nullptr);
  if (r != loomSuccess) {
    fprintf(stderr, "rank %d: loomAllReduce: %s\n", rank, loomGetLastError(comm));
    return 3;
  }
  for (size_t i = 0; i < n; ++i) {
    int64_t want = 0;
    for (int q = 0; q < count; ++q) want += (q + 1) * static_cast<int64_t>(i + 7);
    if (recv[i] != want) {
      fprintf(stderr, "rank %d: element %zu is %lld, want %lld\n", rank, i,
              static_cast<long long>(recv[i]), static_cast<long long>(want));
      return 4;
    }
  }
  return loomCommDestroy(comm) == loomSuccess ? 0 : 5;
}

void expectRanksJoin(int nranks, const VarsFn& vars, bool withConfig = false) {
  LaunchOptions opts;
  opts.nranks = nranks;
  opts.initComm = false;
  opts.setCommId = false;
  opts.beforeInit = [vars](RankContext& ctx) { setOnly(vars(ctx)); };
  LaunchResult res =
      launch(opts, [withConfig](RankContext& ctx) { return initAndReduce(ctx, withConfig); });
  EXPECT_TRUE(res.allPassed()) << res.report();
}

TEST(InitFromEnv, LoomVariables) {
  expectRanksJoin(3, [](const RankContext& c) {
    return Vars{{"LOOM_RANK", str(c.rank)},
                {"LOOM_WORLD_SIZE", str(c.nranks)},
                {"LOOM_COMM_ID", "127.0.0.1:" + str(c.port)}};
  });
}

// The root listens at MASTER_PORT + 1: MASTER_PORT itself belongs to torchrun's store.
TEST(InitFromEnv, Torchrun) {
  expectRanksJoin(
      2,
      [](const RankContext& c) {
        return Vars{{"RANK", str(c.rank)},
                    {"WORLD_SIZE", str(c.nranks)},
                    {"LOCAL_RANK", str(c.rank)},
                    {"MASTER_ADDR", "127.0.0.1"},
                    {"MASTER_PORT", str(c.port - 1)}};
      },
      /*withConfig=*/true);
}

TEST(InitFromEnv, CommIdOverridesMasterAddr) {
  expectRanksJoin(2, [](const RankContext& c) {
    return Vars{{"RANK", str(c.rank)},
                {"WORLD_SIZE", str(c.nranks)},
                {"MASTER_ADDR", "no-such-host.invalid"},
                {"MASTER_PORT", "1"},
                {"LOOM_COMM_ID", "127.0.0.1:" + str(c.port)}};
  });
}

TEST(InitFromEnv, OpenMpiWithCommId) {
  expectRanksJoin(3, [](const RankContext& c) {
    return Vars{{"OMPI_COMM_WORLD_RANK", str(c.rank)},
                {"OMPI_COMM_WORLD_SIZE", str(c.nranks)},
                {"OMPI_COMM_WORLD_LOCAL_RANK", str(c.rank)},
                {"LOOM_COMM_ID", "127.0.0.1:" + str(c.port)}};
  });
}

TEST(InitFromEnv, OpenMpiWithMasterAddr) {
  expectRanksJoin(2, [](const RankContext& c) {
    return Vars{{"OMPI_COMM_WORLD_RANK", str(c.rank)},
                {"OMPI_COMM_WORLD_SIZE", str(c.nranks)},
                {"MASTER_ADDR", "127.0.0.1"},
                {"MASTER_PORT", str(c.port - 1)}};
  });
}

TEST(InitFromEnv, SlurmWithCommPort) {
  expectRanksJoin(3, [](const RankContext& c) {
    return Vars{{"SLURM_PROCID", str(c.rank)},  {"SLURM_NTASKS", str(c.nranks)},
                {"SLURM_LOCALID", str(c.rank)}, {"SLURM_STEP_ID", "0"},
                {"SLURM_JOB_ID", "4242"},       {"SLURM_JOB_NODELIST", "127.0.0.[1-4,9]"},
                {"LOOM_COMM_PORT", str(c.port)}};
  });
}

bool loopbackPortFree(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  const bool ok = fd >= 0 && bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  if (fd >= 0) close(fd);
  return ok;
}

// Without LOOM_COMM_PORT the port follows the job and step ids; the step's node list wins over
// the job's (here a host that does not exist).
TEST(InitFromEnv, SlurmDefaultPort) {
  using loom::api::kSlurmBasePort;
  using loom::api::kSlurmPortSpan;
  int offset = -1;
  for (int k = 0; k < kSlurmPortSpan && offset < 0; ++k) {
    const int candidate = (k * 37 + static_cast<int>(getpid())) % kSlurmPortSpan;
    if (loopbackPortFree(kSlurmBasePort + candidate)) offset = candidate;
  }
  ASSERT_GE(offset, 0) << "no free port in the default Slurm range";
  const int stepId = 3, jobId = 77000 + (offset - stepId + kSlurmPortSpan) % kSlurmPortSpan;
  expectRanksJoin(2, [=](const RankContext& c) {
    return Vars{{"SLURM_PROCID", str(c.rank)},        {"SLURM_NTASKS", str(c.nranks)},
                {"SLURM_STEP_ID", str(stepId)},       {"SLURM_JOB_ID", str(jobId)},
                {"SLURM_STEP_NODELIST", "localhost"}, {"SLURM_JOB_NODELIST", "nohost[1-2]"}};
  });
}

// Loom's variables are checked first, so the others' (here all malformed) are never read.
TEST(InitFromEnv, LoomVariablesComeFirst) {
  expectRanksJoin(2, [](const RankContext& c) {
    return Vars{{"LOOM_RANK", str(c.rank)},
                {"LOOM_WORLD_SIZE", str(c.nranks)},
                {"LOOM_COMM_ID", "127.0.0.1:" + str(c.port)},
                {"RANK", "x"},
                {"OMPI_COMM_WORLD_RANK", "x"},
                {"SLURM_PROCID", "x"}};
  });
}

// ---- Errors: one process per case, which must fail before any rendezvous ----

struct ErrorCase {
  const char* name;
  Vars vars;
  std::vector<std::string> says;  // pieces the message must contain
  bool nullComm = false;
};

// Names the case in test listings (and so in ctest's names) instead of dumping its bytes.
void PrintTo(const ErrorCase& c, std::ostream* os) { *os << c.name; }

const Vars kTorch{{"RANK", "0"}, {"WORLD_SIZE", "2"}};
const Vars kMpi{{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"}};
const Vars kSlurm{{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_STEP_ID", "0"}};

Vars plus(Vars base, const Vars& more) {
  base.insert(base.end(), more.begin(), more.end());
  return base;
}

class InitFromEnvError : public ::testing::TestWithParam<ErrorCase> {};

TEST_P(InitFromEnvError, NamesTheVariable) {
  const ErrorCase& c = GetParam();
  LaunchOptions opts;
  opts.nranks = 1;
  opts.initComm = false;
  opts.setCommId = false;
  opts.beforeInit = [&c](RankContext&) { setOnly(c.vars); };
  LaunchResult res = launch(opts, [&c](RankContext&) {
    loomComm_t comm = nullptr;
    const loomResult_t r = loomCommInitFromEnv(c.nullComm ? nullptr : &comm, nullptr);
    const std::string msg = loomGetLastError(nullptr);
    fprintf(stderr, "result %d, message: %s\n", static_cast<int>(r), msg.c_str());
    int bad = r == loomInvalidArgument && comm == nullptr ? 0 : 1;
    for (const std::string& piece : c.says) {
      if (msg.find(piece) != std::string::npos) continue;
      fprintf(stderr, "the message lacks \"%s\"\n", piece.c_str());
      bad = 1;
    }
    return bad;
  });
  EXPECT_TRUE(res.allPassed()) << res.report();
}

const ErrorCase kErrorCases[] = {
    {"NoLauncher", {}, {"no launcher found", "LOOM_RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"}},
    {"NullComm", {}, {"loomCommInitFromEnv: comm: NULL"}, true},
    {"LoomNoWorldSize", {{"LOOM_RANK", "0"}}, {"LOOM_WORLD_SIZE is not set (found LOOM_RANK)"}},
    {"LoomNoRank", {{"LOOM_WORLD_SIZE", "2"}}, {"LOOM_RANK is not set (found LOOM_WORLD_SIZE)"}},
    {"LoomNoCommId",
     {{"LOOM_RANK", "0"}, {"LOOM_WORLD_SIZE", "2"}},
     {"LOOM_COMM_ID is not set (found LOOM_RANK and LOOM_WORLD_SIZE)"}},
    {"LoomRankNotANumber",
     {{"LOOM_RANK", "one"}, {"LOOM_WORLD_SIZE", "2"}, {"LOOM_COMM_ID", "127.0.0.1:9"}},
     {"LOOM_RANK=one is not an integer"}},
    {"LoomRankTooLarge",
     {{"LOOM_RANK", "2"}, {"LOOM_WORLD_SIZE", "2"}, {"LOOM_COMM_ID", "127.0.0.1:9"}},
     {"LOOM_RANK=2 is outside [0, LOOM_WORLD_SIZE=2)"}},
    {"LoomWorldSizeZero",
     {{"LOOM_RANK", "0"}, {"LOOM_WORLD_SIZE", "0"}},
     {"LOOM_WORLD_SIZE=0 is outside [1, "}},
    {"LoomCommIdNoPort",
     {{"LOOM_RANK", "0"}, {"LOOM_WORLD_SIZE", "2"}, {"LOOM_COMM_ID", "127.0.0.1"}},
     {"LOOM_COMM_ID=127.0.0.1"}},
    {"TorchNoWorldSize", {{"RANK", "0"}}, {"WORLD_SIZE is not set (found RANK)"}},
    {"TorchNoMaster", kTorch, {"MASTER_ADDR is not set (found RANK and WORLD_SIZE)"}},
    {"TorchNoMasterPort",
     plus(kTorch, {{"MASTER_ADDR", "127.0.0.1"}}),
     {"MASTER_PORT is not set (found MASTER_ADDR)"}},
    {"TorchNoMasterAddr",
     plus(kTorch, {{"MASTER_PORT", "29500"}}),
     {"MASTER_ADDR is not set (found MASTER_PORT)"}},
    {"TorchMasterPortTooLarge",
     plus(kTorch, {{"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "65535"}}),
     {"MASTER_PORT=65535 is outside [1, 65534]"}},
    {"TorchMasterPortNotANumber",
     plus(kTorch, {{"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "http"}}),
     {"MASTER_PORT=http is not an integer"}},
    {"TorchLocalRankNegative",
     plus(kTorch, {{"LOCAL_RANK", "-1"}}),
     {"LOCAL_RANK=-1 is outside [0, WORLD_SIZE=2)"}},
    {"MpiNoWorldSize",
     {{"OMPI_COMM_WORLD_RANK", "0"}},
     {"OMPI_COMM_WORLD_SIZE is not set (found OMPI_COMM_WORLD_RANK)"}},
    {"MpiNoAddress",
     kMpi,
     {"LOOM_COMM_ID is not set (found OMPI_COMM_WORLD_RANK and OMPI_COMM_WORLD_SIZE)",
      "set LOOM_COMM_ID=host:port"}},
    {"MpiLocalRankNotANumber",
     plus(kMpi, {{"OMPI_COMM_WORLD_LOCAL_RANK", "z"}}),
     {"OMPI_COMM_WORLD_LOCAL_RANK=z is not an integer"}},
    {"SlurmNoTasks", {{"SLURM_PROCID", "0"}}, {"SLURM_NTASKS is not set (found SLURM_PROCID)"}},
    {"SlurmNotUnderSrun",
     {{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}},
     {"SLURM_STEP_ID is not set (found SLURM_PROCID and SLURM_NTASKS)", "srun"}},
    {"SlurmNoNodeList",
     kSlurm,
     {"SLURM_JOB_NODELIST is not set (found SLURM_PROCID and SLURM_NTASKS)", "LOOM_COMM_ID"}},
    {"SlurmBadNodeList",
     plus(kSlurm, {{"SLURM_JOB_NODELIST", "node[01-04"}}),
     {"SLURM_JOB_NODELIST=node[01-04 is not a Slurm node list", "not closed"}},
    {"SlurmBadCommPort",
     plus(kSlurm, {{"SLURM_NODELIST", "node1"}, {"LOOM_COMM_PORT", "0"}}),
     {"LOOM_COMM_PORT=0 is outside [1, 65535]"}},
    {"SlurmBadJobId",
     plus(kSlurm, {{"SLURM_NODELIST", "node1"}, {"SLURM_JOB_ID", "12a"}}),
     {"SLURM_JOB_ID=12a is not a non-negative integer"}},
    {"SlurmLocalIdTooLarge",
     plus(kSlurm, {{"SLURM_LOCALID", "2"}}),
     {"SLURM_LOCALID=2 is outside [0, SLURM_NTASKS=2)"}},
};

INSTANTIATE_TEST_SUITE_P(Cases, InitFromEnvError, ::testing::ValuesIn(kErrorCases),
                         [](const ::testing::TestParamInfo<ErrorCase>& info) {
                           return std::string(info.param.name);
                         });

// ---- The Slurm node-list parser ----

TEST(SlurmNodeList, FirstHost) {
  const std::pair<const char*, const char*> cases[] = {
      {"node01", "node01"},
      {"node[01-04,07]", "node01"},
      {"node[07,01-04]", "node07"},
      {"node[001-128]", "node001"},
      {"node[1-2],gpu[3-4]", "node1"},
      {"a1,b[2-3]", "a1"},
      {"gpu-a100-[01-04]", "gpu-a100-01"},
      {"n[1-2]-ib", "n1-ib"},
      {"rack[1-2]-node[03-04]", "rack1-node03"},
      {"127.0.0.[1-4,9]", "127.0.0.1"},
      {"host.example.org", "host.example.org"},
  };
  for (const auto& c : cases) {
    std::string why;
    EXPECT_EQ(loom::api::firstSlurmHost(c.first, &why), c.second) << c.first << ": " << why;
  }
}

TEST(SlurmNodeList, Malformed) {
  const std::pair<const char*, const char*> cases[] = {
      {"", "empty"},
      {",node1", "empty"},
      {"node[01-04", "not closed"},
      {"node]", "no matching '['"},
      {"node[]", "not a number"},
      {"node[a-b]", "not a number"},
      {"node[1-]", "not a number"},
      {"node[1,,2]", "not a number"},
      {"node[1[2]]", "not a number"},
      {"node 1", "white space"},
  };
  for (const auto& c : cases) {
    std::string why;
    EXPECT_EQ(loom::api::firstSlurmHost(c.first, &why), "") << c.first;
    EXPECT_NE(why.find(c.second), std::string::npos) << c.first << ": " << why;
  }
}

}  // namespace
}  // namespace loomtest
