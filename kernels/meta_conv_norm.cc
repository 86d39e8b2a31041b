// Meta kernels for convolution, the normalisations and the fused transformer ops: shapes, dtypes
// and strides exactly as libtorch's CPU kernels produce them, argument checks as they make them.
#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/irange.h>

#include <algorithm>

#include "kernels/meta_common.h"

namespace metaload::meta {
namespace {

// ---- convolution ----------------------------------------------------------------------------

// mkldnn_bf16_device_check() / mkldnn_fp16_device_check() (CPU features), read through the ops
// torch exposes them as; false where this libtorch has no such op.
bool mkldnn_supports(const char* op) {
  auto handle = c10::Dispatcher::singleton().findOp(c10::OperatorName(op, ""));
  return handle.has_value() && handle->typed<bool()>().call();
}

// ConvParams::use_mkldnn of 2.x for a CPU convolution: oneDNN takes float when the problem is
// big enough (thresholds copied from Convolution.cpp), bfloat16 / half when the CPU supports
// them, transposed ones unless output_padding >= stride.
bool cpu_conv_uses_mkldnn(const Tensor& input, const Tensor& weight, IntArrayRef stride,
                          IntArrayRef dilation, IntArrayRef output_padding, bool transposed,
                          int64_t groups) {
  if (!at::hasMKLDNN() || !at::globalContext().userEnabledMkldnn()) return false;
  for (auto i : c10::irange(stride.size())) {
    if (transposed && output_padding[i] >= stride[i]) return false;
  }
  static const bool bf16 = mkldnn_supports("mkldnn::_is_mkldnn_bf16_supported");
  static const bool fp16 = mkldnn_supports("mkldnn::_is_mkldnn_fp16_supported");
  const ScalarType t = input.scalar_type();
  if ((t == ScalarType::BFloat16 && bf16) || (t == ScalarType::Half && fp16)) return true;
  if (t != ScalarType::Float) return false;
  auto any_not_one = [](IntArrayRef v) {
    return std::any_of(v.begin(), v.end(), [](int64_t x) { return x != 1; });
  };
  const int64_t n = input.size(0);
  const int64_t w1 = weight.size(-1), w2 = weight.size(-2);
  return (any_not_one(stride) || any_not_one(dilation) || n >= 16 || w1 != 1 || w2 != 1 ||
          at::get_num_threads() > 1) &&
         (groups > 1 || (w1 > 3 && w2 > 3) || n > 1 ||
          n * input.size(1) * input.size(2) * input.size(3) > 20480);
}

// The layout of a CPU convolution's output (determine_backend_memory_format). 2-d convolutions
// (1-d ones run as 2-d on input.contiguous().unsqueeze(2) and weight.unsqueeze(2)) come out
// channels-last when the input or the weight suggests it: mkldnn and thnn both do this, and since
// 2.x the transposed backends too (1.13's are contiguous). 3-d ones are contiguous, except in
// 2.x where oneDNN runs them (mkldnn_conv_use_channels_last, not for double). For a 1-d
// convolution, ChannelsLast means the squeezed (N, C, L) with channels innermost.
MemoryFormat cpu_conv_format(const Tensor& input, const Tensor& weight, bool transposed,
                             IntArrayRef stride, IntArrayRef dilation, IntArrayRef output_padding,
                             int64_t groups) {
  const int64_t dim = weight.dim() - 2;
  if (dim == 3) {
    if (!compat::kCpuConv3dMkldnnChannelsLast3d) return MemoryFormat::Contiguous;
    const bool cl3d = input.suggest_memory_format() == MemoryFormat::ChannelsLast3d ||
                      weight.suggest_memory_format() == MemoryFormat::ChannelsLast3d;
    const bool fp64 =
        input.scalar_type() == ScalarType::Double || weight.scalar_type() == ScalarType::Double;
    return cl3d && !fp64 &&
                   cpu_conv_uses_mkldnn(input, weight, stride, dilation, output_padding, transposed,
                                        groups)
               ? MemoryFormat::ChannelsLast3d
               : MemoryFormat::Contiguous;
  }
  if (transposed && !compat::kCpuConvTransposedFollowsChannelsLast) return MemoryFormat::Contiguous;
  if (dim == 2) {
    return input.suggest_memory_format() == MemoryFormat::ChannelsLast ||
                   weight.suggest_memory_format() == MemoryFormat::ChannelsLast
               ? MemoryFormat::ChannelsLast
               : MemoryFormat::Contiguous;
  }
  // 1-d: a permuted weight can still make the unsqueezed problem channels-last.
  auto unsq = [](IntArrayRef sizes, IntArrayRef strides) {
    c10::SmallVector<int64_t, 4> sz(sizes.begin(), sizes.end());
    c10::SmallVector<int64_t, 4> st(strides.begin(), strides.end());
    sz.insert(sz.begin() + 2, 1);
    st.insert(st.begin() + 2, sizes[2] * strides[2]);
    return suggest_format(sz, st) == MemoryFormat::ChannelsLast;
  };
  // (.contiguous() keeps the strides of a tensor that already is contiguous.)
  auto input_strides = input.is_contiguous() ? c10::SmallVector<int64_t, 5>(input.strides().begin(),
                                                                            input.strides().end())
                                             : contiguous_strides(input.sizes());
  return unsq(input.sizes(), input_strides) || unsq(weight.sizes(), weight.strides())
             ? MemoryFormat::ChannelsLast
             : MemoryFormat::Contiguous;
}

// A convolution's arguments, each list expanded to one value per spatial dimension.
struct ConvParams {
  const char* op;
  int64_t dim;  // spatial dimensions
  c10::SmallVector<int64_t, 4> stride, padding, dilation, output_padding;
  int64_t groups;
  const Tensor* bias;  // null: none
};

// Step 1: the parameters, the dtypes and the weight/input/group shapes at::_convolution checks.
ConvParams conv_params(const char* op, const Tensor& input, const Tensor& weight,
                       const c10::optional<Tensor>& bias_opt, IntArrayRef stride,
                       IntArrayRef padding, IntArrayRef dilation, IntArrayRef output_padding,
                       int64_t groups) {
  const int64_t k = weight.dim();
  META_CHECK(k >= 3, op, "weight should have at least three dimensions, but got weight of size ",
             weight.sizes());
  const int64_t dim = k - 2;
  META_CHECK(groups > 0, op, "non-positive groups is not supported");
  ConvParams p{op,
               dim,
               expand_param(op, "stride", stride, dim),
               expand_param(op, "padding", padding, dim),
               expand_param(op, "dilation", dilation, dim),
               expand_param(op, "output_padding", output_padding, dim),
               groups,
               bias_opt.has_value() && bias_opt->defined() ? &*bias_opt : nullptr};
  const Tensor* bias = p.bias;
  META_CHECK(input.scalar_type() == weight.scalar_type(), op, "Input type (", input.scalar_type(),
             ") and weight type (", weight.scalar_type(), ") should be the same");
  META_CHECK(bias == nullptr || bias->scalar_type() == input.scalar_type(), op, "Input type (",
             input.scalar_type(), ") and bias type (", bias->scalar_type(), ") should be the same");
  for (auto i : c10::irange(dim)) {
    META_CHECK(p.padding[i] >= 0, op, "negative padding is not supported");
    META_CHECK(p.output_padding[i] >= 0, op, "negative output_padding is not supported");
    META_CHECK(p.stride[i] > 0, op, "non-positive stride is not supported");
    META_CHECK(p.dilation[i] > 0, op, "dilation should be greater than zero");
  }
  auto w = weight.sizes();
  META_CHECK(input.dim() == k, op, "Expected ", k, "-dimensional input for ", k,
             "-dimensional weight ", w, ", but got ", input.dim(), "-dimensional input of size ",
             input.sizes(), " instead");
  META_CHECK(w[0] >= groups, op, "Given groups=", groups, ", expected weight to be at least ",
             groups, " at dimension 0, but got weight of size ", w, " instead");
  META_CHECK(w[0] % groups == 0, op, "Given groups=", groups,
             ", expected weight to be divisible by ", groups,
             " at dimension 0, but got weight of size [", w, "] instead");
  return p;
}

// Step 2 (forward): channels and bias against the weight, and the output size.
c10::SmallVector<int64_t, 5> conv_out_sizes(const ConvParams& p, const Tensor& input,
                                            IntArrayRef w) {
  const char* op = p.op;
  const Tensor* bias = p.bias;
  META_CHECK(input.size(1) == w[1] * p.groups, op, "Given groups=", p.groups, ", weight of size ",
             w, ", expected input", input.sizes(), " to have ", w[1] * p.groups,
             " channels, but got ", input.size(1), " channels instead");
  META_CHECK(bias == nullptr || (bias->dim() == 1 && bias->size(0) == w[0]), op,
             "Given weight of size ", w, ", expected bias to be 1-dimensional with ", w[0],
             " elements, but got bias of size ", bias->sizes(), " instead");
  c10::SmallVector<int64_t, 5> out_sizes{input.size(0), w[0]};
  bool fits = true;
  std::string padded, kernel;
  for (auto i : c10::irange(p.dim)) {
    int64_t in = input.size(i + 2) + 2 * p.padding[i];
    int64_t kk = p.dilation[i] * (w[i + 2] - 1) + 1;
    fits = fits && in >= kk;
    padded += (i ? " x " : "") + std::to_string(in);
    kernel += (i ? " x " : "") + std::to_string(kk);
    out_sizes.push_back((in - kk) / p.stride[i] + 1);
  }
  META_CHECK(fits, op, "Calculated padded input size per channel: (", padded, "). Kernel size: (",
             kernel, "). Kernel size can't be greater than actual input size");
  return out_sizes;
}

// Step 2 (transposed): the same for a transposed convolution.
c10::SmallVector<int64_t, 5> conv_transpose_out_sizes(const ConvParams& p, const Tensor& input,
                                                      IntArrayRef w) {
  const char* op = p.op;
  const Tensor* bias = p.bias;
  META_CHECK(input.size(1) == w[0], op, "Given transposed=1, weight of size ", w,
             ", expected input", input.sizes(), " to have ", w[0], " channels, but got ",
             input.size(1), " channels instead");
  META_CHECK(bias == nullptr || (bias->dim() == 1 && bias->size(0) == w[1] * p.groups), op,
             "Given transposed=1, weight of size ", w, ", expected bias to be 1-dimensional with ",
             w[1] * p.groups, " elements, but got bias of size ", bias->sizes(), " instead");
  c10::SmallVector<int64_t, 5> out_sizes{input.size(0), w[1] * p.groups};
  for (auto i : c10::irange(p.dim)) {
    META_CHECK(p.output_padding[i] < p.stride[i] || p.output_padding[i] < p.dilation[i], op,
               "output padding must be smaller than either stride or dilation, but got "
               "output_padding: ",
               p.output_padding[i], ", stride: ", p.stride[i], ", dilation: ", p.dilation[i]);
    int64_t size = (input.size(i + 2) - 1) * p.stride[i] - 2 * p.padding[i] +
                   p.dilation[i] * (w[i + 2] - 1) + p.output_padding[i] + 1;
    META_CHECK(size > 0, op, "Given input size per channel: ", input.sizes().slice(2),
               ", calculated output size is non-positive: ", size);
    out_sizes.push_back(size);
  }
  return out_sizes;
}

// at::_convolution's checks (check_shape_forward and friends) and its output size, in the CPU
// backends' layout (cpu_conv_format).
Tensor conv_impl(const char* op, const Tensor& input, const Tensor& weight,
                 const c10::optional<Tensor>& bias_opt, IntArrayRef stride_in,
                 IntArrayRef padding_in, IntArrayRef dilation_in, bool transposed,
                 IntArrayRef output_padding_in, int64_t groups) {
  const ConvParams p = conv_params(op, input, weight, bias_opt, stride_in, padding_in, dilation_in,
                                   output_padding_in, groups);
  const c10::SmallVector<int64_t, 5> out_sizes =
      transposed ? conv_transpose_out_sizes(p, input, weight.sizes())
                 : conv_out_sizes(p, input, weight.sizes());
  const MemoryFormat format =
      cpu_conv_format(input, weight, transposed, p.stride, p.dilation, p.output_padding, groups);
  if (p.dim == 1 && format == MemoryFormat::ChannelsLast) {
    // (N, C, 1, L) channels-last squeezed back: channels innermost.
    const int64_t c = out_sizes[1], l = out_sizes[2];
    return new_meta(out_sizes, {c * l, 1, c}, input.scalar_type());
  }
  return new_meta(out_sizes, input.scalar_type(), format);
}

Tensor convolution(const Tensor& input, const Tensor& weight, const c10::optional<Tensor>& bias,
                   IntArrayRef stride, IntArrayRef padding, IntArrayRef dilation, bool transposed,
                   IntArrayRef output_padding, int64_t groups) {
  return conv_impl("convolution", input, weight, bias, stride, padding, dilation, transposed,
                   output_padding, groups);
}

Tensor convolution_overrideable(const Tensor& input, const Tensor& weight,
                                const c10::optional<Tensor>& bias, IntArrayRef stride,
                                IntArrayRef padding, IntArrayRef dilation, bool transposed,
                                IntArrayRef output_padding, int64_t groups) {
  return conv_impl("convolution_overrideable", input, weight, bias, stride, padding, dilation,
                   transposed, output_padding, groups);
}

Tensor _convolution(const Tensor& input, const Tensor& weight, const c10::optional<Tensor>& bias,
                    IntArrayRef stride, IntArrayRef padding, IntArrayRef dilation, bool transposed,
                    IntArrayRef output_padding, int64_t groups, bool, bool, bool, bool) {
  return conv_impl("_convolution", input, weight, bias, stride, padding, dilation, transposed,
                   output_padding, groups);
}

// ---- batch norm -----------------------------------------------------------------------------

const Tensor* opt(const c10::optional<Tensor>& t) {
  return t.has_value() && t->defined() ? &*t : nullptr;
}

// CPU batch_norm: output in the input's memory format (see below); save_mean/save_invstd
// of shape (C) when training and (0) in eval, in the parameters' dtype when a BFloat16 input
// comes with Float parameters ("mixed type"), else the input's.
std::tuple<Tensor, Tensor, Tensor> batch_norm_impl(const char* op, const Tensor& input,
                                                   const Tensor* weight, const Tensor* bias,
                                                   const Tensor* mean, const Tensor* var,
                                                   bool training) {
  META_CHECK(input.dim() >= 2, op, "expected an input of at least 2 dimensions (N, C, ...), got ",
             input.sizes());
  const int64_t c = input.size(1);
  const std::pair<const char*, const Tensor*> params[] = {
      {"weight", weight}, {"bias", bias}, {"running_mean", mean}, {"running_var", var}};
  ScalarType param_type = ScalarType::Undefined;
  for (const auto& [name, t] : params) {
    if (t == nullptr) continue;
    META_CHECK(t->numel() == c, op, name, " should contain ", c, " elements not ", t->numel());
    if (param_type == ScalarType::Undefined) param_type = t->scalar_type();
    META_CHECK(t->scalar_type() == param_type, op, "expected scalar type ", param_type,
               " but found ", t->scalar_type());
  }
  const bool mixed = param_type != ScalarType::Undefined && param_type != input.scalar_type();
  if (mixed) {
    META_CHECK(input.scalar_type() == ScalarType::BFloat16, op,
               "mixed dtype (CPU): expect input to have scalar type of BFloat16, got ",
               input.scalar_type(), " with ", param_type, " parameters");
    META_CHECK(param_type == ScalarType::Float, op,
               "mixed dtype (CPU): expect parameter to have scalar type of Float, got ",
               param_type);
  }
  META_CHECK(training || (mean != nullptr && var != nullptr), op,
             "running_mean and running_var must be defined in evaluation mode");
  const ScalarType stat_type = mixed ? ScalarType::Float : input.scalar_type();
  const int64_t stat_size = training ? c : 0;
  // The CPU kernel's fast path takes inputs contiguous in either format (and contiguous
  // parameters) and decides by is_contiguous(), which also settles ambiguous size-1 layouts that
  // suggest_memory_format() would call the other way; the slow path uses suggest_memory_format().
  // 2.x's fast path also takes channels-last-3d inputs.
  const bool cl2d = input.is_contiguous(MemoryFormat::ChannelsLast);
  const bool cl3d = compat::kCpuBatchNormFastPathChannelsLast3d &&
                    input.is_contiguous(MemoryFormat::ChannelsLast3d);
  bool fast = input.is_contiguous() || cl2d || cl3d;
  for (const auto& [name, t] : params) fast = fast && (t == nullptr || t->is_contiguous());
  const MemoryFormat format = !fast                   ? input.suggest_memory_format()
                              : input.is_contiguous() ? MemoryFormat::Contiguous
                              : cl2d                  ? MemoryFormat::ChannelsLast
                                                      : MemoryFormat::ChannelsLast3d;
  return {new_meta(input.sizes(), input.scalar_type(), format), new_meta({stat_size}, stat_type),
          new_meta({stat_size}, stat_type)};
}

std::tuple<Tensor, Tensor, Tensor> native_batch_norm(const Tensor& input,
                                                     const c10::optional<Tensor>& weight,
                                                     const c10::optional<Tensor>& bias,
                                                     const c10::optional<Tensor>& running_mean,
                                                     const c10::optional<Tensor>& running_var,
                                                     bool training, double, double) {
  return batch_norm_impl("native_batch_norm", input, opt(weight), opt(bias), opt(running_mean),
                         opt(running_var), training);
}

// libtorch 2.x splits native_batch_norm into these; registered only where they exist and lack a
// Meta kernel.
std::tuple<Tensor, Tensor, Tensor> native_batch_norm_legit(
    const Tensor& input, const c10::optional<Tensor>& weight, const c10::optional<Tensor>& bias,
    Tensor& running_mean, Tensor& running_var, bool training, double, double) {
  return batch_norm_impl("_native_batch_norm_legit", input, opt(weight), opt(bias), &running_mean,
                         &running_var, training);
}

std::tuple<Tensor, Tensor, Tensor> native_batch_norm_legit_no_stats(
    const Tensor& input, const c10::optional<Tensor>& weight, const c10::optional<Tensor>& bias,
    bool training, double, double) {
  META_CHECK(training, "_native_batch_norm_legit.no_stats",
             "running_mean and running_var must be defined in evaluation mode");
  return batch_norm_impl("_native_batch_norm_legit.no_stats", input, opt(weight), opt(bias),
                         nullptr, nullptr, training);
}

std::tuple<Tensor, Tensor, Tensor> native_batch_norm_legit_no_training(
    const Tensor& input, const c10::optional<Tensor>& weight, const c10::optional<Tensor>& bias,
    const Tensor& running_mean, const Tensor& running_var, double, double) {
  return batch_norm_impl("_native_batch_norm_legit_no_training", input, opt(weight), opt(bias),
                         &running_mean, &running_var, false);
}

// ---- layer norm / group norm ----------------------------------------------------------------

// CPU layer_norm: contiguous output; mean and rstd of shape input.shape[:axis] + [1] * len(norm).
std::tuple<Tensor, Tensor, Tensor> native_layer_norm(const Tensor& input,
                                                     c10::SymIntArrayRef normalized_shape_sym,
                                                     const c10::optional<Tensor>& weight_opt,
                                                     const c10::optional<Tensor>& bias_opt,
                                                     double) {
  const char* op = "native_layer_norm";
  IntArrayRef normalized_shape = concrete(normalized_shape_sym);
  const int64_t nd = normalized_shape.size();
  META_CHECK(nd >= 1, op,
             "Expected normalized_shape to be at least 1-dimensional, i.e., containing at least "
             "one element, but got normalized_shape = ",
             normalized_shape);
  const Tensor* weight = opt(weight_opt);
  const Tensor* bias = opt(bias_opt);
  META_CHECK(weight == nullptr || weight->sizes().equals(normalized_shape), op,
             "Expected weight to be of same shape as normalized_shape, but got weight of shape ",
             weight->sizes(), " and normalized_shape = ", normalized_shape);
  META_CHECK(bias == nullptr || bias->sizes().equals(normalized_shape), op,
             "Expected bias to be of same shape as normalized_shape, but got bias of shape ",
             bias->sizes(), " and normalized_shape = ", normalized_shape);
  const int64_t ndim = input.dim();
  if (ndim < nd || !input.sizes().slice(ndim - nd).equals(normalized_shape)) {
    std::ostringstream ss;
    ss << "Given normalized_shape=" << normalized_shape << ", expected input with shape [*";
    for (auto s : normalized_shape) ss << ", " << s;
    ss << "], but got input of size" << input.sizes();
    fail(op, ss.str());
  }
  c10::SmallVector<int64_t, 5> stat_shape(input.sizes().begin(), input.sizes().end() - nd);
  stat_shape.append(nd, 1);
  // The CPU kernel allocates (M) and views it as stat_shape: contiguous strides.
  return {new_meta(input.sizes(), input.scalar_type()), new_meta(stat_shape, input.scalar_type()),
          new_meta(stat_shape, input.scalar_type())};
}

// CPU group_norm: the input must be contiguous in its suggested format; output in that format,
// mean/rstd (N, group).
std::tuple<Tensor, Tensor, Tensor> native_group_norm(const Tensor& input,
                                                     const c10::optional<Tensor>& weight_opt,
                                                     const c10::optional<Tensor>& bias_opt,
                                                     c10::SymInt n_sym, c10::SymInt c_sym,
                                                     c10::SymInt hxw_sym, int64_t group, double) {
  const char* op = "native_group_norm";
  const int64_t n = concrete(n_sym), c = concrete(c_sym), hxw = concrete(hxw_sym);
  META_CHECK(group > 0, op, "Expected num_groups to be positive, but got num_groups=", group);
  META_CHECK(c % group == 0, op,
             "Expected number of channels in input to be divisible by num_groups, but got input "
             "of shape ",
             input.sizes(), " and num_groups=", group);
  META_CHECK(input.numel() == n * c * hxw, op, "Expected input of ", n, " x ", c, " x ", hxw,
             " elements (N x C x HxW), but got input of size ", input.sizes());
  META_CHECK(input.dim() < 2 || input.size(1) == c, op, "Expected input with ", c,
             " channels, but got input of size ", input.sizes());
  const Tensor* weight = opt(weight_opt);
  const Tensor* bias = opt(bias_opt);
  META_CHECK(weight == nullptr || (weight->dim() == 1 && weight->numel() == c), op,
             "Expected weight to be a vector of size equal to the number of channels in input, "
             "but got weight of shape ",
             weight->sizes(), " and input of shape ", input.sizes());
  META_CHECK(bias == nullptr || (bias->dim() == 1 && bias->numel() == c), op,
             "Expected bias to be a vector of size equal to the number of channels in input, but "
             "got bias of shape ",
             bias->sizes(), " and input of shape ", input.sizes());
  const auto format = input.suggest_memory_format();
  META_CHECK(input.is_contiguous(format), op,
             "Expected X.is_contiguous(memory_format) to be true, but got false (input of size ",
             input.sizes(), " and strides ", input.strides(), ")");
  const ScalarType dtype = input.scalar_type();
  ScalarType stat_type = dtype;
  if (compat::kCpuGroupNormMixedDtype) {
    // Float parameters with a BFloat16 / Half input ("mixed type", check_mixed_data_type); mean
    // and rstd are then Float.
    const bool mixed = (weight != nullptr && weight->scalar_type() != dtype) ||
                       (bias != nullptr && bias->scalar_type() != dtype);
    if (mixed) {
      for (const Tensor* t : {weight, bias}) {
        META_CHECK(t == nullptr || t->scalar_type() == ScalarType::Float, op,
                   "mixed dtype (CPU): expect parameter to have scalar type of Float");
      }
      META_CHECK(dtype == ScalarType::BFloat16 || dtype == ScalarType::Half, op,
                 "mixed dtype (CPU): all inputs must share same datatype.");
      stat_type = ScalarType::Float;
    }
  } else {
    // The CPU kernel reads weight and bias as the input's dtype.
    for (const Tensor* t : {weight, bias}) {
      META_CHECK(t == nullptr || t->scalar_type() == dtype, op, "expected scalar type ", dtype,
                 " but found ", t->scalar_type());
    }
  }
  return {new_meta(input.sizes(), dtype, format), new_meta({n, group}, stat_type),
          new_meta({n, group}, stat_type)};
}

// CPU weight_norm (the fused kernel under torch.nn.utils.weight_norm): w contiguous, the norm
// shaped and strided like g, kept in Float for a BFloat16 g.
std::tuple<Tensor, Tensor> weight_norm_interface(const Tensor& v, const Tensor& g, int64_t dim) {
  const char* op = "_weight_norm_interface";
  META_CHECK(dim == 0 || dim == v.dim() - 1, op,
             "fused weight norm works over the first or last dim only, got dim ", dim, " for v of ",
             v.dim(), " dims");
  META_CHECK(v.dim() == g.dim(), op, "expected g with as many dims as v (", v.dim(),
             "), got g of size ", g.sizes());
  for (int64_t i = 0; i < v.dim(); ++i) {
    META_CHECK(g.size(i) == (i == dim ? v.size(i) : 1), op, "expected g of size ", v.size(dim),
               " along dim ", dim, " and 1 elsewhere, got ", g.sizes(), " for v of size ",
               v.sizes());
  }
  const ScalarType norm_type =
      g.scalar_type() == ScalarType::BFloat16 ? ScalarType::Float : g.scalar_type();
  return {new_meta(v.sizes(), v.scalar_type()), new_meta(g.sizes(), g.strides(), norm_type)};
}

// ---- fused transformer ops (nn.MultiheadAttention / TransformerEncoderLayer fast paths) ------

void check_dim(const char* op, const Tensor& t, int64_t dim, const char* name) {
  META_CHECK(t.dim() == dim, op, "expected ", dim, "-D `", name, "`, got ", t.dim(), "-D tensor");
}

std::tuple<Tensor, Tensor> native_multi_head_attention(
    const Tensor& query, const Tensor& key, const Tensor& value, int64_t embed_dim,
    int64_t num_head, const Tensor& qkv_weight, const Tensor& qkv_bias, const Tensor& proj_weight,
    const Tensor& proj_bias, const c10::optional<Tensor>& mask, bool need_weights,
    bool average_attn_weights, c10::optional<int64_t>) {
  const char* op = "_native_multi_head_attention";
  check_dim(op, query, 3, "query");
  META_CHECK(query.size(2) == embed_dim, op, "passed-in embed_dim ", embed_dim,
             " didn't match last dim of query ", query.size(2));
  check_dim(op, key, 3, "key");
  check_dim(op, value, 3, "value");
  META_CHECK(query.sizes() == key.sizes() && key.sizes() == value.sizes(), op,
             "expected `query`/`key`/`value` shapes to match, got ", query.sizes(), ", ",
             key.sizes(), " and ", value.sizes());
  check_dim(op, qkv_weight, 2, "qkv_weight");
  META_CHECK(qkv_weight.size(0) == 3 * embed_dim, op,
             "expected `qkv_weight` first dim to be 3x embed_dim, got ", qkv_weight.sizes());
  META_CHECK(qkv_weight.size(1) == embed_dim, op,
             "expected `qkv_weight` second dim to be embed_Dim, got ", qkv_weight.sizes());
  check_dim(op, qkv_bias, 1, "qkv_bias");
  META_CHECK(qkv_bias.size(0) == 3 * embed_dim, op,
             "expected `qkv_bias` first dim and first dim of query to be equal, got ",
             qkv_bias.sizes());
  META_CHECK(num_head > 0 && embed_dim % num_head == 0, op,
             "`embed_dim` must divide evenly by `num_heads`, got embed_dim=", embed_dim,
             " and num_heads=", num_head);
  META_CHECK(proj_weight.dim() == 2 && proj_weight.size(0) == embed_dim &&
                 proj_weight.size(1) == embed_dim,
             op, "expected `proj_weight` of shape [", embed_dim, ", ", embed_dim, "], got ",
             proj_weight.sizes());
  const int64_t b = query.size(0), t = query.size(1), s = key.size(1);
  Tensor out = new_meta({b, t, embed_dim}, query.scalar_type());
  if (!need_weights) return {out, Tensor()};
  Tensor weights = average_attn_weights ? new_meta({b, t, s}, query.scalar_type())
                                        : new_meta({b, num_head, t, s}, query.scalar_type());
  return {out, weights};
}

Tensor transformer_encoder_layer_fwd(const Tensor& src, int64_t embed_dim, int64_t num_heads,
                                     const Tensor& qkv_weight, const Tensor& qkv_bias,
                                     const Tensor& proj_weight, const Tensor& proj_bias, bool, bool,
                                     double, const Tensor& norm_weight_1, const Tensor& norm_bias_1,
                                     const Tensor& norm_weight_2, const Tensor& norm_bias_2,
                                     const Tensor& ffn_weight_1, const Tensor& ffn_bias_1,
                                     const Tensor& ffn_weight_2, const Tensor& ffn_bias_2,
                                     const c10::optional<Tensor>& mask,
                                     c10::optional<int64_t> mask_type) {
  const char* op = "_transformer_encoder_layer_fwd";
  check_dim(op, src, 3, "src");
  // The attention block checks what MHA checks.
  native_multi_head_attention(src, src, src, embed_dim, num_heads, qkv_weight, qkv_bias,
                              proj_weight, proj_bias, mask, false, false, mask_type);
  for (const Tensor* t : {&norm_weight_1, &norm_bias_1, &norm_weight_2, &norm_bias_2}) {
    META_CHECK(t->dim() == 1 && t->size(0) == embed_dim, op,
               "expected layer norm parameters of shape [", embed_dim, "], got ", t->sizes());
  }
  META_CHECK(ffn_weight_1.dim() == 2 && ffn_weight_1.size(1) == embed_dim, op,
             "expected `ffn_weight_1` of shape [dim_feedforward, ", embed_dim, "], got ",
             ffn_weight_1.sizes());
  const int64_t ff = ffn_weight_1.size(0);
  META_CHECK(ffn_bias_1.dim() == 1 && ffn_bias_1.size(0) == ff, op,
             "expected `ffn_bias_1` of shape [", ff, "], got ", ffn_bias_1.sizes());
  META_CHECK(
      ffn_weight_2.dim() == 2 && ffn_weight_2.size(0) == embed_dim && ffn_weight_2.size(1) == ff,
      op, "expected `ffn_weight_2` of shape [", embed_dim, ", ", ff, "], got ",
      ffn_weight_2.sizes());
  META_CHECK(ffn_bias_2.dim() == 1 && ffn_bias_2.size(0) == embed_dim, op,
             "expected `ffn_bias_2` of shape [", embed_dim, "], got ", ffn_bias_2.sizes());
  return new_meta(src.sizes(), src.scalar_type());
}

// q, k and v are (B, H, T, D/H) views into one (3, B, H, T, D/H) buffer, as on CPU.
std::tuple<Tensor, Tensor, Tensor> transform_bias_rescale_qkv(const Tensor& qkv,
                                                              const Tensor& qkv_bias,
                                                              int64_t num_heads) {
  const char* op = "_transform_bias_rescale_qkv";
  check_dim(op, qkv, 3, "qkv");
  const int64_t b = qkv.size(0), t = qkv.size(1), three_d = qkv.size(2);
  META_CHECK(three_d % 3 == 0, op, "qkv last dim must be a multiple of 3, got ", qkv.sizes());
  const int64_t d = three_d / 3;
  META_CHECK(num_heads > 0 && d % num_heads == 0, op, "embed_dim ", d,
             " must divide evenly by num_heads ", num_heads);
  META_CHECK(qkv_bias.dim() == 1 && qkv_bias.size(0) == three_d, op,
             "expected `qkv_bias` of shape [", three_d, "], got ", qkv_bias.sizes());
  const int64_t dh = d / num_heads;
  Tensor all = new_meta({3, b, num_heads, t, dh}, qkv.scalar_type());
  c10::SmallVector<int64_t, 4> sizes{b, num_heads, t, dh};
  auto strides = contiguous_strides(sizes);
  const int64_t each = b * num_heads * t * dh;
  return {view_of(all, sizes, strides, 0), view_of(all, sizes, strides, each),
          view_of(all, sizes, strides, 2 * each)};
}

// CPU 2.x: a mask that is not 2-d (or an input that is not 4-d) counts as mask_type 2 and must
// have the input's shape; type 1 takes a (B, L) padding mask and type 0 an (L, L) attention mask
// for a (B, H, L, L) input. Whether the type is given at all (and is 0, 1 or 2) is only checked
// after the dtype. The output is like the input (layout preserved).
Tensor masked_softmax_inferred_type(const Tensor& input, const Tensor& mask,
                                    c10::optional<int64_t> dim,
                                    c10::optional<int64_t> mask_type_arg) {
  const char* op = "_masked_softmax";
  META_CHECK(mask.scalar_type() == ScalarType::Bool, op, "Mask should be a boolean tensor");
  c10::optional<int64_t> mask_type = mask_type_arg;
  if (mask.dim() != 2 || input.dim() != 4) mask_type = 2;
  if (mask_type == 2) {
    META_CHECK(input.sizes() == mask.sizes(), op,
               "For mask_type == 2 mask shape should match input shape, got mask of size ",
               mask.sizes(), " for input of size ", input.sizes());
  } else if (mask_type == 1) {
    META_CHECK(input.size(0) == mask.size(0) && input.size(2) == mask.size(1), op,
               "For mask_type == 1 mask shape should be (B, L), got mask of size ", mask.sizes(),
               " for input of size ", input.sizes());
  } else if (mask_type == 0) {
    META_CHECK(input.size(2) == mask.size(0) && input.size(2) == mask.size(1), op,
               "For mask_type == 0 mask shape should be (L, L), got mask of size ", mask.sizes(),
               " for input of size ", input.sizes());
  }
  if (dim.has_value()) wrap_dim(op, *dim, input.dim());
  META_CHECK(at::isFloatingType(input.scalar_type()), op,
             "\"masked_softmax\" not implemented for '", input.scalar_type(), "'");
  META_CHECK(mask_type.has_value(), op, "Mask Type should be defined");
  META_CHECK(*mask_type >= 0 && *mask_type <= 2, op,
             "Mask Type should be 0 (src_mask) or 1 (src_key_padding_mask), or 2 (default_mask)");
  return new_meta_like(input, input.scalar_type());
}

// CPU 1.13 wants the mask in the input's shape and a mask_type; the CUDA kernel also takes an
// (L, L) src mask (type 0) or a (B, L) key padding mask (type 1) for a (B, H, L, L) input. The
// output is like the input (layout preserved).
Tensor masked_softmax_given_type(const Tensor& input, const Tensor& mask,
                                 c10::optional<int64_t> dim, c10::optional<int64_t> mask_type) {
  const char* op = "_masked_softmax";
  META_CHECK(mask.scalar_type() == ScalarType::Bool, op, "Mask should be a boolean tensor, got ",
             mask.scalar_type());
  const bool same_shape = mask.sizes() == input.sizes();
  const bool src_mask = mask_type == 0 && input.dim() == 4 && mask.dim() == 2 &&
                        mask.size(0) == input.size(2) && mask.size(1) == input.size(3);
  const bool padding_mask = mask_type == 1 && input.dim() == 4 && mask.dim() == 2 &&
                            mask.size(0) == input.size(0) && mask.size(1) == input.size(3);
  META_CHECK(same_shape || src_mask || padding_mask, op,
             "Mask shape should match input shape, got mask of size ", mask.sizes(),
             " for input of size ", input.sizes());
  META_CHECK(mask_type.has_value(), op, "Mask Type should be defined");
  META_CHECK(*mask_type >= 0 && *mask_type <= 2, op, "Mask Type should be 0, 1 or 2, got ",
             *mask_type);
  META_CHECK(at::isFloatingType(input.scalar_type()), op, "expected a floating point input, got ",
             input.scalar_type());
  if (dim.has_value()) wrap_dim(op, *dim, input.dim());
  return new_meta_like(input, input.scalar_type());
}

Tensor masked_softmax(const Tensor& input, const Tensor& mask, c10::optional<int64_t> dim,
                      c10::optional<int64_t> mask_type) {
  return compat::kCpuMaskedSoftmaxInfersMaskType
             ? masked_softmax_inferred_type(input, mask, dim, mask_type)
             : masked_softmax_given_type(input, mask, dim, mask_type);
}

}  // namespace

const std::vector<KernelDef>& conv_norm_kernels() {
  static const std::vector<KernelDef> table = {
      METALOAD_META_KERNEL("convolution", convolution),
      METALOAD_META_KERNEL("_convolution", _convolution),
      METALOAD_META_KERNEL("convolution_overrideable", convolution_overrideable),
      METALOAD_META_KERNEL("native_batch_norm", native_batch_norm),
      METALOAD_META_KERNEL("_native_batch_norm_legit", native_batch_norm_legit),
      METALOAD_META_KERNEL("_native_batch_norm_legit.no_stats", native_batch_norm_legit_no_stats),
      METALOAD_META_KERNEL("_native_batch_norm_legit_no_training",
                           native_batch_norm_legit_no_training),
      METALOAD_META_KERNEL("native_layer_norm", native_layer_norm),
      METALOAD_META_KERNEL("native_group_norm", native_group_norm),
      METALOAD_META_KERNEL("_weight_norm_interface", weight_norm_interface),
      METALOAD_META_KERNEL("_native_multi_head_attention", native_multi_head_attention),
      METALOAD_META_KERNEL("_transformer_encoder_layer_fwd", transformer_encoder_layer_fwd),
      METALOAD_META_KERNEL("_transform_bias_rescale_qkv", transform_bias_rescale_qkv),
      METALOAD_META_KERNEL("_masked_softmax", masked_softmax),
  };
  return table;
}

}  // namespace metaload::meta
