// The wrong-shard signal, in one place: a pod's refusal of ids (or a dense tensor) of a
// vshard it does not own is FAILED_PRECONDITION carrying a ps.WrongShard (proto/ps.proto)
// as an absl::Status payload, which common/rpc/grpc_status.h carries across gRPC as an
// error detail. Pods make it with WrongShardError; clients decide "the map changed: refresh
// and route again" with WrongShardOf, and only so, never from the message text.
//
//   absl::Status s = WrongShardError("id 7 of table 'emb' is in vshard 3, ...", epoch, 3);
//   if (auto ws = WrongShardOf(s)) router.Refresh(ws->epoch() ...);
//
// The same for NotApplied: a retryable refusal that says the push was applied nowhere.
//
// Here rather than in common/rpc: the detail is a message of proto/ps.proto, and common/
// sits below proto/.
#pragma once

#include <cstdint>
#include <optional>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "proto/ps.pb.h"
#include "proto/status_detail.h"

namespace ps {

// FAILED_PRECONDITION with `message` (for humans; say which id, vshard and epoch) and the
// WrongShard{epoch, vshard} detail. Thread-safe (pure).
inline absl::Status WrongShardError(absl::string_view message, uint64_t epoch, uint32_t vshard) {
  WrongShard detail;
  detail.set_epoch(epoch);
  detail.set_vshard(vshard);
  return WithDetail(absl::FailedPreconditionError(message), detail);
}

// The WrongShard detail of `s`: set only for FAILED_PRECONDITION carrying a readable one.
// A FAILED_PRECONDITION without it (a superseded push key, a bad request) is not a wrong
// shard, whatever its message says. Thread-safe (pure).
inline std::optional<WrongShard> WrongShardOf(const absl::Status& s) {
  if (s.code() != absl::StatusCode::kFailedPrecondition) return std::nullopt;
  return DetailOf<WrongShard>(s);
}

// `s` (a retryable refusal of a push this pod neither applied nor is applying) with the
// NotApplied detail. Thread-safe (pure).
inline absl::Status NotAppliedError(absl::Status s) {
  return WithDetail(std::move(s), NotApplied());
}

// Whether `s` carries the NotApplied detail: the refused attempt applied nothing.
// Thread-safe (pure).
inline bool IsNotApplied(const absl::Status& s) { return DetailOf<NotApplied>(s).has_value(); }

}  // namespace ps
