"""Quantized checkpoints written by the real libraries on the CPU (issue 14): bitsandbytes NF4 /
FP4 (with and without double quantization) and int8 through transformers' BitsAndBytesConfig,
compressed-tensors pack-quantized int4 (symmetric and asymmetric) and NVFP4. describe reads their
exact stored bytes and logical parameter counts from the headers; estimate(ref, scheme), from the
unquantized checkpoint alone, is within 1% of what the library wrote (exact but for the few bytes
of a float in bitsandbytes' quant_state blob); a blob or shape broken by hand is a typed error.

transformers 5.x, bitsandbytes and compressed-tensors need torch 2.x (PyPI): on Debian's torch
1.13 this file is skipped (it says so)."""
import json
import os
import struct

import pytest
import torch

if int(torch.__version__.split(".")[0]) < 2:
    pytest.skip("the quantization libraries (transformers 5, bitsandbytes, compressed-tensors) need "
                "torch 2.x from PyPI; Debian's torch 1.13 has none of them", allow_module_level=True)
transformers = pytest.importorskip("transformers")
bnb = pytest.importorskip("bitsandbytes")
ct = pytest.importorskip("compressed_tensors")

import metaload  # noqa: E402
from quant_refs import ct_calibrate  # noqa: E402
from safetensors import safe_open  # noqa: E402


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A tiny Llama in bfloat16 (intermediate 768: compressed-tensors needs whole groups of 128)."""
    cfg = transformers.LlamaConfig(hidden_size=256, intermediate_size=768, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, vocab_size=1000,
                                   tie_word_embeddings=False)
    torch.manual_seed(0)
    d = str(tmp_path_factory.mktemp("base"))
    transformers.LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(d)
    return d


def stored(d):
    """Bytes of every tensor in the directory's safetensors files, read by safetensors itself."""
    total, params = 0, 0
    for f in os.listdir(d):
        if f.endswith(".safetensors"):
            with safe_open(os.path.join(d, f), "pt") as s:
                for k in s.keys():
                    t = s.get_tensor(k)
                    total += t.numel() * t.element_size()
    return total


def n_params(d):
    return sum(p.numel() for p in transformers.AutoModelForCausalLM.from_pretrained(d).parameters())


BNB = {
    "bnb-nf4": dict(load_in_4bit=True, bnb_4bit_quant_type="nf4"),
    "bnb-nf4-dq": dict(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True),
    "bnb-fp4": dict(load_in_4bit=True),
    "bnb-fp4-dq": dict(load_in_4bit=True, bnb_4bit_use_double_quant=True),
    "bnb-int8": dict(load_in_8bit=True),
}


@pytest.fixture(scope="module")
def bnb_dirs(base, tmp_path_factory):
    out = {}
    for preset, kwargs in BNB.items():
        d = str(tmp_path_factory.mktemp(preset))
        m = transformers.AutoModelForCausalLM.from_pretrained(
            base, quantization_config=transformers.BitsAndBytesConfig(**kwargs), device_map="cpu",
            dtype=torch.bfloat16)
        m.save_pretrained(d)
        out[preset] = d
    return out


def compress(base, preset, fmt, out_dir):
    """compressed-tensors' own quantize + pack: its scheme applied to the model, min-max scales
    computed with its calculate_qparams, then its ModelCompressor writes the checkpoint."""
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import (QuantizationConfig, apply_quantization_config,
                                                 preset_name_to_scheme)
    m = transformers.AutoModelForCausalLM.from_pretrained(base, dtype=torch.bfloat16)
    qc = QuantizationConfig(config_groups={"group_0": preset_name_to_scheme(preset, ["Linear"])},
                            ignore=["lm_head"])
    apply_quantization_config(m, qc)
    for mod in m.modules():
        scheme = getattr(mod, "quantization_scheme", None)
        if scheme is None:
            continue
        ct_calibrate(mod)
        if hasattr(mod, "input_global_scale"):
            mod.input_global_scale.data.fill_(1.0)
    compressor = ModelCompressor.from_pretrained_model(m, fmt)
    compressor.compress_model(m)
    m.save_pretrained(out_dir)
    compressor.update_config(out_dir)
    return out_dir


CT = {"ct-w4a16": ("W4A16", "pack-quantized"), "ct-w4a16-asym": ("W4A16_ASYM", "pack-quantized"),
      "ct-nvfp4a16": ("NVFP4A16", "nvfp4-pack-quantized"), "ct-nvfp4": ("NVFP4", "nvfp4-pack-quantized")}


