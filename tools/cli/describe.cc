// metaload describe REF [--dtype D] [--revision R] [--json]
#include <iostream>
#include <memory>

#include "identity/config_fields.h"
#include "identity/describe.h"
#include "tools/cli/command.h"

namespace metaload {
namespace cli {
namespace {

struct Options : ModelArgs {
  std::string dtype;
  CLI::Option* dtype_opt = nullptr;
};

// A quantized checkpoint's scheme and breakdown (the per-module list is in --json).
void add_quantization_rows(const nlohmann::json& q,
                           std::vector<std::pair<std::string, std::string>>& rows) {
  std::string scheme = q.value("scheme", "");
  if (q.contains("quant_type")) scheme += " " + q["quant_type"].get<std::string>();
  if (q.contains("group_size"))
    scheme += ", group " + std::to_string(q["group_size"].get<int64_t>());
  rows.emplace_back("quantization", scheme + " (" + q.value("quant_method", "") + ")");
  rows.emplace_back("  quantized", with_commas(q.value("n_modules", uint64_t{0})) + " layers, " +
                                       with_commas(q.value("n_quantized_params", uint64_t{0})) +
                                       " parameters");
  rows.emplace_back("  packed weights", gib_and_bytes(q.value("weight_bytes", uint64_t{0})));
  rows.emplace_back("  scales etc.", gib_and_bytes(q.value("aux_bytes", uint64_t{0})));
  rows.emplace_back("  left as is", gib_and_bytes(q.value("unquantized_bytes", uint64_t{0})));
  const std::string limit = q.value("tp_limited_by", "");
  if (!limit.empty()) rows.emplace_back("  TP limited by", limit);
}

// A mixture of experts: the counts, the parameters a token uses and the expert-parallel degree.
void add_moe_rows(const MoeInfo& m, std::vector<std::pair<std::string, std::string>>& rows) {
  std::string experts = std::to_string(m.n_experts) + " routed";
  if (m.experts_per_token) experts += ", " + std::to_string(*m.experts_per_token) + " per token";
  if (m.n_shared_experts) experts += ", " + std::to_string(m.n_shared_experts) + " shared";
  rows.emplace_back("experts", experts);
  rows.emplace_back("  MoE layers",
                    std::to_string(m.n_moe_layers) +
                        (m.layout.empty() ? " (no expert tensors stored)" : " (" + m.layout + ")"));
  rows.emplace_back("  expert params",
                    with_commas(m.expert_params) + " in " + gib_and_bytes(m.expert_bytes));
  if (m.shared_expert_params)
    rows.emplace_back("  shared experts", with_commas(m.shared_expert_params) + " parameters");
  rows.emplace_back("active params",
                    m.active_params ? with_commas(*m.active_params) + " per token" : "unknown");
  rows.emplace_back("max EP degree", m.max_ep_size ? std::to_string(m.max_ep_size) : "-");
}

int run(const Options& o) {
  std::optional<std::string> dtype;
  if (*o.dtype_opt) dtype = o.dtype;
  CheckpointInfo info =
      describe_checkpoint(o.ref, dtype, o.requested_revision(), KeyOptions{o.allow_local_paths});
  if (o.json) {
    std::cout << to_json(info).dump(2) << "\n";
    return 0;
  }
  std::vector<std::pair<std::string, std::string>> rows;
  rows.emplace_back("checkpoint", info.repo_id ? *info.repo_id : o.ref);
  rows.emplace_back("directory", info.dir);
  rows.emplace_back("revision", info.revision ? *info.revision : "-");
  rows.emplace_back("files", std::to_string(info.n_files));
  rows.emplace_back("tensors", with_commas(info.n_tensors));
  rows.emplace_back("parameters", info.n_params ? with_commas(*info.n_params) : "unknown");
  rows.emplace_back("dtype", dtype ? info.dtype : info.dtype + " (as stored)");
  rows.emplace_back("size", info.size_bytes ? gib_and_bytes(*info.size_bytes) : "unknown");
  rows.emplace_back("stored", gib_and_bytes(info.stored_bytes));
  if (info.n_buffer_elements) {
    rows.emplace_back("buffers", with_commas(info.n_buffer_elements) +
                                     " elements of non-parameter buffers (not counted)");
  }
  rows.emplace_back("config", info.config ? config_summary(*info.config) : "none (no config.json)");
  if (info.config_error) rows.emplace_back("  unreadable", info.config_error->message);
  rows.emplace_back("max TP degree", info.max_tp_size ? std::to_string(*info.max_tp_size) : "-");
  if (info.moe) add_moe_rows(*info.moe, rows);
  if (info.quantization) add_quantization_rows(*info.quantization, rows);
  print_rows(rows);
  return 0;
}

}  // namespace

std::function<int()> setup_describe(CLI::App& sub) {
  auto o = std::make_shared<Options>();
  add_ref_argument(sub, *o,
                   "checkpoint directory, .safetensors file, index.json, HF repo id or model key");
  o->dtype_opt = sub.add_option(
      "--dtype", o->dtype,
      "size for this dtype or quantization (bfloat16, nf4, ...); default: as stored");
  add_revision_option(sub, *o, "branch, tag or commit hash of an HF repo id");
  add_output_and_key_flags(sub, *o);
  return [o] { return run(*o); };
}

}  // namespace cli
}  // namespace metaload
