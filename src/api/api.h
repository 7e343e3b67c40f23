// Internals of the C API shared by api.cc and group.cc: the handle behind
// loomComm_t, the guard every entry point runs in, and the queued calls that
// groups collect.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "algorithms/schedule.h"
#include "comm/comm.h"
#include "loom/loom.h"

struct loomComm {
  std::unique_ptr<loom::Comm> impl;
};

namespace loom::api {

// Runs f, turning every failure (a Status or an exception) into a result
// code and this thread's last-error text. Nothing escapes.
loomResult_t guard(const char* fn, const std::function<Status()>& f);
void setLastError(const std::string& message);

// Registry of live communicators, so a destroyed or bogus handle is an error.
void registerComm(loomComm* c);
void unregisterComm(loomComm* c);
// loomInvalidArgument naming `argName` unless c is a live communicator.
Result<Comm*> lookup(loomComm* c, const char* argName = "comm");

// One queued call: a collective or one side of a send/receive.
struct Call {
  enum Kind { Collective, Send, Recv } kind = Collective;
  algo::Coll coll = algo::Coll::AllReduce;
  const void* sendbuff = nullptr;
  void* recvbuff = nullptr;
  size_t count = 0;
  loomDataType_t dtype = loomFloat32;
  loomRedOp_t op = loomSum;
  int root = -1;  // root, or peer for Send/Recv
  loomComm* comm = nullptr;
  loomStream_t stream = nullptr;  // device buffers only (api/device.h)
};

// The reduction of a call (built-in op or the communicator's PreMulSum).
Result<kernels::Reducer> reducerFor(Comm& comm, const Call& c);

// Runs the call now, or queues it when this thread is inside a group.
Status submit(const Call& call);
bool inGroup();

// Runs calls of one communicator: sends/receives together first, then the
// collectives in call order (every rank issues the same sequence).
Status runOnComm(Comm& comm, const std::vector<Call>& calls);

}  // namespace loom::api
