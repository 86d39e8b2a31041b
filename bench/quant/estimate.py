"""bench/quant: metaload.estimate(config, scheme) against the bytes the real quantization stores,
for every preset on the Llama-2-7B and Llama-3.2-1B configs (no weights needed), with the old
per-dtype table's figure (n_params x 0.5 / 1 byte) beside it.

"real": bitsandbytes and compressed-tensors quantize one random tensor of each distinct layer shape
with their own code on the CPU (bitsandbytes.functional.quantize_4bit + QuantState.as_dict(packed=
True), which Linear4bit saves; int8_vectorwise_quant for int8; compressed-tensors' ModelCompressor
on a Linear) and the bytes of what they produce are summed over the layers, plus the tensors every
scheme leaves alone; GPTQ, AWQ and FP8 (no library here) come from their documented layouts,
computed in this file. The anchor of each row is that real size: est/real and table/real are the
ratios; estimate time and peak RSS are beside them.

usage: METALOAD_LIB=... PYTHONPATH=python python bench/quant/estimate.py [--configs DIR]
"""
import argparse
import datetime
import json
import os
import resource
import time

os.environ.setdefault("TQDM_DISABLE", "1")  # the libraries' progress bars would break the table

import torch

import metaload

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIGS = ("llama-2-7b", "llama-3.2-1b")
PRESETS = ("bnb-nf4", "bnb-nf4-dq", "bnb-fp4", "bnb-int8", "gptq-int4", "gptq-int8", "awq-int4",
           "fp8-block", "ct-w4a16", "ct-w4a16-asym", "ct-w8a16", "ct-nvfp4")
TORCH2 = int(torch.__version__.split(".")[0]) >= 2


def layers(config):
    """(module, out, in, count) of every linear layer of a Llama config, and the bytes of the rest."""
    h, inter, L = config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"]
    heads, kv = config["num_attention_heads"], config.get("num_key_value_heads") or config["num_attention_heads"]
    hd = config.get("head_dim") or h // heads
    item = {"bfloat16": 2, "float16": 2, "float32": 4}[config.get("torch_dtype", "float32")]
    shapes = [("q_proj", heads * hd, h), ("k_proj", kv * hd, h), ("v_proj", kv * hd, h),
              ("o_proj", h, heads * hd), ("gate_proj", inter, h), ("up_proj", inter, h),
              ("down_proj", h, inter)]
    heads_out = 1 if config.get("tie_word_embeddings") else 2
    rest = (heads_out * config["vocab_size"] * h + (2 * L + 1) * h) * item
    return [(n, o, i, L) for n, o, i in shapes], rest, item


