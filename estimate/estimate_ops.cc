// Python operators of the quantization layer: estimate and the preset table. The logic lives in
// the torch-free files.
#include <torch/library.h>

#include <nlohmann/json.hpp>

#include "base/torch_library.h"
#include "estimate/estimate.h"

namespace metaload {
namespace {

std::string op_estimate(std::string ref, std::string scheme, c10::optional<std::string> revision,
                        bool allow_local_paths) {
  std::optional<std::string> rev;
  if (revision) rev = *revision;
  return to_json(estimate_quantized(ref, scheme, rev, KeyOptions{allow_local_paths})).dump();
}

std::string op_quant_presets() {
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& p : quant_presets()) {
    rows.push_back({{"name", p.name},
                    {"table_name", p.table_name},
                    {"quantization_config", nlohmann::json::parse(p.config)}});
  }
  return rows.dump();
}

}  // namespace
}  // namespace metaload

METALOAD_LIBRARY_FRAGMENT(m) {
  m.def(
      "estimate_quantized(str ref, str scheme, str? revision=None, "
      "bool allow_local_paths=False) -> str",
      &metaload::op_estimate);
  m.def("quant_presets() -> str", &metaload::op_quant_presets);
}
