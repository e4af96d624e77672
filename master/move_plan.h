// Planning drains and rebalances: which vshards move from which pod to which, cut into
// moves of at most `per_move` vshards. Pure functions of a ClusterView; Balancer runs the
// plans.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "master/cluster_view.h"

namespace ps {

struct PlannedMove {
  std::string source, destination;
  std::vector<uint32_t> vshards;
};

struct MovePlan {
  std::vector<PlannedMove> moves;  // run in this order
  uint32_t vshards = 0;            // in all moves
  bool empty() const { return moves.empty(); }
};

// Moves every vshard of `pod_id` onto the live, not drained other pods, each to the least
// loaded one at that point. Empty when it owns nothing. FAILED_PRECONDITION when no other
// pod can take them; UNAVAILABLE when `pod_id` is not live (its rows are only on its volume).
absl::StatusOr<MovePlan> PlanDrain(const ClusterView& view, const std::string& pod_id,
                                   uint32_t per_move);

// Spreads the vshards evenly over the live, not drained pods; the pods owning the most keep
// the larger shares, so the fewest vshards move. Vshards of a pod that is not live stay
// where they are. Empty when balanced. FAILED_PRECONDITION when no pod can take vshards.
absl::StatusOr<MovePlan> PlanRebalance(const ClusterView& view, uint32_t per_move);

}  // namespace ps
