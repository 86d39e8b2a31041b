#include "loader/format/writer.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <limits>
#include <memory>

#include <nlohmann/json.hpp>

#include "base/checked.h"
#include "base/unique_fd.h"
#include "loader/format/json_util.h"

namespace metaload {
namespace {

// Collects bytes and writes them in large pwrite calls; holes (zero tensors without a source) are
// skipped so the file system allocates nothing for them.
class BlockWriter {
 public:
  BlockWriter(int fd, const std::string& path, uint64_t block)
      : fd_(fd), path_(path), buf_(new char[block]), cap_(block) {}

  void append(const void* data, uint64_t n) {
    const char* p = static_cast<const char*>(data);
    while (n > 0) {
      uint64_t k = std::min(n, cap_ - used_);
      std::memcpy(buf_.get() + used_, p, k);
      used_ += k;
      p += k;
      n -= k;
      if (used_ == cap_) flush();
    }
  }
  // Lets `fill` write up to `n` bytes straight into the buffer, block by block.
  template <typename Fill>
  void append_from(uint64_t n, Fill fill) {
    uint64_t done = 0;
    while (done < n) {
      uint64_t k = std::min(n - done, cap_ - used_);
      fill(done, buf_.get() + used_, k);
      used_ += k;
      done += k;
      if (used_ == cap_) flush();
    }
  }
  void skip(uint64_t n) {
    flush();
    offset_ += n;
  }
  void flush() {
    uint64_t done = 0;
    while (done < used_) {
      ssize_t r =
          ::pwrite(fd_, buf_.get() + done, used_ - done, static_cast<off_t>(offset_ + done));
      if (r < 0) {
        if (errno == EINTR) continue;
        throw FormatError(path_, "", "write-failed",
                          "write at offset " + std::to_string(offset_ + done) +
                              " failed: " + std::strerror(errno));
      }
      done += static_cast<uint64_t>(r);
    }
    offset_ += used_;
    used_ = 0;
  }
  uint64_t offset() const { return offset_ + used_; }

 private:
  int fd_;
  const std::string& path_;
  std::unique_ptr<char[]> buf_;
  uint64_t cap_, used_ = 0, offset_ = 0;
};

void check_name(const std::string& path, const std::string& name,
                const std::map<std::string, size_t>& names) {
  if (!valid_utf8(name))
    throw FormatError(path, name, "name-not-utf8", "tensor name is not valid UTF-8");
  if (name == "__metadata__") {
    throw FormatError(path, name, "reserved-name",
                      "\"__metadata__\" is reserved for the metadata map");
  }
  if (names.count(name)) throw FormatError(path, name, "duplicate-tensor", "tensor added twice");
}

// Writes `text` to path atomically (temporary file + rename).
void write_text_file(const std::string& path, const std::string& text) {
  std::string tmp = path + ".tmp-" + std::to_string(::getpid());
  UniqueFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (!fd)
    throw FormatError(path, "", "write-failed",
                      std::string("cannot create: ") + std::strerror(errno));
  try {
    BlockWriter w(fd.get(), tmp, std::max<uint64_t>(text.size(), 1));
    w.append(text.data(), text.size());
    w.flush();
  } catch (...) {
    fd.reset();
    ::unlink(tmp.c_str());
    throw;
  }
  fd.reset();
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int e = errno;
    ::unlink(tmp.c_str());
    throw FormatError(path, "", "write-failed", std::string("rename failed: ") + std::strerror(e));
  }
}

}  // namespace

