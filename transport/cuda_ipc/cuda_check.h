// LOOM_CUDA_CHECK(call): a failed CUDA runtime call becomes a Status (loomUnhandledCudaError)
// that names the call and the CUDA error, returned from the enclosing function.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "util/status.h"

namespace loom::cuda {

inline Status cudaStatus(cudaError_t e, const char* call) {
  if (e == cudaSuccess) return Status::ok();
  return Status(loomUnhandledCudaError, std::string(call) + " failed: " + cudaGetErrorName(e) +
                                            ": " + cudaGetErrorString(e));
}

}  // namespace loom::cuda

#define LOOM_CUDA_CHECK(call) LOOM_CHECK(::loom::cuda::cudaStatus((call), #call))
