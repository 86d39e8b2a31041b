// Meta kernels for pointwise, indexing and reduction ops without one in libtorch 1.13.
//
// Pointwise ops run ATen's own TensorIterator over the meta operands, with outputs allocated
// directly on meta (as the generated structured Meta kernels do): broadcasting, type promotion and
// the output's stride order are then exactly the CPU kernel's.
#include <ATen/Dispatch.h>
#include <ATen/TensorIterator.h>
#include <ATen/native/TypeProperties.h>
#include <c10/util/irange.h>

#include <bitset>
#include <climits>

#include <cmath>
#include <limits>

#include "base/error.h"
#include "kernels/meta_common.h"
#include "kernels/meta_iter.h"

namespace metaload::meta {
namespace {

ScalarType result_type(const Tensor& a, const Tensor& b) {
  at::native::ResultTypeState state;
  state = at::native::update_result_type_state(a, state);
  state = at::native::update_result_type_state(b, state);
  return at::native::result_type(state);
}

// On CPU, TensorIterator promotes an input by copying it with .to(common dtype) before it computes
// the output's strides; a non-dense input then counts as dense. Mirror that so the strides match.
Tensor cpu_promoted(const Tensor& t, ScalarType common) {
  if (t.scalar_type() == common || t.dim() == 0) return t;
  return converted_like(t, common);
}

// A CPU 0-dim tensor may join meta operands (the kernels move such scalars to the device first).
Tensor on_meta(const Tensor& t) {
  if (t.is_meta() || t.dim() != 0) return t;
  return new_meta({}, {}, t.scalar_type());
}

Tensor unary(const char* op, const Tensor& self) {
  MetaIter it;
  it.build_checked(op, [&] { it.build_borrowing_unary_op(it.maybe_get_output(0), self); });
  return it.out();
}

Tensor binary(const char* op, const Tensor& a, const Tensor& b) {
  const ScalarType common = result_type(a, b);
  Tensor pa = cpu_promoted(a, common), pb = cpu_promoted(b, common);
  MetaIter it;
  it.build_checked(op, [&] { it.build_borrowing_binary_op(it.maybe_get_output(0), pa, pb); });
  return it.out();
}

void check_not_bool(const char* op, const Tensor& t) {
  META_CHECK(t.scalar_type() != ScalarType::Bool, op, "Boolean inputs not supported for ", op);
}

void check_not_complex(const char* op, const Tensor& t) {
  META_CHECK(!at::isComplexType(t.scalar_type()), op, op, " is not supported for complex types");
}

void check_floating(const char* op, const Tensor& t) {
  META_CHECK(at::isFloatingType(t.scalar_type()), op, op, " not implemented for '", t.scalar_type(),
             "'");
}

// ---- activations ----------------------------------------------------------------------------

Tensor relu(const Tensor& self) {
  check_not_bool("relu", self);
  check_not_complex("relu", self);
  return unary("relu", self);
}

Tensor hardswish(const Tensor& self) {
  check_floating("hardswish", self);
  return unary("hardswish", self);
}

// hardtanh writes into at::empty_like(self): the preserved layout, not TensorIterator's.
Tensor hardtanh(const Tensor& self, const at::Scalar&, const at::Scalar&) {
  check_not_bool("hardtanh", self);
  check_not_complex("hardtanh", self);
  return new_meta_like(self, self.scalar_type());
}

// ---- where / logical ------------------------------------------------------------------------

// where.self and where.self_out (torch 2.x's where.self goes through the out= form).
Tensor where_impl(const Tensor& condition, const Tensor& self, const Tensor& other,
                  const Tensor* out) {
  const char* op = "where";
  const ScalarType common = result_type(self, other);
  ScalarType cond_type = condition.scalar_type();
  if (cond_type == ScalarType::Byte) {
    TORCH_WARN_ONCE(
        "where received a uint8 condition tensor. This behavior is deprecated and "
        "will be removed in a future version of PyTorch. Use a boolean condition "
        "instead.");
  }
  META_CHECK(cond_type == ScalarType::Bool || cond_type == ScalarType::Byte, op,
             "where expected condition to be a boolean tensor, but got a tensor with dtype ",
             cond_type);
  if (out != nullptr) {
    META_CHECK(out->scalar_type() == common, op, "Expected out type to be ", common, " but got ",
               out->scalar_type());
  }
  Tensor cond = on_meta(cpu_promoted(condition, ScalarType::Bool));
  Tensor a = on_meta(cpu_promoted(self, common));
  Tensor b = on_meta(cpu_promoted(other, common));
  at::TensorIteratorConfig config;
  config.check_all_same_dtype(false).declare_static_dtype_and_device(common, cond.device());
  if (out != nullptr) {
    config.add_output(*out);
  } else {
    config.add_owned_output(Tensor());
  }
  config.add_input(cond).add_input(a).add_input(b);
  MetaIter it(out != nullptr ? *out : Tensor());
  it.build_checked(op, [&] { it.build(config); });
  return it.out();
}

Tensor where_self(const Tensor& condition, const Tensor& self, const Tensor& other) {
  return where_impl(condition, self, other, nullptr);
}

Tensor& where_self_out(const Tensor& condition, const Tensor& self, const Tensor& other,
                       Tensor& out) {
  where_impl(condition, self, other, &out);
  return out;
}

Tensor& logical_not_out(const Tensor& self, Tensor& out) {
  const char* op = "logical_not";
  at::TensorIteratorConfig config;
  config.check_all_same_dtype(false).add_output(out).add_input(self);
  MetaIter it(out);
  it.build_checked(op, [&] { it.build(config); });
  return out;
}

Tensor logical_not(const Tensor& self) {
  const char* op = "logical_not";
  at::TensorIteratorConfig config;
  config.check_all_same_dtype(false)
      .declare_static_dtype_and_device(ScalarType::Bool, self.device())
      .add_owned_output(Tensor())
      .add_input(self);
  MetaIter it;
  it.build_checked(op, [&] { it.build(config); });
  return it.out();
}

Tensor& logical_not_(Tensor& self) {
  return logical_not_out(self, self);
}

Tensor& logical_binary_out(const char* op, const Tensor& self, const Tensor& other, Tensor& out) {
  const ScalarType common = result_type(self, other);
  Tensor a = cpu_promoted(self, common), b = cpu_promoted(other, common);
  MetaIter it(out);
  it.build_checked(op, [&] { it.build_comparison_op(out, a, b); });
  return out;
}

Tensor& logical_and_out(const Tensor& self, const Tensor& other, Tensor& out) {
  return logical_binary_out("logical_and", self, other, out);
}
Tensor& logical_or_out(const Tensor& self, const Tensor& other, Tensor& out) {
  return logical_binary_out("logical_or", self, other, out);
}
Tensor& logical_xor_out(const Tensor& self, const Tensor& other, Tensor& out) {
  return logical_binary_out("logical_xor", self, other, out);
}

Tensor isnan(const Tensor& self) {
  const char* op = "isnan";
  MetaIter it;
  it.build_checked(op,
                   [&] { it.build_borrowing_comparison_op(it.maybe_get_output(0), self, self); });
  return it.out();
}

// ---- abs / nan_to_num out= forms --------------------------------------------------------------

Tensor& abs_out(const Tensor& self, Tensor& out) {
  const char* op = "abs";
  if (self.is_complex() && !out.is_complex()) {
    const ScalarType real = c10::toRealValueType(self.scalar_type());
    META_CHECK(at::canCast(real, out.scalar_type()), op, "result type ", real,
               " can't be cast to the desired output type ", out.scalar_type());
    // Computed complex->complex, then copied into a resized `out`.
    resize_out(out, self.sizes());
    return out;
  }
  META_CHECK(out.scalar_type() == self.scalar_type(), op, "Found dtype ", out.scalar_type(),
             " but expected ", self.scalar_type());
  MetaIter it(out);
  it.build_checked(op, [&] { it.build_unary_op(out, self); });
  return out;
}

Tensor& nan_to_num_out(const Tensor& self, c10::optional<double>, c10::optional<double>,
                       c10::optional<double>, Tensor& out) {
  const char* op = "nan_to_num";
  META_CHECK(self.scalar_type() == out.scalar_type(), op, "dtype of out: ", out.scalar_type(),
             " should be same as input: ", self.scalar_type());
  if (at::isIntegralType(self.scalar_type(), /*includeBool=*/true)) {
    resize_out(out, self.sizes());  // a plain copy
    return out;
  }
  MetaIter it(out);
  it.build_checked(op, [&] { it.build_unary_op(out, self); });
  return out;
}

// ---- binary ops without a Meta kernel -------------------------------------------------------

// rsub(self, other, alpha) = other - alpha * self, with sub's argument checks.
Tensor rsub_tensor(const Tensor& self, const Tensor& other, const at::Scalar& alpha) {
  const char* op = "rsub";
  META_CHECK(self.scalar_type() != ScalarType::Bool || other.scalar_type() != ScalarType::Bool, op,
             "Subtraction, the `-` operator, with two bool tensors is not supported. Use the `^` "
             "or `logical_xor()` operator instead.");
  META_CHECK(self.scalar_type() != ScalarType::Bool && other.scalar_type() != ScalarType::Bool, op,
             "Subtraction, the `-` operator, with a bool tensor is not supported. If you are "
             "trying to invert a mask, use the `~` or `logical_not()` operator instead.");
  Tensor out = binary(op, other, self);
  const ScalarType dtype = out.scalar_type();
  META_CHECK(!alpha.isBoolean() || dtype == ScalarType::Bool, op,
             "Boolean alpha only supported for Boolean results.");
  META_CHECK(at::isFloatingType(dtype) || at::isComplexType(dtype) || alpha.isIntegral(true), op,
             "For integral input tensors, argument alpha must not be a floating point number.");
  META_CHECK(at::isComplexType(dtype) || !alpha.isComplex(), op,
             "For non-complex input tensors, argument alpha must not be a complex number.");
  return out;
}

Tensor floor_divide(const Tensor& self, const Tensor& other) {
  return binary("floor_divide", self, other);
}

// remainder(Scalar, Tensor): the scalar joins as a wrapped number, so it does not widen the type.
Tensor remainder_scalar_tensor(const at::Scalar& self, const Tensor& other) {
  Tensor wrapped = new_meta({}, {}, self.type());
  wrapped.unsafeGetTensorImpl()->set_wrapped_number(true);
  return binary("remainder", wrapped, other);
}

// ---- indexing -------------------------------------------------------------------------------

c10::SmallVector<int64_t, 5> index_select_sizes(const Tensor& self, int64_t dim,
                                                const Tensor& index) {
  const char* op = "index_select()";
  const int64_t d = wrap_dim(op, dim, self.dim());
  META_CHECK(index.dim() <= 1, op, "Index is supposed to be a vector, got index of size ",
             index.sizes());
  META_CHECK(!(self.dim() == 0 && index.numel() != 1), op,
             "Index to scalar can have only 1 value, got ", index.numel(), " value(s)");
  META_CHECK(index.scalar_type() == ScalarType::Long || index.scalar_type() == ScalarType::Int, op,
             "Expected dtype int32 or int64 for index, got ", index.scalar_type());
  c10::SmallVector<int64_t, 5> sizes(self.sizes().begin(), self.sizes().end());
  if (self.dim() > 0) sizes[d] = index.numel();
  return sizes;
}

Tensor index_select(const Tensor& self, int64_t dim, const Tensor& index) {
  return new_meta(index_select_sizes(self, dim, index), self.scalar_type());
}

Tensor& index_select_out(const Tensor& self, int64_t dim, const Tensor& index, Tensor& out) {
  auto sizes = index_select_sizes(self, dim, index);
  META_CHECK(self.scalar_type() == out.scalar_type(), "index_select()",
             "self and result must have the same scalar type, got ", self.scalar_type(), " and ",
             out.scalar_type());
  resize_out(out, sizes);
  return out;
}

Tensor take(const Tensor& self, const Tensor& index) {
  const char* op = "take()";
  META_CHECK(index.scalar_type() == ScalarType::Long, op,
             "Expected a long tensor for index, but got ", index.scalar_type());
  META_CHECK(!(self.numel() == 0 && index.numel() != 0), op, "tried to take from an empty tensor");
  return new_meta(index.sizes(), self.scalar_type());
}

// CPU roll (1.13) rolls one dim as cat(self.narrow(dim, start, n - start), self.narrow(dim, 0,
// start)), so the result takes cat's memory format: the pieces' suggested format when they all
// agree and none is contiguous, else contiguous. Several dims roll one after the other; no dims
// rolls the flattened tensor (contiguous). An empty tensor is cloned with its layout preserved.
Tensor roll(const Tensor& self, IntArrayRef shifts, IntArrayRef dims) {
  const char* op = "roll";
  META_CHECK(!shifts.empty(), op, "`shifts` required");
  const bool flat = dims.empty() && shifts.size() == 1;
  META_CHECK(flat || shifts.size() == dims.size(), op,
             "shifts and dimensions must align. shifts: ", shifts.size(), ", dims:", dims.size());
  for (int64_t d : dims) wrap_dim(op, d, self.dim());
  if (self.numel() == 0) {
    if (flat && self.dim() != 1) return new_meta(self.sizes(), self.scalar_type());
    return new_meta_like(self, self.scalar_type());
  }
  if (flat) return new_meta(self.sizes(), self.scalar_type());
  c10::SmallVector<int64_t, 5> strides(self.strides().begin(), self.strides().end());
  for (size_t i = 0; i < dims.size(); ++i) {
    const int64_t d = wrap_dim(op, dims[i], self.dim());
    const int64_t n = self.size(d);
    int64_t start = (n - shifts[i]) % n;
    if (start < 0) start += n;
    MemoryFormat format = MemoryFormat::Contiguous;
    bool first = true, contiguous = false;
    for (int64_t piece : {n - start, start}) {
      c10::SmallVector<int64_t, 5> sizes(self.sizes().begin(), self.sizes().end());
      sizes[d] = piece;
      MemoryFormat f = suggest_format(sizes, strides);
      if (f == MemoryFormat::Contiguous || (!first && f != format)) contiguous = true;
      format = f;
      first = false;
    }
    auto next = format_strides(self.sizes(), contiguous ? MemoryFormat::Contiguous : format);
    strides.assign(next.begin(), next.end());
  }
  return new_meta(self.sizes(), strides, self.scalar_type());
}

Tensor flip(const Tensor& self, IntArrayRef dims) {
  const char* op = "flip";
  std::bitset<64> seen;
  for (int64_t d : dims) {
    int64_t w = wrap_dim(op, d, self.dim());
    META_CHECK(!seen[w], op, "dim ", w, " appears multiple times in the list of dims");
    seen.set(w);
  }
  return new_meta_like(self, self.scalar_type());
}

Tensor& diag_out(const Tensor& self, int64_t diagonal, Tensor& out) {
  const char* op = "diag";
  META_CHECK(self.dim() == 1 || self.dim() == 2, op, "matrix or a vector expected, got ",
             self.dim(), "D tensor");
  META_CHECK(self.scalar_type() == out.scalar_type(), op, "expected out of dtype ",
             self.scalar_type(), " but got ", out.scalar_type());
  if (self.dim() == 1) {
    const int64_t n = self.size(0) + std::abs(diagonal);
    resize_out(out, {n, n});
  } else {
    int64_t n = diagonal >= 0 ? std::min(self.size(0), self.size(1) - diagonal)
                              : std::min(self.size(0) + diagonal, self.size(1));
    // The CPU kernel fails on these too (resizing to a negative size); only one past the corner
    // gives an empty diagonal.
    META_CHECK(n >= 0, op, "diagonal ", diagonal, " is out of range for a matrix of size ",
               self.sizes());
    resize_out(out, {n});
  }
  return out;
}

// CPU _embedding_bag (1.13): output (bags, D); offset2bag one per index, or empty on the sum fast
// path (contiguous-rowed Float/Half weight); bag_size one per bag (per offset for a sum in the
// forward-only variant); max_indices (bags, D) in max mode, else like bag_size. The checks on
// offset values (offsets[0] == 0, ...) read data and are left to the real run.
std::tuple<Tensor, Tensor, Tensor, Tensor> embedding_bag_impl(
    const char* op, const Tensor& weight, const Tensor& indices, const Tensor& offsets,
    int64_t mode, const c10::optional<Tensor>& per_sample_weights, bool include_last_offset,
    bool forward_only) {
  for (const auto& [name, t] : {std::pair{"indices", &indices}, std::pair{"offsets", &offsets}}) {
    META_CHECK(t->scalar_type() == ScalarType::Long || t->scalar_type() == ScalarType::Int, op,
               "Expected tensor for argument '", name,
               "' to have one of the following scalar "
               "types: Long, Int; but got ",
               t->scalar_type(), " instead");
    META_CHECK(t->dim() == 1, op, "expected 1-D ", name, ", got ", name, " of size ", t->sizes());
  }
  META_CHECK(indices.scalar_type() == offsets.scalar_type(), op,
             "expected indices and offsets of the same type, got ", indices.scalar_type(), " and ",
             offsets.scalar_type());
  META_CHECK(weight.dim() == 2, op, "expected a 2-D weight, got weight of size ", weight.sizes());
  const auto wt = weight.scalar_type();
  META_CHECK(wt == ScalarType::Float || wt == ScalarType::Double || wt == ScalarType::Half ||
                 wt == ScalarType::BFloat16,
             op, "weight of type ", wt, " is not supported");
  META_CHECK(mode >= 0 && mode <= 2, op, "unknown mode ", mode, " (0: sum, 1: mean, 2: max)");
  const Tensor* psw = per_sample_weights.has_value() && per_sample_weights->defined()
                          ? &*per_sample_weights
                          : nullptr;
  if (psw != nullptr) {
    META_CHECK(mode == 0, op, "embedding_bag: per_sample_weights only supported with mode='sum'");
    META_CHECK(psw->scalar_type() == wt, op, "expected per_sample_weights of type ", wt, ", got ",
               psw->scalar_type());
    META_CHECK(psw->dim() == 1 && psw->numel() == indices.numel(), op,
               "expected per_sample_weights of size [", indices.numel(), "], got ", psw->sizes());
  }
  META_CHECK(!include_last_offset || offsets.size(0) >= 1, op,
             "include_last_offset: number of offset should be at least 1");
  const int64_t bags = offsets.size(0) - (include_last_offset ? 1 : 0);
  const ScalarType it = indices.scalar_type();
  const bool fast_sum =
      mode == 0 && weight.stride(1) == 1 && (wt == ScalarType::Float || wt == ScalarType::Half);
  Tensor offset2bag = new_meta({fast_sum ? 0 : indices.size(0)}, it);
  Tensor bag_size = new_meta({mode == 0 && forward_only ? offsets.size(0) : bags}, it);
  Tensor max_indices =
      mode == 2 ? new_meta({bags, weight.size(1)}, it) : new_meta(bag_size.sizes(), it);
  return {new_meta({bags, weight.size(1)}, wt), offset2bag, bag_size, max_indices};
}

std::tuple<Tensor, Tensor, Tensor, Tensor> embedding_bag(
    const Tensor& weight, const Tensor& indices, const Tensor& offsets, bool, int64_t mode, bool,
    const c10::optional<Tensor>& per_sample_weights, bool include_last_offset, int64_t) {
  return embedding_bag_impl("_embedding_bag", weight, indices, offsets, mode, per_sample_weights,
                            include_last_offset, false);
}

std::tuple<Tensor, Tensor, Tensor, Tensor> embedding_bag_forward_only(
    const Tensor& weight, const Tensor& indices, const Tensor& offsets, bool, int64_t mode, bool,
    const c10::optional<Tensor>& per_sample_weights, bool include_last_offset, int64_t) {
  return embedding_bag_impl("_embedding_bag_forward_only", weight, indices, offsets, mode,
                            per_sample_weights, include_last_offset, true);
}

// randperm(n) fills an out tensor resized to (n).
Tensor& randperm_out(int64_t n, c10::optional<at::Generator>, Tensor& out) {
  const char* op = "randperm";
  META_CHECK(n >= 0, op, "n must be non-negative, got", n);
  const auto t = out.scalar_type();
  META_CHECK(t != ScalarType::Bool && !at::isComplexType(t), op, "randperm not implemented for '",
             t, "'");
  const int64_t limit = t == ScalarType::Half       ? (int64_t{1} << 11) + 1
                        : t == ScalarType::BFloat16 ? (int64_t{1} << 8) + 1
                        : t == ScalarType::Float    ? (int64_t{1} << 24) + 1
                                                    : -1;
  META_CHECK(limit < 0 || n <= limit, op, "n cannot be greater than ", limit, " for ", t, " type.");
  resize_out(out, {n}, {}, /*warn=*/false);  // a plain resize_ on CPU
  return out;
}

// ---- losses and activations with buffers ------------------------------------------------------

Tensor binary_cross_entropy(const Tensor& input, const Tensor& target,
                            const c10::optional<Tensor>& weight, int64_t reduction) {
  const char* op = "binary_cross_entropy";
  META_CHECK(at::isFloatingType(input.scalar_type()), op, "expected a floating point input, got ",
             input.scalar_type());
  META_CHECK(target.sizes() == input.sizes(), op, "target of size ", target.sizes(),
             " does not match input of size ", input.sizes());
  META_CHECK(target.scalar_type() == input.scalar_type(), op, "expected target of type ",
             input.scalar_type(), ", got ", target.scalar_type());
  if (weight.has_value() && weight->defined()) {
    META_CHECK(weight->dim() <= input.dim(), op, "weight of size ", weight->sizes(),
               " does not broadcast to input of size ", input.sizes());
    for (int64_t i = 1; i <= weight->dim(); ++i) {
      int64_t w = weight->size(-i), s = input.size(-i);
      META_CHECK(w == s || w == 1, op, "weight of size ", weight->sizes(),
                 " does not broadcast to input of size ", input.sizes());
    }
  }
  META_CHECK(reduction >= 0 && reduction <= 2, op, "unknown reduction ", reduction);
  if (reduction != 0) return new_meta({}, {}, input.scalar_type());
  return new_meta_like(input, input.scalar_type());
}

std::tuple<Tensor, Tensor> nll_loss2d_forward(const Tensor& input, const Tensor& target,
                                              const c10::optional<Tensor>& weight,
                                              int64_t reduction, int64_t) {
  const char* op = "nll_loss2d";
  META_CHECK(target.dim() == 3, op,
             "only batches of spatial targets supported (3D tensors) but got targets of "
             "dimension: ",
             target.dim());
  META_CHECK(input.dim() == 4, op,
             "only batches of spatial inputs supported (4D tensors), but got input of "
             "dimension: ",
             input.dim());
  META_CHECK(target.scalar_type() == ScalarType::Long, op, "expected target of type Long, got ",
             target.scalar_type());
  META_CHECK(!(weight.has_value() && weight->defined()) || weight->numel() == input.size(1), op,
             "weight tensor should be defined either for all or no classes");
  META_CHECK(input.size(0) == target.size(0) && input.size(2) == target.size(1) &&
                 input.size(3) == target.size(2),
             op, "size mismatch (got input: ", input.sizes(), " , target: ", target.sizes());
  META_CHECK(reduction >= 0 && reduction <= 2, op, "unknown reduction ", reduction);
  Tensor total_weight = new_meta({}, {}, input.scalar_type());
  if (reduction != 0) return {new_meta({}, {}, input.scalar_type()), total_weight};
  return {new_meta({input.size(0), input.size(2), input.size(3)}, input.scalar_type()),
          total_weight};
}

std::tuple<Tensor, Tensor> log_sigmoid_forward(const Tensor& self) {
  check_floating("log_sigmoid", self);
  return {new_meta(self.sizes(), self.scalar_type()), new_meta(self.sizes(), self.scalar_type())};
}

// CPU prelu: output in the input's suggested memory format; weight a scalar or one per channel.
Tensor prelu(const Tensor& self, const Tensor& weight) {
  const char* op = "prelu";
  const int64_t n = weight.numel();
  if (n != 1) {
    META_CHECK(self.dim() > 0, op, "Not allow zero-dim input tensor.");
    const int64_t channels = self.dim() > 1 ? self.size(1) : 1;
    META_CHECK(channels == n, op,
               "Mismatch of parameter numbers and input channel size. Found "
               "parameter numbers = ",
               n, " and channel size = ", channels, ".");
  }
  META_CHECK(weight.dim() <= 1, op,
             "prelu: Expected `weight` to be a scalar or 1D tensor, but got ndim = ", weight.dim());
  META_CHECK(self.scalar_type() == weight.scalar_type(), op, "expected weight of type ",
             self.scalar_type(), ", got ", weight.scalar_type());
  return new_meta(self.sizes(), self.scalar_type(), self.suggest_memory_format());
}

// libtorch 2.x's prelu is CompositeImplicitAutograd (it checks the weight, reshapes it to
// broadcast over the channels, then calls this); on CPU the output is at::empty_like(self), which
// TensorIterator resizes (with the usual warning) when the weight broadcasts to a larger shape.
Tensor prelu_kernel(const Tensor& self, const Tensor& weight) {
  const char* op = "_prelu_kernel";
  Tensor out = new_meta_like(self, self.scalar_type());
  at::TensorIteratorConfig config;
  config.add_output(out).add_input(self).add_input(weight);
  MetaIter it(out);
  it.build_checked(op, [&] { it.build(config); });
  return out;
}

// ---- products ---------------------------------------------------------------------------------

Tensor dot_impl(const char* op, const Tensor& self, const Tensor& other) {
  META_CHECK(self.dim() == 1 && other.dim() == 1, op, "1D tensors expected, but got ", self.dim(),
             "D and ", other.dim(), "D tensors");
  META_CHECK(self.scalar_type() == other.scalar_type(), op,
             "expected both vectors to have same dtype, but found ", self.scalar_type(), " and ",
             other.scalar_type());
  META_CHECK(self.numel() == other.numel(), op, "inconsistent tensor size, expected tensor [",
             self.numel(), "] and src [", other.numel(),
             "] to have the same number of elements, but got ", self.numel(), " and ",
             other.numel(), " elements respectively");
  return new_meta({}, {}, self.scalar_type());
}

Tensor dot(const Tensor& self, const Tensor& other) {
  return dot_impl("dot", self, other);
}
Tensor vdot(const Tensor& self, const Tensor& other) {
  return dot_impl("vdot", self, other);
}

ScalarType promoted_integer(const Tensor& self, c10::optional<ScalarType> dtype) {
  if (dtype.has_value()) return *dtype;
  return at::isIntegralType(self.scalar_type(), /*includeBool=*/true) ? ScalarType::Long
                                                                      : self.scalar_type();
}

Tensor trace(const Tensor& self) {
  META_CHECK(self.dim() == 2, "trace", "expected a matrix, but got tensor with dim ", self.dim());
  META_CHECK(self.scalar_type() != ScalarType::Bool, "trace", "not implemented for 'Bool'");
  return new_meta({}, {}, promoted_integer(self, c10::nullopt));
}

Tensor addbmm(const Tensor& self, const Tensor& batch1, const Tensor& batch2, const at::Scalar&,
              const at::Scalar&) {
  const char* op = "addbmm";
  META_CHECK(batch1.dim() == 3, op, "batch1 must be a 3D tensor, got ", batch1.sizes());
  META_CHECK(batch2.dim() == 3, op, "batch2 must be a 3D tensor, got ", batch2.sizes());
  META_CHECK(batch1.size(0) == batch2.size(0), op,
             "batch1 and batch2 must have same number of batches, got ", batch1.size(0), " and ",
             batch2.size(0));
  META_CHECK(batch1.size(2) == batch2.size(1), op, "Incompatible matrix sizes for bmm (",
             batch1.size(1), "x", batch1.size(2), " and ", batch2.size(1), "x", batch2.size(2),
             ")");
  const int64_t target[2] = {batch1.size(1), batch2.size(2)};
  bool expandable = self.dim() <= 2;
  for (int64_t i = 0; expandable && i < self.dim(); ++i) {
    int64_t s = self.size(self.dim() - 1 - i);
    expandable = s == 1 || s == target[1 - i];
  }
  META_CHECK(expandable, op, "self of size ", self.sizes(),
             " cannot be expanded to the matmul output shape [", target[0], ", ", target[1], "]");
  META_CHECK(
      self.scalar_type() == batch1.scalar_type() && batch1.scalar_type() == batch2.scalar_type(),
      op, "expected self, batch1 and batch2 to have the same dtype, but got ", self.scalar_type(),
      ", ", batch1.scalar_type(), " and ", batch2.scalar_type());
  return new_meta({target[0], target[1]}, self.scalar_type());
}

Tensor cdist_forward(const Tensor& x1, const Tensor& x2, double p,
                     c10::optional<int64_t> compute_mode) {
  const char* op = "cdist";
  META_CHECK(x1.dim() >= 2, op, "cdist only supports at least 2D tensors, X1 got: ", x1.dim(), "D");
  META_CHECK(x2.dim() >= 2, op, "cdist only supports at least 2D tensors, X2 got: ", x2.dim(), "D");
  META_CHECK(x1.size(-1) == x2.size(-1), op,
             "X1 and X2 must have the same number of columns. X1: ", x1.size(-1),
             " X2: ", x2.size(-1));
  META_CHECK(at::isFloatingType(x1.scalar_type()), op,
             "cdist only supports floating-point dtypes, X1 got: ", x1.scalar_type());
  META_CHECK(at::isFloatingType(x2.scalar_type()), op,
             "cdist only supports floating-point dtypes, X2 got: ", x2.scalar_type());
  META_CHECK(p >= 0, op, "cdist only supports non-negative p values");
  const int64_t mode = compute_mode.value_or(0);
  META_CHECK(mode >= 0 && mode <= 2, op, "possible modes: 0, 1, 2, but was: ", mode);
  IntArrayRef b1 = x1.sizes().slice(0, x1.dim() - 2), b2 = x2.sizes().slice(0, x2.dim() - 2);
  const int64_t n = std::max(b1.size(), b2.size());
  c10::SmallVector<int64_t, 5> sizes(n);
  for (int64_t i = 0; i < n; ++i) {
    int64_t i1 = static_cast<int64_t>(b1.size()) - n + i;
    int64_t i2 = static_cast<int64_t>(b2.size()) - n + i;
    int64_t s1 = i1 >= 0 ? b1[i1] : 1, s2 = i2 >= 0 ? b2[i2] : 1;
    META_CHECK(s1 == s2 || s1 == 1 || s2 == 1, op, "The size of tensor a (", s1,
               ") must match the size of tensor b (", s2, ") at non-singleton dimension ", i);
    sizes[i] = s1 == 1 ? s2 : s1;
  }
  sizes.append({x1.size(-2), x2.size(-2)});
  return new_meta(sizes, x1.scalar_type());
}

// ---- random / search ------------------------------------------------------------------------

// CPU: in training the mask is empty_like(input, bool) filled by bernoulli_ and the output is
// input.mul(mask) (TensorIterator's layout over both); in eval a clone and ones_like. An empty
// input comes back as itself with an empty mask of its dtype.
std::tuple<Tensor, Tensor> native_dropout(const Tensor& input, double p,
                                          c10::optional<bool> train) {
  const char* op = "native_dropout";
  META_CHECK(p >= 0 && p <= 1, op, "dropout probability has to be between 0 and 1, but got ", p);
  if (input.numel() == 0) {
    return {new_meta_like(input, input.scalar_type()), new_meta_like(input, input.scalar_type())};
  }
  Tensor mask = new_meta_like(input, ScalarType::Bool);
  if (train.has_value() && !*train) return {new_meta_like(input, input.scalar_type()), mask};
  return {binary(op, input, mask), mask};
}

Tensor multinomial(const Tensor& self, int64_t n_sample, bool replacement,
                   c10::optional<at::Generator>) {
  const char* op = "multinomial";
  META_CHECK(self.dim() > 0 && self.dim() <= 2, op, "prob_dist must be 1 or 2 dim, got ",
             self.sizes());
  META_CHECK(
      at::isFloatingType(self.scalar_type()), op,
      "multinomial only supports floating-point dtypes for input, got: ", self.scalar_type());
  META_CHECK(n_sample > 0, op, "cannot sample n_sample <= 0 samples");
  const int64_t categories = self.size(-1);
  META_CHECK(replacement || n_sample <= categories, op,
             "cannot sample n_sample > prob_dist.size(-1) samples without replacement");
  META_CHECK(categories <= (int64_t{1} << 24), op, "number of categories cannot exceed 2^24");
  if (self.dim() == 1) return new_meta({n_sample}, ScalarType::Long);
  return new_meta({self.size(0), n_sample}, ScalarType::Long);
}

Tensor searchsorted_impl(const char* op, const Tensor& boundaries, const Tensor& input,
                         bool out_int32, bool right, c10::optional<c10::string_view> side,
                         const Tensor* sorter) {
  if (side.has_value()) {
    META_CHECK(*side == "left" || *side == "right", op,
               "side can only be 'left' or 'right' but got ", *side);
    META_CHECK(!right || *side == "right", op,
               "side and right can't be set to opposites, got side of ", *side,
               " while right was True");
  }
  if (sorter != nullptr) {
    META_CHECK(sorter->sizes() == boundaries.sizes(), op,
               "boundary and sorter must have the same size, but got boundary tensor ",
               boundaries.sizes(), "and got sorter tensor ", sorter->sizes());
    META_CHECK(sorter->scalar_type() == ScalarType::Long, op,
               "sorter must be a tensor of long dtype but got dtype ", sorter->scalar_type());
  }
  META_CHECK(input.dim() > 0 || (input.numel() == 1 && boundaries.dim() == 1), op,
             "input value can be a scalar only when boundaries tensor dimension is 1, but we got "
             "boundaries tensor dim(",
             boundaries.dim(), ") and input value's dim(", input.dim(), ") numel(", input.numel(),
             ")");
  META_CHECK(boundaries.dim() != 0, op,
             "boundaries tensor should have positive dimension, but got 0 dimension");
  bool leading_match = boundaries.dim() == input.dim();
  for (int64_t i = 0; leading_match && i + 1 < boundaries.dim(); ++i) {
    leading_match = boundaries.size(i) == input.size(i);
  }
  META_CHECK(boundaries.dim() == 1 || leading_match, op,
             "boundaries tensor should be 1 dimension or the first N-1 dimensions of boundaries "
             "tensor and input value tensor must match, but we got boundaries tensor ",
             boundaries.sizes(), " and input value tensor ", input.sizes());
  META_CHECK(!out_int32 || boundaries.sizes().back() < INT_MAX, op,
             "the size of boundaries' last dimension should be less than ", INT_MAX,
             ", but we got ", boundaries.sizes().back());
  return new_meta(input.sizes(), out_int32 ? ScalarType::Int : ScalarType::Long);
}

Tensor searchsorted_tensor(const Tensor& sorted_sequence, const Tensor& self, bool out_int32,
                           bool right, c10::optional<c10::string_view> side,
                           const c10::optional<Tensor>& sorter) {
  const Tensor* s = sorter.has_value() && sorter->defined() ? &*sorter : nullptr;
  return searchsorted_impl("torch.searchsorted()", sorted_sequence, self, out_int32, right, side,
                           s);
}

Tensor bucketize_tensor(const Tensor& self, const Tensor& boundaries, bool out_int32, bool right) {
  META_CHECK(boundaries.dim() == 1, "bucketize",
             "boundaries tensor must be 1 dimension, but got dim(", boundaries.dim(), ")");
  return searchsorted_impl("bucketize", boundaries, self, out_int32, right, c10::nullopt, nullptr);
}

// repeat_interleave(repeats) gives the indices that repeat each position repeats[i] times: its
// length is sum(repeats), a value. Known only when the caller passes output_size (or repeats is
// empty); otherwise DataDependentError. Ours also replaces torch's Python kernel, which raises a
// plain RuntimeError.
Tensor repeat_interleave_tensor(const Tensor& repeats, c10::optional<int64_t> output_size) {
  META_CHECK(repeats.dim() == 1, "repeat_interleave",
             "repeat_interleave only accept 1D vector as repeat");
  META_CHECK(repeats.scalar_type() == ScalarType::Long || repeats.scalar_type() == ScalarType::Int,
             "repeat_interleave", "repeats has to be Long or Int tensor");
  if (repeats.size(0) == 0) return new_meta({0}, repeats.scalar_type());
  if (!output_size) {
    throw DataDependentError(
        "aten::repeat_interleave.Tensor without output_size produces an output whose size depends "
        "on the values of `repeats` (" +
        std::string(c10::toString(repeats.scalar_type())) + " " + c10::str(repeats.sizes()) +
        "), which is a meta or fake tensor: pass output_size, or create `repeats` under "
        "metaload::RealGuard (Python: `with metaload.real():`).");
  }
  META_CHECK(*output_size >= 0, "repeat_interleave", "allocated size does not match required size");
  return new_meta({*output_size}, repeats.scalar_type());
}

// ---- reductions -------------------------------------------------------------------------------

// The shape of a reduction over `dim` (all dims when absent or empty), as make_reduction makes
// it; CPU reductions allocate their results contiguous.
c10::SmallVector<int64_t, 5> reduced_sizes(const char* op, const Tensor& self,
                                           at::OptionalIntArrayRef dim, bool keepdim) {
  std::bitset<64> mask;
  if (!dim.has_value() || dim->empty()) {
    mask.set();
  } else {
    for (int64_t d : *dim) {
      int64_t w = wrap_dim(op, d, self.dim());
      META_CHECK(!mask[w], op, "dim ", w, " appears multiple times in the list of dims");
      mask.set(w);
    }
  }
  c10::SmallVector<int64_t, 5> sizes;
  for (int64_t i = 0; i < self.dim(); ++i) {
    if (!mask[i]) {
      sizes.push_back(self.size(i));
    } else if (keepdim) {
      sizes.push_back(1);
    }
  }
  return sizes;
}

Tensor full_extremum(const char* op, const Tensor& self) {
  META_CHECK(self.numel() > 0, op,
             "Expected reduction dim to be specified for input.numel() == 0. Specify the "
             "reduction dim with the 'dim' argument.");
  check_not_complex(op, self);
  return new_meta({}, {}, self.scalar_type());
}

Tensor max_all(const Tensor& self) {
  return full_extremum("max()", self);
}
Tensor min_all(const Tensor& self) {
  return full_extremum("min()", self);
}

// median of an empty tensor is nan, not an error.
Tensor median_all(const Tensor& self) {
  check_not_complex("median()", self);
  return new_meta({}, {}, self.scalar_type());
}
Tensor nanmedian_all(const Tensor& self) {
  check_not_complex("nanmedian()", self);
  return new_meta({}, {}, self.scalar_type());
}

Tensor prod_all(const Tensor& self, c10::optional<ScalarType> dtype) {
  return new_meta({}, {}, promoted_integer(self, dtype));
}

Tensor nansum(const Tensor& self, at::OptionalIntArrayRef dim, bool keepdim,
              c10::optional<ScalarType> dtype) {
  META_CHECK(!self.is_complex(), "nansum", "nansum does not support complex inputs");
  return new_meta(reduced_sizes("nansum", self, dim, keepdim), promoted_integer(self, dtype));
}

Tensor count_nonzero_dims(const Tensor& self, IntArrayRef dims) {
  return new_meta(reduced_sizes("count_nonzero", self, dims, false), ScalarType::Long);
}

void check_var_dtype(const char* op, const Tensor& self) {
  META_CHECK(at::isFloatingType(self.scalar_type()) || at::isComplexType(self.scalar_type()), op,
             op, " only support floating point and complex dtypes, got ", self.scalar_type());
}

Tensor var_like(const char* op, const Tensor& self, at::OptionalIntArrayRef dim, bool keepdim) {
  check_var_dtype(op, self);
  return new_meta(reduced_sizes(op, self, dim, keepdim), c10::toRealValueType(self.scalar_type()));
}

Tensor var_correction(const Tensor& self, at::OptionalIntArrayRef dim, CorrectionArg,
                      bool keepdim) {
  return var_like("var", self, dim, keepdim);
}

Tensor std_correction(const Tensor& self, at::OptionalIntArrayRef dim, CorrectionArg,
                      bool keepdim) {
  return var_like("std", self, dim, keepdim);
}

std::tuple<Tensor, Tensor> var_mean_like(const char* op, const Tensor& self,
                                         at::OptionalIntArrayRef dim, bool keepdim) {
  check_var_dtype(op, self);
  auto sizes = reduced_sizes(op, self, dim, keepdim);
  return {new_meta(sizes, c10::toRealValueType(self.scalar_type())),
          new_meta(sizes, self.scalar_type())};
}

std::tuple<Tensor, Tensor> var_mean_correction(const Tensor& self, at::OptionalIntArrayRef dim,
                                               CorrectionArg, bool keepdim) {
  return var_mean_like("var_mean", self, dim, keepdim);
}

std::tuple<Tensor, Tensor> std_mean_correction(const Tensor& self, at::OptionalIntArrayRef dim,
                                               CorrectionArg, bool keepdim) {
  return var_mean_like("std_mean", self, dim, keepdim);
}

// ---- factories whose dtype comes from their values
// ------------------------------------------------ libtorch's own kernels (composite) are right;
// torch 1.13's Python meta kernels for these (torch/_meta_registrations.py) are not: arange(16.)
// comes out int64 and full((2,), 7) float32. Python's go on top of libtorch's, so without these
// every meta build from Python gets them.

ScalarType arange_dtype(c10::optional<ScalarType> dtype, const at::Scalar& start,
                        const at::Scalar& end, const at::Scalar& step) {
  if (dtype) return *dtype;
  if (start.isIntegral(true) && end.isIntegral(true) && step.isIntegral(true)) return at::kLong;
  return c10::get_default_dtype_as_scalartype();
}

// The element count at::arange_out computes, with its argument checks.
int64_t arange_size(ScalarType dtype, const at::Scalar& start, const at::Scalar& end,
                    const at::Scalar& step) {
  double size_d;
  if (c10::isIntegralType(dtype, /*includeBool=*/false)) {
    const int64_t s = start.to<int64_t>(), e = end.to<int64_t>(), st = step.to<int64_t>();
    META_CHECK(st != 0, "arange", "step must be nonzero");
    META_CHECK((st > 0 && e >= s) || (st < 0 && e <= s), "arange",
               "upper bound and larger bound inconsistent with step sign");
    size_d = std::ceil(static_cast<double>(e - s) / static_cast<double>(st));
  } else {
    const double s = start.to<double>(), e = end.to<double>(), st = step.to<double>();
    META_CHECK(std::isfinite(s) && std::isfinite(e), "arange", "unsupported range: ", s, " -> ", e);
    META_CHECK(st != 0, "arange", "step must be nonzero");
    META_CHECK((st > 0 && e >= s) || (st < 0 && e <= s), "arange",
               "upper bound and larger bound inconsistent with step sign");
    size_d = std::ceil((e - s) / st);
  }
  META_CHECK(size_d >= 0 && size_d <= static_cast<double>(std::numeric_limits<int64_t>::max()),
             "arange", "invalid size, possible overflow?");
  return static_cast<int64_t>(size_d);
}

Tensor arange_start_step(const at::Scalar& start, const at::Scalar& end, const at::Scalar& step,
                         c10::optional<ScalarType> dtype, c10::optional<at::Layout>,
                         c10::optional<at::Device>, c10::optional<bool>) {
  const ScalarType t = arange_dtype(dtype, start, end, step);
  return new_meta({arange_size(t, start, end, step)}, t);
}

Tensor arange_start(const at::Scalar& start, const at::Scalar& end, c10::optional<ScalarType> dtype,
                    c10::optional<at::Layout> layout, c10::optional<at::Device> device,
                    c10::optional<bool> pin_memory) {
  return arange_start_step(start, end, 1, dtype, layout, device, pin_memory);
}

Tensor arange_end(const at::Scalar& end, c10::optional<ScalarType> dtype,
                  c10::optional<at::Layout> layout, c10::optional<at::Device> device,
                  c10::optional<bool> pin_memory) {
  return arange_start_step(0, end, 1, dtype, layout, device, pin_memory);
}

// full's dtype when none is given: bool, long or the default dtype (complex default for complex).
Tensor full(c10::SymIntArrayRef size, const at::Scalar& fill_value, c10::optional<ScalarType> dtype,
            c10::optional<at::Layout>, c10::optional<at::Device>, c10::optional<bool>) {
  ScalarType t = c10::get_default_dtype_as_scalartype();
  if (dtype) {
    t = *dtype;
  } else if (fill_value.isBoolean()) {
    t = at::kBool;
  } else if (fill_value.isIntegral(false)) {
    t = at::kLong;
  } else if (fill_value.isComplex()) {
    t = c10::toComplexType(t);
  }
  for (int64_t d : concrete(size)) META_CHECK(d >= 0, "full", "negative dimension ", d);
  // The value must fit the dtype, as fill_ checks it on a real run (Scalar::to checks overflow).
  AT_DISPATCH_ALL_TYPES_AND_COMPLEX_AND3(at::kBool, at::kHalf, at::kBFloat16, t, "full",
                                         [&] { (void)fill_value.to<scalar_t>(); });
  return new_meta(concrete(size), t);
}

}  // namespace

const std::vector<KernelDef>& pointwise_index_kernels() {
  static const std::vector<KernelDef> table = {
      METALOAD_META_KERNEL("relu", relu),
      METALOAD_META_KERNEL("arange", arange_end),
      METALOAD_META_KERNEL("arange.start", arange_start),
      METALOAD_META_KERNEL("arange.start_step", arange_start_step),
      METALOAD_META_KERNEL("full", full),
      METALOAD_META_KERNEL("hardswish", hardswish),
      METALOAD_META_KERNEL("hardtanh", hardtanh),
      METALOAD_META_KERNEL("where.self", where_self),
      METALOAD_META_KERNEL("where.self_out", where_self_out),
      METALOAD_META_KERNEL("logical_not", logical_not),
      METALOAD_META_KERNEL("logical_not_", logical_not_),
      METALOAD_META_KERNEL("logical_not.out", logical_not_out),
      METALOAD_META_KERNEL("logical_and.out", logical_and_out),
      METALOAD_META_KERNEL("logical_or.out", logical_or_out),
      METALOAD_META_KERNEL("logical_xor.out", logical_xor_out),
      METALOAD_META_KERNEL("isnan", isnan),
      METALOAD_META_KERNEL("abs.out", abs_out),
      METALOAD_META_KERNEL("nan_to_num.out", nan_to_num_out),
      METALOAD_META_KERNEL("rsub.Tensor", rsub_tensor),
      METALOAD_META_KERNEL("floor_divide", floor_divide),
      METALOAD_META_KERNEL("remainder.Scalar_Tensor", remainder_scalar_tensor),
      METALOAD_META_KERNEL("index_select", index_select),
      METALOAD_META_KERNEL("index_select.out", index_select_out),
      METALOAD_META_KERNEL("take", take),
      METALOAD_META_KERNEL("_embedding_bag", embedding_bag),
      METALOAD_META_KERNEL("_embedding_bag_forward_only", embedding_bag_forward_only),
      METALOAD_META_KERNEL("randperm.generator_out", randperm_out),
      METALOAD_META_KERNEL("binary_cross_entropy", binary_cross_entropy),
      METALOAD_META_KERNEL("nll_loss2d_forward", nll_loss2d_forward),
      METALOAD_META_KERNEL("log_sigmoid_forward", log_sigmoid_forward),
      METALOAD_META_KERNEL("prelu", prelu),
      METALOAD_META_KERNEL("_prelu_kernel", prelu_kernel),
      METALOAD_META_KERNEL("roll", roll),
      METALOAD_META_KERNEL("flip", flip),
      METALOAD_META_KERNEL("diag.out", diag_out),
      METALOAD_META_KERNEL("dot", dot),
      METALOAD_META_KERNEL("vdot", vdot),
      METALOAD_META_KERNEL("trace", trace),
      METALOAD_META_KERNEL("addbmm", addbmm),
      METALOAD_META_KERNEL("_cdist_forward", cdist_forward),
      METALOAD_META_KERNEL("native_dropout", native_dropout),
      METALOAD_META_KERNEL("multinomial", multinomial),
      METALOAD_META_KERNEL("searchsorted.Tensor", searchsorted_tensor),
      METALOAD_META_KERNEL("bucketize.Tensor", bucketize_tensor),
      METALOAD_META_KERNEL("repeat_interleave.Tensor", repeat_interleave_tensor),
      METALOAD_META_KERNEL("max", max_all),
      METALOAD_META_KERNEL("min", min_all),
      METALOAD_META_KERNEL("median", median_all),
      METALOAD_META_KERNEL("nanmedian", nanmedian_all),
      METALOAD_META_KERNEL("prod", prod_all),
      METALOAD_META_KERNEL("nansum", nansum),
      METALOAD_META_KERNEL("count_nonzero.dim_IntList", count_nonzero_dims),
      METALOAD_META_KERNEL("var.correction", var_correction),
      METALOAD_META_KERNEL("std.correction", std_correction),
      METALOAD_META_KERNEL("var_mean.correction", var_mean_correction),
      METALOAD_META_KERNEL("std_mean.correction", std_mean_correction),
  };
  return table;
}

}  // namespace metaload::meta
