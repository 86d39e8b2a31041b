// bench/describe: how long describe_checkpoint takes on a Llama-2-70B-shaped sharded checkpoint
// whose shard files are sparse (real headers, ~138 GB apparent size, no data blocks), against an
// anchor measured in the same run: the raw cost of opening and reading exactly the header bytes of
// every shard plus the index and config.json (no parsing). Prints a table of ratios, the bytes read
// per describe and the peak RSS. Target: describe under 20 ms.
#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "loader/format/checkpoint.h"
#include "loader/format/writer.h"
#include "identity/checkpoint_shapes.h"
#include "identity/describe.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Stats {
  double median_ms, min_ms, p90_ms;
};

Stats time_it(int n, const std::function<void()>& f) {
  f();  // warm-up
  std::vector<double> ms;
  for (int i = 0; i < n; ++i) {
    auto t0 = Clock::now();
    f();
    ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  return {ms[ms.size() / 2], ms.front(), ms[std::min(ms.size() - 1, ms.size() * 9 / 10)]};
}

// The anchor: open + pread of exactly the header bytes (8 + N) of every shard, the whole index and
// config.json, then close. What any describe must at least do.
void raw_header_reads(const std::vector<std::string>& shards,
                      const std::vector<std::string>& whole_files) {
  std::string buf;
  for (const auto& p : shards) {
    int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
    unsigned char len[8];
    if (fd < 0 || ::pread(fd, len, 8, 0) != 8) std::abort();
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | len[i];
    buf.resize(n);
    if (::pread(fd, buf.data(), n, 8) != static_cast<ssize_t>(n)) std::abort();
    ::close(fd);
  }
  for (const auto& p : whole_files) {
    int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) std::abort();
    off_t size = ::lseek(fd, 0, SEEK_END);
    buf.resize(static_cast<size_t>(size));
    if (::pread(fd, buf.data(), buf.size(), 0) != size) std::abort();
    ::close(fd);
  }
}

std::string source_dir() {
  const char* s = std::getenv("METALOAD_SOURCE_DIR");
  return s && *s ? s : ".";
}

}  // namespace

int main(int argc, char** argv) {
  using namespace metaload;
  CLI::App app{
      "bench/describe: describe_checkpoint on a sparse Llama-2-70B-shaped sharded checkpoint"};
  int iterations = 50, shards = 15;
  std::string config_path = source_dir() + "/model/families/configs/llama-2-70b.json", keep;
  app.add_option("-n,--iterations", iterations, "timed repetitions (median reported)")
      ->capture_default_str();
  app.add_option("--shards", shards, "number of shard files")->capture_default_str();
  app.add_option("--config", config_path, "config.json of the model to imitate")
      ->capture_default_str();
  app.add_option("--keep", keep,
                 "write the checkpoint into this (existing, empty) directory and keep it");
  CLI11_PARSE(app, argc, argv);

  std::string dir = keep;
  if (dir.empty()) {
    std::string tmpl = "/tmp/metaload-bench-describe-XXXXXX";
    if (!::mkdtemp(tmpl.data())) {
      std::perror("mkdtemp");
      return 1;
    }
    dir = tmpl;
  }
  nlohmann::json config = read_config_json(config_path);
  auto t0 = Clock::now();
  {
    std::FILE* f = std::fopen((dir + "/config.json").c_str(), "w");
    std::string text = config.dump(2);
    std::fwrite(text.data(), 1, text.size(), f);
    std::fclose(f);
    ShardOptions o;
    o.num_shards = shards;
    o.metadata = {{"format", "pt"}};
    ShardedSafetensorsWriter w(dir, o);
    for (const auto& s : checkpoint_tensor_specs(config, DType::BF16))
      w.add(s.name, s.dtype, s.shape, nullptr);
    w.write();
  }
  const double build_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();

  Checkpoint c = open_checkpoint(dir);
  std::vector<std::string> shard_paths;
  for (const auto& f : c.files) shard_paths.push_back(f.path);
  std::vector<std::string> whole = {*c.index_path, *c.config_path};

  reset_io_bytes_read();
  CheckpointInfo info = describe_checkpoint(dir);
  const uint64_t bytes_per_describe = io_bytes_read();

  Stats anchor = time_it(iterations, [&] { raw_header_reads(shard_paths, whole); });
  Stats open = time_it(iterations, [&] { open_checkpoint(dir); });
  Stats describe = time_it(iterations, [&] { describe_checkpoint(dir); });
  Stats describe_nf4 = time_it(iterations, [&] { describe_checkpoint(dir, std::string("nf4")); });

  struct rusage ru;
  ::getrusage(RUSAGE_SELF, &ru);
  std::printf(
      "bench/describe: %s-shaped, %zu shards, %llu tensors, %.2f GB apparent (sparse), %llu "
      "params; "
      "fixture built in %.0f ms; N=%d\n\n",
      config.value("model_type", "?").c_str(), c.files.size(),
      static_cast<unsigned long long>(info.n_tensors), info.stored_bytes / 1e9,
      static_cast<unsigned long long>(*info.n_params), build_ms, iterations);
  std::printf("| case | median ms | min ms | p90 ms | x anchor |\n|---|---|---|---|---|\n");
  auto row = [&](const char* name, const Stats& s) {
    std::printf("| %s | %.3f | %.3f | %.3f | %.2f |\n", name, s.median_ms, s.min_ms, s.p90_ms,
                s.median_ms / anchor.median_ms);
  };
  row("anchor: open + read header bytes of every shard, index, config", anchor);
  row("open_checkpoint (validate headers + index)", open);
  row("describe_checkpoint (stored dtype)", describe);
  row("describe_checkpoint --dtype nf4", describe_nf4);
  std::printf("\nbytes read per describe: %llu (limit 1 MiB)\npeak RSS: %.1f MiB\n",
              static_cast<unsigned long long>(bytes_per_describe), ru.ru_maxrss / 1024.0);
  const bool ok = describe.median_ms < 20.0 && bytes_per_describe < (1u << 20);
  std::printf("target: describe < 20 ms and < 1 MiB read: %s\n", ok ? "met" : "MISSED");
  if (keep.empty()) {
    std::string cmd = "rm -rf '" + dir + "'";
    if (std::system(cmd.c_str()) != 0) std::fprintf(stderr, "could not remove %s\n", dir.c_str());
  }
  return 0;
}
