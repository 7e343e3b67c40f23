// loomCommShrink: a communicator of the ranks that stay, built without the ranks left out.
//
// Which channel survives a death? Not the parent's bootstrap ring (it passes through every
// rank), nor its data connections (a failure breaks them all so that peers fail fast). So
// nothing travels: every rank that stays derives the same new id by itself. The secret comes
// from the parent's secret, the number of shrinks the parent has seen and the excluded set;
// the root is hosted by the lowest rank that stays (rank 0 of the new communicator, as under
// LOOM_COMM_ID) at the IP address of its parent's transport listener, which every rank learnt
// at the parent's rendezvous, on a port derived from the new secret below the ephemeral range
// (the listener's own port, free once the parent was set up, could meanwhile be taken by any
// socket bound to port 0).
// Ranks that stay agree on the excluded set because the caller passes it, as with NCCL's
// ncclCommShrink; a rank that should have been excluded but was not makes the new
// rendezvous time out, naming it.
#include <algorithm>
#include <string>
#include <vector>

#include "api/api.h"
#include "bootstrap/unique_id.h"
#include "util/wait.h"

namespace loom::api {

Status shrink(loomComm* h, const int* exclude, int count, loomComm_t* newcomm,
              const loomConfig_t* config, int flags) {
  LOOM_ASSIGN(Comm * comm, lookup(h));
  if (newcomm == nullptr) return LOOM_ERROR(loomInvalidArgument, "newcomm: NULL");
  *newcomm = nullptr;
  LOOM_CHECK(checkNotFinalized(h));
  if (flags != LOOM_SHRINK_DEFAULT && flags != LOOM_SHRINK_ABORT)
    return LOOM_ERROR(loomInvalidArgument, "shrinkFlags: " + std::to_string(flags) +
                                               " is not LOOM_SHRINK_DEFAULT or LOOM_SHRINK_ABORT");
  if (count < 0)
    return LOOM_ERROR(loomInvalidArgument,
                      "excludeRanksCount: " + std::to_string(count) + " is negative");
  if (count > 0 && exclude == nullptr)
    return LOOM_ERROR(loomInvalidArgument,
                      "excludeRanksList: NULL with excludeRanksCount " + std::to_string(count));
  const int n = comm->nranks(), me = comm->rank();
  std::vector<char> excluded(static_cast<size_t>(n), 0);
  for (int i = 0; i < count; ++i) {
    const int x = exclude[i];
    if (x < 0 || x >= n)
      return LOOM_ERROR(loomInvalidArgument, "excludeRanksList[" + std::to_string(i) +
                                                 "]: " + std::to_string(x) + " is outside [0, " +
                                                 std::to_string(n) + ")");
    excluded[static_cast<size_t>(x)] = 1;
  }
  if (excluded[static_cast<size_t>(me)])
    return LOOM_ERROR(loomInvalidUsage, "excludeRanksList: names this rank (" + std::to_string(me) +
                                            "); excluded ranks must not call loomCommShrink");
  LOOM_ASSIGN(CommOptions opts, resolveConfig(config, &comm->options()));
  if (flags == LOOM_SHRINK_ABORT) {
    comm->abort();
  } else if (h->worker && !h->worker->waitIdle(nowNs() + comm->options().timeoutMs * 1000000)) {
    return LOOM_ERROR(loomTimeout, "comm: queued operations did not finish within the timeout");
  }
  int leader = -1, newRank = 0, stay = 0;
  std::string text =
      "loomCommShrink\n" + comm->bootstrap().secret() + "\n" + std::to_string(++h->shrinks) + "\n";
  for (int r = 0; r < n; ++r) {
    if (excluded[static_cast<size_t>(r)]) {
      text += std::to_string(r) + ",";
      continue;
    }
    if (leader < 0) leader = r;
    if (r == me) newRank = stay;
    ++stay;
  }
  loomUniqueId id;
  LOOM_CHECK(bootstrap::makeDerivedUniqueId(comm->peer(leader).tcpAddr, text, &id));
  // Under the parent's operation lock, so that a loomCommAbort of the parent on another thread
  // ends a blocking creation (and waits for it) instead of freeing the parent under it.
  std::lock_guard<FutexMutex> lock(comm->opMutex());
  return initComm(newcomm, stay, id, newRank, opts, h);
}

}  // namespace loom::api

extern "C" loomResult_t loomCommShrink(loomComm_t comm, int* excludeRanksList,
                                       int excludeRanksCount, loomComm_t* newcomm,
                                       loomConfig_t* config, int shrinkFlags) {
  return loom::api::guard("loomCommShrink", [&] {
    return loom::api::shrink(comm, excludeRanksList, excludeRanksCount, newcomm, config,
                             shrinkFlags);
  });
}
