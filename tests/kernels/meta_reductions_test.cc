// Meta kernels of kernels/meta_reductions.cc against the CPU kernels: sorting reductions, scans,
// frexp/polar/rrelu, margin losses, pdist, histograms and segment_reduce on random shapes and
// layouts, their out= forms where the functional op goes through one, and the argument errors.
// to_sparse raises DataDependentError.
#include "c10_ext/mode_key.h"
#include "tests/kernels/meta_harness.h"

namespace metaload::testing {
namespace {

using at::kBool;
using at::kComplexFloat;
using at::kDouble;
using at::kFloat;
using at::kInt;
using at::kLong;

Layout any_layout(Gen& g) {
  return all_layouts()[g.uniform(0, all_layouts().size() - 1)];
}

// The states an out= tensor comes in: empty, right shape (maybe strided), wrong non-empty shape.
std::vector<Tensor> out_variants(Gen& g, at::IntArrayRef sizes, at::ScalarType dtype) {
  return {at::empty({0}, dtype), g.make(sizes, dtype), g.make(sizes, dtype, Layout::kTransposed),
          at::empty({7}, dtype)};
}

std::vector<int64_t> reduced(at::IntArrayRef sizes, int64_t dim, bool keepdim) {
  std::vector<int64_t> v(sizes.begin(), sizes.end());
  if (v.empty()) return v;
  if (dim < 0) dim += v.size();
  if (keepdim) {
    v[dim] = 1;
  } else {
    v.erase(v.begin() + dim);
  }
  return v;
}

// ---- kthvalue / median / nanmedian / mode ---------------------------------------------------

TEST(MetaSortReductions, MatchCpuOnRandomShapesAndLayouts) {
  Gen g(300);
  for (int rep = 0; rep < 24; ++rep) {
    auto sizes = g.sizes(g.uniform(0, 4), 0, 4);
    const auto dtype = rep % 3 == 0 ? kDouble : (rep % 3 == 1 ? kFloat : kLong);
    Tensor x = g.make(sizes, dtype, any_layout(g));
    const int64_t ndim = std::max<int64_t>(x.dim(), 1);
    const int64_t dim = g.uniform(-ndim, ndim - 1);
    const bool keepdim = g.uniform(0, 1);
    const int64_t slice = x.dim() == 0 ? 1 : x.size(dim);
    const std::string what = c10::str(dtype, " dim ", dim, keepdim ? " keepdim" : "");
    expect_meta_agrees_with_cpu(
        "kthvalue " + what,
        [=](const Inputs& v) {
          return flat(at::kthvalue(v[0], std::max<int64_t>(slice, 1), dim, keepdim));
        },
        {x}, "kthvalue(): Expected reduction dim");
    expect_meta_agrees_with_cpu(
        "median " + what, [=](const Inputs& v) { return flat(at::median(v[0], dim, keepdim)); },
        {x}, "median(): Expected reduction dim");
    expect_meta_agrees_with_cpu(
        "nanmedian " + what,
        [=](const Inputs& v) { return flat(at::nanmedian(v[0], dim, keepdim)); }, {x},
        "median(): Expected reduction dim");
    expect_meta_agrees_with_cpu(
        "mode " + what, [=](const Inputs& v) { return flat(at::mode(v[0], dim, keepdim)); }, {x},
        "mode(): Expected reduction dim");
    if (slice == 0) continue;
    // out= tensors in every state, including one of the reduced shape but strided: kthvalue keeps
    // its strides by unsqueezing it first.
    const auto out_sizes = reduced(x.sizes(), dim, keepdim);
    for (const Tensor& values : out_variants(g, out_sizes, dtype)) {
      const Tensor indices = values.numel() == 0
                                 ? at::empty({0}, kLong)
                                 : at::empty_strided(values.sizes(), values.strides(), kLong);
      expect_meta_matches_cpu("kthvalue.values " + what + " into " + describe(values),
                              [=](const Inputs& v) {
                                Tensor a = v[1], b = v[2];
                                auto r = at::kthvalue_out(a, b, v[0], 1, dim, keepdim);
                                EXPECT_TRUE(std::get<0>(r).is_same(v[1]));
                                return flat(std::make_tuple(a, b));
                              },
                              {x, values, indices});
      expect_meta_matches_cpu("median.dim_values " + what + " into " + describe(values),
                              [=](const Inputs& v) {
                                Tensor a = v[1], b = v[2];
                                at::median_out(a, b, v[0], dim, keepdim);
                                return flat(std::make_tuple(a, b));
                              },
                              {x, values, indices});
    }
  }
}

TEST(MetaSortReductions, RejectWhatTheCpuKernelRejects) {
  Gen g(301);
  Tensor x = g.make({3, 4}, kFloat);
  expect_both_fail(
      "kthvalue k too large", [](const Inputs& v) { return flat(at::kthvalue(v[0], 5, 1)); }, {x},
      "kthvalue(): selected number k out of range for dimension 1");
  expect_both_fail(
      "kthvalue k = 0", [](const Inputs& v) { return flat(at::kthvalue(v[0], 0, 0)); }, {x},
      "kthvalue(): selected number k out of range for dimension 0");
  expect_both_fail(
      "kthvalue bool", [](const Inputs& v) { return flat(at::kthvalue(v[0], 1, 0)); },
      {g.make({3}, kBool)}, "not implemented for 'Bool'");
  expect_both_fail(
      "kthvalue dim", [](const Inputs& v) { return flat(at::kthvalue(v[0], 1, 2)); }, {x},
      "Dimension out of range");
  expect_both_fail(
      "median complex", [](const Inputs& v) { return flat(at::median(v[0], 0)); },
      {g.make({3}, kComplexFloat)}, "not implemented for 'ComplexFloat'");
  expect_both_fail(
      "median of an empty dim", [](const Inputs& v) { return flat(at::median(v[0], 1)); },
      {g.make({3, 0}, kFloat)}, "median(): Expected reduction dim 1 to have non-zero size.");
  expect_both_fail(
      "mode of an empty dim", [](const Inputs& v) { return flat(at::mode(v[0], 0)); },
      {g.make({0, 2}, kFloat)}, "mode(): Expected reduction dim 0 to have non-zero size.");
  expect_both_fail(
      "mode complex", [](const Inputs& v) { return flat(at::mode(v[0], 0)); },
      {g.make({3}, kComplexFloat)}, "not implemented for 'ComplexFloat'");
  expect_both_fail(
      "kthvalue.values indices dtype",
      [](const Inputs& v) {
        Tensor a = v[1], b = v[2];
        return flat(at::kthvalue_out(a, b, v[0], 1, 0));
      },
      {x, at::empty({0}, kFloat), at::empty({0}, kInt)},
      "output indices must be of scalar type Long");
  expect_both_fail(
      "median.dim_values values dtype",
      [](const Inputs& v) {
        Tensor a = v[1], b = v[2];
        return flat(at::median_out(a, b, v[0], 0));
      },
      {x, at::empty({0}, kDouble), at::empty({0}, kLong)}, "median()");
}

// ---- scans ----------------------------------------------------------------------------------

TEST(MetaScans, CummaxCumminLogcumsumexpMatchCpu) {
  Gen g(302);
  for (int rep = 0; rep < 16; ++rep) {
    auto sizes = g.sizes(g.uniform(0, 4), 0, 4);
    Tensor x = g.make(sizes, rep % 2 ? kFloat : kDouble, any_layout(g));
    const int64_t ndim = std::max<int64_t>(x.dim(), 1);
    const int64_t dim = g.uniform(-ndim, ndim - 1);
    expect_meta_matches_cpu(c10::str("cummax dim ", dim),
                            [=](const Inputs& v) { return flat(at::cummax(v[0], dim)); }, {x});
    expect_meta_matches_cpu(c10::str("cummin dim ", dim),
                            [=](const Inputs& v) { return flat(at::cummin(v[0], dim)); }, {x});
    expect_meta_matches_cpu(c10::str("cummax long dim ", dim),
                            [=](const Inputs& v) { return flat(at::cummax(v[0], dim)); },
                            {g.make(sizes, kLong, any_layout(g))});
    expect_meta_matches_cpu(c10::str("logcumsumexp dim ", dim),
                            [=](const Inputs& v) { return flat(at::logcumsumexp(v[0], dim)); },
                            {x});
    for (const Tensor& out : out_variants(g, x.sizes(), x.scalar_type())) {
      expect_meta_matches_cpu(c10::str("_logcumsumexp.out dim ", dim, " into ", describe(out)),
                              [=](const Inputs& v) {
                                Tensor o = v[1];
                                return flat(at::_logcumsumexp_out(o, v[0], dim));
                              },
                              {x, out});
    }
  }
  expect_both_fail(
      "cummax complex", [](const Inputs& v) { return flat(at::cummax(v[0], 0)); },
      {g.make({3, 2}, kComplexFloat)}, "not implemented for 'ComplexFloat'");
  expect_both_fail(
      "logcumsumexp long", [](const Inputs& v) { return flat(at::_logcumsumexp(v[0], 0)); },
      {g.make({3}, kLong)}, "not implemented for 'Long'");
  expect_both_fail(
      "logcumsumexp dim", [](const Inputs& v) { return flat(at::_logcumsumexp(v[0], 2)); },
      {g.make({3, 2}, kFloat)}, "Dimension out of range");
}

// ---- frexp / polar / rrelu_with_noise ---------------------------------------------------------

TEST(MetaPointwiseMulti, FrexpPolarRreluMatchCpu) {
  Gen g(303);
  for (int rep = 0; rep < 12; ++rep) {
    auto sizes = g.sizes(g.uniform(0, 4), 0, 4);
    const auto dtype = rep % 2 ? kFloat : kDouble;
    Tensor x = g.make(sizes, dtype, any_layout(g));
    expect_meta_matches_cpu("frexp", [](const Inputs& v) { return flat(at::frexp(v[0])); }, {x});
    for (const Tensor& m : out_variants(g, sizes, dtype)) {
      const Tensor e =
          m.numel() == 0 ? at::empty({0}, kInt) : at::empty_strided(m.sizes(), m.strides(), kInt);
      expect_meta_matches_cpu("frexp.Tensor_out into " + describe(m),
                              [](const Inputs& v) {
                                Tensor a = v[1], b = v[2];
                                return flat(at::frexp_out(a, b, v[0]));
                              },
                              {x, m, e});
    }
    // Broadcasting operands in any layout.
    std::vector<int64_t> other(sizes.end() - g.uniform(0, sizes.size()), sizes.end());
    for (auto& d : other) {
      if (g.uniform(0, 2) == 0) d = 1;
    }
    Tensor y = g.make(other, dtype, any_layout(g));
    expect_meta_matches_cpu("polar", [](const Inputs& v) { return flat(at::polar(v[0], v[1])); },
                            {x, y});
    for (const Tensor& out : out_variants(g, sizes, c10::toComplexType(dtype))) {
      expect_meta_matches_cpu("polar.out into " + describe(out),
                              [](const Inputs& v) {
                                Tensor o = v[2];
                                return flat(at::polar_out(o, v[0], v[1]));
                              },
                              {x, y, out});
    }
    for (bool training : {false, true}) {
      expect_meta_matches_cpu(c10::str("rrelu_with_noise training ", training),
                              [=](const Inputs& v) {
                                Tensor noise = v[1];
                                return flat(at::rrelu_with_noise(v[0], noise, 0.1, 0.3, training));
                              },
                              {x, g.make(sizes, dtype)});
    }
  }
  expect_both_fail(
      "frexp long", [](const Inputs& v) { return flat(at::frexp(v[0])); }, {g.make({3}, kLong)},
      "torch.frexp() only supports floating-point dtypes");
  expect_both_fail(
      "frexp exponent dtype",
      [](const Inputs& v) {
        Tensor a = v[1], b = v[2];
        return flat(at::frexp_out(a, b, v[0]));
      },
      {g.make({3}, kFloat), at::empty({3}, kFloat), at::empty({3}, kLong)},
      "torch.frexp() expects exponent to have int dtype but got Long");
  expect_both_fail(
      "polar dtypes", [](const Inputs& v) { return flat(at::polar(v[0], v[1])); },
      {g.make({3}, kFloat), g.make({3}, kDouble)}, "Expected object of scalar type Float");
  expect_both_fail(
      "polar long", [](const Inputs& v) { return flat(at::polar(v[0], v[1])); },
      {g.make({3}, kLong), g.make({3}, kLong)},
      "Expected both inputs to be Half, Float or Double tensors but got Long and Long",
      "aten::polar");  // the composite polar checks before polar.out
  expect_both_fail(
      "polar shapes", [](const Inputs& v) { return flat(at::polar(v[0], v[1])); },
      {g.make({3}, kFloat), g.make({4}, kFloat)}, "must match the size of tensor");
  expect_both_fail(
      "rrelu long",
      [](const Inputs& v) {
        Tensor noise = v[1];
        return flat(at::rrelu_with_noise(v[0], noise, 0.1, 0.3, false));
      },
      {g.make({3}, kLong), g.make({3}, kFloat)}, "not implemented for 'Long'");
  // torch 2.x checks the noise's shape; 1.13 does not (the meta kernel follows each). In eval
  // mode: 1.13's training mode would write past the end of the short noise tensor.
  expect_meta_agrees_with_cpu(
      "rrelu noise shape",
      [](const Inputs& v) {
        Tensor noise = v[1];
        return flat(at::rrelu_with_noise(v[0], noise, 0.1, 0.3, false));
      },
      {g.make({3, 4}, kFloat), g.make({2}, kFloat)},
      "noise tensor shape must match self tensor shape");
}

// ---- losses -----------------------------------------------------------------------------------

TEST(MetaLosses, MarginLossesAndPdistMatchCpu) {
  Gen g(304);
  for (int rep = 0; rep < 12; ++rep) {
    const int64_t classes = g.uniform(1, 5), batch = g.uniform(0, 4);
    const int kind = rep % 3;  // a (batch, classes) matrix, a vector, a 0-dim tensor
    std::vector<int64_t> in_sizes =
        kind == 0 ? std::vector<int64_t>{batch, classes}
                  : (kind == 1 ? std::vector<int64_t>{classes} : std::vector<int64_t>{});
    std::vector<int64_t> tgt_sizes =
        kind == 0 ? std::vector<int64_t>{batch} : std::vector<int64_t>{};
    const auto dtype = rep % 2 ? kFloat : kDouble;
    Tensor x = g.make(in_sizes, dtype, any_layout(g));
    Tensor target = at::zeros(tgt_sizes, kLong);  // class 0 exists in every input
    for (int64_t reduction : {0, 1, 2}) {
      for (int p : {1, 2}) {
        expect_meta_matches_cpu(
            c10::str("multi_margin_loss p ", p, " reduction ", reduction),
            [=](const Inputs& v) {
              return flat(at::multi_margin_loss(v[0], v[1], p, 1.0, {}, reduction));
            },
            {x, target});
      }
      const int64_t width = kind == 2 ? 1 : classes;
      expect_meta_matches_cpu(
          c10::str("multi_margin_loss weighted, reduction ", reduction),
          [=](const Inputs& v) {
            return flat(at::multi_margin_loss(v[0], v[1], 1, 0.5, v[2], reduction));
          },
          {x, target, g.make({width}, dtype)});
      // multilabel targets: class indices, -1 ends the list; zeros are valid.
      Tensor labels =
          kind == 0 ? at::zeros({batch, classes}, kLong)
                    : at::zeros(kind == 1 ? std::vector<int64_t>{classes} : std::vector<int64_t>{},
                                kLong);
      expect_meta_matches_cpu(
          c10::str("multilabel_margin_loss_forward reduction ", reduction),
          [=](const Inputs& v) {
            return flat(at::multilabel_margin_loss_forward(v[0], v[1], reduction));
          },
          {x, labels});
    }
    const int64_t n = g.uniform(0, 5), m = g.uniform(0, 4);
    expect_meta_matches_cpu(c10::str("_pdist_forward ", n, "x", m),
                            [](const Inputs& v) { return flat(at::_pdist_forward(v[0], 2.0)); },
                            {g.make({n, m}, dtype)});
    expect_meta_matches_cpu(c10::str("pdist ", n, "x", m),
                            [](const Inputs& v) { return flat(at::pdist(v[0], 1.0)); },
                            {g.make({n, m}, dtype, any_layout(g))});
  }
  Tensor x = g.make({3, 4}, kFloat);
  expect_both_fail(
      "multi_margin_loss p = 3",
      [](const Inputs& v) { return flat(at::multi_margin_loss(v[0], v[1], 3, 1.0, {}, 1)); },
      {x, at::zeros({3}, kLong)}, "only p == 1 and p == 2 supported");
  expect_both_fail(
      "multi_margin_loss target size",
      [](const Inputs& v) { return flat(at::multi_margin_loss(v[0], v[1], 1, 1.0, {}, 1)); },
      {x, at::zeros({2}, kLong)}, "inconsistent target size");
  expect_both_fail(
      "multi_margin_loss 3-d input",
      [](const Inputs& v) { return flat(at::multi_margin_loss(v[0], v[1], 1, 1.0, {}, 1)); },
      {g.make({2, 3, 4}, kFloat), at::zeros({2}, kLong)},
      "Expected non-empty vector or matrix with optional 0-dim batch size");
  expect_both_fail(
      "multi_margin_loss int target",
      [](const Inputs& v) { return flat(at::multi_margin_loss(v[0], v[1], 1, 1.0, {}, 1)); },
      {x, at::zeros({3}, kInt)}, "expected scalar type Long but found Int");
  // 1.13 ignores a weight of the wrong size, 2.x rejects it.
  expect_meta_agrees_with_cpu(
      "multi_margin_loss weight size",
      [](const Inputs& v) { return flat(at::multi_margin_loss(v[0], v[1], 1, 1.0, v[2], 1)); },
      {x, at::zeros({3}, kLong), g.make({3}, kFloat)}, "inconsistent weight size, expected 4");
  expect_both_fail(
      "multilabel_margin_loss target size",
      [](const Inputs& v) { return flat(at::multilabel_margin_loss_forward(v[0], v[1], 1)); },
      {x, at::zeros({3, 3}, kLong)}, "inconsistent");
  expect_both_fail(
      "multilabel_margin_loss empty classes",
      [](const Inputs& v) { return flat(at::multilabel_margin_loss_forward(v[0], v[1], 1)); },
      {g.make({3, 0}, kFloat), at::zeros({3, 0}, kLong)},
      "Expected non-empty vector or matrix with optional 0-dim batch size");
  expect_both_fail(
      "multilabel_margin_loss int target",
      [](const Inputs& v) { return flat(at::multilabel_margin_loss_forward(v[0], v[1], 1)); },
      {x, at::zeros({3, 4}, kInt)}, "expected scalar type Long but found Int");
  expect_both_fail(
      "_pdist_forward transposed",
      [](const Inputs& v) { return flat(at::_pdist_forward(v[0], 2)); },
      {g.make({3, 4}, kFloat, Layout::kTransposed)}, "_pdist_forward requires contiguous input");
  expect_both_fail(
      "_pdist_forward long", [](const Inputs& v) { return flat(at::_pdist_forward(v[0], 2)); },
      {g.make({3, 4}, kLong)}, "not implemented for 'Long'");
}

// ---- histograms -------------------------------------------------------------------------------

TEST(MetaHistograms, MatchCpu) {
  Gen g(305);
  for (int rep = 0; rep < 12; ++rep) {
    auto sizes = g.sizes(g.uniform(0, 3), 0, 4);
    const auto dtype = rep % 2 ? kFloat : kDouble;
    Tensor x = g.make(sizes, dtype, any_layout(g));
    const int64_t bins = g.uniform(1, 6);
    expect_meta_matches_cpu(c10::str("histc ", bins),
                            [=](const Inputs& v) { return flat(at::histc(v[0], bins)); }, {x});
    expect_meta_matches_cpu(c10::str("histc range ", bins),
                            [=](const Inputs& v) { return flat(at::histc(v[0], bins, -1, 2)); },
                            {x});
    expect_meta_matches_cpu(c10::str("histogram ", bins),
                            [=](const Inputs& v) { return flat(at::histogram(v[0], bins)); }, {x});
    const std::vector<double> range = {0.25, 0.75};
    expect_meta_matches_cpu(
        c10::str("histogram weighted, range, density ", bins),
        [=](const Inputs& v) {
          return flat(at::histogram(v[0], bins, at::ArrayRef<double>(range), v[1], true));
        },
        {x, g.make(sizes, dtype, any_layout(g))});
    Tensor edges = at::linspace(0, 1, bins + 1, dtype);
    expect_meta_matches_cpu(c10::str("histogram bins tensor ", bins),
                            [](const Inputs& v) { return flat(at::histogram(v[0], v[1])); },
                            {x, edges});
    // histogramdd: points of d coordinates in the last dimension.
    const int64_t d = g.uniform(1, 3);
    std::vector<int64_t> pts = {g.uniform(0, 5), d};
    if (g.uniform(0, 1)) pts.insert(pts.begin(), 2);
    Tensor p = g.make(pts, dtype, any_layout(g));
    std::vector<int64_t> counts = g.sizes(d, 1, 4);
    expect_meta_matches_cpu("_histogramdd_bin_edges",
                            [=](const Inputs& v) {
                              auto e = at::_histogramdd_bin_edges(v[0], counts);
                              return std::vector<Tensor>(e.begin(), e.end());
                            },
                            {p});
    expect_meta_matches_cpu(
        "_histogramdd_from_bin_cts",
        [=](const Inputs& v) { return flat(at::_histogramdd_from_bin_cts(v[0], counts)); }, {p});
    std::vector<Tensor> edge_list;
    for (int64_t c : counts) edge_list.push_back(at::linspace(0, 1, c + 1, dtype));
    std::vector<int64_t> weight_sizes(pts.begin(), pts.end() - 1);
    expect_meta_matches_cpu(
        "_histogramdd_from_bin_tensors weighted",
        [=](const Inputs& v) {
          return flat(at::_histogramdd_from_bin_tensors(v[0], edge_list, v[1], true));
        },
        {p, g.make(weight_sizes, dtype)});
  }
  Tensor x = g.make({5}, kFloat);
  expect_both_fail(
      "histc no bins", [](const Inputs& v) { return flat(at::histc(v[0], 0)); }, {x},
      "bins must be > 0, but got 0");
  expect_both_fail(
      "histc min > max", [](const Inputs& v) { return flat(at::histc(v[0], 4, 2, 1)); }, {x},
      "torch.histc: max must be larger than min");
  expect_both_fail(
      "histc infinite range", [](const Inputs& v) { return flat(at::histc(v[0], 4, 0, INFINITY)); },
      {x}, "torch.histc: range of [0, inf] is not finite");
  {
    // Integers: CPU refuses them, CUDA counts them (in their dtype); the meta device is neither,
    // so its kernel counts them as torch's own meta function does (a fake cpu tensor refuses them
    // in Python, metaload.fake: test_moe_scan).
    const Tensor counts = at::histc(to_meta(g.make({3}, kLong)), 4);
    EXPECT_EQ(counts.sizes().vec(), std::vector<int64_t>{4});
    EXPECT_EQ(counts.scalar_type(), kLong);
    EXPECT_TRUE(counts.is_meta());
  }
  const std::vector<double> bad_range = {2., 1.}, long_range = {0., 1., 2.};
  expect_both_fail(
      "histogram range order",
      [&](const Inputs& v) {
        return flat(at::histogram(v[0], 3, at::ArrayRef<double>(bad_range)));
      },
      {x}, "min should not exceed max, but got min 2 max 1 for dimension 0");
  expect_both_fail(
      "histogram range length",
      [&](const Inputs& v) {
        return flat(at::histogram(v[0], 3, at::ArrayRef<double>(long_range)));
      },
      {x}, "for a 1-dimensional histogram range should have 2 elements, but got 3");
  expect_both_fail(
      "histogram weight shape",
      [](const Inputs& v) { return flat(at::histogram(v[0], 3, c10::nullopt, v[1])); },
      {x, g.make({4}, kFloat)},
      "if weight tensor is provided it should have the same shape as the input tensor");
  expect_both_fail(
      "histogram weight dtype",
      [](const Inputs& v) { return flat(at::histogram(v[0], 3, c10::nullopt, v[1])); },
      {x, g.make({5}, kDouble)}, "input tensor and weight tensor should have the same dtype");
  expect_both_fail(
      "histogram 2-d bins", [](const Inputs& v) { return flat(at::histogram(v[0], v[1])); },
      {x, g.make({2, 2}, kFloat)}, "bins tensor should have one dimension, but got 2 dimensions");
  expect_both_fail(
      "histogram one edge", [](const Inputs& v) { return flat(at::histogram(v[0], v[1])); },
      {x, g.make({1}, kFloat)}, "bins must be > 0, but got 0");
  expect_both_fail(
      "histogram bins dtype", [](const Inputs& v) { return flat(at::histogram(v[0], v[1])); },
      {x, g.make({3}, kDouble)}, "input tensor and bins tensors should have the same dtype");
  expect_both_fail(
      "histogram long", [](const Inputs& v) { return flat(at::histogram(v[0], 3)); },
      {g.make({3}, kLong)}, "not implemented for 'Long'");
  expect_both_fail(
      "histogramdd of a vector",
      [](const Inputs& v) { return flat(at::_histogramdd_from_bin_cts(v[0], {2})); }, {x},
      "input tensor should have at least 2 dimensions");
  expect_both_fail(
      "histogramdd no bins",
      [](const Inputs& v) {
        return flat(at::_histogramdd_from_bin_cts(v[0], {2, 0}));
      },
      {g.make({3, 2}, kFloat)}, "bins must be > 0, but got 0 for dimension 1");
  expect_both_fail(
      "histogramdd edges per dimension",
      [](const Inputs& v) { return flat(at::_histogramdd_from_bin_tensors(v[0], {v[1]})); },
      {g.make({3, 2}, kFloat), g.make({3}, kFloat)},
      "expected 2 sequences of bin edges for each of the 2 dimensions of the input, but got 1");
}

// ---- segment_reduce ---------------------------------------------------------------------------

TEST(MetaSegmentReduce, MatchesCpu) {
  Gen g(306);
  const char* reductions[] = {"sum", "mean", "max", "min", "prod"};
  for (int rep = 0; rep < 12; ++rep) {
    // Segments along axis 0 or 1; lengths that sum to the axis' size (the CPU kernel checks).
    const int64_t axis = rep % 2;
    const int64_t rows = g.uniform(1, 3), len = g.uniform(0, 6), cols = g.uniform(1, 3);
    std::vector<int64_t> sizes =
        axis == 0 ? std::vector<int64_t>{len, cols} : std::vector<int64_t>{rows, len, cols};
    Tensor data = g.make(sizes, rep % 3 ? kFloat : kDouble, any_layout(g));
    std::vector<int64_t> lengths;
    for (int64_t left = len; left > 0;) {
      lengths.push_back(g.uniform(1, left));
      left -= lengths.back();
    }
    if (g.uniform(0, 1)) lengths.push_back(0);  // an empty segment
    Tensor l = at::tensor(lengths, kLong);
    Tensor offsets = at::cat({at::zeros({1}, kLong), at::cumsum(l, 0)});
    if (axis == 1) {
      l = l.unsqueeze(0).expand({rows, l.size(0)}).contiguous();
      offsets = offsets.unsqueeze(0).expand({rows, offsets.size(0)}).contiguous();
    }
    const char* reduce = reductions[rep % 5];
    // 1.13 refuses data with no elements, 2.x takes it; the safe mode refuses empty lengths
    // (lengths.min()).
    const char* refusal = !compat::kSegmentReduceTakesEmptyData && data.numel() == 0
                              ? "Expected data.numel() > 0"
                              : "Expected reduction dim to be specified for input.numel() == 0";
    expect_meta_agrees_with_cpu(
        c10::str("segment_reduce lengths ", reduce, " axis ", axis),
        [=](const Inputs& v) {
          return flat(at::segment_reduce(v[0], reduce, v[1], {}, {}, axis, false, 0.0));
        },
        {data, l}, refusal);
    expect_meta_agrees_with_cpu(
        c10::str("segment_reduce offsets ", reduce, " axis ", axis),
        [=](const Inputs& v) {
          return flat(at::segment_reduce(v[0], reduce, {}, {}, v[1], axis, false, 0.0));
        },
        {data, offsets}, refusal);
  }
  Tensor data = g.make({5}, kFloat);
  Tensor l = at::tensor(std::vector<int64_t>{2, 3}, kLong);
  expect_both_fail(
      "segment_reduce indices",
      [](const Inputs& v) { return flat(at::segment_reduce(v[0], "sum", {}, v[1])); }, {data, l},
      "indices based reduction is not supported yet.");
  expect_both_fail(
      "segment_reduce nothing",
      [](const Inputs& v) { return flat(at::segment_reduce(v[0], "sum")); }, {data},
      "Either lengths or offsets must be defined.");
  expect_both_fail(
      "segment_reduce reduce",
      [](const Inputs& v) { return flat(at::segment_reduce(v[0], "foo", v[1])); }, {data, l},
      "foo");
  expect_both_fail(
      "segment_reduce axis",
      [](const Inputs& v) { return flat(at::segment_reduce(v[0], "sum", v[1], {}, {}, 1)); },
      {g.make({5, 3}, kFloat), l}, "Expected axis to be the last dimension of lengths but got 1.");
  expect_both_fail(
      "segment_reduce float lengths",
      [](const Inputs& v) { return flat(at::segment_reduce(v[0], "sum", v[1])); },
      {data, l.to(kFloat)}, "not implemented for 'Float'");
  expect_both_fail(
      "segment_reduce long data",
      [](const Inputs& v) { return flat(at::segment_reduce(v[0], "sum", v[1])); },
      {g.make({5}, kLong), l}, "not implemented for 'Long'");
}

// ---- to_sparse ------------------------------------------------------------------------------

TEST(MetaToSparse, IsDataDependent) {
  // A sparse tensor stores one entry per nonzero element: the count is a value.
  const Tensor x = at::empty({3, 4}, at::TensorOptions(kFloat).device(at::kMeta));
  for (int sparse_dim : {0, 1}) {
    try {
      (void)(sparse_dim == 0 ? x.to_sparse() : x.to_sparse(1));
      ADD_FAILURE() << "to_sparse of a meta tensor returned";
    } catch (const DataDependentError& e) {
      EXPECT_NE(std::string(e.what()).find("one entry per nonzero element"), std::string::npos)
          << e.what();
      EXPECT_NE(std::string(e.what()).find("[3, 4]"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace metaload::testing
