// The TCP connection's reader over a real loopback connection, with the peer's side written by
// hand so that a frame's bytes can arrive in timed pieces. The frame layout is the one
// transport/tcp/tcp_connection.cc writes: a 56-byte header {uint32 size, uint32 flags, Stamp}
// and then size bytes.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "transport/tcp/tcp_connection.h"

using loom::transport::Stamp;
using loom::transport::TcpConnection;

namespace {

constexpr size_t kHeader = 56;
constexpr size_t kSlot = 256 << 10;

// A connected loopback pair: `reader` non-blocking (as TcpConnection expects), `writer` blocking.
struct Pair {
  int reader = -1, writer = -1;
  Pair() {
    int ls = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    EXPECT_EQ(bind(ls, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    EXPECT_EQ(listen(ls, 1), 0);
    EXPECT_EQ(getsockname(ls, reinterpret_cast<sockaddr*>(&a), &len), 0);
    writer = socket(AF_INET, SOCK_STREAM, 0);
    EXPECT_EQ(connect(writer, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    reader = accept(ls, nullptr, nullptr);
    EXPECT_GE(reader, 0);
    fcntl(reader, F_SETFL, fcntl(reader, F_GETFL) | O_NONBLOCK);
    close(ls);
  }
};

void writeAll(int fd, const char* p, size_t n) {
  while (n > 0) {
    ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
    ASSERT_GT(w, 0);
    p += w;
    n -= static_cast<size_t>(w);
  }
}

// One frame's bytes: header then a payload of `size` bytes, byte i = i * 7 + 3; `message`: the
// stamp of a tagged message's first slot (tag 9).
std::vector<char> frame(uint32_t size, uint64_t seq, bool message = false) {
  std::vector<char> f(kHeader + size);
  std::memcpy(f.data(), &size, 4);
  Stamp st;
  st.seq = seq;
  if (message) {
    st.message = loom::transport::kMessageHead;
    st.tag = 9;
    st.messageBytes = size;
  }
  std::memcpy(f.data() + 8, &st, sizeof(st));
  for (size_t i = 0; i < size; ++i) f[kHeader + i] = static_cast<char>(i * 7 + 3);
  return f;
}

double secondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// A large frame whose bytes come in three pieces, 150 ms apart: the reader gets the whole
// frame, byte for byte, and its blocking wait returns as soon as the last piece lands (a receive
// low-water mark above what is still to come would leave it asleep for the whole wait). While
// the rest is owed, the middle piece does not wake the reader: the low-water mark is the rest.
TEST(TcpFrames, ALargeFrameArrivingInPiecesWakesTheReaderOnceItIsWhole) {
  Pair p;
  auto conn = std::make_unique<TcpConnection>(1, p.reader, kSlot, 2);
  const uint32_t size = 200 << 10;
  const std::vector<char> f = frame(size, 42);
  const size_t cut1 = kHeader + 4096, cut2 = kHeader + 100000;
  std::chrono::steady_clock::time_point lastSent;
  std::thread writer([&] {
    writeAll(p.writer, f.data(), cut1);
    std::this_thread::sleep_for(std::chrono::milliseconds(150));
    writeAll(p.writer, f.data() + cut1, cut2 - cut1);
    std::this_thread::sleep_for(std::chrono::milliseconds(150));
    lastSent = std::chrono::steady_clock::now();
    writeAll(p.writer, f.data() + cut2, f.size() - cut2);
  });
  int wakeups = 0;
  size_t bytes = 0;
  const void* got = nullptr;
  const auto t0 = std::chrono::steady_clock::now();
  while (got == nullptr && secondsSince(t0) < 20) {
    ASSERT_TRUE(conn->progress().isOk());
    got = conn->tryRecvSlot(&bytes);
    if (got != nullptr) break;
    conn->wait(false, 5'000'000);
    ++wakeups;
  }
  const double lateBy = secondsSince(lastSent);
  writer.join();
  ASSERT_NE(got, nullptr) << "the frame never completed";
  ASSERT_EQ(bytes, size);
  EXPECT_EQ(std::memcmp(got, f.data() + kHeader, size), 0);
  EXPECT_EQ(conn->recvStamp().seq, 42u);
  EXPECT_LT(lateBy, 2.0) << "the reader slept on after the frame's last bytes had landed";
  // The first piece (header and 4 KiB) and the last: not the middle one as well.
  EXPECT_LE(wakeups, 2);
  conn->releaseRecv();
  close(p.writer);
}

// A peer that closes in the middle of a large frame: the reader's wait returns at once (the
// close is news whatever the low-water mark) and progress() names the peer.
TEST(TcpFrames, APeerClosingInsideALargeFrameIsSeenAtOnce) {
  Pair p;
  auto conn = std::make_unique<TcpConnection>(3, p.reader, kSlot, 2);
  const std::vector<char> f = frame(200 << 10, 7);
  writeAll(p.writer, f.data(), kHeader + 50000);
  // Read what came, so that the socket owes the rest of the frame.
  const auto t0 = std::chrono::steady_clock::now();
  while (secondsSince(t0) < 0.3) {
    ASSERT_TRUE(conn->progress().isOk());
    conn->wait(false, 50'000);
  }
  std::thread closer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    close(p.writer);
  });
  const auto t1 = std::chrono::steady_clock::now();
  conn->wait(false, 10'000'000);
  const double waited = secondsSince(t1);
  closer.join();
  EXPECT_LT(waited, 5.0) << "the close did not wake the reader";
  loom::Status s = conn->progress();
  ASSERT_FALSE(s.isOk());
  EXPECT_NE(s.message().find("rank 3 closed its TCP connection"), std::string::npos) << s.message();
}

// Reads until a frame is complete (or 20 s pass); returns its bytes' address.
const void* readFrame(TcpConnection& conn, size_t* bytes) {
  const void* got = nullptr;
  const auto t0 = std::chrono::steady_clock::now();
  while (got == nullptr && secondsSince(t0) < 20) {
    EXPECT_TRUE(conn.progress().isOk());
    got = conn.tryRecvSlot(bytes);
    if (got == nullptr) conn.wait(false, 100'000);
  }
  return got;
}

// Reads for a while, so that what has arrived of a frame is taken from the socket.
void readAWhile(TcpConnection& conn) {
  const auto t0 = std::chrono::steady_clock::now();
  while (secondsSince(t0) < 0.2) {
    ASSERT_TRUE(conn.progress().isOk());
    conn.wait(false, 20'000);
  }
}

// recvInto: a frame half read into its slot is finished in the caller's memory, the half that
// came first copied over; tryRecvSlot() then gives the caller's memory. The next frame, not
// asked for, lands in its slot again.
TEST(TcpFrames, RecvIntoFinishesAFrameInTheCallersMemory) {
  Pair p;
  auto conn = std::make_unique<TcpConnection>(1, p.reader, kSlot, 2);
  const uint32_t size = 200 << 10;
  const std::vector<char> f = frame(size, 5), g = frame(size, 6);
  writeAll(p.writer, f.data(), kHeader + 70000);
  readAWhile(*conn);
  size_t bytes = 0;
  ASSERT_EQ(conn->tryRecvSlot(&bytes), nullptr);
  std::vector<char> dst(size, 0);
  ASSERT_TRUE(conn->recvInto(dst.data(), size));
  writeAll(p.writer, f.data() + kHeader + 70000, size - 70000);
  writeAll(p.writer, g.data(), g.size());
  const void* got = readFrame(*conn, &bytes);
  ASSERT_EQ(got, dst.data()) << "the frame did not land in the caller's memory";
  ASSERT_EQ(bytes, size);
  EXPECT_EQ(std::memcmp(dst.data(), f.data() + kHeader, size), 0);
  EXPECT_EQ(conn->recvStamp().seq, 5u);
  conn->releaseRecv();
  got = readFrame(*conn, &bytes);
  ASSERT_NE(got, nullptr);
  EXPECT_NE(got, dst.data());
  EXPECT_EQ(std::memcmp(got, g.data() + kHeader, size), 0);
  conn->releaseRecv();
  close(p.writer);
}

// recvInto declines a frame that is already complete and one whose header says another size;
// a request made before the header arrives, for another size, leaves the frame in its slot.
TEST(TcpFrames, RecvIntoLeavesFramesOfOtherSizesInTheirSlots) {
  Pair p;
  auto conn = std::make_unique<TcpConnection>(1, p.reader, kSlot, 2);
  std::vector<char> dst(kSlot, 0);
  const std::vector<char> a = frame(1000, 1), b = frame(100000, 2), c = frame(50000, 3);
  ASSERT_TRUE(conn->recvInto(dst.data(), 2000));  // nothing arrived yet: taken, for 2000 bytes
  writeAll(p.writer, a.data(), a.size());
  size_t bytes = 0;
  const void* got = readFrame(*conn, &bytes);
  ASSERT_NE(got, nullptr);
  EXPECT_NE(got, dst.data());
  EXPECT_EQ(bytes, 1000u);
  EXPECT_EQ(std::memcmp(got, a.data() + kHeader, 1000), 0);
  conn->releaseRecv();
  writeAll(p.writer, b.data(), kHeader + 10);
  readAWhile(*conn);
  EXPECT_FALSE(conn->recvInto(dst.data(), 99999)) << "the header says 100000 bytes";
  writeAll(p.writer, b.data() + kHeader + 10, 100000 - 10);
  got = readFrame(*conn, &bytes);
  ASSERT_NE(got, nullptr);
  EXPECT_NE(got, dst.data());
  EXPECT_EQ(std::memcmp(got, b.data() + kHeader, 100000), 0);
  conn->releaseRecv();
  writeAll(p.writer, c.data(), c.size());
  got = readFrame(*conn, &bytes);
  ASSERT_NE(got, nullptr);
  EXPECT_FALSE(conn->recvInto(dst.data(), 50000)) << "the frame is complete in its slot";
  EXPECT_EQ(std::memcmp(got, c.data() + kHeader, 50000), 0);
  conn->releaseRecv();
  close(p.writer);
}

// A tagged message's frame never lands in the caller's memory (the inbox takes it from its
// slot), whether its header came before recvInto or after; the schedule's frame behind it does.
TEST(TcpFrames, RecvIntoLeavesMessagesInTheirSlots) {
  Pair p;
  auto conn = std::make_unique<TcpConnection>(1, p.reader, kSlot, 4);
  const uint32_t size = 3000;
  std::vector<char> dst(size, 0);
  const std::vector<char> m1 = frame(size, 0, true), m2 = frame(size, 0, true), d = frame(size, 7);
  ASSERT_TRUE(conn->recvInto(dst.data(), size));  // before any header
  writeAll(p.writer, m1.data(), m1.size());
  size_t bytes = 0;
  const void* got = readFrame(*conn, &bytes);
  ASSERT_NE(got, nullptr);
  EXPECT_NE(got, dst.data()) << "a message landed in the caller's memory";
  EXPECT_EQ(conn->recvStamp().message, loom::transport::kMessageHead);
  EXPECT_EQ(conn->recvStamp().tag, 9);
  EXPECT_EQ(conn->recvStamp().messageBytes, size);
  conn->releaseRecv();
  writeAll(p.writer, m2.data(), kHeader + 10);
  readAWhile(*conn);
  EXPECT_FALSE(conn->recvInto(dst.data(), size)) << "its header says it is a message";
  writeAll(p.writer, m2.data() + kHeader + 10, size - 10);
  got = readFrame(*conn, &bytes);
  ASSERT_NE(got, nullptr);
  EXPECT_NE(got, dst.data());
  conn->releaseRecv();
  ASSERT_TRUE(conn->recvInto(dst.data(), size));
  writeAll(p.writer, d.data(), d.size());
  got = readFrame(*conn, &bytes);
  ASSERT_EQ(got, dst.data()) << "the schedule's frame did not land in the caller's memory";
  EXPECT_EQ(std::memcmp(dst.data(), d.data() + kHeader, size), 0);
  EXPECT_EQ(conn->recvStamp().message, loom::transport::kScheduleData);
  conn->releaseRecv();
  close(p.writer);
}

// cancelRecvInto (an operation failing while a frame lands in the caller's memory): what
// arrived goes back into the slot, the rest follows it there, and the caller's memory is not
// written again.
TEST(TcpFrames, CancelRecvIntoPutsTheFrameBackInItsSlot) {
  Pair p;
  auto conn = std::make_unique<TcpConnection>(1, p.reader, kSlot, 2);
  const uint32_t size = 200 << 10;
  const std::vector<char> f = frame(size, 9);
  std::vector<char> dst(size, 0);
  ASSERT_TRUE(conn->recvInto(dst.data(), size));
  writeAll(p.writer, f.data(), kHeader + 90000);
  readAWhile(*conn);
  EXPECT_EQ(std::memcmp(dst.data(), f.data() + kHeader, 90000), 0)
      << "the first part did not land in the caller's memory";
  conn->cancelRecvInto();
  std::fill(dst.begin(), dst.end(), 0);
  writeAll(p.writer, f.data() + kHeader + 90000, size - 90000);
  size_t bytes = 0;
  const void* got = readFrame(*conn, &bytes);
  ASSERT_NE(got, nullptr);
  EXPECT_NE(got, dst.data());
  ASSERT_EQ(bytes, size);
  EXPECT_EQ(std::memcmp(got, f.data() + kHeader, size), 0);
  EXPECT_EQ(std::count(dst.begin(), dst.end(), 0), static_cast<long>(size))
      << "the caller's memory was written after the cancel";
  conn->releaseRecv();
  close(p.writer);
}

}  // namespace