def ceil(a, b):
    return -(-a // b)


# ---- the documented layouts (GPTQ, AWQ, FP8) -------------------------------------------------
def gptq(out, inp, bits):
    g = ceil(inp, 128)
    return inp * bits // 32 * out * 4 + g * (out * bits // 32) * 4 + g * out * 2 + inp * 4


def awq(out, inp, bits=4):
    g = inp // 128
    return inp * (out * bits // 32) * 4 + g * (out * bits // 32) * 4 + g * out * 2


def fp8(out, inp):
    return out * inp + ceil(out, 128) * ceil(inp, 128) * 4


# ---- the real libraries (torch 2.x) ----------------------------------------------------------
def bnb_bytes(preset, out, inp):
    import bitsandbytes.functional as F
    w = torch.randn(out, inp, dtype=torch.bfloat16)
    if preset == "bnb-int8":
        cb, scb, _ = F.int8_vectorwise_quant(w.half())
        return cb.numel() * cb.element_size() + scb.numel() * scb.element_size() + 1  # weight_format
    qt = "nf4" if "nf4" in preset else "fp4"
    packed, state = F.quantize_4bit(w, blocksize=64, quant_type=qt,
                                    compress_statistics=preset.endswith("-dq"))
    total = packed.numel() * packed.element_size()
    for v in state.as_dict(packed=True).values():
        total += v.numel() * v.element_size()
    return total


CT = {"ct-w4a16": "W4A16", "ct-w4a16-asym": "W4A16_ASYM", "ct-w8a16": "W8A16", "ct-nvfp4": "NVFP4"}


def ct_bytes(preset, out, inp):
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import (QuantizationConfig, QuantizationStatus,
                                                 apply_quantization_config, preset_name_to_scheme)
    from compressed_tensors.quantization.utils import calculate_qparams, generate_gparam
    model = torch.nn.Sequential(torch.nn.Linear(inp, out, bias=False, dtype=torch.bfloat16))
    qc = QuantizationConfig(config_groups={"g": preset_name_to_scheme(CT[preset], ["Linear"])})
    apply_quantization_config(model, qc)
    mod = model[0]
    w, args = mod.weight.data.float(), mod.quantization_scheme.weights
    glob = None
    if args.strategy == "tensor_group":
        glob = generate_gparam(-w.abs().amax().reshape(1), w.abs().amax().reshape(1))
        mod.weight_global_scale.data.copy_(glob)
    groups = w.reshape(out, -1, args.group_size) if args.group_size else w.reshape(out, 1, -1)
    scale, zp = calculate_qparams(groups.amin(-1), groups.amax(-1), args, global_scale=glob)
    mod.weight_scale.data.copy_(scale.to(mod.weight_scale.dtype).reshape(mod.weight_scale.shape))
    if hasattr(mod, "weight_zero_point"):
        mod.weight_zero_point.data.copy_(zp.to(mod.weight_zero_point.dtype).reshape(mod.weight_zero_point.shape))
    if hasattr(mod, "input_global_scale"):
        mod.input_global_scale.data.fill_(1.0)
    mod.quantization_status = QuantizationStatus.FROZEN
    ModelCompressor.from_pretrained_model(model, None).compress_model(model)
    return sum(t.numel() * t.element_size() for t in model.state_dict().values())


def real_bytes(preset, config):
    """Bytes of the quantized checkpoint, or None where the library is not here."""
    shapes, rest, _ = layers(config)
    cache = {}
    total = rest
    for _, out, inp, count in shapes:
        key = (out, inp)
        if key not in cache:
            if preset.startswith("bnb"):
                if not TORCH2:
                    return None
                cache[key] = bnb_bytes(preset, out, inp)
            elif preset.startswith("ct"):
                if not TORCH2:
                    return None
                cache[key] = ct_bytes(preset, out, inp)
            elif preset.startswith("gptq"):
                cache[key] = gptq(out, inp, 8 if preset.endswith("int8") else 4)
            elif preset.startswith("awq"):
                cache[key] = awq(out, inp)
            else:
                cache[key] = fp8(out, inp)
        total += count * cache[key]
    return total


def peak_rss_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", default=os.path.join(ROOT, "model", "families", "configs"))
    a = ap.parse_args()
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%MZ")
    print(f"bench/quant/estimate, torch {torch.__version__}, metaload {metaload.__version__}, {stamp}")
    print("real: the library's own bytes (bnb-*, ct-*: torch 2.x only) or the documented layout "
          "(gptq, awq, fp8); anchor of each row = real\n")
    print("| config | scheme | real GB | estimate GB | est/real | old table GB | table/real "
          "| max TP (unquantized) | estimate ms | peak RSS MiB |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name in CONFIGS:
        path = os.path.join(a.configs, name + ".json")
        with open(path) as f:
            config = json.load(f)
        for preset in PRESETS:
            t0 = time.perf_counter()
            e = metaload.estimate(path, preset)
            ms = (time.perf_counter() - t0) * 1e3
            real = real_bytes(preset, config)
            rr = f"{real / 1e9:.4f}" if real else "n/a (torch 2.x)"
            ratio = f"{e.size_bytes / real:.5f}" if real else "-"
            tratio = f"{e.table_bytes / real:.3f}" if real else f"{e.table_bytes / e.size_bytes:.3f} (of est.)"
            tp = f"{e.max_tp_size or 1} ({e.max_tp_size_unquantized or 1})"
            print(f"| {name} | {preset} | {rr} | {e.size_bytes / 1e9:.4f} | {ratio} | "
                  f"{e.table_bytes / 1e9:.4f} | {tratio} | {tp} | {ms:.1f} | {peak_rss_mib():.0f} |")


if __name__ == "__main__":
    main()
