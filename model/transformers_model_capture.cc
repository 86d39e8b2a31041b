// Capture handles and the family observer that feeds them (installed only while a capture or a
// scan needs it, so plain forwards pay nothing).
#include <algorithm>

#include <fmt/format.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>

#include "base/text.h"
#include "model/transformers_model.h"

namespace metaload {

struct Capture::State {
  explicit State(std::string p) : path(std::move(p)) {}
  const std::string path;
  mutable std::mutex mu;
  at::Tensor value;
  int64_t count = 0;
};

const std::string& Capture::path() const {
  return state_->path;
}

bool Capture::has_value() const {
  std::lock_guard<std::mutex> g(state_->mu);
  return state_->value.defined();
}

at::Tensor Capture::value() const {
  std::lock_guard<std::mutex> g(state_->mu);
  if (!state_->value.defined())
    throw ModelError(
        fmt::format("no output of {} captured yet: the module has not run since the capture began",
                    quote_text(state_->path, '\'')));
  return state_->value;
}

int64_t Capture::count() const {
  std::lock_guard<std::mutex> g(state_->mu);
  return state_->count;
}

void Capture::reset() {
  std::lock_guard<std::mutex> g(state_->mu);
  state_->value = at::Tensor();
}

namespace {

bool is_container(const torch::nn::Module& m) {
  return dynamic_cast<const torch::nn::ModuleListImpl*>(&m) != nullptr;
}

// ModelError for a module that produces no output of its own to capture (a container) or a tuple
// (whose elements are captured instead).
void check_capturable(const std::string& path, const torch::nn::Module& m) {
  if (is_container(m)) {
    throw ModelError(fmt::format(
        "capture: '{}' is a container ({}): it produces no output of its own; capture one of "
        "its entries, e.g. '{}.0'",
        path, m.name(), path));
  }
  if (const int64_t n = output_elements(m); n > 0) {
    throw ModelError(fmt::format(
        "capture: '{}' ({}) returns a tuple of {} tensors; capture its elements '{}.0' to "
        "'{}.{}' (rotary_emb: .0 is cos, .1 is sin)",
        path, m.name(), n, path, path, n - 1));
  }
}

}  // namespace

Capture TransformersModel::capture(const std::string& path) {
  std::lock_guard<std::recursive_mutex> g(mu_);
  // An element of a tuple output ("model.rotary_emb.0") is no module but is reported like one.
  const auto& classes = classes_locked();
  std::shared_ptr<torch::nn::Module> m;
  for (const auto& item : module_->named_modules("", /*include_self=*/true))
    if (item.key() == path) m = item.value();
  if (!m && classes.count(path) == 0) at(path);  // ModulePathError for a wrong path
  if (m) check_capturable(path, *m);
  auto state = std::make_shared<Capture::State>(path);
  captures_.push_back(state);
  install_observer({});
  return Capture(state);
}

void TransformersModel::install_observer(const ModuleObserver& extra) {
  captures_.erase(
      std::remove_if(captures_.begin(), captures_.end(), [](const auto& w) { return w.expired(); }),
      captures_.end());
  if (captures_.empty() && !extra) {
    module_->set_output_observer({});  // nothing observed: the forward pays nothing
    return;
  }
  module_->set_output_observer([this, extra](const std::string& path, const at::Tensor& out) {
    if (extra) extra(path, out);
    deliver(path, out);
  });
}

void TransformersModel::deliver(const std::string& path, const at::Tensor& output) {
  for (const auto& w : captures_) {
    std::shared_ptr<Capture::State> s = w.lock();
    if (!s || s->path != path) continue;
    std::lock_guard<std::mutex> g(s->mu);
    s->value = output;
    ++s->count;
  }
}

const std::unordered_map<std::string, std::string>& TransformersModel::classes_locked() {
  if (classes_.empty()) {
    for (const auto& item : module_->named_modules("", /*include_self=*/true)) {
      classes_[item.key()] = item.value()->name();
      const int64_t n = output_elements(*item.value());
      for (int64_t i = 0; i < n; ++i)
        classes_[fmt::format("{}.{}", item.key(), i)] = item.value()->name();
    }
  }
  return classes_;
}

}  // namespace metaload
