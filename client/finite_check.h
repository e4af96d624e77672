// The client's check that gradients are finite, before anything of a push is sent. The
// pods refuse a NaN or Inf too, but a push that spans several pods would then be applied
// on some of them and not on others; checked here, nothing of it is sent anywhere.
#pragma once

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace ps::internal {

// OK when the `rows` x `dim` floats at `grads` are all finite; else INVALID_ARGUMENT naming
// `what` (e.g. "push to 'user'"), the first bad value, its row's id (ids[row], when `ids`
// is not empty; else the row) and its element. Reads the floats once; thread-safe (pure).
absl::Status CheckFinite(absl::string_view what, const float* grads, size_t rows, uint32_t dim,
                         absl::Span<const int64_t> ids = {});

}  // namespace ps::internal
