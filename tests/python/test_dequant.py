"""Dequantizing loads: load_into(model, path, dequantize=dtype) on GPTQ, AWQ, bitsandbytes
NF4/FP4/int8, FP8 and compressed-tensors (pack-quantized int, NVFP4) checkpoints written by
quant_refs.py (each library's documented layout),
against quant_refs' own numpy dequantization; tensor-parallel slices on pack/group boundaries;
typed errors for malformed checkpoints with nothing half-loaded; the torch ops dequant_*.
Comparisons with the real libraries (bitsandbytes, compressed-tensors) are in
test_dequant_libraries.py (torch 2.x). Runs on both torches."""
import json
import os

import numpy as np
import pytest
import torch

import metaload
from metaload import _lib
from quant_refs import (awq_tensors, bnb4_tensors, bnb8_tensors, ct_config, ct_int_tensors,
                        fp8_tensors, gptq_tensors, nvfp4_tensors, rounded, write_safetensors)

OUT, IN = 64, 128  # every Linear below is [OUT, IN]
DTYPES = {torch.bfloat16: "bfloat16", torch.float32: "float32", torch.float16: "float16"}


class Block(torch.nn.Module):
    def __init__(self, bias=True):
        super().__init__()
        self.q_proj = torch.nn.Linear(IN, OUT, bias=bias)
        self.o_proj = torch.nn.Linear(IN, OUT, bias=bias)
        self.norm = torch.nn.LayerNorm(OUT)


class Tiny(torch.nn.Module):
    """Two blocks of quantized Linears and an unquantized norm, as a quantizer leaves them."""

    def __init__(self, bias=True):
        super().__init__()
        self.layers = torch.nn.ModuleList([Block(bias), Block(bias)])


def meta_model(bias=True, dtype=torch.bfloat16):
    with metaload.meta():
        return Tiny(bias).to(dtype)


def norms(rng):
    t = {}
    for i in range(2):
        t[f"layers.{i}.norm.weight"] = ("F32", [OUT], rng.random(OUT).astype(np.float32).tobytes())
        t[f"layers.{i}.norm.bias"] = ("F32", [OUT], rng.random(OUT).astype(np.float32).tobytes())
    return t


def linears():
    return [f"layers.{i}.{p}" for i in range(2) for p in ("q_proj", "o_proj")]


def write(tmp_path, tensors, config):
    path = str(tmp_path / "model.safetensors")
    write_safetensors(path, tensors, {"quantization_config": config} if config else None)
    return path


def check(model, refs, dtype, report, extra=()):
    want = sorted([f"{p}.weight" for p in refs] + list(extra))
    assert sorted(report.dequantized_keys) == want
    state = model.state_dict()
    for prefix, ref in refs.items():
        w = state[f"{prefix}.weight"]
        assert w.dtype == dtype and w.device.type == "cpu" and tuple(w.shape) == ref.shape
        expect = torch.from_numpy(rounded(ref, DTYPES[dtype])).to(dtype)
        assert torch.equal(w, expect), prefix


def gptq_checkpoint(tmp_path, bits=4, act_order=False, fmt="gptq", group=32, seed=0):
    rng = np.random.default_rng(seed)
    tensors, refs = norms(rng), {}
    for p in linears():
        t, r = gptq_tensors(rng, p, OUT, IN, bits=bits, group=group, act_order=act_order)
        tensors.update(t)
        refs[p] = r[1 if fmt == "gptq" else 0]
    config = {"quant_method": "gptq", "bits": bits, "group_size": group, "desc_act": act_order,
              "sym": False, "checkpoint_format": fmt}
    return write(tmp_path, tensors, config), refs


@pytest.mark.parametrize("bits,act_order,fmt,dtype", [
    (4, False, "gptq", torch.bfloat16),
    (4, True, "gptq", torch.float32),
    (8, False, "gptq_v2", torch.bfloat16),
    (4, True, "gptq_v2", torch.float16),
])
def test_gptq(tmp_path, bits, act_order, fmt, dtype):
    path, refs = gptq_checkpoint(tmp_path, bits, act_order, fmt)
    model = meta_model()
    report = metaload.load_into(model, path, dequantize=dtype, progress=False)
    check(model, refs, dtype, report)
    # The unquantized tensors load as usual; the biases (f16 in the file) take the module's dtype.
    assert model.layers[0].norm.weight.dtype == torch.bfloat16
    assert model.layers[1].q_proj.bias.dtype == torch.bfloat16
    assert not any(p.is_meta for p in model.parameters())


