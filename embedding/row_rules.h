// How one row changes under each kind of update the push log records, written once for
// rows inside an EmbeddingTable (Replay, Install, row creation) and for rows held
// elsewhere: a pod's lazy replay (ps/storage/pod_storage.cc) applies the log to rows it reads back
// from disk. Both use these functions, so both produce the same bits.
//
// A row is its weights (dim floats), its optimizer slots (slots() * dim floats) and its
// step: the number of updates applied to it.
#pragma once

#include <cstdint>
#include <cstring>

#include "embedding/initializer.h"
#include "embedding/optimizer.h"

namespace ps {

// A new row of `id` in a table whose name hashes to name_hash: the initializer's value,
// the optimizer's initial slots, step 0.
inline void InitRowValues(const Initializer& initializer, const Optimizer& optimizer,
                          uint64_t name_hash, int64_t id, uint32_t dim, float* weights,
                          float* slots, uint64_t* step) {
  initializer.Fill(name_hash, id, weights, dim);
  optimizer.InitSlots(slots, dim);
  *step = 0;
}

// A logged gradient that made its row's step `step`: applied on top of the row's first
// step - 1 updates, unless the row already has `step` or more (replay is idempotent).
// Returns whether it applied.
inline bool ReplayGradient(const Optimizer& optimizer, float lr, const float* grad, uint64_t step,
                           uint32_t dim, float* weights, float* slots, uint64_t* row_step) {
  if (*row_step >= step) return false;
  uint64_t before = step - 1;
  optimizer.Apply(lr, weights, slots, &before, grad, dim);
  *row_step = before;
  return true;
}

// A whole row installed at `step` (an import, or a logged install). A row that does not
// exist yet (row_exists false) takes it whatever the step; an existing row takes it only
// if it has fewer than `step` updates. Returns whether it installed.
inline bool InstallValues(const float* new_weights, const float* new_slots, uint64_t step,
                          uint32_t dim, uint32_t slot_floats, bool row_exists, float* weights,
                          float* slots, uint64_t* row_step) {
  if (row_exists && *row_step >= step) return false;
  std::memcpy(weights, new_weights, dim * sizeof(float));
  std::memcpy(slots, new_slots, slot_floats * sizeof(float));
  *row_step = step;
  return true;
}

}  // namespace ps
