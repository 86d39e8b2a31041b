"""Quantized checkpoints written here, following each library's documented layout, and their
dequantization written out plainly in numpy (independent of metaload's kernels): the references
test_dequant*.py compares metaload's dequantizing loads with. Runs on both torches (no float8 or
PyPI package needed): files are written by a plain safetensors writer below.

Layouts (the logical weight is nn.Linear's [out, in]):
  GPTQ  qweight int32 [in / pack, out]: input row i in bits-wide field i % pack (lowest first);
        qzeros int32 [groups, out / pack] the same along out; scales f16 [groups, out]; g_idx
        int32 [in]. w[j, i] = (q - (z + 1)) * s for checkpoint_format "gptq" (v1 stores z - 1),
        (q - z) * s for "gptq_v2".
  AWQ   qweight int32 [in, out / 8]: output column 8c + ORDER[k] in nibble k, ORDER = 0 2 4 6 1 3 5 7;
        qzeros int32 [in / group, out / 8] likewise; scales f16 [in / group, out]. w = (q - z) * s.
  NF4   weight u8 [ceil(n / 2), 1]: the flattened weight, first element of each pair in the high
        nibble; absmax f32 per blocksize; quant_map f32 [16]; a JSON quant_state blob (u8).
        Double quantization: absmax u8 codes, nested_absmax f32 per 256 blocks, nested_quant_map
        f32 [256], nested_offset in the blob: absmax = nested_map[code] * nested_absmax + offset.
  int8  weight i8 [out, in], SCB f32 [out], weight_format u8 scalar 0: w = q * SCB / 127.
  FP8   weight e4m3fn [out, in], weight_scale_inv f32 [ceil(out / 128), ceil(in / 128)]: w = x * s.
  compressed-tensors pack-quantized (int, 1 to 8 bits): weight_packed int32 [out, ceil(in * bits /
        32)], each row a dense little-endian bit stream of q + 2^(bits - 1) (input i at bit
        i * bits); weight_scale [out, groups]; weight_shape int64 [out, in]; asymmetric:
        weight_zero_point int32 [ceil(out * bits / 32), groups], the same stream down each column.
        w = (q - z) * s (z = 0 when symmetric).
  compressed-tensors NVFP4: weight_packed u8 [out, in / 2] (input 2k in the low nibble), FP4 E2M1
        codes (bit 3 the sign; magnitudes 0 0.5 1 1.5 2 3 4 6); weight_scale e4m3fn [out, in / 16];
        weight_global_scale f32 [1]. w = e2m1(q) * f32(e4m3(s) / global).
"""
import json
import os
import struct
from typing import Dict, Optional, Tuple

import numpy as np

AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]

_NP = {"F32": np.float32, "F16": np.float16, "I32": np.int32, "I64": np.int64, "U8": np.uint8,
       "I8": np.int8}


def write_safetensors(path: str, tensors: Dict[str, Tuple[str, list, bytes]],
                      config: Optional[dict] = None):
    """Writes {name: (dtype name, shape, raw bytes)} as safetensors (header padded to 8 bytes,
    tensors in the given order); with `config`, a config.json beside it."""
    header, offset, blobs = {}, 0, []
    for name, (dtype, shape, data) in tensors.items():
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)
    if config is not None:
        with open(os.path.join(os.path.dirname(path), "config.json"), "w") as f:
            json.dump(config, f)


def arr(dtype: str, a: np.ndarray) -> Tuple[str, list, bytes]:
    a = np.ascontiguousarray(a.astype(_NP[dtype]) if dtype in _NP else a)
    return (dtype, list(a.shape), a.tobytes())


