#include "util/auth.h"

#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <sys/random.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <mutex>

namespace loom::auth {
namespace {

void putPart(std::string& s, const void* data, size_t n) {
  for (int i = 0; i < 4; ++i) s.push_back(static_cast<char>(static_cast<uint32_t>(n) >> (8 * i)));
  s.append(static_cast<const char*>(data), n);
}

// libcrypto frees its global tables from an atexit handler. A rendezvous root thread (detached)
// may still be checking a handshake while the process exits, and would read freed tables, so
// libcrypto is initialised without that handler; the kernel reclaims its memory at exit.
void initCrypto() {
  static std::once_flag once;
  std::call_once(once, [] { OPENSSL_init_crypto(OPENSSL_INIT_NO_ATEXIT, nullptr); });
}

}  // namespace

Status randomBytes(void* out, size_t n) {
  auto* p = static_cast<unsigned char*>(out);
  size_t got = 0;
  while (got < n) {
    ssize_t r = getrandom(p + got, n - got, 0);
    if (r > 0) {
      got += static_cast<size_t>(r);
    } else if (r < 0 && errno != EINTR) {
      break;
    }
  }
  if (got == n) return Status::ok();
  int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return LOOM_ERROR(loomSystemError, "random bytes: cannot read /dev/urandom");
  got = 0;
  while (got < n) {
    ssize_t r = read(fd, p + got, n - got);
    if (r > 0) {
      got += static_cast<size_t>(r);
    } else if (r == 0 || errno != EINTR) {
      break;
    }
  }
  close(fd);
  if (got != n) return LOOM_ERROR(loomSystemError, "random bytes: short read from /dev/urandom");
  return Status::ok();
}

Result<Nonce> freshNonce() {
  Nonce n{};
  LOOM_CHECK(randomBytes(n.data(), n.size()));
  return n;
}

Result<Mac> hmacSha256(const void* key, size_t keyBytes, const void* data, size_t bytes) {
  initCrypto();
  Mac mac{};
  unsigned int len = 0;
  if (HMAC(EVP_sha256(), key, static_cast<int>(keyBytes), static_cast<const unsigned char*>(data),
           bytes, mac.data(), &len) == nullptr ||
      len != kMacBytes) {
    return LOOM_ERROR(loomSystemError, "libcrypto could not compute an HMAC-SHA256");
  }
  return mac;
}

Result<Mac> handshakeMac(const std::string& secret, const char* context, Side side,
                         const unsigned char* acceptorNonce, const unsigned char* connectorNonce,
                         const std::string& fields) {
  const char* label = side == Side::Connector ? "connector" : "acceptor";
  std::string t;
  putPart(t, context, std::strlen(context));
  putPart(t, label, std::strlen(label));
  putPart(t, acceptorNonce, kNonceBytes);
  putPart(t, connectorNonce, kNonceBytes);
  putPart(t, fields.data(), fields.size());
  return hmacSha256(secret.data(), secret.size(), t.data(), t.size());
}

bool sameMac(const unsigned char* a, const unsigned char* b) {
  return CRYPTO_memcmp(a, b, kMacBytes) == 0;
}

void put32(std::string& s, uint32_t v) {
  for (int i = 0; i < 4; ++i) s.push_back(static_cast<char>(v >> (8 * i)));
}

void put64(std::string& s, uint64_t v) {
  put32(s, static_cast<uint32_t>(v));
  put32(s, static_cast<uint32_t>(v >> 32));
}

uint32_t get32(const unsigned char* p) {
  return p[0] | (p[1] << 8) | (p[2] << 16) | (static_cast<uint32_t>(p[3]) << 24);
}

uint64_t get64(const unsigned char* p) {
  return get32(p) | (static_cast<uint64_t>(get32(p + 4)) << 32);
}

namespace {

std::string frame32(uint32_t magic, const unsigned char* bytes) {
  std::string s;
  put32(s, magic);
  s.append(reinterpret_cast<const char*>(bytes), 32);
  return s;
}

}  // namespace

Result<Acceptor> Acceptor::start(const Protocol& protocol, const std::string& secret) {
  LOOM_ASSIGN(Nonce n, freshNonce());
  return Acceptor(protocol, secret, n);
}

std::string Acceptor::challenge() const { return frame32(protocol_.challengeMagic, nonce_.data()); }

bool Acceptor::check(const unsigned char* hello, const std::string& fields) {
  accepted_ = false;
  if (get32(hello) != protocol_.helloMagic) return false;
  const unsigned char* theirs = hello + 4;
  Result<Mac> want =
      handshakeMac(secret_, protocol_.context, Side::Connector, nonce_.data(), theirs, fields);
  if (!want.isOk() || !sameMac(hello + 4 + kNonceBytes, want.value().data())) return false;
  std::memcpy(theirs_.data(), theirs, kNonceBytes);
  fields_ = fields;
  accepted_ = true;
  return true;
}

Result<std::string> Acceptor::answer() const {
  if (!accepted_) return LOOM_ERROR(loomInternalError, "handshake: no hello accepted to answer");
  LOOM_ASSIGN(Mac mac, handshakeMac(secret_, protocol_.context, Side::Acceptor, nonce_.data(),
                                    theirs_.data(), fields_));
  return frame32(protocol_.answerMagic, mac.data());
}

bool Connector::isChallenge(const Protocol& protocol, const unsigned char* frame) {
  return get32(frame) == protocol.challengeMagic;
}

Result<Connector> Connector::answer(const Protocol& protocol, const std::string& secret,
                                    const unsigned char* challenge, const std::string& fields,
                                    const std::string& wire) {
  if (!isChallenge(protocol, challenge))
    return LOOM_ERROR(loomRemoteError, "handshake: not a challenge of this kind");
  Connector c;
  c.protocol_ = protocol;
  c.secret_ = secret;
  std::memcpy(c.theirs_.data(), challenge + 4, kNonceBytes);
  LOOM_ASSIGN(c.nonce_, freshNonce());
  c.fields_ = fields;
  LOOM_ASSIGN(Mac mac, handshakeMac(secret, protocol.context, Side::Connector, c.theirs_.data(),
                                    c.nonce_.data(), fields));
  put32(c.hello_, protocol.helloMagic);
  c.hello_.append(reinterpret_cast<const char*>(c.nonce_.data()), kNonceBytes);
  c.hello_.append(reinterpret_cast<const char*>(mac.data()), kMacBytes);
  c.hello_ += wire;
  return c;
}

bool Connector::check(const unsigned char* answer) const {
  if (get32(answer) != protocol_.answerMagic) return false;
  Result<Mac> want = handshakeMac(secret_, protocol_.context, Side::Acceptor, theirs_.data(),
                                  nonce_.data(), fields_);
  return want.isOk() && sameMac(answer + 4, want.value().data());
}

}  // namespace loom::auth
