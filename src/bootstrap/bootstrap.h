// Bootstrap: the rendezvous that lets nranks processes find each other.
//
// A unique id (unique_id.h) names a root: a TCP listener (Boost.Asio) run by a
// background thread of the process that made the id, or by rank 0 when
// LOOM_COMM_ID=host:port is set. Every rank connects to the root, answers its
// challenge with its rank, an opaque info blob and a MAC that proves it holds
// the id's secret (util/auth.h; the secret itself never travels), and checks
// the root's own MAC; once all nranks have joined, the root sends every rank
// the table of all blobs and its thread ends. Connections that cannot prove
// the secret (strangers, replays, garbage, half frames, oversized length
// fields) are closed and logged; the rendezvous goes on.
//
// The ranks then link into a ring of TCP connections (each rank connects to
// rank+1 and accepts rank-1, with the same challenge-response), over which
// allGather() and barrier() run for the communicator's lifetime.
//
// Thread safety: one thread uses a Bootstrap at a time. Every wait honours the
// timeout and the abort flag (checked at least every 100 ms); a peer that
// closes its socket is loomRemoteError naming that peer.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "loom/loom.h"
#include "util/status.h"

namespace loom::bootstrap {

constexpr size_t kSecretBytes = 32;
constexpr size_t kMaxInfoBytes = 64 * 1024;
// The most ranks a rendezvous takes: the root keeps a slot per rank, sized by the first hello.
constexpr int kMaxRanks = 1 << 20;

class Bootstrap {
 public:
  virtual ~Bootstrap() = default;

  // Joins the rendezvous of `id` as `rank` of `nranks` with this rank's blob
  // `info` (at most kMaxInfoBytes). Blocks until every rank has joined and the
  // ring is linked, or fails: loomInvalidArgument for a corrupted id,
  // loomTimeout after timeoutMs, loomRemoteError if the root or a ring
  // neighbour fails, loomInvalidUsage if *abortFlag becomes true.
  static Result<std::unique_ptr<Bootstrap>> join(const loomUniqueId& id, int rank, int nranks,
                                                 const std::string& info, int64_t timeoutMs,
                                                 const std::atomic<bool>* abortFlag);

  virtual int rank() const = 0;
  virtual int nranks() const = 0;
  // Every rank's info blob, indexed by rank.
  virtual const std::vector<std::string>& peerInfo() const = 0;
  // The id's secret (for transports to authenticate their own connections).
  virtual const std::string& secret() const = 0;
  // A 64-bit hash of the id, the same on every rank; names shm segments.
  virtual uint64_t commHash() const = 0;

  // all[r * bytes ...] = rank r's mine[0 .. bytes), over the ring.
  virtual Status allGather(const void* mine, void* all, size_t bytes) = 0;
  virtual Status barrier() = 0;
  // Closes the ring sockets so that neighbours waiting on this rank fail fast.
  virtual void abort() = 0;
  // The flag whose raising ends the ring's waits from now on, in place of join's (which may
  // not outlive the set-up: a split's parent's). Called before the ring is shared.
  virtual void setAbortFlag(const std::atomic<bool>* abortFlag) = 0;
};

}  // namespace loom::bootstrap
