#include "common/status.h"

#include <gtest/gtest.h>

namespace oml {
namespace {

Result<int> Half(int x) {
  if (x % 2) return InvalidArgument("odd: " + std::to_string(x));
  return x / 2;
}

Status Quarter(int x, int* out) {
  OML_ASSIGN_OR_RETURN(int h, Half(x));
  OML_ASSIGN_OR_RETURN(*out, Half(h));
  return Status::Ok();
}

TEST(StatusTest, PropagatesFirstError) {
  int out = 0;
  EXPECT_TRUE(Quarter(8, &out).ok());
  EXPECT_EQ(out, 2);
  Status s = Quarter(6, &out);
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_EQ(s.message(), "odd: 3");
  EXPECT_EQ(s.ToString(), "invalid-argument: odd: 3");
}

TEST(StatusTest, TypeIsCarried) {
  Status s = Unavailable("head behind", "chain-fork");
  EXPECT_EQ(s.type(), "chain-fork");
  EXPECT_EQ(s.ToString(), "unavailable(chain-fork): head behind");
}

}  // namespace
}  // namespace oml
