// Fuzzes the rendezvous root (src/bootstrap/unique_id.cc: hellos as src/bootstrap/wire.h lays
// them out). Each input is the bytes of up to four connections, separated by "LMFZ"; a real
// root (runRoot) is started on a loopback listener per input, every connection sends its bytes
// and half-closes, and the target waits briefly for the root to answer and close.
//
// Checked besides crashes and sanitizer reports: the root never sends a byte to a connection
// whose bytes do not start with the hello magic and the secret (strangers learn nothing), and
// it never allocates by a length field (libFuzzer's -malloc_limit_mb catches that).
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "bootstrap/unique_id.h"
#include "bootstrap/wire.h"
#include "fuzz_net.h"

using namespace loom::bootstrap;

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  setenv("LOOM_DEBUG", "NONE", 1);  // every stranger is logged as a warning otherwise
  return 0;
}

namespace {

std::vector<std::string> splitConnections(const std::string& in) {
  std::vector<std::string> out;
  size_t start = 0;
  while (out.size() < 4) {
    size_t sep = in.find("LMFZ", start);
    out.push_back(in.substr(start, sep == std::string::npos ? std::string::npos : sep - start));
    if (sep == std::string::npos) break;
    start = sep + 4;
  }
  return out;
}

bool authenticated(const std::string& bytes) {
  if (bytes.size() < 4 + kSecretBytes) return false;
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  return get32(p) == kHelloMagic && bytes.compare(4, kSecretBytes, loomfuzz::fuzzSecret()) == 0;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<std::string> conns =
      splitConnections(std::string(reinterpret_cast<const char*>(data), size));
  sockaddr_in addr{};
  int listenFd = loomfuzz::listenLoopback(&addr);
  if (listenFd < 0) return 0;
  std::atomic<bool> stop{false};
  std::thread root([&] {
    loom::Status ignored = runRoot(listenFd, loomfuzz::fuzzSecret(), 5000, &stop);
    (void)ignored;
  });

  std::vector<int> fds;
  for (const std::string& c : conns) {
    int fd = loomfuzz::dial(addr);
    if (fd < 0) break;  // the root finished (every rank served) and closed its listener
    loomfuzz::sendAll(fd, c, loomfuzz::after(200));
    shutdown(fd, SHUT_WR);
    fds.push_back(fd);
  }
  // Connections the root drops or answers close at once; a hello that waits for other ranks
  // stays open, so the wait is short.
  auto deadline = loomfuzz::after(20);
  for (size_t i = 0; i < fds.size(); ++i) {
    std::string reply;
    loomfuzz::readUntilClosed(fds[i], &reply, deadline);
    if (!reply.empty() && !authenticated(conns[i])) {
      fprintf(stderr, "the root sent %zu bytes to a connection without the secret\n",
              reply.size());
      abort();
    }
  }
  stop.store(true);
  int wake = loomfuzz::dial(addr);  // the root looks at `stop` between handlers
  root.join();
  if (wake >= 0) close(wake);
  for (int fd : fds) close(fd);
  return 0;
}
