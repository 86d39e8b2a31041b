#include "model/fixtures.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "base/text.h"
#include "base/unique_fd.h"
#include "identity/checkpoint_shapes.h"
#include "kernels/convert.h"
#include "loader/errors.h"
#include "loader/format/file_io.h"
#include "loader/format/hf_cache.h"
#include "loader/format/writer.h"
#include "model/families/config.h"
#include "model/families/spec.h"
#include "model/sha256.h"

namespace metaload {
namespace {

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;
// Embeddings small next to what the layers add (their outputs are O(1)): with a tied head, a
// large embedding makes every position predict its own token again (measured on gpt2: std 1
// repeated the last prompt token forever), while this still spreads the logits (std ~ 0.25 *
// sqrt(hidden)).
constexpr float kEmbeddingStd = 0.25f;
// Matrices: std kMatrixGain / sqrt(fan_in). At 1 the layers of gpt2 were close to linear and
// greedy decoding repeated one token; at 2 (as test_families' reference weights) it conditions on
// its input.
constexpr double kMatrixGain = 2.0;

inline uint64_t mix64(uint64_t z) {  // splitmix64's finaliser
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001B3ull;
  return h;
}

// Published and saved GPT-2 names differ by the base-model prefix; values must not.
std::string canonical_name(const std::string& name) {
  const std::string prefix = "transformer.";
  return name.rfind(prefix, 0) == 0 ? name.substr(prefix.size()) : name;
}

enum class Kind { kUniform, kMask, kConstant, kInvFreq };

// How to compute every element of one tensor.
struct TensorGen {
  Kind kind = Kind::kUniform;
  float scale = 1, offset = 0;  // value = offset + scale * u, u uniform in [-1, 1)
  uint64_t key = 0;
  int64_t positions = 0;  // mask: [1, 1, P, P]
  int64_t dim = 0;        // inv_freq: head dim
  double theta = 10000;
};

TensorGen plan_tensor(const std::string& name, const std::vector<int64_t>& shape,
                      const std::string& model_type, double rope_theta, uint64_t seed) {
  const std::string n = canonical_name(name);
  TensorGen g;
  g.key = mix64(seed * kGolden + fnv1a(n));
  if (shape.size() == 4 && ends_with(n, ".attn.bias")) {
    g.kind = Kind::kMask;
    g.positions = shape[3];
  } else if (ends_with(n, "masked_bias")) {
    g.kind = Kind::kConstant;
    g.offset = -1e4f;
  } else if (ends_with(n, "rotary_emb.inv_freq")) {
    g.kind = Kind::kInvFreq;
    g.dim = 2 * (shape.empty() ? 0 : shape[0]);
    g.theta = rope_theta;
  } else if (ends_with(n, "wte.weight") || ends_with(n, "wpe.weight") ||
             ends_with(n, "embed_tokens.weight")) {
    g.scale = kEmbeddingStd * std::sqrt(3.0f);  // uniform(-a, a) has std a / sqrt(3)
  } else if (shape.size() == 1 && (ends_with(n, "norm.weight") || ends_with(n, "ln_1.weight") ||
                                   ends_with(n, "ln_2.weight") || ends_with(n, "ln_f.weight"))) {
    g.offset = 1.0f;
    g.scale = 0.2f;
  } else if (shape.size() == 1) {
    g.scale = 0.1f;
  } else if (shape.size() == 2) {
    // Conv1D (GPT-2) stores [in, out]; Linear and the lm_head [out, in].
    const bool in_first = model_type == "gpt2" && !ends_with(n, "lm_head.weight");
    const double fan_in = static_cast<double>(in_first ? shape[0] : shape[1]);
    g.scale = static_cast<float>(kMatrixGain * std::sqrt(3.0 / std::max(fan_in, 1.0)));
  } else {
    g.scale = 0.1f;
  }
  return g;
}

void fill_f32(const TensorGen& g, uint64_t first, uint64_t count, float* out) {
  switch (g.kind) {
    case Kind::kUniform: {
      const float k = 1.0f / 8388608.0f;  // 2^-23: 24 random bits -> [0, 2)
      for (uint64_t i = 0; i < count; ++i) {
        const uint64_t z = mix64(g.key + (first + i) * kGolden);
        const float u = static_cast<float>(z >> 40) * k - 1.0f;
        out[i] = g.offset + g.scale * u;
      }
      break;
    }
    case Kind::kMask:
      for (uint64_t i = 0; i < count; ++i) {
        const uint64_t e = first + i, p = static_cast<uint64_t>(g.positions);
        out[i] = (e % p) <= (e / p) % p ? 1.0f : 0.0f;
      }
      break;
    case Kind::kConstant:
      std::fill(out, out + count, g.offset);
      break;
    case Kind::kInvFreq:
      for (uint64_t i = 0; i < count; ++i)
        out[i] = static_cast<float>(1.0 / std::pow(g.theta, static_cast<double>(2 * (first + i)) /
                                                                std::max<int64_t>(g.dim, 1)));
      break;
  }
}

FloatFormat format_of(DType d) {
  return d == DType::F16    ? FloatFormat::kF16
         : d == DType::BF16 ? FloatFormat::kBF16
                            : FloatFormat::kF32;
}

// Bytes [offset, offset + n) of a tensor: its elements computed in float32, rounded to the file
// dtype by the project's conversion kernel, then the asked-for bytes copied out.
TensorSource make_source(TensorGen g, DType dtype) {
  return [g, dtype](uint64_t offset, void* dst, uint64_t n) {
    const uint64_t es = static_cast<uint64_t>(dtype_bits(dtype) / 8);
    const uint64_t first = offset / es, last = (offset + n + es - 1) / es, count = last - first;
    thread_local std::vector<float> values;
    thread_local std::vector<unsigned char> bytes;
    values.resize(count);
    fill_f32(g, first, count, values.data());
    const unsigned char* src = reinterpret_cast<const unsigned char*>(values.data());
    if (dtype != DType::F32) {
      bytes.resize(count * es);
      convert_cpu(values.data(), FloatFormat::kF32, bytes.data(), format_of(dtype), count);
      src = bytes.data();
    }
    std::memcpy(dst, src + (offset - first * es), n);
  };
}

void make_dirs(const std::string& path) {
  std::string partial;
  std::stringstream ss(path);
  std::string part;
  if (!path.empty() && path[0] == '/') partial = "/";
  while (std::getline(ss, part, '/')) {
    if (part.empty()) continue;
    partial += part + "/";
    if (::mkdir(partial.c_str(), 0755) != 0 && errno != EEXIST)
      throw FixtureError(
          fmt::format("cannot create directory {}: {}", partial, std::strerror(errno)));
  }
  struct stat st;
  if (::stat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    throw FixtureError(fmt::format("{} is not a directory", path));
}

bool dir_is_empty(const std::string& path) {
  DIR* d = ::opendir(path.c_str());
  if (!d) return true;
  bool empty = true;
  while (dirent* e = ::readdir(d)) {
    if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) {
      empty = false;
      break;
    }
  }
  ::closedir(d);
  return empty;
}

void write_text(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp-" + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << text;
    if (!out) throw FixtureError(fmt::format("cannot write {}", tmp));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0)
    throw FixtureError(fmt::format("cannot rename {} to {}: {}", tmp, path, std::strerror(errno)));
}

std::string read_text(const std::string& path) {
  try {
    return fileio::read_small_file(path, 64ull << 20, "config.json");  // never blocks on a FIFO
  } catch (const FormatError& e) {
    throw FixtureError(fmt::format("cannot read the config file {}: {}", path, e.detail()));
  }
}

std::string base_name(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// Writes config.json and the safetensors files into `dir`; fills result.files and counts.
void write_plain(const FixtureOptions& o, const FamilyConfig& config, const std::string& text,
                 const std::string& dir, FixtureResult& result) {
  std::vector<TensorSpec> specs;
  if (o.layout == FixtureLayout::kPublished) {
    specs = checkpoint_tensor_specs(config.raw, o.dtype, o.buffers);
  } else {
    for (const ParamSpec& p : parameter_specs(config))
      if (p.tied_to.empty()) specs.push_back({p.name, o.dtype, p.shape});
  }
  const std::string config_path = dir + "/config.json";
  write_text(config_path, text);
  result.files.push_back(config_path);

  ShardOptions so;
  so.num_shards = o.shards > 1 ? o.shards : 0;
  so.metadata = {{"format", "pt"}};
  ShardedSafetensorsWriter writer(dir, so);
  for (const TensorSpec& s : specs) {
    const TensorGen g = plan_tensor(s.name, s.shape, config.model_type, config.rope_theta, o.seed);
    writer.add(s.name, s.dtype, s.shape, make_source(g, s.dtype));
    const uint64_t bytes = s.nbytes();
    result.data_bytes += bytes;
    ++result.n_tensors;
    const bool buffer = g.kind != Kind::kUniform;
    if (!buffer) result.n_params += bytes / (dtype_bits(s.dtype) / 8);
  }
  ShardedWriteResult written = writer.write();
  for (const std::string& f : written.files) result.files.push_back(f);
  if (!written.index_path.empty()) result.files.push_back(written.index_path);
}

bool plain_ref_name(const std::string& s) {
  if (s.empty() || s == "." || s == "..") return false;
  for (char c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-'))
      return false;
  return true;
}

// A ref as the hub names it under refs/: a branch or tag ("main", "v1.0", "feature/x") or a pull
// request's "refs/pr/N" (the hub keeps it at refs/refs/pr/N): plain names joined by '/'.
bool ref_name(const std::string& s) {
  size_t start = 0;
  while (true) {
    const size_t end = s.find('/', start);
    if (!plain_ref_name(s.substr(start, end == std::string::npos ? end : end - start)))
      return false;
    if (end == std::string::npos) return true;
    start = end + 1;
  }
}

// Written into a hub repo folder that make_checkpoint created, so that it may repoint that repo's
// refs later; a repo without it (downloaded, or made by anything else) keeps its refs.
constexpr const char* kOwnerMarker = ".metaload-fixture";

bool exists(const std::string& path) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0;
}

// Checks, before anything is written, that make_checkpoint may write `branch` of `repo` into
// `repo_dir`; marks the folder as metaload's when this call creates it.
void claim_repo(const std::string& repo_dir, const std::string& repo, const std::string& branch) {
  const std::string marker = repo_dir + "/" + kOwnerMarker;
  const std::string ref = repo_dir + "/refs/" + branch;
  if (exists(repo_dir)) {
    if (exists(ref) && !exists(marker))
      throw FixtureError(fmt::format(
          "refusing to repoint refs/{} of {} ({}): metaload did not create this repo (no {}), so "
          "it may be a real model; use another cache directory or repo id",
          branch, quote_text(repo, '\''), quote_path(repo_dir), kOwnerMarker));
    return;
  }
  make_dirs(repo_dir);
  write_text(marker, "written by metaload make-checkpoint: this repo holds generated fixtures\n");
}

// Moves the files of `staging` into the hub layout of `repo_dir`: blobs named by their SHA-256,
// snapshots/<commit>/<name> -> ../../blobs/<digest>, refs/<branch> = commit.
std::string publish_to_cache(const std::string& staging, const std::string& repo_dir,
                             const std::string& branch, FixtureResult& result) {
  make_dirs(repo_dir + "/blobs");
  make_dirs(repo_dir + "/refs");
  std::vector<std::pair<std::string, std::string>> entries;  // name, digest
  for (const std::string& f : result.files) entries.emplace_back(base_name(f), file_sha256(f));
  std::string listing;
  for (const auto& [name, digest] : entries) listing += name + " " + digest + "\n";
  const std::string listing_path = staging + "/.listing";
  write_text(listing_path, listing);
  const std::string commit = file_sha256(listing_path).substr(0, 40);
  ::unlink(listing_path.c_str());

  const std::string snapshot = repo_dir + "/snapshots/" + commit;
  make_dirs(snapshot);
  std::vector<std::string> files;
  for (size_t i = 0; i < entries.size(); ++i) {
    const auto& [name, digest] = entries[i];
    const std::string blob = repo_dir + "/blobs/" + digest;
    if (::rename(result.files[i].c_str(), blob.c_str()) != 0)
      throw FixtureError(
          fmt::format("cannot move {} to {}: {}", result.files[i], blob, std::strerror(errno)));
    const std::string link = snapshot + "/" + name;
    ::unlink(link.c_str());
    if (::symlink(("../../blobs/" + digest).c_str(), link.c_str()) != 0)
      throw FixtureError(
          fmt::format("cannot create the symlink {}: {}", link, std::strerror(errno)));
    files.push_back(link);
  }
  ::rmdir(staging.c_str());
  const std::string ref = repo_dir + "/refs/" + branch;
  make_dirs(ref.substr(0, ref.rfind('/')));  // refs/refs/pr/ for a pull request's ref
  write_text(ref, commit);                   // the hub writes the hash without a newline
  result.files = files;
  result.commit = commit;
  return snapshot;
}

}  // namespace

float fixture_value(const std::string& name, const std::vector<int64_t>& shape,
                    const std::string& model_type, double rope_theta, uint64_t seed,
                    uint64_t index) {
  float v = 0;
  fill_f32(plan_tensor(name, shape, model_type, rope_theta, seed), index, 1, &v);
  return v;
}

std::string file_sha256(const std::string& path) {
  const UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) throw FixtureError(fmt::format("cannot open {}: {}", path, std::strerror(errno)));
  Sha256 sha;
  std::vector<unsigned char> buf(8u << 20);
  for (;;) {
    const ssize_t r = ::read(fd.get(), buf.data(), buf.size());
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) throw FixtureError(fmt::format("cannot read {}: {}", path, std::strerror(errno)));
    if (r == 0) break;
    sha.update(buf.data(), static_cast<size_t>(r));
  }
  return sha.hex_digest();
}

