#include "master/rereplicate_plan.h"

#include <algorithm>
#include <map>
#include <string>
#include <vector>

namespace ps {

MovePlan PlanFills(const ClusterView& view, uint32_t per_move) {
  MovePlan plan;
  const uint32_t wanted = view.replication - 1;  // followers per vshard
  if (view.replication < 2 || view.followers.size() != view.owner.size()) return plan;
  per_move = std::max(1u, per_move);
  // Copies each pod holds, as the plan grows: new followers go where there are fewest.
  std::map<std::string, uint32_t> load;
  for (const std::string& id : view.known) load[id] = view.CopiesHeldBy(id);
  auto live_followers = [&](uint32_t v) {
    std::vector<std::string> out;
    for (const std::string& f : view.followers[v]) {
      if (view.Live(f) && f != view.owner[v]) out.push_back(f);
    }
    return out;
  };
  for (const std::string& primary : view.known) {
    if (!view.Live(primary)) continue;
    std::vector<uint32_t> led;
    for (uint32_t v = 0; v < view.owner.size(); ++v) {
      if (view.owner[v] == primary) led.push_back(v);
    }
    if (led.empty()) continue;
    // The pods already following some of its vshards, most first (then in natural order).
    std::map<std::string, uint32_t> following;
    for (uint32_t v : led) {
      for (const std::string& f : live_followers(v)) ++following[f];
    }
    std::vector<std::string> chosen;
    for (const std::string& id : view.known) {
      if (following.count(id) > 0) chosen.push_back(id);
    }
    std::stable_sort(chosen.begin(), chosen.end(), [&](const std::string& a, const std::string& b) {
      return following[a] > following[b];
    });
    if (chosen.size() > wanted) chosen.resize(wanted);
    while (chosen.size() < wanted) {
      const std::string* best = nullptr;
      for (const std::string& id : view.known) {
        if (id == primary || !view.Target(id) ||
            std::find(chosen.begin(), chosen.end(), id) != chosen.end()) {
          continue;
        }
        if (best == nullptr || load[id] < load[*best]) best = &id;
      }
      if (best == nullptr) break;  // fewer than R live pods: the copies wait for one
      chosen.push_back(*best);
    }
    // Each vshard short of copies gets them on the chosen pods it is not on yet.
    std::map<std::string, std::vector<uint32_t>> to;  // follower -> vshards
    for (uint32_t v : led) {
      const std::vector<std::string> has = live_followers(v);
      uint32_t need = has.size() < wanted ? wanted - static_cast<uint32_t>(has.size()) : 0;
      for (const std::string& f : chosen) {
        if (need == 0) break;
        if (std::find(has.begin(), has.end(), f) != has.end()) continue;
        to[f].push_back(v);
        --need;
      }
    }
    for (const std::string& f : chosen) {
      const std::vector<uint32_t>& vshards = to[f];
      for (size_t i = 0; i < vshards.size(); i += per_move) {
        PlannedMove& move = plan.moves.emplace_back();
        move.source = primary;
        move.destination = f;
        move.vshards.assign(vshards.begin() + i,
                            vshards.begin() + std::min(vshards.size(), i + per_move));
        plan.vshards += move.vshards.size();
      }
      load[f] += vshards.size();
    }
  }
  return plan;
}

std::map<uint32_t, std::vector<std::string>> PlanTrims(const ClusterView& view) {
  std::map<uint32_t, std::vector<std::string>> out;
  if (view.replication < 2 || view.followers.size() != view.owner.size()) return out;
  const size_t wanted = view.replication - 1;  // followers per vshard
  for (uint32_t v = 0; v < view.owner.size(); ++v) {
    const std::vector<std::string>& set = view.followers[v];
    if (set.size() <= wanted || !view.Live(view.owner[v])) continue;
    size_t surplus = set.size() - wanted;
    std::vector<std::string>& drop = out[v];
    for (bool live : {false, true}) {  // the pods not live first, then the live ones
      for (auto f = set.rbegin(); f != set.rend() && surplus > 0; ++f) {
        if (view.Live(*f) == live) {
          drop.push_back(*f);
          --surplus;
        }
      }
    }
  }
  return out;
}

}  // namespace ps
