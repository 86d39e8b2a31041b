#include "fake_mode/cpu_rules.h"

#include <ATen/ATen.h>

#include <sstream>
#include <string>

#include "fake_mode/fake_tensor.h"
#include "kernels/errors.h"

namespace metaload {
namespace {

template <typename... Args>
[[noreturn]] void refuse(const char* op, const Args&... what) {
  std::ostringstream out;
  out << op << ": ";
  (out << ... << what);
  throw ShapeError(out.str());
}

// torch.histc on cpu: "histogram_cpu" is dispatched over floating types only.
bool histc(const torch::jit::Stack& s, size_t base) {
  const at::Tensor& self = s[base].toTensor();
  const at::ScalarType type = self.scalar_type();
  if (c10::isIntegralType(type, /*includeBool=*/false)) {
    refuse("torch.histc", "\"histogram_cpu\" not implemented for '", c10::toString(type), "'");
  }
  return false;
}

// The leading dimension of a matrix the CPU kernel takes: one of its last two dims has stride 1
// and the other at least the matching size; the leading stride is a multiple of 16 bytes.
void check_matrix(const at::Tensor& m, const char* label) {
  const char* op = "torch._grouped_mm";
  const auto st = m.strides();
  const auto sz = m.sizes();
  const int64_t n = m.dim();
  int64_t lead = 0;
  if (st[n - 2] == 1 && st[n - 1] >= std::max<int64_t>(1, sz[n - 2])) {
    lead = st[n - 1];
  } else if (st[n - 1] == 1 && st[n - 2] >= std::max<int64_t>(1, sz[n - 1])) {
    lead = st[n - 2];
  } else {
    refuse(op, "Invalid strides/sizes, got ", st, " for strides and ", sz, " for sizes of ", label);
  }
  const int64_t align = 16 / static_cast<int64_t>(m.element_size());
  if (lead % align != 0) {
    refuse(op, label, "'s strides should be multiple of 16 bytes (strides ", st, ", ",
           m.scalar_type(), ")");
  }
}

// The result size of torch._grouped_mm(a, b, offs) as the CPU kernel (torch >= 2.9) checks it:
// float32, float16 and bfloat16 (torch's Meta kernel follows CUDA's: bfloat16 only).
std::vector<int64_t> grouped_mm_size(const at::Tensor& a, const at::Tensor& b,
                                     const c10::optional<at::Tensor>& offs) {
  const char* op = "torch._grouped_mm";
  const at::ScalarType type = a.scalar_type();
  if ((type != at::kFloat && type != at::kHalf && type != at::kBFloat16) ||
      b.scalar_type() != type) {
    refuse(op,
           "Expected mat_a and mat_b to be Float32, BFloat16 or Float16 matrices of one dtype, "
           "got ",
           a.scalar_type(), " and ", b.scalar_type());
  }
  const int64_t da = a.dim(), db = b.dim();
  if ((da != 2 && da != 3) || (db != 2 && db != 3)) {
    refuse(op, "Multiplicands must be 2D or 3D but got mat_a.dim()=", da, " and mat_b.dim()=", db);
  }
  const bool a2 = da == 2, b2 = db == 2;
  if (!(a2 && b2) && a.size(-1) != b.size(-2)) {
    refuse(op, "contraction dimension of mat_a and mat_b must match (", a.sizes(), " and ",
           b.sizes(), ")");
  }
  check_matrix(a, "mat_a");
  check_matrix(b, "mat_b");
  if ((a2 || b2) != offs.has_value()) refuse(op, "offs is needed exactly when an operand is 2D");
  if (offs && (offs->dim() != 1 || offs->scalar_type() != at::kInt)) {
    refuse(op, "offs must be a 1D int32 tensor, got ", offs->scalar_type(), " ", offs->sizes());
  }
  if (a2 && b2) return {offs->size(0), a.size(0), b.size(1)};
  if (a2 || b2) {
    const int64_t batch = a2 ? b.size(0) : a.size(0);
    if (offs->size(0) != batch) refuse(op, "matrix batch sizes have to match");
    return a2 ? std::vector<int64_t>{a.size(0), b.size(-1)}
              : std::vector<int64_t>{a.size(1), b.size(1)};
  }
  if (a.size(0) != b.size(0)) refuse(op, "batched dimension has to match");
  return {a.size(0), a.size(1), b.size(-1)};
}

// _grouped_mm(Tensor self, Tensor mat2, Tensor? offs, Tensor? bias, ScalarType? out_dtype).
bool grouped_mm(torch::jit::Stack* stack, size_t base, size_t n_args) {
  auto& s = *stack;
  if (n_args < 5 || !s[base + 3].isNone()) return false;  // a bias: the Meta kernel's rules
  const at::Tensor a = s[base].toTensor(), b = s[base + 1].toTensor();
  const c10::optional<at::Tensor> offs =
      s[base + 2].isNone() ? c10::nullopt : c10::optional<at::Tensor>(s[base + 2].toTensor());
  const std::vector<int64_t> size = grouped_mm_size(a, b, offs);
  if (!s[base + 4].isNone() && s[base + 4].toScalarType() != a.scalar_type()) {
    refuse("torch._grouped_mm", "out_dtype must be None or the inputs' dtype on cpu");
  }
  at::Tensor out = empty_fake(size, a.scalar_type(), c10::Device(c10::kCPU));
  torch::jit::drop(s, n_args);
  s.emplace_back(std::move(out));
  return true;
}

}  // namespace

CpuRule cpu_rule_for(const c10::FunctionSchema& schema) {
  if (schema.name() == "aten::histc" && schema.overload_name().empty()) return CpuRule::kHistc;
  if (schema.name() == "aten::_grouped_mm") return CpuRule::kGroupedMm;
  return CpuRule::kNone;
}

bool apply_cpu_rule(CpuRule rule, torch::jit::Stack* stack, size_t n_args) {
  const size_t base = stack->size() - n_args;
  switch (rule) {
    case CpuRule::kHistc:
      return histc(*stack, base);
    case CpuRule::kGroupedMm:
      return grouped_mm(stack, base, n_args);
    case CpuRule::kNone:
      break;
  }
  return false;
}

}  // namespace metaload