FixtureResult make_checkpoint(const FixtureOptions& o, const std::string& out_dir) {
  const auto t0 = std::chrono::steady_clock::now();
  if (o.config.empty()) throw FixtureError("no config given (a built-in name or a config.json)");
  if (o.dtype != DType::F32 && o.dtype != DType::F16 && o.dtype != DType::BF16)
    throw FixtureError(fmt::format("dtype {} is not one of F32, F16, BF16", dtype_name(o.dtype)));
  if (o.shards < 1) throw FixtureError(fmt::format("--shards must be >= 1, got {}", o.shards));
  if (o.buffers && o.layout != FixtureLayout::kPublished)
    throw FixtureError(
        "buffers are stored only in the published layout (transformers never saves them)");
  const bool to_cache = !o.hf_cache.empty() || !o.repo.empty();
  if (to_cache && (o.hf_cache.empty() || o.repo.empty()))
    throw FixtureError("a hub cache needs both the cache directory and the repo id (ORG/NAME)");
  if (to_cache && !out_dir.empty())
    throw FixtureError(
        fmt::format("give either an output directory or a hub cache, not both (got {} and {})",
                    quote_path(out_dir), quote_path(o.hf_cache)));
  if (!to_cache && out_dir.empty()) throw FixtureError("no output directory given");
  if (to_cache && !looks_like_repo_id(o.repo))
    throw FixtureError(
        fmt::format("{} is not a Hugging Face repo id (ORG/NAME)", quote_text(o.repo, '\'')));
  if (to_cache && !ref_name(o.branch))
    throw FixtureError(fmt::format(
        "{} is not a ref name (a branch or tag such as main, v1.0, feature/x, or refs/pr/N)",
        quote_text(o.branch, '\'')));

  FixtureResult result;
  std::string text;
  if (is_builtin_config(o.config)) {
    text = builtin_config_json(o.config);
    result.config_name = "builtin:" + o.config;
  } else {
    struct stat st;
    if (::stat(o.config.c_str(), &st) != 0) {
      std::string names;
      for (const auto& n : builtin_config_names()) names += (names.empty() ? "" : ", ") + n;
      throw FixtureError(
          fmt::format("config {} is neither a built-in config ({}) nor an existing config.json",
                      quote_text(o.config, '\''), names));
    }
    result.config_name = S_ISDIR(st.st_mode) ? o.config + "/config.json" : o.config;
    text = read_text(result.config_name);
  }
  const FamilyConfig config = parse_family_config_text(text, result.config_name);
  if (!o.arch.empty() && o.arch != arch_name(config.arch))
    throw FixtureError(fmt::format("--arch {} but {} is a {} config (model_type {})", o.arch,
                                   result.config_name, arch_name(config.arch), config.model_type));

  std::string dir = out_dir;
  std::string repo_dir;
  if (to_cache) {
    repo_dir = o.hf_cache + "/" + hf_repo_folder_name(o.repo);
    claim_repo(repo_dir, o.repo, o.branch);
    dir = repo_dir + "/.staging-" + std::to_string(::getpid());
  }
  make_dirs(dir);
  if (!dir_is_empty(dir)) throw FixtureError(fmt::format("output directory {} is not empty", dir));
  write_plain(o, config, text, dir, result);
  result.dir = to_cache ? publish_to_cache(dir, repo_dir, o.branch, result) : dir;
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return result;
}

}  // namespace metaload
