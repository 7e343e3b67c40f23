// The unique id: 128 opaque bytes that carry the rendezvous root's address, a
// random secret and a checksum, so a corrupted id is rejected, not trusted.
#pragma once

#include <netinet/in.h>

#include <atomic>
#include <cstdint>
#include <string>

#include "bootstrap/bootstrap.h"
#include "loom/loom.h"
#include "util/status.h"

namespace loom::bootstrap {

struct IdContents {
  sockaddr_in root{};        // where the rendezvous root listens
  std::string secret;        // kSecretBytes bytes
  bool rootOnRank0 = false;  // LOOM_COMM_ID: rank 0 starts the root in join()
};

// Makes a fresh id. Without LOOM_COMM_ID, starts the root in a background
// thread of this process (it ends when all ranks have joined or after the
// timeout). With LOOM_COMM_ID=host:port, the id names that address, the
// secret comes from LOOM_COMM_SECRET (else from the LOOM_COMM_ID text), and
// rank 0 starts the root in join().
Status makeUniqueId(loomUniqueId* out);

// The id makeUniqueId gives with LOOM_COMM_ID=hostPort, for an address that came from elsewhere
// (loomCommInitFromEnv: MASTER_ADDR, a Slurm node list): every process that passes the same text
// gets the same id, and rank 0 starts the root in join(). varName names the source in errors.
Status makeUniqueIdFor(const std::string& hostPort, const char* varName, loomUniqueId* out);

// An id whose root rank 0 hosts at `host`'s address, with a secret derived from `text`: every
// process that passes the same arguments gets the same id (loomCommShrink derives one on every
// survivor from the parent's secret, so no id travels). The port comes from the secret too, in
// [10000, 32768): below Linux's default range of ephemeral ports, so no socket another rank
// binds or connects meanwhile can already hold it.
Status makeDerivedUniqueId(const sockaddr_in& host, const std::string& text, loomUniqueId* out);

// Makes a fresh id whose root always runs in a background thread of this
// process, whatever LOOM_COMM_ID says: for communicators made inside a running
// job (loomCommInitAll, loomCommSplit), which must not reuse the fixed address.
Status makeLocalUniqueId(loomUniqueId* out);

// Checks magic and checksum. loomInvalidArgument "commId: ..." if corrupted.
Result<IdContents> parseUniqueId(const loomUniqueId& id);
void encodeUniqueId(const IdContents& c, loomUniqueId* out);

// Implementation details exposed for tests.

// makeLocalUniqueId whose root gives up after rootTimeoutMs instead of
// env::timeoutMs().
Status makeLocalUniqueId(loomUniqueId* out, int64_t rootTimeoutMs);

// Runs a rendezvous root on listenFd (a bound, listening TCP socket that it
// takes over and closes) for ranks whose count it learns from the first valid
// hello; used by makeUniqueId and by rank 0 under LOOM_COMM_ID (bootstrap.cc).
// Returns once every rank has been sent the table, after timeoutMs, or when
// *stop (if not null) becomes true.
Status runRoot(int listenFd, const std::string& secret, int64_t timeoutMs,
               const std::atomic<bool>* stop);

// What the root at `root` has heard so far ("2 of 3 ranks joined; missing rank(s) 1") when this
// process hosts it and it still waits for ranks; "" otherwise.
std::string hostedRootProgress(const sockaddr_in& root);

// Called by join() on the joining thread with the rank's ring listener address
// as soon as it listens, before the rank contacts the root (null: none). The
// hook may replace *addr, the address the rank publishes for its ring listener
// (a test puts a recording proxy, or a fake listener, in front of it).
using RingListenHook = void (*)(int rank, sockaddr_in* addr);
void setRingListenHookForTest(RingListenHook hook);

}  // namespace loom::bootstrap
