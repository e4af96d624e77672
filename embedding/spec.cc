#include "embedding/spec.h"

#include <cmath>
#include <cstdlib>
#include <limits>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/base/status_macros.h"
#include "google/protobuf/util/message_differencer.h"

namespace ps {
namespace {

// The shortest decimal form of v that reads back as v (StrCat's 6 digits print
// 0.9999999f as "1").
std::string Num(float v) {
  for (int digits = 6; digits < 9; ++digits) {
    std::string s = absl::StrFormat("%.*g", digits, v);
    if (std::strtof(s.c_str(), nullptr) == v) return s;
  }
  return absl::StrFormat("%.9g", v);
}

absl::Status Invalid(absl::string_view what, float value, absl::string_view rule) {
  return absl::InvalidArgumentError(absl::StrCat(what, " = ", Num(value), " is invalid: ", rule));
}

bool Finite(float v) { return std::isfinite(v); }

// INVALID_ARGUMENT unless lo <= v <= hi (so also unless v is finite).
absl::Status InRange(absl::string_view what, float v, float lo, float hi) {
  if (v >= lo && v <= hi) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      what, " = ", Num(v), " is outside the accepted range [", Num(lo), ", ", Num(hi), "]"));
}

// The rules every new initializer follows beyond kStored's (see spec.h).
absl::Status CheckNewInitializer(const InitializerSpec& spec) {
  switch (spec.kind()) {
    case InitializerSpec::CONSTANT:
      return InRange("initializer.value", spec.value(), -kMaxInitValue, kMaxInitValue);
    case InitializerSpec::UNIFORM:
      RETURN_IF_ERROR(InRange("initializer.low", spec.low(), -kMaxInitValue, kMaxInitValue));
      return InRange("initializer.high", spec.high(), -kMaxInitValue, kMaxInitValue);
    case InitializerSpec::NORMAL:
    case InitializerSpec::TRUNCATED_NORMAL:
      RETURN_IF_ERROR(InRange("initializer.mean", spec.mean(), -kMaxInitValue, kMaxInitValue));
      return InRange("initializer.stddev", spec.stddev(), 0, kMaxInitValue);
    default:
      return absl::OkStatus();
  }
}

// The ranges of a new optimizer spec (normalized, so every field of its kind is set).
absl::Status CheckNewOptimizer(const OptimizerSpec& o) {
  RETURN_IF_ERROR(
      InRange("optimizer.learning_rate", o.learning_rate(), kMinLearningRate, kMaxLearningRate));
  if (o.has_momentum()) RETURN_IF_ERROR(InRange("optimizer.momentum", o.momentum(), 0, kMaxDecay));
  if (o.has_beta1()) RETURN_IF_ERROR(InRange("optimizer.beta1", o.beta1(), 0, kMaxDecay));
  if (o.has_beta2()) RETURN_IF_ERROR(InRange("optimizer.beta2", o.beta2(), 0, kMaxDecay));
  if (o.has_epsilon()) {
    RETURN_IF_ERROR(InRange("optimizer.epsilon", o.epsilon(), kMinEpsilon, kMaxEpsilon));
  }
  if (o.has_initial_accumulator()) {
    RETURN_IF_ERROR(
        InRange("optimizer.initial_accumulator", o.initial_accumulator(), 0, kMaxCoefficient));
  }
  if (o.has_ftrl_beta()) {
    RETURN_IF_ERROR(InRange("optimizer.ftrl_beta", o.ftrl_beta(), 0, kMaxCoefficient));
  }
  if (o.has_ftrl_l1())
    RETURN_IF_ERROR(InRange("optimizer.ftrl_l1", o.ftrl_l1(), 0, kMaxCoefficient));
  if (o.has_ftrl_l2())
    RETURN_IF_ERROR(InRange("optimizer.ftrl_l2", o.ftrl_l2(), 0, kMaxCoefficient));
  return absl::OkStatus();
}

