// Fuzzes a rank's reading of the root's reply (src/bootstrap/bootstrap.cc: the table or the
// refusal, as src/bootstrap/wire.h lays them out). A fake root on a loopback listener reads
// the rank's hello and answers with the input, then closes; the rank is a real
// Bootstrap::join of one rank, so the whole read path runs: header, length limit, body, table.
//
// Checked besides crashes: a join that succeeds got exactly the table the input holds (one
// entry whose info is the rank's view of itself), parsed here independently.
#include <cstdlib>
#include <string>
#include <thread>

#include "bootstrap/bootstrap.h"
#include "bootstrap/unique_id.h"
#include "bootstrap/wire.h"
#include "fuzz_net.h"

using namespace loom::bootstrap;

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  setenv("LOOM_DEBUG", "NONE", 1);
  return 0;
}

namespace {

// The info of the only entry of a one-rank table, or false if the input is not such a table.
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

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string reply(reinterpret_cast<const char*>(data), size);
  IdContents c;
  int listenFd = loomfuzz::listenLoopback(&c.root);
  if (listenFd < 0) return 0;
  c.secret = loomfuzz::fuzzSecret();
  loomUniqueId id;
  encodeUniqueId(c, &id);

  std::thread fakeRoot([&] {
    pollfd p{listenFd, POLLIN, 0};
    if (poll(&p, 1, 2000) <= 0) return;
    int fd = accept4(listenFd, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) return;
    std::string hello;
    auto deadline = loomfuzz::after(2000);
    while (hello.size() < kHelloBytes) {  // the rank's hello (no info), then the reply
      pollfd q{fd, POLLIN, 0};
      if (poll(&q, 1, static_cast<int>(loomfuzz::msLeft(deadline))) <= 0) break;
      char buf[kHelloBytes];
      ssize_t n = recv(fd, buf, kHelloBytes - hello.size(), 0);
      if (n <= 0) break;
      hello.append(buf, static_cast<size_t>(n));
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
  bool valid = expectedInfo(reply, &info);
  if (joined.isOk() && (!valid || joined.value()->peerInfo().size() != 1 ||
                        joined.value()->peerInfo()[0] != info)) {
    fprintf(stderr, "join accepted a reply that is not a one-rank table\n");
    abort();
  }
  if (!joined.isOk() && valid) {
    fprintf(stderr, "join refused a valid one-rank table: %s\n",
            joined.status().message().c_str());
    abort();
  }
  return 0;
}
