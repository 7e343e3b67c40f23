// Two ranks as two real processes, for the transport conformance suite (conformance_test.cc).
//
// The test's own process is rank 0 and a forked child is rank 1. A control socket (a
// socketpair) joins them: it carries set-up barriers and the test's cues ("the FIFO is full",
// "one slot released"), never payload, which goes over the transport under test. Every wait
// here has a deadline and the child runs under an alarm, so a transport that hangs fails its
// test instead of hanging the suite.
//
// Payload: message n of `bytes` bytes holds pattern(n), so that a receiver checks each slot's
// size and every byte knowing only the message's number.
#pragma once

#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>

namespace loomtest::transport {

// ---- Payload ----

inline uint64_t mix(uint64_t x) {  // splitmix64
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Fills `bytes` at p with message msg's pattern.
inline void fillMessage(void* p, size_t bytes, uint64_t msg) {
  auto* b = static_cast<unsigned char*>(p);
  for (size_t i = 0; i < bytes; i += 8) {
    const uint64_t w = mix((msg << 24) + i / 8);
    std::memcpy(b + i, &w, std::min<size_t>(8, bytes - i));
  }
}

// The offset of the first byte at p that differs from message msg's pattern; `bytes` if none.
inline size_t firstWrongByte(const void* p, size_t bytes, uint64_t msg) {
  const auto* b = static_cast<const unsigned char*>(p);
  for (size_t i = 0; i < bytes; i += 8) {
    const uint64_t w = mix((msg << 24) + i / 8);
    const size_t n = std::min<size_t>(8, bytes - i);
    if (std::memcmp(b + i, &w, n) != 0)
      for (size_t k = 0; k < n; ++k)
        if (b[i + k] != reinterpret_cast<const unsigned char*>(&w)[k]) return i + k;
  }
  return bytes;
}

// A size for message msg between 0 and slotBytes: every fifth a whole slot, every seventh
// (offset by one) empty, the rest anywhere in between.
inline size_t messageBytes(uint64_t msg, size_t slotBytes) {
  if (msg % 5 == 0) return slotBytes;
  if (msg % 7 == 1) return 0;
  return static_cast<size_t>(mix(msg ^ 0x5eed) % (slotBytes + 1));
}

// ---- Time ----

inline double secondsNow() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Deadline {
  explicit Deadline(double seconds) : at(secondsNow() + seconds) {}
  bool passed() const { return secondsNow() > at; }
  double at;
};

// ---- The control socket ----

// A cue: what happened, and a number.
struct Cue {
  uint32_t tag = 0;
  uint64_t value = 0;
};

class Control {
 public:
  Control() = default;
  explicit Control(int fd) : fd_(fd) {}
  ~Control() {
    if (fd_ >= 0) close(fd_);
  }
  Control(const Control&) = delete;
  Control& operator=(const Control&) = delete;

  ::testing::AssertionResult send(uint32_t tag, uint64_t value = 0) {
    const Cue c{tag, value};
    if (::send(fd_, &c, sizeof(c), MSG_NOSIGNAL) != static_cast<ssize_t>(sizeof(c)))
      return ::testing::AssertionFailure()
             << "control socket: sending cue " << tag << ": " << std::strerror(errno);
    return ::testing::AssertionSuccess();
  }

  // The next cue, which must be `tag`, within timeoutMs; its number goes to *value.
  ::testing::AssertionResult expect(uint32_t tag, uint64_t* value = nullptr,
                                    int timeoutMs = 10000) {
    Cue c;
    size_t got = 0;
    const Deadline deadline(timeoutMs / 1000.0);
    while (got < sizeof(c)) {
      const int left = static_cast<int>((deadline.at - secondsNow()) * 1000);
      pollfd p{fd_, POLLIN, 0};
      if (left <= 0 || poll(&p, 1, left) == 0)
        return ::testing::AssertionFailure() << "control socket: no cue " << tag
                                             << " from the peer within " << timeoutMs << " ms";
      const ssize_t r = recv(fd_, reinterpret_cast<char*>(&c) + got, sizeof(c) - got, 0);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0)
        return ::testing::AssertionFailure()
               << "control socket: the peer closed it (or failed) before cue " << tag;
      got += static_cast<size_t>(r);
    }
    if (c.tag != tag)
      return ::testing::AssertionFailure()
             << "control socket: cue " << c.tag << " where " << tag << " was expected";
    if (value != nullptr) *value = c.value;
    return ::testing::AssertionSuccess();
  }

  // Whether a cue (or the peer's close) is waiting, within timeoutMs.
  bool readable(int timeoutMs) {
    pollfd p{fd_, POLLIN, 0};
    return poll(&p, 1, timeoutMs) > 0;
  }

  // Waits until the peer closes its end (its process ended), up to timeoutMs.
  ::testing::AssertionResult expectClosed(int timeoutMs) {
    const Deadline deadline(timeoutMs / 1000.0);
    for (;;) {
      const int left = static_cast<int>((deadline.at - secondsNow()) * 1000);
      pollfd p{fd_, POLLIN, 0};
      if (left <= 0 || poll(&p, 1, left) == 0)
        return ::testing::AssertionFailure()
               << "control socket: the peer did not close it within " << timeoutMs << " ms";
      char c;
      const ssize_t r = recv(fd_, &c, 1, 0);
      if (r == 0 || (r < 0 && errno != EINTR)) return ::testing::AssertionSuccess();
      if (r > 0) return ::testing::AssertionFailure() << "control socket: an unexpected cue";
    }
  }

 private:
  int fd_ = -1;
};

// ---- The child process ----

struct ChildEnd {
  bool exited = false;  // exited normally with `code`
  int code = -1;
  int signal = 0;       // the signal that ended it
  bool killed = false;  // killed here: it outlived its time
  std::string text() const {
    if (killed) return "still running at its deadline (killed; a hang?)";
    if (exited) return "exited with code " + std::to_string(code);
    return std::string("ended by signal ") + strsignal(signal);
  }
};

// The child's limit: its alarm ends it (SIGALRM) after this long, whatever it waits on.
constexpr unsigned kChildAlarmS = 30;

// Forks a child that runs fn and ends with _exit: 0 when it recorded no test failure, 1 when it
// did, 2 on an exception. Its failures print on its own stdout, which the parent shares.
inline pid_t forkChild(const std::function<void()>& fn) {
  std::fflush(nullptr);  // nothing buffered twice
  const pid_t pid = fork();
  if (pid != 0) return pid;
  alarm(kChildAlarmS);
  int code = 2;
  try {
    fn();
    code = ::testing::Test::HasFailure() ? 1 : 0;
  } catch (...) {
  }
  std::fflush(nullptr);
  _exit(code);
}

// Waits up to timeoutMs for the child to end, then SIGKILLs it.
inline ChildEnd waitChild(pid_t pid, int timeoutMs) {
  ChildEnd end;
  const Deadline deadline(timeoutMs / 1000.0);
  int status = 0;
  for (;;) {
    const pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) break;
    if (r < 0 && errno != EINTR) return end;
    if (deadline.passed()) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      end.killed = true;
      break;
    }
    usleep(2000);
  }
  end.exited = WIFEXITED(status);
  end.code = end.exited ? WEXITSTATUS(status) : -1;
  end.signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
  return end;
}

}  // namespace loomtest::transport