// clip_value and clip_norm: 0 (off) or positive; a new spec's at most kMaxGradient.
absl::Status CheckClip(float clip_value, float clip_norm, SpecRules rules) {
  const float hi = rules == SpecRules::kNew ? kMaxGradient : std::numeric_limits<float>::max();
  if (clip_value != 0) RETURN_IF_ERROR(InRange("clip_value", clip_value, 0, hi));
  if (clip_norm != 0) RETURN_IF_ERROR(InRange("clip_norm", clip_norm, 0, hi));
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateName(absl::string_view name) {
  if (name.empty() || name.size() > 128) {
    return absl::InvalidArgumentError(
        absl::StrCat("name '", name, "' must have 1..128 characters"));
  }
  for (char c : name) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '.' || c == ':' || c == '/' || c == '-';
    if (!ok) {
      return absl::InvalidArgumentError(
          absl::StrCat("name '", name, "' has a character outside [A-Za-z0-9_.:/-]"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<InitializerSpec> NormalizeInitializer(const InitializerSpec& spec, SpecRules rules) {
  InitializerSpec out = spec;
  switch (spec.kind()) {
    case InitializerSpec::ZEROS:
      break;
    case InitializerSpec::CONSTANT:
      if (!Finite(spec.value())) return Invalid("initializer.value", spec.value(), "not finite");
      break;
    case InitializerSpec::UNIFORM:
      if (!Finite(spec.low()) || !Finite(spec.high()) || !(spec.low() < spec.high())) {
        return absl::InvalidArgumentError(
            absl::StrCat("uniform initializer needs finite low < high, got [", spec.low(), ", ",
                         spec.high(), ")"));
      }
      break;
    case InitializerSpec::NORMAL:
    case InitializerSpec::TRUNCATED_NORMAL:
      if (!Finite(spec.mean())) return Invalid("initializer.mean", spec.mean(), "not finite");
      if (!Finite(spec.stddev()) || spec.stddev() <= 0) {
        return Invalid("initializer.stddev", spec.stddev(), "must be finite and > 0");
      }
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("unknown initializer kind ", static_cast<int>(spec.kind())));
  }
  if (rules == SpecRules::kNew) RETURN_IF_ERROR(CheckNewInitializer(out));
  return out;
}

absl::StatusOr<OptimizerSpec> NormalizeOptimizer(const OptimizerSpec& spec, SpecRules rules) {
  OptimizerSpec o = spec;
  auto fill = [](bool has, float value, auto setter) {
    if (!has) setter(value);
  };
  switch (o.kind()) {
    case OptimizerSpec::SGD:
      fill(o.has_learning_rate(), 0.01f, [&](float v) { o.set_learning_rate(v); });
      break;
    case OptimizerSpec::MOMENTUM:
      fill(o.has_learning_rate(), 0.01f, [&](float v) { o.set_learning_rate(v); });
      fill(o.has_momentum(), 0.9f, [&](float v) { o.set_momentum(v); });
      if (!o.has_nesterov()) o.set_nesterov(false);
      break;
    case OptimizerSpec::ADAGRAD:
      fill(o.has_learning_rate(), 0.01f, [&](float v) { o.set_learning_rate(v); });
      fill(o.has_initial_accumulator(), 0.1f, [&](float v) { o.set_initial_accumulator(v); });
      fill(o.has_epsilon(), 1e-10f, [&](float v) { o.set_epsilon(v); });
      break;
    case OptimizerSpec::ADAM:
      fill(o.has_learning_rate(), 0.001f, [&](float v) { o.set_learning_rate(v); });
      fill(o.has_beta1(), 0.9f, [&](float v) { o.set_beta1(v); });
      fill(o.has_beta2(), 0.999f, [&](float v) { o.set_beta2(v); });
      fill(o.has_epsilon(), 1e-8f, [&](float v) { o.set_epsilon(v); });
      break;
    case OptimizerSpec::FTRL:
      fill(o.has_learning_rate(), 0.05f, [&](float v) { o.set_learning_rate(v); });
      fill(o.has_ftrl_beta(), 1.0f, [&](float v) { o.set_ftrl_beta(v); });
      fill(o.has_ftrl_l1(), 0.0f, [&](float v) { o.set_ftrl_l1(v); });
      fill(o.has_ftrl_l2(), 0.0f, [&](float v) { o.set_ftrl_l2(v); });
      fill(o.has_initial_accumulator(), 0.0f, [&](float v) { o.set_initial_accumulator(v); });
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("unknown optimizer kind ", static_cast<int>(o.kind())));
  }
  if (!Finite(o.learning_rate()) || o.learning_rate() <= 0) {
    return Invalid("optimizer.learning_rate", o.learning_rate(), "must be finite and > 0");
  }
  if (o.has_momentum() && !(o.momentum() >= 0 && o.momentum() < 1)) {
    return Invalid("optimizer.momentum", o.momentum(), "must be in [0, 1)");
  }
  if (o.has_initial_accumulator() &&
      !(Finite(o.initial_accumulator()) && o.initial_accumulator() >= 0)) {
    return Invalid("optimizer.initial_accumulator", o.initial_accumulator(),
                   "must be finite and >= 0");
  }
  if (o.has_epsilon() && !(Finite(o.epsilon()) && o.epsilon() > 0)) {
    return Invalid("optimizer.epsilon", o.epsilon(), "must be finite and > 0");
  }
  if (o.has_beta1() && !(o.beta1() >= 0 && o.beta1() < 1)) {
    return Invalid("optimizer.beta1", o.beta1(), "must be in [0, 1)");
  }
  if (o.has_beta2() && !(o.beta2() >= 0 && o.beta2() < 1)) {
    return Invalid("optimizer.beta2", o.beta2(), "must be in [0, 1)");
  }
  if (o.has_ftrl_beta() && !(Finite(o.ftrl_beta()) && o.ftrl_beta() >= 0)) {
    return Invalid("optimizer.ftrl_beta", o.ftrl_beta(), "must be finite and >= 0");
  }
  if (o.has_ftrl_l1() && !(Finite(o.ftrl_l1()) && o.ftrl_l1() >= 0)) {
    return Invalid("optimizer.ftrl_l1", o.ftrl_l1(), "must be finite and >= 0");
  }
  if (o.has_ftrl_l2() && !(Finite(o.ftrl_l2()) && o.ftrl_l2() >= 0)) {
    return Invalid("optimizer.ftrl_l2", o.ftrl_l2(), "must be finite and >= 0");
  }
  if (o.kind() == OptimizerSpec::FTRL && o.ftrl_beta() == 0 && o.initial_accumulator() == 0) {
    return absl::InvalidArgumentError(
        "FTRL needs ftrl_beta > 0 or initial_accumulator > 0 (else its first step divides "
        "by zero)");
  }
  if (rules == SpecRules::kNew) RETURN_IF_ERROR(CheckNewOptimizer(o));
  return o;
}

absl::Status ValidatePushLearningRate(float lr, absl::string_view name) {
  if (lr == 0) return absl::OkStatus();  // the table's own rate
  if (lr >= kMinLearningRate && lr <= kMaxLearningRate) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "learning_rate ", Num(lr), " for '", name, "' is outside the accepted range [",
      Num(kMinLearningRate), ", ", Num(kMaxLearningRate), "] (0: the table's own rate)"));
}

float MaxPushGradient(float clip_value, float clip_norm) {
  const bool value_bounds = clip_value > 0 && clip_value <= kMaxGradient;
  const bool norm_bounds = clip_norm > 0 && clip_norm <= kMaxGradient;
  return value_bounds || norm_bounds ? std::numeric_limits<float>::max() : kMaxGradient;
}

namespace {

// "table 't': " or "dense tensor 't': " before a field's complaint.
absl::Status Naming(absl::string_view what, absl::string_view name, absl::Status s) {
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat(what, " '", name, "': ", s.message()));
}

}  // namespace

