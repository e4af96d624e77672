// One PS pod as the client sees it: its identity, its address and the channels to it.
#pragma once

#include <grpcpp/generic/generic_stub.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "client/ps_client.h"
#include "proto/ps.grpc.pb.h"

namespace ps::internal {

// A pod's stubs: ClientOptions::channels_per_server channels, each with its own
// connection, used in turn. Constant after MakePod except the rotation counter;
// thread-safe. Shared (shared_ptr) by every routing snapshot that names the pod at this
// address and by the RPCs sent to it.
struct Pod {
  std::string id;  // the master's pod id, or "pod i" in a static map
  std::string address;
  std::vector<std::unique_ptr<ParameterServer::Stub>> stubs;
  std::vector<std::unique_ptr<grpc::GenericStub>> raw_stubs;  // on the same channels
  std::atomic<uint32_t> next{0};

  // The channel for the next call (round-robin).
  uint32_t NextChannel() {
    return next.fetch_add(1, std::memory_order_relaxed) % static_cast<uint32_t>(stubs.size());
  }
};

// A pod with its channels, made with `options` (security, message sizes, reconnect
// backoff). An empty address (a pod that never registered) makes a pod with no channels:
// it owns nothing and gets no calls.
std::shared_ptr<Pod> MakePod(const ClientOptions& options, const std::string& id,
                             const std::string& address);

// The channel maker of `options.security`. Connect read its files once already; a
// failure here (a file removed since) gives channels whose calls fail with UNAVAILABLE
// naming the file, never plain text (ChannelMaker::CreateOrFailClosed).
ChannelMaker Channels(const ClientOptions& options);

}  // namespace ps::internal
