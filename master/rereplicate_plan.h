// Planning re-replication: which vshards need another copy, and on which pod, and which
// ack sets hold more than R - 1 followers. Pure functions of a ClusterView; the Rereplicator
// (rereplicator.h) runs the plan as follower copies (MoveRunner::FillFollower).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

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

// Vshard -> the followers to take out of its ack set, for every vshard of a live primary
// whose ack set names more than R - 1 pods: a copy was filled for a ring follower that had
// not registered yet, which then did (tests/replica_placement_test.cc). A surplus copy
// costs its primary a stream, and a vshard on every pod blocks drains. Any member of an
// ack set holds every acknowledged record, so dropping any of them loses nothing; the plan
// drops first those not live (a pod that never registered or was lost: pushes wait for it
// until its lag passes the bound), then the latest in the ack set (the longest-standing
// followers stay), down to R - 1. Vshards of a primary not live are left out (a failover
// decides). Empty at R = 1.
std::map<uint32_t, std::vector<std::string>> PlanTrims(const ClusterView& view);

}  // namespace ps
