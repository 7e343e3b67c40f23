// The Python module _loom_torch: the loom backend's class, and its creator for
// torch.distributed.Backend.register_backend (python/loom/torch.py registers it).
#include <pybind11/chrono.h>
#include <torch/csrc/utils/pybind.h>

#include "backend.h"

namespace py = pybind11;

PYBIND11_MODULE(_loom_torch, m) {
  m.doc() = "The loom torch.distributed backend (C++ over libloom's C API)";
  py::module_::import("torch.distributed");  // registers c10d::Backend's Python type first
  py::class_<loom::torchext::LoomBackend, c10d::Backend,
             c10::intrusive_ptr<loom::torchext::LoomBackend>>(m, "LoomBackend");
  m.def(
      "create_backend",
      [](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
         std::chrono::milliseconds timeout) {
        return c10::make_intrusive<loom::torchext::LoomBackend>(store, rank, size, timeout);
      },
      py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"),
      py::call_guard<py::gil_scoped_release>(),
      "A loom backend joining the group whose rank 0 publishes Loom's unique id in store.");
  m.def("join_stopped_threads", &loom::torchext::joinStoppedThreads,
        py::call_guard<py::gil_scoped_release>(),
        "Joins the backend threads that a future's callback stopped (python/loom/torch.py calls "
        "it at exit).");
  m.def("stopped_threads", &loom::torchext::stoppedThreads,
        "How many backend threads that a future's callback stopped are not joined yet (each is "
        "joined once it has ended, by the next backend made or shut down).");
}
