// Meta kernels of kernels/meta_conv_norm.cc and kernels/meta_pool.cc against the CPU kernels:
// random shapes, layouts (contiguous, channels-last, transposed, sliced, permuted) and dtypes.
#include "tests/kernels/meta_harness.h"

namespace metaload::testing {
namespace {

using at::kBFloat16;
using at::kBool;
using at::kDouble;
using at::kFloat;
using at::kLong;

// The floating dtypes that models run in, cycled one per random case where a test had one dtype.
constexpr at::ScalarType kCycle[] = {kFloat, kDouble, at::kBFloat16, at::kHalf};

std::vector<int64_t> rand_list(Gen& g, int64_t n, int64_t lo, int64_t hi) {
  return g.sizes(n, lo, hi);
}

// ---- convolution ----------------------------------------------------------------------------

struct ConvCase {
  int64_t dim;
  bool transposed;
  int64_t groups;
};

void conv_cases(Gen& g, const ConvCase& cc, at::ScalarType dtype, int reps) {
  for (int rep = 0; rep < reps; ++rep) {
    const int64_t d = cc.dim;
    const int64_t groups = cc.groups;
    const int64_t cin = groups * g.uniform(1, 3), cout = groups * g.uniform(1, 3);
    auto stride = rand_list(g, d, 1, 3);
    auto dilation = rand_list(g, d, 1, 2);
    auto kernel = rand_list(g, d, 1, 3);
    std::vector<int64_t> padding, output_padding(d, 0), spatial;
    for (int64_t i = 0; i < d; ++i) {
      // Transposed: padding beyond dilation * (kernel - 1) / 2 could make the output empty.
      padding.push_back(cc.transposed ? g.uniform(0, dilation[i] * (kernel[i] - 1) / 2)
                                      : g.uniform(0, kernel[i] / 2 + 1));
      int64_t min_in = cc.transposed ? 1 : dilation[i] * (kernel[i] - 1) + 1 - 2 * padding[i];
      spatial.push_back(std::max<int64_t>(min_in, 1) + g.uniform(0, 4));
      if (cc.transposed) output_padding[i] = g.uniform(0, std::max(stride[i], dilation[i]) - 1);
    }
    std::vector<int64_t> in_sizes{g.uniform(1, 3), cin};
    in_sizes.insert(in_sizes.end(), spatial.begin(), spatial.end());
    std::vector<int64_t> w_sizes = cc.transposed ? std::vector<int64_t>{cin, cout / groups}
                                                 : std::vector<int64_t>{cout, cin / groups};
    w_sizes.insert(w_sizes.end(), kernel.begin(), kernel.end());
    const int64_t bias_size = cout;
    const bool with_bias = g.uniform(0, 1) == 1;
    for (Layout in_layout : {Layout::kContiguous, Layout::kChannelsLast, Layout::kPermuted}) {
      for (Layout w_layout : {Layout::kContiguous, Layout::kChannelsLast}) {
        Tensor x = g.make(in_sizes, dtype, in_layout);
        Tensor w = g.make(w_sizes, dtype, w_layout);
        Inputs in{x, w};
        if (with_bias) in.push_back(g.make({bias_size}, dtype));
        std::string what = c10::str("conv", d, "d transposed=", cc.transposed, " groups=", groups,
                                    " stride=", stride, " padding=", padding,
                                    " dilation=", dilation, " output_padding=", output_padding,
                                    " input ", name(in_layout), " weight ", name(w_layout));
        auto bias = [&](const Inputs& t) {
          return t.size() > 2 ? c10::optional<Tensor>(t[2]) : c10::nullopt;
        };
        expect_meta_matches_cpu(
            "convolution " + what,
            [&](const Inputs& t) {
              return flat(at::convolution(t[0], t[1], bias(t), stride, padding, dilation,
                                          cc.transposed, output_padding, groups));
            },
            in);
        expect_meta_matches_cpu(
            "_convolution " + what,
            [&](const Inputs& t) {
              return flat(at::_convolution(t[0], t[1], bias(t), stride, padding, dilation,
                                           cc.transposed, output_padding, groups, false, false,
                                           true, true));
            },
            in);
      }
    }
  }
}

TEST(MetaConv, MatchesCpuOnRandomConvolutions) {
  Gen g(1);
  for (int64_t d : {1, 2, 3}) {
    for (bool transposed : {false, true}) {
      for (int64_t groups : {1, 2}) {
        conv_cases(g, {d, transposed, groups}, kFloat, 2);
      }
    }
  }
  conv_cases(g, {2, false, 1}, kDouble, 2);
  conv_cases(g, {2, true, 2}, kDouble, 1);
  conv_cases(g, {1, false, 1}, kDouble, 2);
  conv_cases(g, {2, false, 1}, kBFloat16, 1);
}

TEST(MetaConv, DepthwiseAndPointwiseAsInMobileNets) {
  Gen g(2);
  for (Layout l : {Layout::kContiguous, Layout::kChannelsLast}) {
    Tensor x = g.make({2, 8, 9, 9}, kFloat, l);
    expect_meta_matches_cpu(
        std::string("depthwise ") + name(l),
        [](const Inputs& t) {
          return flat(at::convolution(t[0], t[1], t[2], {2, 2}, {1, 1}, {1, 1}, false, {0, 0}, 8));
        },
        {x, g.make({8, 1, 3, 3}, kFloat, l), g.make({8}, kFloat)});
    expect_meta_matches_cpu(
        std::string("pointwise ") + name(l),
        [](const Inputs& t) {
          return flat(at::convolution(t[0], t[1], {}, {1, 1}, {0, 0}, {1, 1}, false, {0, 0}, 1));
        },
        {x, g.make({16, 8, 1, 1}, kFloat, l)});
  }
}

TEST(MetaConv, OverrideableHasTheSameShapes) {
  // convolution_overrideable has no CPU kernel: compare meta with the CPU convolution.
  Gen g(3);
  Tensor x = g.make({2, 4, 9, 9}, kFloat, Layout::kChannelsLast);
  Tensor w = g.make({6, 2, 3, 3}, kFloat);
  Tensor cpu = at::convolution(x, w, {}, {2, 1}, {1, 0}, {1, 2}, false, {0, 0}, 2);
  Tensor meta = at::convolution_overrideable(to_meta(x), to_meta(w), {}, {2, 1}, {1, 0}, {1, 2},
                                             false, {0, 0}, 2);
  EXPECT_EQ(cpu.sizes(), meta.sizes());
  EXPECT_EQ(cpu.strides(), meta.strides());
}

TEST(MetaConv, SingleValuedParametersExpand) {
  Gen g(4);
  expect_meta_matches_cpu(
      "stride/padding/dilation given once",
      [](const Inputs& t) {
        return flat(at::convolution(t[0], t[1], {}, {2}, {1}, {1}, false, {0}, 1));
      },
      {g.make({1, 3, 8, 7}, kFloat), g.make({5, 3, 3, 3}, kFloat)});
}

TEST(MetaConv, RejectsWhatTheCpuKernelRejects) {
  Gen g(5);
  auto conv = [](std::vector<int64_t> stride, std::vector<int64_t> padding, int64_t groups,
                 bool transposed = false) {
    return [=](const Inputs& t) {
      c10::optional<Tensor> bias = t.size() > 2 ? c10::optional<Tensor>(t[2]) : c10::nullopt;
      std::vector<int64_t> ones(stride.size(), 1), zeros(stride.size(), 0);
      return flat(
          at::convolution(t[0], t[1], bias, stride, padding, ones, transposed, zeros, groups));
    };
  };
  expect_both_fail("channels", conv({1, 1}, {0, 0}, 1),
                   {g.make({1, 4, 8, 8}, kFloat), g.make({6, 3, 3, 3}, kFloat)},
                   "expected input[1, 4, 8, 8] to have 3 channels, but got 4 channels instead");
  expect_both_fail("rank", conv({1, 1}, {0, 0}, 1),
                   {g.make({4, 8, 8}, kFloat), g.make({6, 4, 3, 3}, kFloat)},
                   "Expected 4-dimensional input for 4-dimensional weight");
  expect_both_fail("kernel too big", conv({1, 1}, {0, 0}, 1),
                   {g.make({1, 3, 2, 8}, kFloat), g.make({6, 3, 3, 3}, kFloat)},
                   "Kernel size can't be greater than actual input size");
  expect_both_fail(
      "bias size", conv({1, 1}, {0, 0}, 1),
      {g.make({1, 3, 8, 8}, kFloat), g.make({6, 3, 3, 3}, kFloat), g.make({5}, kFloat)},
      "expected bias to be 1-dimensional with 6 elements");
  expect_both_fail("groups", conv({1, 1}, {0, 0}, 4),
                   {g.make({1, 8, 8, 8}, kFloat), g.make({6, 2, 3, 3}, kFloat)},
                   "expected weight to be divisible by 4");
  expect_both_fail("negative padding", conv({1, 1}, {-1, 0}, 1),
                   {g.make({1, 3, 8, 8}, kFloat), g.make({6, 3, 3, 3}, kFloat)},
                   "negative padding is not supported");
  expect_both_fail("zero stride", conv({0, 1}, {0, 0}, 1),
                   {g.make({1, 3, 8, 8}, kFloat), g.make({6, 3, 3, 3}, kFloat)},
                   "non-positive stride is not supported");
  expect_both_fail("dtype", conv({1, 1}, {0, 0}, 1),
                   {g.make({1, 3, 8, 8}, kFloat), g.make({6, 3, 3, 3}, kDouble)},
                   "Input type (Float) and weight type (Double) should be the same");
  expect_both_fail("stride list", conv({1, 1, 1}, {0, 0}, 1),
                   {g.make({1, 3, 8, 8}, kFloat), g.make({6, 3, 3, 3}, kFloat)},
                   "expected stride to be a single integer value or a list of 2 values");
  expect_both_fail("transposed channels", conv({1, 1}, {0, 0}, 1, true),
                   {g.make({1, 4, 8, 8}, kFloat), g.make({3, 6, 3, 3}, kFloat)},
                   "Given transposed=1, weight of size [3, 6, 3, 3], expected input[1, 4, 8, 8] "
                   "to have 3 channels");
}

// ---- batch norm -----------------------------------------------------------------------------

TEST(MetaBatchNorm, MatchesCpuInTrainingAndEval) {
  Gen g(10);
  for (int rep = 0; rep < 3; ++rep) {
    for (int64_t ndim : {2, 3, 4, 5}) {
      auto sizes = g.sizes(ndim, 1, 5);
      sizes[0] = g.uniform(2, 3);
      const int64_t c = sizes[1];
      for (Layout l : all_layouts()) {
        for (auto [dtype, ptype] :
             {std::pair{kFloat, kFloat}, std::pair{kDouble, kDouble}, std::pair{kBFloat16, kFloat},
              std::pair{kBFloat16, kBFloat16}}) {
          for (bool training : {true, false}) {
            const bool affine = g.uniform(0, 1) == 1;
            const bool stats = !training || g.uniform(0, 1) == 1;
            Inputs in{g.make(sizes, dtype, l)};
            in.push_back(affine ? g.make({c}, ptype) : Tensor());
            in.push_back(affine ? g.make({c}, ptype) : Tensor());
            in.push_back(stats ? g.make({c}, ptype) : Tensor());
            in.push_back(stats ? at::ones({c}, ptype) : Tensor());
            expect_meta_matches_cpu(
                c10::str("native_batch_norm ", name(l), " training=", training, " affine=", affine,
                         " stats=", stats, " ", dtype, "/", ptype),
                [&](const Inputs& t) {
                  return flat(
                      at::native_batch_norm(t[0], t[1], t[2], t[3], t[4], training, 0.1, 1e-5));
                },
                in);
          }
        }
      }
    }
  }
}

TEST(MetaBatchNorm, EvalStatsAreEmptyLikeCpu) {
  // The case Python's 1.13 meta kernel gets wrong: eval returns save_mean/save_invstd of (0).
  Tensor x = at::empty({2, 3, 4, 4}, at::kMeta);
  auto [y, mean, invstd] = at::native_batch_norm(x, {}, {}, at::empty({3}, at::kMeta),
                                                 at::empty({3}, at::kMeta), false, 0.1, 1e-5);
  EXPECT_EQ(mean.sizes(), at::IntArrayRef({0}));
  EXPECT_EQ(invstd.sizes(), at::IntArrayRef({0}));
  EXPECT_EQ(y.sizes(), x.sizes());
}

// CPU native_batch_norm trusts its caller (at::batch_norm checks the parameter sizes, then reads
// out of bounds if they were wrong); the meta kernel checks them itself.
void expect_meta_rejects(const std::string& what, const Op& op, const Inputs& cpu_inputs,
                         const std::string& expect) {
  SCOPED_TRACE(what);
  Inputs meta_inputs;
  for (const auto& t : cpu_inputs) meta_inputs.push_back(to_meta(t));
  try {
    op(meta_inputs);
    ADD_FAILURE() << "the meta kernel accepted it";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find(expect), std::string::npos) << e.what();
  }
}

TEST(MetaBatchNorm, RejectsWhatTheCpuKernelRejects) {
  Gen g(11);
  auto bn = [](bool training) {
    return [=](const Inputs& t) {
      return flat(at::native_batch_norm(t[0], t[1], t[2], t[3], t[4], training, 0.1, 1e-5));
    };
  };
  Inputs bad_mean{g.make({2, 3, 4}, kFloat), Tensor(), Tensor(), g.make({4}, kFloat),
                  g.make({3}, kFloat)};
  EXPECT_ANY_THROW(
      at::batch_norm(bad_mean[0], {}, {}, bad_mean[3], bad_mean[4], false, 0.1, 1e-5, false));
  expect_meta_rejects("running_mean size", bn(false), bad_mean,
                      "native_batch_norm: running_mean should contain 3 elements not 4");
  Inputs bad_weight{g.make({2, 3, 4}, kFloat), g.make({2}, kFloat), Tensor(), Tensor(), Tensor()};
  EXPECT_ANY_THROW(
      at::batch_norm(bad_weight[0], bad_weight[1], {}, {}, {}, true, 0.1, 1e-5, false));
  expect_meta_rejects("weight size", bn(true), bad_weight,
                      "native_batch_norm: weight should contain 3 elements not 2");
  expect_both_fail("mixed parameter dtypes", bn(true),
                   {g.make({2, 3, 4}, kBFloat16), g.make({3}, kBFloat16), g.make({3}, kFloat),
                    Tensor(), Tensor()},
                   "expected scalar type BFloat16 but found Float");
}

// ---- layer norm / group norm ----------------------------------------------------------------

TEST(MetaLayerNorm, MatchesCpu) {
  Gen g(20);
  for (int rep = 0; rep < 4; ++rep) {
    for (int64_t ndim : {1, 2, 3, 4}) {
      auto sizes = g.sizes(ndim, 1, 5);
      for (int64_t nd = 1; nd <= ndim; ++nd) {
        std::vector<int64_t> norm(sizes.end() - nd, sizes.end());
        for (Layout l : all_layouts()) {
          for (auto dtype : {kFloat, kDouble, kBFloat16}) {
            const bool affine = g.uniform(0, 1) == 1;
            Inputs in{g.make(sizes, dtype, l)};
            in.push_back(affine ? g.make(norm, dtype) : Tensor());
            in.push_back(affine && g.uniform(0, 1) ? g.make(norm, dtype) : Tensor());
            expect_meta_matches_cpu(
                c10::str("native_layer_norm ", name(l), " normalized_shape=", norm, " ", dtype),
                [&](const Inputs& t) {
                  return flat(at::native_layer_norm(t[0], norm, t[1], t[2], 1e-5));
                },
                in);
          }
        }
      }
    }
  }
}

TEST(MetaLayerNorm, RejectsWhatTheCpuKernelRejects) {
  Gen g(21);
  auto ln = [](std::vector<int64_t> norm) {
    return [=](const Inputs& t) {
      return flat(at::native_layer_norm(t[0], norm, t[1], c10::nullopt, 1e-5));
    };
  };
  expect_both_fail("input shape", ln({5}), {g.make({2, 4}, kFloat), Tensor()},
                   "Given normalized_shape=[5], expected input with shape [*, 5], but got input "
                   "of size[2, 4]");
  expect_both_fail("weight shape", ln({4}), {g.make({2, 4}, kFloat), g.make({3}, kFloat)},
                   "Expected weight to be of same shape as normalized_shape");
}

TEST(MetaGroupNorm, MatchesCpu) {
  Gen g(30);
  for (int rep = 0; rep < 4; ++rep) {
    for (int64_t ndim : {2, 3, 4, 5}) {
      auto sizes = g.sizes(ndim, 1, 4);
      const int64_t groups = g.uniform(1, 3);
      sizes[1] = groups * g.uniform(1, 3);
      int64_t hxw = 1;
      for (int64_t i = 2; i < ndim; ++i) hxw *= sizes[i];
      for (Layout l : {Layout::kContiguous, Layout::kChannelsLast}) {
        for (auto dtype : {kFloat, kDouble, kBFloat16}) {
          const bool affine = g.uniform(0, 1) == 1;
          Inputs in{g.make(sizes, dtype, l)};
          in.push_back(affine ? g.make({sizes[1]}, dtype) : Tensor());
          in.push_back(affine ? g.make({sizes[1]}, dtype) : Tensor());
          expect_meta_matches_cpu(
              c10::str("native_group_norm ", name(l), " groups=", groups, " ", dtype),
              [&](const Inputs& t) {
                return flat(
                    at::native_group_norm(t[0], t[1], t[2], sizes[0], sizes[1], hxw, groups, 1e-5));
              },
              in);
        }
      }
    }
  }
}

// native_group_norm's message for a Double input with Float parameters: 2.x accepts Float
// parameters with a 16-bit input (check_mixed_data_type), 1.13 wants the input's dtype throughout.
constexpr const char* kGroupNormMixedDtypeError =
    compat::kCpuGroupNormMixedDtype ? "all inputs must share same datatype"
                                    : "expected scalar type Double but found Float";

TEST(MetaGroupNorm, RejectsWhatTheCpuKernelRejects) {
  Gen g(31);
  expect_both_fail(
      "non-contiguous input",
      [](const Inputs& t) { return flat(at::native_group_norm(t[0], {}, {}, 2, 4, 12, 2, 1e-5)); },
      {g.make({2, 4, 3, 4}, kFloat, Layout::kSliced)}, "Expected X.is_contiguous(memory_format)");
  expect_both_fail(
      "parameter dtype",
      [](const Inputs& t) {
        return flat(at::native_group_norm(t[0], t[1], {}, 2, 4, 12, 2, 1e-5));
      },
      {g.make({2, 4, 3, 4}, kBFloat16), g.make({4}, kFloat)},
      "expected scalar type BFloat16 but found Float");  // 1.13; 2.x takes it (and must match)
  expect_both_fail(
      "parameter dtype with a double input",
      [](const Inputs& t) {
        return flat(at::native_group_norm(t[0], t[1], {}, 2, 4, 12, 2, 1e-5));
      },
      {g.make({2, 4, 3, 4}, kDouble), g.make({4}, kFloat)}, kGroupNormMixedDtypeError);
}

TEST(MetaWeightNorm, MatchesCpu) {
  Gen g(32);
  for (int rep = 0; rep < 6; ++rep) {
    auto sizes = g.sizes(g.uniform(2, 4), 1, 5);
    for (int64_t dim : {int64_t{0}, static_cast<int64_t>(sizes.size()) - 1}) {
      std::vector<int64_t> gs(sizes.size(), 1);
      gs[dim] = sizes[dim];
      // Dense layouts only: the CPU kernel writes through g's strides (an expanded g overflows).
      for (Layout l : {Layout::kContiguous, Layout::kChannelsLast, Layout::kPermuted}) {
        for (auto dtype : {kFloat, kDouble, kBFloat16}) {
          expect_meta_matches_cpu(
              c10::str("_weight_norm_interface ", name(l), " dim ", dim, " ", dtype),
              [&](const Inputs& x) { return flat(at::_weight_norm_interface(x[0], x[1], dim)); },
              {g.make(sizes, dtype, l),
               g.make(gs, dtype, g.uniform(0, 1) ? l : Layout::kContiguous)});
        }
      }
    }
  }
  Tensor v = at::empty({2, 3, 4}, at::kMeta), gm = at::empty({1, 3, 1}, at::kMeta);
  EXPECT_THROW(at::_weight_norm_interface(v, gm, 1), ShapeError);  // CPU: internal assert
}

// ---- fused transformer ops ------------------------------------------------------------------

TEST(MetaTransformer, MultiHeadAttentionMatchesCpu) {
  Gen g(40);
  for (int rep = 0; rep < 4; ++rep) {
    const int64_t b = g.uniform(1, 3), t = g.uniform(1, 6), h = g.uniform(1, 3);
    const int64_t d = h * g.uniform(1, 4);
    for (auto dtype : {kFloat, kDouble}) {
      for (auto [need, avg] :
           {std::pair{true, true}, std::pair{true, false}, std::pair{false, true}}) {
        for (bool with_mask : {false, true}) {
          Inputs in{g.make({b, t, d}, dtype), g.make({3 * d, d}, dtype), g.make({3 * d}, dtype),
                    g.make({d, d}, dtype), g.make({d}, dtype)};
          if (with_mask) in.push_back(at::zeros({b, t}, kBool));
          expect_meta_matches_cpu(
              c10::str("_native_multi_head_attention B=", b, " T=", t, " D=", d, " H=", h,
                       " need_weights=", need, " average=", avg, " mask=", with_mask),
              [&](const Inputs& x) {
                c10::optional<Tensor> mask =
                    x.size() > 5 ? c10::optional<Tensor>(x[5]) : c10::nullopt;
                c10::optional<int64_t> mask_type =
                    x.size() > 5 ? c10::optional<int64_t>(1) : c10::nullopt;
                return flat(at::_native_multi_head_attention(
                    x[0], x[0], x[0], d, h, x[1], x[2], x[3], x[4], mask, need, avg, mask_type));
              },
              in);
        }
      }
    }
  }
}

TEST(MetaTransformer, EncoderLayerMatchesCpu) {
  Gen g(41);
  for (int rep = 0; rep < 3; ++rep) {
    const int64_t b = g.uniform(1, 3), t = g.uniform(1, 6), h = g.uniform(1, 2);
    const int64_t d = h * g.uniform(2, 4), ff = g.uniform(2, 9);
    for (bool gelu : {false, true}) {
      for (bool norm_first : {false, true}) {
        for (Layout l : {Layout::kContiguous, Layout::kTransposed}) {
          auto p = [&](std::vector<int64_t> s) { return g.make(s, kFloat); };
          Inputs in{g.make({b, t, d}, kFloat, l),
                    p({3 * d, d}),
                    p({3 * d}),
                    p({d, d}),
                    p({d}),
                    p({d}),
                    p({d}),
                    p({d}),
                    p({d}),
                    p({ff, d}),
                    p({ff}),
                    p({d, ff}),
                    p({d})};
          expect_meta_matches_cpu(
              c10::str("_transformer_encoder_layer_fwd ", name(l), " gelu=", gelu,
                       " norm_first=", norm_first),
              [&](const Inputs& x) {
                return flat(at::_transformer_encoder_layer_fwd(
                    x[0], d, h, x[1], x[2], x[3], x[4], gelu, norm_first, 1e-5, x[5], x[6], x[7],
                    x[8], x[9], x[10], x[11], x[12], c10::nullopt, c10::nullopt));
              },
              in);
        }
      }
    }
  }
}

TEST(MetaTransformer, TransformBiasRescaleQkvAndMaskedSoftmaxMatchCpu) {
  Gen g(42);
  for (int rep = 0; rep < 4; ++rep) {
    const int64_t b = g.uniform(1, 3), t = g.uniform(1, 9), h = g.uniform(1, 3);
    const int64_t d = h * g.uniform(1, 4);
    expect_meta_matches_cpu(
        "_transform_bias_rescale_qkv",
        [&](const Inputs& x) { return flat(at::_transform_bias_rescale_qkv(x[0], x[1], h)); },
        {g.make({b, t, 3 * d}, kFloat), g.make({3 * d}, kFloat)});
    for (Layout l : all_layouts()) {
      Tensor scores = g.make({b, h, t, t}, kFloat, l);
      for (int64_t mask_type : {1, 2}) {
        for (int64_t dim : {3, 1, -1}) {
          expect_meta_matches_cpu(
              c10::str("_masked_softmax ", name(l), " mask_type ", mask_type, " dim ", dim),
              [&](const Inputs& x) {
                return flat(at::_masked_softmax(x[0], x[1], dim, mask_type));
              },
              {scores, at::zeros({b, h, t, t}, kBool)});
        }
      }
    }
  }
}

// _masked_softmax of a (B, L) mask without a mask_type: 1.13's CPU kernel takes only masks of
// the input's shape, 2.x's also (B, L) and (L, L) ones, given their type.
constexpr const char* kUntypedPaddingMaskError = compat::kCpuMaskedSoftmaxInfersMaskType
                                                     ? "Mask Type should be defined"
                                                     : "Mask shape should match input shape";

TEST(MetaTransformer, RejectsWhatTheCpuKernelRejects) {
  Gen g(43);
  auto mha = [](int64_t d, int64_t h) {
    return [=](const Inputs& x) {
      return flat(at::_native_multi_head_attention(x[0], x[0], x[0], d, h, x[1], x[2], x[3], x[4],
                                                   c10::nullopt, true, true, c10::nullopt));
    };
  };
  expect_both_fail("embed_dim", mha(6, 2),
                   {g.make({2, 3, 8}, kFloat), g.make({24, 8}, kFloat), g.make({24}, kFloat),
                    g.make({8, 8}, kFloat), g.make({8}, kFloat)},
                   "passed-in embed_dim 6 didn't match last dim of query 8");
  expect_both_fail("heads", mha(8, 3),
                   {g.make({2, 3, 8}, kFloat), g.make({24, 8}, kFloat), g.make({24}, kFloat),
                    g.make({8, 8}, kFloat), g.make({8}, kFloat)},
                   "`embed_dim` must divide evenly by `num_heads`");
  expect_both_fail(
      "mask shape",
      [](const Inputs& x) { return flat(at::_masked_softmax(x[0], x[1], 3, c10::nullopt)); },
      {g.make({2, 2, 3, 3}, kFloat), at::zeros({2, 2, 3, 4}, kBool)},
      "shape should match input shape");
  // 1.13 wants a mask_type; 2.x treats a mask of the input's shape as type 2 (and must match).
  expect_both_fail(
      "mask type",
      [](const Inputs& x) { return flat(at::_masked_softmax(x[0], x[1], 3, c10::nullopt)); },
      {g.make({2, 2, 3, 3}, kFloat), at::zeros({2, 2, 3, 3}, kBool)},
      "Mask Type should be defined");
  expect_both_fail(
      "padding mask without a mask type",
      [](const Inputs& x) { return flat(at::_masked_softmax(x[0], x[1], 3, c10::nullopt)); },
      {g.make({2, 2, 3, 3}, kFloat), at::zeros({2, 3}, kBool)}, kUntypedPaddingMaskError);
}

// ---- pooling and friends ----------------------------------------------------------------------

TEST(MetaPool, AdaptiveAvgPoolMatchesCpu) {
  Gen g(50);
  for (int rep = 0; rep < 4; ++rep) {
    for (int64_t ndim : {3, 4}) {
      auto sizes = g.sizes(ndim, 1, 9);
      std::vector<int64_t> out = g.sizes(2, 1, 5);
      for (Layout l : all_layouts()) {
        for (auto dtype : {kFloat, kDouble, kBFloat16}) {
          expect_meta_matches_cpu(
              c10::str("_adaptive_avg_pool2d ", name(l), " out=", out),
              [&](const Inputs& x) { return flat(at::_adaptive_avg_pool2d(x[0], out)); },
              {g.make(sizes, dtype, l)});
        }
      }
    }
    for (int64_t ndim : {4, 5}) {
      auto sizes = g.sizes(ndim, 1, 6);
      std::vector<int64_t> out = g.sizes(3, 1, 4);
      const auto dtype = (rep + ndim) % 2 ? kDouble : kFloat;  // all the 1.13 CPU kernel takes
      for (Layout l : all_layouts()) {
        expect_meta_matches_cpu(
            c10::str("_adaptive_avg_pool3d ", dtype, " ", name(l), " out=", out),
            [&](const Inputs& x) { return flat(at::_adaptive_avg_pool3d(x[0], out)); },
            {g.make(sizes, dtype, l)});
      }
    }
  }
  expect_both_fail(
      "adaptive rank",
      [](const Inputs& x) {
        return flat(at::_adaptive_avg_pool2d(x[0], {2, 2}));
      },
      {g.make({2, 3}, kFloat)}, "Expected 3D or 4D tensor");
}

TEST(MetaPool, MaxPool3dWithIndicesMatchesCpu) {
  Gen g(51);
  for (int rep = 0; rep < 6; ++rep) {
    auto k = g.sizes(3, 1, 3);
    auto s = g.sizes(3, 1, 3);
    std::vector<int64_t> p, d = g.sizes(3, 1, 2);
    for (int i = 0; i < 3; ++i) p.push_back(g.uniform(0, k[i] / 2));
    const bool ceil = g.uniform(0, 1) == 1;
    const auto dtype = rep % 2 ? kDouble : kFloat;  // all the 1.13 CPU kernel takes
    for (int64_t ndim : {4, 5}) {
      std::vector<int64_t> sizes;
      if (ndim == 5) sizes.push_back(g.uniform(1, 2));
      sizes.push_back(g.uniform(1, 3));
      for (int i = 0; i < 3; ++i) sizes.push_back(d[i] * (k[i] - 1) + 1 + g.uniform(0, 4));
      for (Layout l : all_layouts()) {
        // 2.x's CPU kernel refuses a 4-d input laid out channels-last (2-d); 1.13's takes it.
        expect_meta_agrees_with_cpu(
            c10::str("max_pool3d_with_indices ", dtype, " ", name(l), " k=", k, " s=", s, " p=", p,
                     " d=", d, " ceil=", ceil),
            [&](const Inputs& x) {
              return flat(at::max_pool3d_with_indices(x[0], k, s, p, d, ceil));
            },
            {g.make(sizes, dtype, l)}, "Unsupported memory format");
      }
    }
  }
  expect_both_fail(
      "pool pad",
      [](const Inputs& x) {
        return flat(
            at::max_pool3d_with_indices(x[0], {2, 2, 2}, {1, 1, 1}, {2, 0, 0}, {1, 1, 1}, false));
      },
      {g.make({1, 1, 5, 5, 5}, kFloat)}, "pad should be smaller than or equal to half");
}

TEST(MetaPool, GridSamplerMatchesCpu) {
  Gen g(52);
  for (int rep = 0; rep < 4; ++rep) {
    const int64_t n = g.uniform(1, 3), c = g.uniform(1, 3);
    const auto dtype = rep % 2 ? kDouble : kFloat;  // the CPU kernels take float and double
    for (Layout l : {Layout::kContiguous, Layout::kChannelsLast, Layout::kTransposed}) {
      for (int64_t mode : {0, 1, 2}) {
        expect_meta_matches_cpu(
            c10::str("grid_sampler_2d ", dtype, " ", name(l), " mode ", mode),
            [&](const Inputs& x) { return flat(at::grid_sampler_2d(x[0], x[1], mode, 0, false)); },
            {g.make({n, c, g.uniform(1, 6), g.uniform(1, 6)}, dtype, l),
             g.make({n, g.uniform(1, 5), g.uniform(1, 5), 2}, dtype)});
      }
      expect_meta_matches_cpu(
          c10::str("grid_sampler_3d ", dtype, " ", name(l)),
          [&](const Inputs& x) { return flat(at::grid_sampler_3d(x[0], x[1], 0, 1, true)); },
          {g.make({n, c, g.uniform(1, 4), g.uniform(1, 4), g.uniform(1, 4)}, dtype, l),
           g.make({n, g.uniform(1, 3), g.uniform(1, 3), g.uniform(1, 3), 3}, dtype)});
    }
  }
  expect_both_fail(
      "grid last dim",
      [](const Inputs& x) { return flat(at::grid_sampler_2d(x[0], x[1], 0, 0, false)); },
      {g.make({1, 2, 4, 4}, kFloat), g.make({1, 3, 3, 3}, kFloat)},
      "expected grid to have size 2 in last dimension");
}

TEST(MetaPool, Im2ColCol2ImMatchCpu) {
  Gen g(53);
  for (int rep = 0; rep < 6; ++rep) {
    auto k = g.sizes(2, 1, 3), d = g.sizes(2, 1, 2), s = g.sizes(2, 1, 3);
    std::vector<int64_t> p = g.sizes(2, 0, 1);
    std::vector<int64_t> hw{d[0] * (k[0] - 1) + 1 + g.uniform(0, 4),
                            d[1] * (k[1] - 1) + 1 + g.uniform(0, 4)};
    const int64_t c = g.uniform(1, 3);
    const auto dtype = kCycle[rep % 4];
    for (bool batched : {true, false}) {
      std::vector<int64_t> sizes = batched ? std::vector<int64_t>{g.uniform(1, 2), c, hw[0], hw[1]}
                                           : std::vector<int64_t>{c, hw[0], hw[1]};
      for (Layout l : all_layouts()) {
        expect_meta_matches_cpu(
            c10::str("im2col ", dtype, " ", name(l), " k=", k, " d=", d, " p=", p, " s=", s),
            [&](const Inputs& x) { return flat(at::im2col(x[0], k, d, p, s)); },
            {g.make(sizes, dtype, l)});
      }
      // col2im of the matching column tensor restores (N, C, H, W).
      Tensor cols = at::im2col(g.make(sizes, dtype), k, d, p, s);
      for (Layout l : {Layout::kContiguous, Layout::kTransposed}) {
        expect_meta_matches_cpu(
            c10::str("col2im ", name(l)),
            [&](const Inputs& x) { return flat(at::col2im(x[0], hw, k, d, p, s)); },
            {g.make(cols.sizes(), dtype, l)});
      }
    }
  }
  expect_both_fail(
      "col2im blocks",
      [](const Inputs& x) {
        return flat(at::col2im(x[0], {4, 4}, {2, 2}, {1, 1}, {0, 0}, {1, 1}));
      },
      {g.make({1, 4, 10}, kFloat)}, "expected size of input's dimension 2 to match");
}

TEST(MetaPool, UpsampleNearest3dVecMatchesCpu) {
  Gen g(54);
  for (int rep = 0; rep < 4; ++rep) {
    auto sizes = g.sizes(5, 1, 4);
    std::vector<int64_t> out = g.sizes(3, 1, 7);
    std::vector<double> scales{1.5, 2.0, 0.75 + 0.25 * g.uniform(1, 4)};
    const auto dtype = rep % 2 ? kDouble : kFloat;  // the 1.13 CPU kernel has no 16-bit
    for (Layout l : all_layouts()) {
      expect_meta_matches_cpu(
          c10::str("upsample_nearest3d.vec size ", dtype, " ", name(l)),
          [&](const Inputs& x) {
            return flat(at::upsample_nearest3d(x[0], at::OptionalIntArrayRef(out),
                                               c10::optional<at::ArrayRef<double>>()));
          },
          {g.make(sizes, dtype, l)});
      expect_meta_matches_cpu(c10::str("upsample_nearest3d.vec scales ", name(l)),
                              [&](const Inputs& x) {
                                return flat(at::upsample_nearest3d(x[0], at::OptionalIntArrayRef(),
                                                                   at::ArrayRef<double>(scales)));
                              },
                              {g.make(sizes, dtype, l)});
      expect_meta_matches_cpu(
          c10::str("_upsample_nearest_exact3d.vec ", name(l)),
          [&](const Inputs& x) {
            return flat(at::_upsample_nearest_exact3d(x[0], at::OptionalIntArrayRef(out),
                                                      c10::optional<at::ArrayRef<double>>()));
          },
          {g.make(sizes, dtype, l)});
    }
  }
}

TEST(MetaPool, PaddingUnpoolingShuffleMatchCpu) {
  Gen g(55);
  for (int rep = 0; rep < 4; ++rep) {
    const auto dtype = rep % 2 ? kDouble : kFloat;  // the 1.13 CPU kernels have no 16-bit
    for (int64_t ndim : {3, 4}) {
      auto sizes = g.sizes(ndim, 2, 6);
      std::vector<int64_t> pad{g.uniform(0, sizes[ndim - 1] - 1), g.uniform(0, sizes[ndim - 1] - 1),
                               g.uniform(0, sizes[ndim - 2] - 1),
                               g.uniform(0, sizes[ndim - 2] - 1)};
      for (Layout l : all_layouts()) {
        expect_meta_matches_cpu(
            c10::str("reflection_pad2d ", dtype, " ", name(l), " pad=", pad),
            [&](const Inputs& x) { return flat(at::reflection_pad2d(x[0], pad)); },
            {g.make(sizes, dtype, l)});
        expect_meta_matches_cpu(c10::str("max_unpool2d ", name(l)),
                                [&](const Inputs& x) {
                                  return flat(at::max_unpool2d(x[0], x[1], {7, 8}));
                                },
                                {g.make(sizes, dtype, l), at::zeros(sizes, kLong)});
      }
    }
    for (int64_t ndim : {4, 5}) {
      auto sizes = g.sizes(ndim, 1, 4);
      for (Layout l : all_layouts()) {
        expect_meta_matches_cpu(
            c10::str("max_unpool3d ", name(l)),
            [&](const Inputs& x) {
              return flat(at::max_unpool3d(x[0], x[1], {5, 6, 7}, {2, 2, 2}, {0, 0, 0}));
            },
            {g.make(sizes, dtype, l), at::zeros(sizes, kLong)});
      }
    }
    auto sizes = g.sizes(4, 1, 4);
    const int64_t groups = g.uniform(1, 3);
    sizes[1] = groups * g.uniform(1, 3);
    for (Layout l : all_layouts()) {
      expect_meta_matches_cpu(
          c10::str("channel_shuffle ", name(l), " groups=", groups),
          [&](const Inputs& x) { return flat(at::channel_shuffle(x[0], groups)); },
          {g.make(sizes, dtype, l)});
    }
  }
  expect_both_fail(
      "reflection pad too big",
      [](const Inputs& x) {
        return flat(at::reflection_pad2d(x[0], {4, 0, 0, 0}));
      },
      {g.make({1, 2, 3, 4}, kFloat)}, "Padding size should be less than the corresponding input");
  expect_both_fail(
      "unpool indices",
      [](const Inputs& x) {
        return flat(at::max_unpool2d(x[0], x[1], {4, 4}));
      },
      {g.make({1, 2, 3, 3}, kFloat), at::zeros({1, 2, 3, 3}, at::kInt)},
      "elements in indices should be type int64");
}

}  // namespace
}  // namespace metaload::testing
