// Bootstrap::join and the ring of TCP connections a rank keeps afterwards.
// The root's side of the rendezvous is in unique_id.cc; wire.h has the frames.
#include "bootstrap/bootstrap.h"

#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <mutex>
#include <optional>
#include <thread>

#include "bootstrap/unique_id.h"
#include "bootstrap/wire.h"
#include "util/env.h"
#include "util/log.h"
#include "util/net.h"
#include "util/wait.h"

namespace loom::bootstrap {
namespace {

std::atomic<RingListenHook> gRingListenHook{nullptr};

// A rank: joins the root, then keeps a ring of two TCP connections.
class Ring final : public Bootstrap {
 public:
  Ring(int rank, int nranks, const IdContents& id, int64_t timeoutMs,
       const std::atomic<bool>* abortFlag)
      : listener_(io_),
        next_(io_),
        prev_(io_),
        rank_(rank),
        nranks_(nranks),
        id_(id),
        timeoutMs_(timeoutMs),
        abortFlag_(abortFlag) {}
  ~Ring() override { closeRing(); }

  Status link(const std::string& info);

  int rank() const override { return rank_; }
  int nranks() const override { return nranks_; }
  const std::vector<std::string>& peerInfo() const override { return peerInfo_; }
  const std::string& secret() const override { return id_.secret; }
  uint64_t commHash() const override;
  Status allGather(const void* mine, void* all, size_t bytes) override;
  Status barrier() override;
  void abort() override;
  void setAbortFlag(const std::atomic<bool>* abortFlag) override { abortFlag_ = abortFlag; }

 private:
  struct Incoming {
    Incoming(asio::io_context& io, tcp::socket s) : sock(std::move(s)), timer(io) {}
    tcp::socket sock;
    asio::steady_timer timer;
    std::string remote;
    std::optional<auth::Acceptor> shake;
    std::string challenge;
    unsigned char hello[kRingHelloBytes] = {};
    std::string answer;
    bool open = true;
  };
  using IncomingPtr = std::shared_ptr<Incoming>;
  // State of linkRing(), alive until its handlers have all run.
  struct Linker {
    explicit Linker(asio::io_context& io) : retry(io) {}
    asio::steady_timer retry;
    unsigned char challenge[kChallengeBytes] = {};  // next's
    std::optional<auth::Connector> shake;           // ours, answering it
    unsigned char ack[kChallengeBytes] = {};
    bool nextDone = false, prevClaimed = false, prevDone = false, stopping = false;
    Status failure;
    std::vector<IncomingPtr> incoming;
  };

  int next() const { return (rank_ + 1) % nranks_; }
  int prev() const { return (rank_ + nranks_ - 1) % nranks_; }
  Limits limits() const {
    return makeLimits("rank " + std::to_string(rank_), timeoutMs_, abortFlag_, &aborted_);
  }
  Status openListener();
  // Runs op until it completes, the deadline passes or an abort; on failure the socket is
  // closed (keepOpen: only op is cancelled, and an op that completed meanwhile succeeds) and the
  // handler has run. *moved: the bytes op moved, all of them or up to the cut.
  Status await(tcp::socket& sock, const std::function<void(Done)>& op, const Limits& lim,
               const std::function<std::string()>& what, error_code* ec, bool keepOpen = false,
               size_t* moved = nullptr);
  Status connectRetry(tcp::socket& sock, const sockaddr_in& addr, const std::string& whom,
                      const Limits& lim);
  Status exchangeWithRoot(const std::string& info, const Limits& lim);
  Status parseTable(const std::string& body, uint32_t n);
  Status linkRing(const Limits& lim);
  void connectNext(Linker& lk, const Limits& lim);
  void acceptPrev(Linker& lk, const Limits& lim);
  void sayHelloToNext(Linker& lk);
  void onRingHello(Linker& lk, const IncomingPtr& in);
  void closeIncoming(const IncomingPtr& in, const std::string& why);
  Status peerError(int peer, const error_code& ec, const std::string& during) const;
  Status fail(Status s);
  void closeRing();

