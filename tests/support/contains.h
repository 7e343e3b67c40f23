// EXPECT_TRUE(Contains(text, part)): on failure gtest prints the part looked for and the whole
// text, which an EXPECT_NE(text.find(part), npos) would not.
#pragma once

#include <gtest/gtest.h>

#include <string>

namespace loomtest {

inline ::testing::AssertionResult Contains(const std::string& text, const std::string& part) {
  if (text.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "\"" << part << "\" not in: " << text;
}

}  // namespace loomtest
