// GPUDirect RDMA: registering CUDA device memory with the RDMA device, so the
// NIC reads a registered device buffer in place instead of the host staging it.
//
// Three ways to register a buffer, chosen per buffer by chooseRegistration():
//   DmaBuf   the driver exports the range as a dma-buf fd
//            (cuMemGetHandleForAddressRange, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD)
//            and ibv_reg_dmabuf_mr registers it; needs the GPU's
//            CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED, a driver exporting the call and
//            an rdma-core with ibv_reg_dmabuf_mr (rdma-core 34, Linux 5.12).
//   PeerMem  ibv_reg_mr on the device pointer itself, which works where the
//            nvidia-peermem (or the older nv_peer_mem) kernel module is loaded.
//   Staged   no registration: the buffer goes through host memory as any
//            unregistered device buffer does (src/api/device.cc).
// Host memory is registered with ibv_reg_mr (Host). LOOM_GDR_DISABLE=1 stages
// every device buffer. A failed dma-buf registration falls back to peer memory,
// then to staging; the reason is logged at INFO.
//
// The CUDA driver (libcuda.so.1) is loaded with dlopen, as libibverbs is: a
// build or a host without it stages. Thread-safe; the driver table is loaded
// once per process and never unloaded.
#pragma once

#include <cstdint>
#include <string>

namespace loom::transport::ib {

enum class Registration { Host, DmaBuf, PeerMem, Staged };
const char* registrationName(Registration r);

// What is known about one buffer and this host, for the choice.
struct GdrCaps {
  bool device = false;        // the buffer is CUDA device memory
  bool disabled = false;      // LOOM_GDR_DISABLE=1
  bool driver = false;        // libcuda.so.1 loaded and answers for the buffer's GPU
  bool driverDmaBuf = false;  // the driver exports cuMemGetHandleForAddressRange
  bool gpuDmaBuf = false;     // the GPU's CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED
  bool verbsDmaBuf = false;   // libibverbs exports ibv_reg_dmabuf_mr
  bool peerMem = false;       // a peer-memory kernel module is loaded
};

// The registration to try first; *why says why a device buffer is not DmaBuf
// (empty when it is). Pure: unit-tested without a GPU.
Registration chooseRegistration(const GdrCaps& caps, std::string* why);
// The next registration to try when `failed` did not work for this buffer.
Registration fallbackAfter(Registration failed, const GdrCaps& caps);

// The CUDA driver's view of one address.
struct DevicePointer {
  bool device = false;  // CUDA device memory
  int ordinal = -1;     // its GPU
};

// libcuda.so.1's calls that GPUDirect needs, loaded on first use.
class CudaDriver {
 public:
  // The process's driver table, or nullptr with *why saying why (a build without
  // cuda.h, no library, cuInit failed). Loaded once.
  static const CudaDriver* get(std::string* why);

  DevicePointer classify(const void* p) const;
  bool dmaBufSupported(int ordinal) const;  // CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED
  bool exportsDmaBuf() const;               // cuMemGetHandleForAddressRange exists
  // A dma-buf fd for [base, base + bytes) (both page-aligned), or -1 with *why.
  int dmaBufFd(uintptr_t base, size_t bytes, std::string* why) const;
  // PCI bus id of device `ordinal` ("0000:10:1c.0", lower case), empty when unknown.
  std::string busId(int ordinal) const;

  struct Table;  // the resolved symbols (gdr.cc)

 private:
  explicit CudaDriver(const Table* t) : t_(t) {}
  const Table* t_;
};

// Whether a peer-memory kernel module (nvidia_peermem, nv_peer_mem) is loaded.
bool peerMemLoaded();

}  // namespace loom::transport::ib
