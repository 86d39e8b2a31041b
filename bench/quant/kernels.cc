// bench/quant kernels: the CPU dequantization kernels alone, per element, on one thread.
//
// One [4096, 4096] weight of each scheme (random codes; scales, FP8 codes and NVFP4 scales
// finite, as checkpoints hold them) into bf16, through dequant_cpu_jobs with one thread and a sink
// that takes each tile (a load's path without the page fills): the AVX2 kernels against the
// portable ones (the anchor, measured in the same run), min of ROUNDS. The packed inputs stay in
// the caches between rounds here; in a load they come from memory, which is what
// bench/quant/load.py measures.
//   bench_quant [rounds]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "kernels/dequant.h"

namespace {

using metaload::DequantDst;
using metaload::QuantScheme;
using metaload::QuantView;

constexpr int64_t kDim = 4096;

// Random packed words, finite f32 scales, a 16-entry code table and one global scale.
struct Data {
  std::vector<uint32_t> words, zeros;
  std::vector<float> scales, code;
  std::vector<int32_t> g_idx, g_idx512;
  float global = 1.5f;
  Data() : words(kDim * kDim / 4), zeros(kDim * kDim / 64), scales(kDim * kDim / 8) {
    std::mt19937 rng(1);
    for (uint32_t& w : words) w = rng();
    for (uint32_t& w : zeros) w = rng();
    for (float& s : scales) s = 0.001f + static_cast<float>(rng() % 1000) * 1e-5f;
    for (int n = 0; n < 16; ++n) code.push_back(static_cast<float>(n - 8) / 8.0f);
    for (int64_t i = 0; i < kDim; ++i) g_idx.push_back(static_cast<int32_t>(i % (kDim / 128)));
    // Act order with 512 groups (of 8 here): as many as a [4096, 16384] weight in groups of 32
    // has, the layout of the common "32g, act order" checkpoints.
    for (int64_t i = 0; i < kDim; ++i) g_idx512.push_back(static_cast<int32_t>(i / 8));
    std::shuffle(g_idx512.begin(), g_idx512.end(), rng);
  }
};

// The scheme's view of `data`, shaped as its checkpoints are (groups of 128, bnb blocks of 64,
// FP8 blocks of 128 x 128, NVFP4 groups of 16).
QuantView view(const std::string& scheme, Data& data, std::vector<uint8_t>& bytes) {
  QuantView v;
  v.out = kDim;
  v.in = kDim;
  v.q = data.words.data();
  v.zeros = data.zeros.data();
  v.scales = data.scales.data();
  v.group_size = 128;
  v.groups = kDim / 128;
  if (scheme == "gptq4" || scheme == "gptq4-act" || scheme == "gptq4-act-512g") {
    v.scheme = QuantScheme::kGptq;
    if (scheme == "gptq4-act") v.g_idx = data.g_idx.data();
    if (scheme == "gptq4-act-512g") {
      v.g_idx = data.g_idx512.data();
      v.group_size = 8;
      v.groups = 512;
    }
  } else if (scheme == "awq4") {
    v.scheme = QuantScheme::kAwq;
  } else if (scheme == "nf4") {
    v.scheme = QuantScheme::kBnb4;
    v.code = data.code.data();
    v.group_size = 64;
  } else if (scheme == "int8") {
    v.scheme = QuantScheme::kBnb8;
  } else if (scheme == "ct-int4") {
    v.scheme = QuantScheme::kCtInt;
  } else {
    // FP8 codes and NVFP4's e4m3 scales without the NaN code (S.1111.111).
    bytes.assign(reinterpret_cast<const uint8_t*>(data.words.data()),
                 reinterpret_cast<const uint8_t*>(data.words.data()) + data.words.size() * 4);
    for (uint8_t& b : bytes) b = (b & 0x7F) == 0x7F ? b ^ 1 : b;
    if (scheme == "fp8") {
      v.scheme = QuantScheme::kFp8;
      v.q = bytes.data();
      v.block_in = 128;
    } else {
      v.scheme = QuantScheme::kNvfp4;
      v.scales = bytes.data();
      v.group_size = 16;
      v.groups = kDim / 16;
      v.global_scale = &data.global;
    }
  }
  return v;
}

double ns_per_element(const QuantView& v, std::vector<uint8_t>& out, int rounds) {
  DequantDst d;
  d.data = out.data();
  d.format = 2;  // bf16
  d.ld = kDim;
  d.rows = kDim;
  d.cols = kDim;
  double best = 1e30;
  for (int r = 0; r < rounds; ++r) {
    const double t0 = metaload::bench::now_s();
    metaload::dequant_cpu_jobs({{v, d}}, 1, nullptr, [](void*, const void*, size_t) {});
    best = std::min(best, metaload::bench::now_s() - t0);
  }
  return best * 1e9 / static_cast<double>(kDim * kDim);
}

}  // namespace

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 15;
  Data data;
  std::vector<uint8_t> out(kDim * kDim * 2), bytes;
  std::printf(
      "bench/quant kernels: [%lld, %lld] -> bf16, one thread, tiles into a sink (no page fills), "
      "min of %d\n\n",
      static_cast<long long>(kDim), static_cast<long long>(kDim), rounds);
  std::printf("| scheme | portable ns/element (anchor) | AVX2 ns/element | x anchor |\n");
  std::printf("|---|---|---|---|\n");
  const bool vector = metaload::dequant_vector_kernels();
  for (const char* s :
       {"gptq4", "gptq4-act", "gptq4-act-512g", "awq4", "nf4", "int8", "fp8", "ct-int4", "nvfp4"}) {
    const QuantView v = view(s, data, bytes);
    metaload::set_dequant_vector_kernels(false);
    const double portable = ns_per_element(v, out, rounds);
    metaload::set_dequant_vector_kernels(true);
    if (!vector) {
      std::printf("| %s | %.3f | (no AVX2 / F16C) | |\n", s, portable);
      continue;
    }
    const double avx2 = ns_per_element(v, out, rounds);
    std::printf("| %s | %.3f | %.3f | %.2f |\n", s, portable, avx2, portable / avx2);
  }
  return 0;
}
