// scan() for C++ torch::nn modules: runs a module on fake tensors and reports its outputs by
// dotted module path, like Python's metaload.scan.
//
// C++ modules have no forward hooks and no virtual forward, so what can be observed is what a
// module tree calls through type-erased AnyModules:
//  - the root module's output, under "" (always, when it is a tensor, a vector of tensors or a
//    tuple of two tensors -- then the first, as in Python);
//  - for a torch::nn::Sequential, every child's output under its index ("0", "1", ...), and
//    recursively for children that are Sequentials themselves ("2.0"; a Sequential nests only
//    as a subclass with a typed forward, since AnyModule needs one);
//  - any other module is one opaque call: its submodules are not reported. Models of the model
//    layer report every module through scan()'s `attach` (fake_mode/scan.h) instead.
// Kept apart from scan.h so that its includers do not compile torch::nn.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/pimpl.h>

#include <memory>
#include <type_traits>
#include <vector>

#include "base/error.h"
#include "fake_mode/scan.h"

namespace metaload {

// A module cannot be scanned with these inputs (too many, or none).
METALOAD_DEFINE_ERROR(ScanError, Error);

// Runs `module` (forward taking 1 to 3 tensors) under FakeMode(device) with gradients off; inputs
// become fake as in scan(ScanFn). ScanResult::outputs holds the root output's tensors.
ScanResult scan(torch::nn::AnyModule module, const std::vector<at::Tensor>& inputs,
                c10::Device device);

// A Sequential (it cannot be put in an AnyModule: its forward is a template).
ScanResult scan(torch::nn::Sequential module, const std::vector<at::Tensor>& inputs,
                c10::Device device);

// Any module by its impl pointer: scan(net.ptr(), ...), scan(std::make_shared<MyImpl>(), ...).
// (A module holder such as torch::nn::Linear is passed as linear.ptr(): a holder is callable, and
// overload resolution against scan(ScanFn) would instantiate its forward with a vector.)
template <typename Impl, typename = std::enable_if_t<std::is_base_of_v<torch::nn::Module, Impl>>>
ScanResult scan(const std::shared_ptr<Impl>& module, const std::vector<at::Tensor>& inputs,
                c10::Device device) {
  if constexpr (std::is_base_of_v<torch::nn::SequentialImpl, Impl>) {
    return scan(torch::nn::Sequential(std::static_pointer_cast<torch::nn::SequentialImpl>(module)),
                inputs, device);
  } else {
    return scan(torch::nn::AnyModule(module), inputs, device);
  }
}

}  // namespace metaload
