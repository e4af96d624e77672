// Registers the routing functions (elastic_ps.routing computes with them) and the token
// file reader in `m`.
#pragma once

#include <pybind11/pybind11.h>

namespace ps::py {

void BindRouting(pybind11::module_& m);

}  // namespace ps::py
