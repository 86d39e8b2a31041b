"""Every quantization_config field metaload reads, against what the libraries themselves accept
(transformers' GPTQConfig / AwqConfig / BitsAndBytesConfig / FineGrainedFP8Config,
compressed-tensors' QuantizationArgs validators, bitsandbytes' and AutoAWQ's kernels): one row per
scheme / field / value, run through describe, estimate and the dequantizing load. A row the
libraries accept works in all three (and the load gives quant_refs' numpy dequantization); any
other is the same typed error in all three, naming the field, with nothing loaded. Per-channel
GPTQ and AWQ (group_size -1, common in real checkpoints) dequantize end to end. Both torches."""
import copy
import os

import numpy as np
import pytest
import torch

import metaload
from quant_refs import (awq_tensors, bnb4_tensors, bnb8_tensors, ct_config, ct_int_tensors,
                        fp8_tensors, gptq_tensors, nvfp4_tensors, write_safetensors)

OUT, IN = 64, 128
MOD = "model.layers.0.mlp.up_proj"  # inside a repeated block: GPTQ and AWQ quantize only those
LLAMA = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": IN,
         "intermediate_size": OUT, "num_hidden_layers": 1, "num_attention_heads": 2,
         "num_key_value_heads": 2, "vocab_size": 32, "torch_dtype": "bfloat16"}
DEL = object()  # an override that removes the field

BASE = {
    "gptq": {"quant_method": "gptq", "bits": 4, "group_size": 32, "desc_act": False, "sym": True},
    "awq": {"quant_method": "awq", "bits": 4, "group_size": 32, "zero_point": True,
            "version": "gemm"},
    "bnb4": {"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "nf4",
             "bnb_4bit_use_double_quant": False},
    "bnb8": {"quant_method": "bitsandbytes", "load_in_8bit": True},
    "fp8": {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
            "weight_block_size": [32, 64]},
    "ct": ct_config("pack-quantized", bits=4, group=32),
    "nvfp4": ct_config("nvfp4-pack-quantized"),
}
WEIGHTS = "config_groups.*.weights."


def config_of(family, overrides):
    c = copy.deepcopy(BASE[family])
    target = c["config_groups"]["group_0"]["weights"] if family in ("ct", "nvfp4") else c
    for k, v in overrides.items():
        if v is DEL:
            target.pop(k, None)
        else:
            target[k] = v
    return c


def effective_group(c, default):
    g = c.get("group_size", c.get("q_group_size", default))
    return IN if g == -1 else g


def tensors_for(family, c, rng):
    """The checkpoint a config that the libraries accept describes, and its dequantization."""
    if family == "gptq":
        bits = c.get("bits", 4)
        t, refs = gptq_tensors(rng, MOD, OUT, IN, bits=bits, group=effective_group(c, 128),
                               act_order=bool(c.get("desc_act")), bias=False)
        fmt = str(c.get("checkpoint_format", c.get("format", "gptq"))).lower()
        return t, refs[0 if fmt == "gptq_v2" else 1]
    if family == "awq":
        return awq_tensors(rng, MOD, OUT, IN, group=effective_group(c, 128))
    if family == "bnb4":
        return bnb4_tensors(rng, MOD, OUT, IN, quant_type=c.get("bnb_4bit_quant_type", "fp4"),
                            nested=bool(c.get("bnb_4bit_use_double_quant")), nested_block=4)
    if family == "bnb8":
        return bnb8_tensors(rng, MOD, OUT, IN)
    if family == "fp8":
        t, ref, _, _ = fp8_tensors(rng, MOD, OUT, IN, tuple(c.get("weight_block_size", [128, 128])))
        return t, ref
    w = c["config_groups"]["group_0"]["weights"]
    if family == "ct":
        g = w.get("group_size")
        return ct_int_tensors(rng, MOD, OUT, IN, bits=w["num_bits"],
                              group=None if g in (None, -1) else g,
                              symmetric=w.get("symmetric", True))
    return nvfp4_tensors(rng, MOD, OUT, IN, group=w.get("group_size", 16))