  asio::io_context io_;
  tcp::acceptor listener_;
  tcp::socket next_;
  tcp::socket prev_;
  int rank_;
  int nranks_;
  IdContents id_;
  int64_t timeoutMs_;
  const std::atomic<bool>* abortFlag_;
  std::atomic<bool> aborted_{false};
  sockaddr_in ringAddr_{};
  std::vector<std::string> peerInfo_;
  std::vector<sockaddr_in> ringAddrs_;
  std::mutex fdMu_;  // guards the descriptors abort() may shut down from another thread
  int nextFd_ = -1;
  int prevFd_ = -1;
  Status broken_;
};

Status Ring::openListener() {
  LOOM_ASSIGN(std::string local, net::localAddress());
  error_code ec;
  tcp::endpoint ep(asio::ip::make_address_v4(local, ec), 0);
  if (!ec) listener_.open(tcp::v4(), ec);
  if (!ec) listener_.bind(ep, ec);
  if (!ec) listener_.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    return LOOM_ERROR(loomSystemError, "bootstrap: rank " + std::to_string(rank_) +
                                           " cannot listen on " + local + ": " + ec.message());
  }
  ringAddr_ = fromEndpoint(listener_.local_endpoint(ec));
  RingListenHook hook = gRingListenHook.load();
  if (hook != nullptr) hook(rank_, &ringAddr_);
  return Status::ok();
}

Status Ring::await(tcp::socket& sock, const std::function<void(Done)>& op, const Limits& lim,
                   const std::function<std::string()>& what, error_code* ec, bool keepOpen,
                   size_t* moved) {
  Pending p;
  op(Done{&p});
  Status s = waitFor(
      io_, [&p] { return p.done; }, lim, what);
  if (!s.isOk()) {
    error_code ignored;
    if (keepOpen)
      sock.cancel(ignored);
    else
      sock.close(ignored);
    drain(io_);  // the handler points at p
    // Kept open: an operation that completed meanwhile (its handler ran in the drain) stands.
    if (keepOpen && p.done && !p.ec) s = Status::ok();
  }
  *ec = p.ec;
  if (moved != nullptr) *moved = p.bytes;
  return s;
}

Status Ring::connectRetry(tcp::socket& sock, const sockaddr_in& addr, const std::string& whom,
                          const Limits& lim) {
  tcp::endpoint ep = toEndpoint(addr);
  std::string last = "none";
  for (;;) {
    error_code ec;
    LOOM_CHECK(await(
        sock, [&](Done d) { sock.async_connect(ep, d); }, lim,
        [&] { return "connecting to " + whom + " (last error: " + last + ")"; }, &ec));
    if (!ec) break;
    if (!retryableConnect(ec)) {
      return LOOM_ERROR(loomSystemError, "bootstrap: rank " + std::to_string(rank_) +
                                             " cannot connect to " + whom + ": " + ec.message());
    }
    last = ec.message();
    error_code ignored;
    sock.close(ignored);
    asio::steady_timer timer(io_, kRetryDelay);
    LOOM_CHECK(await(
        sock, [&](Done d) { timer.async_wait(d); }, lim,
        [&] { return "connecting to " + whom + " (last error: " + last + ")"; }, &ec));
  }
  error_code ignored;
  sock.set_option(tcp::no_delay(true), ignored);
  return Status::ok();
}

Status Ring::exchangeWithRoot(const std::string& info, const Limits& lim) {
  std::string where = "the root at " + net::toString(id_.root);
  tcp::socket root(io_);
  LOOM_CHECK(connectRetry(root, id_.root, where, lim));

  // The root speaks first: its challenge. Then this rank's hello, with its MAC.
  unsigned char challenge[kChallengeBytes];
  error_code ec;
  LOOM_CHECK(await(
      root, [&](Done d) { asio::async_read(root, asio::buffer(challenge), d); }, lim,
      [&] { return "waiting for the challenge of " + where; }, &ec));
  if (ec && peerClosed(ec)) {  // the root's process went away (or was never a Loom root)
    return LOOM_ERROR(
        loomRemoteError,
        "bootstrap: " + where + " closed the connection before its challenge (" + ec.message() +
            "): the process that hosts it (" +
            (id_.rootOnRank0 ? "rank 0's" : "the one that made the id, often rank 0") +
            ") may have exited");
  }
  if (ec || !auth::Connector::isChallenge(kRootProtocol, challenge)) {
    return LOOM_ERROR(loomRemoteError,
                      "bootstrap: " + where + " did not open with a Loom challenge (" +
                          (ec ? ec.message() : std::string("bad magic")) + "); is it a Loom root?");
  }
  const std::string fields = rootFields(rank_, nranks_, ringAddr_, info);
  LOOM_ASSIGN(auth::Connector shake,
              auth::Connector::answer(kRootProtocol, id_.secret, challenge, fields, fields));
  const std::string& hello = shake.hello();
  LOOM_CHECK(await(
      root, [&](Done d) { asio::async_write(root, asio::buffer(hello), d); }, lim,
      [&] { return "sending its hello to " + where; }, &ec));

  auto waiting = [&] {
    // The root knows who is missing; when this process hosts it, say what it knows.
    const std::string heard = hostedRootProgress(id_.root);
    return "waiting for the table from " + where +
           (heard.empty() ? " (has every rank joined?)" : " (it has " + heard + ")");
  };
  // The root's proof comes with its reply, once every rank has joined.
  unsigned char proof[kChallengeBytes];
  unsigned char header[kReplyHeaderBytes];
  size_t got = 0;  // of the proof, once a wait for it was cut short
  auto readProof = [&](Done d) {
    asio::async_read(root, asio::buffer(proof + got, sizeof(proof) - got), d);
  };
  Limits replyLim = lim;
  Status gaveUp;  // this rank's own timeout, when it left before the reply came
  Status waited = await(root, readProof, lim, waiting, &ec, /*keepOpen=*/true, &got);
  if (!waited.isOk()) {
    // Leave: the root then gives up and tells every rank that joined (this one too, within the
    // grace) who never came. An aborted rank leaves without waiting for that word; a wait that
    // failed otherwise just closes (the root takes that as a leave too).
    const bool timedOut = waited.code() == loomTimeout;
    error_code wec;
    if (timedOut || waited.code() == loomInvalidUsage) {
      const unsigned char why = timedOut ? kLeaveTimeout : kLeaveAborted;
      asio::write(root, asio::buffer(&why, 1), wec);
      if (!wec) root.shutdown(tcp::socket::shutdown_send, wec);
    }
    if (!timedOut) {
      root.close(wec);
      return waited;
    }
    // Read on even when the root has closed: its word may be here already.
    gaveUp = waited;
    replyLim = makeLimits(lim.who, waitGraceMs(msCount(lim.deadline - lim.start)), lim.abortFlag,
                          lim.aborted);
    if (!await(root, readProof, replyLim, waiting, &ec).isOk()) return gaveUp;
  }
  // Once this rank has left, any failure below is its own timeout, and a refusal adds to it.
  auto failed = [&](Status s) { return gaveUp.isOk() ? s : gaveUp; };
  if (!ec) {
    Status s = await(
        root, [&](Done d) { asio::async_read(root, asio::buffer(header), d); }, replyLim, waiting,
        &ec);
    if (!s.isOk()) return failed(s);
  }
  if (ec) {
    return failed(LOOM_ERROR(loomRemoteError,
                             "bootstrap: " + where + " closed the connection of rank " +
                                 std::to_string(rank_) + " (" + ec.message() +
                                 "); was the id used up already, did the root time out, or does "
                                 "it hold another secret?"));
  }
  if (!shake.check(proof)) {
    return LOOM_ERROR(loomRemoteError,
                      "bootstrap: " + where + " did not prove that it holds the id's secret " +
                          "(rank " + std::to_string(rank_) +
                          " refuses it: a stranger listening at the root's address?)");
  }
  uint32_t magic = get32(header), a = get32(header + 4), len = get32(header + 8);
  size_t limit = 0;
  if (magic == kTableMagic && a == static_cast<uint32_t>(nranks_)) {
    limit = static_cast<size_t>(nranks_) * (kEntryBytes + kMaxInfoBytes);
  } else if (magic == kRefusalMagic) {
    limit = kMaxRefusalBytes;
  } else {
    return LOOM_ERROR(loomRemoteError, "bootstrap: rank " + std::to_string(rank_) +
                                           " got a malformed reply from " + where);
  }
  if (len > limit) {
    return LOOM_ERROR(loomRemoteError, "bootstrap: " + where + " announced a reply of " +
                                           std::to_string(len) + " bytes, over the limit");
  }
  std::string body(len, '\0');
  if (len > 0) {
    Status s = await(
        root, [&](Done d) { asio::async_read(root, asio::buffer(&body[0], len), d); }, replyLim,
        waiting, &ec);
    if (!s.isOk()) return failed(s);
    if (ec) {
      return failed(LOOM_ERROR(loomRemoteError, "bootstrap: " + where +
                                                    " closed the connection of rank " +
                                                    std::to_string(rank_) + " mid-reply"));
    }
  }
  if (magic == kRefusalMagic && !gaveUp.isOk())
    return LOOM_ERROR(loomTimeout, gaveUp.message() + "; then the root " + body);
  if (magic == kRefusalMagic) {
    loomResult_t code =
        (a > 0 && a < loomNumResults) ? static_cast<loomResult_t>(a) : loomRemoteError;
    return LOOM_ERROR(
        code, "bootstrap: " + where + " refused rank " + std::to_string(rank_) + ": " + body);
  }
  return parseTable(body, a);
}

Status Ring::parseTable(const std::string& body, uint32_t n) {
  const auto* p = reinterpret_cast<const unsigned char*>(body.data());
  size_t pos = 0;
  peerInfo_.assign(n, std::string());
  ringAddrs_.assign(n, sockaddr_in{});
  for (uint32_t r = 0; r < n; ++r) {
    if (body.size() - pos < kEntryBytes) break;
    ringAddrs_[r] = getAddr(p + pos);
    uint32_t len = get32(p + pos + 8);
    pos += kEntryBytes;
    if (len > kMaxInfoBytes || body.size() - pos < len) break;
    peerInfo_[r].assign(body, pos, len);
    pos += len;
    if (r + 1 == n && pos == body.size()) return Status::ok();
  }
  return LOOM_ERROR(loomRemoteError, "bootstrap: rank " + std::to_string(rank_) +
                                         " got a malformed table from the root");
}

void Ring::connectNext(Linker& lk, const Limits& lim) {
  next_.async_connect(toEndpoint(ringAddrs_[next()]), [this, &lk, &lim](const error_code& ec) {
    if (lk.stopping) return;
    if (ec) {
      if (!retryableConnect(ec)) {
        lk.failure = LOOM_ERROR(loomSystemError, "bootstrap: rank " + std::to_string(rank_) +
                                                     " cannot connect to rank " +
                                                     std::to_string(next()) + ": " + ec.message());
        return;
      }
      error_code ignored;
      next_.close(ignored);
      lk.retry.expires_after(kRetryDelay);
      lk.retry.async_wait([this, &lk, &lim](const error_code& e) {
        if (!e && !lk.stopping) connectNext(lk, lim);
      });
      return;
    }
    error_code ignored;
    next_.set_option(tcp::no_delay(true), ignored);
    asio::async_read(next_, asio::buffer(lk.challenge), [this, &lk](const error_code& e, size_t) {
      if (lk.stopping) return;
      if (e) {
        lk.failure = peerError(next(), e, "waiting for its ring challenge");
        return;
      }
      sayHelloToNext(lk);
    });
  });
}

// Answers next's challenge with this rank's hello, then checks next's MAC.
void Ring::sayHelloToNext(Linker& lk) {
  const std::string who = "the ring listener of rank " + std::to_string(next()) + " at " +
                          net::toString(ringAddrs_[next()]);
  if (!auth::Connector::isChallenge(kRingProtocol, lk.challenge)) {
    lk.failure =
        LOOM_ERROR(loomRemoteError, "bootstrap: " + who + " answered rank " +
                                        std::to_string(rank_) + " with something other than Loom");
    return;
  }
  std::string wire;
  put32(wire, static_cast<uint32_t>(rank_));
  Result<auth::Connector> shake = auth::Connector::answer(kRingProtocol, id_.secret, lk.challenge,
                                                          ringFields(rank_, next(), nranks_), wire);
  if (!shake.isOk()) {
    lk.failure = shake.status();
    return;
  }
  lk.shake = shake.take();
  asio::async_write(
      next_, asio::buffer(lk.shake->hello()), [this, &lk, who](const error_code& e, size_t) {
        if (lk.stopping) return;
        if (e) {
          lk.failure = peerError(next(), e, "linking the ring");
          return;
        }
        asio::async_read(
            next_, asio::buffer(lk.ack), [this, &lk, who](const error_code& e2, size_t) {
              if (lk.stopping) return;
              if (e2) {
                lk.failure = peerError(next(), e2, "linking the ring; did it refuse this rank?");
              } else if (!lk.shake->check(lk.ack)) {
                lk.failure =
                    LOOM_ERROR(loomRemoteError,
                               "bootstrap: " + who + " did not prove that it holds the id's " +
                                   "secret; rank " + std::to_string(rank_) +
                                   " refuses it (a stranger listening at that address?)");
              } else {
                lk.nextDone = true;
              }
            });
      });
}

void Ring::acceptPrev(Linker& lk, const Limits& lim) {
  listener_.async_accept([this, &lk, &lim](const error_code& ec, tcp::socket sock) {
    if (lk.stopping || lk.prevDone) return;
    if (ec) {
      LOOM_INFO(kBootstrap, "rank %d: ring accept failed: %s", rank_, ec.message().c_str());
      lk.retry.expires_after(kRetryDelay);
      lk.retry.async_wait([this, &lk, &lim](const error_code& e) {
        if (!e && !lk.stopping) acceptPrev(lk, lim);
      });
      return;
    }
    auto in = std::make_shared<Incoming>(io_, std::move(sock));
    in->remote = remoteOf(in->sock);
    lk.incoming.push_back(in);
    auto limit = std::min<Clock::duration>(kHandshake, lim.deadline - Clock::now());
    in->timer.expires_after(limit);
    in->timer.async_wait([this, in, limit](const error_code& e) {
      if (e || !in->open) return;
      closeIncoming(in, "no complete hello within " + msString(limit));
    });
    Result<auth::Acceptor> shake = auth::Acceptor::start(kRingProtocol, id_.secret);
    if (!shake.isOk()) {
      closeIncoming(in, shake.status().message());
    } else {
      in->shake = shake.take();
      in->challenge = in->shake->challenge();
      // The hello is read once the challenge is out: one write in flight at a time.
      asio::async_write(
          in->sock, asio::buffer(in->challenge), [this, &lk, in](const error_code& e, size_t) {
            if (lk.stopping || !in->open) return;
            if (e) return closeIncoming(in, "closed before its challenge was sent");
            asio::async_read(
                in->sock, asio::buffer(in->hello), [this, &lk, in](const error_code& e2, size_t) {
                  if (lk.stopping || !in->open) return;
                  if (e2) {
                    return closeIncoming(
                        in, peerClosed(e2) ? "closed before a complete hello" : e2.message());
                  }
                  onRingHello(lk, in);
                });
          });
    }
    acceptPrev(lk, lim);
  });
}

void Ring::closeIncoming(const IncomingPtr& in, const std::string& why) {
  LOOM_WARN(kBootstrap, "rank %d: closed ring connection from %s: %s", rank_, in->remote.c_str(),
            why.c_str());
  in->open = false;
  in->timer.cancel();
  error_code ignored;
  in->sock.close(ignored);
}

void Ring::onRingHello(Linker& lk, const IncomingPtr& in) {
  const unsigned char* h = in->hello;
  int claimed = static_cast<int32_t>(get32(h + kOffFields));
  const std::string fields = ringFields(claimed, rank_, nranks_);
  if (get32(h) != kRingMagic) {
    return closeIncoming(in, "not a Loom ring hello (bad magic)");
  }
  if (!in->shake->check(h, fields)) {
    return closeIncoming(in, "its MAC does not match (wrong secret, or a replayed hello)");
  }
  if (claimed != prev()) {
    return closeIncoming(in, "it claims rank " + std::to_string(claimed) + ", expected rank " +
                                 std::to_string(prev()));
  }
  if (lk.prevClaimed) {
    return closeIncoming(in, "rank " + std::to_string(prev()) + " is already connected");
  }
  Result<std::string> answer = in->shake->answer();
  if (!answer.isOk()) return closeIncoming(in, answer.status().message());
  in->timer.cancel();
  lk.prevClaimed = true;
  in->answer = answer.take();
  asio::async_write(in->sock, asio::buffer(in->answer),
                    [this, &lk, in](const error_code& e, size_t) {
                      if (lk.stopping || !in->open) return;
                      if (e) {
                        lk.failure = peerError(prev(), e, "linking the ring");
                        return;
                      }
                      in->open = false;
                      prev_ = std::move(in->sock);
                      error_code ignored;
                      prev_.set_option(tcp::no_delay(true), ignored);
                      lk.prevDone = true;
                    });
}

Status Ring::linkRing(const Limits& lim) {
  Linker lk(io_);
  connectNext(lk, lim);
  acceptPrev(lk, lim);
  Status s = waitFor(
      io_, [&lk] { return (lk.nextDone && lk.prevDone) || !lk.failure.isOk(); }, lim,
      [&] {
        return std::string("linking the ring: ") +
               (lk.nextDone ? "" : "rank " + std::to_string(next()) + " has not answered; ") +
               (lk.prevDone ? "" : "rank " + std::to_string(prev()) + " has not connected; ");
      });
  if (s.isOk()) s = lk.failure;
  // Stop everything still in flight and let the handlers that refer to lk run.
  lk.stopping = true;
  error_code ignored;
  listener_.close(ignored);
  lk.retry.cancel();
  for (const IncomingPtr& in : lk.incoming) {
    if (in->open && lk.prevDone) {
      LOOM_WARN(kBootstrap,
                "rank %d: closed ring connection from %s: no complete hello by the "
                "time the ring was linked",
                rank_, in->remote.c_str());
    }
    in->open = false;
    in->timer.cancel();
    in->sock.close(ignored);
  }
  if (!s.isOk()) {
    next_.close(ignored);
    prev_.close(ignored);
  }
  drain(io_);
  return s;
}

// The root, hosted by rank 0 under LOOM_COMM_ID, in a thread of its own.
class RootThread {
 public:
  ~RootThread() { finish(true); }
  Status start(const IdContents& id, int64_t timeoutMs) {
    asio::io_context io;
    tcp::acceptor acceptor(io);
    error_code ec;
    tcp::endpoint ep = toEndpoint(id.root);
    acceptor.open(tcp::v4(), ec);
    if (!ec) acceptor.set_option(asio::socket_base::reuse_address(true), ec);
    if (!ec) acceptor.bind(ep, ec);
    if (ec.value() == EADDRNOTAVAIL) {
      ec.clear();  // a name for this host that is not one of its addresses: listen on all
      acceptor.bind(tcp::endpoint(tcp::v4(), ep.port()), ec);
    }
    if (!ec) acceptor.listen(asio::socket_base::max_listen_connections, ec);
    int fd = ec ? -1 : acceptor.release(ec);
    if (ec || fd < 0) {
      return LOOM_ERROR(loomSystemError, "bootstrap: rank 0 cannot host the root at LOOM_COMM_ID " +
                                             net::toString(id.root) + ": " + ec.message());
    }
    std::string secret = id.secret;
    thread_ = std::thread([this, fd, secret, timeoutMs] {
      Status ignored = runRoot(fd, secret, timeoutMs, &stop_);  // it logs its failures
      (void)ignored;
    });
    return Status::ok();
  }
  // Waits for the root; it is told to stop first when this rank failed.
  void finish(bool stop) {
    if (stop) stop_.store(true);
    if (thread_.joinable()) thread_.join();
  }

