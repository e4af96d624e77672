// The numpy arrays the binding hands to the C++ client, checked: ids, rows to fill and
// gradients are used in place (the buffer protocol, no copy), so their dtype, shape,
// layout and writability are checked first, each failure a ValueError that says what was
// expected. All functions need the GIL; the pointers they return are valid while the
// array is alive and not resized.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/types/span.h"

namespace ps::py {

namespace pyb = pybind11;

// A 1-D C-contiguous native int64 array (elastic_ps.routing.as_ids makes one of any
// integer array-like) of at most 2^32 - 1 ids. `what` names the call in the error.
absl::Span<const int64_t> IdsOf(pyb::handle ids, const std::string& what);

// A writable C-contiguous native float32 array of shape (n, dim): the rows of a pull.
float* OutRows(pyb::handle out, size_t n, uint32_t dim, const std::string& what);

// A writable C-contiguous native array of 16-bit elements (int16, uint16 or float16: the
// raw bits of a compact pull, e.g. a torch.bfloat16 tensor's int16 view) of shape (n, dim).
uint16_t* OutHalfRows(pyb::handle out, size_t n, uint32_t dim, const std::string& what);

// Whether `out` is a numpy array of native float32 (what OutRows takes).
bool IsFloat32Array(pyb::handle out);

// A new (uninitialized) int16 array of `shape`: the raw rows of a compact pull.
pyb::array_t<int16_t> NewHalfRows(const std::vector<ssize_t>& shape);

// A C-contiguous native float32 array of shape (n, dim), or of n * dim elements in one
// dimension: the gradients of a push.
const float* GradRows(pyb::handle grads, size_t n, uint32_t dim, const std::string& what);

// A C-contiguous native float32 array of `numel` elements in any shape: a dense tensor's
// values or gradients; writable when `writable`.
float* DenseValues(pyb::handle values, size_t numel, bool writable, const std::string& what);

// A new (uninitialized) float32 array of `shape`.
pyb::array_t<float> NewFloats(const std::vector<ssize_t>& shape);

}  // namespace ps::py
