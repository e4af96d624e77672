// The chaos test's training data (ps-chaos, tests/chaos_main.cc, and the workers it
// runs, tests/test_worker.cc `train`): which rows each record of each epoch pushes, and
// with which gradients, as a pure function of (record, epoch), so that the workers and the
// checker compute the same thing without sharing anything but the numbers.
//
// A record of epoch e pushes `kParts` parts. Part j lands in one vshard v (chosen from
// (record, epoch, j)) and holds
//  - its witness row: an id routed to v that no other (record, epoch, part) touches, with
//    gradient 1 in every element, so that the row's value after training is minus the
//    number of times that part was applied;
//  - `kHotPerPart` hot rows of v (each vshard has `kHotPerVShard`, shared by every record
//    that lands there), with small integer gradients, so that hot rows sum many records'
//    updates.
// One vshard per part means one pod per part, in one request, applied whole or not at
// all (a pod validates a request whole, and logs it as one record): so the witness row
// tells how often the whole part was applied, and hot rows must then equal exactly the
// sum of their parts' gradients times those counts. Gradients are small integers and the
// table is SGD with learning rate 1 and zero initial rows, so every sum is exact in float
// whatever the order of the updates.
//
// Thread-safe (immutable after construction).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ps::chaos {

inline constexpr uint32_t kDim = 4;
inline constexpr uint32_t kParts = 3;
inline constexpr uint32_t kHotPerVShard = 4;
inline constexpr uint32_t kHotPerPart = 2;
inline constexpr char kTable[] = "chaos";

// One part of one record's push: rows of one vshard and their gradients
// (grads[i * kDim, (i + 1) * kDim) for ids[i]; ids[0] is the witness).
struct Part {
  uint32_t vshard = 0;
  std::vector<int64_t> ids;
  std::vector<float> grads;
};

class Workload {
 public:
  // num_vshards: the cluster's (a power of two).
  explicit Workload(uint32_t num_vshards);

  uint32_t num_vshards() const { return num_vshards_; }

  // The parts of `record` in `epoch`: kParts of them, in order j = 0..kParts-1.
  std::vector<Part> Record(uint64_t record, uint32_t epoch) const;

  // The witness row of part `part` of (record, epoch).
  int64_t Witness(uint64_t record, uint32_t epoch, uint32_t part) const;

  // Every hot row of every vshard (kHotPerVShard per vshard, in vshard order).
  const std::vector<int64_t>& hot_ids() const { return hot_ids_; }

 private:
  uint32_t VShardOfPart(uint64_t record, uint32_t epoch, uint32_t part) const;
  // The first id of [base, base + 2^20) that routes to `vshard`.
  int64_t IdIn(uint32_t vshard, int64_t base) const;

  const uint32_t num_vshards_;
  const uint64_t table_hash_;
  std::vector<int64_t> hot_ids_;  // [v * kHotPerVShard + k]
};

}  // namespace ps::chaos
