// The one retry policy: which codes retry, how long it waits, when the map is refreshed,
// the final status's shape, and the blocking Run.
#include "common/rpc/retry_policy.h"

#include <vector>

#include "absl/strings/cord.h"
#include "common/rpc/grpc_status.h"
#include "gtest/gtest.h"

namespace ps {
namespace {

TEST(RetryPolicyTest, RetriesOnlyTransientCodesWhileAttemptsLast) {
  for (absl::StatusCode c : {absl::StatusCode::kUnavailable, absl::StatusCode::kAborted,
                             absl::StatusCode::kDeadlineExceeded}) {
    EXPECT_TRUE(RetryPolicy::IsRetryable(c)) << c;
  }
  for (absl::StatusCode c :
       {absl::StatusCode::kOk, absl::StatusCode::kInvalidArgument, absl::StatusCode::kNotFound,
        absl::StatusCode::kFailedPrecondition, absl::StatusCode::kAlreadyExists,
        absl::StatusCode::kUnauthenticated, absl::StatusCode::kPermissionDenied,
        absl::StatusCode::kInternal, absl::StatusCode::kResourceExhausted}) {
    EXPECT_FALSE(RetryPolicy::IsRetryable(c)) << c;
  }
  RetryOptions o;
  o.max_attempts = 3;
  RetryPolicy policy(o);
  EXPECT_TRUE(policy.ShouldRetry(absl::StatusCode::kUnavailable, 1));
  EXPECT_TRUE(policy.ShouldRetry(absl::StatusCode::kUnavailable, 2));
  EXPECT_FALSE(policy.ShouldRetry(absl::StatusCode::kUnavailable, 3));
  EXPECT_FALSE(policy.ShouldRetry(absl::StatusCode::kFailedPrecondition, 1));
}

TEST(RetryPolicyTest, BackoffDoublesWithJitterUpToTheCap) {
  RetryOptions o;
  o.initial_backoff = absl::Milliseconds(20);
  o.max_backoff = absl::Milliseconds(150);
  RetryPolicy policy(o);
  const std::vector<absl::Duration> caps = {absl::Milliseconds(20), absl::Milliseconds(40),
                                            absl::Milliseconds(80), absl::Milliseconds(150),
                                            absl::Milliseconds(150)};
  for (size_t k = 0; k < caps.size(); ++k) {
    absl::Duration lo = absl::InfiniteDuration(), hi = absl::ZeroDuration();
    for (int i = 0; i < 200; ++i) {
      const absl::Duration b = policy.Backoff(static_cast<int>(k) + 1);
      ASSERT_GE(b, caps[k] / 2) << "after " << k + 1 << " failures";
      ASSERT_LE(b, caps[k]) << "after " << k + 1 << " failures";
      lo = std::min(lo, b);
      hi = std::max(hi, b);
    }
    EXPECT_LT(lo, hi) << "jittered";  // 200 draws over a range of thousands of values
  }
  // Huge attempt counts neither overflow nor exceed the cap.
  EXPECT_LE(policy.Backoff(1000), absl::Milliseconds(150));
  EXPECT_GE(policy.Backoff(1000), absl::Milliseconds(75));
}

TEST(RetryPolicyTest, MapIsRefreshedFromTheThirdAttempt) {
  EXPECT_FALSE(RetryPolicy::RefreshMapBefore(1));
  EXPECT_FALSE(RetryPolicy::RefreshMapBefore(2));
  EXPECT_TRUE(RetryPolicy::RefreshMapBefore(3));
  EXPECT_TRUE(RetryPolicy::RefreshMapBefore(10));
}

TEST(RetryPolicyTest, ValidateNamesBadOptions) {
  EXPECT_TRUE(RetryPolicy::Validate(RetryOptions()).ok());
  RetryOptions o;
  o.max_attempts = 0;
  EXPECT_EQ(RetryPolicy::Validate(o).code(), absl::StatusCode::kInvalidArgument);
  o = RetryOptions();
  o.max_backoff = o.initial_backoff / 2;
  EXPECT_EQ(RetryPolicy::Validate(o).code(), absl::StatusCode::kInvalidArgument);
  o = RetryOptions();
  o.attempt_timeout = absl::ZeroDuration();
  EXPECT_EQ(RetryPolicy::Validate(o).code(), absl::StatusCode::kInvalidArgument);
}

TEST(RetryPolicyTest, FinalNamesThePeerAndTheAttemptsAndKeepsDetails) {
  EXPECT_EQ(
      RetryPolicy::Final(grpc::Status(grpc::StatusCode::NOT_FOUND, "no"), "pod a", 1).message(),
      "pod a: no");
  const absl::Status s =
      RetryPolicy::Final(grpc::Status(grpc::StatusCode::UNAVAILABLE, "down"), "pod a", 4);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(s.message(), "pod a: down [after 4 attempts]");
  // A detail survives the annotation (grpc_status.h carries it).
  absl::Status detailed = absl::FailedPreconditionError("moved");
  detailed.SetPayload("type.googleapis.com/x.Y", absl::Cord("v"));
  const absl::Status final = RetryPolicy::Final(ToGrpcStatus(detailed), "pod b", 2);
  EXPECT_TRUE(final.GetPayload("type.googleapis.com/x.Y").has_value());
  EXPECT_EQ(final.message(), "pod b: moved [after 2 attempts]");
}

TEST(RetryPolicyTest, RunRetriesTransientErrorsWithTheSameCall) {
  RetryOptions o;
  o.max_attempts = 4;
  o.initial_backoff = absl::Milliseconds(1);
  o.max_backoff = absl::Milliseconds(2);
  RetryPolicy policy(o);
  std::vector<grpc::StatusCode> script = {grpc::StatusCode::UNAVAILABLE, grpc::StatusCode::ABORTED,
                                          grpc::StatusCode::OK};
  size_t calls = 0;
  int attempts = 0;
  auto scripted = [&](grpc::ClientContext* ctx) {
    EXPECT_NE(ctx, nullptr);
    const grpc::StatusCode c = script[std::min(calls++, script.size() - 1)];
    return c == grpc::StatusCode::OK ? grpc::Status::OK : grpc::Status(c, "x");
  };
  EXPECT_TRUE(policy.Run(scripted, "m", &attempts).ok());
  EXPECT_EQ(attempts, 3);

  // Not retryable: one call.
  calls = 0;
  script = {grpc::StatusCode::INVALID_ARGUMENT};
  EXPECT_EQ(policy.Run(scripted, "m", &attempts).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(attempts, 1);
  EXPECT_EQ(calls, 1u);

  // Retryable every time: max_attempts calls, then the last error.
  calls = 0;
  script = {grpc::StatusCode::DEADLINE_EXCEEDED};
  const absl::Status s = policy.Run(scripted, "m", &attempts);
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(attempts, 4);
  EXPECT_EQ(calls, 4u);
  EXPECT_EQ(s.message(), "m: x [after 4 attempts]");
}

}  // namespace
}  // namespace ps
