// The record of recent errors that the Python package reads (error.h). Torch-free.
#include "base/error.h"

#include <deque>
#include <mutex>

#include <nlohmann/json.hpp>

namespace metaload {

namespace {

struct Record {
  uint64_t id;
  std::string what;
  nlohmann::json data;
};

// Bounded: a long-lived server does not accumulate errors. Never destroyed: errors are made
// during exit too.
struct Records {
  std::mutex mu;
  uint64_t last_id = 0;
  std::deque<Record> entries;  // oldest first
  static Records& instance() {
    static Records* r = new Records();
    return *r;
  }
  Record* find(uint64_t id) {
    for (auto it = entries.rbegin(); it != entries.rend(); ++it) {
      if (it->id == id) return &*it;
    }
    return nullptr;
  }
};

std::string dump(const nlohmann::json& j) {
  // Names are kept as given; a byte that is not UTF-8 becomes U+FFFD in the JSON.
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

template <typename Value>
void add_field(uint64_t id, const char* name, const Value& value) {
  if (id == 0) return;
  try {
    Records& r = Records::instance();
    std::lock_guard<std::mutex> g(r.mu);
    if (Record* rec = r.find(id)) rec->data[name] = value;
  } catch (...) {  // out of memory: the error is raised without its record
  }
}

}  // namespace

uint64_t Error::record_error(const char* what, const char* kind,
                             const std::string& message) noexcept {
  try {
    Records& r = Records::instance();
    nlohmann::json data = {{"kind", kind}, {"message", message}};
    std::lock_guard<std::mutex> g(r.mu);
    r.entries.push_back({++r.last_id, what, std::move(data)});
    if (r.entries.size() > kErrorRecordsKept) r.entries.pop_front();
    return r.last_id;
  } catch (...) {
    return 0;
  }
}

void Error::record_field(const char* name, const std::string& value) const {
  add_field(record_, name, value);
}

void Error::record_field(const char* name, const std::vector<std::string>& values) const {
  add_field(record_, name, values);
}

std::optional<std::string> error_data_json(const std::string& text) {
  Records& r = Records::instance();
  std::lock_guard<std::mutex> g(r.mu);
  const Record* best = nullptr;
  for (auto it = r.entries.rbegin(); it != r.entries.rend(); ++it) {
    if ((best == nullptr || it->what.size() > best->what.size()) &&
        text.find(it->what) != std::string::npos) {
      best = &*it;
    }
  }
  if (best == nullptr) return std::nullopt;
  return dump(best->data);
}

std::optional<std::string> error_data_json_exact(const std::string& what) {
  Records& r = Records::instance();
  std::lock_guard<std::mutex> g(r.mu);
  for (auto it = r.entries.rbegin(); it != r.entries.rend(); ++it) {
    if (it->what == what) return dump(it->data);
  }
  return std::nullopt;
}

}  // namespace metaload
