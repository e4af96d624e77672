#include "client/python/_core/arrays.h"

#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/python/_core/errors.h"

namespace ps::py {
namespace {

std::string ShapeOf(const pyb::array& a) {
  std::vector<ssize_t> shape(a.shape(), a.shape() + a.ndim());
  return absl::StrCat("(", absl::StrJoin(shape, ", "), a.ndim() == 1 ? ",)" : ")");
}

std::string DtypeOf(pyb::handle h) {
  return pyb::str(pyb::getattr(h, "dtype", pyb::str(Py_TYPE(h.ptr())->tp_name)));
}

// `h` as a C-contiguous array of native T, or ValueError.
template <typename T>
pyb::array_t<T> Checked(pyb::handle h, const std::string& what, const char* role,
                        const char* want) {
  if (!pyb::array_t<T>::check_(h)) {
    ThrowValueError(
        absl::StrCat(what, ": ", role, " must be a numpy array of ", want, ", got ", DtypeOf(h)));
  }
  auto a = pyb::reinterpret_borrow<pyb::array_t<T>>(h);
  if (!(a.flags() & pyb::array::c_style)) {
    ThrowValueError(absl::StrCat(what, ": ", role, " must be C-contiguous"));
  }
  return a;
}

}  // namespace

absl::Span<const int64_t> IdsOf(pyb::handle ids, const std::string& what) {
  auto a = Checked<int64_t>(ids, what, "ids", "int64");
  if (a.ndim() != 1) ThrowValueError(absl::StrCat(what, ": ids must be 1-D, got ", ShapeOf(a)));
  if (static_cast<uint64_t>(a.size()) >= std::numeric_limits<uint32_t>::max()) {
    ThrowValueError(absl::StrCat(what, ": ", a.size(), " ids; at most 2^32 - 2 per table"));
  }
  return absl::Span<const int64_t>(a.data(), static_cast<size_t>(a.size()));
}

float* OutRows(pyb::handle out, size_t n, uint32_t dim, const std::string& what) {
  auto a = Checked<float>(out, what, "out", "float32");
  if (a.ndim() != 2 || static_cast<size_t>(a.shape(0)) != n ||
      static_cast<size_t>(a.shape(1)) != dim) {
    ThrowValueError(
        absl::StrCat(what, ": out has shape ", ShapeOf(a), "; expected (", n, ", ", dim, ")"));
  }
  if (!a.writeable()) ThrowValueError(absl::StrCat(what, ": out is read-only"));
  return a.mutable_data();
}

uint16_t* OutHalfRows(pyb::handle out, size_t n, uint32_t dim, const std::string& what) {
  if (!pyb::isinstance<pyb::array>(out)) {
    ThrowValueError(absl::StrCat(what, ": out must be a numpy array, got ", DtypeOf(out)));
  }
  auto a = pyb::reinterpret_borrow<pyb::array>(out);
  const char kind = a.dtype().kind();
  if (a.itemsize() != 2 || (kind != 'i' && kind != 'u' && kind != 'f') ||
      !a.dtype().attr("isnative").cast<bool>()) {
    ThrowValueError(absl::StrCat(what, ": out of a bfloat16/float16 pull must be float32 (widened)",
                                 " or a native 16-bit array (float16, int16, uint16: the raw",
                                 " values), got ", DtypeOf(out)));
  }
  if (!(a.flags() & pyb::array::c_style)) {
    ThrowValueError(absl::StrCat(what, ": out must be C-contiguous"));
  }
  if (a.ndim() != 2 || static_cast<size_t>(a.shape(0)) != n ||
      static_cast<size_t>(a.shape(1)) != dim) {
    ThrowValueError(
        absl::StrCat(what, ": out has shape ", ShapeOf(a), "; expected (", n, ", ", dim, ")"));
  }
  if (!a.writeable()) ThrowValueError(absl::StrCat(what, ": out is read-only"));
  return static_cast<uint16_t*>(a.mutable_data());
}

bool IsFloat32Array(pyb::handle out) { return pyb::array_t<float>::check_(out); }

pyb::array_t<int16_t> NewHalfRows(const std::vector<ssize_t>& shape) {
  return pyb::array_t<int16_t>(shape);
}

const float* GradRows(pyb::handle grads, size_t n, uint32_t dim, const std::string& what) {
  auto a = Checked<float>(grads, what, "grads", "float32");
  const bool ok = (a.ndim() == 2 && static_cast<size_t>(a.shape(0)) == n &&
                   static_cast<size_t>(a.shape(1)) == dim) ||
                  (a.ndim() == 1 && static_cast<size_t>(a.size()) == n * dim);
  if (!ok) {
    ThrowValueError(absl::StrCat(what, ": grads of shape ", ShapeOf(a), " for ", n, " ids of dim ",
                                 dim, " (expected (", n, ", ", dim, "))"));
  }
  return a.data();
}

float* DenseValues(pyb::handle values, size_t numel, bool writable, const std::string& what) {
  auto a = Checked<float>(values, what, writable ? "out" : "grads", "float32");
  if (static_cast<size_t>(a.size()) != numel) {
    ThrowValueError(absl::StrCat(what, ": ", writable ? "out" : "grads", " of shape ", ShapeOf(a),
                                 "; expected ", numel, " floats"));
  }
  if (!writable) return const_cast<float*>(a.data());
  if (!a.writeable()) ThrowValueError(absl::StrCat(what, ": out is read-only"));
  return a.mutable_data();
}

pyb::array_t<float> NewFloats(const std::vector<ssize_t>& shape) {
  return pyb::array_t<float>(shape);
}

}  // namespace ps::py
