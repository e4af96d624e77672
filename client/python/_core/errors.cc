#include "client/python/_core/errors.h"

#include <string>

#include "proto/wrong_shard.h"

namespace ps::py {

pyb::object ErrorOf(const absl::Status& status) {
  // Server messages may hold anything; invalid UTF-8 is replaced, never an error of its own.
  const std::string message(status.message());
  pyb::object text = pyb::reinterpret_steal<pyb::object>(
      PyUnicode_DecodeUTF8(message.data(), static_cast<Py_ssize_t>(message.size()), "replace"));
  if (!text) throw pyb::error_already_set();
  pyb::object error = pyb::module_::import("elastic_ps.errors")
                          .attr("error_from_status")(static_cast<int>(status.code()), text);
  // The wrong-shard signal is the refusal's detail, never its text (proto/wrong_shard.h).
  if (auto ws = WrongShardOf(status)) {
    error.attr("wrong_shard") = pyb::make_tuple(ws->epoch(), ws->vshard());
  }
  return error;
}

void ThrowStatus(const absl::Status& status) {
  pyb::object error = ErrorOf(status);
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(error.ptr())), error.ptr());
  throw pyb::error_already_set();
}

void ThrowValueError(const std::string& message) { throw pyb::value_error(message); }

}  // namespace ps::py
