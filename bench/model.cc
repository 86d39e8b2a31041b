// bench/model: the model layer against the pieces it is built from, on the GPT-2 124M fixture
// (made once in a temporary directory, or --keep DIR).
//   construction: TransformersModel(dir) vs reading config.json + build_causal_lm(config, meta)
//   scan:         TransformersModel::scan(8, 1024) vs metaload::scan of the module's forward
//   dispatch:     TransformersModel(dir).dispatch() vs metaload::load into a meta skeleton with
//                 the same names (the loader alone); rounds interleaved, fresh processes' memory
//                 is what both get (bench/RESULTS.md explains why that bounds a fresh load)
// Usage: model [--rounds N] [--keep DIR]
#include <sys/stat.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include "bench/bench_util.h"
#include "fake_mode/scan.h"
#include "loader/format/checkpoint.h"
#include "loader/load/plan.h"
#include "model/fixtures.h"
#include "model/transformers_model.h"

using namespace metaload;
using metaload::bench::median;
using metaload::bench::mib;
using metaload::bench::now_s;

namespace {

NameMapping names_of(const FamilyConfig& c) {
  NameMapping n;
  n.checkpoint_to_module = [c](const std::string& s) { return map_checkpoint_name(c, s); };
  n.tied = tied_parameter_groups(c);
  std::unordered_set<std::string> skip;
  for (const BufferSpec& b : buffer_specs(c)) skip.insert(b.name);
  n.skip = [skip](const std::string& s) { return skip.count(s) > 0; };
  return n;
}

void row(const char* what, double t, double anchor, const std::string& note) {
  std::printf("%-34s %10.2f ms %10.2f ms %8.2fx  %s\n", what, t * 1e3, anchor * 1e3, t / anchor,
              note.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = 5;
  std::string keep;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--rounds") && i + 1 < argc)
      rounds = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--keep") && i + 1 < argc)
      keep = argv[++i];
    else {
      std::fprintf(stderr, "usage: model [--rounds N] [--keep DIR]\n");
      return 2;
    }
  }
  std::string dir = keep;
  std::string tmp;
  if (dir.empty()) {
    char t[] = "/tmp/metaload-bench-model-XXXXXX";
    tmp = ::mkdtemp(t);
    dir = tmp + "/gpt2";
  }
  struct stat st;
  if (::stat((dir + "/model.safetensors").c_str(), &st) != 0) {
    FixtureOptions f;
    f.config = "gpt2";
    const FixtureResult r = make_checkpoint(f, dir);
    std::printf("fixture: gpt2 124M fp32, %.1f MiB written in %.2f s\n", mib(r.data_bytes),
                r.seconds);
  }
  const FamilyConfig config = load_family_config(dir + "/config.json");

  std::vector<double> build, build_anchor, scan, scan_anchor, disp, disp_anchor;
  double gbps = 0, gbps_anchor = 0;
  for (int r = 0; r < rounds; ++r) {
    // Construction, in alternating order.
    std::unique_ptr<TransformersModel> mp;
    std::shared_ptr<CausalLM> skeleton;
    auto model_build = [&] {
      const double t = now_s();
      mp = std::make_unique<TransformersModel>(dir);
      build.push_back(now_s() - t);
    };
    auto anchor_build = [&] {
      const double t = now_s();
      BuildOptions meta;
      meta.device = at::kMeta;
      meta.init_weights = false;
      skeleton =
          build_causal_lm(parse_family_config(read_config_json(dir + "/config.json"), dir), meta);
      build_anchor.push_back(now_s() - t);
    };
    if (r % 2) {
      anchor_build();
      model_build();
    } else {
      model_build();
      anchor_build();
    }
    TransformersModel& m = *mp;
    double t0;

    t0 = now_s();
    m.scan(8, 1024);
    scan.push_back(now_s() - t0);
    t0 = now_s();
    metaload::scan(
        [&](const std::vector<at::Tensor>& in) {
          return std::vector<at::Tensor>{skeleton->forward(in[0])};
        },
        {at::zeros({8, 1024}, at::TensorOptions().dtype(at::kLong).device(at::kMeta))}, at::kCPU);
    scan_anchor.push_back(now_s() - t0);

    // Interleaved: the loader alone, then the model layer (order alternates per round).
    auto loader_alone = [&] {
      LoadOptions lo;
      lo.names = names_of(config);
      lo.engine.bar = ProgressBar::kOff;
      const double t = now_s();
      const LoadReport rep = load(*skeleton, dir, lo);
      disp_anchor.push_back(now_s() - t);
      gbps_anchor = rep.bytes / rep.seconds / 1e9;
    };
    auto model_layer = [&] {
      const double t = now_s();
      const LoadReport rep = m.dispatch();
      disp.push_back(now_s() - t);
      gbps = rep.bytes / rep.seconds / 1e9;
    };
    if (r % 2) {
      loader_alone();
      model_layer();
    } else {
      model_layer();
      loader_alone();
    }
    skeleton.reset();
  }
  std::printf("\nbench/model: GPT-2 124M (%s), %d rounds, medians\n", dir.c_str(), rounds);
  std::printf("%-34s %13s %13s %9s\n", "case", "time", "anchor", "ratio");
  row("construct from dir (config only)", median(build), median(build_anchor),
      "anchor: read config.json + build_causal_lm on meta");
  row("scan [8, 1024] (every module)", median(scan), median(scan_anchor),
      "anchor: metaload::scan of the forward, no recording");
  row("dispatch to cpu (same tensors)", median(disp), median(disp_anchor),
      "anchor: metaload::load into a meta skeleton; last GB/s " +
          std::to_string(gbps).substr(0, 4) + " vs " + std::to_string(gbps_anchor).substr(0, 4));
  std::printf("peak RSS %.0f MiB\n", mib(metaload::bench::peak_rss_bytes()));
  if (!tmp.empty()) std::system(("rm -rf '" + tmp + "'").c_str());
  return 0;
}
