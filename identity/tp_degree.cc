#include "identity/tp_degree.h"

#include <numeric>
#include <string>

namespace metaload {
namespace {

const nlohmann::json& text_part(const nlohmann::json& config) {
  if (!config.is_object()) throw TPError("config is not a JSON object");
  auto it = config.find("text_config");
  // Multimodal configs keep the language model's sizes under text_config.
  if (it != config.end() && it->is_object()) return *it;
  return config;
}

// Sizes above this are no model's (heads, kv heads, intermediate size, experts); refusing them
// keeps the float check below inside int64 and the divisor listing in tp_degrees short.
constexpr int64_t kMaxField = (int64_t{1} << 31) - 1;

// The first present, non-null field among `names`; 0 when none (a zero value counts as absent).
int64_t field(const nlohmann::json& c, std::initializer_list<const char*> names) {
  for (const char* n : names) {
    auto it = c.find(n);
    if (it == c.end() || it->is_null()) continue;
    if (it->is_number_unsigned() && it->get<uint64_t>() <= static_cast<uint64_t>(kMaxField))
      return static_cast<int64_t>(it->get<uint64_t>());
    if (it->is_number_integer() && it->get<int64_t>() >= 0 && it->get<int64_t>() <= kMaxField)
      return it->get<int64_t>();
    if (it->is_number_float()) {
      // Range first: casting a double outside int64 to an integer is undefined behaviour.
      double d = it->get<double>();
      if (d >= 0 && d <= static_cast<double>(kMaxField) &&
          d == static_cast<double>(static_cast<int64_t>(d)))
        return static_cast<int64_t>(d);
    }
    throw TPError(std::string("config field \"") + n + "\" is " + it->dump() +
                  ", not an integer in [0, " + std::to_string(kMaxField) + "]");
  }
  return 0;
}

std::string list(const std::vector<int64_t>& v) {
  std::string s;
  for (int64_t x : v) s += (s.empty() ? "" : ", ") + std::to_string(x);
  return s;
}

}  // namespace

std::optional<int64_t> max_tp_size(const nlohmann::json& config, bool expert_parallel) {
  const nlohmann::json& c = text_part(config);
  int64_t values[] = {
      field(c, {"num_attention_heads", "n_head", "num_heads"}),
      field(c, {"num_key_value_heads", "num_kv_heads"}),
      field(c, {"intermediate_size", "n_inner", "ffn_dim"}),
      field(c, {"moe_intermediate_size"}),
      field(c, {"shared_expert_intermediate_size"}),
      expert_parallel ? moe_config(config).routed_experts : 0,
  };
  int64_t g = 0;
  for (int64_t v : values) g = std::gcd(g, v);  // gcd(0, v) = v: absent fields drop out
  if (g <= 1) return std::nullopt;
  return g;
}

MoeConfig moe_config(const nlohmann::json& config) {
  const nlohmann::json& c = text_part(config);
  MoeConfig m;
  for (const char* name : {"num_local_experts", "num_experts", "n_routed_experts"}) {
    if ((m.routed_experts = field(c, {name})) != 0) {
      m.routed_field = name;
      break;
    }
  }
  m.experts_per_token = field(c, {"num_experts_per_tok", "experts_per_token"});
  m.shared_experts = field(c, {"n_shared_experts"});
  m.shared_expert_intermediate_size = field(c, {"shared_expert_intermediate_size"});
  return m;
}

std::vector<int64_t> divisors(int64_t n) {
  std::vector<int64_t> out, high;
  // Divisors in pairs up to sqrt(n): the config fields are <= kMaxField, so at most ~46k steps.
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
