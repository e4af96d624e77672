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
//   clip_value 0, clip_norm 0 (no clipping; proto3 zero, so older specs compare equal)
//
// Accepted ranges of a new spec (SpecRules::kNew; every value must also be finite):
//   learning_rate (and a push's own rate)  [1e-10, 1e3]
//   epsilon                                [1e-12, 1e3]
//   momentum, beta1, beta2                 [0, 0.999999]
//   ftrl_beta, ftrl_l1, ftrl_l2,
//   initial_accumulator                    [0, 1e6]
//   initializer value, low, high, mean     [-1e6, 1e6];  stddev (0, 1e6]
//   clip_value, clip_norm                  0 (off) or (0, kMaxGradient]
//   dense tensor elements                  1..2^24 (kMaxNewDenseElements)
//   admission.min_count                    0..65535 (kMaxAdmissionCount); 0 and 1 both
//                                          mean "admit at the first push" and normalize
//                                          to no admission field; an eviction with
//                                          neither ttl_seconds nor max_rows to none
//
// Why these ranges: with them an update cannot overflow. Every value a row stores (weights
// and optimizer slots) is within ±kMaxValue (the kernels saturate there, see
// optimizer_kernels.h), and a gradient element is within ±kMaxGradient (a push beyond it
// is refused, or the table clips). Then the largest intermediate of each optimizer stays
// below float's 3.4e38: SGD lr*g <= 1e15; Momentum lr*(g + mu*v) ~ 1e18; Adagrad g*g <= 1e24
// and |lr*g/(sqrt(acc)+eps)| <= lr since acc >= g*g; Adam (m/c1)/eps <= 1e15 * 1e6 / 1e-12
// times lr 1e3 = 1e36 (c1 = 1 - beta1^t >= 1e-6); FTRL (sqrt(n+g*g) - sqrt(n))/alpha * w
// <= g/alpha * w <= 1e12 / 1e-10 * 1e15 = 1e37. OptimizerTest.ExtremeValidInputsStayFinite
// runs those corners.
#pragma once

#include <cstdint>
#include <limits>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "proto/ps.pb.h"

namespace ps {

inline constexpr uint32_t kMaxDim = 4096;
// Largest admission.min_count: the admission counters (AdmissionSketch) saturate there.
inline constexpr uint32_t kMaxAdmissionCount = 65535;
// Dense tensor elements a stored spec may have, and a new one (2^24 floats with Adam's two
// slots is 192 MiB: one tensor's state fits the default 256 MiB message).
inline constexpr int64_t kMaxDenseElements = int64_t{1} << 28;
inline constexpr int64_t kMaxNewDenseElements = int64_t{1} << 24;

// Largest magnitude of a stored weight or optimizer slot: updates saturate there, and an
// import refuses a row beyond it. Far beyond any trained value.
inline constexpr float kMaxValue = 1e15f;
// Largest gradient element a push may carry to a table that does not clip.
inline constexpr float kMaxGradient = 1e12f;
inline constexpr float kMinLearningRate = 1e-10f;
inline constexpr float kMaxLearningRate = 1e3f;
inline constexpr float kMinEpsilon = 1e-12f;
inline constexpr float kMaxEpsilon = 1e3f;
inline constexpr float kMaxDecay = 0.999999f;   // momentum, beta1, beta2
inline constexpr float kMaxCoefficient = 1e6f;  // ftrl_beta, ftrl_l1, ftrl_l2, initial_accumulator
inline constexpr float kMaxInitValue = 1e6f;    // initializer value, low, high, mean, stddev

// Which rules a spec is held to.
enum class SpecRules {
  // A spec a request creates (CreateTable / CreateDense on a pod or the master): the
  // ranges above.
  kNew,
  // A spec already stored (a pod's catalog at recovery, a move's source catalog, an
  // export's snapshot): only what the engine needs to run it (names, sizes, finite values,
  // each hyperparameter's own domain), so state made under older, wider rules still loads.
  kStored,
};

absl::StatusOr<InitializerSpec> NormalizeInitializer(const InitializerSpec& spec,
                                                     SpecRules rules = SpecRules::kNew);
absl::StatusOr<OptimizerSpec> NormalizeOptimizer(const OptimizerSpec& spec,
                                                 SpecRules rules = SpecRules::kNew);
absl::StatusOr<TableSpec> NormalizeTableSpec(const TableSpec& spec,
                                             SpecRules rules = SpecRules::kNew);
absl::StatusOr<DenseSpec> NormalizeDenseSpec(const DenseSpec& spec,
                                             SpecRules rules = SpecRules::kNew);

// OK for a push's learning rate: 0 (the table's) or within [kMinLearningRate,
// kMaxLearningRate]; else INVALID_ARGUMENT naming `name` and the value.
absl::Status ValidatePushLearningRate(float lr, absl::string_view name);

// The largest gradient element magnitude a push to a table (or tensor) with this clipping
// may carry: kMaxGradient without clipping, or with clipping bounds above it (a stored
// spec); otherwise every finite value (the clipped gradient is within kMaxGradient).
float MaxPushGradient(float clip_value, float clip_norm);

// INVALID_ARGUMENT unless `name` is 1..128 characters of [A-Za-z0-9_.:/-].
absl::Status ValidateName(absl::string_view name);

// Number of element-wise optimizer slots kept beside each weight (0, 1 or 2).
int SlotsPerElement(OptimizerSpec::Kind kind);

// True when two (normalized) messages are field-by-field equal.
bool SpecsEqual(const google::protobuf::Message& a, const google::protobuf::Message& b);

}  // namespace ps
