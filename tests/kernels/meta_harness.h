// Test harness for Meta kernels: run an op on CPU tensors and on meta copies of them (same sizes,
// strides and dtype), then require identical sizes, strides and dtypes of every output -- or, for
// arguments the CPU kernel rejects, that the meta side rejects them too and says why with a
// metaload::ShapeError.
#pragma once

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "base/torch_compat.h"
#include "kernels/meta_registry.h"

namespace metaload::testing {

using at::Tensor;
using Inputs = std::vector<Tensor>;

// A meta tensor with t's sizes, strides and dtype. CPU 0-dim tensors stay on CPU when
// `keep_cpu_scalars` (ops accept them next to device tensors).
inline Tensor to_meta(const Tensor& t, bool keep_cpu_scalars = false) {
  if (!t.defined()) return t;
  if (keep_cpu_scalars && t.dim() == 0) return t;
  return at::empty_strided(t.sizes(), t.strides(), t.options().device(at::kMeta));
}

// A copy with the same strides (an out= tensor passed twice must not carry the first resize into
// the second run). Overlapping tensors (stride 0) cannot be out= tensors and are shared.
inline Tensor same_layout_copy(const Tensor& t) {
  if (!t.defined() || t.dim() == 0) return t;
  for (auto s : t.strides()) {
    if (s == 0) return t;
  }
  return at::empty_strided(t.sizes(), t.strides(), t.options()).copy_(t);
}

// Outputs of an op, flattened; undefined tensors (e.g. "no attention weights") are kept.
inline std::vector<Tensor> flat(const Tensor& t) {
  return {t};
}
template <typename... Ts>
std::vector<Tensor> flat(const std::tuple<Ts...>& t) {
  std::vector<Tensor> out;
  std::apply([&](const auto&... x) { (out.push_back(x), ...); }, t);
  return out;
}

using Op = std::function<std::vector<Tensor>(const Inputs&)>;

// Collects the warnings raised while it lives instead of printing them.
class CapturedWarnings : public compat::WarningMessageHandler {
 public:
  CapturedWarnings() : previous_(compat::warning_handler()) { compat::set_warning_handler(this); }
  ~CapturedWarnings() override { compat::set_warning_handler(previous_); }
  void on_warning(const std::string& message) override { messages.push_back(message); }
  // How many warnings said that an out= tensor was resized.
  int resized() const {
    int n = 0;
    for (const auto& m : messages) n += m.find("was resized") != std::string::npos;
    return n;
  }
  std::vector<std::string> messages;

