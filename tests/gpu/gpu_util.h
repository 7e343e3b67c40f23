// Helpers of the GPU tests: whether this machine has a CUDA device (asked in a forked child, so
// the test process itself never initialises CUDA before the harness forks ranks), and a check
// macro that reports the failing CUDA call.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace loomtest {

// "" when a CUDA device exists, else why not (the skip reason).
inline std::string noDeviceReason() {
  static const std::string reason = [] {
    int fds[2];
    if (pipe(fds) != 0) return std::string("pipe failed");
    const pid_t pid = fork();
    if (pid == 0) {
      int n = 0;
      const cudaError_t e = cudaGetDeviceCount(&n);
      char msg[256];
      std::snprintf(msg, sizeof(msg), "%s",
                    e != cudaSuccess ? cudaGetErrorString(e)
                    : n == 0         ? "0 devices"
                                     : "");
      (void)!write(fds[1], msg, std::string(msg).size());
      _exit(0);
    }
    close(fds[1]);
    char buf[256] = {};
    const ssize_t got = read(fds[0], buf, sizeof(buf) - 1);
    close(fds[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    if (got < 0) return std::string("cannot ask a child process");
    return got == 0 ? std::string()
                    : "no CUDA device (" + std::string(buf, static_cast<size_t>(got)) + ")";
  }();
  return reason;
}

// LOOM_GPU_REQUIRED=1 (tests/gpu/run.sh sets it): a missing device fails the test instead of
// skipping it, so that a GPU machine where CUDA cannot start is not reported as passing.
inline bool gpuRequired() {
  const char* v = std::getenv("LOOM_GPU_REQUIRED");
  return v != nullptr && std::strcmp(v, "1") == 0;
}

}  // namespace loomtest

// In a test body or SetUp(): skips where there is no CUDA device (fails where one is required).
#define LOOM_SKIP_WITHOUT_GPU()                               \
  do {                                                        \
    const std::string loom_why_ = loomtest::noDeviceReason(); \
    if (!loom_why_.empty()) {                                 \
      if (loomtest::gpuRequired()) FAIL() << loom_why_;       \
      GTEST_SKIP() << loom_why_;                              \
    }                                                         \
  } while (0)

// In a rank: prints the failed call and returns 1 from the rank function.
#define GPU_CHECK(call)                                                         \
  do {                                                                          \
    const cudaError_t gpu_e_ = (call);                                          \
    if (gpu_e_ != cudaSuccess) {                                                \
      std::fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #call, \
                   cudaGetErrorString(gpu_e_));                                 \
      return 1;                                                                 \
    }                                                                           \
  } while (0)
