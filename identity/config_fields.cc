#include "identity/config_fields.h"

#include <fmt/format.h>

#include "base/text.h"

namespace metaload {
namespace {

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& item : items) out += (out.empty() ? "" : ", ") + item;
  return out;
}

}  // namespace

std::string config_excerpt(const nlohmann::json& value) {
  std::string text = value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (text.size() > 60) text = text.substr(0, 57) + "...";
  return text;
}

ConfigFields::ConfigFields(const nlohmann::json& object, std::string file, std::string prefix)
    : j_(object), file_(std::move(file)), prefix_(std::move(prefix)) {
  if (!j_.is_object()) {
    const std::string what = fmt::format("must be a JSON object, got {}", config_excerpt(j_));
    if (prefix_.empty()) throw ConfigError(file_, "", "config-not-object", "a config.json " + what);
    throw ConfigError(file_, prefix_.substr(0, prefix_.size() - 1), "config-not-object", what);
  }
}

ConfigFields ConfigFields::text_part() const {
  auto it = j_.find("text_config");
  if (it != j_.end() && it->is_object()) return ConfigFields(*it, file_, prefix_ + "text_config.");
  return *this;
}

ConfigFields ConfigFields::object(const char* field) const {
  return ConfigFields(at(field), file_, prefix_ + field + ".");
}

void ConfigFields::fail(const std::string& field, const char* rule, const std::string& what) const {
  throw ConfigError(file_, prefix_ + field, rule, what);
}

bool ConfigFields::has(const char* field) const {
  auto it = j_.find(field);
  return it != j_.end() && !it->is_null();
}
bool ConfigFields::contains(const char* field) const {
  return j_.contains(field);
}
const nlohmann::json& ConfigFields::at(const char* field) const {
  return j_.at(field);
}

int64_t ConfigFields::int_value(const char* field, int64_t lowest, int64_t highest,
                                const char* too_large) const {
  const nlohmann::json& v = j_.at(field);
  const char* kind = lowest > 0 ? "a positive integer" : "a non-negative integer";
  // Booleans are no numbers in nlohmann; integral floats (16.0) are refused as transformers'
  // modules refuse them: sizes must be JSON integers. Range before the cast: a uint64 above
  // INT64_MAX would wrap.
  if (!v.is_number_integer())
    fail(field, "config-not-integer", fmt::format("must be {}, got {}", kind, config_excerpt(v)));
  if (v.is_number_unsigned() ? v.get<uint64_t>() > static_cast<uint64_t>(highest)
                             : v.get<int64_t>() > highest)
    fail(field, "config-too-large",
         fmt::format("is {}, {} (at most {})", config_excerpt(v), too_large, highest));
  const int64_t n = v.get<int64_t>();
  if (n < lowest) fail(field, "config-not-positive", fmt::format("must be {}, got {}", kind, n));
  return n;
}

int64_t ConfigFields::positive_int(const char* field) const {
  if (!has(field))
    fail(field, "config-missing-field", "is missing (a positive integer is required)");
  return int_value(field, 1, kMaxConfigInt, "larger than any model's");
}
int64_t ConfigFields::positive_int_or(const char* field, int64_t fallback) const {
  return has(field) ? positive_int(field) : fallback;
}
int64_t ConfigFields::first_positive_int(std::initializer_list<const char*> aliases) const {
  for (const char* a : aliases)
    if (has(a)) return positive_int(a);
  return 0;
}
int64_t ConfigFields::count_or_zero(const char* field) const {
  return has(field) ? int_value(field, 0, kMaxConfigInt, "larger than any model's") : 0;
}
int64_t ConfigFields::layer_count(const char* field) const {
  if (!has(field))
    fail(field, "config-missing-field", "is missing (a positive integer is required)");
  return int_value(field, 1, kMaxConfigLayers, "more layers than metaload builds");
}

double ConfigFields::positive_number_value(const char* field) const {
  const nlohmann::json& v = j_.at(field);
  if (!v.is_number())
    fail(field, "config-not-number",
         fmt::format("must be a positive number, got {}", config_excerpt(v)));
  if (!(v.get<double>() > 0))
    fail(field, "config-not-positive",
         fmt::format("must be a positive number, got {}", config_excerpt(v)));
  return v.get<double>();
}
double ConfigFields::positive_number(const char* field) const {
  if (!has(field))
    fail(field, "config-missing-field", "is missing (a positive number is required)");
  return positive_number_value(field);
}
double ConfigFields::positive_number_or(const char* field, double fallback) const {
  return has(field) ? positive_number_value(field) : fallback;
}

bool ConfigFields::bool_or(const char* field, bool fallback) const {
  if (!has(field)) return fallback;
  const nlohmann::json& v = j_.at(field);
  if (!v.is_boolean())
    fail(field, "config-not-bool", fmt::format("must be true or false, got {}", config_excerpt(v)));
  return v.get<bool>();
}

std::string ConfigFields::string_or(const char* field, const std::string& fallback) const {
  if (!has(field)) return fallback;
  const nlohmann::json& v = j_.at(field);
  if (!v.is_string())
    fail(field, "config-not-string", fmt::format("must be a string, got {}", config_excerpt(v)));
  return v.get<std::string>();
}

std::string ConfigFields::first_name_of(const char* field) const {
  if (!has(field)) return "";
  const nlohmann::json& v = j_.at(field);
  if (!v.is_array() || v.empty() || !v[0].is_string())
    fail(field, "config-not-string",
         fmt::format("must be a list of class names, got {}", config_excerpt(v)));
  return v[0].get<std::string>();
}

std::string ConfigFields::one_of(const char* field, const std::string& fallback,
                                 const std::vector<std::string>& allowed) const {
  std::string value = string_or(field, fallback);
  for (const auto& a : allowed)
    if (a == value) return value;
  fail(field, "config-unsupported",
       fmt::format("has unsupported value {} (supported: {})", quote_text(value, '\''),
                   join(allowed)));
}

std::string config_model_type(const nlohmann::json& config) {
  if (!config.is_object()) return "";
  auto it = config.find("model_type");
  return it != config.end() && it->is_string() ? it->get<std::string>() : "";
}

std::string config_summary(const nlohmann::json& config) {
  if (!config.is_object()) return "present";
  const nlohmann::json* text = &config;
  if (auto it = config.find("text_config"); it != config.end() && it->is_object()) text = &*it;
  // The first field of `keys` holding a string, a first string of a list or an integer.
  auto first = [](const nlohmann::json& c, std::initializer_list<const char*> keys) -> std::string {
    for (const char* k : keys) {
      auto it = c.find(k);
      if (it == c.end()) continue;
      if (it->is_string()) return it->get<std::string>();
      if (it->is_array() && !it->empty() && it->front().is_string())
        return it->front().get<std::string>();
      if (it->is_number_integer()) return std::to_string(it->get<int64_t>());
    }
    return "";
  };
  std::string s = first(config, {"model_type"});
  if (std::string a = first(config, {"architectures"}); !a.empty())
    s += (s.empty() ? "" : " ") + ("(" + a + ")");
  if (std::string l = first(*text, {"num_hidden_layers", "n_layer"}); !l.empty())
    s += ", " + l + " layers";
  if (std::string h = first(*text, {"hidden_size", "n_embd"}); !h.empty()) s += ", hidden " + h;
  return s.empty() ? "present" : s;
}

}  // namespace metaload
