// Meta kernels for the LAPACK-backed linear algebra ops whose CPU kernels have no Meta twin in
// libtorch 1.13: cholesky (+ inverse, solve), geqrf, ormqr, householder_product, eig, symeig,
// solve_triangular, matrix_exp and lstsq.
//
// LAPACK works on column-major ("Fortran contiguous") matrices, so the CPU kernels hand back
// their results batched column major: the batch dimensions contiguous, each matrix stored column
// after column (strides (..., 1, rows)). The kernels here allocate the same layout.
#include <ATen/ExpandUtils.h>
#include <ATen/TensorUtils.h>
#include <c10/util/accumulate.h>
#include <c10/util/irange.h>

#include <algorithm>
#include <cctype>
#include <string>
#include <vector>

#include "base/error.h"
#include "kernels/meta_common.h"
#include "kernels/meta_iter.h"

namespace metaload::meta {
namespace {

// ---- helpers --------------------------------------------------------------------------------

// Strides of a batched column-major tensor of these sizes (at least 2 dims): a contiguous tensor
// of the sizes with the last two swapped, transposed back.
c10::SmallVector<int64_t, 5> column_major_strides(IntArrayRef sizes) {
  c10::SmallVector<int64_t, 5> swapped(sizes.begin(), sizes.end());
  const size_t n = swapped.size();
  std::swap(swapped[n - 1], swapped[n - 2]);
  auto strides = meta::contiguous_strides(IntArrayRef(swapped));
  std::swap(strides[n - 1], strides[n - 2]);
  return strides;
}

Tensor new_column_major(IntArrayRef sizes, ScalarType dtype) {
  return new_meta(sizes, column_major_strides(sizes), dtype);
}

bool is_column_major(const Tensor& t) {
  return t.dim() >= 2 && t.mT().is_contiguous();
}

void check_matrix(const char* op, const Tensor& t, const char* name = "A") {
  META_CHECK(t.dim() >= 2, op, "The input tensor ", name, " must have at least 2 dimensions.");
}

// squareCheckInputs: a batch of square matrices.
void check_square(const char* op, const Tensor& t, const char* name = "A") {
  check_matrix(op, t, name);
  META_CHECK(t.size(-1) == t.size(-2), op, name,
             " must be batches of square matrices, but they are ", t.size(-2), " by ", t.size(-1),
             " matrices");
}

void check_floating_or_complex(const char* op, const Tensor& t, const char* what = "input") {
  const ScalarType s = t.scalar_type();
  META_CHECK(at::isFloatingType(s) || at::isComplexType(s), op,
             "Expected a floating point or complex tensor as ", what, ". Got ", s);
}

// checkLinalgCompatibleDtype: an out= tensor must be able to hold `expected` safely.
void check_castable(const char* op, ScalarType expected, const Tensor& out, const char* name) {
  META_CHECK(c10::canCast(expected, out.scalar_type()), op, "Expected ", name,
             " to be safely castable from ", expected, " dtype, but got ", name, " with dtype ",
             out.scalar_type());
}

// A view of t (an out= tensor) with new sizes and strides at the same storage offset, set in
// place (as Tensor::set_ does), its storage grown to hold the largest of both extents.
void restride(const Tensor& t, IntArrayRef sizes, IntArrayRef strides) {
  auto* impl = t.unsafeGetTensorImpl();
  impl->set_sizes_and_strides(sizes, strides);
  if (impl->has_storage()) {
    const size_t needed =
        at::detail::computeStorageNbytes(sizes, strides, t.dtype().itemsize(), t.storage_offset());
    auto* storage = impl->storage().unsafeGetStorageImpl();
    if (storage->nbytes() < needed) storage->set_nbytes(needed);
  }
}

// ---- cholesky family ------------------------------------------------------------------------

Tensor cholesky(const Tensor& self, bool) {
  const char* op = "cholesky";
  // An empty input comes back as an empty contiguous tensor before any check.
  if (self.numel() == 0) return new_meta(self.sizes(), self.scalar_type());
  check_square(op, self);
  check_floating_or_complex(op, self);
  return new_column_major(self.sizes(), self.scalar_type());
}

Tensor cholesky_inverse(const Tensor& self, bool) {
  const char* op = "cholesky_inverse";
  check_square(op, self);
  check_floating_or_complex(op, self);
  return new_column_major(self.sizes(), self.scalar_type());
}

// cholesky_solve (composite) checks and broadcasts its arguments; the helper returns the solution
// in a column-major copy of the right-hand side.
Tensor cholesky_solve_helper(const Tensor& self, const Tensor& A, bool) {
  const char* op = "cholesky_solve";
  check_matrix(op, self, "b");
  check_square(op, A);
  check_floating_or_complex(op, self);
  return new_column_major(self.sizes(), self.scalar_type());
}

// ---- QR pieces ------------------------------------------------------------------------------

std::tuple<Tensor, Tensor> geqrf(const Tensor& self) {
  const char* op = "torch.geqrf";
  META_CHECK(self.dim() >= 2, op, "input must have at least 2 dimensions.");
  check_floating_or_complex(op, self);
  c10::SmallVector<int64_t, 5> tau(self.sizes().begin(), self.sizes().end() - 2);
  tau.push_back(std::min(self.size(-2), self.size(-1)));
  return {new_column_major(self.sizes(), self.scalar_type()), new_meta(tau, self.scalar_type())};
}

// tau holds one scalar per reflector: batch dimensions of input, then at most input.shape[-1].
void check_tau(const char* op, const Tensor& input, const Tensor& tau) {
  META_CHECK(input.dim() - tau.dim() == 1, op,
             "Expected tau to have one dimension less than input, but got tau.ndim equal to ",
             tau.dim(), " and input.ndim is equal to ", input.dim());
  if (input.dim() > 2) {
    const IntArrayRef expected = input.sizes().slice(0, input.dim() - 2);
    const IntArrayRef actual = tau.sizes().slice(0, tau.dim() - 1);
    META_CHECK(actual == expected, op,
               "Expected batch dimensions of tau to be equal to input.shape[:-2], but got ",
               actual);
  }
}

Tensor householder_product(const Tensor& input, const Tensor& tau) {
  const char* op = "torch.linalg.householder_product";
  META_CHECK(input.dim() >= 2, op, "input must have at least 2 dimensions.");
  META_CHECK(input.size(-2) >= input.size(-1), op,
             "input.shape[-2] must be greater than or equal to input.shape[-1]");
  META_CHECK(input.size(-1) >= tau.size(-1), op,
             "input.shape[-1] must be greater than or equal to tau.shape[-1]");
  check_tau(op, input, tau);
  META_CHECK(tau.scalar_type() == input.scalar_type(), op, "tau dtype ", tau.scalar_type(),
             " does not match input dtype ", input.scalar_type());
  check_floating_or_complex(op, input);
  return new_column_major(input.sizes(), input.scalar_type());
}

Tensor ormqr(const Tensor& input, const Tensor& tau, const Tensor& other, bool left, bool) {
  const char* op = "torch.ormqr";
  META_CHECK(input.dim() >= 2, op, "input must have at least 2 dimensions.");
  META_CHECK(other.dim() >= 2, op, "other must have at least 2 dimensions.");
  const int64_t side = left ? -2 : -1;
  META_CHECK(other.size(side) >= tau.size(-1), op, "other.shape[", side,
             "] must be greater than or equal to tau.shape[-1]");
  META_CHECK(other.size(side) == input.size(-2), op, "other.shape[", side,
             "] must be equal to input.shape[-2]");
  META_CHECK(tau.size(-1) <= input.size(-1), op,
             "tau.shape[-1] must be less than or equal to input.shape[-1]");
  if (compat::kOrmqrChecksTauLength) {
    META_CHECK(tau.size(-1) == std::min(other.size(side), input.size(-1)), op,
               "tau.shape[-1] must be equal to min(other.shape[", side, "], input.shape[-1])");
  }
  check_tau(op, input, tau);
  META_CHECK(input.dim() == other.dim(), op,
             "Expected other to have the same number of dimensions as input, but got other.ndim "
             "equal to ",
             other.dim(), " and input.ndim is equal to ", input.dim());
  if (input.dim() > 2) {
    const IntArrayRef expected = input.sizes().slice(0, input.dim() - 2);
    const IntArrayRef actual = other.sizes().slice(0, other.dim() - 2);
    META_CHECK(actual == expected, op,
               "Expected batch dimensions of other to be equal to input.shape[:-2], but got ",
               actual);
  }
  META_CHECK(tau.scalar_type() == input.scalar_type(), op,
             "Expected input and tau to have the same dtype, but input has dtype",
             input.scalar_type(), " and tau has dtype ", tau.scalar_type());
  META_CHECK(other.scalar_type() == input.scalar_type(), op,
             "Expected input and other to have the same dtype, but input has dtype",
             input.scalar_type(), " and other has dtype ", other.scalar_type());
  check_floating_or_complex(op, input);
  return new_column_major(other.sizes(), input.scalar_type());
}

// ---- eigen decompositions -------------------------------------------------------------------

// Complex eigenvalues and eigenvectors, whatever the input's dtype. (The CPU kernel also refuses
// inputs holding inf or NaN: values, left to real runs.)
std::tuple<Tensor, Tensor> linalg_eig(const Tensor& self) {
  const char* op = "linalg.eig";
  check_square(op, self);
  check_floating_or_complex(op, self);
  const ScalarType complex = c10::toComplexType(self.scalar_type());
  return {new_meta(self.sizes().slice(0, self.dim() - 1), complex),
          new_column_major(self.sizes(), complex)};
}

// symeig (composite, deprecated) checks that its input is square before the helper (which does
// not); the helper returns real eigenvalues and, when asked, the eigenvectors column major.
std::tuple<Tensor, Tensor> symeig_helper(const Tensor& self, bool eigenvectors, bool) {
  const char* op = "symeig";
  check_matrix(op, self);
  check_floating_or_complex(op, self);
  Tensor values =
      new_meta(self.sizes().slice(0, self.dim() - 1), c10::toRealValueType(self.scalar_type()));
  if (self.numel() == 0) return {values, new_meta(self.sizes(), self.scalar_type())};
  if (!eigenvectors) return {values, new_meta({0}, self.scalar_type())};
  return {values, new_column_major(self.sizes(), self.scalar_type())};
}

// ---- solvers --------------------------------------------------------------------------------

// The solution has B's matrix shape and the broadcast batch dimensions of A and B; the CPU kernel
// returns it column major.
Tensor solve_triangular(const Tensor& A, const Tensor& B, bool, bool left, bool) {
  const char* op = "linalg.solve_triangular";
  check_square(op, A);
  META_CHECK(B.dim() >= 2, op, "The input tensor B must have at least 2 dimensions.");
  META_CHECK(left ? A.size(-2) == B.size(-2) : A.size(-1) == B.size(-1), op,
             "Incompatible shapes of A and B for the equation ", left ? "AX = B" : "XA = B", " (",
             A.size(-2), "x", A.size(-1), " and ", B.size(-2), "x", B.size(-1), ")");
  META_CHECK(A.scalar_type() == B.scalar_type(), op,
             "Expected A and B to have the same dtype, but found A of type ", A.scalar_type(),
             " and B of type ", B.scalar_type(), " instead");
  check_floating_or_complex(op, A);
  const auto batch =
      at::infer_size(A.sizes().slice(0, A.dim() - 2), B.sizes().slice(0, B.dim() - 2));
  c10::SmallVector<int64_t, 5> sizes(batch.begin(), batch.end());
  sizes.push_back(B.size(-2));
  sizes.push_back(B.size(-1));
  return new_column_major(sizes, B.scalar_type());
}

// matrix_exp: a clone for 0x0 matrices, exp() for 1x1 ones (elementwise: its output follows the
// input's layout), the Taylor/Pade evaluation otherwise, on self.view(-1, n, n) (which fails for
// a batch whose dimensions cannot be merged). That result is contiguous from 2.x on; on 1.13 it is
// empty_like(the view), viewed back to self's shape.
Tensor matrix_exp(const Tensor& self) {
  const char* op = "linalg.matrix_exp";
  check_square(op, self);
  check_floating_or_complex(op, self);
  const int64_t n = self.size(-1);
  if (n == 0) return new_meta_like(self, self.scalar_type());
  if (n == 1) {
    MetaIter it({Tensor()});
    it.build_checked(op, [&] { it.build_borrowing_unary_float_op(it.maybe_get_output(0), self); });
    return it.out(0);
  }
  const int64_t batch = c10::multiply_integers(self.sizes().slice(0, self.dim() - 2));
  const int64_t flat_sizes[] = {batch, n, n};
  const auto flat_strides = at::detail::computeStride(self.sizes(), self.strides(), flat_sizes);
  META_CHECK(flat_strides.has_value(), "view",
             "view size is not compatible with input tensor's size and stride (at least one "
             "dimension spans across two contiguous subspaces). Use .reshape(...) instead.");
  if (compat::kMatrixExpIsContiguous) return new_meta(self.sizes(), self.scalar_type());
  const Tensor flat =
      new_meta_like(new_meta(flat_sizes, *flat_strides, self.scalar_type()), self.scalar_type());
  const auto strides = at::detail::computeStride(flat_sizes, flat.strides(), self.sizes());
  return new_meta(self.sizes(), *strides, self.scalar_type());
}

// ---- least squares ----------------------------------------------------------------------------

// Step 1: the argument checks of the CPU kernel, and the driver (lowercase; gelsy by default).
std::string lstsq_checks(const char* op, const Tensor& input, const Tensor& other,
                         c10::optional<c10::string_view> driver_arg, const Tensor& solution,
                         const Tensor& residuals, const Tensor& rank,
                         const Tensor& singular_values) {
  META_CHECK(input.dim() >= 2, op, "input must have at least 2 dimensions.");
  META_CHECK(other.dim() >= 1, op, "other must have at least 1 dimension.");
  META_CHECK(input.scalar_type() == other.scalar_type(), op,
             "Expected input and other to have the same dtype, but got input's dtype ",
             input.scalar_type(), " and other's dtype ", other.scalar_type());
  const int64_t dim_diff = input.dim() - other.dim();
  META_CHECK(0 <= dim_diff && dim_diff <= 1, op,
             "input.dim() must be greater or equal to other.dim() and (input.dim() - "
             "other.dim()) <= 1");
  const int64_t other_rows = dim_diff ? other.size(-1) : other.size(-2);
  META_CHECK(input.size(-2) == other_rows, op,
             dim_diff ? "input.size(-2) should match other.size(-1)"
                      : "input.size(-2) should match other.size(-2)");
  check_floating_or_complex(op, input);
  const ScalarType dtype = input.scalar_type();
  const ScalarType real = c10::toRealValueType(dtype);
  check_castable(op, dtype, solution, "solution");
  check_castable(op, real, residuals, "residuals");
  check_castable(op, ScalarType::Long, rank, "rank");
  check_castable(op, real, singular_values, "singular_values");
  std::string driver = "gelsy";
  if (driver_arg.has_value()) {
    driver = std::string(driver_arg->data(), driver_arg->size());
    std::transform(driver.begin(), driver.end(), driver.begin(),
                   [](unsigned char c) { return std::tolower(c); });
    META_CHECK(driver == "gels" || driver == "gelsy" || driver == "gelsd" || driver == "gelss", op,
               "parameter `driver` should be one of (gels, gelsy, gelsd, gelss)");
  }
  return driver;
}

// The shapes of lstsq's results as computed into fresh tensors, and which the driver fills.
struct LstsqShapes {
  bool vector_case = false;
  c10::SmallVector<int64_t, 5> buffer, solution, rank, sv, residual;
  bool has_rank = false, has_sv = false, has_residuals = false;
};

// Step 2: the result shapes. LAPACK's buffer has max(m, n) rows; the solution is its first n.
LstsqShapes lstsq_shapes(const char* op, const Tensor& input, const Tensor& other,
                         const std::string& driver) {
  LstsqShapes r;
  // A right-hand side of input.shape[:-1] (or 1-d) is a batch of vectors.
  const IntArrayRef input_rows = input.sizes().slice(0, input.dim() - 1);
  r.vector_case =
      other.dim() == 1 || (input.dim() - 1 == other.dim() && other.sizes() == input_rows);
  c10::SmallVector<int64_t, 5> other_2d(other.sizes().begin(), other.sizes().end());
  if (r.vector_case) other_2d.push_back(1);
  META_CHECK(input.size(-2) == other_2d.end()[-2], op,
             "input.size(-2) should match other.size(-2)");
  const int64_t m = input.size(-2), n = input.size(-1), nrhs = other_2d.back();
  const IntArrayRef input_batch = input.sizes().slice(0, input.dim() - 2);
  const auto batch =
      at::infer_size(input_batch, IntArrayRef(other_2d).slice(0, other_2d.size() - 2));
  r.buffer.assign(batch.begin(), batch.end());
  r.buffer.push_back(std::max(m, n));
  if (!r.vector_case) r.buffer.push_back(nrhs);
  r.solution = r.buffer;
  r.solution[batch.size()] = n;
  r.rank.assign(input_batch.begin(), input_batch.end());
  r.sv = r.rank;
  r.sv.push_back(std::min(m, n));
  r.has_rank = driver != "gels";
  r.has_sv = driver == "gelsd" || driver == "gelss";
  r.has_residuals = m > n && driver != "gelsy";
  // Residuals exist for gelsd/gelss only when every matrix has rank n. An empty batch or n == 0
  // decides it without values.
  if (r.has_residuals && r.has_sv && c10::multiply_integers(input_batch) != 0 && n != 0) {
    throw DataDependentError(
        "aten::linalg_lstsq.out with driver " + driver +
        " returns residuals only when every matrix has full rank, which depends on the values, "
        "but its input has none: it is a meta or fake tensor, which holds shapes only (input: " +
        std::string(c10::toString(input.scalar_type())) + " " + c10::str(input.sizes()) +
        "). Use driver='gels' or 'gelsy' (whose outputs have known shapes), or create the "
        "tensors under metaload::RealGuard (Python: `with metaload.real():`).");
  }
  // residuals = the squares of the buffer's rows n..m summed, a trailing column in the vector
  // case (the buffer is unsqueezed while LAPACK runs).
  r.residual.assign(batch.begin(), batch.end());
  r.residual.push_back(r.vector_case ? 1 : nrhs);
  return r;
}

// Step 3: whether the provided outputs cannot be used as they are. They can when the solution is
// empty or has the solution's shape, dtype and (column-major, or contiguous for vectors) layout,
// and the rank and singular values the driver fills are empty or right.
bool lstsq_copy_needed(const LstsqShapes& r, ScalarType dtype, const Tensor& solution,
                       const Tensor& rank, const Tensor& singular_values) {
  const ScalarType real = c10::toRealValueType(dtype);
  const bool solution_layout_ok =
      r.vector_case ? solution.is_contiguous() : is_column_major(solution);
  bool copy_needed = solution.numel() != 0 && !solution_layout_ok;
  copy_needed |= solution.scalar_type() != dtype;
  copy_needed |= solution.numel() != 0 && solution.sizes() != IntArrayRef(r.solution);
  if (r.has_rank) {
    copy_needed |= rank.scalar_type() != ScalarType::Long;
    copy_needed |=
        rank.numel() != 0 && (rank.sizes() != IntArrayRef(r.rank) || !rank.is_contiguous());
  }
  if (r.has_sv) {
    copy_needed |= singular_values.scalar_type() != real;
    copy_needed |= singular_values.numel() != 0 && (singular_values.sizes() != IntArrayRef(r.sv) ||
                                                    !singular_values.is_contiguous());
  }
  return copy_needed;
}

// linalg_lstsq.out, which the functional form (composite) calls with empty outputs.
//
// LAPACK solves in place in a (*, max(m, n), nrhs) column-major buffer holding B; the solution is
// its first n rows, a view whose strides keep the buffer's. Which outputs are filled depends on
// the driver: rank for all but gels, singular values for gelsd/gelss, residuals when m > n for
// all but gelsy -- and for gelsd/gelss only when every matrix has full rank, which depends on the
// values (DataDependentError). The default driver is the CPU kernel's, gelsy (CUDA's is gels).
std::tuple<Tensor&, Tensor&, Tensor&, Tensor&> linalg_lstsq_out(
    const Tensor& input, const Tensor& other, c10::optional<double>,
    c10::optional<c10::string_view> driver_arg, Tensor& solution, Tensor& residuals, Tensor& rank,
    Tensor& singular_values) {
  const char* op = "torch.linalg.lstsq";
  const std::string driver =
      lstsq_checks(op, input, other, driver_arg, solution, residuals, rank, singular_values);
  const LstsqShapes r = lstsq_shapes(op, input, other, driver);
  const ScalarType real = c10::toRealValueType(input.scalar_type());
  if (lstsq_copy_needed(r, input.scalar_type(), solution, rank, singular_values)) {
    // Every result is computed into a temporary and copied into its output, resized as needed.
    resize_out(solution, r.solution);
    resize_out(residuals, r.has_residuals ? IntArrayRef(r.residual) : IntArrayRef{0});
    resize_out(rank, r.has_rank ? IntArrayRef(r.rank) : IntArrayRef{0});
    resize_out(singular_values, r.has_sv ? IntArrayRef(r.sv) : IntArrayRef{0});
    return {solution, residuals, rank, singular_values};
  }
  // Used in place, an output the driver does not fill must still have the dtype LAPACK's
  // results come in (the CPU kernel asserts it).
  META_CHECK(rank.scalar_type() == ScalarType::Long, op, "rank must have dtype Long, but got ",
             rank.scalar_type());
  META_CHECK(singular_values.scalar_type() == real, op, "singular_values must have dtype ", real,
             ", but got ", singular_values.scalar_type());
  if (solution.numel() == 0) {
    // LAPACK's buffer, then a view of its first n rows.
    restride(solution, r.buffer,
             r.vector_case ? meta::contiguous_strides(IntArrayRef(r.buffer))
                           : column_major_strides(r.buffer));
    restride(solution, r.solution, solution.strides());
  }
  if (r.has_rank && rank.numel() == 0) {
    restride(rank, r.rank, meta::contiguous_strides(IntArrayRef(r.rank)));
  }
  if (r.has_sv && singular_values.numel() == 0) {
    restride(singular_values, r.sv, meta::contiguous_strides(IntArrayRef(r.sv)));
  }
  if (r.has_residuals) {
    META_CHECK(residuals.scalar_type() == real, op, "Expected out tensor to have dtype ", real,
               ", but got ", residuals.scalar_type(), " instead");
    resize_out(residuals, r.residual);
  }
  return {solution, residuals, rank, singular_values};
}

}  // namespace

const std::vector<KernelDef>& linalg_kernels() {
  static const std::vector<KernelDef> table = {
      METALOAD_META_KERNEL("cholesky", cholesky),
      METALOAD_META_KERNEL("cholesky_inverse", cholesky_inverse),
      METALOAD_META_KERNEL("_cholesky_solve_helper", cholesky_solve_helper),
      METALOAD_META_KERNEL("geqrf", geqrf),
      METALOAD_META_KERNEL("linalg_householder_product", householder_product),
      METALOAD_META_KERNEL("ormqr", ormqr),
      METALOAD_META_KERNEL("linalg_eig", linalg_eig),
      METALOAD_META_KERNEL("_symeig_helper", symeig_helper),
      METALOAD_META_KERNEL("linalg_solve_triangular", solve_triangular),
      METALOAD_META_KERNEL("linalg_matrix_exp", matrix_exp),
      METALOAD_META_KERNEL("linalg_lstsq.out", linalg_lstsq_out),
  };
  return table;
}

}  // namespace metaload::meta
