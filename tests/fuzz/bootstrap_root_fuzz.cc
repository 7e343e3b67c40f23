// Fuzzes the rendezvous root (src/bootstrap/unique_id.cc: challenges, hellos and replies as
// src/bootstrap/wire.h lays them out). Each input is the bytes of up to four connections,
// separated by "LMFZ"; a real root (runRoot) is started on a loopback listener per input.
// Every connection reads the root's challenge, then sends its bytes and half-closes; the target
// waits briefly for the root to answer and close.
//
// A hello's MAC answers a fresh nonce, which no input can know, so the target signs for the
// input: where the bytes are a hello (magic, and the info its length announces, within the
// limit) whose nonce's first byte is even, it writes the right MAC for this root's challenge
// over the input's fields (wire.h's helloFrame, as a rank does). Odd nonces keep the input's
// MAC, so the refusal path is fuzzed too. Signed hellos take the root past authentication to
// its checks of rank, nranks and duplicates, its refusals and its tables.
//
// Checked besides crashes and sanitizer reports: the root sends a connection nothing but its
// challenge unless that connection was signed (strangers learn nothing), and what it sends a
// signed one starts with its proof: the acceptor's MAC over the same transcript. It never
// allocates by a length field (libFuzzer's -malloc_limit_mb catches that).
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "bootstrap/unique_id.h"
#include "bootstrap/wire.h"
#include "forged_frames.h"
#include "fuzz_net.h"

using namespace loom::bootstrap;
namespace auth = loom::auth;

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  setenv("LOOM_DEBUG", "NONE", 1);  // every stranger is logged as a warning otherwise
  return 0;
}

namespace {

const unsigned char* bytesOf(const std::string& s) {
  return reinterpret_cast<const unsigned char*>(s.data());
}

// The MAC'd fields of the hello `bytes` holds, or "" if it is not one the target signs.
std::string signableFields(const std::string& bytes) {
  if (bytes.size() < kHelloBytes || get32(bytesOf(bytes)) != kHelloMagic) return "";
  if ((bytes[kOffNonce] & 1) != 0) return "";
  uint32_t infoLen = get32(bytesOf(bytes) + kOffFields + 16);
  if (infoLen > kMaxInfoBytes || bytes.size() - kHelloBytes < infoLen) return "";
  return bytes.substr(kOffFields, kHelloBytes - kOffFields + infoLen);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<std::string> conns =
      loomfuzz::splitConnections(std::string(reinterpret_cast<const char*>(data), size), 4);
  sockaddr_in addr{};
  int listenFd = loomfuzz::listenLoopback(&addr);
  if (listenFd < 0) return 0;
  std::atomic<bool> stop{false};
  std::thread root([&] {
    loom::Status ignored = runRoot(listenFd, loomfuzz::fuzzSecret(), 5000, &stop);
    (void)ignored;
  });

  std::vector<int> fds;
  std::vector<std::string> challenges, fields;
  for (std::string& c : conns) {
    int fd = loomfuzz::dial(addr);
    if (fd < 0) break;  // the root finished (every rank served) and closed its listener
    std::string challenge;
    loomfuzz::readExactly(fd, &challenge, kChallengeBytes, loomfuzz::after(1000));
    std::string f = signableFields(c);
    if (challenge.size() == kChallengeBytes && get32(bytesOf(challenge)) == kChallengeMagic &&
        !f.empty()) {
      auto mac = auth::handshakeMac(loomfuzz::fuzzSecret(), kRootContext, auth::Side::Connector,
                                    bytesOf(challenge) + 4, bytesOf(c) + kOffNonce, f);
      if (mac.isOk()) {
        c.replace(kOffMac, auth::kMacBytes, reinterpret_cast<const char*>(mac.value().data()),
                  auth::kMacBytes);
      } else {
        f.clear();
      }
    } else {
      f.clear();
    }
    loomfuzz::sendAll(fd, c, loomfuzz::after(200));
    shutdown(fd, SHUT_WR);
    fds.push_back(fd);
    challenges.push_back(challenge);
    fields.push_back(f);
  }
  // Connections the root drops or answers close at once; a hello that waits for other ranks
  // stays open, so the wait is short.
  auto deadline = loomfuzz::after(20);
  for (size_t i = 0; i < fds.size(); ++i) {
    // Everything after the challenge (which, on a loaded machine, may come after the target
    // stopped waiting for it: then the connection was not signed).
    std::string reply = challenges[i];
    loomfuzz::readUntilClosed(fds[i], &reply, deadline);
    if (reply.size() >= kChallengeBytes && get32(bytesOf(reply)) == kChallengeMagic)
      reply.erase(0, kChallengeBytes);
    if (fields[i].empty()) {
      if (!reply.empty()) {
        fprintf(stderr, "the root sent %zu bytes after its challenge to an unsigned connection\n",
                reply.size());
        abort();
      }
      continue;
    }
    if (reply.empty()) continue;
    if (reply.size() < kChallengeBytes || get32(bytesOf(reply)) != kProofMagic ||
        !macMatches(bytesOf(reply) + 4, kRootContext, auth::Side::Acceptor, loomfuzz::fuzzSecret(),
                    bytesOf(challenges[i]) + 4, bytesOf(conns[i]) + kOffNonce, fields[i])) {
      fprintf(stderr, "the root answered a signed hello without a valid proof\n");
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