 private:
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

Status Ring::link(const std::string& info) {
  Limits lim = limits();
  if (nranks_ > 1) LOOM_CHECK(openListener());
  RootThread root;
  if (id_.rootOnRank0 && rank_ == 0) LOOM_CHECK(root.start(id_, timeoutMs_));
  Status s = exchangeWithRoot(info, lim);
  if (s.isOk() && nranks_ > 1) s = linkRing(lim);
  root.finish(!s.isOk());
  if (!s.isOk()) {
    closeRing();
    return s;
  }
  std::lock_guard<std::mutex> lock(fdMu_);
  if (nranks_ > 1) {
    nextFd_ = next_.native_handle();
    prevFd_ = prev_.native_handle();
  }
  std::string ring = nranks_ > 1 ? "; ring to " + net::toString(ringAddrs_[next()]) : "";
  LOOM_INFO(kBootstrap, "rank %d of %d joined in %s%s", rank_, nranks_,
            msString(Clock::now() - lim.start).c_str(), ring.c_str());
  return Status::ok();
}

uint64_t Ring::commHash() const {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char ch : id_.secret) {
    h ^= ch;
    h *= 0x100000001b3ull;
  }
  return h;
}

Status Ring::peerError(int peer, const error_code& ec, const std::string& during) const {
  if (aborted_.load()) {
    return LOOM_ERROR(loomInvalidUsage, "bootstrap: rank " + std::to_string(rank_) +
                                            " was aborted by loomCommAbort while " + during);
  }
  if (peerClosed(ec)) {
    return LOOM_ERROR(loomRemoteError, "bootstrap: rank " + std::to_string(peer) +
                                           " closed its connection (seen by rank " +
                                           std::to_string(rank_) + " " + during + ")");
  }
  return LOOM_ERROR(loomRemoteError, "bootstrap: connection from rank " + std::to_string(rank_) +
                                         " to rank " + std::to_string(peer) + " failed " + during +
                                         ": " + ec.message());
}

Status Ring::allGather(const void* mine, void* all, size_t bytes) {
  if (!broken_.isOk()) return broken_;
  if (aborted_.load()) {
    return fail(LOOM_ERROR(loomInvalidUsage, "bootstrap: rank " + std::to_string(rank_) +
                                                 " was aborted by loomCommAbort"));
  }
  auto* out = static_cast<char*>(all);
  if (bytes == 0) return Status::ok();
  std::memmove(out + static_cast<size_t>(rank_) * bytes, mine, bytes);
  if (nranks_ == 1) return Status::ok();
  Limits lim = limits();
  // Step s sends the block received in step s - 1 (first our own) to next and
  // receives the block of rank - s - 1 from prev, both at once.
  for (int step = 0; step < nranks_ - 1; ++step) {
    size_t sendIdx = static_cast<size_t>((rank_ - step + nranks_) % nranks_);
    size_t recvIdx = static_cast<size_t>((rank_ - step - 1 + 2 * nranks_) % nranks_);
    Pending w, r;
    asio::async_write(next_, asio::buffer(out + sendIdx * bytes, bytes), Done{&w});
    asio::async_read(prev_, asio::buffer(out + recvIdx * bytes, bytes), Done{&r});
    std::string during =
        "in allGather step " + std::to_string(step + 1) + " of " + std::to_string(nranks_ - 1);
    Status s = waitFor(
        io_, [&] { return (w.done && r.done) || (w.done && w.ec) || (r.done && r.ec); }, lim,
        [&] {
          return during + (r.done ? "" : " waiting for rank " + std::to_string(prev())) +
                 (w.done ? "" : " waiting to send to rank " + std::to_string(next()));
        });
    if (s.isOk() && r.ec) s = peerError(prev(), r.ec, during);
    if (s.isOk() && w.ec) s = peerError(next(), w.ec, during);
    if (!s.isOk()) return fail(s);
  }
  return Status::ok();
}

Status Ring::barrier() {
  char token = 0;
  std::vector<char> all(static_cast<size_t>(nranks_));
  return allGather(&token, all.data(), 1);
}

void Ring::abort() {
  aborted_.store(true);
  std::lock_guard<std::mutex> lock(fdMu_);
  if (nextFd_ >= 0) ::shutdown(nextFd_, SHUT_RDWR);
  if (prevFd_ >= 0) ::shutdown(prevFd_, SHUT_RDWR);
}

void Ring::closeRing() {
  std::lock_guard<std::mutex> lock(fdMu_);
  nextFd_ = prevFd_ = -1;
  error_code ignored;
  next_.close(ignored);
  prev_.close(ignored);
}

Status Ring::fail(Status s) {
  closeRing();  // neighbours see the ring close and fail fast too
  drain(io_);   // the pending handlers point into the caller's frame
  broken_ = s;
  return s;
}

}  // namespace

