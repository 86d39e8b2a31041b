// metaload demo [--data DIR] [--repo ORG/NAME] [--config NAME] [--batch B --seq S]
//   [--new-tokens N] [--device D] [--threads N] [--progress]
// The main job on the embedded default (GPT-2 124M, the real gpt2 config, deterministic weights in
// a hub cache tree under DIR/hf-cache, created on the first run): describe, model key, TP degree,
// meta build, scan, dispatch, greedy generation, and a summary. Every number is measured here.
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <memory>
#include <sstream>

#include <fmt/format.h>

#include "loader/engine/engine.h"
#include "loader/format/hf_cache.h"
#include "identity/describe.h"
#include "model/fixtures.h"
#include "identity/model_key.h"
#include "identity/registry.h"
#include "identity/tp_degree.h"
#include "model/transformers_model.h"
#include "tools/cli/torch/torch_cli.h"

namespace metaload {
namespace cli {
namespace {

struct Options {
  std::string data = "data", repo = "openai-community/gpt2", config = "gpt2", device = "cpu";
  std::string prompt = "464,2068,7586,21831,18045,625,262,16931";
  int64_t batch = 4, seq = 128, new_tokens = 16;
  int threads = 0;
  bool progress = false;  // the bar even when stderr is no terminal
};

double since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void heading(const std::string& title) {
  std::cout << "\n== " << title << "\n" << std::flush;
}

std::string ms(double s) {
  return s < 1.0 ? fmt::format("{:.1f} ms", s * 1e3) : fmt::format("{:.2f} s", s);
}

using Summary = std::vector<std::pair<std::string, std::string>>;  // step -> what was measured

// The prompt's token ids, checked before any work (the default too).
std::vector<int64_t> checked_prompt(const Options& o) {
  std::vector<std::vector<int64_t>> prompt_rows;
  if (const std::string bad = parse_token_ids(o.prompt, /*several=*/false, &prompt_rows);
      !bad.empty())
    throw UsageError("--prompt: " + bad);
  return std::move(prompt_rows.front());
}

// The demo's own hub cache: repo ids resolve there (and nowhere else) in this process. The
// checkpoint is made there on the first run.
void prepare_checkpoint(const Options& o, Summary& summary) {
  if (::mkdir(o.data.c_str(), 0755) != 0 && errno != EEXIST)
    throw UsageError(fmt::format("--data {}: cannot create it: {}", o.data, std::strerror(errno)));
  char abs[PATH_MAX];
  if (!::realpath(o.data.c_str(), abs))
    throw UsageError(fmt::format("--data {}: no such directory", o.data));
  FixtureOptions f;
  f.config = o.config;
  f.hf_cache = std::string(abs) + "/hf-cache";
  f.repo = o.repo;
  ::setenv("HF_HUB_CACHE", f.hf_cache.c_str(), 1);
  std::vector<std::string> looked;
  if (try_resolve_hf_snapshot(o.repo, std::nullopt, looked)) return;
  heading(fmt::format("Creating the embedded default once: {} ({} config, deterministic weights)",
                      o.repo, o.config));
  const FixtureResult r = make_checkpoint(f);
  std::cout << fmt::format("wrote {} ({} parameters) in {:.2f} s ({:.2f} GB/s) to {}\n",
                           human_bytes(r.data_bytes), with_commas(r.n_params), r.seconds,
                           r.data_bytes / r.seconds / 1e9, r.dir);
  summary.emplace_back("create checkpoint", fmt::format("{}, {:.2f} s (first run only)",
                                                        human_bytes(r.data_bytes), r.seconds));
}

CheckpointInfo describe_step(const Options& o, Summary& summary) {
  heading(fmt::format("describe {} (headers and config.json only)", o.repo));
  const auto t = std::chrono::steady_clock::now();
  const CheckpointInfo info = describe_checkpoint(o.repo);
  const double describe_s = since(t);
  std::vector<std::pair<std::string, std::string>> rows;
  rows.emplace_back("checkpoint", info.repo_id ? *info.repo_id : o.repo);
  rows.emplace_back("revision", info.revision ? *info.revision : "-");
  rows.emplace_back("directory", info.dir);
  rows.emplace_back("files", std::to_string(info.n_files));
  rows.emplace_back("tensors", with_commas(info.n_tensors));
  rows.emplace_back("parameters", info.n_params ? with_commas(*info.n_params) : "unknown");
  rows.emplace_back("dtype", info.dtype);
  rows.emplace_back("size", info.size_bytes ? gib_and_bytes(*info.size_bytes) : "unknown");
  rows.emplace_back("time", ms(describe_s));
  print_rows(rows);
  summary.emplace_back(
      "describe", fmt::format("{} parameters, {}",
                              info.n_params ? with_commas(*info.n_params) : "?", ms(describe_s)));
  return info;
}

std::string model_key_step(const Options& o, Summary& summary) {
  heading("model key");
  const auto t = std::chrono::steady_clock::now();
  const std::string key = to_model_key(ModelKey{kTransformersModel, o.repo, std::nullopt, {}});
  const ModelKey back = from_model_key(key);
  const double key_s = since(t);
  std::cout << key << "\n"
            << fmt::format("(parsed back: class {}, repo_id {}, revision {}; {})\n",
                           canonical_model_class(back.class_path), back.repo_id,
                           back.revision ? *back.revision : "null", ms(key_s));
  summary.emplace_back("model key", key);
  return key;
}

void tp_step(const CheckpointInfo& info, Summary& summary) {
  heading("tensor parallelism");
  std::string tp_line = "no config.json";
  if (info.config) {
    const auto max = max_tp_size(*info.config);
    std::string degrees;
    for (int64_t d : tp_degrees(*info.config))
      degrees += (degrees.empty() ? "" : ", ") + std::to_string(d);
    tp_line = max ? fmt::format("max degree {} (degrees {})", *max, degrees)
                  : std::string("cannot be split (gcd of heads, kv heads, MLP size is 1)");
    if (max) tp_line += fmt::format("; for 4 GPUs: {}", tp_degree_for(*info.config, 4));
  }
  std::cout << tp_line << "\n";
  summary.emplace_back("TP degree", tp_line);
}

std::shared_ptr<TransformersModel> build_step(const std::string& key, const ModelOptions& mo,
                                              Summary& summary) {
  heading("meta build from the model key (config.json only)");
  const uint64_t rss0 = rss_bytes();
  const auto t = std::chrono::steady_clock::now();
  std::shared_ptr<TransformersModel> model = TransformersModel::from_model_key(key, mo);
  const double build_s = since(t);
  const uint64_t rss1 = rss_bytes();
  int64_t meta_params = 0, all_params = 0;
  uint64_t would_be = 0;
  for (const auto& p : model->module().parameters()) {
    ++all_params;
    if (p.is_meta()) ++meta_params;
  }
  for (const ParamSpec& p : model->module().parameter_specs())
    if (p.tied_to.empty()) {
      uint64_t n = 1;
      for (int64_t s : p.shape) n *= static_cast<uint64_t>(s);
      would_be += n * 4;
    }
  std::cout << fmt::format(
      "{}: {} parameters in {} tensors, all on meta ({} of {}); built in {}; RSS +{} (the "
      "weights would take {})\n",
      model->module().name(), with_commas(model->module().num_parameters()), all_params,
      meta_params, all_params, ms(build_s), human_bytes(rss1 > rss0 ? rss1 - rss0 : 0),
      human_bytes(would_be));
  summary.emplace_back("meta build", fmt::format("{}, RSS +{}", ms(build_s),
                                                 human_bytes(rss1 > rss0 ? rss1 - rss0 : 0)));
  return model;
}

void scan_step(TransformersModel& model, const Options& o, const c10::Device& device,
               Summary& summary) {
  heading(fmt::format("scan of a [{}, {}] batch on fake {} tensors (no weight read)", o.batch,
                      o.seq, device.str()));
  const ModelScan scan = model.scan(o.batch, o.seq);
  print_scan_table(scan, /*depth=*/3, /*collapse=*/true, std::cout);
  std::cout << fmt::format(
      "scan took {}; parameters still on meta: {}\n", ms(scan.seconds),
      model.parameter(model.module().named_parameters().begin()->key()).is_meta() ? "yes" : "no");
  summary.emplace_back(
      "scan", fmt::format("[{}, {}]: {} modules, {} of activations, {}", o.batch, o.seq,
                          scan.modules.size(), human_bytes(scan.total_bytes()), ms(scan.seconds)));
}

void dispatch_step(TransformersModel& model, const c10::Device& device, Summary& summary) {
  heading(
      fmt::format("dispatch to {} (the same Parameter objects receive the weights)", device.str()));
  const std::string probe = model.module().named_parameters().begin()->key();
  const at::Tensor held = model.parameter(probe);  // a reference taken before dispatch
  const LoadReport report = model.dispatch();
  const double gbps = report.seconds > 0 ? report.bytes / report.seconds / 1e9 : 0.0;
  // Zero-copy bytes are mapped from the page cache and only their pages populated, so their rate
  // is no streaming rate: say which it is.
  const uint64_t copied = report.bytes - std::min(report.bytes, report.mapped_bytes);
  const std::string how = report.mapped_bytes == 0 ? "copied"
                          : copied == 0
                              ? "zero-copy: mapped from the page cache, nothing copied"
                              : fmt::format("{} zero-copy (mapped), {} copied",
                                            human_bytes(report.mapped_bytes), human_bytes(copied));
  std::cout << fmt::format(
      "loaded {} in {:.2f} s: {:.2f} GB/s {} ({} engine, {} threads, {} reads)\n",
      human_bytes(report.bytes), report.seconds, gbps, how, report.engine, report.threads,
      report.reads);
  std::cout << fmt::format("{} taken before dispatch: now on {}, {} (mean |w| {:.4f})\n", probe,
                           held.device().str(), held.is_meta() ? "still meta" : "real",
                           held.is_meta() ? 0.0 : held.abs().mean().item<double>());
  summary.emplace_back("dispatch", fmt::format("{} in {:.2f} s, {:.2f} GB/s {}, RSS {}",
                                               human_bytes(report.bytes), report.seconds, gbps,
                                               report.mapped_bytes == 0 ? "copied"
                                               : copied == 0            ? "zero-copy"
                                                                        : "partly zero-copy",
                                               human_bytes(rss_bytes())));
}

void generate_step(TransformersModel& model, const Options& o, const std::vector<int64_t>& prompt,
                   Summary& summary) {
  heading(fmt::format("greedy generation of {} tokens", o.new_tokens));
  const at::Tensor ids = at::tensor(prompt, at::kLong).unsqueeze(0);
  auto capture = model.capture("");  // the logits of every step
  const auto t = std::chrono::steady_clock::now();
  const at::Tensor out = model.generate(ids, o.new_tokens).cpu();
  const double gen_s = since(t);
  std::string toks;
  for (int64_t i = ids.size(1); i < out.size(1); ++i)
    toks += (toks.empty() ? "" : ",") + std::to_string(out[0][i].item<int64_t>());
  std::cout << "prompt " << o.prompt << "\nnew    " << toks << "\n"
            << fmt::format("{} tokens in {:.2f} s ({:.1f} tokens/s; {} forwards observed)\n",
                           o.new_tokens, gen_s, o.new_tokens / gen_s, capture.count());
  summary.emplace_back("generate", fmt::format("{} tokens in {:.2f} s ({:.1f} tokens/s)",
                                               o.new_tokens, gen_s, o.new_tokens / gen_s));
}

int run(const Options& o) {
  const auto t_all = std::chrono::steady_clock::now();
  const std::vector<int64_t> prompt = checked_prompt(o);
  Summary summary;
  prepare_checkpoint(o, summary);
  const CheckpointInfo info = describe_step(o, summary);
  const std::string key = model_key_step(o, summary);
  tp_step(info, summary);
  ModelOptions mo;
  mo.device = parse_device(o.device, "--device");
  mo.threads = o.threads;
  mo.engine.bar = o.progress ? ProgressBar::kOn : ProgressBar::kAuto;
  std::shared_ptr<TransformersModel> model = build_step(key, mo, summary);
  scan_step(*model, o, mo.device, summary);
  dispatch_step(*model, mo.device, summary);
  generate_step(*model, o, prompt, summary);
  heading("summary");
  summary.emplace_back("total", fmt::format("{:.2f} s in this process, peak RSS {}", since(t_all),
                                            human_bytes(rss_bytes())));
  print_rows(summary);
  return 0;
}

}  // namespace

std::function<int()> setup_demo(CLI::App& sub) {
  auto o = std::make_shared<Options>();
  sub.add_option("--data", o->data, "data directory (its hf-cache/ holds the checkpoint)")
      ->capture_default_str();
  sub.add_option("--repo", o->repo, "repo id of the embedded default")->capture_default_str();
  sub.add_option("--config", o->config, "config of the embedded default, if it must be made")
      ->capture_default_str();
  sub.add_option("--batch", o->batch, "scan batch")
      ->capture_default_str()
      ->transform(whole_number(1, INT64_MAX));
  sub.add_option("--seq", o->seq, "scan sequence length")
      ->capture_default_str()
      ->transform(whole_number(1, INT64_MAX));
  sub.add_option("--new-tokens", o->new_tokens, "tokens to generate")
      ->capture_default_str()
      ->transform(whole_number(0, INT_MAX));
  sub.add_option("--prompt", o->prompt, "prompt token ids")
      ->capture_default_str()
      ->check(token_ids(/*several=*/false));
  sub.add_option("--device", o->device, "dispatch device")->capture_default_str();
  sub.add_option("--threads", o->threads, "loader threads (default: the cores)")
      ->transform(whole_number(0, kMaxLoaderThreads));
  sub.add_flag("--progress", o->progress,
               "draw the dispatch's progress bar even when stderr is not a terminal");
  return [o] { return run(*o); };
}

}  // namespace cli
}  // namespace metaload
