#include "client/python/_core/raw_call.h"

#include <grpcpp/generic/generic_stub.h>

#include <chrono>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/rpc/grpc_status.h"

namespace ps::py {

absl::StatusOr<std::shared_ptr<grpc::Channel>> RawCaller::ChannelTo(const std::string& address) {
  absl::MutexLock lock(&mu_);
  auto it = channels_.find(address);
  if (it != channels_.end()) return it->second;
  // Made (and its files read) here: unreadable TLS material is an error, never plain text.
  ASSIGN_OR_RETURN(ChannelMaker maker, ChannelMaker::Create(security_));
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(256 << 20);
  args.SetMaxSendMessageSize(256 << 20);
  args.SetInt(GRPC_ARG_ENABLE_RETRIES, 0);
  auto channel = maker.Make(address, args);
  channels_[address] = channel;
  return channel;
}

absl::StatusOr<std::string> RawCaller::Call(const std::string& address, const std::string& method,
                                            const std::string& request, int deadline_ms) {
  ASSIGN_OR_RETURN(std::shared_ptr<grpc::Channel> channel, ChannelTo(address));
  grpc::GenericStub stub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(deadline_ms));
  grpc::Slice slice(request);
  grpc::ByteBuffer req(&slice, 1);
  grpc::CompletionQueue queue;
  auto reader =
      stub.PrepareUnaryCall(&ctx, absl::StrCat("/ps.ParameterServer/", method), req, &queue);
  reader->StartCall();
  grpc::ByteBuffer resp;
  grpc::Status status;
  reader->Finish(&resp, &status, nullptr);
  void* tag;
  bool ok;
  queue.Next(&tag, &ok);  // the call's only event
  queue.Shutdown();
  while (queue.Next(&tag, &ok)) {
  }
  if (!status.ok()) return FromGrpcStatus(status, absl::StrCat("pod ", address, " ", method));
  std::vector<grpc::Slice> slices;
  if (!resp.Dump(&slices).ok()) return absl::InternalError("unreadable answer");
  std::string out;
  out.reserve(resp.Length());
  for (const grpc::Slice& s : slices)
    out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

}  // namespace ps::py
