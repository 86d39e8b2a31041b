#include "identity/tp_degree.h"

#include <numeric>
#include <string>

#include "identity/config_fields.h"

namespace metaload {
namespace {

std::string list(const std::vector<int64_t>& v) {
  std::string s;
  for (int64_t x : v) s += (s.empty() ? "" : ", ") + std::to_string(x);
  return s;
}

}  // namespace

std::optional<int64_t> max_tp_size(const nlohmann::json& config, bool expert_parallel,
                                   const std::string& file) {
  const ConfigFields c = ConfigFields(config, file).text_part();
  int64_t values[] = {
      c.first_positive_int({"num_attention_heads", "n_head", "num_heads"}),
      c.first_positive_int({"num_key_value_heads", "num_kv_heads"}),
      c.first_positive_int({"intermediate_size", "n_inner", "ffn_dim"}),
      c.count_or_zero("moe_intermediate_size"),
      c.count_or_zero("shared_expert_intermediate_size"),
      expert_parallel ? moe_config(config, file).routed_experts : 0,
  };
  int64_t g = 0;
  for (int64_t v : values) g = std::gcd(g, v);  // gcd(0, v) = v: absent fields drop out
  if (g <= 1) return std::nullopt;
  return g;
}

MoeConfig moe_config(const nlohmann::json& config, const std::string& file) {
  const ConfigFields c = ConfigFields(config, file).text_part();
  MoeConfig m;
  for (const char* name : {"num_local_experts", "num_experts", "n_routed_experts"}) {
    if ((m.routed_experts = c.count_or_zero(name)) != 0) {
      m.routed_field = name;
      break;
    }
  }
  m.experts_per_token = c.has("num_experts_per_tok") ? c.count_or_zero("num_experts_per_tok")
                                                     : c.count_or_zero("experts_per_token");
  m.shared_experts = c.count_or_zero("n_shared_experts");
  m.shared_expert_intermediate_size = c.count_or_zero("shared_expert_intermediate_size");
  return m;
}

std::vector<int64_t> divisors(int64_t n) {
  std::vector<int64_t> out, high;
  // Divisors in pairs up to sqrt(n): config fields are <= kMaxConfigInt, so at most ~46k steps.
  for (int64_t d = 1; d * d <= n; ++d) {
    if (n % d != 0) continue;
    out.push_back(d);
    if (d * d != n) high.push_back(n / d);
  }
  out.insert(out.end(), high.rbegin(), high.rend());
  return out;
}

std::vector<int64_t> tp_degrees(const nlohmann::json& config, bool expert_parallel) {
  auto m = max_tp_size(config, expert_parallel);
  if (!m) return {};
  return divisors(*m);
}

int64_t tp_degree_for(const nlohmann::json& config, int64_t n, bool expert_parallel) {
  if (n < 1) throw TPError("a TP degree must be at least 1, got " + std::to_string(n));
  auto degrees = tp_degrees(config, expert_parallel);
  if (degrees.empty()) {
    if (n == 1) return 1;
    throw TPError(
        "this model cannot be split by tensor parallelism (heads, kv heads and intermediate size "
        "have no common divisor above 1); only degree 1 works, " +
        std::to_string(n) + " was asked for");
  }
  for (int64_t d : degrees) {
    if (d >= n) return d;
  }
  throw TPError("no TP degree >= " + std::to_string(n) +
                " splits this model; degrees that work: " + list(degrees));
}

}  // namespace metaload
