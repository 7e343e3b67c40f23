// Authentication of Loom's own connections: one mutual challenge-response over the
// communicator's secret, which the bootstrap (root and ring) and the TCP transport all speak.
// Acceptor and Connector below are its two sides without I/O: each caller moves their frames
// with its own sockets (Boost.Asio in the bootstrap, a poll loop in the transport).
//
// The handshake, on every connection Loom accepts:
//   acceptor  -> connector   a fresh random nonce Na
//   connector -> acceptor    its own fresh nonce Nc, the hello's fields, and
//                            MAC_c = HMAC-SHA256(secret, transcript(context, "connector"))
//   acceptor  -> connector   MAC_a = HMAC-SHA256(secret, transcript(context, "acceptor"))
// where transcript = context || side label || Na || Nc || the hello's fields (each part
// length-prefixed, so no two transcripts share their bytes). The acceptor checks MAC_c in
// constant time before it believes any field; the connector checks MAC_a, so a listener that
// does not hold the secret is found out and learns nothing it could reuse. Nothing computed
// from the secret alone is sent, and a recorded hello answers another nonce, so a replay fails.
//
// What this does not give: the bytes after the handshake are neither encrypted nor
// authenticated (someone who can rewrite a live TCP stream can still tamper with it).
//
// Thread safety: every function is pure or reads the kernel's random source; any thread may
// call them.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "util/status.h"

namespace loom::auth {

constexpr size_t kNonceBytes = 32;
constexpr size_t kMacBytes = 32;
using Nonce = std::array<unsigned char, kNonceBytes>;
using Mac = std::array<unsigned char, kMacBytes>;

// Which side of a handshake a MAC speaks for.
enum class Side { Connector, Acceptor };

// n bytes from the kernel's random source (getrandom, else /dev/urandom).
Status randomBytes(void* out, size_t n);

// A fresh nonce; loomSystemError if the kernel gives no randomness.
Result<Nonce> freshNonce();

// HMAC-SHA256 (RFC 2104 over FIPS 180-4), computed by OpenSSL's libcrypto;
// loomSystemError if libcrypto fails.
Result<Mac> hmacSha256(const void* key, size_t keyBytes, const void* data, size_t bytes);

// The MAC `side` sends in a handshake under `context` (a fixed label per kind of
// connection, e.g. "loom/tcp/1"): HMAC-SHA256(secret, transcript) as the header says.
// `fields` are the hello's fields, encoded as on the wire.
Result<Mac> handshakeMac(const std::string& secret, const char* context, Side side,
                         const unsigned char* acceptorNonce, const unsigned char* connectorNonce,
                         const std::string& fields);

// Compares two MACs in constant time.
bool sameMac(const unsigned char* a, const unsigned char* b);

// ---- The frames ----
//
// Integers little-endian:
//   challenge  acceptor  -> connector   magic, Na[32]
//   hello      connector -> acceptor    magic, Nc[32], MAC_c[32], then the kind's wire fields
//   answer     acceptor  -> connector   magic, MAC_a[32]
// A kind of connection (Protocol) has its own context and three magics. The MACs cover the
// hello's fields as the kind defines them, which may hold more than its wire fields: what the
// acceptor knows itself (its own rank, the communicator) is covered without being sent.

struct Protocol {
  const char* context;  // e.g. "loom/tcp/1"
  uint32_t challengeMagic, helloMagic, answerMagic;
};

constexpr size_t kFrame32Bytes = 4 + 32;                         // a challenge or an answer
constexpr size_t kHelloHeadBytes = 4 + kNonceBytes + kMacBytes;  // a hello's before its fields

// Little-endian integers, as frames carry them.
void put32(std::string& s, uint32_t v);
void put64(std::string& s, uint64_t v);
uint32_t get32(const unsigned char* p);
uint64_t get64(const unsigned char* p);

// The acceptor's side of one connection.
class Acceptor {
 public:
  // With a fresh nonce; loomSystemError if the kernel gives no randomness.
  static Result<Acceptor> start(const Protocol& protocol, const std::string& secret);
  // The challenge, sent first.
  std::string challenge() const;
  // Whether `hello` (kHelloHeadBytes and its wire fields) is this kind's hello, its MAC over
  // `fields` made with the secret for this challenge. The caller builds `fields` from the
  // hello's wire fields and what it knows, and believes them only once this returns true.
  bool check(const unsigned char* hello, const std::string& fields);
  // The answer to the hello check() accepted.
  Result<std::string> answer() const;

 private:
  Acceptor(const Protocol& p, const std::string& secret, const Nonce& n)
      : protocol_(p), secret_(secret), nonce_(n) {}
  Protocol protocol_;
  std::string secret_;
  Nonce nonce_;
  Nonce theirs_{};
  std::string fields_;
  bool accepted_ = false;
};

// The connector's side of one connection.
class Connector {
 public:
  // Whether `frame` (kFrame32Bytes) starts with this kind's challenge magic.
  static bool isChallenge(const Protocol& protocol, const unsigned char* frame);
  // The hello answering `challenge` (kFrame32Bytes, isChallenge), with a fresh nonce: the MAC
  // covers `fields`, and `wire` follows the head.
  static Result<Connector> answer(const Protocol& protocol, const std::string& secret,
                                  const unsigned char* challenge, const std::string& fields,
                                  const std::string& wire);
  const std::string& hello() const { return hello_; }
  // Whether `answer` (kFrame32Bytes) proves that the acceptor holds the secret.
  bool check(const unsigned char* answer) const;

 private:
  Connector() = default;
  Protocol protocol_{};
  std::string secret_;
  Nonce theirs_{};
  Nonce nonce_{};
  std::string fields_;
  std::string hello_;
};

}  // namespace loom::auth