def test_gptq_without_config_by_shapes(tmp_path):
    """Without config.json the scheme, bits and group size follow from the shapes (v1 zeros)."""
    path, refs = gptq_checkpoint(tmp_path, 8, False, "gptq")
    os.remove(tmp_path / "config.json")
    assert metaload.quant_layout(path)["method"] == ""
    assert {w["scheme"] for w in metaload.quant_layout(path)["weights"]} == {"gptq"}
    model = meta_model()
    check(model, refs, torch.bfloat16,
          metaload.load_into(model, path, dequantize=torch.bfloat16, progress=False))


def test_awq(tmp_path):
    rng = np.random.default_rng(1)
    tensors, refs = norms(rng), {}
    for p in linears():
        t, r = awq_tensors(rng, p, OUT, IN, group=32)
        tensors.update(t)
        refs[p] = r
    path = write(tmp_path, tensors, {"quant_method": "awq", "bits": 4, "group_size": 32,
                                     "zero_point": True, "version": "gemm"})
    layout = metaload.quant_layout(path)
    assert layout["method"] == "awq" and len(layout["weights"]) == 4
    assert layout["weights"][0]["parts"].keys() == {"q", "zeros", "scales"}
    model = meta_model(bias=False)
    report = metaload.load_into(model, path, dequantize=torch.float32, progress=False)
    check(model, refs, torch.float32, report)


@pytest.mark.parametrize("quant_type,nested", [("nf4", False), ("fp4", False), ("nf4", True)])
def test_bnb4(tmp_path, quant_type, nested):
    rng = np.random.default_rng(2)
    tensors, refs = norms(rng), {}
    for p in linears():
        t, r = bnb4_tensors(rng, p, OUT, IN, quant_type=quant_type, nested=nested, nested_block=4)
        tensors.update(t)
        tensors[f"{p}.bias"] = ("F32", [OUT], rng.random(OUT).astype(np.float32).tobytes())
        refs[p] = r
    path = write(tmp_path, tensors, {"quant_method": "bitsandbytes", "load_in_4bit": True,
                                     "bnb_4bit_quant_type": quant_type,
                                     "bnb_4bit_use_double_quant": nested})
    model = meta_model()
    report = metaload.load_into(model, path, dequantize=torch.bfloat16, progress=False)
    check(model, refs, torch.bfloat16, report)


def test_bnb8(tmp_path):
    rng = np.random.default_rng(3)
    tensors, refs = norms(rng), {}
    for p in linears():
        t, r = bnb8_tensors(rng, p, OUT, IN)
        tensors.update(t)
        tensors[f"{p}.bias"] = ("F32", [OUT], rng.random(OUT).astype(np.float32).tobytes())
        refs[p] = r
    path = write(tmp_path, tensors, {"quant_method": "bitsandbytes", "load_in_8bit": True})
    model = meta_model()
    check(model, refs, torch.float32,
          metaload.load_into(model, path, dequantize=torch.float32, progress=False))


def fp8_checkpoint(tmp_path, out=OUT, inp=IN, block=(128, 128), seed=4):
    rng = np.random.default_rng(seed)
    tensors, refs = {}, {}
    for p in linears():
        t, r, _, _ = fp8_tensors(rng, p, out, inp, block)
        tensors.update(t)
        refs[p] = r
    config = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
              "weight_block_size": list(block)}
    return write(tmp_path, tensors, config), refs


def test_fp8_block_scales(tmp_path):
    """Partial blocks at both ends (out 200 = 128 + 72, in 72 < 128), on both torches (1.13 has no
    float8 dtype: the bytes are decoded by the kernels)."""
    global OUT, IN
    path, refs = fp8_checkpoint(tmp_path, 200, 72)

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleList(
                [torch.nn.ModuleDict({"q_proj": torch.nn.Linear(72, 200, bias=False),
                                      "o_proj": torch.nn.Linear(72, 200, bias=False)})
                 for _ in range(2)])

    with metaload.meta():
        model = M()
    report = metaload.load_into(model, path, dequantize=torch.bfloat16, progress=False)
    check(model, refs, torch.bfloat16, report)


