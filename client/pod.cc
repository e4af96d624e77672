#include "client/pod.h"

#include <algorithm>

namespace ps::internal {

ChannelMaker Channels(const ClientOptions& options) {
  // Fail closed: TLS files that cannot be read now fail the calls, never a plain-text channel.
  return ChannelMaker::CreateOrFailClosed(options.security);
}

std::shared_ptr<Pod> MakePod(const ClientOptions& options, const std::string& id,
                             const std::string& address) {
  auto pod = std::make_shared<Pod>();
  pod->id = id;
  pod->address = address;
  if (address.empty()) return pod;  // never registered: owns nothing, gets no calls
  const ChannelMaker channels = Channels(options);
  for (int c = 0; c < std::max(1, options.channels_per_server); ++c) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(options.max_message_bytes);
    args.SetMaxSendMessageSize(options.max_message_bytes);
    // Own connection per channel, rather than one shared subchannel.
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    // The client retries on its own (with backoff and push keys); gRPC's transparent
    // retry layer would only add per-call work (it buffers every message it sends).
    args.SetInt(GRPC_ARG_ENABLE_RETRIES, 0);
    args.SetInt("ps.channel_index", c);
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, options.initial_backoff_ms);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, options.max_backoff_ms);
    auto channel = channels.Make(address, args);
    pod->stubs.push_back(ParameterServer::NewStub(channel));
    pod->raw_stubs.push_back(std::make_unique<grpc::GenericStub>(channel));
  }
  return pod;
}

}  // namespace ps::internal
