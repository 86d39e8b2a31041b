#include "fake_mode/scan.h"

#include <ATen/core/grad_mode.h>

#include "fake_mode/fake_mode.h"
#include "fake_mode/fake_tensor.h"

namespace metaload {

namespace {

at::Tensor as_fake_input(const at::Tensor& t, c10::Device device) {
  if (!t.defined() || (is_fake(t) && claimed_device(t) == device)) return t;
  at::Tensor meta = t.is_meta() && !is_fake(t)
                        ? t
                        : at::empty_strided(t.sizes(), t.strides(), t.options().device(c10::kMeta));
  return make_fake(meta, device);
}

// Detaches the observer however the run ends.
struct Attached {
  const std::function<void(ModuleObserver)>& attach;
  ~Attached() {
    if (attach) attach(ModuleObserver());
  }
};

}  // namespace

ScanResult scan(const ScanFn& fn, const std::vector<at::Tensor>& inputs, c10::Device device,
                const std::function<void(ModuleObserver)>& attach) {
  ScanResult result;
  std::vector<at::Tensor> fake_inputs;
  fake_inputs.reserve(inputs.size());
  {
    FakeMode mode(device);  // registers the fallback before fake tensors are made
    for (const auto& t : inputs) fake_inputs.push_back(as_fake_input(t, device));
  }
  if (attach) {
    attach([&result](const std::string& path, const at::Tensor& out) {
      auto [it, fresh] = result.modules.try_emplace(path);
      if (fresh) result.order.push_back(path);
      it->second = ShapeInfo{out.sizes().vec(), out.scalar_type(), claimed_device(out),
                             it->second.calls + 1};
    });
  }
  Attached detach{attach};
  at::NoGradGuard no_grad;
  FakeMode mode(device);
  result.outputs = fn(fake_inputs);
  return result;
}

}  // namespace metaload
