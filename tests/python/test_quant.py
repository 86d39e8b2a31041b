"""Quantized checkpoints (issue 14): describe's exact sizes and logical parameter counts from
headers, estimate(ref, scheme) against files written in each library's layout, the TP limits on
group boundaries, and the typed errors for checkpoints that contradict their quantization_config.

The GPTQ, AWQ and FP8 files are written here by an independent writer from the documented
layouts (both torches); the bitsandbytes and compressed-tensors files are written by the real
libraries on the CPU (test_quant_libraries.py, torch 2.x only)."""
import json
import os
import struct

import pytest

import metaload
from conftest import ROOT, run_cli

# ---------------------------------------------------------------------------------------------
# An independent safetensors writer: header JSON + zero data (or given bytes), as the format says.

NBYTES = {"F32": 4, "F16": 2, "BF16": 2, "I32": 4, "I64": 8, "U8": 1, "I8": 1, "F8_E4M3": 1}


def write_safetensors(path, tensors):
    """tensors: {name: (dtype, shape, bytes or None)}; returns the bytes of tensor data."""
    header, blobs, offset = {}, [], 0
    for name, (dtype, shape, data) in tensors.items():
        n = NBYTES[dtype]
        for d in shape:
            n *= d
        if data is not None:
            assert len(data) == n, name
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + n]}
        blobs.append(data if data is not None else bytes(n))
        offset += n
    text = json.dumps(header).encode()
    text += b" " * (-(8 + len(text)) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))
    return offset


HIDDEN, INTER, LAYERS, VOCAB = 256, 768, 2, 1000
PROJ = {"self_attn.q_proj": (256, 256), "self_attn.k_proj": (128, 256),
        "self_attn.v_proj": (128, 256), "self_attn.o_proj": (256, 256),
        "mlp.gate_proj": (INTER, 256), "mlp.up_proj": (INTER, 256), "mlp.down_proj": (256, INTER)}
CONFIG = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": HIDDEN,
          "intermediate_size": INTER, "num_hidden_layers": LAYERS, "num_attention_heads": 4,
          "num_key_value_heads": 2, "head_dim": 64, "vocab_size": VOCAB,
          "tie_word_embeddings": False, "torch_dtype": "bfloat16"}


def plain_tensors(dtype="BF16"):
    """The unquantized parameters: embeddings, head, norms (never quantized) and the projections."""
    t = {"model.embed_tokens.weight": (dtype, (VOCAB, HIDDEN), None),
         "lm_head.weight": (dtype, (VOCAB, HIDDEN), None),
         "model.norm.weight": (dtype, (HIDDEN,), None)}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = (dtype, (HIDDEN,), None)
        t[p + "post_attention_layernorm.weight"] = (dtype, (HIDDEN,), None)
    return t


def modules():
    for i in range(LAYERS):
        for proj, (out, inp) in PROJ.items():
            yield f"model.layers.{i}.{proj}", out, inp


def n_params():
    return 2 * VOCAB * HIDDEN + HIDDEN + 2 * LAYERS * HIDDEN + sum(o * i for _, o, i in modules())


