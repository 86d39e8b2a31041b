// bench/model: the model layer against the pieces it is built from, on the GPT-2 124M fixture
// (made once in a temporary directory, or --keep DIR).
//   construction: TransformersModel(dir) vs reading config.json + build_causal_lm(config, meta)
//   scan:         TransformersModel::scan(8, 1024) vs metaload::scan of the module's forward
//   dispatch:     TransformersModel(dir).dispatch() vs metaload::load into a meta skeleton with
//                 the same names (the loader alone); rounds interleaved, fresh processes' memory
//                 is what both get (bench/RESULTS.md explains why that bounds a fresh load)
// and, moved here from unit tests that compared times (a unit test asserts behaviour only):
//   generate:     16 greedy tokens after a 32-token prompt on gpt2-sized random weights, with the
//                 KV cache vs without it (every position recomputed), tokens checked equal
//   skeletons:    TransformersModel(dir) of every real-size built-in config vs reading its
//                 config.json + build_causal_lm on meta
//   fixture:      make_checkpoint of the gpt2 config (124M float32) vs write(2) of as many bytes
// Usage: model [--rounds N] [--keep DIR] [--parts core,generate,skeletons,fixture]
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>

#include "bench/bench_util.h"
#include "fake_mode/scan.h"
#include "loader/format/checkpoint.h"
#include "loader/load/plan.h"
#include "model/families/config.h"
#include "model/families/family.h"
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

// Runs a then b, or b then a on odd rounds: the machine's noise hits both alike.
template <class A, class B>
void interleaved(int round, A a, B b) {
  if (round % 2) {
    b();
    a();
  } else {
    a();
    b();
  }
}

// Was the unit test FamilySpeed.Gpt2Generate16Tokens (it asserted the cache was faster and failed
// on a loaded machine); FamilyGenerate.Gpt2SizedCachedAndUncachedGiveTheSameTokens keeps the
// behaviour.
void generate_rows(int rounds) {
  BuildOptions o;
  o.seed = 1;
  double t = now_s();
  auto model = build_causal_lm(builtin_config("gpt2"), o);
  const double build = now_s() - t;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1);
  const at::Tensor prompt = at::randint(model->config().vocab_size, {1, 32}, gen, at::kLong);
  model->generate(prompt, 1);  // warm-up (allocator, BLAS threads)
  std::vector<double> cached, plain;
  bool same = true;
  for (int r = 0; r < rounds; ++r) {
    at::Tensor a, b;
    interleaved(
        r,
        [&] {
          t = now_s();
          a = model->generate(prompt, 16);
          cached.push_back(now_s() - t);
        },
        [&] {
          t = now_s();
          b = model->generate(prompt, 16, /*use_cache=*/false);
          plain.push_back(now_s() - t);
        });
    same = same && a.equal(b);
  }
  std::ostringstream note;
  note.precision(2);
  note << std::fixed << "anchor: the same without the cache; tokens " << (same ? "equal" : "DIFFER")
       << "; build+init " << build << " s, " << at::get_num_threads() << " threads";
  row("generate 16 tokens (KV cache)", median(cached), median(plain), note.str());
}

// Was TransformersModel.SkeletonsOfRealSizesInMilliseconds's bound (under 2 s each).
void skeleton_rows(const std::string& tmp, int rounds) {
  for (const std::string& name : builtin_config_names()) {
    if (name.find("tiny") != std::string::npos) continue;
    const std::string d = tmp + "/skeleton-" + name;
    ::mkdir(d.c_str(), 0755);
    std::ofstream(d + "/config.json") << builtin_config_json(name);
    std::vector<double> model, anchor;
    for (int r = 0; r < rounds; ++r) {
      interleaved(
          r,
          [&] {
            const double t = now_s();
            TransformersModel m(d);
            model.push_back(now_s() - t);
          },
          [&] {
            const double t = now_s();
            BuildOptions meta;
            meta.device = at::kMeta;
            meta.init_weights = false;
            build_causal_lm(parse_family_config(read_config_json(d + "/config.json"), d), meta);
            anchor.push_back(now_s() - t);
          });
    }
    row(("skeleton " + name).c_str(), median(model), median(anchor),
        "anchor: read config.json + build_causal_lm on meta");
  }
}

