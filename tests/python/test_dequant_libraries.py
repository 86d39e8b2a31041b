"""Dequantizing loads against the quantizing libraries themselves, where they run on the CPU here
(torch 2.x; skipped on 1.13, which has no bitsandbytes or compressed-tensors):
  - bitsandbytes 0.50: Linear4bit (NF4/FP4, with and without double quantization) and
    Linear8bitLt quantized on the CPU, saved with their real state_dict names, then loaded into
    plain nn.Linear layers: equal to bitsandbytes.functional.dequantize_4bit /
    int8_vectorwise_dequant;
  - compressed-tensors: its dequantize() on group-quantized ints (the GPTQ and AWQ math, from the
    unpacked codes of quant_refs' checkpoints) and on FP8 with 128x128 block scales;
  - compressed-tensors' own files (pack-quantized int4 / int8, symmetric and asymmetric, and
    NVFP4), written by its ModelCompressor: equal to its decompress_model."""
import numpy as np
import pytest
import torch

import metaload
from quant_refs import awq_tensors, ct_calibrate, fp8_tensors, gptq_tensors, write_safetensors

bnb = pytest.importorskip("bitsandbytes", reason="bitsandbytes comes from PyPI (torch 2.x venv)")
st = pytest.importorskip("safetensors.torch", reason="safetensors comes from PyPI")


class Net(torch.nn.Module):
    def __init__(self, linear):
        super().__init__()
        self.up = linear(128, 256)
        self.down = linear(256, 128)