# The documented layouts (Linear weight [out, in]).
def gptq(m, out, inp, bits=4, group=128):
    g = -(-inp // group)
    return {m + ".qweight": ("I32", (inp * bits // 32, out), None),
            m + ".qzeros": ("I32", (g, out * bits // 32), None),
            m + ".scales": ("F16", (g, out), None),
            m + ".g_idx": ("I32", (inp,), None)}


def awq(m, out, inp, bits=4, group=128):
    return {m + ".qweight": ("I32", (inp, out * bits // 32), None),
            m + ".qzeros": ("I32", (inp // group, out * bits // 32), None),
            m + ".scales": ("F16", (inp // group, out), None)}


def fp8(m, out, inp):
    return {m + ".weight": ("F8_E4M3", (out, inp), None),
            m + ".weight_scale_inv": ("F32", (-(-out // 128), -(-inp // 128)), None)}


LAYOUTS = {
    "gptq-int4": (gptq, {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False,
                         "sym": True}),
    "gptq-int8": (lambda m, o, i: gptq(m, o, i, bits=8),
                  {"quant_method": "gptq", "bits": 8, "group_size": 128}),
    "awq-int4": (awq, {"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemm",
                       "zero_point": True}),
    "fp8-block": (fp8, {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                        "weight_block_size": [128, 128]}),
}


def write_checkpoint(d, tensors, quantization_config=None):
    os.makedirs(d, exist_ok=True)
    config = dict(CONFIG)
    if quantization_config is not None:
        config["quantization_config"] = quantization_config
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(config, f)
    return write_safetensors(os.path.join(d, "model.safetensors"), tensors)


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("base"))
    t = plain_tensors()
    for m, out, inp in modules():
        t[m + ".weight"] = ("BF16", (out, inp), None)
    write_checkpoint(d, t)
    return d


def quantized(tmp_path, preset, edit=None):
    layout, qc = LAYOUTS[preset]
    t = plain_tensors()
    for m, out, inp in modules():
        t.update(layout(m, out, inp))
    if edit:
        edit(t)
    d = str(tmp_path / preset)
    return d, write_checkpoint(d, t, qc)


# ---------------------------------------------------------------------------------------------
# describe and estimate


@pytest.mark.parametrize("preset", sorted(LAYOUTS))
def test_estimate_equals_the_bytes_of_the_documented_layout(tmp_path, base, preset):
    d, stored = quantized(tmp_path, preset)
    info = metaload.describe(d)
    assert info.size_bytes == stored and info.n_params == n_params()
    q = info.quantization
    assert q["n_modules"] == 2 * len(PROJ) and q["n_quantized_params"] == sum(
        o * i for _, o, i in modules())
    assert q["weight_bytes"] + q["aux_bytes"] + q["unquantized_bytes"] == stored
    e = metaload.estimate(base, preset)
    assert e.size_bytes == stored and e.n_params == n_params() and e.source == "checkpoint"
    # The old per-dtype table: n_params x 0.5 (int4) or 1 (int8, fp8) bytes, which leaves out the
    # scales and counts the embeddings and head as quantized.
    bpe = 0.5 if preset.endswith("int4") else 1.0
    assert e.table_bytes == int(n_params() * bpe)
    assert e.table_error == pytest.approx((e.table_bytes - stored) / stored)
    print(f"{preset}: exact {stored} bytes, old table {e.table_bytes} ({e.table_error:+.1%})")


def test_describe_of_an_unquantized_checkpoint_is_unchanged(base):
    info = metaload.describe_checkpoint(base)
    assert info.quantization is None
    assert info.n_params == n_params() and info.size_bytes == 2 * n_params()
    assert info.dtype == "BF16" and info.max_tp_size == 2


def test_max_tp_size_falls_on_group_boundaries(tmp_path, base):
    # Unquantized: gcd(4 heads, 2 kv heads, 768) = 2. down_proj's 768 inputs are 6 groups of 128,
    # so a 4-way row split (192) would cut a group: with more heads the limit shows.
    config = dict(CONFIG, num_attention_heads=8, num_key_value_heads=8, head_dim=32)
    d, _ = quantized(tmp_path, "gptq-int4")
    with open(os.path.join(d, "config.json")) as f:
        qc = json.load(f)["quantization_config"]
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(dict(config, quantization_config=qc), f)
    info = metaload.describe(d)
    assert metaload.max_tp_size(config) == 8
    assert info.max_tp_size == 2 and info.quantization["max_tp_size_unquantized"] == 8
    assert "mlp.down_proj" in info.quantization["tp_limited_by"]
    assert "groups of 128" in info.quantization["tp_limited_by"]
    # Llama-2-7B's 11008 = 86 x 128 inputs of down_proj: GPTQ g128 splits 2 ways at most.
    e = metaload.estimate(os.path.join(ROOT, "model", "families", "configs", "llama-2-7b.json"),
                          "gptq-int4")
    assert (e.max_tp_size_unquantized, e.max_tp_size, e.source) == (32, 2, "config")


def test_estimate_of_a_config_with_a_hostile_layer_count_is_a_config_error(tmp_path):
    # 10^12 layers were listed tensor by tensor until memory ran out (a bare MemoryError). The
    # field is refused by the one config reader's rule, as the families' parser refuses it
    # (a ConfigError since issue 23; a FormatError "unsupported-config" before).
    with open(os.path.join(ROOT, "model", "families", "configs", "llama-2-7b.json")) as f:
        config = json.load(f)
    config["num_hidden_layers"] = 10**12
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(metaload.ConfigError) as e:
        metaload.estimate(str(tmp_path / "config.json"), "gptq-int4")
    assert (e.value.rule, e.value.field) == ("config-too-large", "num_hidden_layers")
    assert e.value.file == str(tmp_path / "config.json")
    assert "'num_hidden_layers' is 1000000000000" in str(e.value)
    assert "at most 65536" in str(e.value)


def test_contradicting_tensors_are_typed_errors_naming_file_tensor_and_rule(tmp_path):
    q = "model.layers.0.self_attn.q_proj"
    cases = [
        ("gptq-int4", lambda t: t.update({q + ".scales": ("F16", (3, 256), None)}), "scale-shape",
         q + ".scales"),
        ("gptq-int4", lambda t: t.update({q + ".qzeros": ("I32", (2, 64), None)}), "zeros-shape",
         q + ".qzeros"),
        ("gptq-int4", lambda t: t.pop(q + ".scales"), "missing-tensor", q + ".qweight"),
        ("fp8-block", lambda t: t.update({q + ".weight_scale_inv": ("F32", (2, 3), None)}),
         "scale-shape", q + ".weight_scale_inv"),
        ("gptq-int4", lambda t: t.update({q + ".weight_packed": ("I32", (8, 8), None)}),
         "foreign-tensor", q + ".weight_packed"),
    ]
    for preset, edit, rule, tensor in cases:
        d, _ = quantized(tmp_path, preset, edit)
        with pytest.raises(metaload.QuantLayoutError) as e:
            metaload.describe(d)
        assert e.value.rule == rule, (preset, rule, str(e.value))
        assert f"tensor '{tensor}'" in str(e.value)
        assert os.path.join(d, "model.safetensors") in str(e.value)
        assert isinstance(e.value, metaload.FormatError)


def test_awq_packing_under_a_gptq_config_is_a_packed_shape_error(tmp_path):
    layout, _ = LAYOUTS["awq-int4"]
    t = plain_tensors()
    for m, out, inp in modules():
        t.update(layout(m, out, inp))
    d = str(tmp_path / "mixed")
    write_checkpoint(d, t, LAYOUTS["gptq-int4"][1])
    with pytest.raises(metaload.QuantLayoutError) as e:
        metaload.describe(d)
    assert e.value.rule == "packed-shape" and ".qweight'" in str(e.value)
    assert "along the input dim" in str(e.value)


def test_unknown_schemes_are_typed_errors(tmp_path, base):
    d = str(tmp_path / "hqq")
    write_checkpoint(d, plain_tensors(), {"quant_method": "hqq", "nbits": 4})
    with pytest.raises(metaload.QuantSchemeError) as e:
        metaload.describe(d)
    assert e.value.rule == "unknown-scheme" and "config.json" in str(e.value)
    with pytest.raises(metaload.QuantSchemeError) as e:
        metaload.estimate(base, "gptq-int5")
    assert e.value.rule == "unknown-scheme" and "gptq-int4" in str(e.value)
    with pytest.raises(metaload.QuantSchemeError) as e:
        metaload.estimate(base, {"quant_method": "awq", "version": "gemv"})
    assert e.value.rule == "unsupported-scheme"
    # A group size that does not divide the inputs: AWQ refuses such a layer, and so does estimate.
    with pytest.raises(metaload.QuantSchemeError) as e:
        metaload.estimate(base, {"quant_method": "awq", "bits": 4, "group_size": 512})
    assert e.value.rule == "not-quantizable" and "'model.layers.0.self_attn.q_proj.weight'" in str(e.value)
    assert "256 inputs are not a multiple of the group size 512" in str(e.value)


def test_estimate_of_a_custom_config_and_the_presets(base):
    presets = metaload.quant_presets()
    assert {"bnb-nf4", "bnb-nf4-dq", "bnb-fp4", "bnb-int8", "gptq-int4", "awq-int4", "fp8-block",
            "ct-w4a16", "ct-nvfp4"} <= set(presets)
    custom = metaload.estimate(base, dict(presets["gptq-int4"], group_size=64))
    default = metaload.estimate(base, "gptq-int4")
    assert custom.scheme == "custom" and custom.size_bytes > default.size_bytes
    assert custom.quantization["group_size"] == 64


# ---------------------------------------------------------------------------------------------
# the command line


def test_cli_describe_json_has_the_per_module_breakdown(tmp_path):
    d, stored = quantized(tmp_path, "awq-int4")
    r = run_cli("describe", d, "--json")
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    assert j["size_bytes"] == stored and j["n_params"] == n_params()
    mods = {m["module"]: m for m in j["quantization"]["modules"]}
    down = mods["model.layers.1.mlp.down_proj"]
    assert down["shape"] == [256, 768] and down["n_params"] == 256 * 768
    assert down["weight_bytes"] == 768 * 256 // 2
    assert down["aux_bytes"] == 6 * 32 * 4 + 6 * 256 * 2
    r = run_cli("describe", d)
    assert r.returncode == 0 and "quantization" in r.stdout and "awq" in r.stdout


def test_cli_estimate(tmp_path, base):
    r = run_cli("estimate", base, "gptq-int4", "--json")
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    _, stored = quantized(tmp_path, "gptq-int4")
    assert j["size_bytes"] == stored and j["table_name"] == "int4"
    r = run_cli("estimate", base, "gptq-int4")
    assert r.returncode == 0 and "old table (int4)" in r.stdout and "off" in r.stdout
    r = run_cli("estimate", base, "nf5")
    assert r.returncode == 2 and "QuantSchemeError" in r.stderr and "unknown-scheme" in r.stderr
