#include "identity/registry.h"

#include <algorithm>
#include <map>
#include <mutex>

#include "base/text.h"

namespace metaload {
namespace {

struct Registry {
  std::mutex mu;
  std::map<std::string, ModelClass, std::less<>> classes;   // canonical path -> class
  std::map<std::string, std::string, std::less<>> aliases;  // alias -> canonical path

  Registry() {
    classes[kTransformersModel] = ModelClass{kTransformersModel, {}};
    // Where nnsight's classes live (cls.__module__ + "." + cls.__name__ as nnsight mints keys).
    aliases["nnsight.modeling.language.LanguageModel"] = kTransformersModel;
    aliases["nnsight.modeling.transformers.TransformersModel"] = kTransformersModel;
  }

  // Caller holds mu.
  ModelClass* find(std::string_view path) {
    if (auto it = classes.find(path); it != classes.end()) return &it->second;
    if (auto a = aliases.find(path); a != aliases.end()) return &classes.at(a->second);
    return nullptr;
  }
};

Registry& registry() {
  static Registry r;
  return r;
}

}  // namespace

void register_model_class(const std::string& class_path) {
  Registry& r = registry();
  std::lock_guard<std::mutex> g(r.mu);
  if (r.aliases.count(class_path)) {
    throw ModelKeyError(quote_text(class_path) + " is already an alias of " +
                        quote_text(r.aliases.find(class_path)->second));
  }
  r.classes.try_emplace(class_path, ModelClass{class_path, {}});
}

void register_model_alias(const std::string& alias, const std::string& canonical) {
  Registry& r = registry();
  std::lock_guard<std::mutex> g(r.mu);
  if (!r.classes.count(canonical)) {
    throw ModelKeyError("cannot alias " + quote_text(alias) + " to unregistered class " +
                        quote_text(canonical));
  }
  if (r.classes.count(alias))
    throw ModelKeyError(quote_text(alias) + " is already a registered class");
  r.aliases[alias] = canonical;
}

void set_model_factory(const std::string& class_path, std::any factory) {
  Registry& r = registry();
  std::lock_guard<std::mutex> g(r.mu);
  ModelClass* c = r.find(class_path);
  if (!c)
    throw ModelKeyError("cannot attach a factory to unregistered class " + quote_text(class_path));
  c->factory = std::move(factory);
}

std::optional<ModelClass> find_model_class(std::string_view class_path) {
  Registry& r = registry();
  std::lock_guard<std::mutex> g(r.mu);
  if (ModelClass* c = r.find(class_path)) return *c;
  return std::nullopt;
}

std::string canonical_model_class(std::string_view class_path) {
  if (auto c = find_model_class(class_path)) return c->canonical;
  std::string known;
  for (const auto& k : known_model_classes()) known += (known.empty() ? "" : ", ") + k;
  throw ModelKeyError("unknown model class " + quote_text(class_path) + "; known: " + known);
}

std::vector<std::string> known_model_classes() {
  Registry& r = registry();
  std::lock_guard<std::mutex> g(r.mu);
  std::vector<std::string> v;
  for (const auto& [k, c] : r.classes) v.push_back(k);
  for (const auto& [a, c] : r.aliases) v.push_back(a);
  std::sort(v.begin(), v.end());
  return v;
}

}  // namespace metaload
