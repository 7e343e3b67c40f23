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

// " tid (name) state wchan" for every thread of this process, to tell which one is left.
std::string threadList() {
  std::string out;
  DIR* d = opendir("/proc/self/task");
  if (d == nullptr) return out;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    const std::string dir = std::string("/proc/self/task/") + e->d_name;
    std::ifstream stat(dir + "/stat"), wchan(dir + "/wchan");
    std::string st, wc;
    std::getline(stat, st);
    std::getline(wchan, wc);
    const size_t open = st.find('('), close = st.rfind(')');
    out += " " + std::string(e->d_name) +
           (open != std::string::npos && close != std::string::npos
                ? " " + st.substr(open, close - open + 1) + " " + st.substr(close + 2, 1)
                : "") +
           " " + wc;
  }
  closedir(d);
  return out;
}

}  // namespace

// Threads of this process; without those asleep in nanosleep when `skipSleepers` (under
// ThreadSanitizer: its background threads, started lazily and after fork too, sleep there;
// Loom's threads never do).
static int countThreads(bool skipSleepers) {
  int n = 0;
  DIR* d = opendir("/proc/self/task");
  if (d == nullptr) return -1;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    std::string wc;
    if (skipSleepers) {
      std::ifstream wchan(std::string("/proc/self/task/") + e->d_name + "/wchan");
      std::getline(wchan, wc);
    }
    if (wc != "hrtimer_nanosleep") ++n;
  }
  closedir(d);
  return n;
}

Footprint footprint() { return {countEntries("/proc/self/fd"), countThreads(false)}; }

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
#if defined(__SANITIZE_THREAD__)
  // ThreadSanitizer's own threads come and go: only more threads than before is a leak.
  auto sample = [] { return Footprint{countEntries("/proc/self/fd"), countThreads(true)}; };
  auto threadsLeft = [&](const Footprint& f) { return f.threads > before.threads; };
#else
  auto sample = [] { return footprint(); };
  auto threadsLeft = [&](const Footprint& f) { return f.threads != before.threads; };
#endif
  Footprint now = sample();
  for (int i = 0; i < 200 && (now.fds != before.fds || threadsLeft(now)); ++i) {
    usleep(10000);
    now = sample();
  }
  std::vector<std::string> problems;
  if (now.fds != before.fds)
    problems.push_back(std::to_string(now.fds) + " open fds, " + std::to_string(before.fds) +
                       " before init");
  if (threadsLeft(now))
    problems.push_back(std::to_string(now.threads) + " threads, " + std::to_string(before.threads) +
                       " before init:" + threadList());
  for (uint64_t h : hashes) {
    if (h == 0) problems.push_back("could not learn a communicator's hash");
    for (const std::string& s : segmentsOf(h, nranks)) problems.push_back(s + " remains");
  }
  return problems;
}

}  // namespace loomtest