uint64_t tensor_nbytes(DType dtype, const std::vector<int64_t>& shape, const std::string& file,
                       const std::string& name) {
  for (int64_t d : shape) {
    if (d < 0)
      throw FormatError(file, name, "invalid-shape", "negative dimension " + std::to_string(d));
  }
  const std::optional<int64_t> numel = product_or_none<int64_t>(shape);
  if (!numel) {
    throw FormatError(file, name, "size-overflow", "shape has more elements than fit in 63 bits");
  }
  const std::optional<uint64_t> maybe_bits =
      mul_or_none<uint64_t>(static_cast<uint64_t>(*numel), dtype_bits(dtype));
  if (!maybe_bits) {
    throw FormatError(file, name, "size-overflow", "tensor needs more than 2^64 bits");
  }
  const uint64_t bits = *maybe_bits;
  if (bits % 8) {
    throw FormatError(file, name, "misaligned-size",
                      std::to_string(*numel) + " elements of " + dtype_name(dtype) +
                          " are not a whole number of bytes");
  }
  return bits / 8;
}

uint64_t TensorSpec::nbytes() const {
  return tensor_nbytes(dtype, shape, "", name);
}

namespace {

// The dtype's place in the safetensors library's own Dtype enum (measured on safetensors 0.8; the
// F6 pair, which its Python side cannot write, placed as in its Rust source), by which its writers
// order tensors. Sizes never decrease along it, except that the sub-byte F4/F6 sit between BOOL and
// U8 -- harmless for alignment, as no tensor ends in a partial byte (tensor_nbytes).
int safetensors_rank(DType d) {
  static const std::map<DType, int> rank = [] {
    const DType order[] = {DType::BOOL,    DType::F4,          DType::F6_E2M3,     DType::F6_E3M2,
                           DType::U8,      DType::I8,          DType::F8_E5M2,     DType::F8_E4M3,
                           DType::F8_E8M0, DType::F8_E4M3FNUZ, DType::F8_E5M2FNUZ, DType::I16,
                           DType::U16,     DType::F16,         DType::BF16,        DType::I32,
                           DType::U32,     DType::F32,         DType::C64,         DType::F64,
                           DType::I64,     DType::U64};
    static_assert(std::size(order) == kNumDTypes, "every DType needs its safetensors rank");
    std::map<DType, int> r;
    for (DType t : order) r.emplace(t, static_cast<int>(r.size()));
    return r;
  }();
  return rank.at(d);
}

}  // namespace

void sort_for_writing(std::vector<TensorSpec>& specs) {
  std::stable_sort(specs.begin(), specs.end(), [](const TensorSpec& a, const TensorSpec& b) {
    const int ra = safetensors_rank(a.dtype), rb = safetensors_rank(b.dtype);
    if (ra != rb) return ra > rb;
    return a.name < b.name;
  });
}

SafetensorsWriter::SafetensorsWriter(std::string path, std::map<std::string, std::string> metadata)
    : path_(std::move(path)), metadata_(std::move(metadata)) {
  for (const auto& [k, v] : metadata_) {
    if (!valid_utf8(k) || !valid_utf8(v)) {
      throw FormatError(path_, "", "invalid-metadata",
                        "metadata entry " + quote_str(k) + " is not valid UTF-8");
    }
  }
}

void SafetensorsWriter::add(const std::string& name, DType dtype, const std::vector<int64_t>& shape,
                            TensorSource source) {
  check_name(path_, name, names_);
  TensorSpec spec{name, dtype, shape};
  tensor_nbytes(dtype, shape, path_, name);
  names_.emplace(name, entries_.size());
  entries_.push_back({std::move(spec), std::move(source)});
}

void SafetensorsWriter::add_bytes(const std::string& name, DType dtype,
                                  const std::vector<int64_t>& shape, const void* data) {
  const char* base = static_cast<const char*>(data);
  add(name, dtype, shape,
      [base](uint64_t off, void* dst, uint64_t n) { std::memcpy(dst, base + off, n); });
}

