// PsClient's views of the cluster: the per-pod calls (Stats, Describe) and the routing
// snapshot, for tools, the Python SDK and tests.
#include <memory>
#include <vector>

#include "client/ps_client_impl.h"
#include "common/base/status_macros.h"

namespace ps::internal {
namespace {

PodView ViewOf(const Pod& pod, bool up) { return PodView{pod.id, pod.address, up}; }

// One call of `method` to every pod of `r` that is up, in pod order (a blocking fan-out
// with the runner's retries): each answer with its pod, or the first error.
template <typename Req, typename Resp, typename Out>
absl::StatusOr<std::vector<Out>> CallEveryPod(RpcRunner& runner, const Routing& r,
                                              AsyncMethod<Req, Resp> method) {
  std::vector<std::unique_ptr<Rpc<Req, Resp>>> rpcs;
  for (size_t p = 0; p < r.pods.size(); ++p) {
    if (r.up[p]) rpcs.push_back(MakeRpc<Req, Resp>(r.pods[p], r.map.epoch()));
  }
  RETURN_IF_ERROR(runner.RunAll(method, &rpcs));
  std::vector<Out> out;
  out.reserve(rpcs.size());
  for (auto& rpc : rpcs) out.push_back(Out{ViewOf(*rpc->pod, true), std::move(rpc->resp)});
  return out;
}

}  // namespace

absl::StatusOr<std::vector<PodStats>> PsClientImpl::StatsByPod() {
  return CallEveryPod<StatsRequest, StatsResponse, PodStats>(
      runner_, *router_.current(), &ParameterServer::Stub::PrepareAsyncStats);
}

absl::StatusOr<std::vector<StatsResponse>> PsClientImpl::Stats() {
  ASSIGN_OR_RETURN(std::vector<PodStats> by_pod, StatsByPod());
  std::vector<StatsResponse> out;
  out.reserve(by_pod.size());
  for (PodStats& s : by_pod) out.push_back(std::move(s.response));
  return out;
}

absl::StatusOr<std::vector<PodDescription>> PsClientImpl::DescribeByPod() {
  return CallEveryPod<DescribeRequest, DescribeResponse, PodDescription>(
      runner_, *router_.current(), &ParameterServer::Stub::PrepareAsyncDescribe);
}

ShardMapView PsClientImpl::shard_map() const {
  auto r = router_.current();
  ShardMapView view;
  view.epoch = r->map.epoch();
  view.owner.reserve(r->map.num_vshards());
  for (uint32_t v = 0; v < r->map.num_vshards(); ++v) view.owner.push_back(r->map.PodOfVShard(v));
  view.pods.reserve(r->pods.size());
  for (size_t p = 0; p < r->pods.size(); ++p) view.pods.push_back(ViewOf(*r->pods[p], r->up[p]));
  return view;
}

}  // namespace ps::internal
