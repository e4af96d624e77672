// PsClient::Connect, and the checks a client makes of the pods before its first call.
#include <chrono>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/ps_client.h"
#include "client/ps_client_impl.h"
#include "common/base/status_macros.h"
#include "common/rpc/grpc_status.h"

namespace ps {
namespace internal {

absl::Status PsClientImpl::Init() {
  auto r = router_.current();
  std::vector<std::unique_ptr<Rpc<DescribeRequest, DescribeResponse>>> rpcs;
  for (size_t p = 0; p < r->pods.size(); ++p) {
    if (!r->up[p]) continue;
    rpcs.push_back(MakeRpc<DescribeRequest, DescribeResponse>(r->pods[p], r->map.epoch()));
  }
  RETURN_IF_ERROR(runner_.RunAll(&ParameterServer::Stub::PrepareAsyncDescribe, &rpcs));
  for (size_t i = 0; i < rpcs.size(); ++i) {
    const DescribeResponse& d = rpcs[i]->resp;
    const std::string& where = rpcs[i]->pod->address;
    if (d.num_vshards() != r->map.num_vshards()) {
      return absl::FailedPreconditionError(
          absl::StrCat("pod ", i, " (", where, ") has ", d.num_vshards(),
                       " vshards; the client is configured with ", r->map.num_vshards()));
    }
    if (!router_.follows_master()) {
      for (uint32_t v = 0; v < r->map.num_vshards(); ++v) {
        const bool owns = (static_cast<uint8_t>(d.owned_vshards()[v >> 3]) >> (v & 7)) & 1;
        if (owns != (r->map.PodOfVShard(v) == i)) {
          return absl::FailedPreconditionError(
              absl::StrCat("pod ", i, " (", where, ") ", owns ? "owns" : "does not own", " vshard ",
                           v, ", unlike the shard map (epoch ", r->map.epoch(), ") of ",
                           r->pods.size(), " pods. Static map: start pod i with --shard=i/",
                           r->pods.size(), " and list the servers in that order"));
        }
      }
    }
    catalog_.Add(d);
  }
  return absl::OkStatus();
}

namespace {

absl::Status CheckOptions(const ClientOptions& options) {
  if (options.servers.empty() && options.master.empty()) {
    return absl::InvalidArgumentError("no PS servers and no master given");
  }
  RETURN_IF_ERROR(ChannelMaker::Create(options.security).status());  // files readable now
  if (options.initial_backoff_ms < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("initial_backoff_ms must be >= 1 (got ", options.initial_backoff_ms, ")"));
  }
  return RetryPolicy::Validate(RetryOptionsOf(options));
}

// One try at a client from the master's current map: UNAVAILABLE while an owner is not
// live, or the errors of GetShardMap and Init.
absl::StatusOr<std::unique_ptr<PsClient>> ConnectThroughMaster(const ClientOptions& options,
                                                               Master::Stub& master) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  ShardMapResponse resp;
  grpc::Status gs = master.GetShardMap(&ctx, GetShardMapRequest(), &resp);
  if (!gs.ok()) return FromGrpcStatus(gs);
  // Every owner live, so Init's Describe reaches them.
  for (uint32_t pod : resp.owner()) {
    if (pod < static_cast<uint32_t>(resp.pods_size()) && resp.pods(pod).state() != PodInfo::LIVE) {
      return absl::UnavailableError(absl::StrCat("pod ", resp.pods(pod).pod_id(), " is ",
                                                 PodInfo::State_Name(resp.pods(pod).state())));
    }
  }
  ASSIGN_OR_RETURN(auto routing, RoutingFromMap(options, resp, nullptr));
  auto client = std::make_unique<PsClientImpl>(options, std::move(routing));
  RETURN_IF_ERROR(client->Init());
  return std::unique_ptr<PsClient>(std::move(client));
}

// The vshard count of options.servers[0], asked with a client of that pod alone (so with
// the usual retries while it starts).
absl::StatusOr<uint32_t> FirstPodVShards(const ClientOptions& options) {
  ClientOptions one = options;
  one.servers.resize(1);
  one.num_vshards = 1;
  ASSIGN_OR_RETURN(auto routing, StaticRouting(one));
  PsClientImpl probe(one, std::move(routing));
  ASSIGN_OR_RETURN(std::vector<PodDescription> described, probe.DescribeByPod());
  return described.at(0).response.num_vshards();
}

}  // namespace
}  // namespace internal

absl::StatusOr<std::unique_ptr<PsClient>> PsClient::Connect(const ClientOptions& options) {
  RETURN_IF_ERROR(internal::CheckOptions(options));
  if (options.master.empty()) {
    ClientOptions resolved = options;
    if (resolved.num_vshards == 0) {
      ASSIGN_OR_RETURN(resolved.num_vshards, internal::FirstPodVShards(options));
    }
    ASSIGN_OR_RETURN(auto routing, internal::StaticRouting(resolved));
    auto client = std::make_unique<internal::PsClientImpl>(resolved, std::move(routing));
    RETURN_IF_ERROR(client->Init());
    return std::unique_ptr<PsClient>(std::move(client));
  }
  // From the master: retry while pods start (an owner not live yet, a pod not answering).
  auto stub = Master::NewStub(internal::Channels(options).Make(options.master));
  const absl::Time deadline = absl::Now() + absl::Milliseconds(options.connect_timeout_ms);
  const RetryPolicy policy(internal::RetryOptionsOf(options));
  for (int attempts = 1;; ++attempts) {
    auto client = internal::ConnectThroughMaster(options, *stub);
    if (client.ok()) return client;
    const absl::Status& s = client.status();
    // The policy's retryable codes only: a pod's vshard count that differs from the map's
    // (FAILED_PRECONDITION) is a configuration error, said at once.
    const bool retry = RetryPolicy::IsRetryable(s.code());
    // Until connect_timeout_ms rather than max_attempts: pods may take a while to start.
    const absl::Duration backoff = policy.Backoff(attempts);
    if (!retry || absl::Now() + backoff > deadline) {
      return absl::Status(
          s.code(), absl::StrCat("connecting through master ", options.master, ": ", s.message()));
    }
    absl::SleepFor(backoff);
  }
}

}  // namespace ps
