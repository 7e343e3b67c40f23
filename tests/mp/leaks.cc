#include "leaks.h"

#include <dirent.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

namespace loomtest {
namespace {

int countEntries(const char* dir) {
  DIR* d = opendir(dir);
  if (d == nullptr) return -1;
  int n = 0;
  while (dirent* e = readdir(d))
    if (e->d_name[0] != '.') ++n;
  closedir(d);
  return n;
}

}  // namespace

Footprint footprint() { return {countEntries("/proc/self/fd"), countEntries("/proc/self/task")}; }

// The communicator's hash names its shared-memory segments (/dev/shm/loom-<hash>-<rank>); the
// flight-recorder dump is the public way to learn it.
uint64_t commHash(loomComm_t comm) {
  const std::string path = "/tmp/loom_fault_" + std::to_string(getpid()) + ".json";
  if (loomCommDumpTrace(comm, path.c_str()) != loomSuccess) return 0;
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  unlink(path.c_str());
  const std::string json = text.str(), key = "\"commHash\":\"";
  const size_t at = json.find(key);
  return at == std::string::npos ? 0 : strtoull(json.c_str() + at + key.size(), nullptr, 16);
}

std::vector<std::string> segmentsOf(uint64_t hash, int nranks) {
  std::vector<std::string> left;
  for (int r = 0; r < nranks; ++r) {
    char path[96];
    snprintf(path, sizeof(path), "/dev/shm/loom-%016llx-%d", static_cast<unsigned long long>(hash),
             r);
    if (access(path, F_OK) == 0) left.push_back(path);
  }
  return left;
}

// Problems with what this rank still holds, against `before` (taken before its first init).
// Threads and fds get a moment to go: a rendezvous root thread ends once every rank joined.
std::vector<std::string> leaks(const Footprint& before, const std::vector<uint64_t>& hashes,
                               int nranks) {
  Footprint now = footprint();
  for (int i = 0; i < 200 && (now.fds != before.fds || now.threads != before.threads); ++i) {
    usleep(10000);
    now = footprint();
  }
  std::vector<std::string> problems;
  if (now.fds != before.fds)
    problems.push_back(std::to_string(now.fds) + " open fds, " + std::to_string(before.fds) +
                       " before init");
  if (now.threads != before.threads)
    problems.push_back(std::to_string(now.threads) + " threads, " +
                       std::to_string(before.threads) + " before init");
  for (uint64_t h : hashes) {
    if (h == 0) problems.push_back("could not learn a communicator's hash");
    for (const std::string& s : segmentsOf(h, nranks)) problems.push_back(s + " remains");
  }
  return problems;
}

}  // namespace loomtest
