// Server-side optimizers, applied to one row (or one dense tensor) at a time with the
// optimizer state stored beside the weights. The formulas are in proto/ps.proto; the
// defaults and accepted ranges in embedding/spec.h; the loops, and how every stored value
// saturates at ±kMaxValue, in embedding/optimizer_kernels.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/base/attributes.h"
#include "proto/ps.pb.h"

namespace ps {

// A table's or tensor's gradient clipping (TableSpec / DenseSpec clip_value and
// clip_norm, 0 = off): each element to [-value, value], then the row to L2 norm <= norm.
struct GradientClip {
  float value = 0;
  float norm = 0;
};

class Optimizer {
 public:
  // `spec` must be normalized (embedding/spec.h). Thread-compatible; immutable.
  explicit Optimizer(const OptimizerSpec& spec, GradientClip clip = {});
  // The optimizer a table or dense tensor runs: its spec's optimizer and clipping. Every
  // path that updates a table's rows (pushes, log replay, lazy replay) builds it here.
  static Optimizer For(const TableSpec& spec);
  static Optimizer For(const DenseSpec& spec);

  // Element-wise state slots kept per weight: a row of n weights has slots() * n slot
  // floats, slot k at [k*n, (k+1)*n).
  int slots() const { return slots_; }

  // Writes the initial optimizer state for n weights (never the weight initializer).
  void InitSlots(float* slots, size_t n) const;

  // Applies gradient g[0..n) (clipped first, if this optimizer clips) to weights w[0..n)
  // and their state. `step` counts the updates this row has had (Adam's t); it is
  // incremented. `lr` > 0 overrides the spec's rate. Every value written is finite (see
  // optimizer_kernels.h). Allocates nothing.
  void Apply(float lr, float* w, float* slots, uint64_t* step, const float* g, size_t n) const;

  // Whether n weights and their slots are a state this optimizer's updates can leave: every
  // value finite and within ±kMaxValue, and accumulators (Adagrad's, Adam's second moment,
  // FTRL's n) not negative. If not, and `why` is given, it names the first bad value. What
  // an import accepts and an export writes.
  bool ValidState(const float* w, const float* slots, size_t n, std::string* why = nullptr) const;

  float learning_rate() const { return spec_.learning_rate(); }

 private:
  // The update of weights w[0..n) with slots s0, s1 (each n floats, as slots() says) for
  // gradient g (already clipped) at the row's step t (after incrementing).
  void Update(float lr, uint64_t t, float* w, float* s0, float* s1, const float* g, size_t n) const;
  // Apply's path for an optimizer that clips: the gradient clipped in chunks, then Update.
  ABSL_ATTRIBUTE_NOINLINE void ApplyClipped(float lr, uint64_t t, float* w, float* slots,
                                            const float* g, size_t n) const;

  OptimizerSpec spec_;
  int slots_;
  GradientClip clip_;
  bool clips_;
};

}  // namespace ps
