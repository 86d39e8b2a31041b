#include "fake_mode/scan_module.h"

#include <string>
#include <tuple>
#include <utility>

namespace metaload {
namespace {

using torch::nn::AnyModule;
using torch::nn::AnyValue;

// AnyModule::any_forward takes its arguments as a pack; a vector needs a fixed arity.
AnyValue forward_values(AnyModule& module, std::vector<AnyValue>&& args) {
  switch (args.size()) {
    case 1:
      return module.any_forward(std::move(args[0]));
    case 2:
      return module.any_forward(std::move(args[0]), std::move(args[1]));
    case 3:
      return module.any_forward(std::move(args[0]), std::move(args[1]), std::move(args[2]));
    default:
      throw ScanError("scan of a torch::nn module takes 1 to 3 input tensors, got " +
                      std::to_string(args.size()) +
                      "; wrap a module with another signature in a callable and use "
                      "scan(ScanFn, inputs, device)");
  }
}

// The tensor a module output is reported by: itself, or the first of several.
const at::Tensor* reported_tensor(AnyValue& out) {
  if (auto* t = out.try_get<at::Tensor>()) return t;
  if (auto* v = out.try_get<std::vector<at::Tensor>>()) return v->empty() ? nullptr : &v->front();
  if (auto* p = out.try_get<std::tuple<at::Tensor, at::Tensor>>()) return &std::get<0>(*p);
  return nullptr;
}

std::string child_path(const std::string& parent, size_t index) {
  return parent.empty() ? std::to_string(index) : parent + "." + std::to_string(index);
}

AnyValue run(AnyModule& module, std::vector<AnyValue>&& args, const std::string& path,
             const ModuleObserver& observe);

// Runs a Sequential child by child, reporting each child's output on the way.
AnyValue run_sequential(torch::nn::SequentialImpl& seq, std::vector<AnyValue>&& args,
                        const std::string& path, const ModuleObserver& observe) {
  if (seq.is_empty()) throw ScanError("scan of an empty torch::nn::Sequential at '" + path + "'");
  size_t index = 0;
  for (auto& child : seq) {
    const std::string where = child_path(path, index++);
    AnyValue out = run(child, std::move(args), where, observe);
    if (const at::Tensor* t = reported_tensor(out)) observe(where, *t);
    args.clear();
    args.push_back(std::move(out));
  }
  return std::move(args.front());
}

AnyValue run(AnyModule& module, std::vector<AnyValue>&& args, const std::string& path,
             const ModuleObserver& observe) {
  // A Sequential subclass with a typed forward runs as its children do (what its forward does).
  if (auto seq = std::dynamic_pointer_cast<torch::nn::SequentialImpl>(module.ptr())) {
    return run_sequential(*seq, std::move(args), path, observe);
  }
  return forward_values(module, std::move(args));
}

// Scans `call` (which runs the root module) and reports the root's output under "".
template <typename Call>
ScanResult scan_root(const std::string& name, Call&& call, const std::vector<at::Tensor>& inputs,
                     c10::Device device) {
  if (inputs.empty() || inputs.size() > 3) {
    throw ScanError("scan of a torch::nn module (" + name + ") takes 1 to 3 input tensors, got " +
                    std::to_string(inputs.size()));
  }
  ModuleObserver observer;
  auto attach = [&observer](ModuleObserver o) { observer = std::move(o); };
  auto fn = [&](const std::vector<at::Tensor>& fake_inputs) {
    std::vector<AnyValue> args;
    for (const auto& t : fake_inputs) args.emplace_back(t);
    AnyValue out = call(std::move(args), observer);
    std::vector<at::Tensor> outputs;
    if (auto* t = out.try_get<at::Tensor>()) {
      outputs.push_back(*t);
    } else if (auto* v = out.try_get<std::vector<at::Tensor>>()) {
      outputs = *v;
    } else if (auto* p = out.try_get<std::tuple<at::Tensor, at::Tensor>>()) {
      outputs = {std::get<0>(*p), std::get<1>(*p)};
    }
    if (const at::Tensor* t = reported_tensor(out)) observer("", *t);
    return outputs;
  };
  return scan(fn, inputs, device, attach);
}

}  // namespace

ScanResult scan(AnyModule module, const std::vector<at::Tensor>& inputs, c10::Device device) {
  if (module.is_empty()) throw ScanError("scan of an empty torch::nn::AnyModule");
  return scan_root(
      module.ptr()->name(),
      [&](std::vector<AnyValue>&& args, const ModuleObserver& observe) {
        return run(module, std::move(args), "", observe);
      },
      inputs, device);
}

ScanResult scan(torch::nn::Sequential module, const std::vector<at::Tensor>& inputs,
                c10::Device device) {
  if (module.is_empty()) throw ScanError("scan of an empty torch::nn::Sequential holder");
  return scan_root(
      module->name(),
      [&](std::vector<AnyValue>&& args, const ModuleObserver& observe) {
        return run_sequential(*module, std::move(args), "", observe);
      },
      inputs, device);
}

}  // namespace metaload
