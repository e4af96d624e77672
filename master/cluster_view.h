// ClusterView: a copy of the vshard map and the pods at one moment (Membership::View), the
// input of the move planner (move_plan.h) and of cluster checkpoints. A plain value: safe to
// read from any thread; it does not follow later changes.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace ps {

struct ClusterView {
  struct Pod {
    std::string address;
    bool live = false;     // its lease had not run out
    bool drained = false;  // recorded by a drain
  };

  uint64_t epoch = 0;
  std::vector<std::string> owner;  // owner[v]: the id of the pod owning vshard v
  // With replication (R >= 2): followers[v], the ack set of vshard v; empty at R = 1.
  std::vector<std::vector<std::string>> followers;
  uint32_t replication = 1;
  // Pods named by the map or registered, in natural order (ps-2 before ps-10).
  std::vector<std::string> known;
  std::map<std::string, Pod> registered;  // by pod id

  bool Known(const std::string& id) const {
    return std::find(known.begin(), known.end(), id) != known.end();
  }
  bool Live(const std::string& id) const {
    auto it = registered.find(id);
    return it != registered.end() && it->second.live;
  }
  // Live, registered and not drained: a pod a drain or rebalance may give vshards to.
  bool Target(const std::string& id) const {
    auto it = registered.find(id);
    return it != registered.end() && it->second.live && !it->second.drained;
  }
  // Vshards `id` owns or follows: the copies it holds.
  uint32_t CopiesHeldBy(const std::string& id) const {
    uint32_t n = OwnedBy(id);
    for (const auto& set : followers) n += std::count(set.begin(), set.end(), id);
    return n;
  }
  uint32_t OwnedBy(const std::string& id) const {
    return static_cast<uint32_t>(std::count(owner.begin(), owner.end(), id));
  }
};

}  // namespace ps
