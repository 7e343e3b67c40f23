// The one handshake (src/util/auth.h) on its own, without sockets: both sides' frames checked
// against a hello forged by hand (tests/support/forged_frames.h), and each way it must refuse.
#include <gtest/gtest.h>

#include <string>

#include "forged_frames.h"
#include "util/auth.h"

namespace loom::auth {
namespace {

constexpr Protocol kA{"loom/test/a", 0x41414141u, 0x42424242u, 0x43434343u};
constexpr Protocol kB{"loom/test/b", 0x41414141u, 0x44444444u, 0x45454545u};
const std::string kSecret(32, 's');

const unsigned char* u8(const std::string& s, size_t at = 0) {
  return reinterpret_cast<const unsigned char*>(s.data()) + at;
}

TEST(Handshake, BothSidesAgreeAndTheFramesAreAsLaidOut) {
  Result<Acceptor> acc = Acceptor::start(kA, kSecret);
  ASSERT_TRUE(acc.isOk());
  const std::string challenge = acc.value().challenge();
  ASSERT_EQ(challenge.size(), kFrame32Bytes);
  EXPECT_EQ(get32(u8(challenge)), kA.challengeMagic);
  ASSERT_TRUE(Connector::isChallenge(kA, u8(challenge)));

  Result<Connector> con = Connector::answer(kA, kSecret, u8(challenge), "fields+own", "wire");
  ASSERT_TRUE(con.isOk());
  const std::string& hello = con.value().hello();
  ASSERT_EQ(hello.size(), kHelloHeadBytes + 4);
  EXPECT_EQ(get32(u8(hello)), kA.helloMagic);
  EXPECT_EQ(hello.substr(kHelloHeadBytes), "wire");
  // The MAC is the one computed by hand over the same transcript.
  Result<Mac> want = handshakeMac(kSecret, kA.context, Side::Connector, u8(challenge, 4),
                                  u8(hello, 4), "fields+own");
  ASSERT_TRUE(want.isOk());
  EXPECT_TRUE(sameMac(u8(hello, 4 + kNonceBytes), want.value().data()));

  ASSERT_TRUE(acc.value().check(u8(hello), "fields+own"));
  Result<std::string> answer = acc.value().answer();
  ASSERT_TRUE(answer.isOk());
  ASSERT_EQ(answer.value().size(), kFrame32Bytes);
  EXPECT_EQ(get32(u8(answer.value())), kA.answerMagic);
  EXPECT_TRUE(con.value().check(u8(answer.value())));
}

TEST(Handshake, AHelloForgedByHandIsAccepted) {
  Result<Acceptor> acc = Acceptor::start(kA, kSecret);
  ASSERT_TRUE(acc.isOk());
  const std::string challenge = acc.value().challenge();
  Result<Nonce> nonce = freshNonce();
  ASSERT_TRUE(nonce.isOk());
  Result<std::string> hello = bootstrap::helloFrame(kA.helloMagic, kA.context, kSecret,
                                                    u8(challenge, 4), nonce.value(), "f", "w");
  ASSERT_TRUE(hello.isOk());
  EXPECT_TRUE(acc.value().check(u8(hello.value()), "f"));
}

TEST(Handshake, EveryWrongHelloIsRefusedAndLeavesNothingToAnswer) {
  Result<Acceptor> acc = Acceptor::start(kA, kSecret);
  ASSERT_TRUE(acc.isOk());
  const std::string challenge = acc.value().challenge();
  auto helloFrom = [&](const Protocol& p, const std::string& secret, const std::string& fields) {
    Result<Connector> c = Connector::answer(p, secret, u8(challenge), fields, "");
    EXPECT_TRUE(c.isOk());
    return c.isOk() ? c.value().hello() : std::string(kHelloHeadBytes, '\0');
  };
  // Another secret, other fields (the hello moved to another listener or rank), another kind
  // of connection (same challenge magic, another context and hello magic).
  EXPECT_FALSE(acc.value().check(u8(helloFrom(kA, std::string(32, 'x'), "f")), "f"));
  EXPECT_FALSE(acc.value().check(u8(helloFrom(kA, kSecret, "f")), "g"));
  EXPECT_FALSE(acc.value().check(u8(helloFrom(kB, kSecret, "f")), "f"));
  // A hello's MAC with one bit flipped.
  std::string flipped = helloFrom(kA, kSecret, "f");
  flipped[4 + kNonceBytes] ^= 1;
  EXPECT_FALSE(acc.value().check(u8(flipped), "f"));
  EXPECT_FALSE(acc.value().answer().isOk()) << "answered a hello it refused";

  // A hello that answered one acceptor's challenge, replayed to another.
  const std::string good = helloFrom(kA, kSecret, "f");
  ASSERT_TRUE(acc.value().check(u8(good), "f"));
  Result<Acceptor> other = Acceptor::start(kA, kSecret);
  ASSERT_TRUE(other.isOk());
  EXPECT_FALSE(other.value().check(u8(good), "f")) << "a replayed hello was accepted";
}

TEST(Handshake, TheConnectorRefusesWhatDoesNotProveTheSecret) {
  Result<Acceptor> acc = Acceptor::start(kA, kSecret);
  ASSERT_TRUE(acc.isOk());
  const std::string challenge = acc.value().challenge();
  EXPECT_FALSE(Connector::isChallenge(kB, u8(std::string(kFrame32Bytes, 'z'))));
  EXPECT_FALSE(Connector::answer(kA, kSecret, u8(std::string(kFrame32Bytes, 'z')), "f", "").isOk());
  Result<Connector> con = Connector::answer(kA, kSecret, u8(challenge), "f", "");
  ASSERT_TRUE(con.isOk());
  // An acceptor with another secret answers with its own MAC: refused.
  Result<Acceptor> stranger = Acceptor::start(kA, std::string(32, 'x'));
  ASSERT_TRUE(stranger.isOk());
  EXPECT_FALSE(stranger.value().check(u8(con.value().hello()), "f"));
  Result<Mac> forged = handshakeMac(std::string(32, 'x'), kA.context, Side::Acceptor,
                                    u8(challenge, 4), u8(con.value().hello(), 4), "f");
  ASSERT_TRUE(forged.isOk());
  std::string answer;
  put32(answer, kA.answerMagic);
  answer.append(reinterpret_cast<const char*>(forged.value().data()), kMacBytes);
  EXPECT_FALSE(con.value().check(u8(answer)));
  // The right acceptor's MAC under another kind's answer magic: refused.
  ASSERT_TRUE(acc.value().check(u8(con.value().hello()), "f"));
  Result<std::string> right = acc.value().answer();
  ASSERT_TRUE(right.isOk());
  std::string wrongMagic = right.value();
  wrongMagic[0] ^= 1;
  EXPECT_FALSE(con.value().check(u8(wrongMagic)));
  EXPECT_TRUE(con.value().check(u8(right.value())));
}

}  // namespace
}  // namespace loom::auth
