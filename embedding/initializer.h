// Deterministic row initializers. The value of element j of row `id` depends only on
// (name hash, id, spec, j): the same row gets the same initial value in any process, on
// any shard, at any time, so a row may be created lazily wherever it is first touched.
#pragma once

#include <cstddef>
#include <cstdint>

#include "proto/ps.pb.h"

namespace ps {

class Initializer {
 public:
  // `spec` must be normalized (embedding/spec.h). Thread-safe; cheap to copy.
  explicit Initializer(const InitializerSpec& spec);

  // Writes the initial value of row `id` of the table named by `name_hash` into out[0..n).
  void Fill(uint64_t name_hash, int64_t id, float* out, size_t n) const;

 private:
  InitializerSpec::Kind kind_;
  float a_;  // value | low | mean
  float b_;  // high | stddev
  uint64_t seed_;
};

}  // namespace ps