# (family, overrides, None: accepted | (rule, the field the message names))
ROWS = [
    # GPTQ (transformers GPTQConfig.post_init: bits in 2, 3, 4, 8; group_size > 0 or -1)
    ("gptq", {}, None),
    ("gptq", {"group_size": -1}, None),
    ("gptq", {"group_size": -1, "desc_act": True}, None),
    ("gptq", {"group_size": 128}, None),
    ("gptq", {"group_size": DEL}, None),
    ("gptq", {"group_size": -1, "bits": 8, "checkpoint_format": "gptq_v2"}, None),
    ("gptq", {"bits": 2}, None),
    ("gptq", {"desc_act": True, "sym": False}, None),
    ("gptq", {"format": "gptq_v2"}, None),
    ("gptq", {"checkpoint_format": "GPTQ"}, None),
    ("gptq", {"group_size": 0}, ("invalid-field", "group_size")),
    ("gptq", {"group_size": -2}, ("invalid-field", "group_size")),
    ("gptq", {"group_size": 2 ** 64 - 1}, ("invalid-field", "group_size")),
    ("gptq", {"group_size": "128"}, ("invalid-field", "group_size")),
    ("gptq", {"group_size": 32.0}, ("invalid-field", "group_size")),
    ("gptq", {"bits": 5}, ("invalid-field", "bits")),
    ("gptq", {"bits": 2 ** 32 + 4}, ("invalid-field", "bits")),
    ("gptq", {"bits": True}, ("invalid-field", "bits")),
    ("gptq", {"desc_act": "yes"}, ("invalid-field", "desc_act")),
    ("gptq", {"sym": 1}, ("invalid-field", "sym")),
    ("gptq", {"checkpoint_format": "marlin"}, ("unsupported-scheme", "checkpoint_format")),
    ("gptq", {"format": "bitblas"}, ("unsupported-scheme", "format")),
    # AWQ (AwqConfig; AutoAWQ's WQLinear_GEMM: 4 bits, group_size > 0 or -1)
    ("awq", {}, None),
    ("awq", {"group_size": -1}, None),
    ("awq", {"group_size": DEL, "q_group_size": 64, "bits": DEL, "w_bit": 4}, None),
    ("awq", {"version": "GEMM"}, None),
    ("awq", {"version": DEL, "format": "gemm"}, None),
    ("awq", {"group_size": 0}, ("invalid-field", "group_size")),
    ("awq", {"group_size": -8}, ("invalid-field", "group_size")),
    ("awq", {"group_size": DEL, "q_group_size": 0}, ("invalid-field", "q_group_size")),
    ("awq", {"bits": 8}, ("invalid-field", "bits")),
    ("awq", {"zero_point": "true"}, ("invalid-field", "zero_point")),
    ("awq", {"version": "gemv"}, ("unsupported-scheme", "version")),
    ("awq", {"version": DEL, "format": "gemv_fast"}, ("unsupported-scheme", "format")),
    ("awq", {"version": "fast"}, ("invalid-field", "version")),
    # bitsandbytes (BitsAndBytesConfig; bitsandbytes' nf4 / fp4)
    ("bnb4", {}, None),
    ("bnb4", {"bnb_4bit_quant_type": "fp4"}, None),
    ("bnb4", {"bnb_4bit_use_double_quant": True}, None),
    ("bnb4", {"bnb_4bit_quant_storage": "uint8"}, None),
    ("bnb4", {"bnb_4bit_quant_type": "nf8"}, ("invalid-field", "bnb_4bit_quant_type")),
    ("bnb4", {"bnb_4bit_quant_type": 4}, ("invalid-field", "bnb_4bit_quant_type")),
    ("bnb4", {"bnb_4bit_use_double_quant": "no"}, ("invalid-field", "bnb_4bit_use_double_quant")),
    ("bnb4", {"bnb_4bit_quant_storage": "int4"}, ("invalid-field", "bnb_4bit_quant_storage")),
    ("bnb4", {"load_in_4bit": "true"}, ("invalid-field", "load_in_4bit")),
    ("bnb4", {"load_in_8bit": True}, ("invalid-field", "load_in_8bit")),
    ("bnb8", {}, None),
    ("bnb8", {"llm_int8_skip_modules": ["lm_head"]}, None),
    ("bnb8", {"load_in_8bit": 1}, ("invalid-field", "load_in_8bit")),
    ("bnb8", {"llm_int8_skip_modules": "lm_head"}, ("invalid-field", "llm_int8_skip_modules")),
    # FP8 blocks (FineGrainedFP8Config: two positive block sizes, default [128, 128])
    ("fp8", {}, None),
    ("fp8", {"weight_block_size": DEL}, None),
    ("fp8", {"activation_scheme": "static"}, None),
    ("fp8", {"scale_fmt": "float"}, None),
    ("fp8", {"weight_block_size": [0, 64]}, ("invalid-field", "weight_block_size")),
    ("fp8", {"weight_block_size": [-32, 64]}, ("invalid-field", "weight_block_size")),
    ("fp8", {"weight_block_size": [32]}, ("invalid-field", "weight_block_size")),
    ("fp8", {"weight_block_size": [32.0, 64]}, ("invalid-field", "weight_block_size")),
    ("fp8", {"weight_block_size": [2 ** 64 - 32, 64]}, ("invalid-field", "weight_block_size")),
    ("fp8", {"weight_block_size": None}, ("unsupported-scheme", "weight_block_size")),
    ("fp8", {"fmt": "e5m2"}, ("invalid-field", "fmt")),
    ("fp8", {"activation_scheme": "sometimes"}, ("invalid-field", "activation_scheme")),
    ("fp8", {"scale_fmt": "ue8m0"}, ("unsupported-scheme", "scale_fmt")),
    ("fp8", {"scale_fmt": "int"}, ("invalid-field", "scale_fmt")),
    # compressed-tensors pack-quantized (QuantizationArgs: a missing strategy follows from
    # group_size; group needs group_size > 0, and group_size > 0 needs group; 1 to 8 bits)
    ("ct", {}, None),
    ("ct", {"strategy": DEL}, None),
    ("ct", {"strategy": "channel", "group_size": DEL}, None),
    ("ct", {"strategy": DEL, "group_size": -1}, None),
    ("ct", {"strategy": "channel", "group_size": -1}, None),
    ("ct", {"strategy": "GROUP"}, None),
    ("ct", {"type": "INT", "symmetric": False}, None),
    ("ct", {"num_bits": 8}, None),
    ("ct", {"num_bits": 3, "group_size": 64}, None),
    ("ct", {"group_size": 0}, ("invalid-field", WEIGHTS + "group_size")),
    ("ct", {"group_size": 0, "strategy": DEL}, ("invalid-field", WEIGHTS + "group_size")),
    ("ct", {"group_size": -2}, ("invalid-field", WEIGHTS + "group_size")),
    ("ct", {"group_size": DEL}, ("invalid-field", WEIGHTS + "group_size")),
    ("ct", {"strategy": "channel"}, ("invalid-field", WEIGHTS + "group_size")),
    ("ct", {"group_size": "32"}, ("invalid-field", WEIGHTS + "group_size")),
    ("ct", {"num_bits": 9}, ("invalid-field", WEIGHTS + "num_bits")),
    ("ct", {"num_bits": 0}, ("invalid-field", WEIGHTS + "num_bits")),
    ("ct", {"num_bits": 2 ** 32 + 4}, ("invalid-field", WEIGHTS + "num_bits")),
    ("ct", {"type": "float"}, ("invalid-field", WEIGHTS + "type")),
    ("ct", {"type": "fixed"}, ("invalid-field", WEIGHTS + "type")),
    ("ct", {"symmetric": "no"}, ("invalid-field", WEIGHTS + "symmetric")),
    ("ct", {"strategy": "bogus"}, ("invalid-field", WEIGHTS + "strategy")),
    ("ct", {"strategy": "tensor", "group_size": DEL}, ("unsupported-scheme", "strategy")),
    # compressed-tensors NVFP4 (tensor_group, group_size > 0, symmetric)
    ("nvfp4", {}, None),
    ("nvfp4", {"group_size": 0}, ("invalid-field", WEIGHTS + "group_size")),
    ("nvfp4", {"group_size": -1}, ("invalid-field", WEIGHTS + "group_size")),
    ("nvfp4", {"symmetric": False}, ("unsupported-scheme", "symmetric")),
    ("nvfp4", {"num_bits": 8}, ("invalid-field", WEIGHTS + "type")),
    ("nvfp4", {"strategy": "channel", "group_size": DEL}, ("invalid-field", WEIGHTS + "strategy")),
]


