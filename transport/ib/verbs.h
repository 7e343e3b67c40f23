// libibverbs, loaded at run time.
//
// libloom does not link libibverbs: machines without rdma-core still load it,
// and the ib transport reports at INFO why it is off. Every entry point the
// transport calls is listed here, in one place, and resolved with dlsym.
// The calls verbs.h implements inline (posting work requests, polling and
// arming completion queues, querying a port) go through the device context's
// own function table and need no symbol.
#pragma once

#include <infiniband/verbs.h>

#include <string>

namespace loom::transport::ib {

struct Verbs {
  ibv_device** (*getDeviceList)(int*);
  void (*freeDeviceList)(ibv_device**);
  const char* (*getDeviceName)(ibv_device*);
  ibv_context* (*openDevice)(ibv_device*);
  int (*closeDevice)(ibv_context*);
  int (*queryDevice)(ibv_context*, ibv_device_attr*);
  int (*queryPortCompat)(ibv_context*, uint8_t, struct _compat_ibv_port_attr*);
  int (*queryGid)(ibv_context*, uint8_t, int, ibv_gid*);
  ibv_pd* (*allocPd)(ibv_context*);
  int (*deallocPd)(ibv_pd*);
  ibv_mr* (*regMr)(ibv_pd*, void*, size_t, int);
  int (*deregMr)(ibv_mr*);
  ibv_comp_channel* (*createCompChannel)(ibv_context*);
  int (*destroyCompChannel)(ibv_comp_channel*);
  ibv_cq* (*createCq)(ibv_context*, int, void*, ibv_comp_channel*, int);
  int (*destroyCq)(ibv_cq*);
  int (*getCqEvent)(ibv_comp_channel*, ibv_cq**, void**);
  void (*ackCqEvents)(ibv_cq*, unsigned int);
  ibv_qp* (*createQp)(ibv_pd*, ibv_qp_init_attr*);
  int (*modifyQp)(ibv_qp*, ibv_qp_attr*, int);
  int (*destroyQp)(ibv_qp*);
  const char* (*wcStatusStr)(ibv_wc_status);
  // Optional (rdma-core 34 and later): nullptr where the library lacks it.
  ibv_mr* (*regDmabufMr)(ibv_pd*, uint64_t, size_t, uint64_t, int, int);

  // Port attributes through the context's table where the provider has one
  // (as verbs.h's inline query does), else the exported compatibility call.
  int queryPort(ibv_context* ctx, uint8_t port, ibv_port_attr* attr) const;
};

// The library, loaded on first use from `path` (default libibverbs.so.1), or
// nullptr with *why saying what failed. Thread-safe; the default library is
// loaded once per process and never unloaded.
const Verbs* loadVerbs(std::string* why);
const Verbs* loadVerbsFrom(const std::string& path, std::string* why);

}  // namespace loom::transport::ib
