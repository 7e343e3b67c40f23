// Handshake frames built by hand, as a stranger or a fake peer would write them, for the tests
// and fuzzers that play one against the bootstrap (src/bootstrap/wire.h lays the frames out).
// They compute the MACs with util/auth.h's handshakeMac directly, not through the library's
// Acceptor and Connector, so a test checks those against a separate encoding.
#pragma once

#include <cstdint>
#include <string>

#include "bootstrap/wire.h"
#include "util/auth.h"
#include "util/status.h"

namespace loom::bootstrap {

// A challenge (kChallengeMagic), a proof (kProofMagic) or a ring answer (kRingAckMagic): the
// magic and 32 bytes of nonce or MAC.
inline std::string frame32(uint32_t magic, const unsigned char* bytes32) {
  std::string s;
  put32(s, magic);
  s.append(reinterpret_cast<const char*>(bytes32), 32);
  return s;
}
// The 32 bytes of a frame32 of this magic, or null if p (kChallengeBytes long) is not one.
inline const unsigned char* parse32(const unsigned char* p, uint32_t magic) {
  return get32(p) == magic ? p + 4 : nullptr;
}

// A hello answering the listener's challenge: magic, the connector's nonce, its MAC over
// `fields`, then `wire` (the fields as the frame carries them).
inline Result<std::string> helloFrame(uint32_t magic, const char* context,
                                      const std::string& secret, const unsigned char* listenerNonce,
                                      const auth::Nonce& nonce, const std::string& fields,
                                      const std::string& wire) {
  LOOM_ASSIGN(auth::Mac mac, auth::handshakeMac(secret, context, auth::Side::Connector,
                                                listenerNonce, nonce.data(), fields));
  std::string h;
  put32(h, magic);
  h.append(reinterpret_cast<const char*>(nonce.data()), nonce.size());
  h.append(reinterpret_cast<const char*>(mac.data()), mac.size());
  return h + wire;
}
// Whether `mac` is what `side` must send for this transcript (constant time).
inline bool macMatches(const unsigned char* mac, const char* context, auth::Side side,
                       const std::string& secret, const unsigned char* listenerNonce,
                       const unsigned char* connectorNonce, const std::string& fields) {
  Result<auth::Mac> want =
      auth::handshakeMac(secret, context, side, listenerNonce, connectorNonce, fields);
  return want.isOk() && auth::sameMac(mac, want.value().data());
}

}  // namespace loom::bootstrap