@pytest.fixture(scope="module")
def ct_dirs(base, tmp_path_factory):
    return {p: compress(base, name, fmt, str(tmp_path_factory.mktemp(p))) for p, (name, fmt) in CT.items()}


def check(base, d, preset):
    real = stored(d)
    info = metaload.describe(d)
    assert info.size_bytes == real, preset
    assert info.n_params == n_params(base), preset
    assert info.quantization["n_modules"] == 14, preset  # 7 projections x 2 layers; lm_head left
    e = metaload.estimate(base, preset)
    assert abs(e.size_bytes - real) <= 0.01 * real, (preset, e.size_bytes, real)
    assert e.n_params == info.n_params
    print(f"{preset}: real {real} bytes, estimate {e.size_bytes} ({(e.size_bytes - real) / real:+.4%}),"
          f" old table {e.table_bytes} ({(e.table_bytes - real) / real:+.1%})")
    return e, real


@pytest.mark.parametrize("preset", sorted(BNB))
def test_bitsandbytes_files(base, bnb_dirs, preset):
    e, real = check(base, bnb_dirs[preset], preset)
    if preset == "bnb-int8":
        assert e.size_bytes == real
    else:  # only nested_offset's float repr may differ in length
        assert abs(e.size_bytes - real) <= 14 * 4


@pytest.mark.parametrize("preset", sorted(CT))
def test_compressed_tensors_files(base, ct_dirs, preset):
    e, real = check(base, ct_dirs[preset], preset)
    assert e.size_bytes == real


def rewrite(src, dst, edit):
    """Copies a checkpoint, with the tensors of model.safetensors changed by edit(dict)."""
    import shutil
    from safetensors.torch import load_file, save_file
    shutil.copytree(src, dst)
    tensors = load_file(os.path.join(src, "model.safetensors"))
    edit(tensors)
    save_file(tensors, os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})
    return dst


Q = "model.layers.0.self_attn.q_proj"


def test_broken_bitsandbytes_files_are_typed_errors(bnb_dirs, tmp_path):
    blob = Q + ".weight.quant_state.bitsandbytes__nf4"

    def bad_blob(t):
        t[blob] = torch.tensor(list(b'{"quant_type": "nf4", "blocksize": '), dtype=torch.uint8)

    def bad_absmax(t):
        t[Q + ".weight.absmax"] = t[Q + ".weight.absmax"][:-1].clone()

    def bad_weight(t):
        t[Q + ".weight"] = t[Q + ".weight"][:-8].clone()

    cases = [("bnb-nf4", bad_blob, "quant-state-blob", blob),
             ("bnb-nf4-dq", bad_absmax, "absmax-shape", Q + ".weight.absmax"),
             ("bnb-nf4", bad_weight, "packed-shape", Q + ".weight")]
    for i, (preset, edit, rule, tensor) in enumerate(cases):
        d = rewrite(bnb_dirs[preset], str(tmp_path / f"broken{i}"), edit)
        with pytest.raises(metaload.QuantLayoutError) as e:
            metaload.describe(d)
        assert e.value.rule == rule and f"'{tensor}'" in str(e.value), str(e.value)
        assert "model.safetensors" in str(e.value)
    # SCB of the wrong shape in an int8 file.
    d = rewrite(bnb_dirs["bnb-int8"], str(tmp_path / "int8"),
                lambda t: t.update({Q + ".SCB": t[Q + ".SCB"][:7].clone()}))
    with pytest.raises(metaload.QuantLayoutError) as e:
        metaload.describe(d)
    assert e.value.rule == "scale-shape" and f"'{Q}.SCB'" in str(e.value)


def test_broken_compressed_tensors_files_are_typed_errors(ct_dirs, tmp_path):
    d = rewrite(ct_dirs["ct-w4a16"], str(tmp_path / "scale"),
                lambda t: t.update({Q + ".weight_scale": t[Q + ".weight_scale"][:, :1].clone()}))
    with pytest.raises(metaload.QuantLayoutError) as e:
        metaload.describe(d)
    assert e.value.rule == "scale-shape"
    d = rewrite(ct_dirs["ct-w4a16"], str(tmp_path / "shape"),
                lambda t: t.update({Q + ".weight_shape": torch.tensor([256, 512])}))
    with pytest.raises(metaload.QuantLayoutError) as e:
        metaload.describe(d)
    assert e.value.rule == "packed-shape" and f"'{Q}.weight_packed'" in str(e.value)
