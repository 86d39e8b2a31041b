// The one reader of config.json fields (issue 23): the families' parser (model/families/config.h),
// the published tensor lists (checkpoint_shapes.h), TP degrees and MoE counts (tp_degree.h),
// describe and estimate all read fields through ConfigFields, so a field is refused by one rule,
// with one message, whoever reads it. Torch-free.
//
// Every refusal is a ConfigError (identity/errors.h) naming the file and the field's dotted path,
// with one of these rules:
//   config-not-object     the document, text_config or a nested object is no JSON object
//   config-missing-field  a required field is absent or null
//   config-not-integer    an integer field holds a string, a bool, a float (16.0 included), ...
//   config-not-positive   a size or count below 1 (below 0 for counts where 0 means none)
//   config-too-large      above kMaxConfigInt, or a layer count above kMaxConfigLayers
//   config-not-number     a number field holds a string, a bool, ...
//   config-not-bool       a flag that is not true or false
//   config-not-string     a name that is not a string
//   config-unsupported    a value or feature no reader supports (model_type, activation, ...)
//   config-inconsistent   fields that contradict each other (heads that do not divide, ...)
//   config-not-found      no such config file or built-in config
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "identity/errors.h"

namespace metaload {

// Typed access to one JSON object of a config.json; the object must outlive the reader.
class ConfigFields {
 public:
  // `file` names the config in errors, `prefix` the object's path inside it ("rope_scaling.").
  // ConfigError (config-not-object) when `object` is no JSON object.
  ConfigFields(const nlohmann::json& object, std::string file, std::string prefix = "");

  // The language model's fields: text_config when it is an object (multimodal configs keep the
  // language model's sizes there), else this object.
  ConfigFields text_part() const;
  // The object held by `field` (config-not-object otherwise).
  ConfigFields object(const char* field) const;

  [[noreturn]] void fail(const std::string& field, const char* rule, const std::string& what) const;

  // Present and not null (transformers treats null as "use the default").
  bool has(const char* field) const;
  bool contains(const char* field) const;
  const nlohmann::json& at(const char* field) const;
  const nlohmann::json& json() const { return j_; }
  const std::string& file() const { return file_; }

  // Integers: JSON integers in [1, kMaxConfigInt].
  int64_t positive_int(const char* field) const;  // required
  int64_t positive_int_or(const char* field, int64_t fallback) const;
  // The first present, non-null field of `aliases` (n_head / num_attention_heads ...) as
  // positive_int; 0 when none is present.
  int64_t first_positive_int(std::initializer_list<const char*> aliases) const;
  // A count where 0 means none (experts, shared experts): [0, kMaxConfigInt]; 0 when absent.
  int64_t count_or_zero(const char* field) const;
  // A layer count: required, [1, kMaxConfigLayers].
  int64_t layer_count(const char* field) const;

  double positive_number(const char* field) const;  // required, > 0
  double positive_number_or(const char* field, double fallback) const;
  bool bool_or(const char* field, bool fallback) const;
  std::string string_or(const char* field, const std::string& fallback) const;
  // The first entry of a list of names ("architectures"), "" when absent; config-not-string
  // unless a non-empty list starting with a string.
  std::string first_name_of(const char* field) const;
  // string_or, refusing values outside `allowed` (config-unsupported, listing them).
  std::string one_of(const char* field, const std::string& fallback,
                     const std::vector<std::string>& allowed) const;

 private:
  int64_t int_value(const char* field, int64_t lowest, int64_t highest,
                    const char* too_large) const;
  double positive_number_value(const char* field) const;

  const nlohmann::json& j_;
  std::string file_;
  std::string prefix_;
};

// The first 60 characters of a value's JSON text, for messages.
std::string config_excerpt(const nlohmann::json& value);

// The model_type of a config when it is a string, else "": for telling a family apart without
// judging the config (estimate's Conv1D layout), never throws.
std::string config_model_type(const nlohmann::json& config);

// One line for tools: "<model_type> (<architecture>), <layers> layers, hidden <size>", from the
// fields that are present and well typed (text_config first); "present" when none is. Never
// throws: describe shows odd configs too.
std::string config_summary(const nlohmann::json& config);

}  // namespace metaload
