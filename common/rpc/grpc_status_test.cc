// The absl <-> gRPC status conversion: codes and messages unchanged, payloads carried as
// google.rpc.Status details both ways, and malformed details dropped without harm.
#include "common/rpc/grpc_status.h"

#include "absl/strings/cord.h"
#include "gtest/gtest.h"

namespace ps {
namespace {

TEST(GrpcStatusTest, CodeAndMessageMapOneToOne) {
  EXPECT_TRUE(ToGrpcStatus(absl::OkStatus()).ok());
  EXPECT_TRUE(FromGrpcStatus(grpc::Status::OK).ok());
  const grpc::Status g = ToGrpcStatus(absl::NotFoundError("table 'x' does not exist"));
  EXPECT_EQ(g.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(g.error_message(), "table 'x' does not exist");
  EXPECT_TRUE(g.error_details().empty());  // no payloads: no details sent
  const absl::Status a = FromGrpcStatus(g, "pod ps-1 (h:1)");
  EXPECT_EQ(a.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(a.message(), "pod ps-1 (h:1): table 'x' does not exist");
}

TEST(GrpcStatusTest, PayloadsCrossTheEdgeBothWays) {
  absl::Status s = absl::FailedPreconditionError("refused");
  s.SetPayload("type.googleapis.com/ps.WrongShard", absl::Cord(std::string("\x08\x07\x10\x03", 4)));
  s.SetPayload("type.googleapis.com/other.Detail", absl::Cord(std::string(300, '\0')));
  const grpc::Status g = ToGrpcStatus(s);
  EXPECT_EQ(g.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(g.error_message(), "refused");
  EXPECT_FALSE(g.error_details().empty());
  const absl::Status back = FromGrpcStatus(g, "where");
  EXPECT_EQ(back.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(back.message(), "where: refused");
  auto wrong_shard = back.GetPayload("type.googleapis.com/ps.WrongShard");
  ASSERT_TRUE(wrong_shard.has_value());
  EXPECT_EQ(std::string(*wrong_shard), std::string("\x08\x07\x10\x03", 4));
  auto other = back.GetPayload("type.googleapis.com/other.Detail");
  ASSERT_TRUE(other.has_value());
  EXPECT_EQ(std::string(*other), std::string(300, '\0'));
}

TEST(GrpcStatusTest, MalformedDetailsAreDropped) {
  for (const std::string& details : {std::string("\x1a\x05\x0a", 3), std::string("\xff\xff\xff"),
                                     std::string("\x1a\x00", 2), std::string(1, '\x1a')}) {
    const absl::Status s =
        FromGrpcStatus(grpc::Status(grpc::StatusCode::UNAVAILABLE, "down", details));
    EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
    EXPECT_EQ(s.message(), "down");
    bool any = false;
    s.ForEachPayload([&any](absl::string_view, const absl::Cord&) { any = true; });
    EXPECT_FALSE(any);
  }
}

}  // namespace
}  // namespace ps
