// Loopback socket helpers shared by the fuzz targets that talk to real listeners, and the
// seed writer. Blocking calls bounded by poll() deadlines, so a target never hangs on input.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace loomfuzz {

// A listening TCP socket on 127.0.0.1 with a kernel-chosen port; *addr receives the address.
inline int listenLoopback(sockaddr_in* addr) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || listen(fd, 64) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    close(fd);
    return -1;
  }
  *addr = a;
  return fd;
}

inline int dial(const sockaddr_in& addr) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  if (connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

inline int64_t msLeft(std::chrono::steady_clock::time_point deadline) {
  auto d = deadline - std::chrono::steady_clock::now();
  return std::max<int64_t>(0, std::chrono::duration_cast<std::chrono::milliseconds>(d).count());
}

// Writes all of data unless the peer closes or the deadline passes; false then.
inline bool sendAll(int fd, const std::string& data,
                    std::chrono::steady_clock::time_point deadline) {
  size_t off = 0;
  while (off < data.size()) {
    pollfd p{fd, POLLOUT, 0};
    if (poll(&p, 1, static_cast<int>(msLeft(deadline))) <= 0) return false;
    ssize_t w = send(fd, data.data() + off, data.size() - off, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w < 0 && errno != EAGAIN && errno != EINTR) return false;
    if (w > 0) off += static_cast<size_t>(w);
  }
  return true;
}

// Reads into *out until the peer closes (true) or the deadline passes (false).
inline bool readUntilClosed(int fd, std::string* out,
                            std::chrono::steady_clock::time_point deadline) {
  char buf[4096];
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(msLeft(deadline))) <= 0) return false;
    ssize_t n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
    if (n == 0) return true;
    if (n < 0) {
      if (errno == EAGAIN || errno == EINTR) continue;
      return true;  // reset: closed as well
    }
    out->append(buf, static_cast<size_t>(n));
  }
}

// Reads until *out holds n bytes, the peer closes or the deadline passes; true if it has n.
inline bool readExactly(int fd, std::string* out, size_t n,
                        std::chrono::steady_clock::time_point deadline) {
  char buf[512];
  while (out->size() < n) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(msLeft(deadline))) <= 0) return false;
    ssize_t r = recv(fd, buf, std::min(sizeof(buf), n - out->size()), MSG_DONTWAIT);
    if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)) return false;
    if (r > 0) out->append(buf, static_cast<size_t>(r));
  }
  return true;
}

inline std::chrono::steady_clock::time_point after(int ms) {
  return std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
}

// The bytes of up to `most` connections in one input, separated by "LMFZ".
inline std::vector<std::string> splitConnections(const std::string& in, size_t most) {
  std::vector<std::string> out;
  size_t start = 0;
  while (out.size() < most) {
    size_t sep = in.find("LMFZ", start);
    out.push_back(in.substr(start, sep == std::string::npos ? std::string::npos : sep - start));
    if (sep == std::string::npos) break;
    start = sep + 4;
  }
  return out;
}

// The secret every bootstrap target and seed uses, so seeds get past the secret check.
inline const std::string& fuzzSecret() {
  static const std::string s = "loom-fuzz-secret-0123456789abcde";  // kSecretBytes (32)
  return s;
}

}  // namespace loomfuzz