@pytest.mark.skipif(not hasattr(torch, "float8_e4m3fn"), reason="torch 1.13 has no float8 dtype")
def test_fp8_decoding_matches_torch():
    """Every e4m3fn byte decodes as torch's own float8_e4m3fn -> float32."""
    q = torch.arange(256, dtype=torch.uint8).reshape(16, 16)
    ones = torch.ones(1, 1)
    got = torch.ops.metaload.dequant_fp8(q, ones, [128, 128], torch.float32)
    want = q.view(torch.float8_e4m3fn).float()
    assert torch.equal(got.isnan(), want.isnan())
    assert torch.equal(got[~got.isnan()], want[~want.isnan()])


def ct_checkpoint(tmp_path, bits=4, group=32, symmetric=True, scale_dtype="BF16", seed=11):
    rng = np.random.default_rng(seed)
    tensors, refs = norms(rng), {}
    for p in linears():
        t, r = ct_int_tensors(rng, p, OUT, IN, bits, group, symmetric, scale_dtype)
        tensors.update(t)
        refs[p] = r
    return write(tmp_path, tensors, ct_config("pack-quantized", bits, group, symmetric)), refs


def nvfp4_checkpoint(tmp_path, seed=12):
    rng = np.random.default_rng(seed)
    tensors, refs = norms(rng), {}
    for p in linears():
        t, r = nvfp4_tensors(rng, p, OUT, IN)
        tensors.update(t)
        refs[p] = r
    return write(tmp_path, tensors, ct_config("nvfp4-pack-quantized")), refs


@pytest.mark.parametrize("bits,group,symmetric,scale_dtype,dtype", [
    (4, 32, True, "BF16", torch.bfloat16),    # W4A16
    (4, 32, False, "BF16", torch.float32),    # W4A16_ASYM
    (8, 64, True, "F16", torch.float16),      # W8A16
    (3, None, False, "BF16", torch.float32),  # channel strategy; 3-bit fields straddle words
])
def test_compressed_tensors_pack_quantized(tmp_path, bits, group, symmetric, scale_dtype, dtype):
    path, refs = ct_checkpoint(tmp_path, bits, group, symmetric, scale_dtype)
    layout = metaload.quant_layout(path)
    assert layout["method"] == "compressed-tensors"
    assert {w["scheme"] for w in layout["weights"]} == {"ct-int"}
    assert set(layout["weights"][0]["parts"]) == (
        {"q", "scales", "shape"} | (set() if symmetric else {"zeros"}))
    model = meta_model(bias=False)
    check(model, refs, dtype, metaload.load_into(model, path, dequantize=dtype, progress=False))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_nvfp4(tmp_path, dtype):
    path, refs = nvfp4_checkpoint(tmp_path)
    model = meta_model(bias=False)
    report = metaload.load_into(model, path, dequantize=dtype, progress=False)
    check(model, refs, dtype, report)
    assert {w["scheme"] for w in metaload.quant_layout(path)["weights"]} == {"nvfp4"}


# ---- tensor parallelism --------------------------------------------------------------------------

PLAN = {"layers.*.q_proj": "colwise", "layers.*.o_proj": "rowwise"}


