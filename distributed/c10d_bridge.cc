// The Python module libmetaload_c10d: hands torch.distributed's ProcessGroup to the library's
// operators as the TorchScript object c10d.ProcessGroup. torch 2.x does it itself
// (group.boxed()); torch 1.13 has no such conversion, so this module (linked with torch's Python
// library, kept out of libmetaload.so, which must load without Python) does what boxed() does.
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

PYBIND11_MODULE(libmetaload_c10d, m) {
  m.doc() = "metaload: torch.distributed process groups as TorchScript objects (torch 1.13)";
  m.def(
      "box",
      [](const c10::intrusive_ptr<c10d::ProcessGroup>& group) {
        return torch::jit::toPyObject(c10::IValue(group));
      },
      "The group as a torch.ScriptObject of class c10d.ProcessGroup.");
}
