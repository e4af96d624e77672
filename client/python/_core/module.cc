// elastic_ps._core: the C++ client library (client/ps_client.h, client/worker_session.h)
// and the routing rules (common/routing/) bound for the Python SDK (client/python/
// elastic_ps). Built by client/python/CMakeLists.txt into build/python/elastic_ps/.
#include <pybind11/pybind11.h>

#include "client/python/_core/client.h"
#include "client/python/_core/handle.h"
#include "client/python/_core/routing.h"
#include "client/python/_core/worker.h"

PYBIND11_MODULE(_core, m) {
  m.doc() = "elastic_ps' binding of the C++ client library; use elastic_ps.PsClient.";
  ps::py::BindHandles(m);
  ps::py::BindClient(m);
  ps::py::BindRouting(m);
  ps::py::BindWorker(m);
}