absl::StatusOr<TableSpec> NormalizeTableSpec(const TableSpec& spec, SpecRules rules) {
  RETURN_IF_ERROR(ValidateName(spec.name()));
  if (spec.dim() < 1 || spec.dim() > kMaxDim) {
    return absl::InvalidArgumentError(
        absl::StrCat("table '", spec.name(), "': dim ", spec.dim(), " is outside 1..", kMaxDim));
  }
  TableSpec out = spec;
  auto initializer = NormalizeInitializer(spec.initializer(), rules);
  RETURN_IF_ERROR(Naming("table", spec.name(), initializer.status()));
  *out.mutable_initializer() = *std::move(initializer);
  auto optimizer = NormalizeOptimizer(spec.optimizer(), rules);
  RETURN_IF_ERROR(Naming("table", spec.name(), optimizer.status()));
  *out.mutable_optimizer() = *std::move(optimizer);
  RETURN_IF_ERROR(
      Naming("table", spec.name(), CheckClip(spec.clip_value(), spec.clip_norm(), rules)));
  // The feature lifecycle (issue 17): "off" has one spelling, so equal specs stay equal.
  if (spec.admission().min_count() > kMaxAdmissionCount) {
    return absl::InvalidArgumentError(absl::StrCat(
        "table '", spec.name(), "': admission.min_count ", spec.admission().min_count(),
        " exceeds ", kMaxAdmissionCount, " (the admission counters saturate there)"));
  }
  if (spec.admission().min_count() <= 1) out.clear_admission();
  if (spec.eviction().ttl_seconds() == 0 && spec.eviction().max_rows() == 0) {
    out.clear_eviction();
  }
  return out;
}

