// A named dense tensor of any shape with a server-side optimizer: the small parameters
// (MLP weights, biases) that sit beside the embedding tables.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "embedding/initializer.h"
#include "embedding/optimizer.h"
#include "proto/ps.pb.h"

namespace ps {

class DenseTensor {
 public:
  // Returns INVALID_ARGUMENT for a spec that does not normalize (embedding/spec.h). The
  // tensor starts at its initializer's value for (name, id 0).
  static absl::StatusOr<std::unique_ptr<DenseTensor>> Create(const DenseSpec& spec);

  const DenseSpec& spec() const { return spec_; }
  size_t numel() const { return numel_; }

  // Copies the whole tensor into out[0..numel). Thread-safe.
  void Pull(float* out) const;

  // Applies grads[0..numel) (finite; checked by the caller). lr > 0 overrides the spec's
  // rate. Thread-safe.
  void Push(const float* grads, float lr);

  // Updates applied so far. Thread-safe.
  uint64_t step() const;

 private:
  struct Key {
    explicit Key() = default;
  };

 public:
  // Use Create; the key keeps construction (from a normalized spec) inside the class.
  DenseTensor(Key, DenseSpec spec);

 private:
  // Constant after construction.
  const DenseSpec spec_;
  const size_t numel_;
  const Optimizer optimizer_;

  mutable absl::Mutex mu_;
  std::vector<float> values_ ABSL_GUARDED_BY(mu_);  // weights then optimizer slots
  uint64_t step_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace ps
