// libFuzzer target: model key parsing. An accepted key must be written back by to_model_key and
// parse to the same key again (the json.dumps form is a fixed point).
#include <cstdint>
#include <cstdlib>
#include <string>

#include "model/model_key.h"

using namespace metaload;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  ModelKey k;
  try {
    k = from_model_key(text);
  } catch (const ModelKeyError&) {
    return 0;
  }
  std::string canonical = to_model_key(k);
  ModelKey again = from_model_key(canonical);
  if (!(again == k) || to_model_key(again) != canonical) std::abort();
  return 0;
}
