// libFuzzer target: the safetensors header parser on whole files held in memory. Beyond "no crash,
// no sanitizer report", every accepted header must satisfy the format's invariants and survive a
// write/parse round trip through the writer's header.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "loader/format/safetensors.h"
#include "loader/format/writer.h"

using namespace metaload;

namespace {

void check(bool ok) {
  if (!ok) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view bytes(reinterpret_cast<const char*>(data), size);
  SafetensorsHeader h;
  try {
    h = parse_safetensors_bytes(bytes, "fuzz.safetensors");
  } catch (const FormatError& e) {
    check(!e.rule().empty());
    return 0;
  }
  // Accepted: contiguous offsets from 0 to the end of the file, sizes that match their shapes.
  uint64_t expected = 0;
  std::vector<TensorSpec> specs;
  for (const auto& t : h.tensors) {
    check(t.begin == expected && t.end >= t.begin);
    check(t.nbytes() == tensor_nbytes(t.dtype, t.shape, "", t.name));
    check(h.find(t.name) == &t);
    expected = t.end;
    specs.push_back({t.name, t.dtype, t.shape});
  }
  check(h.data_start + expected == size);
  // The writer's header for the same tensors parses back to the same tensors.
  sort_for_writing(specs);
  std::string json = SafetensorsWriter::header_json(specs, h.metadata);
  SafetensorsHeader back = parse_safetensors_header(json, 8 + json.size() + expected, "roundtrip");
  check(back.tensors.size() == h.tensors.size() && back.metadata == h.metadata);
  for (const auto& t : back.tensors) {
    const TensorInfo* o = h.find(t.name);
    check(o && o->dtype == t.dtype && o->shape == t.shape && o->nbytes() == t.nbytes());
  }
  return 0;
}
