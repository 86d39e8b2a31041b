// Helpers shared by the engine tests: scratch files and the bytes a copy job must produce.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/convert.h"
#include "loader/engine/engine.h"

namespace metaload {
namespace testing_util {

namespace fs = std::filesystem;

// Each of `parts` occurs in `text`; a missing one fails the test, showing the text.
inline void expect_contains(const std::string& text, std::initializer_list<const char*> parts) {
  for (const char* part : parts) {
    EXPECT_NE(text.find(part), std::string::npos) << "'" << part << "' not in: " << text;
  }
}

class TempDir {
 public:
  TempDir() {
    const char* base = std::getenv("TEST_TMPDIR");
    std::string tmpl = std::string(base ? base : "/tmp") + "/metaload_engine_XXXXXX";
    if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = tmpl;
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string file(const std::string& name, const std::vector<unsigned char>& bytes) const {
    const std::string p = path_ + "/" + name;
    std::ofstream(p, std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes.data()),
               static_cast<std::streamsize>(bytes.size()));
    return p;
  }

 private:
  std::string path_;
};

inline std::vector<unsigned char> random_bytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<unsigned char> v(n);
  for (size_t i = 0; i < n; i += 4) {
    const uint32_t x = rng();
    std::memcpy(&v[i], &x, std::min<size_t>(4, n - i));
  }
  return v;
}

// What a job's slot must hold, computed straight from the file bytes.
inline std::vector<unsigned char> expected(const CopyJob& j,
                                           const std::vector<unsigned char>& file) {
  std::vector<unsigned char> out(j.dst_bytes());
  for (uint64_t r = 0; r < j.rows; ++r) {
    const unsigned char* src = file.data() + j.offset + r * j.stride();
    unsigned char* dst = out.data() + r * j.dst_row_bytes();
    if (j.convert) {
      convert_cpu(src, j.from, dst, j.to, j.row_bytes / j.unit);
    } else {
      std::memcpy(dst, src, j.row_bytes);
    }
  }
  return out;
}

// Destination memory with canaries on both sides of every slot.
class Slots {
 public:
  static constexpr size_t kPad = 64;
  void* add(uint64_t bytes) {
    bufs_.emplace_back(bytes + 2 * kPad, 0xCD);
    sizes_.push_back(bytes);
    return bufs_.back().data() + kPad;
  }
  std::vector<unsigned char> content(size_t i) const {
    return {bufs_[i].begin() + kPad, bufs_[i].begin() + kPad + sizes_[i]};
  }
  bool canaries_intact(size_t i) const {
    for (size_t k = 0; k < kPad; ++k) {
      if (bufs_[i][k] != 0xCD || bufs_[i][kPad + sizes_[i] + k] != 0xCD) return false;
    }
    return true;
  }

 private:
  std::vector<std::vector<unsigned char>> bufs_;  // never reallocated after add() (moved)
  std::vector<uint64_t> sizes_;
};

inline CopyJob whole(const std::string& name, size_t file, uint64_t offset, uint64_t bytes,
                     uint32_t unit = 4) {
  CopyJob j;
  j.name = name;
  j.file = file;
  j.offset = offset;
  j.row_bytes = bytes;
  j.unit = unit;
  return j;
}

inline CopyJob converting(const std::string& name, size_t file, uint64_t offset, uint64_t elems,
                          FloatFormat from, FloatFormat to) {
  CopyJob j = whole(name, file, offset, elems * float_format_size(from),
                    static_cast<uint32_t>(float_format_size(from)));
  j.convert = true;
  j.from = from;
  j.to = to;
  return j;
}

inline CopyJob strided(const std::string& name, size_t file, uint64_t offset, uint64_t rows,
                       uint64_t row_bytes, uint64_t stride, uint32_t unit = 4) {
  CopyJob j = whole(name, file, offset, row_bytes, unit);
  j.rows = rows;
  j.row_stride = stride;
  return j;
}

struct Scenario {
  TempDir dir;
  std::vector<std::vector<unsigned char>> data;
  std::vector<std::string> files;
  std::vector<CopyJob> jobs;
  Slots slots;

  void add_file(size_t bytes, uint32_t seed) {
    data.push_back(random_bytes(bytes, seed));
    files.push_back(dir.file("shard" + std::to_string(files.size()) + ".bin", data.back()));
  }
  void add(CopyJob j) {
    j.dst = slots.add(j.dst_bytes());
    jobs.push_back(j);
  }
  // Every slot holds its bytes and nothing was written outside it.
  void check() const {
    for (size_t i = 0; i < jobs.size(); ++i) {
      EXPECT_EQ(slots.content(i), expected(jobs[i], data[jobs[i].file])) << jobs[i].name;
      EXPECT_TRUE(slots.canaries_intact(i)) << jobs[i].name;
    }
  }
};

// Two shards with every kind of job: whole tensors, conversions in all six directions, gathered
// and row-by-row strided slices (copied and converted), an empty tensor, and two slots from the
// same stored bytes.
inline void build_mixed(Scenario& s) {
  s.add_file(4 << 20, 1);
  s.add_file((2 << 20) + 1000, 2);
  using F = FloatFormat;
  s.add(whole("embed", 0, 0, 1 << 20));
  s.add(whole("norm", 0, 1 << 20, 4096));
  s.add(whole("bias", 0, (1 << 20) + 4096, 4000));
  s.add(converting("q", 0, (1 << 20) + 8096, 100000, F::kF32, F::kBF16));
  s.add(converting("k", 0, (1 << 20) + 408096, 50001, F::kF32, F::kF16));
  s.add(converting("v", 1, 0, 300000, F::kBF16, F::kF32));
  s.add(converting("o", 1, 600000, 77777, F::kF16, F::kF32));
  s.add(converting("up", 1, 800000, 100000, F::kBF16, F::kF16));
  s.add(converting("gate", 1, 1000000, 100000, F::kF16, F::kBF16));
  s.add(strided("down.gather", 0, 2 << 20, 200, 512, 2048));
  CopyJob conv = strided("down.convert", 1, 1200000, 100, 1024, 4096);
  conv.convert = true;
  conv.from = F::kF32;
  conv.to = F::kBF16;
  s.add(conv);
  s.add(strided("rows.direct", 0, (2 << 20) + 500000, 3, 300000, 400000, 2));
  s.add(whole("empty", 1, 5000, 0));
  s.add(whole("tied.copy", 0, 1 << 20, 4096));  // same bytes as "norm"
}

}  // namespace testing_util
}  // namespace metaload
