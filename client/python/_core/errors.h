// How the binding turns an absl::Status into a Python exception: elastic_ps.errors'
// PsError (TableConflictError for ALREADY_EXISTS), carrying the code as a grpc.StatusCode,
// the message and, for a pod's wrong-shard refusal, `wrong_shard` = (epoch, vshard) read
// from its detail (proto/wrong_shard.h). The Python classes are the package's; the mapping of codes
// to classes is elastic_ps.errors.error_from_status.
#pragma once

#include <pybind11/pybind11.h>

#include "absl/status/status.h"

namespace ps::py {

namespace pyb = pybind11;

// The exception object for `status` (not OK). Needs the GIL.
pyb::object ErrorOf(const absl::Status& status);

// Raises ErrorOf(status) (not OK) as the current Python exception. Needs the GIL.
[[noreturn]] void ThrowStatus(const absl::Status& status);

// Raises it if `status` is not OK. Needs the GIL.
inline void ThrowIfError(const absl::Status& status) {
  if (!status.ok()) ThrowStatus(status);
}

// Raises ValueError(message) (bad arguments, found before any call).
[[noreturn]] void ThrowValueError(const std::string& message);

}  // namespace ps::py
