// bench/meta_build: how fast and how small is a skeleton?
//
// Builds Llama-2-7B- and Llama-2-70B-shaped decoder module trees (torch::nn, the published
// configs' sizes) under MetaMode, and measures the forced-factory overhead against the anchor
// measured in the same run: a direct at::empty(..., kMeta), the cheapest way to make a meta tensor.
#include <ATen/ATen.h>
#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "c10_ext/meta_mode.h"

namespace mb = metaload::bench;

namespace {

struct Shape {
  const char* name;
  int64_t vocab, hidden, intermediate, layers, heads, kv_heads;
  int64_t published_params;
};

struct RMSNorm : torch::nn::Module {
  explicit RMSNorm(int64_t n) { weight = register_parameter("weight", torch::ones({n})); }
  torch::Tensor weight;
};

struct Attention : torch::nn::Module {
  Attention(const Shape& s) {
    const int64_t head_dim = s.hidden / s.heads;
    q_proj = register_module(
        "q_proj", torch::nn::Linear(torch::nn::LinearOptions(s.hidden, s.hidden).bias(false)));
    k_proj = register_module(
        "k_proj",
        torch::nn::Linear(torch::nn::LinearOptions(s.hidden, s.kv_heads * head_dim).bias(false)));
    v_proj = register_module(
        "v_proj",
        torch::nn::Linear(torch::nn::LinearOptions(s.hidden, s.kv_heads * head_dim).bias(false)));
    o_proj = register_module(
        "o_proj", torch::nn::Linear(torch::nn::LinearOptions(s.hidden, s.hidden).bias(false)));
  }
  torch::nn::Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};
};

struct MLP : torch::nn::Module {
  MLP(const Shape& s) {
    gate_proj = register_module(
        "gate_proj",
        torch::nn::Linear(torch::nn::LinearOptions(s.hidden, s.intermediate).bias(false)));
    up_proj = register_module(
        "up_proj",
        torch::nn::Linear(torch::nn::LinearOptions(s.hidden, s.intermediate).bias(false)));
    down_proj = register_module(
        "down_proj",
        torch::nn::Linear(torch::nn::LinearOptions(s.intermediate, s.hidden).bias(false)));
  }
  torch::nn::Linear gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};
};

struct DecoderLayer : torch::nn::Module {
  DecoderLayer(const Shape& s) {
    register_module("self_attn", std::make_shared<Attention>(s));
    register_module("mlp", std::make_shared<MLP>(s));
    register_module("input_layernorm", std::make_shared<RMSNorm>(s.hidden));
    register_module("post_attention_layernorm", std::make_shared<RMSNorm>(s.hidden));
  }
};

struct Decoder : torch::nn::Module {
  Decoder(const Shape& s) {
    register_module("embed_tokens", torch::nn::Embedding(s.vocab, s.hidden));
    auto layers = torch::nn::ModuleList();
    for (int64_t i = 0; i < s.layers; ++i) layers->push_back(std::make_shared<DecoderLayer>(s));
    register_module("layers", layers);
    register_module("norm", std::make_shared<RMSNorm>(s.hidden));
  }
};

struct CausalLM : torch::nn::Module {
  CausalLM(const Shape& s) {
    register_module("model", std::make_shared<Decoder>(s));
    register_module("lm_head",
                    torch::nn::Linear(torch::nn::LinearOptions(s.hidden, s.vocab).bias(false)));
  }
};

struct BuildResult {
  double median_s;
  long rss_growth;
  int64_t params;
  size_t tensors;
  bool all_meta;
};

BuildResult build(const Shape& s, int reps) {
  std::vector<double> times;
  BuildResult r{};
  for (int i = 0; i < reps; ++i) {
    const long rss0 = mb::rss_bytes();
    const double t0 = mb::now_s();
    std::shared_ptr<CausalLM> model;
    {
      metaload::MetaMode mode;
      model = std::make_shared<CausalLM>(s);
    }
    times.push_back(mb::now_s() - t0);
    const long grew = mb::rss_bytes() - rss0;  // with the whole tree alive
    r.rss_growth = std::max(r.rss_growth, grew);
    if (i == 0) {
      r.all_meta = true;
      for (const auto& p : model->parameters()) {
        r.params += p.numel();
        r.all_meta = r.all_meta && p.is_meta();
        ++r.tensors;
      }
    }
  }
  r.median_s = mb::median(times);
  return r;
}