@pytest.mark.parametrize("quant_type,nested", [("nf4", False), ("nf4", True), ("fp4", True)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_bitsandbytes_4bit(tmp_path, quant_type, nested, dtype):
    torch.manual_seed(0)
    plain = Net(torch.nn.Linear)

    def linear4(i, o):
        return bnb.nn.Linear4bit(i, o, compute_dtype=torch.bfloat16, quant_type=quant_type,
                                 compress_statistics=nested)

    q = Net(linear4)
    for name in ("up", "down"):
        src, dst = getattr(plain, name), getattr(q, name)
        dst.weight = bnb.nn.Params4bit(src.weight.data.clone(), requires_grad=False,
                                       quant_type=quant_type, compress_statistics=nested,
                                       blocksize=64)._quantize("cpu")
        dst.bias = torch.nn.Parameter(src.bias.data.clone())
    sd = q.state_dict()
    assert f"up.weight.quant_state.bitsandbytes__{quant_type}" in sd
    assert ("up.weight.nested_absmax" in sd) == nested
    path = str(tmp_path / "model.safetensors")
    st.save_file({k: v.contiguous() for k, v in sd.items()}, path)
    with metaload.meta():
        model = Net(torch.nn.Linear)
    report = metaload.load_into(model, path, dequantize=dtype, progress=False)
    assert sorted(report.dequantized_keys) == ["down.weight", "up.weight"]
    for name in ("up", "down"):
        w = getattr(q, name).weight
        want = bnb.functional.dequantize_4bit(w.data, w.quant_state).to(dtype)
        assert torch.equal(getattr(model, name).weight, want), name
        assert torch.equal(getattr(model, name).bias, getattr(plain, name).bias)


def test_bitsandbytes_int8(tmp_path):
    torch.manual_seed(1)
    plain = Net(torch.nn.Linear)
    q = Net(lambda i, o: bnb.nn.Linear8bitLt(i, o, has_fp16_weights=False))
    for name in ("up", "down"):
        src, dst = getattr(plain, name), getattr(q, name)
        dst.weight = bnb.nn.Int8Params(src.weight.data.clone(), requires_grad=False,
                                       has_fp16_weights=False)._quantize("cpu")
        dst.bias = torch.nn.Parameter(src.bias.data.clone())
    sd = q.state_dict()
    assert sd["up.weight"].dtype == torch.int8 and "up.SCB" in sd
    path = str(tmp_path / "model.safetensors")
    st.save_file({k: v.contiguous() for k, v in sd.items()}, path)
    with metaload.meta():
        model = Net(torch.nn.Linear)
    metaload.load_into(model, path, dequantize=torch.float32, progress=False)
    for name in ("up", "down"):
        w = getattr(q, name).weight
        want = bnb.functional.int8_vectorwise_dequant(w.data, w.SCB)
        assert torch.equal(getattr(model, name).weight, want), name


ct_forward = pytest.importorskip("compressed_tensors.quantization.lifecycle.forward",
                                 reason="compressed-tensors comes from PyPI")
from compressed_tensors.quantization import QuantizationArgs  # noqa: E402


def unpacked(t, name, dtype):
    _, shape, data = t[name]
    return torch.from_numpy(np.frombuffer(data, dtype=dtype).reshape(shape).copy())


def codes_of(qweight_rows, bits):
    """GPTQ qweight [in / pack, out] -> codes [in, out] (torch's own shifts)."""
    pack = 32 // bits
    shifts = torch.arange(pack, dtype=torch.int32) * bits
    q = (qweight_rows.unsqueeze(1) >> shifts.view(1, -1, 1)) & ((1 << bits) - 1)
    return q.reshape(-1, qweight_rows.shape[1])


@pytest.mark.parametrize("scheme", ["gptq", "awq"])
def test_group_int4_matches_compressed_tensors(tmp_path, scheme):
    rng = np.random.default_rng(3)
    out, inp, group = 64, 256, 64
    if scheme == "gptq":
        t, refs = gptq_tensors(rng, "lin", out, inp, bits=4, group=group, bias=False)
        del t["lin.g_idx"]
        config = {"quant_method": "gptq", "bits": 4, "group_size": group}
        codes = codes_of(unpacked(t, "lin.qweight", np.int32), 4)  # [in, out]
        zeros = codes_of(unpacked(t, "lin.qzeros", np.int32).T.contiguous(), 4).T + 1  # v1: +1
    else:
        t, _ = awq_tensors(rng, "lin", out, inp, group=group)
        config = {"quant_method": "awq", "bits": 4, "group_size": group, "version": "gemm"}
        order = [0, 4, 1, 5, 2, 6, 3, 7]  # nibble of column 8c + k

        def unawq(x):
            return torch.stack([(x >> (4 * order[k])) & 15 for k in range(8)], -1).reshape(x.shape[0], -1)

        codes = unawq(unpacked(t, "lin.qweight", np.int32))
        zeros = unawq(unpacked(t, "lin.qzeros", np.int32))
    scales = unpacked(t, "lin.scales", np.float16).float()  # [groups, out]
    write_safetensors(str(tmp_path / "model.safetensors"), t, {"quantization_config": config})
    args = QuantizationArgs(num_bits=4, type="int", strategy="group", group_size=group,
                            symmetric=False)
    want = ct_forward.dequantize(codes.T.float(), scales.T.contiguous(), zeros.T.float().contiguous(),
                                 args=args, dtype=torch.float32)
    with metaload.meta():
        model = torch.nn.ModuleDict({"lin": torch.nn.Linear(inp, out, bias=False)})
    metaload.load_into(model, str(tmp_path), dequantize=torch.float32, progress=False)
    assert torch.equal(model["lin"].weight, want)


def test_fp8_blocks_match_compressed_tensors(tmp_path):
    rng = np.random.default_rng(4)
    t, _, q, sinv = fp8_tensors(rng, "lin", 256, 384)
    write_safetensors(str(tmp_path / "model.safetensors"), t,
                      {"quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}})
    args = QuantizationArgs(num_bits=8, type="float", strategy="block", block_structure=[128, 128],
                            symmetric=True)
    x = torch.from_numpy(q).view(torch.float8_e4m3fn)
    want = ct_forward.dequantize(x, torch.from_numpy(sinv), None, args=args, dtype=torch.float32)
    with metaload.meta():
        model = torch.nn.ModuleDict({"lin": torch.nn.Linear(384, 256, bias=False)})
    for dtype in (torch.float32, torch.bfloat16):
        metaload.load_into(model, str(tmp_path), dequantize=dtype, progress=False)
        assert torch.equal(model["lin"].weight, want.to(dtype))


class Pair(torch.nn.Module):
    """Two Linears whose inputs compressed-tensors groups whole (128 and 256 inputs)."""

    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(128, 256, bias=False)
        self.down = torch.nn.Linear(256, 128, bias=False)


@pytest.mark.parametrize("preset,fmt", [("W4A16", "pack-quantized"),
                                        ("W4A16_ASYM", "pack-quantized"),
                                        ("W8A16", "pack-quantized"),
                                        ("NVFP4A16", "nvfp4-pack-quantized")])
def test_compressed_tensors_files(tmp_path, preset, fmt):
    """Files written by compressed-tensors itself (its scheme, its min-max qparams, its
    ModelCompressor), loaded dequantized: equal to its own decompression of the same model, in
    the dtype it decompresses to (the scales' bfloat16)."""
    import copy

    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import (QuantizationConfig, apply_quantization_config,
                                                 preset_name_to_scheme)
    torch.manual_seed(5)
    m = Pair().to(torch.bfloat16)
    apply_quantization_config(m, QuantizationConfig(
        config_groups={"group_0": preset_name_to_scheme(preset, ["Linear"])}))
    for mod in (m.up, m.down):
        ct_calibrate(mod)
    compressor = ModelCompressor.from_pretrained_model(m, fmt)
    compressor.compress_model(m)
    st.save_file({k: v.contiguous() for k, v in m.state_dict().items()},
                 str(tmp_path / "model.safetensors"))
    compressor.update_config(str(tmp_path))
    want = copy.deepcopy(m)
    compressor.decompress_model(want)
    with metaload.meta():
        model = Pair()
    report = metaload.load_into(model, str(tmp_path), dequantize=torch.bfloat16, progress=False)
    assert sorted(report.dequantized_keys) == ["down.weight", "up.weight"]
    for name in ("up", "down"):
        ref = getattr(want, name).weight
        assert ref.dtype == torch.bfloat16
        assert torch.equal(getattr(model, name).weight, ref), name
