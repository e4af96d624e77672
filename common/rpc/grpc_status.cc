#include "common/rpc/grpc_status.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace ps {

grpc::Status ToGrpcStatus(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

absl::Status FromGrpcStatus(const grpc::Status& s, absl::string_view where) {
  if (s.ok()) return absl::OkStatus();
  const auto code = static_cast<absl::StatusCode>(s.error_code());
  if (where.empty()) return absl::Status(code, s.error_message());
  return absl::Status(code, absl::StrCat(where, ": ", s.error_message()));
}

}  // namespace ps
