// Python operators of the families, for tests: build a model from a config.json text, put given
// weights into it and run forward or generate. torch.ops.metaload._family_*.
//
// Test-only: built as its own shared library (libmetaload_test_ops.so, beside the tests of this
// folder) that links libmetaload.so, so the release library does not carry them. Python tests load
// it after the package (tests/python/conftest.py, family_test_ops()).
#include <map>
#include <unordered_set>

#include <fmt/format.h>
#include <torch/library.h>

#include "base/torch_library.h"
#include "model/families/family.h"

namespace metaload {
namespace {

// Builds the model (float32, CPU, no init) and copies the given tensors into its parameters. Every
// parameter must be given (one name of a tied group suffices) and every name must be a parameter.
std::shared_ptr<CausalLM> model_with_weights(const std::string& config_json,
                                             const std::vector<std::string>& names,
                                             const std::vector<at::Tensor>& tensors) {
  if (names.size() != tensors.size())
    throw FamilyError(fmt::format("{} names for {} tensors", names.size(), tensors.size()));
  FamilyConfig config = parse_family_config_text(config_json, "<config_json argument>");
  BuildOptions options;
  options.init_weights = false;
  std::shared_ptr<CausalLM> model = build_causal_lm(config, options);
  auto params = model->named_parameters(/*recurse=*/true);
  std::unordered_set<const void*> filled;
  std::vector<std::string> unexpected;
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < names.size(); ++i) {
    at::Tensor* p = params.find(names[i]);
    if (!p) {
      unexpected.push_back(names[i]);
      continue;
    }
    if (!p->sizes().equals(tensors[i].sizes()))
      throw FamilyError(fmt::format("tensor '{}' has shape {}, the model's parameter {}", names[i],
                                    c10::str(tensors[i].sizes()), c10::str(p->sizes())));
    p->copy_(tensors[i]);
    filled.insert(p->unsafeGetTensorImpl());
  }
  std::vector<std::string> missing;
  for (const auto& item : params)
    if (!filled.count(item.value().unsafeGetTensorImpl())) missing.push_back(item.key());
  if (!unexpected.empty() || !missing.empty()) {
    auto list = [](const std::vector<std::string>& v) {
      std::string out;
      for (const auto& s : v) out += (out.empty() ? "" : ", ") + s;
      return out.empty() ? std::string("none") : out;
    };
    throw FamilyError(
        fmt::format("weights do not match the {} module tree: unexpected: {}; "
                    "missing: {}",
                    config.architecture, list(unexpected), list(missing)));
  }
  return model;
}

at::Tensor family_test_forward(std::string config_json, std::vector<std::string> names,
                               std::vector<at::Tensor> tensors, at::Tensor ids) {
  auto model = model_with_weights(config_json, names, tensors);
  at::NoGradGuard no_grad;
  return model->forward(ids);
}

// Forward of the ids in consecutive chunks of the given sizes through one KV cache: the logits of
// all positions, which must equal one uncached forward.
at::Tensor family_test_forward_chunked(std::string config_json, std::vector<std::string> names,
                                       std::vector<at::Tensor> tensors, at::Tensor ids,
                                       std::vector<int64_t> chunks) {
  auto model = model_with_weights(config_json, names, tensors);
  at::NoGradGuard no_grad;
  KVCache cache;
  std::vector<at::Tensor> out;
  int64_t offset = 0;
  for (int64_t n : chunks) {
    out.push_back(model->forward(ids.narrow(1, offset, n), &cache));
    offset += n;
  }
  return at::cat(out, 1);
}

at::Tensor family_test_generate(std::string config_json, std::vector<std::string> names,
                                std::vector<at::Tensor> tensors, at::Tensor ids, int64_t n,
                                bool use_cache) {
  auto model = model_with_weights(config_json, names, tensors);
  return model->generate(ids, n, use_cache);
}

std::string family_builtin_config(std::string name) {
  return builtin_config_json(name);
}

std::vector<std::string> family_parameter_names(std::string config_json) {
  std::vector<std::string> out;
  for (const auto& p : parameter_specs(parse_family_config_text(config_json, "<config_json>")))
    out.push_back(p.name);
  return out;
}

}  // namespace

METALOAD_LIBRARY_FRAGMENT(m) {
  m.def(
      "_family_test_forward(str config_json, str[] names, Tensor[] tensors, Tensor ids) -> Tensor",
      &family_test_forward);
  m.def(
      "_family_test_forward_chunked(str config_json, str[] names, Tensor[] tensors, Tensor ids, "
      "int[] chunks) -> Tensor",
      &family_test_forward_chunked);
  m.def(
      "_family_test_generate(str config_json, str[] names, Tensor[] tensors, Tensor ids, int n, "
      "bool use_cache) -> Tensor",
      &family_test_generate);
  m.def("_family_builtin_config(str name) -> str", &family_builtin_config);
  m.def("_family_parameter_names(str config_json) -> str[]", &family_parameter_names);
}

}  // namespace metaload
