// Meta kernels for sorting reductions (kthvalue, median/nanmedian over a dim, mode), scans
// (cummax/cummin, logcumsumexp), histograms, segment_reduce, a few losses (multi_margin,
// multilabel_margin, pdist) and pointwise ops with several outputs or fixed output dtypes (frexp,
// polar, rrelu_with_noise) whose CPU kernels have no Meta twin in libtorch 1.13. to_sparse is
// data-dependent (the number of stored elements is the number of nonzeros) and raises
// DataDependentError.
#include <ATen/core/Reduction.h>
#include <c10/util/irange.h>

#include <cmath>
#include <string>
#include <vector>

#include "base/error.h"
#include "kernels/meta_common.h"
#include "kernels/meta_iter.h"

namespace metaload::meta {
namespace {

// ---- helpers --------------------------------------------------------------------------------

// Sets an out= tensor's sizes and strides in place, within its storage (unsqueeze_/squeeze_).
void restride(const Tensor& t, IntArrayRef sizes, IntArrayRef strides) {
  t.unsafeGetTensorImpl()->set_sizes_and_strides(sizes, strides);
}

void unsqueeze_in_place(const Tensor& t, int64_t dim) {
  c10::SmallVector<int64_t, 5> sizes(t.sizes().begin(), t.sizes().end());
  c10::SmallVector<int64_t, 5> strides(t.strides().begin(), t.strides().end());
  const int64_t stride = dim >= t.dim() ? 1 : t.size(dim) * t.stride(dim);
  sizes.insert(sizes.begin() + dim, 1);
  strides.insert(strides.begin() + dim, stride);
  restride(t, sizes, strides);
}

void squeeze_in_place(const Tensor& t, int64_t dim) {
  if (t.dim() == 0 || t.size(dim) != 1) return;
  c10::SmallVector<int64_t, 5> sizes(t.sizes().begin(), t.sizes().end());
  c10::SmallVector<int64_t, 5> strides(t.strides().begin(), t.strides().end());
  sizes.erase(sizes.begin() + dim);
  strides.erase(strides.begin() + dim);
  restride(t, sizes, strides);
}

void check_real(const char* op, const Tensor& t) {
  META_CHECK(!at::isComplexType(t.scalar_type()) && t.scalar_type() != ScalarType::Bool, op, "\"",
             op, "\" not implemented for '", t.scalar_type(), "'");
}

void check_floating(const char* op, const Tensor& t) {
  META_CHECK(at::isFloatingType(t.scalar_type()), op, "\"", op, "\" not implemented for '",
             t.scalar_type(), "'");
}

void check_index_dtype(const char* op, const char* what, const Tensor& t) {
  META_CHECK(t.scalar_type() == ScalarType::Long, op, "expected scalar type Long but found ",
             t.scalar_type(), " (", what, ")");
}

// self.sizes() with `dim` removed, or set to 1 when keepdim; a 0-dim tensor stays 0-dim.
c10::SmallVector<int64_t, 5> reduced_dim_sizes(const Tensor& self, int64_t dim, bool keepdim) {
  c10::SmallVector<int64_t, 5> sizes(self.sizes().begin(), self.sizes().end());
  if (self.dim() == 0) return sizes;
  if (keepdim) {
    sizes[dim] = 1;
  } else {
    sizes.erase(sizes.begin() + dim);
  }
  return sizes;
}

// ---- kthvalue / median / nanmedian / mode ---------------------------------------------------

// The CPU kernel's output preparation for (values, indices) reductions
// (_reduction_with_indices_allocate_or_resize_output): an out= tensor of the reduced rank is
// first unsqueezed at `dim` (so its strides survive), resized to the keepdim shape, and squeezed
// again afterwards.
void prepare_indexed_outs(const char* op, const Tensor& self, int64_t dim, bool keepdim,
                          const Tensor& values, const Tensor& indices) {
  META_CHECK(values.scalar_type() == self.scalar_type(), op,
             "output values must be of same type as input");
  META_CHECK(indices.scalar_type() == ScalarType::Long, op,
             "output indices must be of scalar type Long");
  auto sizes = reduced_dim_sizes(self, dim, /*keepdim=*/true);
  for (const Tensor* out : {&values, &indices}) {
    if (!keepdim && out->dim() == self.dim() - 1) unsqueeze_in_place(*out, dim);
    resize_out(*out, sizes);
  }
}

std::tuple<Tensor&, Tensor&> kthvalue_out(const Tensor& self, int64_t k, int64_t dim_, bool keepdim,
                                          Tensor& values, Tensor& indices) {
  const char* op = "kthvalue()";
  const int64_t dim = wrap_dim(op, dim_, self.dim());
  const int64_t slice = self.dim() == 0 ? 1 : self.size(dim);
  META_CHECK(slice != 0, op, "Expected reduction dim ", dim, " to have non-zero size.");
  META_CHECK(k >= 1 && k <= slice, op, "selected number k out of range for dimension ", dim);
  check_real("kthvalue_cpu", self);
  prepare_indexed_outs(op, self, dim, keepdim, values, indices);
  if (!keepdim) {
    squeeze_in_place(values, dim);
    squeeze_in_place(indices, dim);
  }
  return {values, indices};
}

// median(dim) and nanmedian(dim) (whose CPU kernel says "median()" too): out= tensors resized
// straight to the result's shape.
std::tuple<Tensor&, Tensor&> median_dim_out(const Tensor& self, int64_t dim_, bool keepdim,
                                            Tensor& values, Tensor& indices) {
  const char* op = "median()";
  const int64_t dim = wrap_dim(op, dim_, self.dim());
  META_CHECK(self.dim() == 0 || self.size(dim) != 0, op, "Expected reduction dim ", dim,
             " to have non-zero size.");
  META_CHECK(indices.scalar_type() == ScalarType::Long, op,
             "Expected out tensor indices to have dtype Long, but got ", indices.scalar_type());
  META_CHECK(values.scalar_type() == self.scalar_type(), op,
             "Expected out tensor values to have the same dtype as self (", self.scalar_type(),
             "), but got ", values.scalar_type());
  check_real("median_out", self);
  const auto sizes = reduced_dim_sizes(self, dim, keepdim);
  resize_out(values, sizes);
  resize_out(indices, sizes);
  return {values, indices};
}

std::tuple<Tensor, Tensor> mode(const Tensor& self, int64_t dim_, bool keepdim) {
  const char* op = "mode()";
  const int64_t dim = wrap_dim(op, dim_, self.dim());
  META_CHECK(self.dim() == 0 || self.size(dim) != 0, op, "Expected reduction dim ", dim,
             " to have non-zero size.");
  META_CHECK(!at::isComplexType(self.scalar_type()), op, "\"mode_cpu\" not implemented for '",
             self.scalar_type(), "'");
  const auto sizes = reduced_dim_sizes(self, dim, keepdim);
  return {new_meta(sizes, self.scalar_type()), new_meta(sizes, ScalarType::Long)};
}

// ---- scans ----------------------------------------------------------------------------------

// cummax/cummin (composite) size and type-check their outputs before calling the helper, which
// only fills them: nothing is left to do on meta but the dtype check the CPU kernel makes.
void cummax_helper(const Tensor& self, Tensor&, Tensor&, int64_t) {
  META_CHECK(!at::isComplexType(self.scalar_type()), "cummax",
             "\"cummax_cpu\" not implemented for '", self.scalar_type(), "'");
}

void cummin_helper(const Tensor& self, Tensor&, Tensor&, int64_t) {
  META_CHECK(!at::isComplexType(self.scalar_type()), "cummin",
             "\"cummin_cpu\" not implemented for '", self.scalar_type(), "'");
}

void check_logcumsumexp(const Tensor& self, int64_t dim) {
  const char* op = "logcumsumexp";
  wrap_dim(op, dim, self.dim());
  META_CHECK(at::isFloatingType(self.scalar_type()) || at::isComplexType(self.scalar_type()), op,
             "\"logcumsumexp_out_cpu\" not implemented for '", self.scalar_type(), "'");
}

Tensor logcumsumexp(const Tensor& self, int64_t dim) {
  check_logcumsumexp(self, dim);
  return new_meta(self.sizes(), self.scalar_type());  // empty_like(self, Contiguous)
}

Tensor& logcumsumexp_out(const Tensor& self, int64_t dim, Tensor& out) {
  check_logcumsumexp(self, dim);
  META_CHECK(out.scalar_type() == self.scalar_type(), "logcumsumexp", "expected out to have dtype ",
             self.scalar_type(), ", but got ", out.scalar_type());
  resize_out(out, self.sizes());
  return out;
}

// ---- pointwise ops with several outputs or a fixed output dtype -------------------------------

std::tuple<Tensor&, Tensor&> frexp_out(const Tensor& self, Tensor& mantissa, Tensor& exponent) {
  const char* op = "torch.frexp()";
  META_CHECK(at::isFloatingType(self.scalar_type()), op,
             "torch.frexp() only supports floating-point dtypes");
  META_CHECK(mantissa.scalar_type() == self.scalar_type(), op,
             "torch.frexp() expects mantissa to have dtype ", self.scalar_type(), " but got ",
             mantissa.scalar_type());
  META_CHECK(exponent.scalar_type() == ScalarType::Int, op,
             "torch.frexp() expects exponent to have int dtype but got ", exponent.scalar_type());
  MetaIter it({mantissa, exponent});
  at::TensorIteratorConfig config;
  config.add_output(mantissa).add_output(exponent).add_input(self).check_all_same_dtype(false);
  it.build_checked(op, [&] { it.build(config); });
  return {mantissa, exponent};
}

Tensor& polar_out(const Tensor& abs, const Tensor& angle, Tensor& out) {
  const char* op = "polar";
  META_CHECK(at::isFloatingType(abs.scalar_type()) && at::isFloatingType(angle.scalar_type()), op,
             "Expected both inputs to be Half, Float or Double tensors but got ", abs.scalar_type(),
             " and ", angle.scalar_type());
  META_CHECK(abs.scalar_type() == angle.scalar_type(), op, "Expected object of scalar type ",
             abs.scalar_type(), " but got scalar type ", angle.scalar_type(),
             " for second argument");
  META_CHECK(out.scalar_type() == c10::toComplexType(abs.scalar_type()), op,
             "Expected object of scalar type ", c10::toComplexType(abs.scalar_type()),
             " but got scalar type ", out.scalar_type(), " for argument 'out'");
  MetaIter it({out});
  at::TensorIteratorConfig config;
  config.add_output(out).add_input(abs).add_input(angle).check_all_same_dtype(false);
  it.build_checked(op, [&] { it.build(config); });
  return out;
}

// Eval mode is leaky_relu with the mean slope, training mode samples the slopes into `noise`;
// either way the result is a contiguous tensor like self.
Tensor rrelu_with_noise(const Tensor& self, METALOAD_RRELU_NOISE_ARG noise, const at::Scalar&,
                        const at::Scalar&, bool training, c10::optional<at::Generator>) {
  const char* op = "rrelu_with_noise";
  if (compat::kRreluChecksNoiseShape) {
    META_CHECK(noise.sizes() == self.sizes(), op,
               "noise tensor shape must match self tensor shape. Got self.shape = ", self.sizes(),
               " noise.shape = ", noise.sizes());
  }
  META_CHECK(at::isFloatingType(self.scalar_type()), op, "\"",
             training ? "rrelu_with_noise_out_cpu" : "leaky_relu_cpu", "\" not implemented for '",
             self.scalar_type(), "'");
  return new_meta(self.sizes(), self.scalar_type());
}

// ---- losses ---------------------------------------------------------------------------------

// (nframe, dim) of a margin loss input: a vector, a matrix (batch, classes) or a 0-dim tensor.
std::pair<int64_t, int64_t> margin_loss_frames(const char* op, const Tensor& input) {
  const int64_t ndims = input.dim();
  META_CHECK((ndims == 2 && input.size(1) != 0) || (ndims == 1 && input.size(0) != 0) || ndims == 0,
             op, "Expected non-empty vector or matrix with optional 0-dim batch size, but got: ",
             input.sizes());
  if (ndims <= 1) return {1, ndims == 0 ? 1 : input.size(0)};
  return {input.size(0), input.size(1)};
}

Tensor multi_margin_loss(const Tensor& self, const Tensor& target, const at::Scalar& p,
                         const at::Scalar&, const c10::optional<Tensor>& weight,
                         int64_t reduction) {
  const char* op = "multi_margin_loss";
  META_CHECK(p.toLong() == 1 || p.toLong() == 2, op, "only p == 1 and p == 2 supported");
  const auto [nframe, dim] = margin_loss_frames(op, self);
  META_CHECK(target.dim() <= 1 && target.numel() == nframe, op,
             "inconsistent target size, expected ", nframe, " but got ", target.sizes());
  if (compat::kMultiMarginLossChecksWeight && weight.has_value() && weight->defined()) {
    META_CHECK(weight->dim() <= 1 && weight->numel() == dim, op,
               "inconsistent weight size, expected ", dim, " but got ", weight->sizes());
  }
  if (self.numel() != 0) {  // the CPU kernel returns before its dtype dispatch otherwise
    check_floating("multi_margin_loss_cpu_kernel", self);
    check_index_dtype(op, "target", target);
  }
  if (reduction == at::Reduction::None && target.dim() > 0) {
    return new_meta({nframe}, self.scalar_type());
  }
  return new_meta({}, self.scalar_type());
}

std::tuple<Tensor, Tensor> multilabel_margin_loss_forward(const Tensor& self, const Tensor& target,
                                                          int64_t reduction) {
  const char* op = "multilabel_margin_loss";
  const auto [nframe, dim] = margin_loss_frames(op, self);
  if (self.dim() <= 1) {
    META_CHECK(target.dim() <= 1 && target.numel() == dim, op,
               "inconsistent target size: ", target.sizes(), " for input of size: ", self.sizes());
  } else {
    META_CHECK(target.dim() == 2 && target.size(0) == nframe && target.size(1) == dim, op,
               "inconsistent target size: ", target.sizes(), " for input of size: ", self.sizes());
  }
  if (self.numel() != 0) {
    check_index_dtype(op, "target", target);
    check_floating("multilabel_margin_loss_forward_out_frame", self);
  }
  // A scalar loss for a vector input even with reduction='none'.
  Tensor output = reduction != at::Reduction::None || target.dim() <= 1
                      ? new_meta({}, self.scalar_type())
                      : new_meta({nframe}, self.scalar_type());
  return {output, new_meta(target.sizes(), self.scalar_type())};
}

Tensor pdist_forward(const Tensor& self, double) {
  const char* op = "_pdist_forward";
  META_CHECK(self.is_contiguous(), op, "_pdist_forward requires contiguous input");
  wrap_dim(op, 1, self.dim());  // reads self.size(1)
  const int64_t n = self.size(0);
  if (n <= 1) return new_meta({0}, self.scalar_type());
  if (self.size(1) != 0) check_floating("pdist", self);
  return new_meta({n * (n - 1) / 2}, self.scalar_type());
}

// ---- histograms -----------------------------------------------------------------------------

void check_histogram_dtype(const Tensor& self) {
  META_CHECK(at::isFloatingType(self.scalar_type()), "torch.histogram",
             "\"histogramdd\" not implemented for '", self.scalar_type(), "'");
}

void check_bin_count(int64_t bins, int64_t dim) {
  META_CHECK(bins > 0, "torch.histogram()", "bins must be > 0, but got ", bins, " for dimension ",
             dim);
}

// An explicit range (two floats per dimension) must have that length and be finite and ordered.
// Without one the CPU kernel takes the data's min and max: values, not checked here.
void check_histogram_range(int64_t n, c10::optional<c10::ArrayRef<double>> range) {
  const char* op = "torch.histogramdd";
  if (!range.has_value()) return;
  META_CHECK(static_cast<int64_t>(range->size()) == 2 * n, op, "for a ", n,
             "-dimensional histogram range should have ", 2 * n, " elements, but got ",
             range->size());
  for (int64_t d = 0; d < n; ++d) {
    const double lo = (*range)[2 * d], hi = (*range)[2 * d + 1];
    META_CHECK(std::isfinite(lo) && std::isfinite(hi), op, "dimension ", d, "'s range [", lo, ", ",
               hi, "] is not finite");
    META_CHECK(lo <= hi, op, "min should not exceed max, but got min ", lo, " max ", hi,
               " for dimension ", d);
  }
}

// histogramdd_check_inputs: one 1-d non-empty bins tensor per dimension, of the input's dtype; a
// weight of the input's dtype whose shape is the input's without its innermost dimension.
void check_histogramdd_inputs(const Tensor& self, at::TensorList bins,
                              const c10::optional<Tensor>& weight) {
  const char* op = "torch.histogramdd";
  META_CHECK(self.dim() >= 2, op, "input tensor should have at least 2 dimensions, but got ",
             self.dim());
  const int64_t n = self.size(-1);
  META_CHECK(static_cast<int64_t>(bins.size()) == n, op, "expected ", n,
             " sequences of bin edges for each of the ", n, " dimensions of the input, but got ",
             bins.size());
  for (const auto d : c10::irange(n)) {
    META_CHECK(bins[d].scalar_type() == self.scalar_type(), op,
               "input tensor and bins tensors should have the same dtype, but got input with "
               "dtype ",
               self.scalar_type(), " and bins for dimension ", d, " with dtype ",
               bins[d].scalar_type());
    META_CHECK(bins[d].dim() == 1, op, "bins tensor should have one dimension, but got ",
               bins[d].dim(), " dimensions in the bins tensor for dimension ", d);
    META_CHECK(bins[d].numel() > 0, op, "bins tensor should have at least 1 element, but got ",
               bins[d].numel(), " elements in the bins tensor for dimension ", d);
  }
  if (weight.has_value() && weight->defined()) {
    META_CHECK(weight->scalar_type() == self.scalar_type(), op,
               "if weight tensor is provided, input tensor and weight tensor should have the same "
               "dtype, but got input(",
               self.scalar_type(), "), and weight(", weight->scalar_type(), ")");
    const IntArrayRef expected = self.sizes().slice(0, self.dim() - 1);
    const int64_t one = 1;  // a 0-dim weight counts as shape [1]
    const IntArrayRef actual = weight->dim() == 0 ? IntArrayRef(one) : weight->sizes();
    META_CHECK(expected == actual, op,
               "if weight tensor is provided it should have the same shape as the input tensor "
               "excluding its innermost dimension, but got input with shape ",
               self.sizes(), " and weight with shape ", weight->sizes());
  }
}

// histc: `bins` counts between min and max (the data's extremes when min == max). Integers too, as
// torch's own meta function has it on the meta device: CUDA counts them, only CPU refuses (a fake
// cpu tensor refuses them in fake(), python/metaload/_fake.py), and a meta tensor names neither.
Tensor histc(const Tensor& self, int64_t bins, const at::Scalar& min, const at::Scalar& max) {
  const char* op = "torch.histc";
  check_bin_count(bins, 0);
  double lo = min.to<double>(), hi = max.to<double>();
  if (lo != hi || self.numel() == 0) {
    if (lo == hi) {
      lo -= 1;
      hi += 1;
    }
    META_CHECK(std::isfinite(lo) && std::isfinite(hi), op, "range of [", lo, ", ", hi,
               "] is not finite");
    META_CHECK(lo < hi, op, "max must be larger than min");
  }
  return new_meta({bins}, self.scalar_type());
}

std::tuple<Tensor, Tensor> histogram_bin_ct(const Tensor& self, int64_t bins,
                                            c10::optional<c10::ArrayRef<double>> range,
                                            const c10::optional<Tensor>& weight, bool) {
  check_histogram_dtype(self);
  check_bin_count(bins, 0);
  check_histogram_range(1, range);
  // The input is seen as a (numel, 1) tensor, the weight as a (numel) one.
  const Tensor flat = new_meta({self.numel(), 1}, self.scalar_type());
  const Tensor edges = new_meta({bins + 1}, self.scalar_type());
  c10::optional<Tensor> flat_weight;
  if (weight.has_value() && weight->defined()) {
    flat_weight = new_meta({weight->numel()}, weight->scalar_type());
  }
  check_histogramdd_inputs(flat, {edges}, flat_weight);
  return {new_meta({bins}, self.scalar_type()), edges};
}

std::tuple<Tensor, Tensor> histogram_bins_tensor(const Tensor& self, const Tensor& bins,
                                                 const c10::optional<Tensor>& weight, bool) {
  check_histogram_dtype(self);
  const Tensor flat = new_meta({self.numel(), 1}, self.scalar_type());
  c10::optional<Tensor> flat_weight;
  if (weight.has_value() && weight->defined()) {
    flat_weight = new_meta({weight->numel()}, weight->scalar_type());
  }
  check_histogramdd_inputs(flat, {bins}, flat_weight);
  check_bin_count(bins.numel() - 1, 0);
  return {new_meta({bins.numel() - 1}, self.scalar_type()),
          new_meta({bins.numel()}, bins.scalar_type())};
}

int64_t histogramdd_dims(const Tensor& self, size_t bins) {
  const char* op = "torch.histogramdd";
  META_CHECK(self.dim() >= 2, op, "input tensor should have at least 2 dimensions");
  const int64_t n = self.size(-1);
  // 1.13's CPU kernel reads past the end of a shorter list; 2.x checks.
  META_CHECK(static_cast<int64_t>(bins) == n, "histogramdd",
             "The size of bins must be equal to the innermost dimension of the input.");
  return n;
}

std::vector<Tensor> histogramdd_bin_edges(const Tensor& self, IntArrayRef bins,
                                          c10::optional<c10::ArrayRef<double>> range,
                                          const c10::optional<Tensor>&, bool) {
  const int64_t n = histogramdd_dims(self, bins.size());
  // Only finding the data's range dispatches on its dtype.
  if (!range.has_value() && self.numel() > 0) check_histogram_dtype(self);
  check_histogram_range(n, range);
  std::vector<Tensor> edges;
  for (const auto d : c10::irange(n)) {
    META_CHECK(bins[d] + 1 >= 0, "linspace", "number of steps must be non-negative");
    edges.push_back(new_meta({bins[d] + 1}, self.scalar_type()));
  }
  return edges;
}

Tensor histogramdd_from_bin_cts(const Tensor& self, IntArrayRef bins,
                                c10::optional<c10::ArrayRef<double>> range,
                                const c10::optional<Tensor>& weight, bool) {
  const int64_t n = histogramdd_dims(self, bins.size());
  for (const auto d : c10::irange(n)) check_bin_count(bins[d], d);
  check_histogram_range(n, range);
  std::vector<Tensor> edges;
  for (const auto d : c10::irange(n)) edges.push_back(new_meta({bins[d] + 1}, self.scalar_type()));
  check_histogramdd_inputs(self, edges, weight);
  check_histogram_dtype(self);
  return new_meta(bins, self.scalar_type());
}

Tensor histogramdd_from_bin_tensors(const Tensor& self, at::TensorList bins,
                                    const c10::optional<Tensor>& weight, bool) {
  check_histogramdd_inputs(self, bins, weight);
  std::vector<int64_t> sizes;
  for (const auto d : c10::irange(bins.size())) {
    check_bin_count(bins[d].numel() - 1, d);
    sizes.push_back(bins[d].numel() - 1);
  }
  check_histogram_dtype(self);
  return new_meta(sizes, self.scalar_type());
}

// ---- segment_reduce ---------------------------------------------------------------------------

// One result per segment along `axis`: lengths hold one entry per segment, offsets one more. With
// unsafe=False the CPU kernel also checks that the lengths are not negative and sum to the axis'
// size: values, left to real runs.
Tensor segment_reduce(const Tensor& data, c10::string_view reduce,
                      const c10::optional<Tensor>& lengths, const c10::optional<Tensor>& indices,
                      const c10::optional<Tensor>& offsets, int64_t axis_, bool unsafe,
                      const c10::optional<at::Scalar>&) {
  const char* op = "segment_reduce()";
  const int64_t axis = wrap_dim(op, axis_, data.dim());
  if (!compat::kSegmentReduceTakesEmptyData) {
    META_CHECK(data.numel() > 0, op, "Expected data.numel() > 0 to be true, but got false.");
  }
  META_CHECK(!(indices.has_value() && indices->defined()), op,
             "indices based reduction is not supported yet.");
  const bool has_lengths = lengths.has_value() && lengths->defined();
  const bool has_offsets = offsets.has_value() && offsets->defined();
  META_CHECK(has_lengths || has_offsets, op, "Either lengths or offsets must be defined.");
  const bool known =
      reduce == "sum" || reduce == "mean" || reduce == "max" || reduce == "min" ||
      reduce == "prod" ||
      (compat::kSegmentReduceTakesAmaxAmin && (reduce == "amax" || reduce == "amin"));
  META_CHECK(known, op, "unsupported reduction given! ", std::string(reduce));
  const Tensor& segments = has_offsets ? *offsets : *lengths;
  const char* what = has_offsets ? "offsets" : "lengths";
  META_CHECK(data.dim() >= segments.dim(), op,
             "expected data to have at least as many dimensions as ", what);
  META_CHECK(axis == segments.dim() - 1, op, "Expected axis to be the last dimension of ", what,
             " but got ", axis, ".");
  // The safe mode's check starts with lengths.min(), which refuses an empty tensor.
  META_CHECK(unsafe || has_offsets || segments.numel() != 0, "min()",
             "Expected reduction dim to be specified for input.numel() == 0.");
  META_CHECK(
      segments.scalar_type() == ScalarType::Long || segments.scalar_type() == ScalarType::Int, op,
      "\"_segment_reduce_", what, "_cpu_kernel1\" not implemented for '", segments.scalar_type(),
      "'");
  check_floating("_segment_reduce_cpu", data);
  c10::SmallVector<int64_t, 5> sizes(data.sizes().begin(), data.sizes().end());
  sizes[axis] = segments.size(axis) - (has_offsets ? 1 : 0);
  return new_meta(sizes, data.scalar_type());
}

// ---- to_sparse ------------------------------------------------------------------------------

[[noreturn]] void sparse_needs_values(const char* op, const Tensor& self) {
  throw DataDependentError(
      std::string(op) +
      " produces a sparse tensor that stores one entry per nonzero element, a number that "
      "depends on the values, but its input has none: it is a meta or fake tensor, which holds "
      "shapes only (" +
      std::string(c10::toString(self.scalar_type())) + " " + c10::str(self.sizes()) +
      "). Create the tensors whose values you need under metaload::RealGuard (Python: `with "
      "metaload.real():`) and outside FakeMode.");
}

Tensor to_sparse(const Tensor& self) {
  sparse_needs_values("aten::to_sparse", self);
}

Tensor to_sparse_sparse_dim(const Tensor& self, int64_t) {
  sparse_needs_values("aten::to_sparse.sparse_dim", self);
}

// torch 2.x names: to_sparse became a composite over _to_sparse.
Tensor to_sparse_layout(const Tensor& self, c10::optional<at::Layout>, at::OptionalIntArrayRef,
                        c10::optional<int64_t>) {
  sparse_needs_values("aten::_to_sparse", self);
}

Tensor to_sparse_sparse_dim_2x(const Tensor& self, int64_t) {
  sparse_needs_values("aten::_to_sparse.sparse_dim", self);
}

}  // namespace

const std::vector<KernelDef>& reduction_kernels() {
  static const std::vector<KernelDef> table = {
      METALOAD_META_KERNEL("kthvalue.values", kthvalue_out),
      METALOAD_META_KERNEL("median.dim_values", median_dim_out),
      METALOAD_META_KERNEL("nanmedian.dim_values", median_dim_out),
      METALOAD_META_KERNEL("mode", mode),
      METALOAD_META_KERNEL("_cummax_helper", cummax_helper),
      METALOAD_META_KERNEL("_cummin_helper", cummin_helper),
      METALOAD_META_KERNEL("_logcumsumexp", logcumsumexp),
      METALOAD_META_KERNEL("_logcumsumexp.out", logcumsumexp_out),
      METALOAD_META_KERNEL("frexp.Tensor_out", frexp_out),
      METALOAD_META_KERNEL("polar.out", polar_out),
      METALOAD_META_KERNEL("rrelu_with_noise", rrelu_with_noise),
      METALOAD_META_KERNEL("multi_margin_loss", multi_margin_loss),
      METALOAD_META_KERNEL("multilabel_margin_loss_forward", multilabel_margin_loss_forward),
      METALOAD_META_KERNEL("_pdist_forward", pdist_forward),
      METALOAD_META_KERNEL("histc", histc),
      METALOAD_META_KERNEL("histogram.bin_ct", histogram_bin_ct),
      METALOAD_META_KERNEL("histogram.bins_tensor", histogram_bins_tensor),
      METALOAD_META_KERNEL("_histogramdd_bin_edges", histogramdd_bin_edges),
      METALOAD_META_KERNEL("_histogramdd_from_bin_cts", histogramdd_from_bin_cts),
      METALOAD_META_KERNEL("_histogramdd_from_bin_tensors", histogramdd_from_bin_tensors),
      METALOAD_META_KERNEL("segment_reduce", segment_reduce),
      METALOAD_META_KERNEL("to_sparse", to_sparse),
      METALOAD_META_KERNEL("to_sparse.sparse_dim", to_sparse_sparse_dim),
      METALOAD_META_KERNEL("_to_sparse", to_sparse_layout),
      METALOAD_META_KERNEL("_to_sparse.sparse_dim", to_sparse_sparse_dim_2x),
  };
  return table;
}

}  // namespace metaload::meta