absl::StatusOr<DenseSpec> NormalizeDenseSpec(const DenseSpec& spec, SpecRules rules) {
  RETURN_IF_ERROR(ValidateName(spec.name()));
  if (spec.shape_size() == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("dense tensor '", spec.name(), "' needs a shape"));
  }
  const int64_t max_elements = rules == SpecRules::kNew ? kMaxNewDenseElements : kMaxDenseElements;
  int64_t numel = 1;
  for (int64_t d : spec.shape()) {
    if (d < 1 || d > max_elements || numel * d > max_elements) {
      return absl::InvalidArgumentError(
          absl::StrCat("dense tensor '", spec.name(), "': shape dimension ", d,
                       " is < 1 or makes more than ", max_elements, " elements"));
    }
    numel *= d;
  }
  DenseSpec out = spec;
  auto initializer = NormalizeInitializer(spec.initializer(), rules);
  RETURN_IF_ERROR(Naming("dense tensor", spec.name(), initializer.status()));
  *out.mutable_initializer() = *std::move(initializer);
  auto optimizer = NormalizeOptimizer(spec.optimizer(), rules);
  RETURN_IF_ERROR(Naming("dense tensor", spec.name(), optimizer.status()));
  *out.mutable_optimizer() = *std::move(optimizer);
  RETURN_IF_ERROR(
      Naming("dense tensor", spec.name(), CheckClip(spec.clip_value(), spec.clip_norm(), rules)));
  return out;
}

int SlotsPerElement(OptimizerSpec::Kind kind) {
  switch (kind) {
    case OptimizerSpec::MOMENTUM:
    case OptimizerSpec::ADAGRAD:
      return 1;
    case OptimizerSpec::ADAM:
    case OptimizerSpec::FTRL:
      return 2;
    default:
      return 0;
  }
}

bool SpecsEqual(const google::protobuf::Message& a, const google::protobuf::Message& b) {
  return google::protobuf::util::MessageDifferencer::Equals(a, b);
}

}  // namespace ps
