#include "master/move_plan.h"

#include <algorithm>
#include <map>
#include <set>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"

namespace ps {
namespace {

// Groups (source, destination, vshard) triples into moves of at most `per_move` vshards.
MovePlan Batch(const std::vector<std::tuple<std::string, std::string, uint32_t>>& single,
               uint32_t per_move) {
  std::map<std::pair<std::string, std::string>, std::vector<uint32_t>> by_pair;
  for (const auto& [s, d, v] : single) by_pair[{s, d}].push_back(v);
  MovePlan plan;
  plan.vshards = static_cast<uint32_t>(single.size());
  for (auto& [pair, vs] : by_pair) {
    for (size_t i = 0; i < vs.size(); i += per_move) {
      plan.moves.push_back(PlannedMove{
          pair.first, pair.second,
          std::vector<uint32_t>(vs.begin() + i, vs.begin() + std::min(vs.size(), i + per_move))});
    }
  }
  return plan;
}

}  // namespace

absl::StatusOr<MovePlan> PlanDrain(const ClusterView& view, const std::string& pod_id,
                                   uint32_t per_move) {
  const uint32_t owned = view.OwnedBy(pod_id);
  if (owned == 0) return MovePlan();     // nothing to move: drained
  std::map<std::string, uint32_t> load;  // targets: live, not drained
  for (const std::string& id : view.known) {
    if (id != pod_id && view.Target(id)) load[id] = view.OwnedBy(id);
  }
  if (load.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot drain ", pod_id, ": no other live pod to take its ", owned, " vshards"));
  }
  if (!view.Live(pod_id)) {
    return absl::UnavailableError(
        absl::StrCat("cannot drain ", pod_id,
                     ": it is not live, and its rows are only on its volume; restart it first"));
  }
  std::vector<std::tuple<std::string, std::string, uint32_t>> single;
  for (uint32_t v = 0; v < view.owner.size(); ++v) {
    if (view.owner[v] != pod_id) continue;
    auto least = std::min_element(load.begin(), load.end(),
                                  [](const auto& a, const auto& b) { return a.second < b.second; });
    single.emplace_back(pod_id, least->first, v);
    ++least->second;
  }
  return Batch(single, per_move);
}

absl::StatusOr<MovePlan> PlanRebalance(const ClusterView& view, uint32_t per_move) {
  std::vector<std::string> targets;  // live and not drained, in natural order
  for (const std::string& id : view.known) {
    if (view.Target(id)) targets.push_back(id);
  }
  if (targets.empty()) return absl::FailedPreconditionError("no live pod to balance over");
  const std::set<std::string> is_target(targets.begin(), targets.end());
  std::map<std::string, std::vector<uint32_t>> owned;
  uint32_t movable = 0;
  for (uint32_t v = 0; v < view.owner.size(); ++v) {
    const std::string& o = view.owner[v];
    // A pod that is not live keeps its vshards: only its volume has their rows.
    if (is_target.count(o) || view.Live(o)) {
      owned[o].push_back(v);
      ++movable;
    }
  }
  // Targets with the most vshards get the larger shares, so the fewest vshards move.
  std::vector<std::string> order = targets;
  std::stable_sort(order.begin(), order.end(), [&](const std::string& a, const std::string& b) {
    return owned[a].size() > owned[b].size();
  });
  const uint32_t n = static_cast<uint32_t>(order.size());
  std::map<std::string, uint32_t> desired;
  for (uint32_t i = 0; i < n; ++i) desired[order[i]] = movable / n + (i < movable % n ? 1 : 0);
  std::vector<std::pair<std::string, uint32_t>> surplus;  // (source, vshard)
  for (auto& [pod, vs] : owned) {
    const uint32_t keep = desired.count(pod) ? desired[pod] : 0;
    for (size_t k = keep; k < vs.size(); ++k) surplus.emplace_back(pod, vs[k]);
  }
  std::vector<std::tuple<std::string, std::string, uint32_t>> single;
  size_t next = 0;
  for (const std::string& t : targets) {
    for (uint32_t have = owned[t].size(); have < desired[t] && next < surplus.size(); ++have) {
      single.emplace_back(surplus[next].first, t, surplus[next].second);
      ++next;
    }
  }
  return Batch(single, per_move);
}

}  // namespace ps
