// Views of the packed little-endian arrays carried in `bytes` fields. The project targets
// little-endian hosts only (checked at compile time), so a view is the bytes themselves.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"

namespace ps {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "packed arrays are little-endian");

// A span of T over `bytes`, or INVALID_ARGUMENT ("<what> '<name>' has ... bytes") if its size
// is not a multiple of sizeof(T); the message is built only on error.
// When `bytes` is not aligned for T the values are copied into *scratch (which then backs
// the span). The span lives as long as `bytes` and *scratch.
template <typename T>
absl::StatusOr<absl::Span<const T>> PackedView(const std::string& bytes, std::vector<T>* scratch,
                                               absl::string_view what, absl::string_view name) {
  if (bytes.size() % sizeof(T) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, " '", name, "' has ", bytes.size(),
                                                   " bytes, not a multiple of ", sizeof(T)));
  }
  const size_t n = bytes.size() / sizeof(T);
  if (reinterpret_cast<uintptr_t>(bytes.data()) % alignof(T) == 0) {
    return absl::Span<const T>(reinterpret_cast<const T*>(bytes.data()), n);
  }
  scratch->resize(n);
  std::memcpy(scratch->data(), bytes.data(), bytes.size());
  return absl::Span<const T>(scratch->data(), n);
}

// Resizes `bytes` to hold n values of T and returns a pointer to them.
template <typename T>
T* PackedResize(std::string* bytes, size_t n) {
  bytes->resize(n * sizeof(T));
  return reinterpret_cast<T*>(bytes->data());
}

// Copies `values` into a new packed string.
template <typename T>
std::string Pack(absl::Span<const T> values) {
  return std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(T));
}

}  // namespace ps
