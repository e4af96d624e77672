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
  // A follower copy (MoveRunner::FillFollower): `destination` joins the vshards' ack sets,
  // in place of `replaces` when not empty; `source`, their primary, keeps them.
  bool follower = false;
  std::string replaces;
};

struct MovePlan {
  std::vector<PlannedMove> moves;  // run in this order
  uint32_t vshards = 0;            // in all moves
  bool empty() const { return moves.empty(); }
};

// Moves every vshard of `pod_id` onto the live, not drained other pods, each to the least
// loaded one at that point. With replication (R >= 2) a vshard's new owner is never one of
// its followers, and every vshard `pod_id` follows gets a follower copy onto the least
// loaded pod holding no copy of it, replacing `pod_id` in its ack set: R copies
// throughout. Empty when it owns and follows nothing. FAILED_PRECONDITION when no other
// pod can take a vshard or a copy; UNAVAILABLE when `pod_id` is not live (its rows are only
// on its volume), or the primary of a vshard it follows is not (nothing to copy from).
absl::StatusOr<MovePlan> PlanDrain(const ClusterView& view, const std::string& pod_id,
                                   uint32_t per_move);

// Spreads the vshards evenly over the live, not drained pods; the pods owning the most keep
// the larger shares, so the fewest vshards move. Vshards of a pod that is not live stay
// where they are. With replication a vshard never moves onto one of its followers (it stays
// where it is instead). Empty when balanced. FAILED_PRECONDITION when no pod can take
// vshards.
absl::StatusOr<MovePlan> PlanRebalance(const ClusterView& view, uint32_t per_move);

}  // namespace ps
