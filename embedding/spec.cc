#include "embedding/spec.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "google/protobuf/util/message_differencer.h"

namespace ps {
namespace {

absl::Status Invalid(absl::string_view what, double value, absl::string_view rule) {
  return absl::InvalidArgumentError(absl::StrCat(what, " = ", value, " is invalid: ", rule));
}

bool Finite(float v) { return std::isfinite(v); }

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

absl::StatusOr<InitializerSpec> NormalizeInitializer(const InitializerSpec& spec) {
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
  return out;
}

absl::StatusOr<OptimizerSpec> NormalizeOptimizer(const OptimizerSpec& spec) {
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
  return o;
}

absl::StatusOr<TableSpec> NormalizeTableSpec(const TableSpec& spec) {
  RETURN_IF_ERROR(ValidateName(spec.name()));
  if (spec.dim() < 1 || spec.dim() > kMaxDim) {
    return absl::InvalidArgumentError(
        absl::StrCat("table '", spec.name(), "': dim ", spec.dim(), " is outside 1..", kMaxDim));
  }
  TableSpec out = spec;
  ASSIGN_OR_RETURN(*out.mutable_initializer(), NormalizeInitializer(spec.initializer()));
  ASSIGN_OR_RETURN(*out.mutable_optimizer(), NormalizeOptimizer(spec.optimizer()));
  return out;
}

absl::StatusOr<DenseSpec> NormalizeDenseSpec(const DenseSpec& spec) {
  RETURN_IF_ERROR(ValidateName(spec.name()));
  if (spec.shape_size() == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("dense tensor '", spec.name(), "' needs a shape"));
  }
  int64_t numel = 1;
  for (int64_t d : spec.shape()) {
    if (d < 1 || d > kMaxDenseElements || numel * d > kMaxDenseElements) {
      return absl::InvalidArgumentError(
          absl::StrCat("dense tensor '", spec.name(), "': shape dimension ", d,
                       " is < 1 or makes more than ", kMaxDenseElements, " elements"));
    }
    numel *= d;
  }
  DenseSpec out = spec;
  ASSIGN_OR_RETURN(*out.mutable_initializer(), NormalizeInitializer(spec.initializer()));
  ASSIGN_OR_RETURN(*out.mutable_optimizer(), NormalizeOptimizer(spec.optimizer()));
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
