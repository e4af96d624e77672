// What a push whose record was still waiting for followers comes to when its primary is
// deposed of some vshards (docs/architecture.md, "Replication"): its rows of the vshards
// the pod still leads stay applied under its key (that copy is still the one that counts:
// a retry is a duplicate there), those of the vshards it lost do not (their new primary
// may not hold them: the client retries there with the same key). Used by
// PsCore::ApplyAssignment (through Replicator::Depose) and by the push key's Finish
// (ps_core.cc). Stateless functions: thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/routing/shard_ownership.h"
#include "proto/ps.pb.h"
#include "ps/storage/push_dedup.h"

namespace ps {

// The outcome of a queued log record (ps/storage/log_record.h) whose pod now owns `own`:
// OK if `own` has every vshard of its rows and tensors, `why` if none (or the record does
// not parse, logged), else `why` naming the kept vshards (KeptVShards).
absl::Status DeposedOutcome(const std::string& record, const ShardOwnership& own,
                            const absl::Status& why);

// The kept vshards (sorted) a DeposedOutcome error names; nullopt for any other status.
std::optional<std::vector<uint32_t>> KeptVShards(const absl::Status& s);

// Ends a claim of `key` on `dedup` (PushDedup::Finish, with Begin's `part`) by the push's
// outcome `s`: applied if OK; after a DeposedOutcome error naming kept vshards, applied
// for those of them within `part` only; else released (a retry applies it).
void FinishPushKey(PushDedup& dedup, const PushKey& key, const absl::Status& s,
                   const std::vector<uint32_t>* part);

}  // namespace ps
