// The registry of model wrapper classes by class path, with aliases: keys minted by nnsight for the
// same checkpoint (nnsight.modeling.language.LanguageModel, nnsight.modeling.transformers.
// TransformersModel) resolve to metaload.TransformersModel. The model layer attaches a factory
// (its constructor) to a class later; the registry stores it type-erased. Thread-safe. Torch-free.
#pragma once

#include <any>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "identity/model_key.h"

namespace metaload {

inline constexpr const char* kTransformersModel = "metaload.TransformersModel";

struct ModelClass {
  std::string canonical;  // the canonical class path
  std::any factory;       // empty until the model layer registers one
};

// Registers (or keeps) a canonical class path. Registering an existing alias as a class is an
// error.
void register_model_class(const std::string& class_path);
// Makes `alias` resolve to `canonical`, which must be registered. Throws ModelKeyError otherwise.
void register_model_alias(const std::string& alias, const std::string& canonical);
// Attaches a factory (any callable type the model layer chooses) to a class or alias.
void set_model_factory(const std::string& class_path, std::any factory);

// The class of a path or alias, or nullopt when unknown.
std::optional<ModelClass> find_model_class(std::string_view class_path);
// The canonical path of a class or alias. Throws ModelKeyError naming the known class paths.
std::string canonical_model_class(std::string_view class_path);
// Every registered class path and alias, sorted.
std::vector<std::string> known_model_classes();

// The factory attached to a class, cast to F; nullopt when none is attached or it is another type.
template <typename F>
std::optional<F> model_factory(std::string_view class_path) {
  auto c = find_model_class(class_path);
  if (!c || !c->factory.has_value()) return std::nullopt;
  if (const F* f = std::any_cast<F>(&c->factory)) return *f;
  return std::nullopt;
}

}  // namespace metaload
