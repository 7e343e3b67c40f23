// Fuzzes the TCP transport's frame reader (transport/tcp/tcp_connection.cc). The input's first
// byte picks the slot size and FIFO depth; the rest is the byte stream a peer sends. It is fed
// through a socketpair into a real TcpConnection in small pieces while progress() and
// tryRecvSlot() drain it, then the peer's side is closed and the connection is driven until
// it errors or drains.
//
// Checked besides crashes: the frames delivered, their sizes, payloads and stamps, and the way
// the stream ends (clean close, a frame larger than a slot, a close in the middle of a frame)
// match an independent reading of the stream here: a frame is a 56-byte header {uint32 size,
// uint32 flags, Stamp (48 bytes)} and then size bytes; an empty frame with the top bit of flags
// set is a goodbye (the peer failed, naming the rank it lost) and ends the stream cleanly.
#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "transport/tcp/tcp_connection.h"

using loom::transport::Stamp;
using loom::transport::TcpConnection;

namespace {

constexpr size_t kHeader = 56;

struct Frame {
  std::string payload;
  Stamp stamp;
};

enum class End { Clean, Oversize, Truncated };

End expectedFrames(const std::string& s, size_t slotBytes, std::vector<Frame>* out) {
  size_t pos = 0;
  for (;;) {
    if (pos == s.size()) return End::Clean;
    if (s.size() - pos < kHeader) return End::Truncated;
    uint32_t size;
    std::memcpy(&size, s.data() + pos, 4);
    uint32_t flags;
    std::memcpy(&flags, s.data() + pos + 4, 4);
    if (size == 0 && (flags & 0x80000000u) != 0) return End::Clean;
    if (size > slotBytes) return End::Oversize;
    if (s.size() - pos - kHeader < size) return End::Truncated;
    Frame f;
    std::memcpy(&f.stamp, s.data() + pos + 8, sizeof(Stamp));
    f.payload = s.substr(pos + kHeader, size);
    out->push_back(std::move(f));
    pos += kHeader + size;
  }
}

bool sameStamp(const Stamp& a, const Stamp& b) {
  return a.seq == b.seq && a.earliestNs == b.earliestNs && a.latestNs == b.latestNs &&
         a.earliestRank == b.earliestRank && a.latestRank == b.latestRank &&
         a.message == b.message && a.tag == b.tag && a.messageBytes == b.messageBytes;
}

[[noreturn]] void fail(const char* what, size_t frame) {
  fprintf(stderr, "tcp frame reader: %s (frame %zu)\n", what, frame);
  abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  static const size_t kSlots[] = {16, 64, 256, 4096};
  const size_t slotBytes = kSlots[data[0] & 3];
  const size_t depth = 1 + ((data[0] >> 2) & 3);
  const size_t piece = 1 + (data[0] >> 4) * 7;  // bytes written per step: 1 .. 106
  const std::string stream(reinterpret_cast<const char*>(data) + 1, size - 1);
  std::vector<Frame> want;
  const End end = expectedFrames(stream, slotBytes, &want);

  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) return 0;
  fcntl(sv[1], F_SETFL, fcntl(sv[1], F_GETFL) | O_NONBLOCK);
  TcpConnection conn(1, sv[0], slotBytes, depth);  // owns sv[0]

  size_t written = 0, got = 0;
  bool closed = false;
  loom::Status status;
  for (int idle = 0; idle < 1000;) {
    bool moved = false;
    if (written < stream.size()) {
      ssize_t w = send(sv[1], stream.data() + written, std::min(piece, stream.size() - written),
                       MSG_NOSIGNAL);
      if (w > 0) written += static_cast<size_t>(w), moved = true;
    } else if (!closed) {
      shutdown(sv[1], SHUT_WR);
      closed = true;
    }
    if (status.isOk()) status = conn.progress();
    size_t bytes = 0;
    while (const void* slot = conn.tryRecvSlot(&bytes)) {
      if (got >= want.size()) fail("a frame the stream does not hold", got);
      if (bytes != want[got].payload.size()) fail("wrong size", got);
      if (std::memcmp(slot, want[got].payload.data(), bytes) != 0) fail("wrong payload", got);
      if (!sameStamp(conn.recvStamp(), want[got].stamp)) fail("wrong stamp", got);
      conn.releaseRecv();
      ++got;
      moved = true;
    }
    if (closed && (!status.isOk() || !conn.checkRecv().isOk())) break;
    idle = moved ? 0 : idle + 1;
  }
  close(sv[1]);
  if (got != want.size()) fail("frames missing", got);
  switch (end) {
    case End::Clean:
      if (!status.isOk()) fail("an error on a clean stream", got);
      if (conn.checkRecv().code() != loomRemoteError) fail("a clean close not reported", got);
      break;
    case End::Oversize:
      if (status.code() != loomInternalError) fail("an oversized frame not refused", got);
      break;
    case End::Truncated:
      if (status.code() != loomRemoteError) fail("a cut frame not reported", got);
      break;
  }
  return 0;
}
