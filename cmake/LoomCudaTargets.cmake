# The CUDA targets (where cmake/LoomCuda.cmake found nvcc), included by CMakeLists.txt after the
# CPU libraries:
#   loom_kernels_cuda   algorithms/kernels/cuda: reduction and copy kernels
#   loom_transport_cuda transport/cuda_ipc: the cuda_ipc all-reduce (set-up and kernels)
# and, into libloom, src/api/device.cc (collectives on device buffers) with the CUDA runtime
# linked statically.
if(NOT LOOM_HAVE_CUDA)
  return()
endif()

add_library(loom_kernels_cuda STATIC algorithms/kernels/cuda/reduce.cu)
loom_layer(loom_kernels_cuda PUBLIC DIRS algorithms/kernels/cuda)
target_compile_options(loom_kernels_cuda PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:${LOOM_CUDA_FLAGS}>)
target_link_libraries(loom_kernels_cuda PUBLIC loom_kernels CUDA::cudart_static)

# Its kernels are built from the device reduction (algorithms/kernels/cuda/reduce_device.cuh),
# so it links loom_kernels_cuda (and through it loom_kernels), not the CPU kernels alone.
add_library(loom_transport_cuda STATIC transport/cuda_ipc/ipc.cc transport/cuda_ipc/ipc_kernels.cu)
loom_layer(loom_transport_cuda PUBLIC DIRS transport/cuda_ipc)
target_compile_options(loom_transport_cuda PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:${LOOM_CUDA_FLAGS}>)
target_link_libraries(loom_transport_cuda PUBLIC loom_util loom_kernels_cuda CUDA::cudart_static)

target_sources(loom PRIVATE src/api/device.cc)
target_compile_definitions(loom PRIVATE LOOM_HAVE_CUDA=1)
target_link_libraries(loom PRIVATE loom_transport_cuda CUDA::cudart_static)
