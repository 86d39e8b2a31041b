// metaload scan REF --batch B --seq S [--device D] [--dtype T] [--revision R] [--depth N]
//   [--collapse] [--json]
// Builds the model on meta from config.json alone, runs it on fake ids, and prints every module's
// output shape and activation bytes. No weight is read.
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "base/text.h"
#include "identity/model_dtype.h"
#include "model/transformers_model.h"
#include "tools/cli/torch/torch_cli.h"

namespace metaload {
namespace cli {

c10::Device parse_device(const std::string& text, const char* option) {
  try {
    c10::Device d(text);
    if (!d.is_cpu() && !d.is_cuda())
      throw UsageError(fmt::format("{} {}: only cpu and cuda[:N] are supported", option,
                                   quote_text(text, '\'')));
    return d;
  } catch (const c10::Error&) {
    throw UsageError(
        fmt::format("{} {} is not a device (cpu, cuda, cuda:N)", option, quote_text(text, '\'')));
  }
}

c10::ScalarType parse_model_dtype(const std::string& text, const char* option) {
  try {
    return model_scalar_type(text);  // the one table's names and mapping, as TransformersModel's
  } catch (const DTypeError& e) {
    throw UsageError(fmt::format("{} {}", option, e.message()));
  }
}

std::string human_bytes(uint64_t b) {
  const double v = static_cast<double>(b);
  if (b >= (1ull << 30)) return fmt::format("{:.2f} GiB", v / (1ull << 30));
  if (b >= (1ull << 20)) return fmt::format("{:.1f} MiB", v / (1ull << 20));
  if (b >= (1ull << 10)) return fmt::format("{:.1f} KiB", v / (1ull << 10));
  return fmt::format("{} B", b);
}

uint64_t rss_bytes() {
  std::ifstream f("/proc/self/statm");
  uint64_t size = 0, resident = 0;
  f >> size >> resident;
  return resident * static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
}

namespace {

std::vector<std::string> split(const std::string& path) {
  std::vector<std::string> parts;
  if (path.empty()) return parts;
  std::stringstream ss(path);
  std::string p;
  while (std::getline(ss, p, '.')) parts.push_back(p);
  return parts;
}

bool is_index(const std::string& s) {
  return !s.empty() && s.find_first_not_of("0123456789") == std::string::npos;
}

// The first numbered component of a path: (the list's path, the index), or index -1.
std::pair<std::string, int64_t> layer_of(const std::vector<std::string>& parts) {
  std::string prefix;
  for (const std::string& p : parts) {
    if (is_index(p)) return {prefix, std::stoll(p)};
    prefix += (prefix.empty() ? "" : ".") + p;
  }
  return {"", -1};
}

}  // namespace

void print_scan_table(const ModelScan& scan, int depth, bool collapse, std::ostream& out) {
  std::map<std::string, int64_t> last_layer;
  for (const ModuleShape& m : scan.modules) {
    auto [list, index] = layer_of(split(m.path));
    if (index >= 0) last_layer[list] = std::max(last_layer[list], index);
  }
  struct Row {
    std::string path, cls, shape, dtype, bytes;
  };
  std::vector<Row> rows;
  std::map<std::string, bool> elided;
  for (const ModuleShape& m : scan.modules) {
    const std::vector<std::string> parts = split(m.path);
    if (depth >= 0 && static_cast<int>(parts.size()) > depth) continue;
    auto [list, index] = layer_of(parts);
    if (collapse && index > 0 && index < last_layer[list]) {
      if (!elided[list]) {
        elided[list] = true;
        rows.push_back({fmt::format("  ... {}.1 to {}.{} alike", list, list, last_layer[list] - 1),
                        "", "", "", ""});
      }
      continue;
    }
    rows.push_back({m.path.empty() ? "(model)" : m.path, m.class_name, shape_str(m.sizes),
                    torch_dtype_name(m.dtype), human_bytes(m.bytes())});
  }
  Row head{"module", "class", "output shape", "dtype", "bytes"};
  size_t w[5] = {head.path.size(), head.cls.size(), head.shape.size(), head.dtype.size(),
                 head.bytes.size()};
  for (const Row& r : rows) {
    if (!r.cls.empty()) w[0] = std::max(w[0], r.path.size());
    w[1] = std::max(w[1], r.cls.size());
    w[2] = std::max(w[2], r.shape.size());
    w[3] = std::max(w[3], r.dtype.size());
    w[4] = std::max(w[4], r.bytes.size());
  }
  auto line = [&](const Row& r) {
    if (r.cls.empty()) {  // an elision marker
      out << r.path << "\n";
      return;
    }
    out << std::left << std::setw(static_cast<int>(w[0]) + 2) << r.path
        << std::setw(static_cast<int>(w[1]) + 2) << r.cls << std::setw(static_cast<int>(w[2]) + 2)
        << r.shape << std::setw(static_cast<int>(w[3]) + 2) << r.dtype << std::right
        << std::setw(static_cast<int>(w[4])) << r.bytes << "\n";
  };
  line(head);
  for (const Row& r : rows) line(r);
  out << fmt::format("total: {} modules on {}, {} of outputs ({} bytes)\n", scan.modules.size(),
                     scan.device.str(), human_bytes(scan.total_bytes()),
                     with_commas(scan.total_bytes()));
}

namespace {

struct Options : ModelBuildArgs {
  int64_t batch = 1, seq = 0;
  int depth = -1;
  bool collapse = false;
};

int run(const Options& o) {
  TransformersModel model(o.ref, o.model_options());
  const ModelScan scan = model.scan(o.batch, o.seq);
  if (o.json) {
    const nlohmann::json modules = nlohmann::json::parse(scan.modules_json());
    std::cout << nlohmann::json{{"model", model.module().name()},
                                {"config", model.config_path()},
                                {"batch", o.batch},
                                {"seq", o.seq},
                                {"device", scan.device.str()},
                                {"build_seconds", model.build_seconds()},
                                {"scan_seconds", scan.seconds},
                                {"total_bytes", scan.total_bytes()},
                                {"modules", modules}}
                     .dump(2)
              << "\n";
    return 0;
  }
  std::cout << fmt::format(
      "{} from {}: built on meta in {:.1f} ms, scanned [{}, {}] on {} in {:.1f} ms (no weight "
      "read)\n\n",
      model.module().name(), model.config_path(), model.build_seconds() * 1e3, o.batch, o.seq,
      scan.device.str(), scan.seconds * 1e3);
  print_scan_table(scan, o.depth, o.collapse, std::cout);
  return 0;
}

}  // namespace

std::function<int()> setup_scan(CLI::App& sub) {
  auto o = std::make_shared<Options>();
  add_model_build_options(sub, *o, "the device the scan claims (cpu, cuda:0; no GPU needed)");
  sub.add_option("--batch", o->batch, "batch size")
      ->capture_default_str()
      ->transform(whole_number(1, INT64_MAX));
  sub.add_option("--seq", o->seq, "sequence length")
      ->required()
      ->transform(whole_number(1, INT64_MAX));
  add_revision_option(sub, *o, "branch, tag or commit of a repo id");
  sub.add_option("--depth", o->depth, "show paths of at most N components (default: all)")
      ->transform(whole_number(0, INT_MAX));
  sub.add_flag("--collapse", o->collapse, "show only the first and last of numbered layers");
  add_output_and_key_flags(sub, *o);
  return [o] { return run(*o); };
}

}  // namespace cli
}  // namespace metaload
