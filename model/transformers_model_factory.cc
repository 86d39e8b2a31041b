// TransformersModel and model keys: the registry's factory for metaload.TransformersModel (and
// its nnsight aliases), from_model_key and to_model_key.
#include <fmt/format.h>

#include "base/text.h"
#include "identity/registry.h"
#include "model/transformers_model.h"
#include "model/transformers_model_impl.h"

namespace metaload {
namespace {

std::shared_ptr<TransformersModel> factory(const ModelKey& key, const ModelOptions& options) {
  return std::make_shared<TransformersModel>(key, options);
}

[[maybe_unused]] const bool kFactoryRegistered = [] {
  set_model_factory(kTransformersModel, ModelFactory(&factory));
  return true;
}();

}  // namespace

void check_transformers_model_key(const ModelKey& key) {
  if (canonical_model_class(key.class_path) != kTransformersModel)
    throw ModelKeyError(fmt::format("the key's class {} is not {}", quote_text(key.class_path),
                                    kTransformersModel));
  for (const auto& [name, value] : key.extra) {
    // nnsight's TransformersModel keys name their pipeline task; a causal LM's is the one metaload
    // builds. Anything else would build another model than the key means.
    if (name == "task" && value == "text-generation") continue;
    throw ModelKeyError(fmt::format(
        "model key field {}{} is not supported: {} builds causal language models (task "
        "\"text-generation\") from repo_id and revision only",
        quote_text(name),
        name == "task" ? " = " + quote_text(value.is_string() ? value.get<std::string>()
                                                              : python_json_dumps(value))
                       : std::string(),
        kTransformersModel));
  }
}

std::shared_ptr<TransformersModel> TransformersModel::from_model_key(std::string_view key,
                                                                     ModelOptions options) {
  const ModelKey parsed = metaload::from_model_key(key, options.keys);
  const std::string canonical = canonical_model_class(parsed.class_path);
  const auto make = model_factory<ModelFactory>(canonical);
  if (!make)
    throw ModelKeyError(
        fmt::format("no factory builds class {} (key {})", canonical, std::string(key)));
  return (*make)(parsed, options);
}

std::string TransformersModel::to_model_key() const {
  return to_model_key(options_.keys);
}

std::string TransformersModel::to_model_key(const KeyOptions& keys) const {
  if (load_ref_.empty())
    throw ModelError(
        fmt::format("{} was built from a module: it has no repo id for a key", reference_));
  return metaload::to_model_key(
      ModelKey{kTransformersModel, repo_id_ ? *repo_id_ : load_ref_, revision_, {}}, keys);
}

}  // namespace metaload