void setRingListenHookForTest(RingListenHook hook) { gRingListenHook.store(hook); }

Result<std::unique_ptr<Bootstrap>> Bootstrap::join(const loomUniqueId& id, int rank, int nranks,
                                                   const std::string& info, int64_t timeoutMs,
                                                   const std::atomic<bool>* abortFlag) {
  LOOM_ASSIGN(IdContents contents, parseUniqueId(id));
  if (nranks < 1 || rank < 0 || rank >= nranks) {
    return LOOM_ERROR(loomInvalidArgument, "bootstrap: rank " + std::to_string(rank) + " of " +
                                               std::to_string(nranks) +
                                               ": need nranks >= 1 and 0 <= rank < nranks");
  }
  if (info.size() > kMaxInfoBytes) {
    return LOOM_ERROR(loomInvalidArgument, "bootstrap: info of " + std::to_string(info.size()) +
                                               " bytes is over the limit of " +
                                               std::to_string(kMaxInfoBytes));
  }
  if (timeoutMs <= 0) timeoutMs = env::timeoutMs();
  auto ring = std::make_unique<Ring>(rank, nranks, contents, timeoutMs, abortFlag);
  LOOM_CHECK(ring->link(info));
  return std::unique_ptr<Bootstrap>(std::move(ring));
}

}  // namespace loom::bootstrap
