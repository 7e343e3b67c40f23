// Status and Result: success is one word; a failure keeps its code, message and place through
// copies, and prefix() adds context in front.
#include "util/status.h"

#include <gtest/gtest.h>

#include <string>

namespace loom {
namespace {

TEST(Status, SuccessIsOneWordAndEmpty) {
  static_assert(sizeof(Status) == sizeof(void*), "a success must cost one word");
  const Status s;
  EXPECT_TRUE(s.isOk());
  EXPECT_EQ(s.code(), loomSuccess);
  EXPECT_EQ(s.message(), "");
  EXPECT_STREQ(s.file(), "");
  EXPECT_EQ(s.line(), 0);
  EXPECT_TRUE(Status(loomSuccess, "").isOk());
}

TEST(Status, FailuresKeepCodeMessageAndPlaceThroughCopies) {
  const Status e = LOOM_ERROR(loomTimeout, "waited 2 s");
  EXPECT_FALSE(e.isOk());
  EXPECT_EQ(e.code(), loomTimeout);
  EXPECT_EQ(e.message(), "waited 2 s");
  EXPECT_NE(std::string(e.file()).find("status_test.cc"), std::string::npos);
  EXPECT_GT(e.line(), 0);

  Status copy = e;
  copy.prefix("allreduce #3: ");
  EXPECT_EQ(copy.message(), "allreduce #3: waited 2 s");
  EXPECT_EQ(copy.code(), loomTimeout);
  EXPECT_EQ(e.message(), "waited 2 s");  // the copy is its own

  Status assigned;
  assigned = copy;
  EXPECT_EQ(assigned.message(), copy.message());
  assigned = Status();
  EXPECT_TRUE(assigned.isOk());
  EXPECT_EQ(assigned.message(), "");

  // A code without a message (the non-blocking API's loomInProgress) is not success.
  EXPECT_FALSE(Status(loomInProgress, "").isOk());
  EXPECT_EQ(Status(loomInProgress, "").code(), loomInProgress);
}

TEST(Status, PrefixOnSuccessKeepsSuccess) {
  Status s;
  s.prefix("context");
  EXPECT_TRUE(s.isOk());
  EXPECT_EQ(s.message(), "context");
}

TEST(Status, ResultCarriesAValueOrAFailure) {
  Result<int> v = 7;
  ASSERT_TRUE(v.isOk());
  EXPECT_EQ(v.value(), 7);
  EXPECT_TRUE(v.status().isOk());
  Result<int> f = Status(loomInvalidArgument, "count: too large");
  ASSERT_FALSE(f.isOk());
  EXPECT_EQ(f.status().code(), loomInvalidArgument);
  EXPECT_EQ(f.status().message(), "count: too large");
}

}  // namespace
}  // namespace loom
