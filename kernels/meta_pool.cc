// Meta kernels for pooling, sampling, folding, padding and upsampling ops whose CPU kernels have no
// Meta twin in libtorch 1.13.
#include <c10/util/irange.h>

#include <cmath>

#include "kernels/meta_common.h"

namespace metaload::meta {
namespace {

// Floor division rounding toward negative infinity (ATen's div_rtn).
int64_t div_rtn(int64_t x, int64_t y) {
  int64_t q = x / y;
  int64_t r = x % y;
  if ((r != 0) && ((r < 0) != (y < 0))) --q;
  return q;
}

// ATen's pooling_output_shape (Pool.h), ceil mode included.
int64_t pooling_output_shape(int64_t in, int64_t k, int64_t pad, int64_t stride, int64_t dilation,
                             bool ceil_mode) {
  int64_t out =
      div_rtn(in + 2 * pad - dilation * (k - 1) - 1 + (ceil_mode ? stride - 1 : 0), stride) + 1;
  // The last pooling window must start inside the image.
  if (ceil_mode && (out - 1) * stride >= in + pad) --out;
  return out;
}

// ---- adaptive average pooling ---------------------------------------------------------------

Tensor adaptive_avg_pool2d(const Tensor& input, c10::SymIntArrayRef output_size_sym) {
  const char* op = "adaptive_avg_pool2d()";
  IntArrayRef output_size = concrete(output_size_sym);
  META_CHECK(output_size.size() == 2, op, "output_size must be 2, got ", output_size);
  const int64_t ndim = input.dim();
  META_CHECK(ndim == 3 || ndim == 4, op, "Expected 3D or 4D tensor, but got ", input.sizes());
  for (int64_t i : {ndim - 2, ndim - 1}) {
    META_CHECK(input.size(i) > 0, op,
               "Expected input to have non-zero size for non-batch dimensions, but input has "
               "sizes ",
               input.sizes(), " with dimension ", i, " being empty");
  }
  META_CHECK(output_size[0] >= 0 && output_size[1] >= 0, op,
             "output_size must be non-negative, got ", output_size);
  if (ndim == 3) {
    return new_meta({input.size(0), output_size[0], output_size[1]}, input.scalar_type());
  }
  return new_meta({input.size(0), input.size(1), output_size[0], output_size[1]},
                  input.scalar_type(), input.suggest_memory_format());
}

Tensor adaptive_avg_pool3d(const Tensor& input, IntArrayRef output_size) {
  const char* op = "adaptive_avg_pool3d()";
  META_CHECK(output_size.size() == 3, op, "output_size must be 3, got ", output_size);
  const int64_t ndim = input.dim();
  META_CHECK(ndim == 4 || ndim == 5, op, "Expected 4D or 5D tensor, but got ", input.sizes());
  for (int64_t i = ndim - 3; i < ndim; ++i) {
    META_CHECK(input.size(i) > 0, op,
               "Expected input to have non-zero size for non-batch dimensions, but input has "
               "sizes ",
               input.sizes(), " with dimension ", i, " being empty");
  }
  // Contiguous output whatever the input's layout (1.13 CPU has no channels-last 3d here).
  c10::SmallVector<int64_t, 5> sizes(input.sizes().begin(), input.sizes().end() - 3);
  sizes.append(output_size.begin(), output_size.end());
  return new_meta(sizes, input.scalar_type());
}

// ---- max pool 3d ----------------------------------------------------------------------------

// Whether sizes/strides are dense with dims laid out in `order` (innermost first), size-1 dims
// ignored: TensorImpl's is_contiguous(format) for Contiguous ({n-1, ..., 0}) and
// ChannelsLast3d ({1, 4, 3, 2, 0}).
bool dense_in_order(IntArrayRef sizes, IntArrayRef strides, std::initializer_list<int64_t> order) {
  for (int64_t s : sizes) {
    if (s == 0) return true;
  }
  int64_t expected = 1;
  for (int64_t d : order) {
    if (sizes[d] == 1) continue;
    if (strides[d] != expected) return false;
    expected *= sizes[d];
  }
  return true;
}

std::tuple<Tensor, Tensor> max_pool3d_with_indices(const Tensor& input, IntArrayRef kernel_size,
                                                   IntArrayRef stride_in, IntArrayRef padding_in,
                                                   IntArrayRef dilation_in, bool ceil_mode) {
  const char* op = "max_pool3d_with_indices()";
  META_CHECK(kernel_size.size() == 1 || kernel_size.size() == 3, op,
             "kernel_size must either be a single int, or a tuple of three ints, got ",
             kernel_size);
  META_CHECK(stride_in.empty() || stride_in.size() == 1 || stride_in.size() == 3, op,
             "stride must either be omitted, a single int, or a tuple of three ints, got ",
             stride_in);
  META_CHECK(padding_in.size() == 1 || padding_in.size() == 3, op,
             "padding must either be a single int, or a tuple of three ints, got ", padding_in);
  META_CHECK(dilation_in.size() == 1 || dilation_in.size() == 3, op,
             "dilation must be either a single int, or a tuple of three ints, got ", dilation_in);
  auto k = expand_param(op, "kernel_size", kernel_size, 3);
  auto s = stride_in.empty() ? k : expand_param(op, "stride", stride_in, 3);
  auto p = expand_param(op, "padding", padding_in, 3);
  auto d = expand_param(op, "dilation", dilation_in, 3);
  const int64_t ndim = input.dim();
  META_CHECK(ndim == 4 || ndim == 5, op,
             "Expected 4D or 5D tensor for input, but got: ", input.sizes());
  // 1.13's CPU kernel has no channels-last 3d: contiguous outputs whatever the input's layout.
  MemoryFormat format = MemoryFormat::Contiguous;
  if (compat::kCpuMaxPool3dChannelsLast3d) {
    // 2.x's runs contiguous or channels-last-3d inputs only; a 4-d input whose strides suggest
    // (2-d) channels-last is refused.
    format = input.suggest_memory_format();
    META_CHECK(format == MemoryFormat::Contiguous || format == MemoryFormat::ChannelsLast3d, op,
               "Unsupported memory format. Supports only ChannelsLast3d, Contiguous (input of "
               "size ",
               input.sizes(), " and strides ", input.strides(), ")");
  }
  META_CHECK(k[0] > 0 && k[1] > 0 && k[2] > 0, op,
             "kernel size should be greater than zero, but got kT: ", k[0], " kH: ", k[1],
             " kW: ", k[2]);
  META_CHECK(s[0] > 0 && s[1] > 0 && s[2] > 0, op,
             "stride should be greater than zero, but got dT: ", s[0], " dH: ", s[1],
             " dW: ", s[2]);
  META_CHECK(d[0] > 0 && d[1] > 0 && d[2] > 0, op,
             "dilation should be greater than zero, but got dilationT: ", d[0],
             " dilationH: ", d[1], " dilationW: ", d[2]);
  for (int64_t i = ndim == 5 ? 1 : 0; i < ndim; ++i) {
    META_CHECK(input.size(i) > 0, op,
               "Expected input's non-batch dimensions to have positive length, but input has a "
               "shape of ",
               input.sizes(), " and non-batch dimension ", input.size(i), " has length zero!");
  }
  META_CHECK(k[0] / 2 >= p[0] && k[2] / 2 >= p[2] && k[1] / 2 >= p[1], op,
             "pad should be smaller than or equal to half of kernel size, but got kT: ", k[0],
             " kW: ", k[2], " kH: ", k[1], " padT: ", p[0], " padW: ", p[2], " padH: ", p[1]);
  const int64_t c = input.size(ndim - 4);
  c10::SmallVector<int64_t, 5> sizes(input.sizes().begin(), input.sizes().end() - 3);
  for (auto i : c10::irange(3)) {
    sizes.push_back(
        pooling_output_shape(input.size(ndim - 3 + i), k[i], p[i], s[i], d[i], ceil_mode));
  }
  auto out = sizes.end() - 3;
  META_CHECK(out[0] >= 1 && out[1] >= 1 && out[2] >= 1, op, "Given input size: (", c, "x",
             input.size(ndim - 3), "x", input.size(ndim - 2), "x", input.size(ndim - 1),
             "). Calculated output size: (", c, "x", out[0], "x", out[1], "x", out[2],
             "). Output size is too small");
  if (compat::kCpuMaxPool3dChannelsLast3d && ndim == 4) {
    // 2.x's kernel reruns a non-batched input as input.unsqueeze(0) when that is
    // channels-last-3d contiguous but not contiguous, and squeezes its channels-last-3d outputs.
    const int64_t s5[] = {input.size(0) * input.stride(0), input.stride(0), input.stride(1),
                          input.stride(2), input.stride(3)};
    const int64_t z5[] = {1, input.size(0), input.size(1), input.size(2), input.size(3)};
    if (!dense_in_order(z5, s5, {4, 3, 2, 1, 0}) && dense_in_order(z5, s5, {1, 4, 3, 2, 0})) {
      const int64_t out5[] = {1, sizes[0], sizes[1], sizes[2], sizes[3]};
      auto strides = format_strides(IntArrayRef(out5), MemoryFormat::ChannelsLast3d);
      IntArrayRef squeezed = IntArrayRef(strides).slice(1);
      return {new_meta(sizes, squeezed, input.scalar_type()),
              new_meta(sizes, squeezed, ScalarType::Long)};
    }
  }
  return {new_meta(sizes, input.scalar_type(), format), new_meta(sizes, ScalarType::Long, format)};
}

// ---- grid sampling --------------------------------------------------------------------------

Tensor grid_sampler_impl(const char* op, const Tensor& input, const Tensor& grid, int64_t dims,
                         int64_t interpolation_mode, int64_t padding_mode) {
  META_CHECK(input.dim() == dims + 2 && grid.dim() == dims + 2, op, "expected ", dims + 2,
             "D input and grid with same number of dimensions, but got input with sizes ",
             input.sizes(), " and grid with sizes ", grid.sizes());
  META_CHECK(input.scalar_type() == grid.scalar_type(), op,
             "expected input and grid to have same dtype, but input has ", input.scalar_type(),
             " and grid has ", grid.scalar_type());
  META_CHECK(input.size(0) == grid.size(0), op,
             "expected grid and input to have same batch size, but got input with sizes ",
             input.sizes(), " and grid with sizes ", grid.sizes());
  META_CHECK(grid.size(-1) == dims, op, "expected grid to have size ", dims,
             " in last dimension, but got grid with sizes ", grid.sizes());
  for (int64_t i = 2; i < input.dim(); ++i) {
    META_CHECK(input.size(i) > 0, op,
               "expected input to have non-empty spatial dimensions, but input has sizes ",
               input.sizes(), " with dimension ", i, " being empty");
  }
  META_CHECK(interpolation_mode >= 0 && interpolation_mode <= (dims == 2 ? 2 : 1), op,
             "unsupported interpolation mode ", interpolation_mode);
  META_CHECK(padding_mode >= 0 && padding_mode <= 2, op, "unsupported padding mode ", padding_mode);
  c10::SmallVector<int64_t, 5> sizes{input.size(0), input.size(1)};
  sizes.append(grid.sizes().begin() + 1, grid.sizes().end() - 1);
  return new_meta(sizes, input.scalar_type());
}

Tensor grid_sampler_2d(const Tensor& input, const Tensor& grid, int64_t interpolation_mode,
                       int64_t padding_mode, bool) {
  return grid_sampler_impl("grid_sampler_2d()", input, grid, 2, interpolation_mode, padding_mode);
}

Tensor grid_sampler_3d(const Tensor& input, const Tensor& grid, int64_t interpolation_mode,
                       int64_t padding_mode, bool) {
  return grid_sampler_impl("grid_sampler_3d()", input, grid, 3, interpolation_mode, padding_mode);
}

// ---- im2col / col2im ------------------------------------------------------------------------

struct Window {
  int64_t kh, kw, dh, dw, ph, pw, sh, sw;
};

Window window_params(const char* op, IntArrayRef kernel_size, IntArrayRef dilation,
                     IntArrayRef padding, IntArrayRef stride) {
  const std::pair<const char*, IntArrayRef> lists[] = {{"kernel_size", kernel_size},
                                                       {"dilation", dilation},
                                                       {"padding", padding},
                                                       {"stride", stride}};
  for (const auto& [name, list] : lists) {
    META_CHECK(list.size() == 2, op, "It is expected ", name, " equals to 2, but got size ",
               list.size());
  }
  Window w{kernel_size[0], kernel_size[1], dilation[0], dilation[1],
           padding[0],     padding[1],     stride[0],   stride[1]};
  META_CHECK(w.kw > 0 && w.kh > 0, op,
             "kernel size should be greater than zero, but got "
             "kernel_height: ",
             w.kh, " kernel_width: ", w.kw);
  META_CHECK(w.dw > 0 && w.dh > 0, op,
             "dilation should be greater than zero, but got "
             "dilation_height: ",
             w.dh, " dilation_width: ", w.dw);
  META_CHECK(w.pw >= 0 && w.ph >= 0, op,
             "padding should be non-negative, but got pad_height: ", w.ph, " pad_width: ", w.pw);
  META_CHECK(w.sw > 0 && w.sh > 0, op,
             "stride should be greater than zero, but got "
             "stride_height: ",
             w.sh, " stride_width: ", w.sw);
  return w;
}

Tensor im2col(const Tensor& input, IntArrayRef kernel_size, IntArrayRef dilation,
              IntArrayRef padding, IntArrayRef stride) {
  const char* op = "im2col";
  Window w = window_params(op, kernel_size, dilation, padding, stride);
  const int64_t ndim = input.dim();
  bool valid = (ndim == 3 || ndim == 4) && input.size(ndim - 3) != 0 && input.size(ndim - 2) != 0 &&
               input.size(ndim - 1) != 0;
  META_CHECK(valid, op,
             "Expected 3D or 4D (batch mode) tensor input with possible 0 batch size and non-zero "
             "dimensions, but got: ",
             input.sizes());
  const int64_t h = input.size(ndim - 2), wd = input.size(ndim - 1);
  const int64_t oh = div_rtn(h + 2 * w.ph - (w.dh * (w.kh - 1) + 1), w.sh) + 1;
  const int64_t ow = div_rtn(wd + 2 * w.pw - (w.dw * (w.kw - 1) + 1), w.sw) + 1;
  META_CHECK(oh >= 1 && ow >= 1, op, "Given input with spatial size (", h, ", ", wd,
             "), kernel_size=(", w.kh, ", ", w.kw, "), dilation=(", w.dh, ", ", w.dw,
             "), padding=(", w.ph, ", ", w.pw,
             "), calculated shape of the array of sliding "
             "blocks as (",
             oh, ", ", ow, "), but its components must be at least one.");
  const int64_t planes = input.size(ndim - 3) * w.kh * w.kw;
  if (ndim == 3) return new_meta({planes, oh * ow}, input.scalar_type());
  return new_meta({input.size(0), planes, oh * ow}, input.scalar_type());
}

Tensor col2im(const Tensor& input, c10::SymIntArrayRef output_size_sym, IntArrayRef kernel_size,
              IntArrayRef dilation, IntArrayRef padding, IntArrayRef stride) {
  const char* op = "col2im";
  IntArrayRef output_size = concrete(output_size_sym);
  META_CHECK(output_size.size() == 2, op, "It is expected output_size equals to 2, but got size ",
             output_size.size());
  Window w = window_params(op, kernel_size, dilation, padding, stride);
  const int64_t ndim = input.dim();
  bool valid = (ndim == 2 && input.size(0) != 0 && input.size(1) != 0) ||
               (ndim == 3 && input.size(1) != 0 && input.size(2) != 0);
  META_CHECK(valid, op,
             "Expected 2D or 3D (batch mode) tensor for input with possibly 0 batch size and "
             "non-zero dimensions for input, but got: ",
             input.sizes());
  const int64_t planes = input.size(ndim - 2);
  META_CHECK(planes % (w.kw * w.kh) == 0, op,
             "Expected size of input's dimension 1 to be divisible by the product of "
             "kernel_size, but got input.size(1)=",
             planes, " and kernel_size=(", w.kh, ", ", w.kw, ").");
  const int64_t oh = output_size[0], ow = output_size[1];
  const int64_t bh = div_rtn(oh + 2 * w.ph - w.dh * (w.kh - 1) - 1, w.sh) + 1;
  const int64_t bw = div_rtn(ow + 2 * w.pw - w.dw * (w.kw - 1) - 1, w.sw) + 1;
  META_CHECK(input.size(ndim - 1) == bh * bw, op, "Given output_size=(", oh, ", ", ow,
             "), kernel_size=(", w.kh, ", ", w.kw, "), dilation=(", w.dh, ", ", w.dw,
             "), padding=(", w.ph, ", ", w.pw, "), stride=(", w.sh, ", ", w.sw,
             "), expected size of input's dimension 2 to match the calculated number of sliding "
             "blocks ",
             bh, " * ", bw, " = ", bh * bw, ", but got input.size(2)=", input.size(ndim - 1), ".");
  META_CHECK(bh >= 1 && bw >= 1, op, "Given output_size=(", oh, ", ", ow,
             "), calculated shape of the array of sliding blocks as (", bh, ", ", bw,
             "), which is invalid.");
  const int64_t out_planes = planes / (w.kh * w.kw);
  if (ndim == 2) return new_meta({out_planes, oh, ow}, input.scalar_type());
  return new_meta({input.size(0), out_planes, oh, ow}, input.scalar_type());
}

// ---- upsample_nearest3d.vec (the size-computing entry; the sized op has a Meta kernel) -------

Tensor upsample_nearest3d_impl(const char* op, const Tensor& input,
                               at::OptionalSymIntArrayRef output_size_sym,
                               c10::optional<at::ArrayRef<double>> scale_factors) {
  META_CHECK(input.dim() == 5, op, "It is expected input_size equals to 5, but got size ",
             input.dim());
  META_CHECK(output_size_sym.has_value() != scale_factors.has_value(), op,
             "Must specify exactly one of output_size and scale_factors");
  c10::SmallVector<int64_t, 3> out;
  if (output_size_sym.has_value()) {
    IntArrayRef sizes = concrete(*output_size_sym);
    META_CHECK(sizes.size() == 3, op, "It is expected output_size equals to 3, but got size ",
               sizes.size());
    out.assign(sizes.begin(), sizes.end());
  } else {
    META_CHECK(scale_factors->size() == 3, op, "expected 3 scale factors, got ",
               scale_factors->size());
    for (auto i : c10::irange(3)) {
      out.push_back(
          static_cast<int64_t>(static_cast<double>(input.size(i + 2)) * (*scale_factors)[i]));
    }
  }
  META_CHECK(input.size(2) > 0 && input.size(3) > 0 && input.size(4) > 0 && out[0] > 0 &&
                 out[1] > 0 && out[2] > 0,
             op,
             "Input and output sizes should be greater than 0, but got input (D: ", input.size(2),
             ", H: ", input.size(3), ", W: ", input.size(4), ") output (D: ", out[0],
             ", H: ", out[1], ", W: ", out[2], ")");
  META_CHECK(input.size(1) > 0, op,
             "Non-empty 5D data tensor expected but got a tensor with sizes ", input.sizes());
  return new_meta({input.size(0), input.size(1), out[0], out[1], out[2]}, input.scalar_type(),
                  input.suggest_memory_format());
}

Tensor upsample_nearest3d_vec(const Tensor& input, at::OptionalSymIntArrayRef output_size,
                              c10::optional<at::ArrayRef<double>> scale_factors) {
  return upsample_nearest3d_impl("upsample_nearest3d", input, output_size, scale_factors);
}

Tensor upsample_nearest_exact3d_vec(const Tensor& input, at::OptionalSymIntArrayRef output_size,
                                    c10::optional<at::ArrayRef<double>> scale_factors) {
  return upsample_nearest3d_impl("_upsample_nearest_exact3d", input, output_size, scale_factors);
}

// ---- padding / unpooling / shuffles ---------------------------------------------------------

Tensor reflection_pad2d(const Tensor& input, IntArrayRef padding) {
  const char* op = "reflection_pad2d";
  META_CHECK(padding.size() == 4, op,
             "padding size is expected to be 4, but got: ", padding.size());
  const int64_t ndim = input.dim();
  bool valid = (ndim == 3 || ndim == 4) && input.size(ndim - 3) != 0 && input.size(ndim - 2) != 0 &&
               input.size(ndim - 1) != 0;
  META_CHECK(valid, op,
             "Expected 3D or 4D (batch mode) tensor with possibly 0 batch size and other non-zero "
             "dimensions for input, but got: ",
             input.sizes());
  const int64_t h = input.size(ndim - 2), w = input.size(ndim - 1);
  META_CHECK(padding[0] < w && padding[1] < w, op,
             "Argument #4: Padding size should be less than the corresponding input dimension, "
             "but got: padding (",
             padding[0], ", ", padding[1], ") at dimension ", ndim - 1, " of input ",
             input.sizes());
  META_CHECK(padding[2] < h && padding[3] < h, op,
             "Argument #6: Padding size should be less than the corresponding input dimension, "
             "but got: padding (",
             padding[2], ", ", padding[3], ") at dimension ", ndim - 2, " of input ",
             input.sizes());
  const int64_t oh = h + padding[2] + padding[3], ow = w + padding[0] + padding[1];
  META_CHECK(ow >= 1 && oh >= 1, op, "input (H: ", h, ", W: ", w,
             ") is too small. Calculated output H: ", oh, " W: ", ow);
  c10::SmallVector<int64_t, 4> sizes(input.sizes().begin(), input.sizes().end() - 2);
  sizes.append({oh, ow});
  // 2.x's CPU kernel resizes a batched output to the input's suggested memory format; 1.13's
  // output is contiguous, whatever the input.
  if (compat::kCpuReflectionPad2dKeepsFormat && ndim == 4) {
    return new_meta(sizes, input.scalar_type(), input.suggest_memory_format());
  }
  return new_meta(sizes, input.scalar_type());
}

// max_unpool2d/3d's shared checks: indices shaped as the input, no empty non-batch dimension.
void check_unpool_input(const char* op, const Tensor& input, const Tensor& indices) {
  META_CHECK(input.sizes() == indices.sizes(), op,
             "Expected shape of indices to be same as that of the input tensor (", input.sizes(),
             ") but got indices tensor with shape: ", indices.sizes());
  for (int64_t i = 1; i < input.dim(); ++i) {
    META_CHECK(input.size(i) > 0, op,
               "Expected input to have non-zero size for non-batch dimensions, but got ",
               input.sizes(), " with dimension ", i, " being empty.");
  }
}

Tensor max_unpool2d(const Tensor& input, const Tensor& indices, IntArrayRef output_size) {
  const char* op = "max_unpool2d";
  META_CHECK(indices.scalar_type() == ScalarType::Long, op,
             "elements in indices should be type int64 but got: ", indices.scalar_type());
  META_CHECK(output_size.size() == 2, op,
             "There should be exactly two elements (height, width) in output_size, but got ",
             output_size.size(), " elements.");
  META_CHECK(input.dim() == 3 || input.dim() == 4, op,
             "Input to max_unpooling2d should be a 3d or 4d Tensor, but got a tensor with ",
             input.dim(), " dimensions.");
  check_unpool_input(op, input, indices);
  c10::SmallVector<int64_t, 4> sizes(input.sizes().begin(), input.sizes().end() - 2);
  sizes.append(output_size.begin(), output_size.end());
  if (input.dim() == 4) return new_meta(sizes, input.scalar_type(), input.suggest_memory_format());
  return new_meta(sizes, input.scalar_type());
}

Tensor max_unpool3d(const Tensor& input, const Tensor& indices, IntArrayRef output_size,
                    IntArrayRef stride, IntArrayRef padding) {
  const char* op = "max_unpooling3d";
  META_CHECK(indices.scalar_type() == ScalarType::Long, op,
             "elements in indices should be type int64 but got: ", indices.scalar_type());
  META_CHECK(input.dim() == 4 || input.dim() == 5, op,
             "Input to max_unpooling3d should be a 4d or 5d Tensor, but got a tensor with ",
             input.dim(), " dimensions.");
  META_CHECK(output_size.size() == 3, op,
             "There should be exactly three elements (depth, height, width) in output_size, but "
             "got ",
             output_size.size(), " elements.");
  META_CHECK(stride.size() == 3, op,
             "There should be exactly three elements (depth, height, width) in stride, but got: ",
             stride.size(), " elements.");
  META_CHECK(padding.size() == 3, op,
             "There should be exactly three elements (depth, height, width) in padding, but got: ",
             padding.size(), " elements.");
  check_unpool_input(op, input, indices);
  META_CHECK(stride[0] > 0 && stride[1] > 0 && stride[2] > 0, op,
             "strides should be greater than zero, but got stride: ", stride);
  c10::SmallVector<int64_t, 5> sizes(input.sizes().begin(), input.sizes().end() - 3);
  sizes.append(output_size.begin(), output_size.end());
  return new_meta(sizes, input.scalar_type());
}

Tensor channel_shuffle(const Tensor& input, int64_t groups) {
  const char* op = "channel_shuffle";
  META_CHECK(input.dim() > 2, op,
             "channel_shuffle expects input to have at least 3 dimensions, but got input with "
             "sizes ",
             input.sizes());
  META_CHECK(groups > 0, op,
             "Number of groups to divide channels in must be positive. Value of "
             "groups:",
             groups);
  META_CHECK(input.size(1) % groups == 0, op,
             "Number of channels must be divisible by groups. Got ", input.size(1),
             " channels and ", groups, " groups.");
  return new_meta(input.sizes(), input.scalar_type(), input.suggest_memory_format());
}

}  // namespace

const std::vector<KernelDef>& pool_kernels() {
  static const std::vector<KernelDef> table = {
      METALOAD_META_KERNEL("_adaptive_avg_pool2d", adaptive_avg_pool2d),
      METALOAD_META_KERNEL("_adaptive_avg_pool3d", adaptive_avg_pool3d),
      METALOAD_META_KERNEL("max_pool3d_with_indices", max_pool3d_with_indices),
      METALOAD_META_KERNEL("grid_sampler_2d", grid_sampler_2d),
      METALOAD_META_KERNEL("grid_sampler_3d", grid_sampler_3d),
      METALOAD_META_KERNEL("im2col", im2col),
      METALOAD_META_KERNEL("col2im", col2im),
      METALOAD_META_KERNEL("upsample_nearest3d.vec", upsample_nearest3d_vec),
      METALOAD_META_KERNEL("_upsample_nearest_exact3d.vec", upsample_nearest_exact3d_vec),
      METALOAD_META_KERNEL("reflection_pad2d", reflection_pad2d),
      METALOAD_META_KERNEL("max_unpool2d", max_unpool2d),
      METALOAD_META_KERNEL("max_unpool3d", max_unpool3d),
      METALOAD_META_KERNEL("channel_shuffle", channel_shuffle),
  };
  return table;
}

}  // namespace metaload::meta
