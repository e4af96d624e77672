// The requests of one pull or push call, grouped by the pod that owns each id: the one
// place the client groups ids by pod, for PullAsync, PushAsync and the re-routing of
// both after a map change.
//
// Each table's ids are de-duplicated and every unique id is routed once (RouteHash, then
// the map). A pod's request is made on its first id and carries an entry for every table
// with ids there, its ids (and a push's gradients) written packed straight into the
// request's bytes fields, reserved for the table's even share. A pull sends a repeated id
// once and reports it so its row can be copied once the rows are in (PullDuplicates); a
// push sums a repeated id's gradients into its first row. Finish encodes each request
// with proto/wire.h (its bytes moved, not copied).
//
// Not thread-safe: a batch is built and finished on one thread. The de-duplication uses
// an index kept per thread across calls (no allocation per call), so a thread builds one
// batch's table at a time (Add is not re-entrant).
#pragma once

#include <grpcpp/support/byte_buffer.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/types/span.h"
#include "client/pull_scatter.h"
#include "common/routing/shard_map.h"
#include "proto/ps.pb.h"

namespace ps::internal {

// One pod's part of a call, ready to send.
struct PodRequest {
  uint32_t pod = 0;                      // the map's pod index
  PushKey key;                           // pushes: the key the request carries
  grpc::ByteBuffer request;              // a PullRequest or PushRequest, encoded
  std::shared_ptr<PullScatter> scatter;  // pulls: where the answer's rows go
};

// The per-pod requests of one call, made on each pod's first id.
template <typename Req>
struct PodRequests {
  explicit PodRequests(uint32_t num_pods) : index_of_pod(num_pods, -1) {}
  std::vector<Req> reqs;          // in the order of each pod's first id
  std::vector<uint32_t> pods;     // pods[r]: the pod of reqs[r]
  std::vector<int> index_of_pod;  // -1 until the pod's first id
};

class PullBatch {
 public:
  // Requests under `map` (which must outlive the batch), read-only (evaluation) or not,
  // asking for values of `value_type`.
  PullBatch(const ShardMap& map, bool read_only, ValueType value_type = FLOAT32);

  // Adds the pull of `ids` from `table`: the row of ids[k] goes to out + dest[k] rows
  // (dest empty: k), rows of dim values of the batch's value type, or float32 if `widen`
  // (see PullScatter). A repeated id is pulled once and (dest[k], dest[first]) is appended
  // to dups->rows.
  void Add(const std::string& table, uint32_t dim, void* out, absl::Span<const int64_t> ids,
           absl::Span<const uint32_t> dest, PullDuplicates* dups, bool widen = false);

  // The requests, one per pod with ids, in the order of each pod's first id, each with
  // its scatter plan. The batch is empty afterwards.
  std::vector<PodRequest> Finish();

 private:
  const ShardMap& map_;
  const bool read_only_;
  const ValueType value_type_;
  PodRequests<PullRequest> requests_;
  std::vector<std::shared_ptr<PullScatter>> scatters_;  // per request
};

class PushBatch {
 public:
  // Requests under `map` (which must outlive the batch); each pod's request carries the
  // key `key_of_part()` returns when that pod's first id is added (one key per pod part:
  // a pod that follows another pod's vshards holds that pod's records too, keys included,
  // so the parts of one call must not share a key).
  PushBatch(const ShardMap& map, std::function<PushKey()> key_of_part);

  // Adds the gradients of `ids` for `table`: grads + k * dim floats for ids[k], summed
  // over repeated ids; learning_rate > 0 overrides the table's. `grads` is copied here.
  void Add(const std::string& table, uint32_t dim, float learning_rate,
           absl::Span<const int64_t> ids, const float* grads);

  // As PullBatch::Finish, without scatter plans.
  std::vector<PodRequest> Finish();

 private:
  const ShardMap& map_;
  const std::function<PushKey()> key_of_part_;
  PodRequests<PushRequest> requests_;
};

}  // namespace ps::internal
