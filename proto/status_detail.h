// Structured details on an absl::Status, in one place: a protobuf message attached as a
// payload under its google.protobuf.Any type URL ("type.googleapis.com/<full name>").
// common/rpc/grpc_status.h carries every payload across gRPC as a google.rpc.Status detail,
// both ways, so a detail set on one side of an RPC is read on the other. A caller decides
// what a refusal means from its code and detail, never from the message text, which is for
// humans.
//
//   absl::Status s = WithDetail(absl::FailedPreconditionError("..."), detail);
//   if (auto d = DetailOf<WrongShard>(s)) ...
//
// Thread-safe (pure functions).
#pragma once

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"

namespace ps {

// The type URL of message type M, as google.protobuf.Any names it.
template <class M>
std::string DetailTypeUrl() {
  return absl::StrCat("type.googleapis.com/", M::descriptor()->full_name());
}

// `s` with `detail` attached (replacing a detail of the same type). `s` must not be OK
// (absl drops payloads of an OK status).
template <class M>
absl::Status WithDetail(absl::Status s, const M& detail) {
  s.SetPayload(DetailTypeUrl<M>(), absl::Cord(detail.SerializeAsString()));
  return s;
}

// The detail of type M that `s` carries, if any and readable.
template <class M>
std::optional<M> DetailOf(const absl::Status& s) {
  auto payload = s.GetPayload(DetailTypeUrl<M>());  // absl::optional<absl::Cord>
  if (!payload.has_value()) return std::nullopt;
  M detail;
  if (!detail.ParseFromString(std::string(*payload))) return std::nullopt;
  return detail;
}

}  // namespace ps
