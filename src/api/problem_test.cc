// Status -> HTTP status and problem type: one mapping, one place.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "api/server.h"

namespace oml::api {
namespace {

TEST(ProblemTest, EveryCodeHasItsStatus) {
  EXPECT_EQ(HttpStatus(InvalidArgument("x")), 400);
  EXPECT_EQ(HttpStatus(Unauthenticated("x")), 401);
  EXPECT_EQ(HttpStatus(PermissionDenied("x")), 403);
  EXPECT_EQ(HttpStatus(NotFound("x")), 404);
  EXPECT_EQ(HttpStatus(Status(Code::kGone, "x")), 410);
  EXPECT_EQ(HttpStatus(Status(Code::kPayloadTooLarge, "x")), 413);
  EXPECT_EQ(HttpStatus(FailedPrecondition("x")), 409);
  EXPECT_EQ(HttpStatus(Status(Code::kAborted, "x")), 503);
  EXPECT_EQ(HttpStatus(Unavailable("x", "chain-fork")), 503);
  EXPECT_EQ(HttpStatus(DataLoss("x", "integrity")), 500);
  EXPECT_EQ(HttpStatus(Internal("x")), 500);
}

TEST(ProblemTest, TypeIsTheSpecificSlugOrTheCodeDefault) {
  EXPECT_EQ(ProblemSlug(Unavailable("x", "chain-fork")), "chain-fork");
  EXPECT_EQ(ProblemSlug(Unavailable("x")), "unavailable");
  EXPECT_EQ(ProblemSlug(DataLoss("x")), "integrity");
  auto j = nlohmann::json::parse(ProblemJson(Status(Code::kGone, "erased at seq 7", "erased"), "/v1/claims/a"));
  EXPECT_EQ(j["type"], "urn:oml:problem:erased");
  EXPECT_EQ(j["status"], 410);
  EXPECT_EQ(j["detail"], "erased at seq 7");
  EXPECT_EQ(j["instance"], "/v1/claims/a");
}

}  // namespace
}  // namespace oml::api
