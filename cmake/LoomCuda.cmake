# The CUDA part of the build: finds nvcc and, where it exists, enables the CUDA language.
#
# LOOM_CUDA=AUTO (default) builds the CUDA sources when nvcc is found (on PATH, through
# CMAKE_CUDA_COMPILER or CUDACXX, or at /usr/local/cuda/bin/nvcc), ON requires it, OFF builds
# CPU-only. No GPU is needed to build: the device code is compiled for sm_80 and sm_90 and as
# compute_90 PTX, which newer GPUs compile at load time. The CUDA runtime is linked statically
# (CUDA::cudart_static), so libloom loads where no driver is installed; there the runtime
# reports no device and Loom runs CPU-only.
#
# Sets LOOM_HAVE_CUDA (TRUE/FALSE) for the rest of the build.
set(LOOM_CUDA AUTO CACHE STRING "Build the CUDA path: AUTO (where nvcc is found), ON or OFF")
set_property(CACHE LOOM_CUDA PROPERTY STRINGS AUTO ON OFF)

set(LOOM_HAVE_CUDA FALSE)
if(NOT LOOM_CUDA STREQUAL "OFF")
  if(NOT CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX})
    find_program(LOOM_NVCC nvcc)
    if(NOT LOOM_NVCC AND EXISTS /usr/local/cuda/bin/nvcc)
      set(LOOM_NVCC /usr/local/cuda/bin/nvcc)
    endif()
    if(LOOM_NVCC)
      set(CMAKE_CUDA_COMPILER ${LOOM_NVCC})
    endif()
  endif()
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
    set(CMAKE_CUDA_ARCHITECTURES 80-real 90-real 90-virtual)
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    enable_language(CUDA)
    find_package(CUDAToolkit REQUIRED)
    set(LOOM_HAVE_CUDA TRUE)
    set(CMAKE_CUDA_STANDARD 17)
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    message(STATUS "Loom: CUDA ${CUDAToolkit_VERSION} at ${CMAKE_CUDA_COMPILER}, "
                   "architectures ${CMAKE_CUDA_ARCHITECTURES}")
  elseif(LOOM_CUDA STREQUAL "ON")
    message(FATAL_ERROR "LOOM_CUDA=ON but no CUDA compiler was found (set CMAKE_CUDA_COMPILER)")
  else()
    message(STATUS "Loom: no CUDA compiler found; building CPU-only")
  endif()
endif()

# Options for every CUDA source: no fused multiply-add (the kernels must match the CPU build bit
# for bit), IEEE division and subnormals (nvcc's defaults, stated), host warnings as for C++.
set(LOOM_CUDA_FLAGS --fmad=false -prec-div=true -ftz=false -Xcompiler=-Wall,-Wno-unused-parameter)
