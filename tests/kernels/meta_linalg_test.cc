// Meta kernels of kernels/meta_linalg.cc against the CPU kernels: every result's sizes, strides
// (LAPACK's batched column-major layouts), dtypes, on inputs the CPU kernels accept (positive
// definite, triangular, full-rank matrices) in several memory layouts, lstsq's out= tensors in
// every state, and the argument errors.
#include <ATen/core/dispatch/Dispatcher.h>

#include "c10_ext/mode_key.h"
#include "tests/kernels/meta_harness.h"

namespace metaload::testing {
namespace {

using at::kComplexFloat;
using at::kDouble;
using at::kFloat;
using at::kInt;
using at::kLong;

// The layouts a matrix argument comes in; the values stay t's.
const Layout kMatrixLayouts[] = {Layout::kContiguous, Layout::kTransposed, Layout::kSliced,
                                 Layout::kPermuted};

Tensor in_layout(const Tensor& t, Layout layout, Gen& g) {
  const int64_t n = t.dim();
  switch (layout) {
    case Layout::kTransposed:
      if (n < 2) return t.clone();
      return t.mT().contiguous().mT();
    case Layout::kSliced: {
      if (n < 1) return t.clone();
      std::vector<int64_t> s = t.sizes().vec();
      s.back() *= 2;
      Tensor v = at::empty(s, t.options()).slice(-1, 0, s.back(), 2);
      return v.copy_(t);
    }
    case Layout::kPermuted: {
      std::vector<int64_t> perm(n);
      for (int64_t i = 0; i < n; ++i) perm[i] = i;
      std::shuffle(perm.begin(), perm.end(), g.rng());
      std::vector<int64_t> s(n);
      for (int64_t i = 0; i < n; ++i) s[perm[i]] = t.size(i);
      return at::empty(s, t.options()).permute(perm).copy_(t);
    }
    default:
      return t.contiguous();
  }
}

Layout any_matrix_layout(Gen& g) {
  return kMatrixLayouts[g.uniform(0, 3)];
}

std::vector<int64_t> shape(std::vector<int64_t> batch, int64_t rows, int64_t cols) {
  batch.push_back(rows);
  batch.push_back(cols);
  return batch;
}

// A batch of symmetric positive definite matrices, and lower-triangular ones with a dominant
// diagonal (invertible, a Cholesky factor).
Tensor spd(Gen& g, at::IntArrayRef batch, int64_t n, at::ScalarType dtype) {
  Tensor a = g.values(shape(batch.vec(), n, n), dtype);
  return at::matmul(a, a.mT()) + n * at::eye(n, dtype);
}

Tensor lower(Gen& g, at::IntArrayRef batch, int64_t n, at::ScalarType dtype) {
  return at::tril(g.values(shape(batch.vec(), n, n), dtype)) + n * at::eye(n, dtype);
}

std::vector<int64_t> any_batch(Gen& g) {
  return g.sizes(g.uniform(0, 2), 0, 3);
}

// A batch shape that broadcasts with `batch`: none, the same, or one more leading dimension.
std::vector<int64_t> broadcasting_batch(Gen& g, const std::vector<int64_t>& batch) {
  switch (g.uniform(0, 2)) {
    case 0:
      return {};
    case 1:
      return batch;
    default: {
      auto b = batch;
      b.insert(b.begin(), 2);
      return b;
    }
  }
}

// ---- cholesky family ------------------------------------------------------------------------

TEST(MetaLinalg, CholeskyFamilyMatchesCpu) {
  Gen g(400);
  for (int rep = 0; rep < 16; ++rep) {
    const auto batch = any_batch(g);
    const int64_t n = g.uniform(0, 4);
    const auto dtype = rep % 2 ? kFloat : kDouble;
    const Layout l = any_matrix_layout(g);
    const bool upper = g.uniform(0, 1);
    expect_meta_matches_cpu(c10::str("cholesky ", name(l), upper ? " upper" : ""),
                            [=](const Inputs& v) { return flat(at::cholesky(v[0], upper)); },
                            {in_layout(spd(g, batch, n, dtype), l, g)});
    Tensor factor = lower(g, batch, n, dtype);
    if (upper) factor = factor.mT();
    expect_meta_matches_cpu(
        c10::str("cholesky_inverse ", name(l), upper ? " upper" : ""),
        [=](const Inputs& v) { return flat(at::cholesky_inverse(v[0], upper)); },
        {in_layout(factor, l, g)});
    // The right-hand side broadcasts its batch against the factor's.
    const auto rhs_batch = broadcasting_batch(g, batch);
    Tensor b = g.make(shape(rhs_batch, n, g.uniform(0, 3)), dtype);
    expect_meta_matches_cpu(
        c10::str("cholesky_solve ", name(l), upper ? " upper" : ""),
        [=](const Inputs& v) { return flat(at::cholesky_solve(v[0], v[1], upper)); },
        {in_layout(b, any_matrix_layout(g), g), in_layout(factor, l, g)});
  }
  // An empty input is returned contiguous, before the shape checks.
  expect_meta_matches_cpu("cholesky of an empty batch",
                          [](const Inputs& v) { return flat(at::cholesky(v[0])); },
                          {at::empty({0, 3, 3}, kFloat)});
  Gen& rg = g;
  expect_both_fail(
      "cholesky of a vector", [](const Inputs& v) { return flat(at::cholesky(v[0])); },
      {rg.make({3}, kFloat)}, "must have at least 2 dimensions");
  expect_both_fail(
      "cholesky of a non-square matrix", [](const Inputs& v) { return flat(at::cholesky(v[0])); },
      {rg.make({3, 2}, kFloat)},
      "must be batches of square matrices, but they are 3 by 2 matrices");
  expect_both_fail(
      "cholesky_inverse of a non-square matrix",
      [](const Inputs& v) { return flat(at::cholesky_inverse(v[0])); }, {rg.make({2, 3}, kFloat)},
      "must be batches of square matrices, but they are 2 by 3 matrices");
  expect_both_fail(
      "cholesky long", [](const Inputs& v) { return flat(at::cholesky(v[0])); },
      {at::ones({2, 2}, kLong)}, "Long");
}

// ---- QR pieces ------------------------------------------------------------------------------

TEST(MetaLinalg, GeqrfHouseholderOrmqrMatchCpu) {
  Gen g(401);
  for (int rep = 0; rep < 16; ++rep) {
    const auto batch = any_batch(g);
    const int64_t m = g.uniform(0, 5), n = g.uniform(0, 5);
    const auto dtype = rep % 2 ? kFloat : kDouble;
    const Layout l = any_matrix_layout(g);
    Tensor a = in_layout(g.values(shape(batch, m, n), dtype), l, g);
    expect_meta_matches_cpu(c10::str("geqrf ", name(l)),
                            [](const Inputs& v) { return flat(at::geqrf(v[0])); }, {a});
    // householder_product: input m x n with m >= n, tau of k <= n reflectors.
    const int64_t rows = std::max(m, n), k = g.uniform(0, n);
    std::vector<int64_t> tau_sizes = batch;
    tau_sizes.push_back(k);
    Tensor h = in_layout(g.values(shape(batch, rows, n), dtype), l, g);
    Tensor tau = g.make(tau_sizes, dtype);
    expect_meta_matches_cpu(
        c10::str("householder_product ", name(l)),
        [](const Inputs& v) { return flat(at::linalg_householder_product(v[0], v[1])); }, {h, tau});
    // ormqr: (rows x n) reflectors applied to C from the left (C has `rows` rows) or the right
    // (C has `rows` columns); one reflector per column of the input (2.x requires that many).
    tau_sizes.back() = n;
    tau = g.make(tau_sizes, dtype);
    for (bool left : {true, false}) {
      const int64_t other = g.uniform(0, 3);
      Tensor c =
          in_layout(g.values(left ? shape(batch, rows, other) : shape(batch, other, rows), dtype),
                    any_matrix_layout(g), g);
      const bool transpose = g.uniform(0, 1);
      expect_meta_matches_cpu(
          c10::str("ormqr ", name(l), left ? " left" : " right", transpose ? " transposed" : ""),
          [=](const Inputs& v) { return flat(at::ormqr(v[0], v[1], v[2], left, transpose)); },
          {h, tau, c});
    }
  }
  expect_both_fail(
      "geqrf of a vector", [](const Inputs& v) { return flat(at::geqrf(v[0])); },
      {g.make({3}, kFloat)}, "torch.geqrf: input must have at least 2 dimensions.");
  expect_both_fail(
      "geqrf long", [](const Inputs& v) { return flat(at::geqrf(v[0])); },
      {at::ones({2, 2}, kLong)}, "Long");
  auto hp = [](const Inputs& v) { return flat(at::linalg_householder_product(v[0], v[1])); };
  expect_both_fail("householder_product of a wide matrix", hp,
                   {g.make({2, 3}, kFloat), g.make({2}, kFloat)},
                   "input.shape[-2] must be greater than or equal to input.shape[-1]");
  expect_both_fail("householder_product with too many reflectors", hp,
                   {g.make({4, 3}, kFloat), g.make({4}, kFloat)},
                   "input.shape[-1] must be greater than or equal to tau.shape[-1]");
  expect_both_fail("householder_product tau batch", hp,
                   {g.make({2, 4, 3}, kFloat), g.make({3, 2}, kFloat)},
                   "Expected batch dimensions of tau to be equal to input.shape[:-2]");
  expect_both_fail("householder_product tau rank", hp,
                   {g.make({2, 4, 3}, kFloat), g.make({2}, kFloat)},
                   "Expected tau to have one dimension less than input");
  expect_both_fail("householder_product tau dtype", hp,
                   {g.make({4, 3}, kFloat), g.make({2}, kDouble)}, "does not match input dtype");
  auto orm = [](const Inputs& v) { return flat(at::ormqr(v[0], v[1], v[2])); };
  expect_both_fail("ormqr rows", orm,
                   {g.make({4, 3}, kFloat), g.make({3}, kFloat), g.make({3, 2}, kFloat)},
                   "other.shape[-2] must be equal to input.shape[-2]");
  expect_both_fail("ormqr rank", orm,
                   {g.make({4, 3}, kFloat), g.make({3}, kFloat), g.make({1, 4, 2}, kFloat)},
                   "Expected other to have the same number of dimensions as input");
  // 1.13 takes fewer reflectors than columns, 2.x does not.
  expect_meta_agrees_with_cpu(
      "ormqr with fewer reflectors", orm,
      {g.make({4, 3}, kFloat), g.make({2}, kFloat), g.make({4, 2}, kFloat)},
      "tau.shape[-1] must be equal to min(other.shape[-2], input.shape[-1])");
  expect_both_fail("ormqr dtype", orm,
                   {g.make({4, 3}, kFloat), g.make({3}, kFloat), g.make({4, 2}, kDouble)},
                   "Expected input and other to have the same dtype");
}

// ---- eigen decompositions -------------------------------------------------------------------

TEST(MetaLinalg, EigMatchesCpu) {
  Gen g(402);
  for (int rep = 0; rep < 12; ++rep) {
    const auto batch = any_batch(g);
    const int64_t n = g.uniform(0, 4);
    const auto dtype = rep % 3 == 0 ? kComplexFloat : (rep % 3 == 1 ? kFloat : kDouble);
    const Layout l = any_matrix_layout(g);
    expect_meta_matches_cpu(c10::str("linalg_eig ", dtype, " ", name(l)),
                            [](const Inputs& v) { return flat(at::linalg_eig(v[0])); },
                            {in_layout(g.values(shape(batch, n, n), dtype), l, g)});
  }
  expect_both_fail(
      "linalg_eig of a non-square matrix",
      [](const Inputs& v) { return flat(at::linalg_eig(v[0])); }, {g.make({3, 2}, kFloat)},
      "must be batches of square matrices, but they are 3 by 2 matrices");
  expect_both_fail(
      "linalg_eig long", [](const Inputs& v) { return flat(at::linalg_eig(v[0])); },
      {at::ones({2, 2}, kLong)}, "Long");
}

// linalg_eigvals is composite (over linalg_eig's kernel above): the same on meta as on CPU.
TEST(MetaLinalg, EigvalsMatchesCpu) {
  Gen g(404);
  for (int rep = 0; rep < 9; ++rep) {
    const auto batch = any_batch(g);
    const int64_t n = g.uniform(0, 4);
    const auto dtype = rep % 3 == 0 ? kComplexFloat : (rep % 3 == 1 ? kFloat : kDouble);
    const Layout l = any_matrix_layout(g);
    expect_meta_matches_cpu(c10::str("linalg_eigvals ", dtype, " ", name(l)),
                            [](const Inputs& v) { return flat(at::linalg_eigvals(v[0])); },
                            {in_layout(g.values(shape(batch, n, n), dtype), l, g)});
  }
  expect_both_fail(
      "linalg_eigvals of a non-square matrix",
      [](const Inputs& v) { return flat(at::linalg_eigvals(v[0])); }, {g.make({3, 2}, kFloat)},
      "must be batches of square matrices, but they are 3 by 2 matrices");
}

// symeig exists in 1.13 only (2.x removed it): called through the dispatcher by name, so that the
// test builds on both.
TEST(MetaLinalg, SymeigHelperMatchesCpuWhereItExists) {
  auto handle = c10::Dispatcher::singleton().findOp({"aten::_symeig_helper", ""});
  if (!handle) GTEST_SKIP() << "this libtorch has no symeig (removed in torch 2.x)";
  auto op = handle->typed<std::tuple<Tensor, Tensor>(const Tensor&, bool, bool)>();
  Gen g(403);
  for (int rep = 0; rep < 8; ++rep) {
    const auto batch = any_batch(g);
    const int64_t n = g.uniform(0, 4);
    const bool vectors = rep % 2;
    const Layout l = any_matrix_layout(g);
    expect_meta_matches_cpu(c10::str("_symeig_helper ", name(l), vectors ? " vectors" : ""),
                            [=](const Inputs& v) { return flat(op.call(v[0], vectors, true)); },
                            {in_layout(spd(g, batch, n, kFloat), l, g)});
  }
  // The square check is symeig's (composite), before the helper.
  auto symeig = c10::Dispatcher::singleton()
                    .findSchemaOrThrow("aten::symeig", "")
                    .typed<std::tuple<Tensor, Tensor>(const Tensor&, bool, bool)>();
  expect_both_fail(
      "symeig of a non-square matrix",
      [=](const Inputs& v) { return flat(symeig.call(v[0], true, false)); },
      {g.make({3, 2}, kFloat)}, "must be batches of square matrices", "aten::symeig");
}

// ---- solvers, matrix_exp ----------------------------------------------------------------------

TEST(MetaLinalg, SolveTriangularAndMatrixExpMatchCpu) {
  Gen g(404);
  for (int rep = 0; rep < 16; ++rep) {
    const auto batch = any_batch(g);
    const int64_t n = g.uniform(0, 4), k = g.uniform(0, 3);
    const auto dtype = rep % 2 ? kFloat : kDouble;
    const bool upper = g.uniform(0, 1), left = g.uniform(0, 1);
    Tensor a = lower(g, batch, n, dtype);
    if (upper) a = a.mT();
    const auto b_batch = broadcasting_batch(g, batch);
    Tensor b = g.values(left ? shape(b_batch, n, k) : shape(b_batch, k, n), dtype);
    const Layout la = any_matrix_layout(g), lb = any_matrix_layout(g);
    expect_meta_matches_cpu(
        c10::str("solve_triangular ", name(la), "/", name(lb), upper ? " upper" : "",
                 left ? " left" : " right"),
        [=](const Inputs& v) {
          return flat(at::linalg_solve_triangular(v[0], v[1], upper, left, false));
        },
        {in_layout(a, la, g), in_layout(b, lb, g)});
    Tensor m = g.values(shape(batch, n, n), dtype);
    // The input is viewed as one batch of matrices: a batch whose dimensions do not merge is
    // refused.
    expect_meta_agrees_with_cpu(
        c10::str("matrix_exp ", n, "x", n, " ", name(la)),
        [](const Inputs& v) { return flat(at::linalg_matrix_exp(v[0])); }, {in_layout(m, la, g)},
        "view size is not compatible with input tensor's size and stride");
  }
  auto st = [](const Inputs& v) { return flat(at::linalg_solve_triangular(v[0], v[1], true)); };
  expect_both_fail("solve_triangular shapes", st, {g.make({3, 3}, kFloat), g.make({2, 1}, kFloat)},
                   "Incompatible shapes of A and B for the equation AX = B (3x3 and 2x1)");
  expect_both_fail("solve_triangular non-square", st,
                   {g.make({3, 2}, kFloat), g.make({3, 1}, kFloat)},
                   "must be batches of square matrices");
  expect_both_fail("solve_triangular vector", st, {g.make({3, 3}, kFloat), g.make({3}, kFloat)},
                   "must have at least 2 dimensions");
  expect_both_fail(
      "matrix_exp non-square", [](const Inputs& v) { return flat(at::linalg_matrix_exp(v[0])); },
      {g.make({3, 2}, kFloat)}, "must be batches of square matrices");
  expect_both_fail(
      "matrix_exp long", [](const Inputs& v) { return flat(at::linalg_matrix_exp(v[0])); },
      {at::ones({2, 2}, kLong)}, "Long");
}

// ---- lstsq ------------------------------------------------------------------------------------

TEST(MetaLinalg, LstsqMatchesCpuForEveryDriver) {
  Gen g(405);
  for (int rep = 0; rep < 32; ++rep) {
    const auto batch = any_batch(g);
    const int64_t m = g.uniform(1, 5), n = g.uniform(1, 5), nrhs = g.uniform(1, 3);
    const auto dtype = rep % 2 ? kFloat : kDouble;
    const char* drivers[] = {"gelsy", "gels", "gelsd", "gelss"};
    const char* driver = drivers[rep % 4];
    // gels needs a full-rank tall (or square) matrix; the others take any.
    const int64_t rows = std::string(driver) == "gels" ? std::max(m, n) : m;
    Tensor a = in_layout(g.values(shape(batch, rows, n), dtype), any_matrix_layout(g), g);
    // B: a batch of vectors (input.shape[:-1]), or of matrices whose batch broadcasts with A's
    // (lstsq takes B with as many dimensions as A, or one less for vectors).
    const bool vector = g.uniform(0, 3) == 0;
    std::vector<int64_t> b_sizes = batch;
    if (!vector) {
      for (auto& d : b_sizes) {
        if (g.uniform(0, 2) == 0) d = 1;
      }
    }
    b_sizes.push_back(rows);
    if (!vector) b_sizes.push_back(nrhs);
    Tensor b = in_layout(g.values(b_sizes, dtype), any_matrix_layout(g), g);
    const std::string what = c10::str("lstsq ", driver, " A ", a.sizes(), " B ", b.sizes());
    auto run = [=](const Inputs& v) {
      return flat(at::linalg_lstsq(v[0], v[1], c10::nullopt, c10::string_view(driver)));
    };
    // With gelsd/gelss the residuals exist only for full-rank matrices: known from values only.
    const bool by_rank =
        rows > n && (std::string(driver) == "gelsd" || std::string(driver) == "gelss");
    int64_t matrices = 1;
    for (int64_t s : batch) matrices *= s;
    if (by_rank && matrices != 0) {
      EXPECT_THROW(run({to_meta(a), to_meta(b)}), DataDependentError) << what;
      continue;
    }
    expect_meta_matches_cpu(what, run, {a, b});
  }
  // The default driver is the CPU kernel's (gelsy): no residuals even for a tall matrix.
  expect_meta_matches_cpu("lstsq default driver",
                          [](const Inputs& v) { return flat(at::linalg_lstsq(v[0], v[1])); },
                          {g.make({4, 3}, kFloat), g.make({4, 2}, kFloat)});
  auto lstsq = [](const Inputs& v) { return flat(at::linalg_lstsq(v[0], v[1])); };
  expect_both_fail("lstsq of a vector", lstsq, {g.make({3}, kFloat), g.make({3}, kFloat)},
                   "input must have at least 2 dimensions.");
  expect_both_fail("lstsq rows", lstsq, {g.make({3, 2}, kFloat), g.make({4, 2}, kFloat)},
                   "input.size(-2) should match other.size(-2)");
  expect_both_fail("lstsq dtypes", lstsq, {g.make({3, 2}, kFloat), g.make({3, 2}, kDouble)},
                   "Expected input and other to have the same dtype");
  expect_both_fail("lstsq ranks", lstsq, {g.make({3, 2}, kFloat), g.make({1, 1, 3, 2}, kFloat)},
                   "input.dim() must be greater or equal to other.dim()");
  expect_both_fail(
      "lstsq driver",
      [](const Inputs& v) {
        return flat(at::linalg_lstsq(v[0], v[1], c10::nullopt, c10::string_view("svd")));
      },
      {g.make({3, 2}, kFloat), g.make({3, 2}, kFloat)},
      "parameter `driver` should be one of (gels, gelsy, gelsd, gelss)");
}

TEST(MetaLinalg, LstsqOutTensorsInEveryState) {
  Gen g(406);
  const Tensor a = g.values({4, 3}, kFloat), b = g.values({4, 2}, kFloat);
  auto empty = [](at::ScalarType t = kFloat) { return at::empty({0}, t); };
  // (solution, residuals, rank, singular_values): used in place when the solution is empty or
  // column major of the solution's shape and the outputs the driver fills are empty or right;
  // otherwise the results are copied in, each output resized (with torch's warning when it held
  // elements). Outputs the driver does not fill must have the right dtype even so.
  const std::vector<std::pair<const char*, std::vector<Tensor>>> states = {
      {"all empty", {empty(), empty(), empty(kLong), empty()}},
      {"the results' shapes, contiguous",
       {at::empty({3, 2}), at::empty({2}), at::empty({}, kLong), at::empty({3})}},
      {"the solution column major", {at::empty({2, 3}).mT(), empty(), empty(kLong), empty()}},
      {"LAPACK's buffer", {at::empty({2, 4}).mT(), empty(), empty(kLong), empty()}},
      {"other non-empty shapes",
       {at::empty({5, 5}), at::empty({1}), at::empty({7}, kLong), at::empty({1})}},
      {"double", {empty(kDouble), empty(kDouble), empty(kLong), empty(kDouble)}},
      {"int rank", {empty(), empty(), empty(kInt), empty()}},
      {"double residuals", {empty(), empty(kDouble), empty(kLong), empty()}},
      {"double singular values", {empty(), empty(), empty(kLong), empty(kDouble)}},
      {"rank of another shape", {empty(), empty(), at::empty({3}, kLong), empty()}},
      {"singular values of another shape", {empty(), empty(), empty(kLong), at::empty({5})}},
      {"residuals of another shape", {empty(), at::empty({5}), empty(kLong), empty()}},
  };
  for (const char* driver : {"gelsy", "gels", "gelsd", "gelss"}) {
    // gelsd/gelss return residuals only at full rank (values): square systems have none.
    const bool square = std::string(driver) == "gelsd" || std::string(driver) == "gelss";
    for (const auto& [what, o] : states) {
      expect_meta_agrees_with_cpu(
          c10::str("linalg_lstsq.out ", driver, " into ", what),
          [=](const Inputs& v) {
            Tensor s = v[2], r = v[3], k = v[4], sv = v[5];
            at::linalg_lstsq_outf(v[0], v[1], c10::nullopt, c10::string_view(driver), s, r, k, sv);
            return std::vector<Tensor>{s, r, k, sv};
          },
          {square ? a.narrow(0, 0, 3) : a, square ? b.narrow(0, 0, 3) : b, o[0], o[1], o[2], o[3]},
          "torch.linalg.lstsq");
    }
  }
  expect_both_fail(
      "linalg_lstsq.out int solution",
      [](const Inputs& v) {
        Tensor s = v[2], r = v[3], k = v[4], sv = v[5];
        at::linalg_lstsq_outf(v[0], v[1], c10::nullopt, c10::nullopt, s, r, k, sv);
        return std::vector<Tensor>{s};
      },
      {a, b, empty(kInt), empty(), empty(kLong), empty()},
      "Expected solution to be safely castable from Float dtype, but got solution with dtype Int");
}

}  // namespace
}  // namespace metaload::testing
