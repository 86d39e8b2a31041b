// scan: run a model or any callable on fake tensors claiming a device, and learn every shape and
// dtype that flows through it, without weights, memory or compute.
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <map>
#include <string>
#include <vector>

namespace metaload {

// What a module produced during a scan.
struct ShapeInfo {
  std::vector<int64_t> sizes;  // of the latest output (a module called twice reports twice)
  at::ScalarType dtype = at::kFloat;
  c10::Device device = c10::Device(c10::kCPU);
  int64_t calls = 0;  // outputs the module produced in the scan
  // The shape seen: sizes, dtype and device (not how often).
  bool operator==(const ShapeInfo& o) const {
    return sizes == o.sizes && dtype == o.dtype && device == o.device;
  }
};

// Called by a module tree for each module's output: (dotted path, output).
using ModuleObserver = std::function<void(const std::string& path, const at::Tensor& output)>;

struct ScanResult {
  std::vector<at::Tensor> outputs;           // fake tensors on the scan's device
  std::map<std::string, ShapeInfo> modules;  // by dotted path, when the callable reports them
  std::vector<std::string> order;            // the paths of `modules` in first-output order
};

using ScanFn = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)>;

// Runs `fn` under FakeMode(device) with gradients off. Inputs that are real or meta become fake
// tensors of the same shape, strides and dtype on `device`. `attach`, when given, is called with an
// observer before the run and with an empty one after, so that a module tree (for instance the
// model layer's families) can report every module's output into ScanResult::modules; the model
// layer's ModelScan is built from that (model/transformers_model.h).
ScanResult scan(const ScanFn& fn, const std::vector<at::Tensor>& inputs, c10::Device device,
                const std::function<void(ModuleObserver)>& attach = {});

}  // namespace metaload
