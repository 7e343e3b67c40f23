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

}  // namespace loom::auth