// Writes `bytes` bytes to `path` with write(2), 4 MiB at a time: seconds.
double plain_write(const std::string& path, uint64_t bytes) {
  const std::vector<char> buf(4 << 20, 1);
  const double t = now_s();
  const int fd = ::open(path.c_str(), O_CREAT | O_WRONLY | O_TRUNC, 0644);
  for (uint64_t left = bytes; fd >= 0 && left > 0;) {
    const ssize_t n = ::write(fd, buf.data(), std::min<uint64_t>(left, buf.size()));
    if (n <= 0) break;
    left -= static_cast<uint64_t>(n);
  }
  if (fd >= 0) ::close(fd);
  const double s = now_s() - t;
  ::unlink(path.c_str());
  return s;
}

// Was Fixtures.Gpt2SizedCheckpointIsQuick's bound (under 30 s). The first make comes first: it
// says how many bytes the anchor writes.
void fixture_rows(const std::string& tmp, int rounds) {
  std::vector<double> make, anchor;
  uint64_t bytes = 0;
  for (int r = 0; r < rounds; ++r) {
    interleaved(
        r,
        [&] {
          const std::string d = tmp + "/fixture";
          FixtureOptions f;
          f.config = "gpt2";
          const double t = now_s();
          bytes = make_checkpoint(f, d).data_bytes;
          make.push_back(now_s() - t);
          std::system(("rm -rf '" + d + "'").c_str());
        },
        [&] { anchor.push_back(plain_write(tmp + "/plain.bin", bytes)); });
  }
  std::ostringstream note;
  note.precision(1);
  note << std::fixed << "anchor: write(2) of the same " << mib(bytes)
       << " MiB in 4 MiB pieces; make: " << bytes / median(make) / 1e9 << " GB/s";
  row("make_checkpoint gpt2 (124M fp32)", median(make), median(anchor), note.str());
}

// The construct, scan and dispatch rows on the GPT-2 124M fixture (made in a temporary directory
// unless `keep` holds one).
void core_rows(const std::string& keep, int rounds) {
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
    interleaved(r, model_build, anchor_build);
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
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = 5;
  std::string keep;
  const std::set<std::string> all = {"core", "generate", "skeletons", "fixture"};
  std::set<std::string> parts = all;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--rounds") && i + 1 < argc) {
      rounds = std::atoi(argv[++i]);
    } else if (!std::strcmp(argv[i], "--keep") && i + 1 < argc) {
      keep = argv[++i];
    } else if (!std::strcmp(argv[i], "--parts") && i + 1 < argc) {
      parts.clear();
      std::stringstream list(argv[++i]);
      for (std::string p; std::getline(list, p, ',');) parts.insert(p);
    } else {
      parts = {"?"};
    }
    if (parts.count("?") || !std::includes(all.begin(), all.end(), parts.begin(), parts.end())) {
      std::fprintf(stderr,
                   "usage: model [--rounds N] [--keep DIR] [--parts "
                   "core,generate,skeletons,fixture]\n");
      return 2;
    }
  }
  if (parts.count("core")) core_rows(keep, rounds);
  char scratch_template[] = "/tmp/metaload-bench-model-XXXXXX";
  const std::string scratch = ::mkdtemp(scratch_template);
  if (parts.count("generate") || parts.count("skeletons") || parts.count("fixture")) {
    std::printf("\nbench/model: families and fixtures, %d rounds (fixture: %d), medians\n", rounds,
                std::min(rounds, 3));
    std::printf("%-34s %13s %13s %9s\n", "case", "time", "anchor", "ratio");
    if (parts.count("generate")) generate_rows(rounds);
    if (parts.count("skeletons")) skeleton_rows(scratch, rounds);
    if (parts.count("fixture")) fixture_rows(scratch, std::min(rounds, 3));
    std::printf("peak RSS %.0f MiB\n", mib(metaload::bench::peak_rss_bytes()));
  }
  std::system(("rm -rf '" + scratch + "'").c_str());
  return 0;
}