def bf16_round(x: np.ndarray) -> np.ndarray:
    """f32 -> bf16 -> f32, round to nearest even (finite inputs)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    return u.astype(np.uint32).view(np.float32)


def rounded(x: np.ndarray, dtype: str) -> np.ndarray:
    return {"float32": x.astype(np.float32), "bfloat16": bf16_round(x),
            "float16": x.astype(np.float16).astype(np.float32)}[dtype]


# ---- GPTQ / AWQ ----------------------------------------------------------------------------------

def pack_rows(q: np.ndarray, bits: int) -> np.ndarray:
    """[rows, cols] codes -> int32 [rows / pack, cols]: row r in field r % pack of word r / pack."""
    pack = 32 // bits
    w = np.zeros((q.shape[0] // pack, q.shape[1]), dtype=np.uint64)
    for k in range(pack):
        w |= q[k::pack].astype(np.uint64) << np.uint64(bits * k)
    return w.astype(np.uint32).view(np.int32)


def pack_cols(q: np.ndarray, bits: int, order=None) -> np.ndarray:
    """[rows, cols] codes -> int32 [rows, cols / pack]: column pack * c + order[k] in field k."""
    pack = 32 // bits
    order = order or list(range(pack))
    w = np.zeros((q.shape[0], q.shape[1] // pack), dtype=np.uint64)
    for k in range(pack):
        w |= q[:, order[k]::pack].astype(np.uint64) << np.uint64(bits * k)
    return w.astype(np.uint32).view(np.int32)


def gptq_tensors(rng, prefix: str, out: int, inp: int, bits=4, group=32, act_order=False,
                 bias=True):
    """GPTQ parts of one Linear and its dequantization (f32 [out, in], zero offset 1 for v1 and
    0 for v2 as a dict)."""
    groups = (inp + group - 1) // group
    mask = (1 << bits) - 1
    q = rng.integers(0, mask + 1, size=(inp, out))
    z = rng.integers(0, mask, size=(groups, out))  # stored (v1: z - 1)
    scales = (rng.random((groups, out)) * 0.05 + 0.001).astype(np.float16)
    g_idx = np.arange(inp) // group
    if act_order:
        g_idx = rng.permutation(g_idx)
    t = {f"{prefix}.qweight": arr("I32", pack_rows(q, bits)),
         f"{prefix}.qzeros": arr("I32", pack_cols(z, bits)),
         f"{prefix}.scales": arr("F16", scales),
         f"{prefix}.g_idx": arr("I32", g_idx)}
    if bias:
        t[f"{prefix}.bias"] = arr("F16", rng.standard_normal(out))
    refs = {}
    for off in (0, 1):
        zz = (z + off)[g_idx]  # [in, out]
        refs[off] = ((q - zz).astype(np.float32) * scales[g_idx].astype(np.float32)).T.copy()
    return t, refs


def awq_tensors(rng, prefix: str, out: int, inp: int, group=32):
    groups = inp // group
    q = rng.integers(0, 16, size=(inp, out))
    z = rng.integers(0, 16, size=(groups, out))
    scales = (rng.random((groups, out)) * 0.05 + 0.001).astype(np.float16)
    t = {f"{prefix}.qweight": arr("I32", pack_cols(q, 4, AWQ_ORDER)),
         f"{prefix}.qzeros": arr("I32", pack_cols(z, 4, AWQ_ORDER)),
         f"{prefix}.scales": arr("F16", scales)}
    g = np.arange(inp) // group
    ref = ((q - z[g]).astype(np.float32) * scales[g].astype(np.float32)).T.copy()
    return t, ref


# ---- bitsandbytes --------------------------------------------------------------------------------

def bnb4_tensors(rng, prefix: str, out: int, inp: int, quant_type="nf4", blocksize=64,
                 nested=False, nested_block=256):
    """bitsandbytes 4-bit parts written by hand (random codes, a random quant_map) and their
    dequantization."""
    n = out * inp
    codes = rng.integers(0, 16, size=n)
    if n % 2:
        codes = np.append(codes, 0)
    packed = ((codes[0::2] << 4) | codes[1::2]).astype(np.uint8)
    codes = codes[:n]
    qmap = np.sort(rng.uniform(-1, 1, 16)).astype(np.float32)
    blocks = (n + blocksize - 1) // blocksize
    state = {"quant_type": quant_type, "blocksize": blocksize, "dtype": "bfloat16", "shape": [out, inp]}
    w = f"{prefix}.weight"
    t = {w: arr("U8", packed.reshape(-1, 1)), f"{w}.quant_map": arr("F32", qmap)}
    if nested:
        nmap = np.sort(rng.uniform(-1, 1, 256)).astype(np.float32)
        nabs = (rng.random((blocks + nested_block - 1) // nested_block) + 0.5).astype(np.float32)
        qabs = rng.integers(0, 256, size=blocks).astype(np.uint8)
        offset = np.float32(0.75)
        absmax = (nmap[qabs] * nabs[np.arange(blocks) // nested_block]).astype(np.float32) + offset
        state.update(nested_blocksize=nested_block, nested_dtype="float32", nested_offset=float(offset))
        t[f"{w}.absmax"] = arr("U8", qabs)
        t[f"{w}.nested_absmax"] = arr("F32", nabs)
        t[f"{w}.nested_quant_map"] = arr("F32", nmap)
    else:
        absmax = (rng.random(blocks) + 0.5).astype(np.float32)
        t[f"{w}.absmax"] = arr("F32", absmax)
    blob = np.frombuffer(json.dumps(state).encode(), dtype=np.uint8)
    t[f"{w}.quant_state.bitsandbytes__{quant_type}"] = arr("U8", blob)
    ref = (qmap[codes] * absmax[np.arange(n) // blocksize]).astype(np.float32).reshape(out, inp)
    return t, ref


def bnb8_tensors(rng, prefix: str, out: int, inp: int):
    q = rng.integers(-127, 128, size=(out, inp)).astype(np.int8)
    scb = (rng.random(out) * 3 + 0.1).astype(np.float32)
    t = {f"{prefix}.weight": arr("I8", q), f"{prefix}.SCB": arr("F32", scb),
         f"{prefix}.weight_format": ("U8", [], b"\x00")}
    ref = (q.astype(np.float32) * scb[:, None]) * np.float32(1 / 127)
    return t, ref.astype(np.float32)


# ---- FP8 -----------------------------------------------------------------------------------------

def e4m3_decode(b: np.ndarray) -> np.ndarray:
    """float8 e4m3fn bytes -> f32: 2^(e-7) * (1 + m/8); e == 0: m/8 * 2^-6; 0x7F / 0xFF NaN."""
    b = b.astype(np.int64)
    e, m = (b >> 3) & 15, b & 7
    mag = np.where(e == 0, m / 8.0 * 2.0 ** -6, (1 + m / 8.0) * 2.0 ** (e - 7))
    mag = np.where((e == 15) & (m == 7), np.nan, mag)
    return np.where(b & 0x80, -mag, mag).astype(np.float32)


def fp8_tensors(rng, prefix: str, out: int, inp: int, block=(128, 128)):
    q = rng.integers(0, 256, size=(out, inp)).astype(np.uint8)
    q[(q & 0x7F) == 0x7F] = 0x10  # no NaNs: a model weight has none
    so, si = -(-out // block[0]), -(-inp // block[1])
    sinv = (rng.random((so, si)) * 0.01 + 0.001).astype(np.float32)
    t = {f"{prefix}.weight": ("F8_E4M3", [out, inp], q.tobytes()),
         f"{prefix}.weight_scale_inv": arr("F32", sinv)}
    rows, cols = np.arange(out) // block[0], np.arange(inp) // block[1]
    ref = e4m3_decode(q) * sinv[rows][:, cols]
    return t, ref.astype(np.float32), q, sinv


# ---- compressed-tensors --------------------------------------------------------------------------

def bf16_bytes(x: np.ndarray) -> bytes:
    """f32 values exactly representable in bfloat16 -> their bfloat16 bytes."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    return (u >> 16).astype(np.uint16).tobytes()


