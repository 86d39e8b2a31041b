// MismatchError's message and the process-wide record of its names (errors.h). Torch-free.
#include "loader/errors.h"

#include <deque>
#include <mutex>
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

// The names of the last few MismatchErrors, by message, for the Python package (which sees only
// the message). Bounded: a long-lived server does not accumulate them.
struct RecentMismatches {
  static constexpr size_t kKept = 4;
  std::mutex mu;
  std::deque<std::pair<std::string, std::string>> entries;  // message -> names JSON
  static RecentMismatches& instance() {
    static RecentMismatches* r = new RecentMismatches();  // never destroyed: used at exit too
    return *r;
  }
};

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
  std::string json = nlohmann::json{
      {"missing", missing_},
      {"unexpected", unexpected_},
      {"mismatched",
       mismatched_}}.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  RecentMismatches& r = RecentMismatches::instance();
  std::lock_guard<std::mutex> g(r.mu);
  r.entries.emplace_back(message(), std::move(json));
  if (r.entries.size() > RecentMismatches::kKept) r.entries.pop_front();
}

std::optional<std::string> mismatch_names_json(const std::string& message) {
  RecentMismatches& r = RecentMismatches::instance();
  std::lock_guard<std::mutex> g(r.mu);
  for (auto it = r.entries.rbegin(); it != r.entries.rend(); ++it) {
    if (it->first == message) return it->second;
  }
  return std::nullopt;
}

}  // namespace metaload
