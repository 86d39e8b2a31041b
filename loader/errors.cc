// MismatchError's message and record (errors.h). Torch-free.
#include "loader/errors.h"

#include <utility>

#include <nlohmann/json.hpp>

#include "base/text.h"

namespace metaload {

namespace {

// "\n  <title>: <name><detail>" for the first kListMaxItems items, then how many more.
std::string list_block(const char* title, const std::vector<MismatchItem>& items) {
  std::string s;
  for (size_t i = 0; i < items.size() && i < kListMaxItems; ++i) {
    s += std::string("\n  ") + title + ": " + escape_text(items[i].name) + items[i].detail;
  }
  if (items.size() > kListMaxItems) s += "\n  " + and_more(items.size()) + " " + title;
  return s;
}

std::vector<std::string> names_of(const std::vector<MismatchItem>& items) {
  std::vector<std::string> out;
  out.reserve(items.size());
  for (const MismatchItem& i : items) out.push_back(i.name);
  return out;
}

}  // namespace

MismatchError::MismatchError(const std::string& summary, std::vector<MismatchItem> missing,
                             std::vector<MismatchItem> unexpected,
                             std::vector<MismatchItem> mismatched)
    : LoadError("MismatchError", summary + list_block("missing", missing) +
                                     list_block("unexpected", unexpected) +
                                     list_block("mismatched", mismatched)),
      missing_(names_of(missing)),
      unexpected_(names_of(unexpected)),
      mismatched_(names_of(mismatched)) {
  record_field("missing", missing_);
  record_field("unexpected", unexpected_);
  record_field("mismatched", mismatched_);
}

std::optional<std::string> mismatch_names_json(const std::string& message) {
  std::optional<std::string> data = error_data_json_exact("[metaload.MismatchError] " + message);
  if (!data) return std::nullopt;
  nlohmann::json j = nlohmann::json::parse(*data);
  return nlohmann::json{
      {"missing", j["missing"]}, {"unexpected", j["unexpected"]}, {"mismatched", j["mismatched"]}}
      .dump();
}

}  // namespace metaload
