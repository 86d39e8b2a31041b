// torch.ops.metaload.dequant_*: the dequantization kernels (dequant.h) on tensors, CPU or CUDA
// (the kernels of the inputs' device), for tests and for callers holding quantized tensors.
// Each takes the stored tensors as the quantizing library writes them and returns the logical
// [out, in] weight (or the window [row0, rows, col0, cols] of it) in `dtype`.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <string>
#include <vector>

#include "base/torch_library.h"
#include "kernels/dequant.h"

namespace metaload {
namespace {

[[noreturn]] void bad(const char* op, const std::string& what) {
  throw ShapeError(std::string(op) + ": " + what);
}

std::string shape_of(const at::Tensor& t) {
  std::string s = "[";
  for (int64_t i = 0; i < t.dim(); ++i) s += (i ? ", " : "") + std::to_string(t.size(i));
  return s + "]";
}

int format_of(const char* op, const std::string& what, at::ScalarType t) {
  switch (t) {
    case at::kFloat:
      return 0;
    case at::kHalf:
      return 1;
    case at::kBFloat16:
      return 2;
    default:
      bad(op, what + " must be float32, float16 or bfloat16, not " + std::string(c10::toString(t)));
  }
}

// The tensor, contiguous, on `device`, with `dim` dims and `elem` bytes per element.
at::Tensor input(const char* op, const std::string& what, const at::Tensor& t, at::Device device,
                 int64_t dim, size_t elem) {
  if (!t.defined()) bad(op, what + " is undefined");
  if (t.device() != device) {
    bad(op, what + " is on " + t.device().str() + ", the weight on " + device.str());
  }
  if (dim >= 0 && t.dim() != dim) {
    bad(op, what + " has shape " + shape_of(t) + ", expected " + std::to_string(dim) + " dims");
  }
  if (elem != 0 && t.element_size() != elem) {
    bad(op, what + " is " + std::string(c10::toString(t.scalar_type())) + ", expected " +
                std::to_string(elem) + "-byte elements");
  }
  return t.contiguous();
}

void expect_shape(const char* op, const std::string& what, const at::Tensor& t,
                  std::vector<int64_t> shape) {
  if (t.sizes().vec() != shape) {
    std::string want = "[";
    for (size_t i = 0; i < shape.size(); ++i) want += (i ? ", " : "") + std::to_string(shape[i]);
    bad(op, what + " has shape " + shape_of(t) + ", expected " + want + "]");
  }
}

// Allocates the output, fills the view's window into it on the tensors' device.
at::Tensor run(const char* op, QuantView v, c10::optional<at::ScalarType> dtype_opt,
               const c10::optional<std::vector<int64_t>>& window, at::Device device,
               const at::Tensor& g_idx_host = at::Tensor()) {
  const at::ScalarType dtype = dtype_opt.value_or(at::kBFloat16);  // None: bfloat16
  DequantDst d;
  d.format = format_of(op, "dtype", dtype);
  d.rows = v.out;
  d.cols = v.in;
  if (window) {
    if (window->size() != 4) bad(op, "window is [row0, rows, col0, cols]");
    d.row0 = (*window)[0];
    d.rows = (*window)[1];
    d.col0 = (*window)[2];
    d.cols = (*window)[3];
  }
  at::Tensor out = at::empty({std::max<int64_t>(d.rows, 0), std::max<int64_t>(d.cols, 0)},
                             at::TensorOptions().dtype(dtype).device(device));
  d.data = out.data_ptr();
  d.ld = d.cols;
  if (device.is_cpu()) {
    dequant_cpu(v, d);
  } else if (device.is_cuda()) {
    if (g_idx_host.defined()) {
      QuantView h = v;
      h.g_idx = g_idx_host.data_ptr();
      check_g_idx(h);
    }
    dequant_cuda(v, d, nullptr);
    dequant_cuda_sync(nullptr);
  } else {
    bad(op, "tensors on " + device.str() + " (cpu and cuda have kernels)");
  }
  return out;
}

at::Tensor gptq_op(const at::Tensor& qweight, const at::Tensor& qzeros, const at::Tensor& scales,
                   const c10::optional<at::Tensor>& g_idx, int64_t bits, int64_t group_size,
                   int64_t zero_offset, c10::optional<at::ScalarType> dtype_opt,
                   c10::optional<std::vector<int64_t>> window) {
  const char* op = "dequant_gptq";
  const at::Device dev = qweight.device();
  if (bits != 2 && bits != 4 && bits != 8) bad(op, "bits must be 2, 4 or 8");
  const int64_t pack = 32 / bits;
  QuantView v;
  v.scheme = QuantScheme::kGptq;
  at::Tensor qw = input(op, "qweight", qweight, dev, 2, 4);
  v.in = qw.size(0) * pack;
  v.out = qw.size(1);
  at::Tensor sc = input(op, "scales", scales, dev, 2, 0);
  v.groups = sc.size(0);
  expect_shape(op, "scales", sc, {v.groups, v.out});
  at::Tensor qz = input(op, "qzeros", qzeros, dev, 2, 4);
  expect_shape(op, "qzeros", qz, {v.groups, v.out / pack});
  at::Tensor gi, gi_host;
  if (g_idx) {
    gi = input(op, "g_idx", *g_idx, dev, 1, 4);
    expect_shape(op, "g_idx", gi, {v.in});
    v.g_idx = gi.data_ptr();
    if (dev.is_cuda()) gi_host = gi.cpu();
  }
  v.q = qw.data_ptr();
  v.zeros = qz.data_ptr();
  v.scales = sc.data_ptr();
  v.scales_format = format_of(op, "scales", sc.scalar_type());
  v.bits = static_cast<int>(bits);
  v.group_size = group_size < 0 ? v.in : group_size;  // -1: one group
  v.zero_offset = static_cast<int>(zero_offset);
  return run(op, v, dtype_opt, window, dev, gi_host);
}

at::Tensor awq_op(const at::Tensor& qweight, const at::Tensor& qzeros, const at::Tensor& scales,
                  int64_t group_size, c10::optional<at::ScalarType> dtype_opt,
                  c10::optional<std::vector<int64_t>> window) {
  const char* op = "dequant_awq";
  const at::Device dev = qweight.device();
  QuantView v;
  v.scheme = QuantScheme::kAwq;
  at::Tensor qw = input(op, "qweight", qweight, dev, 2, 4);
  v.in = qw.size(0);
  v.out = qw.size(1) * 8;
  at::Tensor sc = input(op, "scales", scales, dev, 2, 0);
  v.groups = sc.size(0);
  expect_shape(op, "scales", sc, {v.groups, v.out});
  at::Tensor qz = input(op, "qzeros", qzeros, dev, 2, 4);
  expect_shape(op, "qzeros", qz, {v.groups, v.out / 8});
  v.q = qw.data_ptr();
  v.zeros = qz.data_ptr();
  v.scales = sc.data_ptr();
  v.scales_format = format_of(op, "scales", sc.scalar_type());
  v.group_size = group_size < 0 ? v.in : group_size;
  return run(op, v, dtype_opt, window, dev);
}

at::Tensor bnb4_op(const at::Tensor& packed, const at::Tensor& absmax, const at::Tensor& quant_map,
                   std::vector<int64_t> shape, int64_t blocksize,
                   const c10::optional<at::Tensor>& nested_absmax,
                   const c10::optional<at::Tensor>& nested_quant_map, double offset,
                   int64_t nested_blocksize, c10::optional<at::ScalarType> dtype_opt,
                   c10::optional<std::vector<int64_t>> window) {
  const char* op = "dequant_bnb4";
  const at::Device dev = packed.device();
  if (shape.size() != 2) bad(op, "shape must be [out, in]");
  if (blocksize < 1) bad(op, "blocksize must be positive");
  QuantView v;
  v.scheme = QuantScheme::kBnb4;
  v.out = shape[0];
  v.in = shape[1];
  const int64_t n = v.out * v.in;
  at::Tensor q = input(op, "packed weight", packed, dev, -1, 1);
  if (q.numel() != (n + 1) / 2) {
    bad(op, "packed weight has " + std::to_string(q.numel()) + " bytes, shape [" +
                std::to_string(v.out) + ", " + std::to_string(v.in) + "] packs into " +
                std::to_string((n + 1) / 2));
  }
  const int64_t blocks = (n + blocksize - 1) / blocksize;
  const bool nested = nested_absmax.has_value();
  at::Tensor am = input(op, "absmax", absmax, dev, 1, nested ? 1 : 4);
  expect_shape(op, "absmax", am, {blocks});
  at::Tensor qm = input(op, "quant_map", quant_map, dev, 1, 4);
  expect_shape(op, "quant_map", qm, {16});
  at::Tensor na, nq;
  if (nested) {
    if (!nested_quant_map) bad(op, "nested_absmax without nested_quant_map");
    if (nested_blocksize < 1) bad(op, "nested_blocksize must be positive");
    na = input(op, "nested_absmax", *nested_absmax, dev, 1, 4);
    expect_shape(op, "nested_absmax", na, {(blocks + nested_blocksize - 1) / nested_blocksize});
    nq = input(op, "nested_quant_map", *nested_quant_map, dev, 1, 4);
    expect_shape(op, "nested_quant_map", nq, {256});
    v.nested_scales = na.data_ptr();
    v.nested_code = nq.data_ptr();
    v.nested_block = nested_blocksize;
    v.offset = static_cast<float>(offset);
  }
  v.q = q.data_ptr();
  v.scales = am.data_ptr();
  v.code = qm.data_ptr();
  v.group_size = blocksize;
  return run(op, v, dtype_opt, window, dev);
}

at::Tensor bnb8_op(const at::Tensor& weight, const at::Tensor& scb,
                   c10::optional<at::ScalarType> dtype_opt,
                   c10::optional<std::vector<int64_t>> window) {
  const char* op = "dequant_bnb8";
  const at::Device dev = weight.device();
  QuantView v;
  v.scheme = QuantScheme::kBnb8;
  at::Tensor w = input(op, "weight", weight, dev, 2, 1);
  v.out = w.size(0);
  v.in = w.size(1);
  at::Tensor s = input(op, "SCB", scb, dev, 1, 0);
  expect_shape(op, "SCB", s, {v.out});
  v.q = w.data_ptr();
  v.scales = s.data_ptr();
  v.scales_format = format_of(op, "SCB", s.scalar_type());
  return run(op, v, dtype_opt, window, dev);
}

at::Tensor fp8_op(const at::Tensor& weight, const at::Tensor& scale_inv, std::vector<int64_t> block,
                  c10::optional<at::ScalarType> dtype_opt,
                  c10::optional<std::vector<int64_t>> window) {
  const char* op = "dequant_fp8";
  const at::Device dev = weight.device();
  if (block.size() != 2 || block[0] < 1 || block[1] < 1) bad(op, "block is [rows, cols] > 0");
  QuantView v;
  v.scheme = QuantScheme::kFp8;
  at::Tensor w = input(op, "weight", weight, dev, 2, 1);
  v.out = w.size(0);
  v.in = w.size(1);
  at::Tensor s = input(op, "weight_scale_inv", scale_inv, dev, 2, 0);
  expect_shape(op, "weight_scale_inv", s,
               {(v.out + block[0] - 1) / block[0], (v.in + block[1] - 1) / block[1]});
  v.q = w.data_ptr();
  v.scales = s.data_ptr();
  v.scales_format = format_of(op, "weight_scale_inv", s.scalar_type());
  v.group_size = block[0];
  v.block_in = block[1];
  return run(op, v, dtype_opt, window, dev);
}

}  // namespace

METALOAD_LIBRARY_FRAGMENT(m) {
  m.def(
      "dequant_gptq(Tensor qweight, Tensor qzeros, Tensor scales, Tensor? g_idx, int bits=4, "
      "int group_size=128, int zero_offset=1, ScalarType? dtype=None, int[]? window=None) -> "
      "Tensor",
      &gptq_op);
  m.def(
      "dequant_awq(Tensor qweight, Tensor qzeros, Tensor scales, int group_size=128, "
      "ScalarType? dtype=None, int[]? window=None) -> Tensor",
      &awq_op);
  m.def(
      "dequant_bnb4(Tensor packed, Tensor absmax, Tensor quant_map, int[] shape, int blocksize=64, "
      "Tensor? nested_absmax=None, Tensor? nested_quant_map=None, float offset=0., "
      "int nested_blocksize=256, ScalarType? dtype=None, int[]? window=None) -> Tensor",
      &bnb4_op);
  m.def(
      "dequant_bnb8(Tensor weight, Tensor SCB, ScalarType? dtype=None, int[]? window=None) -> "
      "Tensor",
      &bnb8_op);
  m.def(
      "dequant_fp8(Tensor weight, Tensor scale_inv, int[] block=[128, 128], "
      "ScalarType? dtype=None, int[]? window=None) -> Tensor",
      &fp8_op);
  m.def("dequant_cuda_compiled() -> bool", [] { return dequant_cuda_compiled(); });
}

}  // namespace metaload
