// Meta kernels of kernels/meta_pointwise_index.cc against the CPU kernels: random shapes with
// broadcasting, layouts (contiguous, channels-last, transposed, sliced, permuted, expanded),
// dtypes, out= tensors in every state, and the argument errors.
#include <ATen/core/grad_mode.h>

#include "c10_ext/mode_key.h"
#include "tests/kernels/meta_harness.h"

namespace metaload::testing {
namespace {

using at::kBFloat16;
using at::kBool;
using at::kByte;
using at::kComplexFloat;
using at::kDouble;
using at::kFloat;
using at::kHalf;
using at::kInt;
using at::kLong;

// A random shape and another that broadcasts with it (some dims 1, maybe fewer dims).
std::pair<std::vector<int64_t>, std::vector<int64_t>> broadcast_pair(Gen& g) {
  auto a = g.sizes(g.uniform(0, 4), 1, 4);
  std::vector<int64_t> b(a.end() - g.uniform(0, a.size()), a.end());
  for (auto& d : b) {
    if (g.uniform(0, 2) == 0) d = 1;
  }
  if (g.uniform(0, 1)) std::swap(a, b);
  return {a, b};
}

Layout any_layout(Gen& g) {
  return all_layouts()[g.uniform(0, all_layouts().size() - 1)];
}

// The floating dtypes models hold weights and activations in; kernels tested in one dtype cycle
// through them (one per random case, so the run time stays that of a single dtype).
constexpr at::ScalarType kModelDtypes[] = {kFloat, kDouble, kBFloat16, kHalf};
at::ScalarType model_dtype(int rep) {
  return kModelDtypes[rep % 4];
}

// ---- activations ----------------------------------------------------------------------------

TEST(MetaPointwise, ActivationsMatchCpu) {
  Gen g(100);
  for (int rep = 0; rep < 6; ++rep) {
    auto sizes = g.sizes(g.uniform(0, 5), 1, 4);
    for (Layout l : all_layouts()) {
      for (auto dtype : {kFloat, kDouble, kBFloat16, kLong}) {
        Inputs in{g.make(sizes, dtype, l)};
        expect_meta_matches_cpu(
            c10::str("relu ", name(l), " ", dtype),
            [](const Inputs& x) { return flat(at::relu(x[0])); }, in);
        expect_meta_matches_cpu(
            c10::str("hardtanh ", name(l), " ", dtype),
            [](const Inputs& x) { return flat(at::hardtanh(x[0], -0.5, 2)); }, in);
        if (dtype != kLong) {
          expect_meta_matches_cpu(
              c10::str("hardswish ", name(l), " ", dtype),
              [](const Inputs& x) { return flat(at::hardswish(x[0])); }, in);
        }
      }
    }
  }
  expect_both_fail(
      "relu bool", [](const Inputs& x) { return flat(at::relu(x[0])); }, {g.make({3}, kBool)},
      "relu: Boolean inputs not supported for relu");
  expect_both_fail(
      "hardtanh bool", [](const Inputs& x) { return flat(at::hardtanh(x[0], -1, 1)); },
      {g.make({3}, kBool)}, "hardtanh: Boolean inputs not supported");
}

// ---- where / logical ------------------------------------------------------------------------

TEST(MetaPointwise, WhereMatchesCpu) {
  Gen g(101);
  const at::ScalarType types[] = {kFloat, kDouble, kLong, kBool, kBFloat16};
  for (int rep = 0; rep < 60; ++rep) {
    auto [a, b] = broadcast_pair(g);
    auto [c, d] = broadcast_pair(g);
    std::vector<int64_t> cond_sizes = g.uniform(0, 1) ? a : b;
    (void)c;
    (void)d;
    auto t1 = types[g.uniform(0, 4)], t2 = types[g.uniform(0, 4)];
    Inputs in{g.make(cond_sizes, g.uniform(0, 5) ? kBool : kByte, any_layout(g)),
              g.make(a, t1, any_layout(g)), g.make(b, t2, any_layout(g))};
    expect_meta_matches_cpu(
        c10::str("where ", t1, "/", t2),
        [](const Inputs& x) { return flat(at::where(x[0], x[1], x[2])); }, in);
  }
  // A CPU 0-dim tensor next to device tensors (torch.where(cond, x, 0.) wraps the scalar).
  expect_meta_matches_cpu(
      "where with a CPU scalar", [](const Inputs& x) { return flat(at::where(x[0], x[1], x[2])); },
      {g.make({2, 3}, kBool), g.make({2, 3}, kFloat), at::scalar_tensor(0.5, kDouble)},
      /*keep_cpu_scalars=*/true);
  expect_both_fail(
      "where condition dtype", [](const Inputs& x) { return flat(at::where(x[0], x[1], x[2])); },
      {g.make({3}, kFloat), g.make({3}, kFloat), g.make({3}, kFloat)},
      "where expected condition to be a boolean tensor");
  expect_both_fail(
      "where shapes", [](const Inputs& x) { return flat(at::where(x[0], x[1], x[2])); },
      {g.make({3}, kBool), g.make({4}, kFloat), g.make({3}, kFloat)},
      "where: The size of tensor a (3) must match the size of tensor b (4)");
}

// The states an out= tensor comes in: empty, right shape (maybe strided), wrong non-empty shape.
std::vector<Tensor> out_variants(Gen& g, at::IntArrayRef sizes, at::ScalarType dtype) {
  std::vector<Tensor> v{at::empty({0}, dtype), g.make(sizes, dtype),
                        g.make(sizes, dtype, Layout::kTransposed)};
  v.push_back(at::empty({7}, dtype));
  return v;
}

TEST(MetaPointwise, LogicalOpsMatchCpu) {
  Gen g(102);
  const at::ScalarType types[] = {kFloat, kLong, kBool, kDouble};
  for (int rep = 0; rep < 20; ++rep) {
    auto [a, b] = broadcast_pair(g);
    auto t1 = types[g.uniform(0, 3)], t2 = types[g.uniform(0, 3)];
    Tensor x = g.make(a, t1, any_layout(g)), y = g.make(b, t2, any_layout(g));
    expect_meta_matches_cpu("logical_not",
                            [](const Inputs& v) { return flat(at::logical_not(v[0])); }, {x});
    std::vector<int64_t> shape = at::infer_size(a, b);
    for (auto out_type : {kBool, kFloat}) {
      for (const Tensor& out : out_variants(g, shape, out_type)) {
        Inputs in{x, y, out};
        expect_meta_matches_cpu(
            c10::str("logical_and.out into ", describe(out)),
            [](const Inputs& v) {
              Tensor o = v[2];
              Tensor& r = at::logical_and_out(o, v[0], v[1]);
              EXPECT_TRUE(r.is_same(v[2]));
              return flat(r);
            },
            in);
        expect_meta_matches_cpu(
            "logical_or.out",
            [](const Inputs& v) {
              Tensor o = v[2];
              return flat(at::logical_or_out(o, v[0], v[1]));
            },
            in);
        expect_meta_matches_cpu(
            "logical_xor.out",
            [](const Inputs& v) {
              Tensor o = v[2];
              return flat(at::logical_xor_out(o, v[0], v[1]));
            },
            in);
      }
      for (const Tensor& out : out_variants(g, a, out_type)) {
        expect_meta_matches_cpu(c10::str("logical_not.out into ", describe(out)),
                                [](const Inputs& v) {
                                  Tensor o = v[1];
                                  return flat(at::logical_not_out(o, v[0]));
                                },
                                {x, out});
      }
    }
    expect_meta_matches_cpu("logical_not_",
                            [](const Inputs& v) {
                              Tensor t = v[0].clone(at::MemoryFormat::Preserve);
                              Tensor& r = t.logical_not_();
                              EXPECT_TRUE(r.is_same(t));
                              return flat(r);
                            },
                            {g.make(a, t1, Layout::kTransposed)});
    expect_meta_matches_cpu("isnan", [](const Inputs& v) { return flat(at::isnan(v[0])); }, {x});
  }
}

TEST(MetaPointwise, AbsAndNanToNumOutMatchCpu) {
  Gen g(103);
  for (int rep = 0; rep < 8; ++rep) {
    auto sizes = g.sizes(g.uniform(0, 4), 1, 4);
    for (auto dtype : {kFloat, kLong, kComplexFloat}) {
      Tensor x = g.make(sizes, dtype, any_layout(g));
      auto out_type = dtype == kComplexFloat ? kFloat : dtype;
      for (const Tensor& out : out_variants(g, sizes, out_type)) {
        expect_meta_matches_cpu(c10::str("abs.out ", dtype, " into ", describe(out)),
                                [](const Inputs& v) {
                                  Tensor o = v[1];
                                  return flat(at::abs_out(o, v[0]));
                                },
                                {x, out});
        if (dtype != kComplexFloat) {
          expect_meta_matches_cpu(c10::str("nan_to_num.out ", dtype, " into ", describe(out)),
                                  [](const Inputs& v) {
                                    Tensor o = v[1];
                                    return flat(at::nan_to_num_out(o, v[0], 0.0, 1.0, -1.0));
                                  },
                                  {x, out});
        }
      }
    }
    expect_meta_matches_cpu("abs", [](const Inputs& v) { return flat(at::abs(v[0])); },
                            {g.make(sizes, kComplexFloat, any_layout(g))});
    expect_meta_matches_cpu("nan_to_num",
                            [](const Inputs& v) { return flat(at::nan_to_num(v[0])); },
                            {g.make(sizes, kFloat, any_layout(g))});
  }
  expect_both_fail(
      "abs.out dtype",
      [](const Inputs& v) {
        Tensor o = v[1];
        return flat(at::abs_out(o, v[0]));
      },
      {g.make({3}, kFloat), at::empty({0}, kLong)}, "Found dtype Long but expected Float");
  expect_both_fail(
      "nan_to_num.out dtype",
      [](const Inputs& v) {
        Tensor o = v[1];
        return flat(at::nan_to_num_out(o, v[0], 0.0, 1.0, -1.0));
      },
      {g.make({3}, kFloat), at::empty({0}, kDouble)}, "should be same as input");
}

TEST(MetaPointwise, BinaryOpsMatchCpu) {
  Gen g(104);
  const at::ScalarType types[] = {kFloat, kDouble, kLong, kInt, kBFloat16};
  for (int rep = 0; rep < 60; ++rep) {
    auto [a, b] = broadcast_pair(g);
    auto t1 = types[g.uniform(0, 4)], t2 = types[g.uniform(0, 4)];
    Inputs in{g.make(a, t1, any_layout(g)), g.make(b, t2, any_layout(g))};
    expect_meta_matches_cpu(
        c10::str("rsub ", t1, "/", t2),
        [](const Inputs& x) { return flat(at::rsub(x[0], x[1], 2)); }, in);
    // floor_divide by zero-valued integers is fine: only shapes are compared.
    Inputs nonzero{in[0], in[1] + 1};
    expect_meta_matches_cpu(
        c10::str("floor_divide ", t1, "/", t2),
        [](const Inputs& x) { return flat(at::floor_divide(x[0], x[1])); }, nonzero);
    expect_meta_matches_cpu(
        c10::str("remainder(Scalar, Tensor) ", t2),
        [](const Inputs& x) { return flat(at::remainder(2.5, x[1])); }, nonzero);
    expect_meta_matches_cpu(
        c10::str("remainder(int Scalar, Tensor) ", t2),
        [](const Inputs& x) { return flat(at::remainder(3, x[1])); }, nonzero);
  }
  expect_both_fail(
      "rsub bool", [](const Inputs& x) { return flat(at::rsub(x[0], x[1], 1)); },
      {g.make({3}, kBool), g.make({3}, kBool)}, "with two bool tensors is not supported");
  expect_both_fail(
      "rsub float alpha for ints", [](const Inputs& x) { return flat(at::rsub(x[0], x[1], 1.5)); },
      {g.make({3}, kLong), g.make({3}, kLong)}, "argument alpha must not be a floating point");
}

// ---- indexing -------------------------------------------------------------------------------

TEST(MetaIndex, IndexSelectMatchesCpu) {
  Gen g(110);
  for (int rep = 0; rep < 20; ++rep) {
    const auto dtype = model_dtype(rep);  // embeddings are looked up in half / bfloat16 too
    auto sizes = g.sizes(g.uniform(0, 4), 1, 5);
    const int64_t ndim = sizes.size();
    const int64_t dim = ndim == 0 ? 0 : g.uniform(-ndim, ndim - 1);
    const int64_t bound = ndim == 0 ? 1 : sizes[dim < 0 ? dim + ndim : dim];
    for (auto itype : {kLong, kInt}) {
      Tensor index = ndim == 0 || g.uniform(0, 3) == 0
                         ? at::randint(0, bound, {}, itype)
                         : at::randint(0, bound, {g.uniform(0, 6)}, itype);
      Tensor self = g.make(sizes, dtype, any_layout(g));
      expect_meta_matches_cpu(
          c10::str("index_select ", dtype, " dim ", dim),
          [dim](const Inputs& x) { return flat(at::index_select(x[0], dim, x[1])); },
          {self, index});
      for (const Tensor& out : {at::empty({0}, dtype), at::empty({5, 5}, dtype)}) {
        expect_meta_matches_cpu(c10::str("index_select.out dim ", dim, " into ", describe(out)),
                                [dim](const Inputs& x) {
                                  Tensor o = x[2];
                                  return flat(at::index_select_out(o, x[0], dim, x[1]));
                                },
                                {self, index, out});
      }
      expect_meta_matches_cpu(
          c10::str("embedding ", dtype),
          [](const Inputs& x) { return flat(at::embedding(x[0], x[1])); },
          {g.make({7, 3}, dtype), at::randint(0, 7, g.sizes(g.uniform(0, 3), 1, 4), itype)});
    }
  }
  expect_both_fail(
      "index dtype", [](const Inputs& x) { return flat(at::index_select(x[0], 0, x[1])); },
      {g.make({4}, kFloat), at::zeros({2}, kFloat)}, "Expected dtype int32 or int64 for index");
  expect_both_fail(
      "index rank", [](const Inputs& x) { return flat(at::index_select(x[0], 0, x[1])); },
      {g.make({4}, kFloat), at::zeros({2, 2}, kLong)}, "Index is supposed to be a vector");
  expect_both_fail(
      "dim", [](const Inputs& x) { return flat(at::index_select(x[0], 2, x[1])); },
      {g.make({4, 4}, kFloat), at::zeros({2}, kLong)}, "Dimension out of range");
}

// diag.out's message for a 3-d input: torch's composite diag.out or metaload's kernel.
constexpr const char* kDiagRankError = compat::kAtenDiagOutIsComposite
                                           ? "Supports 1D or 2D tensors. Got 3D"
                                           : "matrix or a vector expected";

TEST(MetaIndex, TakeRollFlipDiagMatchCpu) {
  Gen g(111);
  for (int rep = 0; rep < 12; ++rep) {
    const auto dtype = model_dtype(rep);
    auto sizes = g.sizes(g.uniform(1, 4), 0, 4);
    const int64_t ndim = sizes.size();
    for (Layout l : all_layouts()) {
      Tensor x = g.make(sizes, dtype, l);
      std::vector<int64_t> dims, shifts;
      for (int64_t d = 0; d < ndim; ++d) {
        if (g.uniform(0, 1)) {
          dims.push_back(d - (g.uniform(0, 1) ? ndim : 0));
          shifts.push_back(g.uniform(-5, 5));
        }
      }
      expect_meta_matches_cpu(c10::str("flip ", name(l), " dims ", dims),
                              [&](const Inputs& v) { return flat(at::flip(v[0], dims)); }, {x});
      if (!dims.empty()) {
        expect_meta_matches_cpu(c10::str("roll ", name(l), " dims ", dims),
                                [&](const Inputs& v) { return flat(at::roll(v[0], shifts, dims)); },
                                {x});
      }
      expect_meta_matches_cpu(c10::str("roll flat ", name(l)),
                              [&](const Inputs& v) { return flat(at::roll(v[0], {3}, {})); }, {x});
      if (x.numel() > 0) {
        expect_meta_matches_cpu(
            c10::str("take ", name(l)), [](const Inputs& v) { return flat(at::take(v[0], v[1])); },
            {x, at::randint(0, x.numel(), g.sizes(g.uniform(0, 3), 1, 3), kLong)});
      }
    }
    // diag's CPU kernel has no Half in 1.13: bfloat16 stands for the 16-bit case.
    const auto diag_dtype = dtype == kHalf ? kBFloat16 : dtype;
    for (int64_t n : {1, 2}) {
      auto s = g.sizes(n, 1, 5);
      const int64_t diagonal = g.uniform(-6, 6);
      if (n == 2 && (diagonal > s[1] || -diagonal > s[0])) {
        // 1.13's CPU kernel rejects a diagonal past the corner; 2.x's returns it empty.
        expect_both_fail(
            c10::str("diag of ", s, " diagonal ", diagonal),
            [&](const Inputs& v) { return flat(at::diag(v[0], diagonal)); },
            {g.make(s, diag_dtype)}, "is out of range for a matrix");
        continue;
      }
      for (const Tensor& out : {at::empty({0}, diag_dtype), at::empty({3, 3}, diag_dtype)}) {
        expect_meta_matches_cpu(
            c10::str("diag.out ", n, "D diagonal ", diagonal, " into ", describe(out)),
            [&](const Inputs& v) {
              Tensor o = v[1];
              return flat(at::diag_out(o, v[0], diagonal));
            },
            {g.make(s, diag_dtype, any_layout(g)), out});
      }
      expect_meta_matches_cpu(c10::str("diag ", diag_dtype, " ", n, "D diagonal ", diagonal),
                              [&](const Inputs& v) { return flat(at::diag(v[0], diagonal)); },
                              {g.make(s, diag_dtype, any_layout(g))});
    }
  }
  expect_both_fail(
      "roll alignment",
      [](const Inputs& v) {
        return flat(at::roll(v[0], {1, 2}, {0}));
      },
      {g.make({3, 3}, kFloat)}, "shifts and dimensions must align");
  expect_both_fail(
      "flip duplicates",
      [](const Inputs& v) {
        return flat(at::flip(v[0], {0, -2}));
      },
      {g.make({3, 3}, kFloat)}, "appears multiple times");
  // 2.x's diag.out is a composite op: torch's own check rejects it, in torch's words.
  expect_both_fail(
      "diag rank",
      [](const Inputs& v) {
        Tensor o = v[1];
        return flat(at::diag_out(o, v[0], 0));
      },
      {g.make({2, 2, 2}, kFloat), at::empty({0}, kFloat)}, kDiagRankError, "diag.out");
  expect_both_fail(
      "take index dtype", [](const Inputs& v) { return flat(at::take(v[0], v[1])); },
      {g.make({3}, kFloat), at::zeros({2}, kInt)}, "Expected a long tensor for index");
}

TEST(MetaIndex, RepeatInterleaveTensorMatchesCpuGivenOutputSize) {
  Gen g(114);
  for (int rep = 0; rep < 6; ++rep) {
    for (auto itype : {kLong, kInt}) {
      Tensor repeats = at::randint(0, 4, {g.uniform(0, 5)}, itype);
      const int64_t total = repeats.sum().item<int64_t>();
      expect_meta_matches_cpu(
          c10::str("repeat_interleave ", itype, " output_size ", total),
          [&](const Inputs& x) {
            return flat(at::repeat_interleave(x[0], c10::optional<int64_t>(total)));
          },
          {repeats});
    }
  }
  // Without output_size the size is sum(repeats): a value, which meta tensors lack.
  EXPECT_THROW(at::repeat_interleave(at::empty({3}, at::TensorOptions(kLong).device(at::kMeta))),
               DataDependentError);
  expect_meta_matches_cpu("repeat_interleave of no repeats",
                          [](const Inputs& x) { return flat(at::repeat_interleave(x[0])); },
                          {at::empty({0}, kLong)});
  expect_both_fail(
      "repeat_interleave rank",
      [](const Inputs& x) { return flat(at::repeat_interleave(x[0], c10::optional<int64_t>(4))); },
      {at::ones({2, 2}, kLong)}, "only accept 1D vector");
  expect_both_fail(
      "repeat_interleave dtype",
      [](const Inputs& x) { return flat(at::repeat_interleave(x[0], c10::optional<int64_t>(2))); },
      {at::ones({2}, kFloat)}, "has to be Long or Int");
}

TEST(MetaIndex, EmbeddingBagMatchesCpu) {
  Gen g(112);
  at::NoGradGuard no_grad;
  for (int rep = 0; rep < 6; ++rep) {
    const int64_t rows = g.uniform(1, 8), dim = g.uniform(1, 5), n = g.uniform(0, 8);
    for (auto itype : {kLong, kInt}) {
      for (auto wtype : {kFloat, kDouble}) {
        for (Layout wl : {Layout::kContiguous, Layout::kTransposed}) {
          for (int64_t mode : {0, 1, 2}) {
            for (bool last : {false, true}) {
              // Valid offsets: start at 0, non-decreasing, within the indices.
              std::vector<int64_t> offs{0};
              for (int64_t b = 1, k = g.uniform(0, 3); b <= k; ++b) {
                offs.push_back(std::min<int64_t>(n, offs.back() + g.uniform(0, 3)));
              }
              if (last) offs.push_back(n);
              Inputs in{g.make({rows, dim}, wtype, wl), at::randint(0, rows, {n}, itype),
                        at::tensor(offs, at::TensorOptions().dtype(itype))};
              const bool weighted = mode == 0 && g.uniform(0, 1);
              if (weighted) in.push_back(g.make({n}, wtype));
              auto psw = [](const Inputs& x) {
                return x.size() > 3 ? c10::optional<Tensor>(x[3]) : c10::nullopt;
              };
              std::string what = c10::str("mode ", mode, " last ", last, " ", wtype, " ", name(wl),
                                          " ", itype, " weighted ", weighted);
              expect_meta_matches_cpu(
                  "_embedding_bag " + what,
                  [&](const Inputs& x) {
                    return flat(
                        at::_embedding_bag(x[0], x[1], x[2], false, mode, false, psw(x), last, -1));
                  },
                  in);
              expect_meta_matches_cpu(
                  "_embedding_bag_forward_only " + what,
                  [&](const Inputs& x) {
                    return flat(at::_embedding_bag_forward_only(x[0], x[1], x[2], false, mode,
                                                                false, psw(x), last, -1));
                  },
                  in);
            }
          }
        }
      }
    }
  }
  expect_both_fail(
      "per_sample_weights with max",
      [](const Inputs& x) {
        return flat(at::_embedding_bag(x[0], x[1], x[2], false, 2, false, x[3], false, -1));
      },
      {g.make({5, 3}, kFloat), at::zeros({4}, kLong), at::zeros({2}, kLong), g.make({4}, kFloat)},
      "per_sample_weights only supported with mode='sum'");
  expect_both_fail(
      "float indices",
      [](const Inputs& x) {
        return flat(at::_embedding_bag(x[0], x[1], x[2], false, 0, false, {}, false, -1));
      },
      {g.make({5, 3}, kFloat), at::zeros({4}, kFloat), at::zeros({2}, kLong)},
      "to have one of the following scalar types: Long, Int");
}

TEST(MetaPointwise, RandpermLossesPreluLogSigmoidMatchCpu) {
  Gen g(113);
  for (int rep = 0; rep < 6; ++rep) {
    const int64_t n = g.uniform(0, 20);
    for (auto dtype : {kLong, kInt, kFloat, kDouble}) {
      for (const Tensor& out : {at::empty({0}, dtype), at::empty({3, 3}, dtype)}) {
        expect_meta_matches_cpu(c10::str("randperm ", n, " into ", describe(out)),
                                [&](const Inputs& x) {
                                  Tensor o = x[0];
                                  return flat(at::randperm_out(o, n));
                                },
                                {out});
      }
    }
    auto sizes = g.sizes(g.uniform(1, 4), 1, 4);
    const auto dtype = rep % 2 ? kDouble : kFloat;  // binary_cross_entropy's CPU kernel: no 16-bit
    for (Layout l : all_layouts()) {
      Tensor x = g.make(sizes, dtype, l);
      for (int64_t reduction : {0, 1, 2}) {
        expect_meta_matches_cpu(
            c10::str("binary_cross_entropy ", dtype, " ", name(l), " reduction ", reduction),
            [&](const Inputs& v) {
              return flat(at::binary_cross_entropy(v[0], v[1], v[2], reduction));
            },
            {x, g.make(sizes, dtype, any_layout(g)),
             g.uniform(0, 1) ? g.make({sizes.back()}, dtype) : Tensor()});
      }
      expect_meta_matches_cpu(c10::str("log_sigmoid_forward ", name(l)),
                              [](const Inputs& v) { return flat(at::log_sigmoid_forward(v[0])); },
                              {x});
      expect_meta_matches_cpu(c10::str("prelu shared ", name(l)),
                              [](const Inputs& v) { return flat(at::prelu(v[0], v[1])); },
                              {x, g.make({1}, dtype)});
      expect_meta_matches_cpu(c10::str("prelu per channel ", name(l)),
                              [](const Inputs& v) { return flat(at::prelu(v[0], v[1])); },
                              {x, g.make({sizes.size() > 1 ? sizes[1] : 1}, dtype)});
    }
    const int64_t b = g.uniform(1, 3), c = g.uniform(1, 4), h = g.uniform(1, 4),
                  w = g.uniform(1, 4);
    for (int64_t reduction : {0, 1, 2}) {
      expect_meta_matches_cpu(
          c10::str("nll_loss2d_forward reduction ", reduction),
          [&](const Inputs& v) {
            return flat(at::nll_loss2d_forward(v[0], v[1], v[2], reduction, -100));
          },
          {g.make({b, c, h, w}, dtype, any_layout(g)), at::randint(0, c, {b, h, w}, kLong),
           g.uniform(0, 1) ? g.make({c}, dtype) : Tensor()});
    }
  }
  // (2.x's prelu is a composite op that checks this itself before it calls _prelu_kernel.)
  expect_both_fail(
      "prelu channels", [](const Inputs& v) { return flat(at::prelu(v[0], v[1])); },
      {g.make({2, 3, 4}, kFloat), g.make({4}, kFloat)},
      "Mismatch of parameter numbers and input channel size", "prelu");
  expect_both_fail(
      "nll_loss2d sizes",
      [](const Inputs& v) { return flat(at::nll_loss2d_forward(v[0], v[1], {}, 1, -100)); },
      {g.make({2, 3, 4, 4}, kFloat), at::zeros({2, 4, 5}, kLong)}, "size mismatch");
  expect_both_fail(
      "randperm negative",
      [](const Inputs& x) {
        Tensor o = x[0];
        return flat(at::randperm_out(o, -1));
      },
      {at::empty({0}, kLong)}, "n must be non-negative");
}

// ---- products -------------------------------------------------------------------------------

TEST(MetaProducts, DotTraceAddbmmCdistMatchCpu) {
  Gen g(120);
  for (int rep = 0; rep < 8; ++rep) {
    const int64_t n = g.uniform(0, 6);
    for (auto dtype : {kFloat, kDouble, kLong}) {
      Inputs v{g.make({n}, dtype, any_layout(g)), g.make({n}, dtype, any_layout(g))};
      expect_meta_matches_cpu(
          "dot", [](const Inputs& x) { return flat(at::dot(x[0], x[1])); }, v);
      expect_meta_matches_cpu(
          "vdot", [](const Inputs& x) { return flat(at::vdot(x[0], x[1])); }, v);
      expect_meta_matches_cpu("trace", [](const Inputs& x) { return flat(at::trace(x[0])); },
                              {g.make(g.sizes(2, 1, 5), dtype, any_layout(g))});
    }
    expect_both_fail(
        "trace bool", [](const Inputs& x) { return flat(at::trace(x[0])); },
        {g.make(g.sizes(2, 1, 5), kBool)}, "not implemented for 'Bool'");
    const int64_t b = g.uniform(1, 3), i = g.uniform(1, 4), k = g.uniform(1, 4),
                  j = g.uniform(1, 4);
    std::vector<int64_t> self_sizes =
        g.uniform(0, 1) ? std::vector<int64_t>{i, j} : std::vector<int64_t>{j};
    if (g.uniform(0, 2) == 0) self_sizes = {1, 1};
    const auto mm_dtype = model_dtype(rep) == kHalf ? kFloat : model_dtype(rep);  // CPU: no half mm
    expect_meta_matches_cpu(
        c10::str("addbmm ", mm_dtype),
        [](const Inputs& x) { return flat(at::addbmm(x[0], x[1], x[2], 0.5, 2)); },
        {g.make(self_sizes, mm_dtype, any_layout(g)), g.make({b, i, k}, mm_dtype, any_layout(g)),
         g.make({b, k, j}, mm_dtype, any_layout(g))});
    const auto dist_dtype = rep % 2 ? kDouble : kFloat;
    auto batch = g.sizes(g.uniform(0, 2), 1, 3);
    std::vector<int64_t> s1 = batch, s2(batch.begin() + g.uniform(0, batch.size()), batch.end());
    s1.insert(s1.end(), {g.uniform(1, 30), 3});
    s2.insert(s2.end(), {g.uniform(1, 30), 3});
    for (int64_t mode : {0, 1, 2}) {
      for (double p : {1.0, 2.0}) {
        expect_meta_matches_cpu(
            c10::str("_cdist_forward ", dist_dtype, " mode ", mode, " p ", p),
            [&](const Inputs& x) { return flat(at::_cdist_forward(x[0], x[1], p, mode)); },
            {g.make(s1, dist_dtype, any_layout(g)), g.make(s2, dist_dtype, any_layout(g))});
      }
    }
  }
  expect_both_fail(
      "dot sizes", [](const Inputs& x) { return flat(at::dot(x[0], x[1])); },
      {g.make({3}, kFloat), g.make({4}, kFloat)}, "inconsistent tensor size");
  expect_both_fail(
      "dot dtypes", [](const Inputs& x) { return flat(at::dot(x[0], x[1])); },
      {g.make({3}, kFloat), g.make({3}, kDouble)}, "expected both vectors to have same dtype");
  expect_both_fail(
      "trace rank", [](const Inputs& x) { return flat(at::trace(x[0])); }, {g.make({3}, kFloat)},
      "trace: expected a matrix");
  expect_both_fail(
      "addbmm batches", [](const Inputs& x) { return flat(at::addbmm(x[0], x[1], x[2])); },
      {g.make({2, 2}, kFloat), g.make({2, 2, 3}, kFloat), g.make({3, 3, 2}, kFloat)},
      "batch1 and batch2 must have same number of batches");
  expect_both_fail(
      "cdist columns", [](const Inputs& x) { return flat(at::_cdist_forward(x[0], x[1], 2, 0)); },
      {g.make({2, 3}, kFloat), g.make({2, 4}, kFloat)}, "must have the same number of columns");
}

// ---- random / search ------------------------------------------------------------------------

TEST(MetaRandomSearch, DropoutMultinomialSearchsortedMatchCpu) {
  Gen g(130);
  for (int rep = 0; rep < 8; ++rep) {
    const auto dtype = model_dtype(rep);
    const auto float_dtype = rep % 2 ? kDouble : kFloat;  // multinomial, searchsorted
    auto sizes = g.sizes(g.uniform(0, 4), 0, 4);
    for (Layout l : all_layouts()) {
      for (c10::optional<bool> train :
           {c10::optional<bool>(true), c10::optional<bool>(false), c10::optional<bool>()}) {
        expect_meta_matches_cpu(
            c10::str("native_dropout ", dtype, " ", name(l), " train ",
                     train.has_value() ? *train : -1),
            [&](const Inputs& x) { return flat(at::native_dropout(x[0], 0.3, train)); },
            {g.make(sizes, dtype, l)});
      }
    }
    const int64_t cats = g.uniform(1, 6);
    for (bool two_d : {false, true}) {
      std::vector<int64_t> s =
          two_d ? std::vector<int64_t>{g.uniform(1, 3), cats} : std::vector<int64_t>{cats};
      Tensor probs = g.make(s, float_dtype) + 0.1;
      for (bool replacement : {false, true}) {
        const int64_t n = replacement ? g.uniform(1, 8) : g.uniform(1, cats);
        expect_meta_matches_cpu(
            c10::str("multinomial n ", n, " replacement ", replacement),
            [&](const Inputs& x) { return flat(at::multinomial(x[0], n, replacement)); }, {probs});
      }
    }
    auto vs = g.sizes(g.uniform(0, 3), 1, 4);
    Tensor boundaries = at::arange(0, 10, 2, float_dtype);
    for (bool out_int32 : {false, true}) {
      for (bool right : {false, true}) {
        Tensor values = g.make(vs, float_dtype, any_layout(g));
        expect_meta_matches_cpu(
            "searchsorted 1-D boundaries",
            [&](const Inputs& x) { return flat(at::searchsorted(x[0], x[1], out_int32, right)); },
            {boundaries, values});
        expect_meta_matches_cpu(
            "bucketize",
            [&](const Inputs& x) { return flat(at::bucketize(x[1], x[0], out_int32, right)); },
            {boundaries, values});
      }
    }
    if (!vs.empty()) {
      std::vector<int64_t> bs(vs.begin(), vs.end() - 1);
      bs.push_back(5);
      Tensor sorted = std::get<0>(at::sort(g.make(bs, float_dtype), -1));
      expect_meta_matches_cpu(
          "searchsorted N-D boundaries with sorter and side",
          [&](const Inputs& x) {
            return flat(at::searchsorted(x[0], x[1], false, false, "right", x[2]));
          },
          {sorted, g.make(vs, float_dtype), at::argsort(sorted, int64_t{-1}, false)});
    }
  }
  expect_both_fail(
      "multinomial without replacement",
      [](const Inputs& x) { return flat(at::multinomial(x[0], 5, false)); },
      {g.make({3}, kFloat) + 0.1}, "cannot sample n_sample > prob_dist.size(-1)");
  expect_both_fail(
      "searchsorted leading dims",
      [](const Inputs& x) { return flat(at::searchsorted(x[0], x[1])); },
      {g.make({2, 5}, kFloat), g.make({3, 4}, kFloat)},
      "boundaries tensor should be 1 dimension or the first N-1 dimensions");
  expect_both_fail(
      "searchsorted side",
      [](const Inputs& x) { return flat(at::searchsorted(x[0], x[1], false, false, "middle")); },
      {g.make({5}, kFloat), g.make({3}, kFloat)}, "side can only be 'left' or 'right'");
}

// ---- reductions -----------------------------------------------------------------------------

TEST(MetaReduce, FullAndDimReductionsMatchCpu) {
  Gen g(140);
  for (int rep = 0; rep < 10; ++rep) {
    auto sizes = g.sizes(g.uniform(0, 4), 1, 4);
    const int64_t ndim = sizes.size();
    std::vector<int64_t> dims;
    for (int64_t d = 0; d < ndim; ++d) {
      if (g.uniform(0, 1)) dims.push_back(g.uniform(0, 1) ? d : d - ndim);
    }
    const bool keepdim = g.uniform(0, 1);
    for (Layout l : all_layouts()) {
      for (auto dtype : {kFloat, kDouble, kLong, kBool}) {
        Inputs x{g.make(sizes, dtype, l)};
        auto what = [&](const char* op) {
          return c10::str(op, " ", name(l), " ", dtype, " dims ", dims, " keepdim ", keepdim);
        };
        if (dtype != kBool) {
          expect_meta_matches_cpu(
              what("max"), [](const Inputs& v) { return flat(at::max(v[0])); }, x);
          expect_meta_matches_cpu(
              what("min"), [](const Inputs& v) { return flat(at::min(v[0])); }, x);
          expect_meta_matches_cpu(
              what("median"), [](const Inputs& v) { return flat(at::median(v[0])); }, x);
          expect_meta_matches_cpu(
              what("nanmedian"), [](const Inputs& v) { return flat(at::nanmedian(v[0])); }, x);
        }
        expect_meta_matches_cpu(
            what("prod"), [](const Inputs& v) { return flat(at::prod(v[0])); }, x);
        expect_meta_matches_cpu(
            what("prod(dtype)"), [](const Inputs& v) { return flat(at::prod(v[0], at::kDouble)); },
            x);
        expect_meta_matches_cpu(
            what("nansum"), [&](const Inputs& v) { return flat(at::nansum(v[0], dims, keepdim)); },
            x);
        expect_meta_matches_cpu(
            what("count_nonzero"),
            [&](const Inputs& v) { return flat(at::count_nonzero(v[0], dims)); }, x);
        if (dtype == kFloat || dtype == kDouble) {
          expect_meta_matches_cpu(
              what("var"), [&](const Inputs& v) { return flat(at::var(v[0], dims, 1, keepdim)); },
              x);
          expect_meta_matches_cpu(
              what("std"), [&](const Inputs& v) { return flat(at::std(v[0], dims, 0, keepdim)); },
              x);
          expect_meta_matches_cpu(
              what("var_mean"),
              [&](const Inputs& v) { return flat(at::var_mean(v[0], dims, 1, keepdim)); }, x);
          expect_meta_matches_cpu(
              what("std_mean"),
              [&](const Inputs& v) { return flat(at::std_mean(v[0], dims, 1, keepdim)); }, x);
          expect_meta_matches_cpu(
              what("var all"),
              [&](const Inputs& v) { return flat(at::var(v[0], c10::nullopt, 1, keepdim)); }, x);
        }
      }
    }
    Tensor c = g.make(sizes, kComplexFloat);
    expect_meta_matches_cpu(
        "var complex", [&](const Inputs& v) { return flat(at::var(v[0], dims, 1, keepdim)); }, {c});
    expect_meta_matches_cpu(
        "std_mean complex",
        [&](const Inputs& v) { return flat(at::std_mean(v[0], dims, 1, keepdim)); }, {c});
  }
  expect_both_fail(
      "max of empty", [](const Inputs& v) { return flat(at::max(v[0])); },
      {at::empty({0, 3}, kFloat)}, "max(): Expected reduction dim to be specified");
  expect_both_fail(
      "var of ints", [](const Inputs& v) { return flat(at::var(v[0], {0}, 1, false)); },
      {g.make({3}, kLong)}, "only support floating point and complex dtypes");
  expect_both_fail(
      "nansum complex", [](const Inputs& v) { return flat(at::nansum(v[0])); },
      {g.make({3}, kComplexFloat)}, "nansum does not support complex inputs");
  expect_both_fail(
      "duplicate dims",
      [](const Inputs& v) {
        return flat(at::nansum(v[0], {0, -2}));
      },
      {g.make({3, 3}, kFloat)}, "appears multiple times");
}

}  // namespace
}  // namespace metaload::testing