 private:
  c10::WarningHandler* previous_;
};

inline std::string describe(const Tensor& t) {
  if (!t.defined()) return "undefined";
  return c10::str(t.scalar_type(), t.sizes(), " strides ", t.strides(), " offset ",
                  t.storage_offset());
}

inline std::string describe(const Inputs& in) {
  std::string s;
  for (const auto& t : in) s += "\n    input " + describe(t);
  return s;
}

// Runs `op` on `cpu_inputs` and on meta copies; every output must agree in definedness, sizes,
// strides, storage offset and dtype, and the meta outputs must be meta tensors.
inline void expect_meta_matches_cpu(const std::string& what, const Op& op, const Inputs& cpu_inputs,
                                    bool keep_cpu_scalars = false) {
  SCOPED_TRACE(what + describe(cpu_inputs));
  // Inputs may be out= tensors that the op resizes: run on copies, keep the originals.
  Inputs cpu_copies, meta_inputs;
  for (const auto& t : cpu_inputs) {
    cpu_copies.push_back(same_layout_copy(t));
    meta_inputs.push_back(to_meta(t, keep_cpu_scalars));
  }
  std::vector<Tensor> cpu_out, meta_out;
  int cpu_resized = 0, meta_resized = 0;
  {
    CapturedWarnings warnings;
    cpu_out = op(cpu_copies);
    cpu_resized = warnings.resized();
  }
  try {
    CapturedWarnings warnings;
    meta_out = op(meta_inputs);
    meta_resized = warnings.resized();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "meta run threw: " << e.what();
    return;
  }
  EXPECT_EQ(cpu_resized, meta_resized) << "warnings about resized out= tensors differ";
  ASSERT_EQ(cpu_out.size(), meta_out.size());
  for (size_t i = 0; i < cpu_out.size(); ++i) {
    const Tensor& c = cpu_out[i];
    const Tensor& m = meta_out[i];
    ASSERT_EQ(c.defined(), m.defined()) << "output " << i;
    if (!c.defined()) continue;
    EXPECT_TRUE(m.is_meta()) << "output " << i << " is on " << m.device();
    EXPECT_EQ(c.sizes(), m.sizes())
        << "output " << i << ": cpu " << describe(c) << " meta " << describe(m);
    EXPECT_EQ(c.strides(), m.strides())
        << "output " << i << ": cpu " << describe(c) << " meta " << describe(m);
    EXPECT_EQ(c.scalar_type(), m.scalar_type()) << "output " << i;
    EXPECT_EQ(c.storage_offset(), m.storage_offset()) << "output " << i;
  }
}

// Arguments the CPU kernel may reject: the meta run must agree with the CPU kernel of the torch it
// runs on, whichever way that goes (torch versions differ: 2.x's CPU kernels accept inputs that
// 1.13's reject and the other way round).
// - The CPU kernel rejects them: so must the meta run, with a metaload ShapeError whose message
//   contains `expect` (and names the op, which `expect` may include). Where metaload has no Meta
//   kernel for `aten_op` in this torch (2.x's own Meta kernel, or a composite op that checks the
//   arguments before it reaches ours), torch's own error is accepted in its place, as long as it
//   says the same (`expect`).
// - The CPU kernel accepts them: the meta run must accept them too and match (as
//   expect_meta_matches_cpu).
inline void expect_meta_agrees_with_cpu(const std::string& what, const Op& op,
                                        const Inputs& cpu_inputs, const std::string& expect,
                                        const char* aten_op = nullptr) {
  bool cpu_rejects = false;
  {
    Inputs copies;
    for (const auto& t : cpu_inputs) copies.push_back(same_layout_copy(t));
    CapturedWarnings quiet;
    try {
      op(copies);
    } catch (const std::exception&) {
      cpu_rejects = true;
    }
  }
  if (!cpu_rejects) {
    expect_meta_matches_cpu(what + " (accepted by this torch's CPU kernel)", op, cpu_inputs);
    return;
  }
  SCOPED_TRACE(what + " (rejected by this torch's CPU kernel)" + describe(cpu_inputs));
  Inputs meta_inputs;
  for (const auto& t : cpu_inputs) meta_inputs.push_back(to_meta(t));
  try {
    op(meta_inputs);
    ADD_FAILURE() << "the meta run accepted it";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find(expect), std::string::npos)
        << "message: " << e.what() << "\nexpected to contain: " << expect;
    EXPECT_EQ(std::string(e.what()).rfind("[metaload.ShapeError] ", 0), 0u) << e.what();
  } catch (const std::exception& e) {
    const bool ours =
        aten_op == nullptr || meta_kernel_owner(aten_op) == MetaKernelOwner::kMetaload;
    if (ours) {
      ADD_FAILURE() << "the meta run threw something other than ShapeError: " << e.what();
    } else {
      EXPECT_NE(std::string(e.what()).find(expect), std::string::npos)
          << "torch's own error: " << e.what() << "\nexpected to contain: " << expect;
    }
  }
}

// Bad arguments: where this torch's CPU kernel rejects them, the meta run rejects them too (see
// expect_meta_agrees_with_cpu, which this is; the name says what the test means: the CPU kernel
// of at least one supported torch rejects them).
inline void expect_both_fail(const std::string& what, const Op& op, const Inputs& cpu_inputs,
                             const std::string& expect, const char* aten_op = nullptr) {
  expect_meta_agrees_with_cpu(what, op, cpu_inputs, expect, aten_op);
}

// Every kernel test binary first checks that the load-time registration ran. (This is also what
// makes the binary depend on libmetaload.so: with --as-needed a library whose only use is its
// static initializers would be dropped from the link.)
class RegistrationRan : public ::testing::Environment {
 public:
  void SetUp() override {
    ASSERT_FALSE(registered_meta_kernels().empty())
        << "libmetaload.so registered no Meta kernels at load time";
  }
};
inline ::testing::Environment* const kRegistrationRan =
    ::testing::AddGlobalTestEnvironment(new RegistrationRan);

// ---- inputs --------------------------------------------------------------------------------

enum class Layout { kContiguous, kChannelsLast, kTransposed, kSliced, kPermuted, kExpanded };

