// libFuzzer target: the sharded index parser. Accepted indexes must name only plain shard file
// names, list them sorted and distinct, and map every tensor to one of them.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "loader/checkpoint.h"

using namespace metaload;

namespace {

void check(bool ok) {
  if (!ok) std::abort();
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
  return 0;
}