std::string SafetensorsWriter::header_json(const std::vector<TensorSpec>& ordered,
                                           const std::map<std::string, std::string>& metadata) {
  std::string h = "{";
  bool first = true;
  if (!metadata.empty()) {
    h += "\"__metadata__\":{";
    bool f = true;
    for (const auto& [k, v] : metadata) {
      if (!f) h += ",";
      f = false;
      h += json_string(k) + ":" + json_string(v);
    }
    h += "}";
    first = false;
  }
  uint64_t off = 0;
  for (const auto& s : ordered) {
    uint64_t n = s.nbytes();
    if (!first) h += ",";
    first = false;
    h += json_string(s.name) + ":{\"dtype\":\"" + dtype_name(s.dtype) + "\",\"shape\":[";
    for (size_t i = 0; i < s.shape.size(); ++i) {
      if (i) h += ",";
      h += std::to_string(s.shape[i]);
    }
    h += "],\"data_offsets\":[" + std::to_string(off) + "," + std::to_string(off + n) + "]}";
    off += n;
  }
  h += "}";
  // Pad with spaces (legal JSON whitespace) so the data starts 8-byte aligned.
  h.append((8 - (8 + h.size()) % 8) % 8, ' ');
  return h;
}

SafetensorsHeader SafetensorsWriter::write() {
  if (written_) throw FormatError(path_, "", "already-written", "write() called twice");
  written_ = true;
  std::vector<TensorSpec> ordered;
  ordered.reserve(entries_.size());
  for (const auto& e : entries_) ordered.push_back(e.spec);
  sort_for_writing(ordered);
  std::string header = header_json(ordered, metadata_);
  uint64_t total = 8 + header.size();
  uint64_t largest = 0;
  for (const auto& s : ordered) {
    uint64_t n = s.nbytes();
    total += n;
    largest = std::max(largest, n);
  }

  std::string tmp = path_ + ".tmp-" + std::to_string(::getpid());
  UniqueFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (!fd)
    throw FormatError(path_, "", "write-failed",
                      std::string("cannot create: ") + std::strerror(errno));
  std::string current;
  try {
    // No bigger buffer than the whole file needs: small fixtures stay cheap.
    BlockWriter w(fd.get(), tmp, std::max<uint64_t>(std::min(block_size_, total), 8));
    unsigned char len[8];
    for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(header.size() >> (8 * i));
    w.append(len, 8);
    w.append(header.data(), header.size());
    for (const auto& s : ordered) {
      current = s.name;
      const TensorSource& src = entries_[names_.at(s.name)].source;
      uint64_t n = s.nbytes();
      if (!src) {
        w.skip(n);
      } else {
        w.append_from(n, [&](uint64_t off, char* dst, uint64_t k) { src(off, dst, k); });
      }
    }
    w.flush();
    // Trailing holes need the size set explicitly.
    if (::ftruncate(fd.get(), static_cast<off_t>(total)) != 0) {
      throw FormatError(path_, "", "write-failed",
                        std::string("ftruncate failed: ") + std::strerror(errno));
    }
  } catch (const Error&) {
    fd.reset();
    ::unlink(tmp.c_str());
    throw;
  } catch (const std::exception& e) {
    fd.reset();
    ::unlink(tmp.c_str());
    throw FormatError(path_, current, "source-failed",
                      std::string("tensor data source failed: ") + e.what());
  }
  if (fd.close() != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    throw FormatError(path_, "", "write-failed",
                      std::string("close failed: ") + std::strerror(err));
  }
  if (::rename(tmp.c_str(), path_.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    throw FormatError(path_, "", "write-failed",
                      std::string("rename failed: ") + std::strerror(err));
  }
  return parse_safetensors_header(std::string_view(header), total, path_);
}

std::vector<size_t> plan_shards(const std::vector<uint64_t>& sizes, const ShardOptions& o) {
  const size_t n = sizes.size();
  std::vector<size_t> starts;
  if (o.max_shard_bytes && o.num_shards) {
    throw ShardError("", "", "invalid-options", "give max_shard_bytes or num_shards, not both");
  }
  if (o.num_shards < 0) {
    throw ShardError("", "", "invalid-options",
                     "num_shards must be positive, got " + std::to_string(o.num_shards));
  }
  if (n == 0) return {0};
  if (o.max_shard_bytes) {
    uint64_t cur = 0;
    starts.push_back(0);
    for (size_t i = 0; i < n; ++i) {
      if (cur > 0 && cur + sizes[i] > o.max_shard_bytes) {
        starts.push_back(i);
        cur = 0;
      }
      cur += sizes[i];
    }
    return starts;
  }
  if (o.num_shards <= 1) return {0};
  const size_t k = static_cast<size_t>(o.num_shards);
  if (k > n) {
    throw ShardError("", "", "invalid-options",
                     std::to_string(k) + " shards asked for but there are only " +
                         std::to_string(n) + " tensors");
  }
  std::vector<long double> prefix(n + 1, 0);
  for (size_t i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + sizes[i];
  const long double total = prefix[n];
  size_t start = 0;
  for (size_t s = 0; s < k; ++s) {
    starts.push_back(start);
    size_t remaining = k - s;  // shards still to fill, this one included
    if (remaining == 1) break;
    long double target = total * (s + 1) / k;
    size_t end = start + 1;  // every shard holds at least one tensor
    // Take the next tensor while its midpoint is below this shard's share, leaving one tensor for
    // every later shard.
    while (end < n - (remaining - 1) && prefix[end] + sizes[end] / 2.0L <= target) ++end;
    start = end;
  }
  return starts;
}

ShardedSafetensorsWriter::ShardedSafetensorsWriter(std::string dir, ShardOptions options)
    : dir_(std::move(dir)), options_(std::move(options)) {}

void ShardedSafetensorsWriter::add(const std::string& name, DType dtype,
                                   const std::vector<int64_t>& shape, TensorSource source) {
  check_name(dir_, name, names_);
  TensorSpec spec{name, dtype, shape};
  tensor_nbytes(dtype, shape, dir_, name);
  names_.emplace(name, specs_.size());
  specs_.push_back(std::move(spec));
  sources_.push_back(std::move(source));
}

ShardedWriteResult ShardedSafetensorsWriter::write() {
  struct stat st;
  if (::stat(dir_.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    throw ShardError(dir_, "", "not-a-directory", "output directory does not exist");
  }
  std::vector<uint64_t> sizes;
  ShardedWriteResult result;
  for (const auto& s : specs_) {
    sizes.push_back(s.nbytes());
    result.total_size += sizes.back();
  }
  std::vector<size_t> starts = plan_shards(sizes, options_);
  starts.push_back(specs_.size());
  const size_t n_shards = starts.size() - 1;
  const bool indexed = n_shards > 1 || options_.always_index || options_.num_shards >= 1;
  nlohmann::json weight_map = nlohmann::json::object();
  for (size_t s = 0; s < n_shards; ++s) {
    std::string file;
    if (indexed) {
      char buf[64];
      std::snprintf(buf, sizeof buf, "-%05zu-of-%05zu.safetensors", s + 1, n_shards);
      file = options_.prefix + buf;
    } else {
      file = options_.prefix + ".safetensors";
    }
    SafetensorsWriter w(dir_ + "/" + file, options_.metadata);
    for (size_t i = starts[s]; i < starts[s + 1]; ++i) {
      w.add(specs_[i].name, specs_[i].dtype, specs_[i].shape, sources_[i]);
      weight_map[specs_[i].name] = file;
    }
    w.write();
    result.files.push_back(dir_ + "/" + file);
  }
  if (indexed) {
    nlohmann::json index = {{"metadata", {{"total_size", result.total_size}}},
                            {"weight_map", weight_map}};
    result.index_path = dir_ + "/" + options_.prefix + ".safetensors.index.json";
    write_text_file(result.index_path, index.dump(2) + "\n");
  }
  return result;
}

}  // namespace metaload
