// bench/load: metaload's CPU (and, where a GPU exists, CUDA) load of a >= 2 GB checkpoint in
// several safetensors shards, warm page cache, as ratios to anchors measured in the same run:
//   (a) a plain multi-threaded pread of the same files into one pre-touched buffer (the machine's
//       limit for reading; target ratio >= 0.85),
//   (b) torch::load (C++) and Python's torch.load of the same weights from .pt files (target: 3x
//       faster),
//   peak RSS of the load (target <= model size + 256 MB), and on a GPU the pinned host-to-device
//   bandwidth (target >= 0.85).
// Every measured load runs in a fresh child process (re-exec of this binary), so each one pays for
// its own page faults as a real load does and reports its own peak RSS.
//
// Usage: load [--dir D] [--layers N] [--hidden H] [--repeat R] [--threads T] [--settle S] [--keep]
// [--gpu-only]
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <torch/csrc/jit/serialization/pickle.h>
#include <torch/serialize.h>
#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "loader/engine/engine.h"
#include "loader/engine/engine_device.h"
#include "loader/engine/slots.h"
#include "loader/format/checkpoint.h"
#include "loader/load/plan.h"
#include "loader/load/slots_torch.h"
#include "loader/load/torch_save.h"

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string loadavg() {
  std::string a, b, c;
  std::ifstream("/proc/loadavg") >> a >> b >> c;
  return a + " " + b + " " + c;
}

long max_rss_kb() {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_maxrss;
}

struct Options {
  std::string dir = "/tmp/metaload_bench_load";
  int layers = 5;
  int hidden = 4096;
  int repeat = 3;
  int threads = 0;
  bool keep = false;
  bool gpu_only = false;
  // Seconds of quiet before each measured run. On a VM with free page reporting (this project's
  // machine) memory freed ~2 s ago has gone back to the host and is slow to touch again; waiting
  // makes every case start from that same, realistic "cold" state instead of inheriting the
  // previous case's freed memory. 0 measures whatever state the previous run left.
  double settle = 2.5;
  std::string child;
  std::string self;
};

// --- the checkpoint: a Llama-shaped bf16 model in 4 safetensors shards ------------------------

struct TensorDef {
  std::string name;
  std::vector<int64_t> shape;
  int tp_dim;  // -1 replicated, 0 column-parallel, 1 row-parallel
};

std::vector<TensorDef> model_tensors(int layers, int hidden) {
  const int64_t h = hidden, inter = hidden * 11008 / 4096, vocab = 32000;
  std::vector<TensorDef> t = {{"model.embed_tokens.weight", {vocab, h}, 0}};
  for (int l = 0; l < layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    t.push_back({p + "input_layernorm.weight", {h}, -1});
    for (const char* n : {"q_proj", "k_proj", "v_proj"})
      t.push_back({p + "self_attn." + n + ".weight", {h, h}, 0});
    t.push_back({p + "self_attn.o_proj.weight", {h, h}, 1});
    t.push_back({p + "post_attention_layernorm.weight", {h}, -1});
    t.push_back({p + "mlp.gate_proj.weight", {inter, h}, 0});
    t.push_back({p + "mlp.up_proj.weight", {inter, h}, 0});
    t.push_back({p + "mlp.down_proj.weight", {h, inter}, 1});
  }
  t.push_back({"model.norm.weight", {h}, -1});
  return t;
}

// Finite bf16 values of both signs (random bits would be ~0.4% NaN).
void fill_bf16(uint16_t* p, size_t n, uint64_t& state) {
  for (size_t i = 0; i < n; ++i) {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    const uint16_t r = static_cast<uint16_t>(state);
    p[i] = static_cast<uint16_t>((r & 0x807F) | ((0x3C + ((r >> 7) & 7)) << 7));
  }
}

struct Layout {
  std::vector<std::string> files;  // the shards
  std::vector<TensorDef> defs;
  uint64_t bytes = 0;       // tensor data
  uint64_t file_bytes = 0;  // shard files
};