// Median over `rounds` of the mean time per call of `calls` calls of fn.
template <typename F>
double per_call_s(F fn, int calls, int rounds) {
  std::vector<double> v;
  for (int r = 0; r < rounds; ++r) {
    const double t0 = mb::now_s();
    for (int i = 0; i < calls; ++i) fn();
    v.push_back((mb::now_s() - t0) / calls);
  }
  return mb::median(v);
}

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 7;
  const Shape shapes[] = {
      {"Llama-2-7B", 32000, 4096, 11008, 32, 32, 32, 6738415616},
      {"Llama-2-70B", 32000, 8192, 28672, 80, 64, 8, 68976648192},
  };
  const int calls = 20000, rounds = 7;
  const auto meta = at::TensorOptions().device(at::kMeta);

  // Per-call costs, interleaved: every round measures every row once (the machine's noise then
  // hits all rows alike). Row 0 is the anchor, the cheapest meta tensor.
  struct Row {
    const char* name;
    std::function<void()> fn;
    bool forced;  // runs under MetaMode
    bool target;  // a forced factory: the <= 4x target applies
    std::vector<double> s;
  };
  at::Tensor src = at::empty({64, 64});
  at::Tensor meta_src = at::empty({64, 64}, meta);
  std::vector<Row> rows = {
      {"anchor: at::empty(kMeta) direct",
       [&] {
         at::empty({4096, 4096}, meta);
       },
       false, false},
      {"at::empty under MetaMode",
       [] {
         at::empty({4096, 4096});
       },
       true, true},
      {"at::zeros(kMeta) direct",
       [&] {
         at::zeros({4096, 4096}, meta);
       },
       false, false},
      {"at::zeros under MetaMode",
       [] {
         at::zeros({4096, 4096});
       },
       true, true},
      {"at::ones under MetaMode",
       [] {
         at::ones({4096, 4096});
       },
       true, true},
      {"at::randn under MetaMode",
       [] {
         at::randn({4096, 4096});
       },
       true, true},
      {"at::empty_like under MetaMode", [&] { at::empty_like(src); }, true, true},
      {"meta.to(kHalf) direct", [&] { meta_src.to(at::kHalf); }, false, false},
      {"tensor.to(kCUDA) under MetaMode", [&] { src.to(at::kCUDA); }, true, false},
  };
  for (int r = 0; r < rounds; ++r) {
    for (auto& row : rows) {
      std::optional<metaload::MetaMode> mode;
      if (row.forced) mode.emplace();
      const double t0 = mb::now_s();
      for (int i = 0; i < calls; ++i) row.fn();
      row.s.push_back((mb::now_s() - t0) / calls);
    }
  }
  const double direct = mb::median(rows[0].s);

  (void)build(shapes[0], 1);  // warm up code paths and allocator caches
  std::printf(
      "metaload bench/meta_build (medians; ratios are against the anchor measured in this "
      "run)\n\n");
  std::printf("%-34s %12s %10s %8s\n", "per-factory cost", "us/call", "x anchor", "<= 4x");
  for (const auto& row : rows) {
    const double t = mb::median(row.s);
    std::printf("%-34s %12.3f %10.2f %8s\n", row.name, t * 1e6, t / direct,
                !row.target         ? ""
                : t / direct <= 4.0 ? "ok"
                                    : "MISSED");
  }
  std::printf("\n%-12s %10s %10s %12s %12s %14s %8s\n", "skeleton", "tensors", "params",
              "median ms", "RSS +MiB", "x (n*anchor)", "on meta");
  for (const auto& s : shapes) {
    const BuildResult r = build(s, reps);
    // Ratio to the bare minimum: one direct meta empty per tensor of the tree.
    const double floor_s = direct * r.tensors;
    std::printf("%-12s %10zu %9.2fB %12.2f %12.2f %14.1f %8s\n", s.name, r.tensors, r.params / 1e9,
                r.median_s * 1e3, mb::mib(r.rss_growth), r.median_s / floor_s,
                r.all_meta ? "yes" : "NO");
    if (r.params != s.published_params) {
      std::printf("  (params differ from the published %lld)\n", (long long)s.published_params);
    }
  }
  std::printf("\npeak RSS of this process: %.1f MiB\n", mb::mib(mb::peak_rss_bytes()));
  std::printf(
      "targets: 70B skeleton < 50 ms and < 16 MiB RSS growth; forced factories <= 4x anchor\n");
  return 0;
}
