// libFuzzer target: model key parsing. An accepted key must be written back by to_model_key and
// parse to the same key again (the json.dumps form is a fixed point). The key policy: an accepted
// key's repo id is a Hub repo id; a key refused for its repo id alone parses once local paths are
// allowed (unless the id holds a NUL byte).
#include <cstdint>
#include <cstdlib>
#include <string>

#include "identity/model_key.h"

using namespace metaload;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  const KeyOptions paths{/*allow_local_paths=*/true};
  ModelKey k;
  try {
    k = from_model_key(text);
  } catch (const RepoIdError& e) {
    try {
      if (from_model_key(text, paths).repo_id != e.repo_id()) std::abort();
    } catch (const RepoIdError& again) {
      if (again.rule() != "repo-id-nul") std::abort();
    }
    return 0;
  } catch (const ModelKeyError&) {
    return 0;
  }
  if (hub_repo_id_problem(k.repo_id) || !(from_model_key(text, paths) == k)) std::abort();
  std::string canonical = to_model_key(k);
  ModelKey again = from_model_key(canonical);
  if (!(again == k) || to_model_key(again) != canonical) std::abort();
  return 0;
}