def row_id(row):
    family, overrides, want = row
    text = ",".join(f"{k}={'DEL' if v is DEL else v}" for k, v in overrides.items()) or "default"
    return f"{family}:{text}:{'ok' if want is None else want[0]}"


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """The unquantized checkpoint estimate sizes each scheme for."""
    d = str(tmp_path_factory.mktemp("base"))
    write_safetensors(os.path.join(d, "model.safetensors"),
                      {f"{MOD}.weight": ("BF16", [OUT, IN], bytes(2 * OUT * IN))},
                      dict(LLAMA))
    return d


def meta_model():
    with metaload.meta():
        up = torch.nn.Linear(IN, OUT, bias=False)
        layer = torch.nn.ModuleDict({"mlp": torch.nn.ModuleDict({"up_proj": up})})
        return torch.nn.ModuleDict({"model": torch.nn.ModuleDict(
            {"layers": torch.nn.ModuleList([layer])})})


def check_error(e, rule, field):
    assert e.rule == rule, str(e)
    assert repr(field)[1:-1] in str(e), (field, str(e))


@pytest.mark.parametrize("row", ROWS, ids=row_id)
def test_quantization_config_rules(tmp_path, base, row):
    family, overrides, want = row
    config = config_of(family, overrides)
    rng = np.random.default_rng(len(ROWS))
    tensors, ref = tensors_for(family, BASE[family] if want else config, rng)
    write_safetensors(str(tmp_path / "model.safetensors"), tensors,
                      dict(LLAMA, quantization_config=config))
    model = meta_model()
    if want is not None:
        with pytest.raises(metaload.QuantSchemeError) as e:
            metaload.describe(str(tmp_path))
        check_error(e.value, *want)
        assert "config.json" in str(e.value)
        with pytest.raises(metaload.QuantSchemeError) as e:
            metaload.estimate(base, config)
        check_error(e.value, *want)
        with pytest.raises(metaload.DequantError) as e:
            metaload.load_into(model, str(tmp_path), dequantize=torch.float32, progress=False)
        check_error(e.value, *want)
        assert all(p.is_meta for p in model.parameters())  # nothing loaded
        return
    info = metaload.describe(str(tmp_path))
    mods = {m["module"]: m for m in info.quantization["modules"]}
    assert mods[MOD]["shape"] == [OUT, IN]
    assert metaload.estimate(base, config).size_bytes > 0
    report = metaload.load_into(model, str(tmp_path), dequantize=torch.float32, progress=False)
    assert report.dequantized_keys == [f"{MOD}.weight"]
    got = model.state_dict()[f"{MOD}.weight"]
    assert torch.equal(got, torch.from_numpy(ref)), family


