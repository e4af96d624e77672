#include "common/rpc/retry_policy.h"

#include <algorithm>
#include <cstdint>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/rpc/grpc_status.h"

namespace ps {

absl::Status RetryPolicy::Validate(const RetryOptions& o) {
  if (o.max_attempts < 1 || o.initial_backoff <= absl::ZeroDuration() ||
      o.max_backoff < o.initial_backoff || o.attempt_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "retry options need max_attempts >= 1 (got ", o.max_attempts,
        "), 0 < initial_backoff <= max_backoff (got ", absl::FormatDuration(o.initial_backoff),
        ", ", absl::FormatDuration(o.max_backoff), ") and attempt_timeout > 0 (got ",
        absl::FormatDuration(o.attempt_timeout), ")"));
  }
  return absl::OkStatus();
}

bool RetryPolicy::IsRetryable(absl::StatusCode code) {
  return code == absl::StatusCode::kUnavailable || code == absl::StatusCode::kAborted ||
         code == absl::StatusCode::kDeadlineExceeded;
}

absl::Duration RetryPolicy::Backoff(int attempts) const {
  const int64_t initial_us = absl::ToInt64Microseconds(options_.initial_backoff);
  const int64_t max_us = absl::ToInt64Microseconds(options_.max_backoff);
  const int shift = std::clamp(attempts - 1, 0, 30);
  const int64_t cap =
      std::min(max_us, initial_us > (max_us >> shift) ? max_us : initial_us << shift);
  thread_local std::mt19937_64 rng(std::random_device{}());
  return absl::Microseconds(cap / 2 +
                            static_cast<int64_t>(rng() % static_cast<uint64_t>(cap / 2 + 1)));
}

std::chrono::system_clock::time_point RetryPolicy::AttemptDeadline() const {
  return absl::ToChronoTime(absl::Now() + options_.attempt_timeout);
}

absl::Status RetryPolicy::Final(const grpc::Status& s, absl::string_view where, int attempts) {
  absl::Status status = FromGrpcStatus(s, where);
  if (status.ok() || attempts <= 1) return status;
  absl::Status annotated(status.code(),
                         absl::StrCat(status.message(), " [after ", attempts, " attempts]"));
  status.ForEachPayload([&annotated](absl::string_view url, const absl::Cord& value) {
    annotated.SetPayload(url, value);
  });
  return annotated;
}

absl::Status RetryPolicy::Run(const std::function<grpc::Status(grpc::ClientContext*)>& attempt,
                              absl::string_view where, int* attempts) const {
  grpc::Status s;
  int n = 0;
  for (;;) {
    grpc::ClientContext ctx;
    ctx.set_deadline(AttemptDeadline());
    s = attempt(&ctx);
    ++n;
    if (s.ok() || !ShouldRetry(static_cast<absl::StatusCode>(s.error_code()), n)) break;
    absl::SleepFor(Backoff(n));
  }
  if (attempts != nullptr) *attempts = n;
  return Final(s, where, n);
}

}  // namespace ps
