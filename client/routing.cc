#include "client/routing.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"

namespace ps::internal {

absl::StatusOr<std::shared_ptr<const Routing>> StaticRouting(const ClientOptions& options) {
  ASSIGN_OR_RETURN(ShardMap map, ShardMap::Static(options.num_vshards,
                                                  static_cast<uint32_t>(options.servers.size())));
  auto routing = std::make_shared<Routing>();
  routing->map = std::move(map);
  for (size_t i = 0; i < options.servers.size(); ++i) {
    routing->pods.push_back(MakePod(options, absl::StrCat("pod ", i), options.servers[i]));
    routing->up.push_back(true);
  }
  return std::shared_ptr<const Routing>(std::move(routing));
}

absl::StatusOr<std::shared_ptr<const Routing>> RoutingFromMap(const ClientOptions& options,
                                                              const ShardMapResponse& resp,
                                                              const Routing* previous) {
  auto routing = std::make_shared<Routing>();
  std::vector<uint32_t> owner(resp.owner().begin(), resp.owner().end());
  for (const PodInfo& info : resp.pods()) {
    std::shared_ptr<Pod> pod;
    if (previous != nullptr) {
      for (const auto& p : previous->pods) {
        if (p->id == info.pod_id() && p->address == info.address()) pod = p;
      }
    }
    if (pod == nullptr) pod = MakePod(options, info.pod_id(), info.address());
    routing->pods.push_back(std::move(pod));
    routing->up.push_back(!info.address().empty() &&
                          (info.state() == PodInfo::LIVE || info.state() == PodInfo::DRAINED));
  }
  for (uint32_t pod : owner) {
    if (pod >= routing->pods.size() || routing->pods[pod]->address.empty()) {
      return absl::UnavailableError(
          absl::StrCat("the master's map names pod ", pod, ", which has no address yet"));
    }
  }
  ASSIGN_OR_RETURN(routing->map,
                   ShardMap::FromOwners(std::move(owner), static_cast<uint32_t>(resp.pods_size()),
                                        resp.epoch()));
  routing->replication = std::max<uint32_t>(1, resp.replication());
  if (resp.followers_size() > 0) {  // replication: where read-only pulls may fall back
    std::vector<std::vector<uint32_t>> followers;
    followers.reserve(resp.followers_size());
    for (const Followers& f : resp.followers())
      followers.emplace_back(f.pods().begin(), f.pods().end());
    RETURN_IF_ERROR(routing->map.SetFollowers(std::move(followers)));
  }
  return std::shared_ptr<const Routing>(std::move(routing));
}

Router::Router(const ClientOptions& options, std::shared_ptr<const Routing> initial,
               Master::Stub* master, Timer* timer, InFlight* inflight, ClientCounters* counters)
    : options_(options),
      master_(master),
      timer_(timer),
      inflight_(inflight),
      counters_(counters),
      routing_(std::move(initial)) {}

void Router::Refresh(uint64_t seen_epoch, std::function<void()> then) {
  if (master_ == nullptr || current()->map.epoch() > seen_epoch) return then();
  absl::Duration wait;
  {
    absl::MutexLock lock(&refresh_mu_);
    waiters_.push_back(std::move(then));
    if (refresh_in_flight_) return;
    refresh_in_flight_ = true;
    wait = std::max(absl::ZeroDuration(),
                    last_refresh_ + absl::Milliseconds(options_.map_refresh_ms) - absl::Now());
  }
  inflight_->Begin();
  timer_->After(wait, [this] { RefreshNow(); });
}

void Router::RefreshNow() {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
  ShardMapResponse resp;
  counters_->map_refreshes.fetch_add(1, std::memory_order_relaxed);
  if (master_->GetShardMap(&ctx, GetShardMapRequest(), &resp).ok()) {
    auto now = current();
    if (resp.epoch() >= now->map.epoch()) {
      auto next = RoutingFromMap(options_, resp, now.get());
      if (next.ok()) {
        absl::MutexLock lock(&mu_);
        routing_ = *std::move(next);
      }
    }
  }
  std::vector<std::function<void()>> waiters;
  {
    absl::MutexLock lock(&refresh_mu_);
    refresh_in_flight_ = false;
    last_refresh_ = absl::Now();
    waiters.swap(waiters_);
  }
  for (auto& w : waiters) w();
  inflight_->End();
}

bool Router::FailedOver(const Pod& pod, uint64_t seen_epoch) const {
  auto r = current();
  if (r->replication < 2 || r->map.epoch() <= seen_epoch) return false;
  for (size_t i = 0; i < r->pods.size(); ++i) {
    if (r->pods[i]->id == pod.id) return !r->up[i];
  }
  return true;  // gone from the map
}

uint64_t Router::StaleAfter(const Pod& pod, uint64_t rpc_epoch) const {
  auto r = current();
  for (const auto& p : r->pods) {
    if (p.get() == &pod) return std::max(rpc_epoch, r->map.epoch());
  }
  return rpc_epoch;
}

std::shared_ptr<Pod> Router::Resolve(const std::shared_ptr<Pod>& pod) const {
  auto r = current();
  for (const auto& p : r->pods) {
    if (p->id == pod->id) return p->address.empty() ? pod : p;
  }
  return pod;
}

}  // namespace ps::internal
