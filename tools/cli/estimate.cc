// metaload estimate REF SCHEME [--revision R] [--json]
//   REF: an unquantized checkpoint reference or model key, or a config.json file; SCHEME: a
//   preset (bnb-nf4, gptq-int4, ...) or a quantization_config JSON object.
#include <cstdio>
#include <iostream>
#include <memory>

#include "estimate/estimate.h"
#include "tools/cli/command.h"

namespace metaload {
namespace cli {
namespace {

struct Options : ModelArgs {
  std::string scheme;
};

std::string percent(double x) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%+.1f%%", x * 100);
  return buf;
}

int run(const Options& o) {
  QuantEstimate e =
      estimate_quantized(o.ref, o.scheme, o.requested_revision(), KeyOptions{o.allow_local_paths});
  if (o.json) {
    std::cout << to_json(e).dump(2) << "\n";
    return 0;
  }
  const double exact = static_cast<double>(e.size_bytes);
  std::vector<std::pair<std::string, std::string>> rows;
  rows.emplace_back("scheme", e.scheme + " (" + quant_kind_name(e.layout.config.kind) + ")");
  rows.emplace_back("shapes from", e.source == "config" ? "config.json" : "checkpoint headers");
  rows.emplace_back("parameters", with_commas(e.n_params));
  rows.emplace_back("unquantized", gib_and_bytes(e.source_bytes));
  rows.emplace_back("quantized size", gib_and_bytes(e.size_bytes));
  rows.emplace_back("  packed weights", gib_and_bytes(e.layout.weight_bytes) + " in " +
                                            with_commas(e.layout.modules.size()) + " layers");
  rows.emplace_back("  scales etc.", gib_and_bytes(e.layout.aux_bytes));
  rows.emplace_back("  left as is", gib_and_bytes(e.unquantized_bytes));
  rows.emplace_back(
      "old table (" + e.table_name + ")",
      gib_and_bytes(e.table_bytes) + ", " +
          percent(exact > 0 ? (static_cast<double>(e.table_bytes) - exact) / exact : 0.0) + " off");
  std::string tp = e.max_tp_size ? std::to_string(*e.max_tp_size) : "1";
  if (e.max_tp_size != e.max_tp_size_unquantized) {
    tp += " (unquantized: " +
          (e.max_tp_size_unquantized ? std::to_string(*e.max_tp_size_unquantized) : "1") + "; " +
          e.tp_limited_by + ")";
  }
  rows.emplace_back("max TP degree", tp);
  print_rows(rows);
  return 0;
}

}  // namespace

std::function<int()> setup_estimate(CLI::App& sub) {
  auto o = std::make_shared<Options>();
  add_ref_argument(sub, *o,
                   "unquantized checkpoint (directory, file, index.json, HF repo id, model key) "
                   "or a config.json file");
  sub.add_option("scheme", o->scheme,
                 "preset (bnb-nf4, bnb-nf4-dq, bnb-fp4, bnb-fp4-dq, bnb-int8, gptq-int4, "
                 "gptq-int8, awq-int4, fp8-block, ct-w4a16, ct-w4a16-asym, ct-w8a16, ct-nvfp4, "
                 "ct-nvfp4a16) or a quantization_config JSON object")
      ->required();
  add_revision_option(sub, *o, "branch, tag or commit hash of an HF repo id");
  add_output_and_key_flags(sub, *o);
  return [o] { return run(*o); };
}

}  // namespace cli
}  // namespace metaload