// The shards as the format layer sees them.
Layout read_layout(const std::string& dir, const std::vector<TensorDef>& defs) {
  Layout lay;
  lay.defs = defs;
  const metaload::Checkpoint ck = metaload::open_checkpoint(dir);
  for (const metaload::SafetensorsHeader& f : ck.files) {
    lay.files.push_back(f.path);
    lay.file_bytes += f.file_size;
  }
  lay.bytes = ck.data_bytes();
  return lay;
}

// Writes the shards with the project's writer (4 shards + index) and, unless gpu_only, the same
// weights as .pt files for the torch::load and torch.load anchors.
void write_checkpoint(const Options& o, const std::vector<TensorDef>& defs) {
  fs::create_directories(o.dir);
  uint64_t state = 0x9E3779B97F4A7C15ull;
  std::vector<std::pair<std::string, at::Tensor>> named;
  for (const TensorDef& d : defs) {
    at::Tensor t = at::empty(d.shape, at::kBFloat16);
    fill_bf16(static_cast<uint16_t*>(t.data_ptr()), t.numel(), state);
    named.push_back({d.name, t});
  }
  metaload::ShardOptions so;
  so.num_shards = 4;
  metaload::save_safetensors_sharded(o.dir, named, so);
  if (o.gpu_only) return;
  std::vector<at::Tensor> all;
  c10::Dict<std::string, at::Tensor> dict;
  for (auto& [n, t] : named) {
    all.push_back(t);
    dict.insert(n, t);
  }
  torch::save(all, o.dir + "/model_cpp.pt");
  const std::vector<char> pickled = torch::pickle_save(c10::IValue(dict));
  std::ofstream(o.dir + "/model.pt", std::ios::binary)
      .write(pickled.data(), static_cast<std::streamsize>(pickled.size()));
}

void warm(const std::vector<std::string>& files) {
  std::vector<char> buf(16 << 20);
  for (const std::string& p : files) {
    const int fd = open(p.c_str(), O_RDONLY);
    while (read(fd, buf.data(), buf.size()) > 0) {
    }
    close(fd);
  }
}

// --- children: each measures one load in a fresh process ----------------------------------------

struct Result {
  double seconds = 0;
  uint64_t bytes = 0;
  long rss_kb = 0;
  long base_rss_kb = 0;
};

void print_result(double secs, uint64_t bytes, long base_rss) {
  std::printf("RESULT %.6f %llu %ld %ld\n", secs, static_cast<unsigned long long>(bytes),
              max_rss_kb(), base_rss);
  std::fflush(stdout);
}

// prefault: MADV_POPULATE_WRITE each chunk's destination right before its read.
void pread_all(const Layout& lay, unsigned char* buf, int threads, bool prefault = false) {
  struct Job {
    int fd;
    uint64_t off, len;
    unsigned char* dst;
  };
  std::vector<Job> jobs;
  uint64_t at = 0;
  std::vector<int> fds;
  const uint64_t chunk = 16 << 20;
  for (const std::string& p : lay.files) {
    const int fd = open(p.c_str(), O_RDONLY);
    fds.push_back(fd);
    const uint64_t size = fs::file_size(p);
    for (uint64_t o = 0; o < size; o += chunk)
      jobs.push_back({fd, o, std::min(chunk, size - o), buf + at + o});
    at += size;
  }
  std::atomic<size_t> next{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&] {
      for (size_t i; (i = next++) < jobs.size();) {
        if (prefault) {
          const uintptr_t a = (reinterpret_cast<uintptr_t>(jobs[i].dst) + 4095) & ~uintptr_t{4095};
          const uintptr_t b =
              (reinterpret_cast<uintptr_t>(jobs[i].dst) + jobs[i].len) & ~uintptr_t{4095};
          if (b > a) madvise(reinterpret_cast<void*>(a), b - a, 23 /* MADV_POPULATE_WRITE */);
        }
        uint64_t got = 0;
        while (got < jobs[i].len) {
          const ssize_t r =
              pread(jobs[i].fd, jobs[i].dst + got, jobs[i].len - got, jobs[i].off + got);
          if (r <= 0) std::abort();
          got += r;
        }
      }
    });
  }
  for (auto& t : pool) t.join();
  for (int fd : fds) close(fd);
}

