#include "transport/ib/verbs.h"

#include <dlfcn.h>

#include <cstring>
#include <mutex>
#include <type_traits>

namespace loom::transport::ib {

int Verbs::queryPort(ibv_context* ctx, uint8_t port, ibv_port_attr* attr) const {
  verbs_context* vctx = verbs_get_ctx_op(ctx, query_port);
  if (vctx != nullptr) return vctx->query_port(ctx, port, attr, sizeof(*attr));
  std::memset(attr, 0, sizeof(*attr));
  return queryPortCompat(ctx, port, reinterpret_cast<struct _compat_ibv_port_attr*>(attr));
}

const Verbs* loadVerbsFrom(const std::string& path, std::string* why) {
  void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* e = dlerror();
    *why = "cannot load " + path + ": " + (e != nullptr ? e : "unknown error");
    return nullptr;
  }
  auto* v = new Verbs();
  bool ok = true;
  auto bind = [&](auto& fn, const char* name) {
    void* sym = dlsym(lib, name);
    if (sym == nullptr && ok) {
      ok = false;
      *why = path + " lacks " + name;
    }
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(sym);
  };
  bind(v->getDeviceList, "ibv_get_device_list");
  bind(v->freeDeviceList, "ibv_free_device_list");
  bind(v->getDeviceName, "ibv_get_device_name");
  bind(v->openDevice, "ibv_open_device");
  bind(v->closeDevice, "ibv_close_device");
  bind(v->queryDevice, "ibv_query_device");
  bind(v->queryPortCompat, "ibv_query_port");
  bind(v->queryGid, "ibv_query_gid");
  bind(v->allocPd, "ibv_alloc_pd");
  bind(v->deallocPd, "ibv_dealloc_pd");
  bind(v->regMr, "ibv_reg_mr");
  bind(v->deregMr, "ibv_dereg_mr");
  bind(v->createCompChannel, "ibv_create_comp_channel");
  bind(v->destroyCompChannel, "ibv_destroy_comp_channel");
  bind(v->createCq, "ibv_create_cq");
  bind(v->destroyCq, "ibv_destroy_cq");
  bind(v->getCqEvent, "ibv_get_cq_event");
  bind(v->ackCqEvents, "ibv_ack_cq_events");
  bind(v->createQp, "ibv_create_qp");
  bind(v->modifyQp, "ibv_modify_qp");
  bind(v->destroyQp, "ibv_destroy_qp");
  bind(v->wcStatusStr, "ibv_wc_status_str");
  // GPUDirect RDMA through dma-buf (gdr.h); an older library simply lacks it.
  v->regDmabufMr = reinterpret_cast<decltype(v->regDmabufMr)>(dlsym(lib, "ibv_reg_dmabuf_mr"));
  if (!ok) {
    delete v;
    dlclose(lib);
    return nullptr;
  }
  return v;
}

const Verbs* loadVerbs(std::string* why) {
  static std::once_flag once;
  static const Verbs* verbs = nullptr;
  static std::string reason;
  std::call_once(once, [] { verbs = loadVerbsFrom("libibverbs.so.1", &reason); });
  *why = reason;
  return verbs;
}

}  // namespace loom::transport::ib
