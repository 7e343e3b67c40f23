// CPU masks as peer information carries them, and the ranks a core counted over the union of
// every rank's mask.
#include "util/cpus.h"

#include <gtest/gtest.h>

#include <initializer_list>
#include <string>
#include <vector>

namespace loom {
namespace {

cpu_set_t maskOf(std::initializer_list<int> cpuIds) {
  cpu_set_t m;
  CPU_ZERO(&m);
  for (int c : cpuIds) CPU_SET(c, &m);
  return m;
}

TEST(Cpus, MaskFormatsAsHexMostSignificantFirst) {
  EXPECT_EQ(cpus::formatMask(maskOf({})), "0");
  EXPECT_EQ(cpus::formatMask(maskOf({0, 1})), "3");
  EXPECT_EQ(cpus::formatMask(maskOf({4})), "10");
  EXPECT_EQ(cpus::formatMask(maskOf({0, 9, 63})), "8000000000000201");
  EXPECT_EQ(cpus::formatMask(maskOf({CPU_SETSIZE - 1})),
            "8" + std::string(CPU_SETSIZE / 4 - 1, '0'));
}

TEST(Cpus, MaskParsesWhatItFormats) {
  for (const cpu_set_t& m :
       {maskOf({}), maskOf({0}), maskOf({2, 3, 17}), maskOf({5, 100, 1000}), cpus::allowed()}) {
    cpu_set_t back;
    ASSERT_TRUE(cpus::parseMask(cpus::formatMask(m), &back));
    EXPECT_TRUE(CPU_EQUAL(&m, &back)) << cpus::formatMask(m);
  }
  cpu_set_t m;
  ASSERT_TRUE(cpus::parseMask("00F0", &m));  // leading zeros and capitals too
  const cpu_set_t want = maskOf({4, 5, 6, 7});
  EXPECT_TRUE(CPU_EQUAL(&m, &want));
}

TEST(Cpus, MaskRejectsWhatIsNotOne) {
  cpu_set_t m;
  EXPECT_FALSE(cpus::parseMask("", &m));
  EXPECT_FALSE(cpus::parseMask("3g", &m));
  EXPECT_FALSE(cpus::parseMask("-1", &m));
  EXPECT_FALSE(cpus::parseMask("0x3", &m));
  // One digit more than CPU_SETSIZE holds, with a bit set in it.
  EXPECT_FALSE(cpus::parseMask("1" + std::string(CPU_SETSIZE / 4, '0'), &m));
  EXPECT_TRUE(cpus::parseMask("0" + std::string(CPU_SETSIZE / 4, '0'), &m));
}

TEST(Cpus, RanksACoreCountTheUnionOfTheMasks) {
  const cpu_set_t both = maskOf({0, 1}), zero = maskOf({0}), one = maskOf({1});
  // Unbound: 2 ranks on 2 CPUs have a core each, 4 share them 2 a core, 5 take 3 (rounded up).
  EXPECT_EQ(cpus::ranksPerCore({both, both}), 1);
  EXPECT_EQ(cpus::ranksPerCore({both, both, both, both}), 2);
  EXPECT_EQ(cpus::ranksPerCore({both, both, both, both, both}), 3);
  // Bound a CPU each: a core each, though each mask alone holds one CPU.
  EXPECT_EQ(cpus::ranksPerCore({zero, one}), 1);
  // Bound to the same CPU: all on one core.
  EXPECT_EQ(cpus::ranksPerCore({zero, zero, zero}), 3);
  // Two a CPU.
  EXPECT_EQ(cpus::ranksPerCore({zero, zero, one, one}), 2);
  EXPECT_EQ(cpus::ranksPerCore({zero}), 1);
  // A mask with no CPU counts as one core rather than dividing by zero.
  EXPECT_EQ(cpus::ranksPerCore({maskOf({}), maskOf({})}), 2);
}

}  // namespace
}  // namespace loom
