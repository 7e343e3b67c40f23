// Fuzzes a rank's reading of the root's answers (src/bootstrap/bootstrap.cc: the challenge,
// the proof, then the table or the refusal, as src/bootstrap/wire.h lays them out). A fake root
// on a loopback listener sends a challenge, reads the rank's hello and answers with the input,
// then closes; the rank is a real Bootstrap::join of one rank, so the whole read path runs:
// proof, header, length limit, body, table.
//
// The proof is the root's MAC over a transcript that includes the rank's fresh nonce, which no
// input can know, so the fake root signs for the input: where the input starts with a proof
// frame whose first MAC byte is even, it writes the right MAC there (as a real root does). Odd
// ones keep the input's bytes, so a wrong proof is fuzzed too.
//
// Checked besides crashes: a join that succeeds had a signed proof and got exactly the table
// the input holds after it (one entry whose info is the rank's view of itself), parsed here
// independently; a join with a signed proof and such a table succeeds.
#include <cstdlib>
#include <string>
#include <thread>

#include "bootstrap/bootstrap.h"
#include "bootstrap/unique_id.h"
#include "bootstrap/wire.h"
#include "forged_frames.h"
#include "fuzz_net.h"

using namespace loom::bootstrap;
namespace auth = loom::auth;

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  setenv("LOOM_DEBUG", "NONE", 1);
  return 0;
}

namespace {

// The info of the only entry of a one-rank table, or false if `in` is not such a table.
bool expectedInfo(const std::string& in, std::string* info) {
  const auto* p = reinterpret_cast<const unsigned char*>(in.data());
  if (in.size() < kReplyHeaderBytes + kEntryBytes) return false;
  if (get32(p) != kTableMagic || get32(p + 4) != 1) return false;
  uint32_t bodyLen = get32(p + 8), infoLen = get32(p + kReplyHeaderBytes + 8);
  if (bodyLen != kEntryBytes + static_cast<uint64_t>(infoLen)) return false;
  if (in.size() < kReplyHeaderBytes + static_cast<size_t>(bodyLen)) return false;
  *info = in.substr(kReplyHeaderBytes + kEntryBytes, infoLen);
  return true;
}

bool signable(const std::string& in) {
  return in.size() >= kChallengeBytes &&
         get32(reinterpret_cast<const unsigned char*>(in.data())) == kProofMagic &&
         (in[4] & 1) == 0;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string reply(reinterpret_cast<const char*>(data), size);
  const bool signed_ = signable(reply);
  IdContents c;
  int listenFd = loomfuzz::listenLoopback(&c.root);
  if (listenFd < 0) return 0;
  c.secret = loomfuzz::fuzzSecret();
  loomUniqueId id;
  encodeUniqueId(c, &id);

  bool signedProof = false;  // the fake root wrote the right MAC into the input's proof
  std::thread fakeRoot([&] {
    pollfd p{listenFd, POLLIN, 0};
    if (poll(&p, 1, 2000) <= 0) return;
    int fd = accept4(listenFd, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) return;
    auth::Nonce nonce{};
    if (!auth::randomBytes(nonce.data(), nonce.size()).isOk()) nonce.fill(7);
    loomfuzz::sendAll(fd, frame32(kChallengeMagic, nonce.data()), loomfuzz::after(2000));
    std::string hello;  // the rank's hello (no info), then the reply
    loomfuzz::readExactly(fd, &hello, kHelloBytes, loomfuzz::after(2000));
    if (signed_ && hello.size() == kHelloBytes) {
      const auto* h = reinterpret_cast<const unsigned char*>(hello.data());
      auto mac = auth::handshakeMac(c.secret, kRootContext, auth::Side::Acceptor, nonce.data(),
                                    h + kOffNonce, hello.substr(kOffFields));
      if (mac.isOk()) {
        reply.replace(4, auth::kMacBytes, reinterpret_cast<const char*>(mac.value().data()),
                      auth::kMacBytes);
        signedProof = true;
      }
    }
    loomfuzz::sendAll(fd, reply, loomfuzz::after(2000));
    shutdown(fd, SHUT_WR);
    std::string rest;
    loomfuzz::readUntilClosed(fd, &rest, loomfuzz::after(2000));
    close(fd);
  });

  auto joined = Bootstrap::join(id, 0, 1, "", 3000, nullptr);
  fakeRoot.join();
  close(listenFd);
  std::string info;
  bool valid = signedProof && expectedInfo(reply.substr(kChallengeBytes), &info);
  if (joined.isOk() &&
      (!valid || joined.value()->peerInfo().size() != 1 || joined.value()->peerInfo()[0] != info)) {
    fprintf(stderr, "join accepted a reply that is not a signed proof and a one-rank table\n");
    abort();
  }
  if (!joined.isOk() && valid) {
    fprintf(stderr, "join refused a signed proof and a valid one-rank table: %s\n",
            joined.status().message().c_str());
    abort();
  }
  return 0;
}