@pytest.mark.parametrize("family", ["gptq", "awq"])
def test_per_channel_dequantizes_with_one_scale_row(tmp_path, family):
    """group_size -1: one group spanning each row (scales [1, out], g_idx all 0 for GPTQ): every
    input of a column shares its scale and zero point."""
    rng = np.random.default_rng(7)
    config = config_of(family, {"group_size": -1})
    tensors, ref = tensors_for(family, config, rng)
    assert tensors[f"{MOD}.scales"][1] == [1, OUT]
    write_safetensors(str(tmp_path / "model.safetensors"), tensors,
                      dict(LLAMA, quantization_config=config))
    assert metaload.describe(str(tmp_path)).quantization.get("group_size") is None  # per row
    model = meta_model()
    metaload.load_into(model, str(tmp_path), dequantize=torch.float32, progress=False)
    got = model.state_dict()[f"{MOD}.weight"]
    assert torch.equal(got, torch.from_numpy(ref))
    # The same checkpoint with group_size 128 (= in: one group too) gives the same weights.
    d2 = tmp_path / "g128"
    d2.mkdir()
    write_safetensors(str(d2 / "model.safetensors"), tensors,
                      dict(LLAMA, quantization_config=config_of(family, {"group_size": IN})))
    model2 = meta_model()
    metaload.load_into(model2, str(d2), dequantize=torch.float32, progress=False)
    assert torch.equal(model2.state_dict()[f"{MOD}.weight"], got)


@pytest.mark.parametrize("bits,group,rows,with_g_idx", [
    (4, 32, 15, True),   # 120 inputs: the scales' 4 groups of 32 fit both 120 and 128
    (4, -1, 8, True),    # per-channel: one scale row fits any input dim
    (8, 32, 30, True),
    (4, 32, 8, False),   # no g_idx: the scales say 4 groups where qweight's rows make 2
])
def test_a_bad_qweight_shape_is_blamed_on_qweight(tmp_path, bits, group, rows, with_g_idx):
    rng = np.random.default_rng(8)
    config = config_of("gptq", {"bits": bits, "group_size": group})
    tensors, _ = tensors_for("gptq", config, rng)
    dt, shape, data = tensors[f"{MOD}.qweight"]
    tensors[f"{MOD}.qweight"] = (dt, [rows, shape[1]], data[:rows * shape[1] * 4])
    if not with_g_idx:
        del tensors[f"{MOD}.g_idx"]
    write_safetensors(str(tmp_path / "model.safetensors"), tensors,
                      dict(LLAMA, quantization_config=config))
    model = meta_model()
    for call, kind in [(lambda: metaload.describe(str(tmp_path)), metaload.QuantLayoutError),
                       (lambda: metaload.load_into(model, str(tmp_path), dequantize=torch.float32,
                                                   progress=False), metaload.DequantError)]:
        with pytest.raises(kind) as e:
            call()
        text = str(e.value)
        if with_g_idx:
            assert e.value.rule == "packed-shape", text
            assert f"tensor '{MOD}.qweight'" in text
            assert f"shape [{rows}, {OUT}], expected [{IN * bits // 32}, {OUT}]" in text, text
            assert "g_idx and the scales" in text
        else:  # the scales disagree with qweight: they are named, and where the inputs came from
            assert e.value.rule == "scale-shape", text
            assert f"tensor '{MOD}.scales'" in text
            assert f"({rows} rows of '{MOD}.qweight')" in text, text
    assert all(p.is_meta for p in model.parameters())
