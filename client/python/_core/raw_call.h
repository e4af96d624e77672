// One unary call to one pod exactly as given (serialized request in, serialized answer
// out): no routing, no retries, no push key. For tools and tests (PsClient.raw_call:
// resending a PushKey, asking a pod for ids it does not own).
#pragma once

#include <grpcpp/grpcpp.h>

#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/rpc/transport_security.h"

namespace ps::py {

// Thread-safe. Keeps one channel per address, made with the client's ChannelSecurity.
class RawCaller {
 public:
  explicit RawCaller(ChannelSecurity security) : security_(std::move(security)) {}

  // Calls /ps.ParameterServer/<method> on `address` with `request` within `deadline_ms`;
  // the answer's bytes, or the pod's error ("pod <address> <method>: <message>"). Blocks.
  absl::StatusOr<std::string> Call(const std::string& address, const std::string& method,
                                   const std::string& request, int deadline_ms);

 private:
  absl::StatusOr<std::shared_ptr<grpc::Channel>> ChannelTo(const std::string& address);

  const ChannelSecurity security_;
  absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<grpc::Channel>> channels_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ps::py
