#include "loader/load/open_checkpoints.h"

#include <mutex>
#include <set>
#include <unordered_map>
#include <utility>

#include "base/torch_library.h"
#include "loader/errors.h"
#include "loader/load/dequant_load.h"

namespace metaload {
namespace {

struct Held {
  std::mutex mu;
  int64_t next = 1;
  std::unordered_map<int64_t, std::shared_ptr<const Checkpoint>> by_handle;

  static Held& get() {
    static Held* h = new Held;  // never destroyed: loads may run while the process exits
    return *h;
  }
};

}  // namespace

int64_t hold_checkpoint(Checkpoint c) {
  auto p = std::make_shared<const Checkpoint>(std::move(c));
  Held& h = Held::get();
  std::lock_guard<std::mutex> lock(h.mu);
  const int64_t handle = h.next++;
  h.by_handle.emplace(handle, std::move(p));
  return handle;
}

std::shared_ptr<const Checkpoint> held_checkpoint(int64_t handle) {
  Held& h = Held::get();
  std::lock_guard<std::mutex> lock(h.mu);
  auto it = h.by_handle.find(handle);
  if (it == h.by_handle.end()) {
    throw PlanError("checkpoint handle " + std::to_string(handle) +
                    " is not open (checkpoint_open returns one; checkpoint_close ends it)");
  }
  return it->second;
}

void close_checkpoint(int64_t handle) {
  Held& h = Held::get();
  std::lock_guard<std::mutex> lock(h.mu);
  h.by_handle.erase(handle);
}

std::vector<std::string> checkpoint_names(const Checkpoint& c, bool dequantized) {
  std::set<std::string> parts;
  std::vector<std::string> weights;
  if (dequantized) {
    for (const QuantModule& m : dequant_layout(c).modules) {
      for (const auto& [role, name] : m.parts) parts.insert(name);
      weights.push_back(m.name + ".weight");
    }
  }
  std::vector<std::string> names;
  for (const SafetensorsHeader& f : c.files) {
    for (const TensorInfo& t : f.tensors) {
      if (!parts.count(t.name)) names.push_back(t.name);
    }
  }
  names.insert(names.end(), weights.begin(), weights.end());
  return names;
}

namespace {

int64_t checkpoint_open_op(std::string ref, c10::optional<std::string> revision) {
  return hold_checkpoint(open_checkpoint(
      ref, revision ? std::optional<std::string>(*revision) : std::nullopt, /*keep_files=*/true));
}

std::vector<std::string> checkpoint_names_op(int64_t handle, bool dequantized) {
  return checkpoint_names(*held_checkpoint(handle), dequantized);
}

}  // namespace

METALOAD_LIBRARY_FRAGMENT(m) {
  m.def("checkpoint_open(str ref, str? revision=None) -> int", &checkpoint_open_op);
  m.def("checkpoint_names(int handle, bool dequantized=False) -> str[]", &checkpoint_names_op);
  m.def("checkpoint_close(int handle) -> ()", &close_checkpoint);
}

}  // namespace metaload
