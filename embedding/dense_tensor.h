// A named dense tensor of any shape with a server-side optimizer: the small parameters
// (MLP weights, biases) that sit beside the embedding tables.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
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
  // rate. Returns the update count after this update (it names the update, as a table
  // row's step does). Thread-safe.
  uint64_t Push(const float* grads, float lr);

  // Replays a logged update: applied only if fewer than `step` updates are in the tensor
  // (see EmbeddingTable::Replay). Thread-safe.
  void Replay(const float* grads, float lr, uint64_t step);

  // Sets values (numel weights then slot_floats() optimizer state) and the update count.
  // INVALID_ARGUMENT if `values` has the wrong size. Thread-safe.
  absl::Status Restore(absl::Span<const float> values, uint64_t step);

  // Installs values (as Restore) and marks the tensor changed if it has had fewer than
  // `step` updates; returns whether it did (see EmbeddingTable::Install). INVALID_ARGUMENT
  // if `values` has the wrong size. Thread-safe.
  absl::StatusOr<bool> Install(absl::Span<const float> values, uint64_t step);

  // If the tensor changed since the previous call (or `always`), copies weights and
  // optimizer state into *values and the count into *step and returns true. Only a call
  // without `always` clears the changed mark. Thread-safe.
  bool Snapshot(bool always, std::vector<float>* values, uint64_t* step);

  // Optimizer state floats after the weights.
  size_t slot_floats() const { return numel_ * optimizer_.slots(); }

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
  bool dirty_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace ps