def pack_stream(u: np.ndarray, bits: int) -> np.ndarray:
    """[rows, n] unsigned fields -> int32 [rows, ceil(n * bits / 32)]: each row one little-endian
    bit stream, field i at bit i * bits (fields may straddle words)."""
    rows, n = u.shape
    words = -(-n * bits // 32)
    out = np.zeros((rows, words), dtype=np.uint32)
    for r in range(rows):
        acc = 0
        for i in range(n):
            acc |= int(u[r, i]) << (i * bits)
        out[r] = np.frombuffer(acc.to_bytes(words * 4, "little"), dtype=np.uint32)
    return out.view(np.int32)


def ct_int_tensors(rng, prefix: str, out: int, inp: int, bits=4, group=32, symmetric=True,
                   scale_dtype="BF16"):
    """compressed-tensors pack-quantized parts of one Linear (group strategy; group=None: one
    scale per output channel) and their dequantization (f32, exact)."""
    groups = 1 if group is None else -(-inp // group)
    half = 1 << (bits - 1)
    q = rng.integers(-half, half, size=(out, inp))
    z = np.zeros((out, groups), dtype=np.int64) if symmetric else rng.integers(-half, half, size=(out, groups))
    scales = bf16_round((rng.random((out, groups)) * 0.05 + 0.001).astype(np.float32))
    t = {f"{prefix}.weight_packed": arr("I32", pack_stream(q + half, bits)),
         f"{prefix}.weight_shape": arr("I64", np.array([out, inp]))}
    if scale_dtype == "BF16":
        t[f"{prefix}.weight_scale"] = ("BF16", [out, groups], bf16_bytes(scales))
    else:
        scales = scales.astype(np.float16).astype(np.float32)
        t[f"{prefix}.weight_scale"] = arr("F16", scales)
    if not symmetric:
        t[f"{prefix}.weight_zero_point"] = arr("I32", pack_stream((z + half).T, bits).T)
    g = np.arange(inp) // (inp if group is None else group)
    ref = ((q - z[:, g]).astype(np.float32) * scales[:, g]).astype(np.float32)
    return t, ref


def e2m1_decode(c: np.ndarray) -> np.ndarray:
    mag = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], dtype=np.float32)[c & 7]
    return np.where(c & 8, -mag, mag).astype(np.float32)