int run_child(const Options& o, const Layout& lay) {
  const int threads =
      o.threads > 0 ? o.threads : static_cast<int>(std::thread::hardware_concurrency());
  const long base = max_rss_kb();
  metaload::EngineOptions eo;
  eo.threads = o.threads;
  eo.bar = metaload::ProgressBar::kOff;
  if (o.child == "pread_touched") {
    auto arena = metaload::HostArena::create(lay.file_bytes);
    std::memset(arena->data(), 0, lay.file_bytes);  // pre-touched: faults paid before the clock
    const double t0 = now();
    pread_all(lay, arena->data(), threads);
    print_result(now() - t0, lay.file_bytes, base);
  } else if (o.child == "pread_fresh_slots") {
    // Fresh memory with the pages a CPU load's slots get (slots.h): the engine's own limit.
    const bool small =
        metaload::resolve_slot_pages(metaload::SlotPages::kAuto) == metaload::SlotPages::kSmall;
    const double t0 = now();
    auto arena = metaload::HostArena::create(lay.file_bytes, /*huge_pages=*/!small);
    pread_all(lay, arena->data(), threads, /*prefault=*/small);
    print_result(now() - t0, lay.file_bytes, base);
  } else if (o.child == "pread_fresh") {
    // What a naive loader gets: fresh malloc'd memory, a 4 KiB page fault per page.
    const double t0 = now();
    auto* buf = static_cast<unsigned char*>(std::malloc(lay.file_bytes));
    pread_all(lay, buf, threads);
    print_result(now() - t0, lay.file_bytes, base);
    std::free(buf);
  } else if (o.child == "metaload" || o.child == "metaload_f32" || o.child == "metaload_tp2" ||
             o.child == "metaload_tp2_rows" || o.child == "metaload_cuda" ||
             o.child == "metaload_mapped") {
    // The public path: open the checkpoint, plan against a meta-built set of tensors, stream,
    // swap in.
    std::vector<metaload::LoadTarget> targets;
    const bool tp = o.child.rfind("metaload_tp2", 0) == 0;
    std::map<std::string, int> tp_dim;
    for (const TensorDef& d : lay.defs) {
      std::vector<int64_t> shape = d.shape;
      if (tp && d.tp_dim >= 0) shape[d.tp_dim] /= 2;
      tp_dim[d.name] = d.tp_dim;
      targets.push_back(
          {d.name, at::empty(shape, at::TensorOptions().dtype(at::kBFloat16).device(at::kMeta))});
    }
    metaload::LoadOptions lo;
    lo.engine = eo;
    if (o.child == "metaload_f32") lo.dtype = at::kFloat;
    if (o.child == "metaload_cuda") lo.device = at::Device("cuda:0");
    if (o.child == "metaload_mapped") lo.engine.map_files = true;
    if (tp) {
      lo.tp_size = 2;
      lo.names.tp_shard = [tp_dim](const std::string& n, const std::vector<int64_t>& shape,
                                   int rank, int size) {
        return metaload::even_shard(shape, {tp_dim.at(n), rank, size}, n);
      };
      // Row-parallel rows straight into the slot instead of packed through staging (both read
      // each row alone: a TP slice never reads the other rank's bytes).
      if (o.child == "metaload_tp2_rows") {
        lo.engine.merge_gap = 0;
        lo.engine.direct_row_min = 1;
      }
    }
    const double t0 = now();
    const metaload::LoadReport r = metaload::load_tensors(targets, o.dir, lo);
    const double secs = now() - t0;
    print_result(secs, r.bytes, base);
    std::fprintf(stderr, "  [%s] engine %s, %llu reads, %.0f MB direct, peak staging %.0f MB\n",
                 o.child.c_str(), r.engine.c_str(), static_cast<unsigned long long>(r.reads),
                 r.direct_bytes / 1e6, r.peak_staging_bytes / 1e6);
  } else if (o.child == "torch_load_cpp") {
    std::vector<at::Tensor> v;
    const double t0 = now();
    torch::load(v, o.dir + "/model_cpp.pt");
    print_result(now() - t0, lay.bytes, base);
  } else if (o.child == "pinned_h2d") {
    auto dev = metaload::make_cuda_device_ops(0);
    const size_t n = 256 << 20;
    void* h = dev->alloc_pinned(n);
    void* d = dev->alloc_device(n);
    std::memset(h, 1, n);
    auto s1 = dev->create_stream(), s2 = dev->create_stream();
    dev->copy_to_device_2d(d, n, h, n, n, 1, s1);  // warm-up
    dev->synchronize(s1);
    const int reps = 8;
    const double t0 = now();
    for (int r = 0; r < reps; ++r) {
      dev->copy_to_device_2d(d, n, h, n, n / 2, 1, s1);
      dev->copy_to_device_2d(static_cast<char*>(d) + n / 2, n, static_cast<char*>(h) + n / 2, n,
                             n / 2, 1, s2);
    }
    dev->synchronize(s1);
    dev->synchronize(s2);
    print_result(now() - t0, static_cast<uint64_t>(n) * reps, base);
  } else {
    std::fprintf(stderr, "unknown child mode %s\n", o.child.c_str());
    return 2;
  }
  return 0;
}

