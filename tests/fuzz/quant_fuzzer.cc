// libFuzzer target: quantized-checkpoint recognition (loader/format/quant_layout.h) and estimate
// (estimate/estimate.h) on hostile input. An input is "<config.json text>\0<safetensors file>": the
// quantization_config is parsed (without one, the scheme is read off the tensors as a
// dequantizing load does: infer_quant_config), the file's header validated, and its tensors
// recognised, with quant_state blobs and weight_shape read from the file's own data -- the one
// parser describe, estimate and the dequantizing loads share. Beyond "no crash, no sanitizer
// report": every rejection is a typed error with a rule, and an accepted layout's parts are the
// file's own tensors with sizes that add up, every part a load would read is one of them, and
// the TP granularity a load slices by is defined for both dims.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "estimate/estimate.h"
#include "loader/format/json_util.h"
#include "loader/format/quant_layout.h"
#include "loader/format/safetensors.h"
#include "loader/tp/quant_split.h"

using namespace metaload;

namespace {

void check(bool ok) {
  if (!ok) std::abort();
}

void check_layout(const Checkpoint& c, const QuantLayout& layout) {
  check(!layout.modules.empty());
  uint64_t weight = 0, aux = 0;
  for (const auto& m : layout.modules) {
    const TensorInfo* w = c.find(m.weight_tensor);
    check(w != nullptr && w->nbytes() == m.weight_bytes);
    uint64_t a = 0;
    for (const auto& name : m.aux_tensors) {
      const TensorInfo* t = c.find(name);
      check(t != nullptr);
      a += t->nbytes();
    }
    check(a == m.aux_bytes);
    check(m.n_params == static_cast<uint64_t>(m.out) * static_cast<uint64_t>(m.in));
    // What a dequantizing load reads: the packed weight and aux tensors of this module.
    check(m.parts.count("q") && m.parts.at("q") == m.weight_tensor && m.parts.count("scales"));
    for (const auto& [role, name] : m.parts) {
      check(name == m.weight_tensor ||
            std::find(m.aux_tensors.begin(), m.aux_tensors.end(), name) != m.aux_tensors.end());
    }
    for (int dim = 0; dim < 2; ++dim) {
      std::string boundary;
      check(tp_unit(layout.config, m, dim, &boundary) >= 0 && !boundary.empty());
    }
    weight += m.weight_bytes;
    aux += m.aux_bytes;
  }
  check(weight == layout.weight_bytes && aux == layout.aux_bytes);
  check(weight + aux <= c.data_bytes());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view all(reinterpret_cast<const char*>(data), size);
  const size_t nul = all.find('\0');
  if (nul == std::string_view::npos) return 0;
  const std::string_view file = all.substr(nul + 1);
  Checkpoint c;
  QuantConfig cfg;
  nlohmann::json config;
  try {
    config = parse_json_strict(all.substr(0, nul), "config.json");
    auto qc = find_quant_config(config);
    if (qc) cfg = parse_quant_config(*qc, "config.json");
    c.files.push_back(parse_safetensors_bytes(file, "fuzz.safetensors"));
    cfg.inferred = !qc;
  } catch (const FormatError& e) {
    check(!e.rule().empty());
    return 0;
  }
  for (uint32_t i = 0; i < c.files[0].tensors.size(); ++i) {
    c.lookup[c.files[0].tensors[i].name] = TensorRef{0, i};
  }
  if (cfg.inferred) {
    // No quantization_config: the scheme the tensors say, as a dequantizing load reads it.
    std::optional<QuantConfig> inferred = infer_quant_config(c);
    if (!inferred) return 0;
    check(inferred->inferred && inferred->method.empty());
    cfg = *inferred;
  }
  const TensorBytes bytes = [&](const SafetensorsHeader& h, const TensorInfo& t) {
    check(h.data_start + t.end <= file.size());  // the parser checked the extent
    return std::string(file.substr(h.data_start + t.begin, t.nbytes()));
  };
  try {
    const QuantLayout layout =
        recognise_quantized(c, cfg, "config.json", bytes, /*require_modules=*/!cfg.inferred);
    if (!layout.modules.empty()) check_layout(c, layout);
  } catch (const FormatError& e) {
    check(!e.rule().empty() && !e.file().empty());
  } catch (const SizeOverflowError&) {
  }
  // The same tensors estimated under the same scheme: refusals are typed, sizes add up.
  if (cfg.inferred) return 0;
  std::vector<TensorSpec> specs;
  for (const auto& t : c.files[0].tensors) specs.push_back({t.name, t.dtype, t.shape});
  try {
    QuantEstimate e = estimate_tensors(specs, config, cfg, "fuzz.safetensors");
    check(e.size_bytes == e.unquantized_bytes + e.layout.weight_bytes + e.layout.aux_bytes);
  } catch (const FormatError& e) {
    check(!e.rule().empty());
  } catch (const SizeOverflowError&) {
  }
  return 0;
}
