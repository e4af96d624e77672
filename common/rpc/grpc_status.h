// The one conversion between absl::Status (used everywhere inside) and grpc::Status (at the
// RPC edge). Both carry google.rpc.Code values, so codes map 1:1 and only the message may
// gain context.
//
// Structured details travel too: an absl::Status payload (type URL -> bytes, e.g. the
// ps.WrongShard of a pod's wrong-shard refusal, proto/wrong_shard.h) becomes one
// google.protobuf.Any detail of a google.rpc.Status in the grpc::Status's error_details
// (sent as the `grpc-status-details-bin` trailer, as gRPC's richer error model has it), and
// comes back as the same payload on the other side. A status without payloads sends no
// details, so the common case costs nothing.
#pragma once

#include <grpcpp/support/status.h>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace ps {

// absl -> gRPC: code and message unchanged; payloads as error details. Thread-safe (pure).
grpc::Status ToGrpcStatus(const absl::Status& s);

// gRPC -> absl, code unchanged, the details back as payloads (details that cannot be read
// are dropped: the code and message still say what happened). With a non-empty `where`
// (e.g. "pod ps-1 (host:port)") the message reads "<where>: <message>", so a caller several
// calls away knows who answered. Thread-safe (pure).
absl::Status FromGrpcStatus(const grpc::Status& s, absl::string_view where = {});

}  // namespace ps
