// Dequantization kernels: GPTQ, AWQ (GEMM), bitsandbytes NF4/FP4 (with double quantization) and
// LLM.int8, FP8 e4m3 with block scales, into f32, f16 or bf16. The layouts and the per-element
// formulas are in dequant_bits.h (shared with the CUDA kernels in dequant.cu, so both devices write
// the same bits). The output is any window of the logical [out, in] weight (a tensor-parallel
// rank's slice), written straight into the caller's memory: no temporaries of the weight's size.
// Torch ops over these (torch.ops.metaload.dequant_*) are in dequant_ops.cc.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "kernels/convert.h"  // FloatFormat
#include "kernels/dequant_bits.h"
#include "kernels/errors.h"

namespace metaload {

// "gptq", "awq", "bnb4", "bnb8", "fp8".
const char* quant_scheme_name(QuantScheme s);

// The view's own consistency (packing factors divide the dims, groups and blocks cover them,
// formats known) and that the window lies inside the weight. Throws ShapeError naming the rule.
// Reads no data.
void check_dequant(const QuantView& v, const DequantDst& d);

// GPTQ: every g_idx value (host memory) is a group of scales, [0, groups). Throws ShapeError
// naming the first row that is not. The kernels index scales by these values unchecked.
void check_g_idx(const QuantView& v);

// The window of `v` into `d` on the CPU, threaded over rows with at::parallel_for (torch's
// intra-op threads). Calls check_dequant and, for GPTQ with g_idx, check_g_idx first. Runs the
// AVX2 + F16C kernels (dequant_avx2.cc) where the CPU has both and they cover the case, the
// portable ones otherwise: the same bits either way.
void dequant_cpu(const QuantView& v, const DequantDst& d);

// Several windows (a load's quantized weights) on `threads` threads of their own (a load's
// engine threads; 0: the machine's cores), which take tiles of rows of every job in turn. When
// `touch` is set, each thread calls it on a tile's output bytes just before writing them (the
// caller's page policy for fresh memory, e.g. MADV_POPULATE_WRITE as the copying load does). Checks
// every job (as dequant_cpu) before any is written.
struct DequantJob {
  QuantView view;
  DequantDst dst;
};
// Or, when `sink` is set, each tile of a job whose rows are contiguous (ld == cols) is computed
// into a buffer of the thread's and handed to sink(dst, src, bytes) with its place in the output,
// to put there itself (a page copier filling fresh pages in one pass: loader/engine/page_copy.h).
using DequantTouch = std::function<void(void* data, size_t bytes)>;
using DequantSink = std::function<void(void* dst, const void* src, size_t bytes)>;
void dequant_cpu_jobs(const std::vector<DequantJob>& jobs, int threads,
                      const DequantTouch& touch = nullptr, const DequantSink& sink = nullptr);

// Whether dequant_cpu may run the AVX2 kernels (on by default). Tests turn them off to compare
// them with the portable kernels; dequant_vector_kernels() is true when they are on and this CPU
// runs them.
void set_dequant_vector_kernels(bool on);
bool dequant_vector_kernels();

// True when this build compiled the CUDA kernels (nvcc existed); says nothing about a GPU.
bool dequant_cuda_compiled();

// The CUDA twin on device pointers, queued on `stream` (cudaStream_t, nullptr: the default
// stream). Calls check_dequant; g_idx must have been checked (check_g_idx) on a host copy.
// Throws ConversionError when the launch fails or the build has no CUDA kernels.
void dequant_cuda(const QuantView& v, const DequantDst& d, void* stream);

// Waits for `stream`; a kernel that failed on the device throws ConversionError here.
void dequant_cuda_sync(void* stream);

}  // namespace metaload