def tp_model(rank, size, bias=True):
    with metaload.meta():
        m = Tiny(bias).to(torch.bfloat16)
    for b in m.layers:
        with metaload.meta():
            b.q_proj = torch.nn.Linear(IN, OUT // size, bias=bias).to(torch.bfloat16)
            b.o_proj = torch.nn.Linear(IN // size, OUT, bias=bias).to(torch.bfloat16)
    return m


@pytest.mark.parametrize("scheme", ["gptq", "bnb4", "fp8_small_blocks", "ct_int_asym", "nvfp4"])
def test_tp_slices(tmp_path, scheme):
    """tp_size 2: each rank's q_proj (colwise) and o_proj (rowwise) weights are its slices of the
    full dequantized weights; the biases split with the weights (colwise) or stay whole."""
    if scheme == "gptq":
        path, refs = gptq_checkpoint(tmp_path, 4, False, "gptq", group=32)
    elif scheme == "fp8_small_blocks":
        path, refs = fp8_checkpoint(tmp_path, block=(16, 32))
    elif scheme == "ct_int_asym":  # zero points packed along out: 32 rows per rank, 4 words
        path, refs = ct_checkpoint(tmp_path, 4, 32, symmetric=False)
    elif scheme == "nvfp4":  # 64 inputs per rank: 4 groups of 16
        path, refs = nvfp4_checkpoint(tmp_path)
    else:
        rng = np.random.default_rng(5)
        tensors, refs = norms(rng), {}
        for p in linears():
            t, r = bnb4_tensors(rng, p, OUT, IN)
            tensors.update(t)
            refs[p] = r
        path = write(tmp_path, tensors, {"quant_method": "bitsandbytes", "load_in_4bit": True})
    bias = scheme == "gptq"
    for rank in range(2):
        model = tp_model(rank, 2, bias)
        report = metaload.load_into(model, path, dequantize=torch.float32, tp_rank=rank,
                                    tp_size=2, tp_plan=PLAN, progress=False, strict=bias)
        assert len(report.dequantized_keys) == 4
        for i in range(2):
            q = refs[f"layers.{i}.q_proj"][rank * OUT // 2:(rank + 1) * OUT // 2]
            o = refs[f"layers.{i}.o_proj"][:, rank * IN // 2:(rank + 1) * IN // 2]
            assert torch.equal(model.layers[i].q_proj.weight, torch.from_numpy(q))
            assert torch.equal(model.layers[i].o_proj.weight, torch.from_numpy(np.ascontiguousarray(o)))
            if bias:
                assert model.layers[i].q_proj.bias.shape == (OUT // 2,)
                assert model.layers[i].o_proj.bias.shape == (OUT,)


def test_tp_degree_off_group_boundaries(tmp_path):
    """GPTQ groups of 32 over 128 input rows: rowwise degree 8 (16 rows each) splits groups; the
    error names the constraint and the degrees that work, and nothing loads."""
    path, _ = gptq_checkpoint(tmp_path, 4, False, "gptq", group=32)
    model = tp_model(0, 8)
    with pytest.raises(metaload.DequantError) as e:
        metaload.load_into(model, path, dequantize=torch.bfloat16, tp_rank=0, tp_size=8,
                           tp_plan=PLAN, progress=False)
    assert e.value.rule == "tp-boundary"
    msg = str(e.value)
    assert "degree 8" in msg and "groups of 32" in msg and "layers.0.o_proj.weight" in msg
    assert "degrees that split it on boundaries: 1, 2, 4" in msg
    assert all(p.is_meta for p in model.parameters())


# ---- bad input: typed errors, nothing half-loaded ------------------------------------------------

def loaded_model(tmp_path):
    """A real model (values known) to load bad checkpoints into: they must leave it unchanged."""
    model = Tiny().to(torch.bfloat16)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    return model, before


def assert_unchanged(model, before):
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k


def bad_gptq(tmp_path, mutate, config_extra=None):
    rng = np.random.default_rng(6)
    tensors = norms(rng)
    for p in linears():
        tensors.update(gptq_tensors(rng, p, OUT, IN, bits=4, group=32)[0])
    config = {"quant_method": "gptq", "bits": 4, "group_size": 32}
    config.update(config_extra or {})
    mutate(tensors)
    return write(tmp_path, tensors, config)


def expect_dequant_error(tmp_path, path, rule, tensor, *fragments):
    model, before = loaded_model(tmp_path)
    with pytest.raises(metaload.DequantError) as e:
        metaload.load_into(model, path, dequantize=torch.bfloat16, progress=False)
    msg = str(e.value)
    assert e.value.rule == rule, msg
    assert f"tensor '{tensor}'" in msg and os.path.basename(path) in msg, msg
    for f in fragments:
        assert f in msg, msg
    assert_unchanged(model, before)
    return msg


def test_bad_scale_shape(tmp_path):
    def mutate(t):
        dt, shape, data = t["layers.1.o_proj.scales"]
        t["layers.1.o_proj.scales"] = (dt, [shape[0] // 2, shape[1]], data[:len(data) // 2])
    path = bad_gptq(tmp_path, mutate)
    expect_dequant_error(tmp_path, path, "scale-shape", "layers.1.o_proj.scales",
                         "shape [2, 64], expected [4, 64]", "groups of 32 (config.json)")


def test_bad_packed_shape(tmp_path):
    """qweight holds 64 input rows where g_idx (the logical input dim) has 128."""
    def mutate(t):
        dt, shape, data = t["layers.0.q_proj.qweight"]
        t["layers.0.q_proj.qweight"] = (dt, [shape[0] // 2, shape[1]], data[:len(data) // 2])
    path = bad_gptq(tmp_path, mutate)
    expect_dequant_error(tmp_path, path, "packed-shape", "layers.0.q_proj.qweight",
                         "shape [8, 64], expected [16, 64]")


def test_bad_zeros_and_g_idx(tmp_path):
    def zeros(t):
        dt, shape, data = t["layers.0.q_proj.qzeros"]
        t["layers.0.q_proj.qzeros"] = (dt, [shape[0] // 2, shape[1] * 2], data)
    expect_dequant_error(tmp_path, bad_gptq(tmp_path, zeros), "zeros-shape",
                         "layers.0.q_proj.qzeros")

    def g_idx(t):
        g = np.arange(IN, dtype=np.int32) // 32
        g[77] = 4  # groups 0..3 exist
        t["layers.1.q_proj.g_idx"] = ("I32", [IN], g.tobytes())
    expect_dequant_error(tmp_path, bad_gptq(tmp_path, g_idx), "g_idx-range",
                         "layers.1.q_proj.g_idx", "g_idx[77] = 4")


def test_config_contradicts_tensors(tmp_path):
    """GPTQ tensors under an AWQ config: g_idx is a tensor AWQ never stores."""
    path = bad_gptq(tmp_path, lambda t: None, {"quant_method": "awq"})
    msg = expect_dequant_error(tmp_path, path, "foreign-tensor", "layers.0.o_proj.g_idx",
                               "quant_method 'awq'", "a GPTQ tensor")
    # One error family: what a load rejects is a QuantLayoutError too, as describe's would be.
    assert issubclass(metaload.DequantError, metaload.QuantLayoutError)
    assert issubclass(metaload.QuantSchemeError, metaload.QuantLayoutError)
    assert "quantization_config says AWQ" in msg
    path = bad_gptq(tmp_path, lambda t: None, {"group_size": 64})
    expect_dequant_error(tmp_path, path, "scale-shape", "layers.0.o_proj.scales",
                         "expected [2, 64]", "groups of 64 (config.json)")


def test_unknown_scheme(tmp_path):
    path = bad_gptq(tmp_path, lambda t: None, {"quant_method": "hqq"})
    model, before = loaded_model(tmp_path)
    with pytest.raises(metaload.DequantError, match="'hqq' cannot be dequantized") as e:
        metaload.load_into(model, path, dequantize=torch.bfloat16, progress=False)
    assert e.value.rule == "unknown-scheme" and "config.json" in str(e.value)
    assert_unchanged(model, before)


@pytest.mark.parametrize("blob,detail", [
    (b"{not json", "not JSON"),
    (b"[1, 2]", "not a JSON object"),
    (json.dumps({"quant_type": "nf4", "shape": [64, 128]}).encode(), 'no integer "blocksize"'),
    (json.dumps({"quant_type": "nf4", "blocksize": 0, "shape": [64, 128]}).encode(),
     '"blocksize" is 0'),
    (json.dumps({"quant_type": "fp4", "blocksize": 64, "shape": [64, 128]}).encode(),
     "the tensor's name says nf4"),
    (json.dumps({"quant_type": "nf4", "blocksize": 64, "shape": [64, "x"]}).encode(),
     '"shape" is not [out, in]'),
    (json.dumps({"quant_type": "nf4", "blocksize": 64, "shape": [64, 128],
                 "nested_blocksize": 256}).encode(), 'a number "nested_offset"'),
])
def test_malformed_quant_state(tmp_path, blob, detail):
    rng = np.random.default_rng(7)
    tensors = norms(rng)
    for p in linears():
        tensors.update(bnb4_tensors(rng, p, OUT, IN)[0])
        tensors[f"{p}.bias"] = ("F32", [OUT], rng.random(OUT).astype(np.float32).tobytes())
    name = "layers.1.o_proj.weight.quant_state.bitsandbytes__nf4"
    tensors[name] = ("U8", [len(blob)], blob)
    path = write(tmp_path, tensors, None)
    expect_dequant_error(tmp_path, path, "quant-state-blob", name, detail)


def test_bnb4_packed_shape_against_quant_state(tmp_path):
    rng = np.random.default_rng(8)
    tensors = norms(rng)
    for p in linears():
        tensors.update(bnb4_tensors(rng, p, OUT, IN)[0])
        tensors[f"{p}.bias"] = ("F32", [OUT], rng.random(OUT).astype(np.float32).tobytes())
    name = "layers.0.q_proj.weight"
    dt, shape, data = tensors[name]
    tensors[name] = (dt, [shape[0] - 8, 1], data[:-8])
    path = write(tmp_path, tensors, None)
    expect_dequant_error(tmp_path, path, "packed-shape", name, "packs into 4096")


def test_bad_compressed_tensors(tmp_path):
    """Scales of the wrong shape, a packed weight that does not hold weight_shape, NVFP4 scales
    that do not cover the inputs: typed errors naming the tensor and the rule, nothing loaded."""
    rng = np.random.default_rng(13)

    def ct(mutate, fmt="pack-quantized"):
        tensors = norms(rng)
        for p in linears():
            tensors.update((ct_int_tensors(rng, p, OUT, IN, 4, 32, False) if fmt == "pack-quantized"
                            else nvfp4_tensors(rng, p, OUT, IN))[0])
        mutate(tensors)
        return write(tmp_path, tensors, ct_config(fmt, 4, 32, False))

    q = "layers.0.q_proj"

    def scales(t):
        dt, shape, data = t[q + ".weight_scale"]
        t[q + ".weight_scale"] = (dt, [shape[0], shape[1] // 2], data[:len(data) // 2])
    expect_dequant_error(tmp_path, ct(scales), "scale-shape", q + ".weight_scale",
                         "shape [64, 2], expected [64, 4]")

    def shape(t):
        t[q + ".weight_shape"] = ("I64", [2], np.array([OUT, 2 * IN], dtype=np.int64).tobytes())
    expect_dequant_error(tmp_path, ct(shape), "packed-shape", q + ".weight_packed",
                         "packs into [64, 32]")

    def zeros(t):
        dt, shape, data = t[q + ".weight_zero_point"]
        t[q + ".weight_zero_point"] = (dt, [shape[0] * 2, shape[1] // 2], data)
    expect_dequant_error(tmp_path, ct(zeros), "zeros-shape", q + ".weight_zero_point")

    def nv_scales(t):
        dt, shape, data = t[q + ".weight_scale"]
        t[q + ".weight_scale"] = (dt, [shape[0], shape[1] - 1], data[:-shape[0]])
    expect_dequant_error(tmp_path, ct(nv_scales, "nvfp4-pack-quantized"), "scale-shape",
                         q + ".weight_scale", "groups of 16")


def test_module_shape_mismatch_is_a_mismatch_error(tmp_path):
    path, _ = gptq_checkpoint(tmp_path)
    with metaload.meta():
        model = Tiny().to(torch.bfloat16)
        model.layers[0].q_proj = torch.nn.Linear(IN, OUT * 2)
    with pytest.raises(metaload.MismatchError) as e:
        metaload.load_into(model, path, dequantize=torch.bfloat16, progress=False)
    assert e.value.mismatched == ["layers.0.q_proj.weight"]
    assert "dequantizes to [64, 128]" in str(e.value)
    assert all(p.is_meta for p in model.parameters())


def test_without_dequantize_parts_are_unexpected(tmp_path):
    """A plain load of a quantized checkpoint does not guess: the parts are unexpected, the
    weights missing."""
    path, _ = gptq_checkpoint(tmp_path)
    with pytest.raises(metaload.MismatchError) as e:
        metaload.load_into(meta_model(), path, progress=False)
    assert "layers.0.q_proj.qweight" in e.value.unexpected
    assert "layers.0.q_proj.weight" in e.value.missing


def test_not_strict(tmp_path):
    """strict=False: a module without o_proj leaves those quantized weights unread (named by
    their logical weight in unexpected_keys), and a quantized weight counts as present (no
    missing key)."""
    path, refs = gptq_checkpoint(tmp_path)
    with metaload.meta():
        model = Tiny().to(torch.bfloat16)
        for b in model.layers:
            del b.o_proj
    report = metaload.load_into(model, path, dequantize=torch.bfloat16, strict=False,
                                progress=False)
    assert report.missing_keys == []
    assert "layers.0.o_proj.weight" in report.unexpected_keys
    assert not any("qweight" in k or "scales" in k for k in report.unexpected_keys)
    check(model, {k: v for k, v in refs.items() if "q_proj" in k}, torch.bfloat16, report)


def test_bad_dequantize_dtype(tmp_path):
    path, _ = gptq_checkpoint(tmp_path)
    with pytest.raises(metaload.PlanError, match="dequantize must be float32, float16 or bfloat16"):
        metaload.load_into(meta_model(), path, dequantize=torch.int8, progress=False)


# ---- the torch ops -------------------------------------------------------------------------------

def test_ops_with_windows():
    rng = np.random.default_rng(9)
    t, refs = gptq_tensors(rng, "x", 64, 256, bits=4, group=64, act_order=True)
    qw, qz, sc, gi = (torch.from_numpy(np.frombuffer(t[f"x.{k}"][2], dtype=d).reshape(t[f"x.{k}"][1]).copy())
                      for k, d in (("qweight", np.int32), ("qzeros", np.int32),
                                   ("scales", np.float16), ("g_idx", np.int32)))
    full = torch.ops.metaload.dequant_gptq(qw, qz, sc, gi, 4, 64, 1, torch.float32)
    assert torch.equal(full, torch.from_numpy(refs[1]))
    win = torch.ops.metaload.dequant_gptq(qw, qz, sc, gi, 4, 64, 1, torch.float32, [8, 16, 64, 128])
    assert torch.equal(win, full[8:24, 64:192])
    with pytest.raises(RuntimeError, match=r"ShapeError\] dequant_gptq: scales has shape"):
        torch.ops.metaload.dequant_gptq(qw, qz, sc[:, :32], gi, 4, 64, 1, torch.float32)
    bad = gi.clone()
    bad[3] = -1
    with pytest.raises(RuntimeError, match=r"ShapeError\] dequant_gptq: g_idx\[3\] = -1"):
        torch.ops.metaload.dequant_gptq(qw, qz, sc, bad, 4, 64, 1, torch.float32)
    t8, r8 = bnb8_tensors(rng, "y", 8, 16)
    w8 = torch.from_numpy(np.frombuffer(t8["y.weight"][2], dtype=np.int8).reshape(8, 16).copy())
    s8 = torch.from_numpy(np.frombuffer(t8["y.SCB"][2], dtype=np.float32).copy())
    assert torch.equal(torch.ops.metaload.dequant_bnb8(w8, s8, torch.float32), torch.from_numpy(r8))


# ---- CUDA (where a GPU is lent: tools/gpu_check) -------------------------------------------------

@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("scheme", ["gptq", "awq", "bnb4", "bnb8", "fp8", "ct_int", "nvfp4"])
def test_cuda_equals_cpu(tmp_path, scheme):
    """The CUDA kernels write the CPU kernels' bits, full weights and TP windows."""
    rng = np.random.default_rng(10)
    tensors = norms(rng)
    config = None
    for p in linears():
        if scheme == "gptq":
            tensors.update(gptq_tensors(rng, p, OUT, IN, act_order=True)[0])
        elif scheme == "awq":
            tensors.update(awq_tensors(rng, p, OUT, IN)[0])
        elif scheme == "bnb4":
            tensors.update(bnb4_tensors(rng, p, OUT, IN, nested=True, nested_block=4)[0])
        elif scheme == "bnb8":
            tensors.update(bnb8_tensors(rng, p, OUT, IN)[0])
        elif scheme == "ct_int":
            tensors.update(ct_int_tensors(rng, p, OUT, IN, 4, 32, symmetric=False)[0])
            config = ct_config("pack-quantized", 4, 32, False)
        elif scheme == "nvfp4":
            tensors.update(nvfp4_tensors(rng, p, OUT, IN)[0])
            config = ct_config("nvfp4-pack-quantized")
        else:
            tensors.update(fp8_tensors(rng, p, OUT, IN, (16, 32))[0])
            config = {"quant_method": "fp8", "weight_block_size": [16, 32]}
    path = write(tmp_path, tensors, config)
    for tp in ({}, dict(tp_rank=1, tp_size=2, tp_plan=PLAN)):
        for dtype in (torch.bfloat16, torch.float32):
            models = []
            for device in ("cpu", "cuda"):
                m = tp_model(tp.get("tp_rank", 0), tp.get("tp_size", 1), bias=False)
                r = metaload.load_into(m, path, device=device, dequantize=dtype, strict=False,
                                       progress=False, **tp)
                assert len(r.dequantized_keys) == 4
                models.append(m)
            for (n, a), (_, b) in zip(models[0].state_dict().items(), models[1].state_dict().items()):
                assert b.device.type == "cuda" and torch.equal(a, b.cpu()), (scheme, tp, n)
