#include "master/move_plan.h"

#include <algorithm>
#include <map>
#include <set>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"

namespace ps {
namespace {

// Whether `pod` is in vshard v's ack set.
bool Follows(const ClusterView& view, uint32_t v, const std::string& pod) {
  if (v >= view.followers.size()) return false;
  const auto& set = view.followers[v];
  return std::find(set.begin(), set.end(), pod) != set.end();
}

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
  std::vector<uint32_t> followed;
  for (uint32_t v = 0; v < view.followers.size(); ++v) {
    if (Follows(view, v, pod_id)) followed.push_back(v);
  }
  if (owned == 0 && followed.empty()) return MovePlan();  // nothing to move: drained
  std::map<std::string, uint32_t> load;                   // targets: live, not drained
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
  // Copies each target holds (owned + followed), for placing the followed copies below.
  std::map<std::string, uint32_t> copies;
  for (const auto& [id, n] : load) copies[id] = view.CopiesHeldBy(id);
  std::vector<std::tuple<std::string, std::string, uint32_t>> single;
  for (uint32_t v = 0; v < view.owner.size(); ++v) {
    if (view.owner[v] != pod_id) continue;
    auto least = load.end();
    for (auto it = load.begin(); it != load.end(); ++it) {
      if (Follows(view, v, it->first)) continue;  // copies stay on distinct pods
      if (least == load.end() || it->second < least->second) least = it;
    }
    if (least == load.end()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "cannot drain ", pod_id, ": every other live pod already holds a copy of vshard ", v));
    }
    single.emplace_back(pod_id, least->first, v);
    ++least->second;
    ++copies[least->first];
  }
  MovePlan plan = Batch(single, per_move);
  // The copies it follows: each onto the pod holding the fewest copies that has none of it.
  std::map<std::pair<std::string, std::string>, std::vector<uint32_t>> by_pair;
  for (uint32_t v : followed) {
    if (!view.Live(view.owner[v])) {
      return absl::UnavailableError(absl::StrCat("cannot drain ", pod_id, ": vshard ", v,
                                                 " it follows has no live primary (", view.owner[v],
                                                 ") to copy from"));
    }
    auto least = copies.end();
    for (auto it = copies.begin(); it != copies.end(); ++it) {
      if (it->first == view.owner[v] || Follows(view, v, it->first)) continue;
      if (least == copies.end() || it->second < least->second) least = it;
    }
    if (least == copies.end()) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot drain ", pod_id, ": no other live pod can take its copy of vshard ",
                       v, " (every one already holds it)"));
    }
    by_pair[{view.owner[v], least->first}].push_back(v);
    ++least->second;
  }
  for (auto& [pair, vs] : by_pair) {
    for (size_t i = 0; i < vs.size(); i += per_move) {
      PlannedMove& m = plan.moves.emplace_back();
      m.source = pair.first;
      m.destination = pair.second;
      m.vshards.assign(vs.begin() + i, vs.begin() + std::min(vs.size(), i + per_move));
      m.follower = true;
      m.replaces = pod_id;
      plan.vshards += m.vshards.size();
    }
  }
  return plan;
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
      // A vshard never moves onto its own follower: it stays (slightly uneven beats fewer
      // copies).
      if (!Follows(view, surplus[next].second, t)) {
        single.emplace_back(surplus[next].first, t, surplus[next].second);
      }
      ++next;
    }
  }
  return Batch(single, per_move);
}

}  // namespace ps