inline const char* name(Layout l) {
  switch (l) {
    case Layout::kContiguous:
      return "contiguous";
    case Layout::kChannelsLast:
      return "channels_last";
    case Layout::kTransposed:
      return "transposed";
    case Layout::kSliced:
      return "sliced";
    case Layout::kPermuted:
      return "permuted";
    case Layout::kExpanded:
      return "expanded";
  }
  return "?";
}

// Random cases are reproducible: each test seeds its own generator; METALOAD_TEST_SEED=n shifts
// every seed to explore other cases.
class Gen {
 public:
  explicit Gen(uint32_t seed) : rng_(seed + seed_shift()) {}

  static uint32_t seed_shift() {
    const char* env = std::getenv("METALOAD_TEST_SEED");
    return env == nullptr ? 0 : static_cast<uint32_t>(std::strtoul(env, nullptr, 10)) * 7919u;
  }

  int64_t uniform(int64_t lo, int64_t hi) {  // inclusive
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng_);
  }

  std::vector<int64_t> sizes(int64_t ndim, int64_t lo, int64_t hi) {
    std::vector<int64_t> s;
    for (int64_t i = 0; i < ndim; ++i) s.push_back(uniform(lo, hi));
    return s;
  }

  // Values matter only for the CPU run: random in a small range.
  Tensor values(at::IntArrayRef sizes, at::ScalarType dtype) {
    at::manual_seed(uniform(0, 1 << 20));
    if (dtype == at::kBool) return at::randint(0, 2, sizes, at::kLong).to(at::kBool);
    if (at::isIntegralType(dtype, false)) return at::randint(0, 5, sizes, dtype);
    return at::rand(sizes, at::TensorOptions().dtype(dtype));
  }

  // A tensor of these sizes in the given layout: channels-last (4-d and 5-d), transposed
  // (last two dims swapped in memory), sliced (every other element of the last dim: not dense),
  // permuted (memory order a random permutation).
  Tensor make(at::IntArrayRef sizes, at::ScalarType dtype, Layout layout = Layout::kContiguous) {
    const int64_t n = sizes.size();
    switch (layout) {
      case Layout::kContiguous:
        return values(sizes, dtype);
      case Layout::kChannelsLast:
        if (n == 4) return values(sizes, dtype).contiguous(at::MemoryFormat::ChannelsLast);
        if (n == 5) return values(sizes, dtype).contiguous(at::MemoryFormat::ChannelsLast3d);
        return values(sizes, dtype);
      case Layout::kTransposed: {
        if (n < 2) return values(sizes, dtype);
        std::vector<int64_t> s(sizes.begin(), sizes.end());
        std::swap(s[n - 1], s[n - 2]);
        return values(s, dtype).transpose(n - 1, n - 2);
      }
      case Layout::kSliced: {
        if (n < 1) return values(sizes, dtype);
        std::vector<int64_t> s(sizes.begin(), sizes.end());
        s[n - 1] *= 2;
        return values(s, dtype).slice(n - 1, 0, s[n - 1], 2);
      }
      case Layout::kPermuted: {
        std::vector<int64_t> perm(n);
        for (int64_t i = 0; i < n; ++i) perm[i] = i;
        std::shuffle(perm.begin(), perm.end(), rng_);
        // base.permute(perm).size(i) == base.size(perm[i]) == sizes[i].
        std::vector<int64_t> s(n);
        for (int64_t i = 0; i < n; ++i) s[perm[i]] = sizes[i];
        return values(s, dtype).permute(perm);
      }
      case Layout::kExpanded: {
        // Stride 0 along the first dim of size > 1 (overlapping memory).
        std::vector<int64_t> s(sizes.begin(), sizes.end());
        for (auto& d : s) {
          if (d > 1) {
            d = 1;
            break;
          }
        }
        return values(s, dtype).expand(sizes);
      }
    }
    return values(sizes, dtype);
  }

  std::mt19937& rng() { return rng_; }

 private:
  std::mt19937 rng_;
};

inline const std::vector<Layout>& all_layouts() {
  static const std::vector<Layout> v = {Layout::kContiguous, Layout::kChannelsLast,
                                        Layout::kTransposed, Layout::kSliced,
                                        Layout::kPermuted,   Layout::kExpanded};
  return v;
}

}  // namespace metaload::testing
