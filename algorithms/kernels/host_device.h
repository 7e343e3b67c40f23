// LOOM_HOST_DEVICE marks a function compiled for both the host and CUDA devices: __host__
// __device__ under nvcc, nothing for a host compiler. The element-wise reduction functions
// (algorithms/kernels/elementwise.inc) carry it, so that the CPU and CUDA kernels share one
// source.
#pragma once

#if defined(__CUDACC__)
#define LOOM_HOST_DEVICE __host__ __device__
#else
#define LOOM_HOST_DEVICE
#endif
