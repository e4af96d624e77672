// The one conversion between absl::Status (used everywhere inside) and grpc::Status (at the
// RPC edge). Both carry google.rpc.Code values, so codes map 1:1 and only the message may
// gain context.
#pragma once

#include <grpcpp/support/status.h>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace ps {

// absl -> gRPC, code and message unchanged. Thread-safe (pure).
grpc::Status ToGrpcStatus(const absl::Status& s);

// gRPC -> absl, code unchanged. With a non-empty `where` (e.g. "pod ps-1 (host:port)") the
// message reads "<where>: <message>", so a caller several calls away knows who answered.
absl::Status FromGrpcStatus(const grpc::Status& s, absl::string_view where = {});

}  // namespace ps
