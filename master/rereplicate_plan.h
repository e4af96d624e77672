// Planning re-replication: which vshards need another copy, and on which pod. A pure
// function of a ClusterView; the Rereplicator (rereplicator.h) runs the plan as follower
// copies (MoveRunner::FillFollower).
#pragma once

#include <cstdint>

#include "master/cluster_view.h"
#include "master/move_plan.h"

namespace ps {

// For every live primary P, the copies its vshards lack: each vshard of P should have
// R - 1 live followers. P's new followers are, first, the live pods that already follow
// some of P's vshards (most first), so that P keeps one stream per follower and each
// follower follows all of P's vshards; then the live, not drained pods that hold the fewest
// copies (owned + followed), never P. Each planned move is source P -> destination, the new
// follower, with at most `per_move` vshards. Vshards whose primary is not live are left out
// (nothing to copy from until a failover or its return), and so are the copies no pod can
// take (fewer than R live pods): the plan does what it can. Empty at R = 1.
MovePlan PlanFills(const ClusterView& view, uint32_t per_move);

}  // namespace ps
