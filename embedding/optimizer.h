// Server-side optimizers, applied to one row (or one dense tensor) at a time with the
// optimizer state stored beside the weights. The formulas are in proto/ps.proto; the
// defaults in embedding/spec.h.
#pragma once

#include <cstddef>
#include <cstdint>

#include "proto/ps.pb.h"

namespace ps {

class Optimizer {
 public:
  // `spec` must be normalized (embedding/spec.h). Thread-compatible; immutable.
  explicit Optimizer(const OptimizerSpec& spec);

  // Element-wise state slots kept per weight: a row of n weights has slots() * n slot
  // floats, slot k at [k*n, (k+1)*n).
  int slots() const { return slots_; }

  // Writes the initial optimizer state for n weights (never the weight initializer).
  void InitSlots(float* slots, size_t n) const;

  // Applies gradient g[0..n) to weights w[0..n) and their state. `step` counts the updates
  // this row has had (Adam's t); it is incremented. `lr` > 0 overrides the spec's rate.
  void Apply(float lr, float* w, float* slots, uint64_t* step, const float* g, size_t n) const;

  float learning_rate() const { return spec_.learning_rate(); }

 private:
  OptimizerSpec spec_;
  int slots_;
};

}  // namespace ps
