// libFuzzer target: the sharded index parser. Accepted indexes must name only plain shard file
// names, list them sorted and distinct, map every tensor to one of them, and keep metadata nested
// within kMaxJsonDepth (the index object is the first level).
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "loader/format/checkpoint.h"
#include "loader/format/json_util.h"

using namespace metaload;

namespace {

void check(bool ok) {
  if (!ok) std::abort();
}

// Levels of arrays and objects in v (1 for a flat one, 0 for a scalar), without recursion.
int depth(const nlohmann::json& v) {
  int most = 0;
  std::vector<std::pair<const nlohmann::json*, int>> todo{{&v, 1}};
  while (!todo.empty()) {
    auto [j, d] = todo.back();
    todo.pop_back();
    if (!j->is_structured()) continue;
    most = std::max(most, d);
    for (const auto& c : *j) todo.push_back({&c, d + 1});
  }
  return most;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  SafetensorsIndex idx;
  try {
    idx = parse_safetensors_index(text, "fuzz.index.json");
  } catch (const ShardError& e) {
    check(!e.rule().empty());
    return 0;
  }
  check(!idx.weight_map.empty());
  check(std::is_sorted(idx.shards.begin(), idx.shards.end()));
  check(std::adjacent_find(idx.shards.begin(), idx.shards.end()) == idx.shards.end());
  for (const auto& s : idx.shards) {
    check(!s.empty() && s != "." && s != ".." && s.find('/') == std::string::npos &&
          s.find('\\') == std::string::npos && s.find('\0') == std::string::npos);
  }
  for (const auto& [name, shard] : idx.weight_map) {
    check(std::binary_search(idx.shards.begin(), idx.shards.end(), shard));
  }
  check(depth(idx.metadata) + 1 <= kMaxJsonDepth);
  return 0;
}