// --- parent -----------------------------------------------------------------------------------

bool parse_result(const std::string& out, Result* r) {
  const size_t p = out.find("RESULT ");
  if (p == std::string::npos) return false;
  unsigned long long bytes = 0;
  if (std::sscanf(out.c_str() + p, "RESULT %lf %llu %ld %ld", &r->seconds, &bytes, &r->rss_kb,
                  &r->base_rss_kb) != 4) {
    return false;
  }
  r->bytes = bytes;
  return true;
}

std::string run_capture(const std::string& cmd) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  pclose(p);
  return out;
}

// One fresh-process run of `mode`.
bool measure_once(const Options& o, const std::string& mode, Result* r, std::string* note) {
  if (o.settle > 0) std::this_thread::sleep_for(std::chrono::duration<double>(o.settle));
  std::string cmd;
  if (mode == "torch_load_py") {
    cmd =
        "/usr/bin/python3 -c \"import time, resource, torch\n"
        "base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "t = time.perf_counter(); sd = torch.load('" +
        o.dir +
        "/model.pt')\n"
        "el = time.perf_counter() - t\n"
        "n = sum(v.numel() * v.element_size() for v in sd.values())\n"
        "print('RESULT %.6f %d %d %d' % (el, n, "
        "resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, base))\"";
  } else {
    cmd = o.self + " --child " + mode + " --dir " + o.dir + " --layers " +
          std::to_string(o.layers) + " --hidden " + std::to_string(o.hidden) + " --threads " +
          std::to_string(o.threads);
  }
  const std::string out = run_capture(cmd + " 2>&1");
  if (!parse_result(out, r)) {
    std::fprintf(stderr, "%s failed:\n%s\n", mode.c_str(), out.c_str());
    return false;
  }
  const size_t nl = out.find("  [");
  if (nl != std::string::npos) *note = out.substr(nl, out.find('\n', nl) - nl + 1);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  o.self = fs::canonical("/proc/self/exe").string();
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto val = [&] { return i + 1 < argc ? std::string(argv[++i]) : std::string(); };
    if (a == "--dir")
      o.dir = val();
    else if (a == "--layers")
      o.layers = std::stoi(val());
    else if (a == "--hidden")
      o.hidden = std::stoi(val());
    else if (a == "--repeat")
      o.repeat = std::stoi(val());
    else if (a == "--threads")
      o.threads = std::stoi(val());
    else if (a == "--keep")
      o.keep = true;
    else if (a == "--settle")
      o.settle = std::stod(val());
    else if (a == "--gpu-only")
      o.gpu_only = true;
    else if (a == "--child")
      o.child = val();
    else {
      std::fprintf(stderr,
                   "usage: %s [--dir D] [--layers N] [--hidden H] [--repeat R] [--threads T] "
                   "[--keep] [--gpu-only]\n",
                   argv[0]);
      return 2;
    }
  }
  const std::vector<TensorDef> defs = model_tensors(o.layers, o.hidden);
  if (!o.child.empty()) return run_child(o, read_layout(o.dir, defs));

  const double tg = now();
  bool fresh = false;
  if (!fs::exists(o.dir + "/model.safetensors.index.json") ||
      (!o.gpu_only && !fs::exists(o.dir + "/model.pt"))) {
    write_checkpoint(o, defs);
    fresh = true;
  }
  Layout lay = read_layout(o.dir, defs);
  std::vector<std::string> all = lay.files;
  if (!o.gpu_only) {
    all.push_back(o.dir + "/model.pt");
    all.push_back(o.dir + "/model_cpp.pt");
  }
  warm(all);
  warm(all);
  const int threads =
      o.threads > 0 ? o.threads : static_cast<int>(std::thread::hardware_concurrency());
  std::printf(
      "bench/load: %.2f GB of bf16 weights in %zu safetensors shards, warm page cache, %d "
      "threads, medians of %d fresh-process runs, %.1f s settle before each; slot pages %s; "
      "load average %s (%s %.0f s)\n\n",
      lay.bytes / 1e9, lay.files.size(), threads, o.repeat, o.settle,
      metaload::resolve_slot_pages(metaload::SlotPages::kAuto) == metaload::SlotPages::kSmall
          ? "4 KiB pre-faulted (free page reporting)"
          : "huge",
      loadavg().c_str(), fresh ? "written in" : "reused, warmed in", now() - tg);

  const bool gpu = metaload::cuda_device_available();
  if (o.gpu_only && !gpu) {
    std::printf("no CUDA device: nothing to measure with --gpu-only\n");
    if (!o.keep) fs::remove_all(o.dir);
    return 1;
  }
  struct Row {
    std::string name, mode, anchor, target;
    double want;   // target ratio, 0 = none
    bool speedup;  // ratio is anchor time / this time
  };
  std::vector<Row> rows;
  if (!o.gpu_only) {
    rows = {
        {"pread into one pre-touched buffer (anchor a)", "pread_touched", "", "", 0, false},
        {"pread into fresh memory paged as the slots are (anchor f)", "pread_fresh_slots", "a", "",
         0, false},
        {"pread into fresh malloc memory (naive)", "pread_fresh", "af", "", 0, false},
        {"metaload CPU load, bf16 as stored", "metaload", "af", ">= 0.85", 0.85, false},
        {"metaload CPU load, zero-copy (map_files)", "metaload_mapped", "af", ">= 0.85", 0.85,
         false},
        {"metaload CPU load, bf16 -> f32", "metaload_f32", "af", "", 0, false},
        {"metaload CPU load, TP rank 0/2, rows staged", "metaload_tp2", "af", "", 0, false},
        {"metaload CPU load, TP rank 0/2, row by row", "metaload_tp2_rows", "af", "", 0, false},
        {"torch::load of model_cpp.pt (anchor b1)", "torch_load_cpp", "", "", 0, false},
        {"python torch.load of model.pt (anchor b2)", "torch_load_py", "", "", 0, false},
    };
  }
  if (gpu) {
    rows.push_back({"pinned host->device copy (anchor c)", "pinned_h2d", "", "", 0, false});
    rows.push_back(
        {"metaload CUDA load, bf16 as stored", "metaload_cuda", "c", ">= 0.85", 0.85, false});
  }
  // Rounds over every case (not one case `repeat` times in a row): whatever state the machine's
  // memory is in -- on a VM, freed memory may go back to the host and be slow to touch again --
  // touches every case alike. Each case's median is reported.
  std::map<std::string, std::vector<Result>> runs;
  std::map<std::string, std::string> notes;
  bool ok = true;
  for (int round = 0; round < o.repeat; ++round) {
    for (const Row& r : rows) {
      Result m;
      std::string note;
      if (measure_once(o, r.mode, &m, &note)) {
        runs[r.mode].push_back(m);
        if (!note.empty()) notes[r.mode] = note;
      } else {
        ok = false;
      }
    }
  }
  std::map<std::string, Result> res;
  for (auto& [mode, rs] : runs) {
    std::sort(rs.begin(), rs.end(),
              [](const Result& a, const Result& b) { return a.seconds < b.seconds; });
    res[mode] = rs[rs.size() / 2];
  }
  std::printf("| case | s | GB/s | vs anchor | target | peak RSS MB (over model) |\n");
  std::printf("|---|---|---|---|---|---|\n");
  for (const Row& r : rows) {
    if (!res.count(r.mode)) continue;
    const Result& m = res[r.mode];
    const double gbs = m.bytes / m.seconds / 1e9;
    std::string vs = "1.00 (anchor)";
    if (!r.anchor.empty()) {
      vs.clear();
      for (const char anchor : r.anchor) {
        const std::string am = anchor == 'a'   ? "pread_touched"
                               : anchor == 'f' ? "pread_fresh_slots"
                                               : "pinned_h2d";
        if (!res.count(am)) continue;
        const Result& a = res[am];
        const double ratio = gbs / (a.bytes / a.seconds / 1e9);
        char b[64];
        std::snprintf(
            b, sizeof b, "%s%.2f x %c%s", vs.empty() ? "" : ", ", ratio, anchor,
            r.want > 0 && anchor == r.anchor[0] ? (ratio >= r.want ? " ok" : " MISSED") : "");
        vs += b;
      }
    }
    std::printf("| %s | %.3f | %.2f | %s | %s | %.0f (%+.0f) |\n", r.name.c_str(), m.seconds, gbs,
                vs.c_str(), r.target.c_str(), m.rss_kb / 1e3, (m.rss_kb * 1e3 - lay.bytes) / 1e6);
  }
  std::printf("\n");
  for (const auto& [mode, note] : notes) std::fputs(note.c_str(), stdout);
  for (const char* mode : {"metaload", "metaload_mapped"}) {
    if (!res.count(mode)) continue;
    const Result& m = res[mode];
    const char* label = std::string(mode) == "metaload" ? "copying" : "zero-copy";
    std::printf("\n");
    for (const char* a : {"torch_load_cpp", "torch_load_py"}) {
      if (!res.count(a)) continue;
      const double x = res[a].seconds / m.seconds;
      std::printf("metaload CPU load (%s) vs %s: %.1fx faster (target >= 3x: %s)\n", label, a, x,
                  x >= 3 ? "ok" : "MISSED");
    }
    const double over = (m.rss_kb * 1e3 - static_cast<double>(lay.bytes)) / 1e6;
    std::printf(
        "metaload CPU load (%s) peak RSS: %.0f MB = model %.0f MB %+.0f MB (target <= +256 MB: "
        "%s)\n",
        label, m.rss_kb / 1e3, lay.bytes / 1e6, over, over <= 256 ? "ok" : "MISSED");
  }
  if (!o.keep) fs::remove_all(o.dir);
  return ok ? 0 : 1;
}