def nvfp4_tensors(rng, prefix: str, out: int, inp: int, group=16):
    """compressed-tensors NVFP4 parts of one Linear and their dequantization (f32)."""
    codes = rng.integers(0, 16, size=(out, inp))
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8)
    s8 = rng.integers(0x20, 0x60, size=(out, inp // group)).astype(np.uint8)  # e4m3, no NaN
    glob = np.float32(rng.random() * 100 + 1)
    scale = (e4m3_decode(s8) / glob).astype(np.float32)  # f32 division, as compressed-tensors
    t = {f"{prefix}.weight_packed": arr("U8", packed),
         f"{prefix}.weight_scale": ("F8_E4M3", [out, inp // group], s8.tobytes()),
         f"{prefix}.weight_global_scale": arr("F32", np.array([glob]))}
    ref = (e2m1_decode(codes) * scale[:, np.arange(inp) // group]).astype(np.float32)
    return t, ref


def ct_config(fmt="pack-quantized", bits=4, group=32, symmetric=True):
    weights = ({"num_bits": bits, "type": "int", "symmetric": symmetric,
                "strategy": "channel" if group is None else "group", "group_size": group}
               if fmt == "pack-quantized" else
               {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16,
                "symmetric": True})
    return {"quant_method": "compressed-tensors", "format": fmt,
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights}}}


def ct_calibrate(mod) -> None:
    """Sets a compressed-tensors module's weight scale (global scale, zero point) from its weight's
    min and max per group, as llm-compressor's calibration does, and freezes it for compression.
    Needs compressed-tensors (torch 2.x)."""
    from compressed_tensors.quantization import QuantizationStatus
    from compressed_tensors.quantization.utils import calculate_qparams, generate_gparam
    w, args = mod.weight.data.float(), mod.quantization_scheme.weights
    groups = w.reshape(w.shape[0], -1, args.group_size)
    glob = None
    if args.strategy == "tensor_group":
        glob = generate_gparam(-w.abs().amax().reshape(1), w.abs().amax().reshape(1))
        mod.weight_global_scale.data.copy_(glob)
    scale, zp = calculate_qparams(groups.amin(-1), groups.amax(-1), args, global_scale=glob)
    mod.weight_scale.data.copy_(scale.to(mod.weight_scale.dtype))
    if hasattr(mod, "weight_zero_point"):
        mod.weight_zero_point.data.copy_(zp.to(mod.weight_zero_point.dtype))
    mod.quantization_status = QuantizationStatus.FROZEN
