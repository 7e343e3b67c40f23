#include "bootstrap/unique_id.h"

#include <arpa/inet.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include "bootstrap/wire.h"
#include "util/env.h"
#include "util/log.h"
#include "util/net.h"

namespace loom::bootstrap {
namespace {

// What each root this process hosts has heard so far, by its listener's address (which may be
// the wildcard's): a rank of this process whose wait for the table runs out says which ranks the
// root still misses.
std::mutex& hostedMutex() {
  static auto* m = new std::mutex;  // never destroyed: roots may run at exit
  return *m;
}
std::map<std::pair<uint32_t, uint16_t>, std::string>& hosted() {
  static auto* m = new std::map<std::pair<uint32_t, uint16_t>, std::string>;
  return *m;
}
void noteHosted(const sockaddr_in& at, const std::string* progress) {
  const auto key = std::make_pair(at.sin_addr.s_addr, at.sin_port);
  std::lock_guard<std::mutex> lock(hostedMutex());
  if (progress != nullptr)
    hosted()[key] = *progress;
  else
    hosted().erase(key);
}

// Layout of the 128 bytes (multi-byte integers little-endian; the address and
// port in network order, as in sockaddr_in):
//   [0, 4)     magic "LMID"
//   [4, 6)     layout version
//   [6, 8)     flags (kFlagRootOnRank0)
//   [8, 12)    root IPv4 address
//   [12, 14)   root port
//   [14, 16)   zero
//   [16, 48)   secret
//   [48, 120)  zero
//   [120, 128) FNV-1a 64 of bytes [0, 120)
constexpr uint32_t kIdMagic = 0x44494d4cu;  // "LMID" in memory order
constexpr uint16_t kIdVersion = 1;
constexpr uint16_t kFlagRootOnRank0 = 1u << 0;
constexpr size_t kOffMagic = 0, kOffVersion = 4, kOffFlags = 6, kOffAddr = 8, kOffPort = 12;
constexpr size_t kOffSecret = 16, kOffChecksum = 120;
static_assert(kOffSecret + kSecretBytes <= kOffChecksum, "secret overlaps the checksum");
static_assert(kOffChecksum + 8 == LOOM_UNIQUE_ID_BYTES, "checksum must end the id");

uint64_t fnv1a64(const void* data, size_t n, uint64_t h = 0xcbf29ce484222325ull) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

uint64_t mix64(uint64_t x) {  // splitmix64's finaliser
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

void putLe(unsigned char* p, uint64_t v, size_t bytes) {
  for (size_t i = 0; i < bytes; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}

uint64_t getLe(const unsigned char* p, size_t bytes) {
  uint64_t v = 0;
  for (size_t i = 0; i < bytes; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return v;
}

// A LOOM_COMM_ID secret must be the same in every process, so it is derived
// from text the processes share rather than drawn at random.
std::string deriveSecret(const std::string& text) {
  std::string secret(kSecretBytes, '\0');
  for (size_t i = 0; i < kSecretBytes / 8; ++i) {
    uint64_t h = mix64(fnv1a64(text.data(), text.size(), 0xcbf29ce484222325ull ^ mix64(i + 1)));
    putLe(reinterpret_cast<unsigned char*>(&secret[8 * i]), h, 8);
  }
  return secret;
}

// A TCP listener on addr (port 0: the kernel picks one); *bound receives the address.
Result<int> listenOn(const sockaddr_in& addr, sockaddr_in* bound) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return LOOM_ERROR(loomSystemError, std::string("socket: ") + strerror(errno));
  socklen_t len = sizeof(*bound);
  if (bind(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0 ||
      listen(fd, SOMAXCONN) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(bound), &len) != 0) {
    int err = errno;
    close(fd);
    return LOOM_ERROR(loomSystemError,
                      "cannot listen on " + net::toString(addr) + ": " + strerror(err));
  }
  return fd;
}

// The rendezvous root.

class Root {
 public:
  Root(std::string secret, int64_t timeoutMs, const std::atomic<bool>* stop)
      : acceptor_(io_),
        retry_(io_),
        secret_(std::move(secret)),
        timeoutMs_(timeoutMs),
        stop_(stop) {}

  Status run(int listenFd);

 private:
  struct Conn {
    Conn(asio::io_context& io, tcp::socket s) : sock(std::move(s)), timer(io) {}
    tcp::socket sock;
    asio::steady_timer timer;
    std::string remote;
    std::optional<auth::Acceptor> shake;
    std::string challenge;
    unsigned char hello[kHelloBytes] = {};
    std::string info;
    std::string proof;  // the root's MAC frame, once the rank's MAC has been checked
    int rank = -1;
    int nranks = 0;
    bool open = true;
    bool heard = false;       // the whole hello arrived
    unsigned char leave = 0;  // the leave byte of a joined rank that gave up
    bool peerClosed = false;  // a joined rank's side has closed (seen by watchLeave)
  };
  using ConnPtr = std::shared_ptr<Conn>;

  void accept();
  void start(tcp::socket sock);
  void readHello(const ConnPtr& c);
  void onHello(const ConnPtr& c);
  void onInfo(const ConnPtr& c);
  // Checks the hello's MAC; true (and c->proof made) if the rank holds the secret.
  bool authenticate(Conn& c);
  // Why an authenticated hello cannot be taken ("" if it can), and the code to refuse with.
  std::string check(const Conn& c, loomResult_t* code) const;
  void close(Conn& c);
  void drop(const ConnPtr& c, const std::string& why);
  void refuse(const ConnPtr& c, loomResult_t code, const std::string& why, bool warn = true);
  void sendTables();
  // Watches a joined rank's connection for its leave byte (or its close): the root then gives up.
  void watchLeave(const ConnPtr& c);
  std::string progress() const;

  asio::io_context io_;
  tcp::acceptor acceptor_;
  asio::steady_timer retry_;
  std::string secret_;
  int64_t timeoutMs_;
  const std::atomic<bool>* stop_;
  Limits lim_;
  std::string where_;
  std::vector<ConnPtr> conns_;   // every connection not yet closed
  std::vector<ConnPtr> byRank_;  // ranks that have joined
  int nranks_ = 0;               // learnt from the first valid hello
  int joined_ = 0;
  sockaddr_in at_{};  // the listener's address (the key of hosted())
  int writesLeft_ = 0;
  bool stopping_ = false;
  bool tablesSent_ = false;
  bool served_ = false;
  Status left_;  // why the rendezvous ended early: a joined rank left
  // Once the root has given up: why, and the code it refuses with (a rank whose hello completes
  // after that is refused too, and no table is ever sent).
  std::string gaveUpWhy_;
  loomResult_t gaveUpCode_ = loomSuccess;
};

Status Root::run(int listenFd) {
  error_code ec;
  acceptor_.assign(tcp::v4(), listenFd, ec);
  if (ec) {
    ::close(listenFd);
    return LOOM_ERROR(loomSystemError, "bootstrap: root cannot use its listener: " + ec.message());
  }
  tcp::endpoint local = acceptor_.local_endpoint(ec);
  where_ = ec ? std::string("?") : net::toString(fromEndpoint(local));
  lim_ = makeLimits("the rendezvous root at " + where_, timeoutMs_, stop_, nullptr);
  at_ = ec ? sockaddr_in{} : fromEndpoint(local);
  const std::string none = progress();
  noteHosted(at_, &none);
  accept();
  Status s = waitFor(
      io_, [this] { return served_ || !left_.isOk(); }, lim_,
      [this] {
        return writesLeft_ > 0 ? "sending the tables" : "waiting for ranks: " + progress();
      });
  if (s.isOk() && !served_) s = left_;
  if (!s.isOk() && tablesSent_) {
    LOOM_WARN(kBootstrap, "%s", s.message().c_str());
  } else if (!s.isOk()) {
    // Tell the ranks that did join why they will get no table, then give up.
    const std::string after = msString(Clock::now() - lim_.start);
    std::string why =
        !left_.isOk()
            ? "gave up after " + after + ", as " + left_.message() + ", with " + progress()
        : s.code() == loomTimeout ? "gave up after " + after + " with " + progress()
                                  : "stopped with " + progress() +
                                        ": rank 0, which hosts it, stopped waiting (see its error)";
    LOOM_WARN(kBootstrap, "rendezvous root at %s: %s", where_.c_str(), why.c_str());
    gaveUpWhy_ = why;
    gaveUpCode_ = s.code() == loomTimeout ? loomTimeout : loomRemoteError;
    error_code closing;
    acceptor_.close(closing);
    for (const ConnPtr& c : byRank_)
      if (c && c->open) refuse(c, gaveUpCode_, why, /*warn=*/false);
    // Each rank closes once it has read its refusal. Closing first, with a leave byte unread,
    // would reset the connection, and a rank whose refusal was not read yet would lose it.
    Limits grace = makeLimits(lim_.who, 1000, stop_, nullptr);
    Status ignored = waitFor(
        io_,
        [this] {
          return writesLeft_ == 0 &&
                 std::all_of(byRank_.begin(), byRank_.end(),
                             [](const ConnPtr& c) { return !c || !c->open || c->peerClosed; });
        },
        grace, [] { return ""; });
    (void)ignored;
  }
  // A root that gave up keeps its last word: its own rank's join times out at the same moment
  // and reads it just after (a later root on the port replaces it).
  if (s.isOk()) noteHosted(at_, nullptr);
  stopping_ = true;
  acceptor_.close(ec);
  retry_.cancel();
  for (const ConnPtr& c : conns_) close(*c);
  drain(io_);
  conns_.clear();
  byRank_.clear();
  if (s.isOk())
    LOOM_INFO(kBootstrap, "rendezvous root at %s: all %d ranks served", where_.c_str(), nranks_);
  return s;
}

std::string Root::progress() const {
  if (nranks_ == 0) return "no rank joined";
  std::string missing;
  int shown = 0;
  for (int r = 0; r < nranks_; ++r) {
    if (byRank_[r]) continue;
    if (shown++ == 16) {
      missing += ", ...";
      break;
    }
    missing += (missing.empty() ? "" : ", ") + std::to_string(r);
  }
  return std::to_string(joined_) + " of " + std::to_string(nranks_) + " ranks joined" +
         (missing.empty() ? std::string() : "; missing rank(s) " + missing);
}

void Root::accept() {
  acceptor_.async_accept([this](const error_code& ec, tcp::socket sock) {
    if (stopping_ || served_ || !acceptor_.is_open()) return;
    if (!ec) {
      start(std::move(sock));
      accept();
      return;
    }
    // Out of descriptors or similar: try again shortly rather than spin.
    LOOM_INFO(kBootstrap, "rendezvous root at %s: accept failed: %s", where_.c_str(),
              ec.message().c_str());
    retry_.expires_after(kRetryDelay);
    retry_.async_wait([this](const error_code& e) {
      if (!e && !stopping_) accept();
    });
  });
}

void Root::start(tcp::socket sock) {
  conns_.erase(
      std::remove_if(conns_.begin(), conns_.end(), [](const ConnPtr& c) { return !c->open; }),
      conns_.end());
  auto c = std::make_shared<Conn>(io_, std::move(sock));
  c->remote = remoteOf(c->sock);
  conns_.push_back(c);
  auto limit = std::min<Clock::duration>(kHandshake, lim_.deadline - Clock::now());
  c->timer.expires_after(limit);
  c->timer.async_wait([this, c, limit](const error_code& ec) {
    if (ec || !c->open || c->heard) return;
    drop(c, "no complete hello within " + msString(limit));
  });
  Result<auth::Acceptor> shake = auth::Acceptor::start(kRootProtocol, secret_);
  if (!shake.isOk()) return drop(c, shake.status().message());
  c->shake = shake.take();
  c->challenge = c->shake->challenge();
  // The hello is read once the challenge is out, so the only write in flight is ever one.
  asio::async_write(c->sock, asio::buffer(c->challenge), [this, c](const error_code& ec, size_t) {
    if (stopping_ || !c->open) return;
    if (ec) return drop(c, peerClosed(ec) ? "closed before its challenge was sent" : ec.message());
    readHello(c);
  });
}

void Root::readHello(const ConnPtr& c) {
  asio::async_read(c->sock, asio::buffer(c->hello), [this, c](const error_code& ec, size_t) {
    if (stopping_ || !c->open) return;
    if (ec) {
      drop(c, peerClosed(ec) ? "closed before a complete hello" : ec.message());
      return;
    }
    onHello(c);
  });
}

void Root::onHello(const ConnPtr& c) {
  const unsigned char* h = c->hello;
  if (get32(h) != kHelloMagic) return drop(c, "not a Loom hello (bad magic)");
  uint32_t infoLen = get32(h + kOffFields + 16);
  if (infoLen > kMaxInfoBytes) {  // a rank never sends this (join checks it): not worth a word
    return drop(c, "it announces info of " + std::to_string(infoLen) +
                       " bytes, over the limit of " + std::to_string(kMaxInfoBytes));
  }
  c->info.resize(infoLen);
  if (infoLen == 0) return onInfo(c);
  asio::async_read(c->sock, asio::buffer(&c->info[0], infoLen),
                   [this, c](const error_code& ec, size_t) {
                     if (stopping_ || !c->open) return;
                     if (ec) return drop(c, "closed before sending all of its info");
                     onInfo(c);
                   });
}

bool Root::authenticate(Conn& c) {
  if (!c.proof.empty()) return true;
  const unsigned char* h = c.hello;
  std::string fields(reinterpret_cast<const char*>(h + kOffFields), kHelloBytes - kOffFields);
  fields += c.info;
  if (!c.shake->check(h, fields)) return false;
  Result<std::string> proof = c.shake->answer();
  if (!proof.isOk()) return false;
  c.proof = proof.take();
  c.rank = static_cast<int32_t>(get32(h + kOffFields));
  c.nranks = static_cast<int32_t>(get32(h + kOffFields + 4));
  return true;
}

std::string Root::check(const Conn& c, loomResult_t* code) const {
  *code = loomInvalidUsage;
  if (c.nranks < 1) {
    *code = loomInvalidArgument;
    return "nranks " + std::to_string(c.nranks) + " is not positive";
  }
  if (c.nranks > kMaxRanks) {  // the first hello sizes byRank_
    *code = loomInvalidArgument;
    return "nranks " + std::to_string(c.nranks) + " is over the limit of " +
           std::to_string(kMaxRanks);
  }
  if (c.rank < 0 || c.rank >= c.nranks) {
    *code = loomInvalidArgument;
    return "rank " + std::to_string(c.rank) + " is outside [0, " + std::to_string(c.nranks) + ")";
  }
  if (nranks_ != 0 && c.nranks != nranks_) {
    return "rank " + std::to_string(c.rank) + " says nranks is " + std::to_string(c.nranks) +
           " but the ranks before it said " + std::to_string(nranks_);
  }
  if (nranks_ != 0 && byRank_[c.rank] && byRank_[c.rank].get() != &c) {
    return "rank " + std::to_string(c.rank) + " has already joined from " +
           byRank_[c.rank]->remote + " (two processes were given the same rank?)";
  }
  return "";
}

void Root::onInfo(const ConnPtr& c) {
  if (!authenticate(*c)) {
    return drop(c,
                "its MAC does not match (a rank of another communicator, a stranger, or a "
                "replayed hello)");
  }
  // A hello that completes after the root gave up gets the same word as the ranks before it.
  if (!gaveUpWhy_.empty()) return refuse(c, gaveUpCode_, gaveUpWhy_, /*warn=*/false);
  loomResult_t code = loomSuccess;
  std::string why = check(*c, &code);
  if (!why.empty()) return refuse(c, code, why);
  c->heard = true;
  c->timer.cancel();
  if (nranks_ == 0) {
    nranks_ = c->nranks;
    byRank_.assign(nranks_, nullptr);
  }
  byRank_[c->rank] = c;
  ++joined_;
  const std::string now = progress();
  noteHosted(at_, &now);
  LOOM_INFO(kBootstrap, "rendezvous root at %s: rank %d joined from %s (%d of %d)", where_.c_str(),
            c->rank, c->remote.c_str(), joined_, nranks_);
  if (joined_ == nranks_)
    sendTables();
  else
    watchLeave(c);
}

void Root::watchLeave(const ConnPtr& c) {
  asio::async_read(c->sock, asio::buffer(&c->leave, 1), [this, c](const error_code& ec, size_t n) {
    if (stopping_ || tablesSent_ || !c->open) return;
    const unsigned char byte = c->leave;
    if (ec) c->peerClosed = true;
    if (!ec) watchLeave(c);  // on to the close
    if (!left_.isOk()) return;
    const std::string who = "rank " + std::to_string(c->rank);
    if (!ec && n == 1 && byte == kLeaveTimeout)
      left_ = LOOM_ERROR(loomTimeout, who + " timed out waiting for the table");
    else if (!ec && n == 1 && byte == kLeaveAborted)
      left_ = LOOM_ERROR(loomRemoteError, who + " was aborted");
    else if (!ec)
      left_ = LOOM_ERROR(loomRemoteError, who + " sent a byte that is not a leave (" +
                                              std::to_string(byte) + ") and was dropped");
    else
      left_ = LOOM_ERROR(loomRemoteError, who + " closed its connection (" + ec.message() +
                                              "; its process may have exited)");
  });
}

void Root::close(Conn& c) {
  if (!c.open) return;
  c.open = false;
  error_code ec;
  c.timer.cancel();
  c.sock.close(ec);
}

void Root::drop(const ConnPtr& c, const std::string& why) {
  LOOM_WARN(kBootstrap, "rendezvous root at %s: closed the connection from %s: %s", where_.c_str(),
            c->remote.c_str(), why.c_str());
  close(*c);
}

void Root::refuse(const ConnPtr& c, loomResult_t code, const std::string& why, bool warn) {
  if (warn) {
    LOOM_WARN(kBootstrap, "rendezvous root at %s: refused rank %d from %s: %s", where_.c_str(),
              c->rank, c->remote.c_str(), why.c_str());
  }
  c->heard = true;
  c->timer.cancel();
  auto msg = std::make_shared<std::string>();
  std::string text = why.substr(0, kMaxRefusalBytes);
  put32(*msg, kRefusalMagic);
  put32(*msg, static_cast<uint32_t>(code));
  put32(*msg, static_cast<uint32_t>(text.size()));
  *msg += text;
  ++writesLeft_;
  std::array<asio::const_buffer, 2> bufs = {asio::buffer(c->proof), asio::buffer(*msg)};
  // A joined rank's connection stays open (its side shut down) until the rank closes it:
  // watchLeave reads it until then.
  const bool joined = c->rank >= 0 && c->rank < nranks_ && byRank_[c->rank] == c;
  asio::async_write(c->sock, bufs, [this, c, msg, joined](const error_code& ec, size_t) {
    --writesLeft_;
    error_code ignored;
    if (joined && !ec)
      c->sock.shutdown(tcp::socket::shutdown_send, ignored);
    else
      close(*c);
  });
}

void Root::sendTables() {
  error_code ec;
  acceptor_.close(ec);
  tablesSent_ = true;
  for (const ConnPtr& c : conns_)  // refused ones close once their refusal is out
    if (c->open && !c->heard) drop(c, "no complete hello by the time every rank had joined");
  std::string body;
  for (const ConnPtr& c : byRank_) {
    putAddr(body, getAddr(c->hello + kOffFields + 8));
    put32(body, static_cast<uint32_t>(c->info.size()));
    body += c->info;
  }
  auto msg = std::make_shared<std::string>();
  put32(*msg, kTableMagic);
  put32(*msg, static_cast<uint32_t>(nranks_));
  put32(*msg, static_cast<uint32_t>(body.size()));
  *msg += body;
  writesLeft_ += nranks_;
  for (const ConnPtr& c : byRank_) {
    std::array<asio::const_buffer, 2> bufs = {asio::buffer(c->proof), asio::buffer(*msg)};
    asio::async_write(c->sock, bufs, [this, c, msg](const error_code& e, size_t) {
      if (e && !stopping_) {
        LOOM_WARN(kBootstrap,
                  "rendezvous root at %s: could not send the table to rank %d at %s: %s",
                  where_.c_str(), c->rank, c->remote.c_str(), e.message().c_str());
      }
      close(*c);
      if (--writesLeft_ == 0) served_ = true;
    });
  }
}
}  // namespace

Status runRoot(int listenFd, const std::string& secret, int64_t timeoutMs,
               const std::atomic<bool>* stop) {
  return Root(secret, timeoutMs, stop).run(listenFd);
}

void encodeUniqueId(const IdContents& c, loomUniqueId* out) {
  auto* p = reinterpret_cast<unsigned char*>(out->internal);
  std::memset(p, 0, LOOM_UNIQUE_ID_BYTES);
  putLe(p + kOffMagic, kIdMagic, 4);
  putLe(p + kOffVersion, kIdVersion, 2);
  putLe(p + kOffFlags, c.rootOnRank0 ? kFlagRootOnRank0 : 0, 2);
  std::memcpy(p + kOffAddr, &c.root.sin_addr.s_addr, 4);
  std::memcpy(p + kOffPort, &c.root.sin_port, 2);
  std::memcpy(p + kOffSecret, c.secret.data(), std::min(c.secret.size(), kSecretBytes));
  putLe(p + kOffChecksum, fnv1a64(p, kOffChecksum), 8);
}

Result<IdContents> parseUniqueId(const loomUniqueId& id) {
  const auto* p = reinterpret_cast<const unsigned char*>(id.internal);
  if (getLe(p + kOffMagic, 4) != kIdMagic) {
    return LOOM_ERROR(loomInvalidArgument,
                      "commId: not a Loom unique id (bad magic); pass every rank the bytes of "
                      "one loomGetUniqueId call");
  }
  if (getLe(p + kOffChecksum, 8) != fnv1a64(p, kOffChecksum)) {
    return LOOM_ERROR(loomInvalidArgument,
                      "commId: checksum mismatch; the id was corrupted on its way to this rank");
  }
  uint64_t version = getLe(p + kOffVersion, 2);
  if (version != kIdVersion) {
    return LOOM_ERROR(loomInvalidArgument, "commId: layout version " + std::to_string(version) +
                                               " is not supported (this library makes " +
                                               std::to_string(kIdVersion) + ")");
  }
  uint64_t flags = getLe(p + kOffFlags, 2);
  if ((flags & ~static_cast<uint64_t>(kFlagRootOnRank0)) != 0) {
    return LOOM_ERROR(loomInvalidArgument, "commId: unknown flags " + std::to_string(flags));
  }
  IdContents c;
  c.root.sin_family = AF_INET;
  std::memcpy(&c.root.sin_addr.s_addr, p + kOffAddr, 4);
  std::memcpy(&c.root.sin_port, p + kOffPort, 2);
  c.secret.assign(reinterpret_cast<const char*>(p + kOffSecret), kSecretBytes);
  c.rootOnRank0 = (flags & kFlagRootOnRank0) != 0;
  if (c.root.sin_port == 0) return LOOM_ERROR(loomInvalidArgument, "commId: root port is 0");
  return c;
}

std::string hostedRootProgress(const sockaddr_in& root) {
  std::lock_guard<std::mutex> lock(hostedMutex());
  for (const uint32_t addr : {root.sin_addr.s_addr, htonl(INADDR_ANY)}) {
    auto it = hosted().find(std::make_pair(addr, root.sin_port));
    if (it != hosted().end()) return it->second;
  }
  return std::string();
}

Status makeUniqueId(loomUniqueId* out) {
  const std::string& commId = env::commId();
  if (commId.empty()) return makeLocalUniqueId(out, env::timeoutMs());
  return makeUniqueIdFor(commId, "LOOM_COMM_ID", out);
}

Status makeUniqueIdFor(const std::string& hostPort, const char* varName, loomUniqueId* out) {
  if (out == nullptr) return LOOM_ERROR(loomInvalidArgument, "uniqueId is NULL");
  IdContents c;
  LOOM_ASSIGN(c.root, net::parseHostPort(hostPort, varName));
  // Derived as for LOOM_COMM_ID=hostPort, so both routes to one address give one id.
  const std::string& secretText = env::commSecret();
  c.secret = deriveSecret(secretText.empty() ? "LOOM_COMM_ID=" + hostPort : secretText);
  c.rootOnRank0 = true;
  encodeUniqueId(c, out);
  LOOM_INFO(kBootstrap, "unique id names %s=%s; rank 0 hosts the root", varName, hostPort.c_str());
  return Status::ok();
}

Status makeDerivedUniqueId(const sockaddr_in& host, const std::string& text, loomUniqueId* out) {
  if (out == nullptr) return LOOM_ERROR(loomInvalidArgument, "uniqueId is NULL");
  IdContents c;
  c.root = host;
  c.secret = deriveSecret(text);
  constexpr uint64_t kLowPort = 10000, kEphemeralFrom = 32768;
  c.root.sin_port = htons(static_cast<uint16_t>(
      kLowPort + fnv1a64(c.secret.data(), c.secret.size()) % (kEphemeralFrom - kLowPort)));
  c.rootOnRank0 = true;
  encodeUniqueId(c, out);
  return Status::ok();
}

Status makeLocalUniqueId(loomUniqueId* out) { return makeLocalUniqueId(out, env::timeoutMs()); }

Status makeLocalUniqueId(loomUniqueId* out, int64_t rootTimeoutMs) {
  if (out == nullptr) return LOOM_ERROR(loomInvalidArgument, "uniqueId is NULL");
  IdContents c;
  LOOM_ASSIGN(std::string local, net::localAddress());
  sockaddr_in want{};
  want.sin_family = AF_INET;
  if (inet_pton(AF_INET, local.c_str(), &want.sin_addr) != 1) {
    return LOOM_ERROR(loomInternalError, "bad local address " + local);
  }
  c.secret.assign(kSecretBytes, '\0');
  LOOM_CHECK(auth::randomBytes(&c.secret[0], kSecretBytes));
  LOOM_ASSIGN(int fd, listenOn(want, &c.root));
  encodeUniqueId(c, out);

  std::string secret = c.secret;
  std::string where = net::toString(c.root);
  try {
    // The root ends on its own (all ranks joined, or the timeout), so it is detached.
    std::thread([fd, secret, rootTimeoutMs] {
      Status ignored = runRoot(fd, secret, rootTimeoutMs, nullptr);  // it logs its failures
      (void)ignored;
    }).detach();
  } catch (const std::exception& e) {
    close(fd);
    return LOOM_ERROR(loomSystemError, std::string("cannot start the root thread: ") + e.what());
  }
  LOOM_INFO(kBootstrap, "unique id: root listens at %s", where.c_str());
  return Status::ok();
}

}  // namespace loom::bootstrap
