// metaload make-checkpoint --arch gpt2|llama --config NAME|FILE [--dtype D] [--shards N]
//   [--seed S] [--layout published|saved] [--buffers] [--hf-cache DIR --repo ORG/NAME
//   [--branch B]] [--json] [OUT]
// Writes a deterministic checkpoint (model/fixtures.h): same options, same bytes.
#include <iostream>
#include <memory>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "identity/dtypes.h"
#include "model/fixtures.h"
#include "tools/cli/torch/torch_cli.h"

namespace metaload {
namespace cli {
namespace {

struct Options {
  std::string arch, config, dtype = "float32", layout = "published", hf_cache, repo,
                            branch = "main", out;
  int shards = 1;
  uint64_t seed = 0;
  bool buffers = false, json = false;
};

int run(const Options& o) {
  FixtureOptions f;
  f.arch = o.arch;
  f.config = o.config;
  const DTypeEntry& e = resolve_dtype_name(o.dtype);  // DTypeError lists the accepted names
  if (!e.file_dtype ||
      (*e.file_dtype != DType::F32 && *e.file_dtype != DType::F16 && *e.file_dtype != DType::BF16))
    throw UsageError(fmt::format(
        "--dtype {}: checkpoints are written as float32, float16 or bfloat16", o.dtype));
  f.dtype = *e.file_dtype;
  f.shards = o.shards;
  f.seed = o.seed;
  f.layout = o.layout == "saved" ? FixtureLayout::kSaved : FixtureLayout::kPublished;
  f.buffers = o.buffers;
  f.hf_cache = o.hf_cache;
  f.repo = o.repo;
  f.branch = o.branch;
  const FixtureResult r = make_checkpoint(f, o.out);
  if (o.json) {
    std::cout << nlohmann::json{{"dir", r.dir},
                                {"files", r.files},
                                {"commit", r.commit ? nlohmann::json(*r.commit) : nlohmann::json()},
                                {"config", r.config_name},
                                {"n_tensors", r.n_tensors},
                                {"n_params", r.n_params},
                                {"data_bytes", r.data_bytes},
                                {"seconds", r.seconds}}
                     .dump(2)
              << "\n";
    return 0;
  }
  std::vector<std::pair<std::string, std::string>> rows;
  rows.emplace_back("directory", r.dir);
  if (r.commit) rows.emplace_back("commit", *r.commit + " (refs/" + o.branch + ")");
  rows.emplace_back("config", r.config_name);
  rows.emplace_back("files", std::to_string(r.files.size()));
  rows.emplace_back("tensors", with_commas(r.n_tensors));
  rows.emplace_back("parameters", with_commas(r.n_params));
  rows.emplace_back("data", gib_and_bytes(r.data_bytes));
  rows.emplace_back("time", fmt::format("{:.2f} s ({:.2f} GB/s)", r.seconds,
                                        r.seconds > 0 ? r.data_bytes / r.seconds / 1e9 : 0.0));
  print_rows(rows);
  return 0;
}

}  // namespace

std::function<int()> setup_make_checkpoint(CLI::App& sub) {
  auto o = std::make_shared<Options>();
  sub.add_option("--arch", o->arch, "model family: gpt2, or llama (Llama, Mistral, Qwen2)")
      ->required()
      ->check(CLI::IsMember({"gpt2", "llama"}));
  sub.add_option("--config", o->config, "a built-in config (gpt2, llama-tiny, ...) or config.json")
      ->required();
  sub.add_option("--dtype", o->dtype, "float32, float16 or bfloat16")->capture_default_str();
  sub.add_option("--shards", o->shards, "N > 1: N shards + model.safetensors.index.json")
      ->capture_default_str()
      ->transform(whole_number(1, 100000));
  sub.add_option("--seed", o->seed, "seed of the weights")
      ->capture_default_str()
      ->transform(whole_number_u64());
  sub.add_option("--layout", o->layout,
                 "tensor names: published (as on the hub: GPT-2 without 'transformer.') or "
                 "saved (as save_pretrained writes them)")
      ->capture_default_str()
      ->check(CLI::IsMember({"published", "saved"}));
  sub.add_flag("--buffers", o->buffers,
               "also store the buffers old checkpoints carry (GPT-2 masks, rotary inv_freq)");
  sub.add_option("--hf-cache", o->hf_cache, "write into this Hugging Face hub cache instead");
  sub.add_option("--repo", o->repo, "the repo id (ORG/NAME) in --hf-cache");
  sub.add_option("--branch", o->branch,
                 "the ref to point at the snapshot: a branch or tag (main, v1.0) or refs/pr/N")
      ->capture_default_str();
  sub.add_flag("--json", o->json, "print JSON instead of a table");
  sub.add_option("out", o->out, "output directory (new or empty); not with --hf-cache");
  return [o] { return run(*o); };
}

}  // namespace cli
}  // namespace metaload