namespace metaload {
namespace {

// Factories whose dtype depends on their values (torch 1.13's Python meta kernels get it wrong).
TEST(MetaFactories, ArangeAndFullMatchCpu) {
  const auto cpu = at::TensorOptions().device(at::kCPU);
  const auto meta = at::TensorOptions().device(at::kMeta);
  // Both succeed with the same sizes, strides and dtype, or both fail.
  auto same_impl = [](const std::function<at::Tensor()>& c, const std::function<at::Tensor()>& m,
                      const std::string& what) {
    at::Tensor ct, mt;
    bool c_ok = true, m_ok = true;
    try {
      ct = c();
    } catch (const std::exception&) {
      c_ok = false;
    }
    try {
      mt = m();
    } catch (const std::exception&) {
      m_ok = false;
    }
    ASSERT_EQ(c_ok, m_ok) << what << (c_ok ? ": only meta failed" : ": only cpu failed");
    if (!c_ok) return;
    EXPECT_EQ(ct.sizes(), mt.sizes()) << what;
    EXPECT_EQ(ct.strides(), mt.strides()) << what;
    EXPECT_EQ(ct.scalar_type(), mt.scalar_type()) << what;
  };
#define same(c, m, what) same_impl([&] { return c; }, [&] { return m; }, what)
  const std::vector<std::tuple<at::Scalar, at::Scalar, at::Scalar>> ranges = {
      {0, 16, 1},      {0, 16.0, 1}, {0, 2.5, 1}, {1, 10, 3},  {10, 1, -3},
      {0.5, 3.7, 0.4}, {-5, 5, 2},   {0, 0, 1},   {true, 5, 1}};
  for (const auto& [start, end, step] : ranges) {
    const std::string what = c10::str("arange(", start, ", ", end, ", ", step, ")");
    same(at::arange(start, end, step, cpu), at::arange(start, end, step, meta), what);
    same(at::arange(start, end, cpu), at::arange(start, end, meta), what + " start");
    same(at::arange(end, cpu), at::arange(end, meta), what + " end");
    same(at::arange(start, end, step, cpu.dtype(at::kHalf)),
         at::arange(start, end, step, meta.dtype(at::kHalf)), what + " half");
  }
  EXPECT_THROW(at::arange(0, 10, 0, meta), ShapeError);
  EXPECT_THROW(at::arange(10, 0, 1, meta), ShapeError);
  for (const at::Scalar& v :
       {at::Scalar(7), at::Scalar(1.5), at::Scalar(true), at::Scalar(c10::complex<double>(1, 2))}) {
    const std::string what = c10::str("full(", v, ")");
    same(at::full({2, 3}, v, cpu), at::full({2, 3}, v, meta), what);
    same(at::full({4}, v, cpu.dtype(at::kInt)), at::full({4}, v, meta.dtype(at::kInt)), what);
  }
#undef same
}

}  // namespace
}  // namespace metaload
