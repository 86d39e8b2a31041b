// libFuzzer target: bitsandbytes' quant_state blob parser (loader/load/dequant_layout.h), which
// reads JSON from checkpoint bytes. Accepted blobs must give a positive blocksize, a 2-d shape of
// non-negative dims whose element count fits in 63 bits, and, with double quantization, a positive
// nested blocksize; everything else must be a DequantError with rule "quant-state".
#include <cstdint>
#include <cstdlib>
#include <string>

#include "loader/load/dequant_layout.h"

using namespace metaload;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string blob(reinterpret_cast<const char*>(data), size);
  for (const char* qt : {"nf4", "fp4"}) {
    QuantWeight w;
    try {
      parse_quant_state(blob, qt, "model.safetensors", "w.weight.quant_state", w);
    } catch (const DequantError& e) {
      if (e.rule() != "quant-state") std::abort();
      continue;
    }
    if (w.group_size < 1 || w.out < 0 || w.in < 0) std::abort();
    if (w.in > 0 && w.out > (int64_t{1} << 62) / w.in) std::abort();
    if (w.nested && w.nested_block < 1) std::abort();
  }
  return 0;
}
