// Progress of loads that Python code watches. A load started with a progress id (the Python
// package's load_into and TransformersModel, when the user passes a callback) stores the engine's
// latest figures under that id from the loading thread; torch.ops.metaload.load_progress reads
// them from another Python thread (torch releases the GIL while an operator or a custom-class
// method runs), which calls the user's callback -- a tqdm update, for example. A C++ function
// cannot call into Python here: the library does not link libpython. Torch-free.
#pragma once

#include <cstdint>
#include <functional>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "loader/engine/engine.h"

namespace metaload {

class ProgressBoard {
 public:
  static ProgressBoard& instance() {
    static ProgressBoard board;
    return board;
  }

  // An EngineOptions::progress callback that posts under `id` (ids are the caller's choice).
  std::function<void(const Progress&)> writer(int64_t id) {
    return [this, id](const Progress& p) {
      std::lock_guard<std::mutex> lock(mu_);
      posted_[id] = p;
    };
  }

  // {bytes_done, bytes_total} posted under `id`, or {} when nothing was; `release` forgets it.
  std::vector<int64_t> read(int64_t id, bool release) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = posted_.find(id);
    if (it == posted_.end()) return {};
    std::vector<int64_t> out = {static_cast<int64_t>(it->second.bytes_done),
                                static_cast<int64_t>(it->second.bytes_total)};
    if (release) posted_.erase(it);
    return out;
  }

 private:
  std::mutex mu_;
  std::unordered_map<int64_t, Progress> posted_;
};

}  // namespace metaload
