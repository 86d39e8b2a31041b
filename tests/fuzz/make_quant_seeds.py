"""Writes tests/fuzz/seeds/quant/: one small input per quantization layout for quant_fuzzer, each
"<config.json>\\0<safetensors file>". The bitsandbytes seeds hold real quant_state blobs written by
bitsandbytes itself (run in the torch 2.x environment: $(tools/torch2_env)/bin/python)."""
import json
import os

import torch
from safetensors.torch import save

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "seeds", "quant")


def seed(name, quantization_config, tensors, **config_fields):
    config = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4,
              "num_key_value_heads": 4, "intermediate_size": 128,
              "quantization_config": quantization_config, **config_fields}
    with open(os.path.join(OUT, name), "wb") as f:
        f.write(json.dumps(config).encode() + b"\0" + save(tensors))


def bnb4(quant_type, double):
    import bitsandbytes.functional as F
    w = torch.randn(16, 64, dtype=torch.bfloat16)
    packed, state = F.quantize_4bit(w, blocksize=64, quant_type=quant_type,
                                    compress_statistics=double)
    t = {"m.o_proj.weight": packed}
    for k, v in state.as_dict(packed=True).items():
        t["m.o_proj.weight." + k] = v
    t["m.norm.weight"] = torch.ones(64, dtype=torch.bfloat16)
    seed(f"bnb-{quant_type}{'-dq' if double else ''}",
         {"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": quant_type,
          "bnb_4bit_use_double_quant": double}, t)


def main():
    os.makedirs(OUT, exist_ok=True)
    torch.manual_seed(0)
    for qt in ("nf4", "fp4"):
        for dq in (False, True):
            bnb4(qt, dq)
    seed("bnb-int8", {"quant_method": "bitsandbytes", "load_in_8bit": True},
         {"m.q_proj.weight": torch.zeros(16, 64, dtype=torch.int8), "m.q_proj.SCB": torch.ones(16),
          "m.q_proj.weight_format": torch.tensor(0, dtype=torch.uint8)})
    seed("gptq", {"quant_method": "gptq", "bits": 4, "group_size": 32},
         {"m.layers.0.down_proj.qweight": torch.zeros(8, 16, dtype=torch.int32),
          "m.layers.0.down_proj.qzeros": torch.zeros(2, 2, dtype=torch.int32),
          "m.layers.0.down_proj.scales": torch.zeros(2, 16, dtype=torch.float16),
          "m.layers.0.down_proj.g_idx": torch.zeros(64, dtype=torch.int32)})
    # A head count no int64 holds (found by the fuzzer: identity/tp_degree.cc cast it, undefined behaviour).
    seed("gptq-float-heads", {"quant_method": "gptq", "bits": 4, "group_size": 32},
         {"m.layers.0.down_proj.qweight": torch.zeros(8, 16, dtype=torch.int32),
          "m.layers.0.down_proj.qzeros": torch.zeros(2, 2, dtype=torch.int32),
          "m.layers.0.down_proj.scales": torch.zeros(2, 16, dtype=torch.float16)},
         num_attention_heads=4.44444e75)
    seed("awq", {"quant_method": "awq", "bits": 4, "group_size": 32, "version": "gemm"},
         {"m.layers.0.up_proj.qweight": torch.zeros(64, 2, dtype=torch.int32),
          "m.layers.0.up_proj.qzeros": torch.zeros(2, 2, dtype=torch.int32),
          "m.layers.0.up_proj.scales": torch.zeros(2, 16, dtype=torch.float16)})
    seed("fp8", {"quant_method": "fp8", "weight_block_size": [16, 32]},
         {"m.q_proj.weight": torch.zeros(16, 64, dtype=torch.float8_e4m3fn),
          "m.q_proj.weight_scale_inv": torch.ones(1, 2)})
    groups = {"group_0": {"targets": ["Linear"], "weights": {
        "num_bits": 4, "type": "int", "strategy": "group", "group_size": 32, "symmetric": False}}}
    seed("ct-pack", {"quant_method": "compressed-tensors", "format": "pack-quantized",
                     "config_groups": groups},
         {"m.q_proj.weight_packed": torch.zeros(16, 8, dtype=torch.int32),
          "m.q_proj.weight_scale": torch.ones(16, 2, dtype=torch.bfloat16),
          "m.q_proj.weight_shape": torch.tensor([16, 64]),
          "m.q_proj.weight_zero_point": torch.zeros(2, 2, dtype=torch.int32)})
    nv = {"group_0": {"targets": ["Linear"], "weights": {
        "num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16}}}
    seed("ct-nvfp4", {"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized",
                      "config_groups": nv},
         {"m.q_proj.weight_packed": torch.zeros(16, 32, dtype=torch.uint8),
          "m.q_proj.weight_scale": torch.ones(16, 4).to(torch.float8_e4m3fn),
          "m.q_proj.weight_global_scale": torch.ones(1),
          "m.q_proj.input_global_scale": torch.ones(1)})
    inferred()


def inferred():
    """The same tensors without a quantization_config: the scheme a dequantizing load reads off
    the tensors (loader/format/quant_layout.h infer_quant_config)."""
    for name in ("gptq", "awq", "bnb-nf4-dq", "bnb-fp4", "bnb-int8", "fp8", "ct-nvfp4"):
        with open(os.path.join(OUT, name), "rb") as f:
            data = f.read()
        with open(os.path.join(OUT, "inferred-" + name), "wb") as f:
            f.write(b'{"model_type": "llama"}' + data[data.index(b"\0"):])


if __name__ == "__main__":
    main()
