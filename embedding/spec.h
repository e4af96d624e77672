// Validation and normalization of table, dense tensor, initializer and optimizer specs.
//
// Normalize* returns a copy of the spec with every optional hyperparameter set to its
// value (the default where the caller left it unset), or INVALID_ARGUMENT naming the bad
// field and value. Two specs describe the same table exactly when their normalized forms
// are equal (SpecsEqual).
//
// Defaults (written once, here and in spec.cc):
//   SGD       learning_rate 0.01
//   MOMENTUM  learning_rate 0.01, momentum 0.9, nesterov false
//   ADAGRAD   learning_rate 0.01, initial_accumulator 0.1, epsilon 1e-10
//   ADAM      learning_rate 0.001, beta1 0.9, beta2 0.999, epsilon 1e-8
//   FTRL      learning_rate (alpha) 0.05, ftrl_beta 1, ftrl_l1 0, ftrl_l2 0,
//             initial_accumulator (n) 0
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "proto/ps.pb.h"

namespace ps {

inline constexpr uint32_t kMaxDim = 4096;
inline constexpr int64_t kMaxDenseElements = int64_t{1} << 28;

absl::StatusOr<InitializerSpec> NormalizeInitializer(const InitializerSpec& spec);
absl::StatusOr<OptimizerSpec> NormalizeOptimizer(const OptimizerSpec& spec);
absl::StatusOr<TableSpec> NormalizeTableSpec(const TableSpec& spec);
absl::StatusOr<DenseSpec> NormalizeDenseSpec(const DenseSpec& spec);

// INVALID_ARGUMENT unless `name` is 1..128 characters of [A-Za-z0-9_.:/-].
absl::Status ValidateName(absl::string_view name);

// Number of element-wise optimizer slots kept beside each weight (0, 1 or 2).
int SlotsPerElement(OptimizerSpec::Kind kind);

// True when two (normalized) messages are field-by-field equal.
bool SpecsEqual(const google::protobuf::Message& a, const google::protobuf::Message& b);

}  // namespace ps
