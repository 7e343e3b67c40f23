#include "transport/ib/gdr.h"

#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <mutex>

#ifdef LOOM_HAVE_CUDA_DRIVER_API
#include <cuda.h>
#endif

namespace loom::transport::ib {

const char* registrationName(Registration r) {
  switch (r) {
    case Registration::Host:
      return "host memory";
    case Registration::DmaBuf:
      return "GPUDirect RDMA (dma-buf)";
    case Registration::PeerMem:
      return "GPUDirect RDMA (peer memory)";
    case Registration::Staged:
      return "host staging";
  }
  return "?";
}

Registration chooseRegistration(const GdrCaps& caps, std::string* why) {
  why->clear();
  if (!caps.device) return Registration::Host;
  if (caps.disabled) {
    *why = "LOOM_GDR_DISABLE=1";
    return Registration::Staged;
  }
  if (!caps.driver) {
    *why = "the CUDA driver is not usable here";
    return Registration::Staged;
  }
  if (caps.driverDmaBuf && caps.gpuDmaBuf && caps.verbsDmaBuf) return Registration::DmaBuf;
  if (!caps.driverDmaBuf)
    *why = "the CUDA driver lacks cuMemGetHandleForAddressRange";
  else if (!caps.gpuDmaBuf)
    *why = "the GPU does not support dma-buf";
  else
    *why = "libibverbs lacks ibv_reg_dmabuf_mr";
  if (caps.peerMem) return Registration::PeerMem;
  *why += ", and no peer-memory module (nvidia_peermem) is loaded";
  return Registration::Staged;
}

Registration fallbackAfter(Registration failed, const GdrCaps& caps) {
  if (failed == Registration::DmaBuf && caps.peerMem && !caps.disabled)
    return Registration::PeerMem;
  return Registration::Staged;
}

bool peerMemLoaded() {
  return access("/sys/module/nvidia_peermem", F_OK) == 0 ||
         access("/sys/kernel/mm/memory_peers/nv_mem/version", F_OK) == 0;
}

#ifdef LOOM_HAVE_CUDA_DRIVER_API

struct CudaDriver::Table {
  decltype(&::cuInit) init = nullptr;
  decltype(&::cuDeviceGet) deviceGet = nullptr;
  decltype(&::cuDeviceGetAttribute) deviceGetAttribute = nullptr;
  decltype(&::cuDeviceGetPCIBusId) deviceGetPciBusId = nullptr;
  decltype(&::cuPointerGetAttribute) pointerGetAttribute = nullptr;
  decltype(&::cuGetErrorString) getErrorString = nullptr;
  decltype(&::cuMemGetHandleForAddressRange) getHandle = nullptr;  // optional (CUDA 11.7)
};

const CudaDriver* CudaDriver::get(std::string* why) {
  static std::once_flag once;
  static const CudaDriver* driver = nullptr;
  static std::string reason;
  std::call_once(once, [] {
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      const char* e = dlerror();
      reason = std::string("cannot load libcuda.so.1: ") + (e != nullptr ? e : "unknown error");
      return;
    }
    auto* t = new Table();
    bool ok = true;
    auto bind = [&](auto& fn, const char* name, bool required) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, name));
      if (fn == nullptr && required && ok) {
        ok = false;
        reason = std::string("libcuda.so.1 lacks ") + name;
      }
    };
    bind(t->init, "cuInit", true);
    bind(t->deviceGet, "cuDeviceGet", true);
    bind(t->deviceGetAttribute, "cuDeviceGetAttribute", true);
    bind(t->deviceGetPciBusId, "cuDeviceGetPCIBusId", true);
    bind(t->pointerGetAttribute, "cuPointerGetAttribute", true);
    bind(t->getErrorString, "cuGetErrorString", true);
    bind(t->getHandle, "cuMemGetHandleForAddressRange", false);
    if (ok && t->init(0) != CUDA_SUCCESS) {
      ok = false;
      reason = "cuInit failed (no GPU or no working driver)";
    }
    if (!ok) {
      delete t;
      dlclose(lib);
      return;
    }
    driver = new CudaDriver(t);
  });
  *why = reason;
  return driver;
}

DevicePointer CudaDriver::classify(const void* p) const {
  DevicePointer out;
  const auto ptr = static_cast<CUdeviceptr>(reinterpret_cast<uintptr_t>(p));
  unsigned int type = 0;
  if (t_->pointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, ptr) != CUDA_SUCCESS ||
      type != CU_MEMORYTYPE_DEVICE)
    return out;  // host memory, or memory the driver does not know
  int ordinal = -1;
  if (t_->pointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, ptr) != CUDA_SUCCESS)
    ordinal = -1;
  out.device = true;
  out.ordinal = ordinal;
  return out;
}

bool CudaDriver::dmaBufSupported(int ordinal) const {
  CUdevice dev = 0;
  int value = 0;
  if (ordinal < 0 || t_->deviceGet(&dev, ordinal) != CUDA_SUCCESS) return false;
  return t_->deviceGetAttribute(&value, CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED, dev) ==
             CUDA_SUCCESS &&
         value != 0;
}

bool CudaDriver::exportsDmaBuf() const { return t_->getHandle != nullptr; }

int CudaDriver::dmaBufFd(uintptr_t base, size_t bytes, std::string* why) const {
  int fd = -1;
  const CUresult rc = t_->getHandle(&fd, static_cast<CUdeviceptr>(base), bytes,
                                    CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
  if (rc != CUDA_SUCCESS) {
    const char* s = nullptr;
    t_->getErrorString(rc, &s);
    *why = std::string("cuMemGetHandleForAddressRange: ") + (s != nullptr ? s : "error");
    return -1;
  }
  return fd;
}

std::string CudaDriver::busId(int ordinal) const {
  CUdevice dev = 0;
  char id[64] = "";
  if (ordinal < 0 || t_->deviceGet(&dev, ordinal) != CUDA_SUCCESS ||
      t_->deviceGetPciBusId(id, sizeof(id), dev) != CUDA_SUCCESS)
    return "";
  std::string s = id;
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

#else  // a build without cuda.h: no driver table, device buffers stage

struct CudaDriver::Table {};

const CudaDriver* CudaDriver::get(std::string* why) {
  *why = "built without the CUDA driver API header (cuda.h)";
  return nullptr;
}
DevicePointer CudaDriver::classify(const void*) const { return {}; }
bool CudaDriver::dmaBufSupported(int) const { return false; }
bool CudaDriver::exportsDmaBuf() const { return false; }
int CudaDriver::dmaBufFd(uintptr_t, size_t, std::string* why) const {
  *why = "built without cuda.h";
  return -1;
}
std::string CudaDriver::busId(int) const { return ""; }

#endif

}  // namespace loom::transport::ib
