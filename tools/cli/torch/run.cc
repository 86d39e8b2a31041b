// metaload run REF --ids 1,2,3[;4,5,6] --new-tokens N [--device D] [--dtype T] [--threads N]
//   [--revision R] [--tp N [--timeout S]] [--json]
// Builds the model on meta, loads the weights (a progress bar on a terminal), generates greedily
// and prints the new tokens of each sequence.
//
// --tp N > 1 runs N tensor-parallel ranks on torch.distributed: the ranks are Python processes
// (`python -m metaload.tp_run`, which this command execs), because the process group is
// torch.distributed's own -- gloo's C++ headers ship with neither torch, so C++ alone cannot make
// a gloo group. The Python is METALOAD_PYTHON, else the one the library was built for; it starts N
// local ranks, or joins a torchrun launch (RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT set).
#include <dlfcn.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <memory>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "loader/engine/engine.h"
#include "model/transformers_model.h"
#include "tools/cli/torch/torch_cli.h"

namespace metaload {
namespace cli {
namespace {

struct Options : ModelBuildArgs {
  std::string ids;
  int64_t new_tokens = 16;
  int threads = 0;
  int tp = 1;
  double timeout = 300;
};

#ifndef METALOAD_DEFAULT_PYTHON
// Debian's, with its torch 1.13: what Bazel's default build links (CMake names its own).
#define METALOAD_DEFAULT_PYTHON "/usr/bin/python3"
#endif

// The file libmetaload.so was loaded from.
std::string this_library() {
  Dl_info info;
  if (::dladdr(reinterpret_cast<void*>(&this_library), &info) && info.dli_fname)
    return info.dli_fname;
  return "";
}

// The python/ folder of the source tree the library was built from (a build folder or Bazel's
// execroot lies below it), or "" (an installed package is importable anyway).
std::string package_dir(std::string from) {
  for (int up = 0; up < 8 && !from.empty(); ++up) {
    const size_t slash = from.find_last_of('/');
    from = slash == std::string::npos ? "" : from.substr(0, slash);
    struct stat st;
    if (::stat((from + "/python/metaload/__init__.py").c_str(), &st) == 0) return from + "/python";
  }
  return "";
}

// Replaces this process with `python -m metaload.tp_run ...` (returns only if that fails).
int run_tensor_parallel(const Options& o) {
  std::vector<std::string> args = {
      o.ref,    "--tp",         std::to_string(o.tp),         "--ids",
      o.ids,    "--new-tokens", std::to_string(o.new_tokens), "--device",
      o.device, "--timeout",    fmt::format("{}", o.timeout)};
  if (!o.dtype.empty()) args.insert(args.end(), {"--dtype", o.dtype});
  if (const auto r = o.requested_revision()) args.insert(args.end(), {"--revision", *r});
  if (o.json) args.push_back("--json");
  if (o.allow_local_paths) args.push_back("--allow-local-paths");
  return exec_python_module("metaload.tp_run", args, "metaload run --tp " + std::to_string(o.tp));
}

// "1,2,3;4,5,6" -> [[1,2,3],[4,5,6]] (sequences of one length; tools/cli/numbers.cc).
at::Tensor parse_ids(const std::string& text) {
  std::vector<std::vector<int64_t>> rows;
  if (const std::string bad = parse_token_ids(text, /*several=*/true, &rows); !bad.empty())
    throw UsageError("--ids: " + bad);
  at::Tensor ids = at::empty(
      {static_cast<int64_t>(rows.size()), static_cast<int64_t>(rows[0].size())}, at::kLong);
  for (size_t i = 0; i < rows.size(); ++i)
    for (size_t j = 0; j < rows[i].size(); ++j) ids[i][j] = rows[i][j];
  return ids;
}

int run(const Options& o) {
  if (o.tp > 1) return run_tensor_parallel(o);
  const at::Tensor ids = parse_ids(o.ids);
  ModelOptions mo = o.model_options();
  mo.threads = o.threads;
  TransformersModel model(o.ref, mo);
  const LoadReport report = model.dispatch();
  const auto t0 = std::chrono::steady_clock::now();
  const at::Tensor out = model.generate(ids, o.new_tokens).cpu();
  const double gen_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const at::Tensor fresh = out.narrow(1, ids.size(1), o.new_tokens).contiguous();
  std::vector<std::vector<int64_t>> tokens;
  for (int64_t b = 0; b < fresh.size(0); ++b) {
    const at::Tensor row = fresh[b];
    tokens.emplace_back(row.data_ptr<int64_t>(), row.data_ptr<int64_t>() + row.numel());
  }
  const double gbps = report.seconds > 0 ? report.bytes / report.seconds / 1e9 : 0.0;
  if (o.json) {
    std::cout << nlohmann::json{{"model", model.module().name()},
                                {"device", mo.device.str()},
                                {"dtype", torch_dtype_name(
                                              model.module().parameters().front().scalar_type())},
                                {"load_bytes", report.bytes},
                                {"load_seconds", report.seconds},
                                {"engine", report.engine},
                                {"generate_seconds", gen_s},
                                {"tokens", tokens}}
                     .dump(2)
              << "\n";
    return 0;
  }
  std::vector<std::pair<std::string, std::string>> rows;
  rows.emplace_back("model",
                    fmt::format("{} ({}), built on meta in {:.1f} ms", model.module().name(),
                                model.config_path(), model.build_seconds() * 1e3));
  // Mapped bytes are not copied: their rate is a mapping rate.
  rows.emplace_back("loaded", fmt::format("{} in {:.2f} s ({:.2f} GB/s, {}), {} engine, {} threads",
                                          human_bytes(report.bytes), report.seconds, gbps,
                                          report.mapped_bytes == 0 ? "copied"
                                          : report.mapped_bytes >= report.bytes
                                              ? "zero-copy"
                                              : human_bytes(report.mapped_bytes) + " zero-copy",
                                          report.engine, report.threads));
  const int64_t n = o.new_tokens * ids.size(0);
  rows.emplace_back("generated", fmt::format("{} tokens in {:.2f} s ({:.1f} tokens/s)", n, gen_s,
                                             gen_s > 0 ? n / gen_s : 0.0));
  print_rows(rows);
  for (const auto& seq : tokens) {
    std::string line;
    for (int64_t t : seq) line += (line.empty() ? "" : ",") + std::to_string(t);
    std::cout << line << "\n";
  }
  return 0;
}

}  // namespace

int exec_python_module(const std::string& module, const std::vector<std::string>& rest,
                       const std::string& command) {
  const char* env = std::getenv("METALOAD_PYTHON");
  const std::string python = env && *env ? env : METALOAD_DEFAULT_PYTHON;
  std::vector<std::string> args = {python, "-m", module};
  args.insert(args.end(), rest.begin(), rest.end());
  const std::string lib = this_library();
  // The Python side loads this very library (an explicit METALOAD_LIB stays as the user set it).
  if (!lib.empty()) ::setenv("METALOAD_LIB", lib.c_str(), /*overwrite=*/0);
  const std::string pkg = package_dir(lib);
  if (!pkg.empty()) {
    const char* old = std::getenv("PYTHONPATH");
    const std::string path = old && *old ? pkg + ":" + old : pkg;
    ::setenv("PYTHONPATH", path.c_str(), 1);
  }
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::cout.flush();
  ::execvp(python.c_str(), argv.data());
  std::cerr << command << ": error: it runs " << python << " -m " << module
            << ", which could not be started: " << std::strerror(errno)
            << " (set METALOAD_PYTHON to a Python with torch and metaload)\n";
  return 1;
}

std::function<int()> setup_run(CLI::App& sub) {
  auto o = std::make_shared<Options>();
  add_model_build_options(sub, *o, "cpu or cuda[:N]");
  sub.add_option("--ids", o->ids, "prompt token ids: 1,2,3 (several sequences: 1,2;3,4)")
      ->required()
      ->check(token_ids(/*several=*/true));
  sub.add_option("--new-tokens", o->new_tokens, "tokens to generate")
      ->capture_default_str()
      ->transform(whole_number(0, INT_MAX));
  sub.add_option("--threads", o->threads, "loader threads (default: the cores)")
      ->transform(whole_number(0, kMaxLoaderThreads));
  add_revision_option(sub, *o, "branch, tag or commit of a repo id");
  sub.add_option("--tp", o->tp,
                 "tensor-parallel ranks: N > 1 starts N local ranks over gloo (or joins a torchrun "
                 "launch), run by python -m metaload.tp_run")
      ->capture_default_str()
      ->transform(whole_number(1, 4096));
  sub.add_option("--timeout", o->timeout,
                 "with --tp: seconds a collective waits for the other ranks at most")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  add_output_and_key_flags(sub, *o);
  return [o] { return run(*o); };
}

}  // namespace cli
}  // namespace metaload
