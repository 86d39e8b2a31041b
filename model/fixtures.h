// Deterministic checkpoints of the built-in (or any GPT-2 / Llama-family) configs in the Hugging
// Face layout: config.json + model.safetensors, or shards + model.safetensors.index.json, written
// to a directory or into a hub cache tree. What `metaload make-checkpoint`, the tests and the demo
// use. Torch-free: values come from a counter-based generator, so any byte of any tensor is
// computed on its own and the project's streaming writer never holds a tensor in memory.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "loader/format/safetensors.h"
#include "model/errors.h"

namespace metaload {

enum class FixtureLayout {
  // Names as the published checkpoints store them: GPT-2 without the "transformer." prefix (it was
  // saved from GPT2Model); Llama-family names are the module names. What the hub serves.
  kPublished,
  // Names as transformers' save_pretrained writes them today: the module names
  // ("transformer.wte.weight"); tied weights once, under the input embedding's name.
  kSaved,
};

struct FixtureOptions {
  // "gpt2" or "llama" (Llama, Mistral, Qwen2 configs); must agree with the config. Empty: any.
  std::string arch;
  // A built-in config name (model/families: gpt2, llama-tiny, ...) or a config.json path.
  std::string config;
  // F32, F16 or BF16.
  DType dtype = DType::F32;
  // 1: one model.safetensors; N > 1: N shards balanced by bytes plus the index.
  int shards = 1;
  uint64_t seed = 0;
  FixtureLayout layout = FixtureLayout::kPublished;
  // Also store the buffers older checkpoints carry (GPT-2's h.N.attn.bias causal masks, Llama's
  // rotary_emb.inv_freq), with their true values; loaders must ignore them.
  bool buffers = false;
  // When set, write into the hub cache `hf_cache` as repo `repo` (models--ORG--NAME/blobs named by
  // SHA-256, snapshots/<commit>/ as symlinks into blobs, refs/<branch>) instead of a plain
  // directory. A repo folder make_checkpoint creates gets a `.metaload-fixture` marker; an existing
  // refs/<branch> of a repo without one (a real download) is never repointed: FixtureError.
  std::string hf_cache;
  std::string repo;
  // The ref pointed at the snapshot, as the hub lays refs out: a branch or a tag ("main", "v1.0",
  // "feature/x": refs/<name>) or a pull request's "refs/pr/N" (refs/refs/pr/N).
  std::string branch = "main";
};

struct FixtureResult {
  std::string dir;                    // the checkpoint directory (a snapshot for the hub cache)
  std::vector<std::string> files;     // every file written, config.json first, full paths
  std::optional<std::string> commit;  // the snapshot's 40-hex commit (hub cache only)
  std::string config_name;            // the config it was made from ("builtin:gpt2" or a path)
  uint64_t n_tensors = 0;
  uint64_t n_params = 0;    // parameter elements stored (buffers excluded)
  uint64_t data_bytes = 0;  // tensor bytes written
  double seconds = 0;
};

// Writes the checkpoint. `out_dir` (created if missing) must be empty unless hf_cache is set, in
// which case it must be empty (""). The bytes are a function of the options alone: the same
// options write the same files on every run and machine.
FixtureResult make_checkpoint(const FixtureOptions& options, const std::string& out_dir = "");

// The value the fixture stores at element `index` of tensor `name` (any layout's name), before
// rounding to the file dtype; `shape` is the stored shape, `model_type` the config's. Exposed so
// tests can check values without reading files.
//   embeddings (wte, wpe, embed_tokens): uniform, std 0.25
//   matrices: uniform, std 2/sqrt(fan_in) (Conv1D [in, out]: shape[0]; Linear [out, in]:
//     shape[1]), so activations stay O(1) through every layer, the logits spread and greedy
//     decoding depends on its input (fixtures.cc says what smaller values did)
//   norm weights: 1 + uniform(-0.2, 0.2); biases: uniform(-0.1, 0.1)
//   buffers: their true values (causal mask 1/0 below/above the diagonal; rotary inv_freq)
float fixture_value(const std::string& name, const std::vector<int64_t>& shape,
                    const std::string& model_type, double rope_theta, uint64_t seed,
                    uint64_t index);

// The SHA-256 of a file's bytes, 64 lowercase hex digits: the name the hub gives a blob of an LFS
// file (its `blobs/` entry), so a fixture's cache tree reads like a downloaded one.
std::string file_sha256(const std::string& path);

}  // namespace metaload
