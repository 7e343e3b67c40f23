// Authentication of Loom's own connections: a mutual challenge-response over the
// communicator's secret, shared by the bootstrap (root and ring) and the TCP transport.
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

}  // namespace loom::auth
