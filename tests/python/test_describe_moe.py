"""describe of mixture-of-experts checkpoints (issue 25, "Scan and describe"): the routed and
shared experts, experts per token, total and active parameters per token from headers and
config.json only, max_tp_size on every expert's rows and the expert-parallel degrees, both layouts
(one tensor per expert as the Hub stores them, fused [E, ...] as gpt-oss and transformers 5 do),
quantized experts (DeepSeek-V3's FP8 block scales, compressed-tensors) sized to the stored byte,
and a checkpoint whose headers contradict its config.

The real models are written header-only: a safetensors header for the published config's tensors
and a sparse file of the data's length (holes, no bytes), so describe sees Mixtral-8x7B or
DeepSeek-V3 at full size. Their configs are the published config.json fields that size them."""
import json
import os
import struct

import pytest
import torch

import metaload
from conftest import run_cli

NBYTES = {"F32": 4, "F16": 2, "BF16": 2, "I32": 4, "I64": 8, "U8": 1, "F8_E4M3": 1}


def write_header_only(path, tensors, data=None):
    """tensors: [(name, dtype, shape)]; writes the header and a sparse data section of the exact
    length, holes but for the tensors `data` gives bytes ({name: bytes}: compressed-tensors'
    weight_shape, which describe reads). Returns the bytes of tensor data."""
    header, offset, data = {}, 0, data or {}
    for name, dtype, shape in tensors:
        n = NBYTES[dtype]
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    text = json.dumps(header).encode()
    text += b" " * (-(8 + len(text)) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        f.truncate(8 + len(text) + offset)
        for name, blob in data.items():
            begin, end = header[name]["data_offsets"]
            assert len(blob) == end - begin, name
            f.seek(8 + len(text) + begin)
            f.write(blob)
    return offset


def write_dir(d, config, tensors, data=None):
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(config, f)
    return write_header_only(os.path.join(d, "model.safetensors"), tensors, data)


def numel(shape):
    n = 1
    for s in shape:
        n *= s
    return n


# ---------------------------------------------------------------------------------------------
# The published checkpoints' layouts, from their configs (Linear weights [out, in]).

MIXTRAL_8X7B = {"model_type": "mixtral", "architectures": ["MixtralForCausalLM"],
                "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 32000,
                "num_local_experts": 8, "num_experts_per_tok": 2, "tie_word_embeddings": False,
                "torch_dtype": "bfloat16"}
QWEN3_30B_A3B = {"model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"],
                 "hidden_size": 2048, "intermediate_size": 6144, "moe_intermediate_size": 768,
                 "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4,
                 "head_dim": 128, "vocab_size": 151936, "num_experts": 128,
                 "num_experts_per_tok": 8, "decoder_sparse_step": 1, "mlp_only_layers": [],
                 "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
OLMOE_1B_7B = {"model_type": "olmoe", "architectures": ["OlmoeForCausalLM"], "hidden_size": 2048,
               "intermediate_size": 1024, "num_hidden_layers": 16, "num_attention_heads": 16,
               "num_key_value_heads": 16, "vocab_size": 50304, "num_experts": 64,
               "num_experts_per_tok": 8, "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
GPT_OSS_20B = {"model_type": "gpt_oss", "architectures": ["GptOssForCausalLM"], "hidden_size": 2880,
               "intermediate_size": 2880, "num_hidden_layers": 24, "num_attention_heads": 64,
               "num_key_value_heads": 8, "head_dim": 64, "vocab_size": 201088,
               "num_local_experts": 32, "num_experts_per_tok": 4, "experts_per_token": 4,
               "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
DEEPSEEK_V3 = {"model_type": "deepseek_v3", "architectures": ["DeepseekV3ForCausalLM"],
               "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048,
               "num_hidden_layers": 61, "first_k_dense_replace": 3, "num_attention_heads": 128,
               "num_key_value_heads": 128, "q_lora_rank": 1536, "kv_lora_rank": 512,
               "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
               "vocab_size": 129280, "n_routed_experts": 256, "n_shared_experts": 1,
               "num_experts_per_tok": 8, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
               "quantization_config": {"quant_method": "fp8", "fmt": "e4m3",
                                       "activation_scheme": "dynamic",
                                       "weight_block_size": [128, 128]}}


def ends(c, dtype="BF16"):
    h, v = c["hidden_size"], c["vocab_size"]
    return [("model.embed_tokens.weight", dtype, (v, h)), ("model.norm.weight", dtype, (h,)),
            ("lm_head.weight", dtype, (v, h))]


def gqa(p, c, dtype="BF16", qk_norm=None, bias=False):
    h, heads, kv = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"]
    hd = c.get("head_dim", h // heads)
    t = [(p + "self_attn.q_proj.weight", dtype, (heads * hd, h)),
         (p + "self_attn.k_proj.weight", dtype, (kv * hd, h)),
         (p + "self_attn.v_proj.weight", dtype, (kv * hd, h)),
         (p + "self_attn.o_proj.weight", dtype, (h, heads * hd)),
         (p + "input_layernorm.weight", dtype, (h,)),
         (p + "post_attention_layernorm.weight", dtype, (h,))]
    if qk_norm:
        t += [(p + "self_attn.q_norm.weight", dtype, (qk_norm[0],)),
              (p + "self_attn.k_norm.weight", dtype, (qk_norm[1],))]
    if bias:
        t += [(p + "self_attn.q_proj.bias", dtype, (heads * hd,)),
              (p + "self_attn.k_proj.bias", dtype, (kv * hd,)),
              (p + "self_attn.v_proj.bias", dtype, (kv * hd,)),
              (p + "self_attn.o_proj.bias", dtype, (h,))]
    return t


def mixtral_tensors(c, fused=False):
    h, i, e = c["hidden_size"], c["intermediate_size"], c["num_local_experts"]
    t = ends(c)
    for n in range(c["num_hidden_layers"]):
        p = f"model.layers.{n}."
        t += gqa(p, c)
        if fused:  # transformers 5's MixtralExperts, saved with save_original_format=False
            t += [(p + "mlp.gate.weight", "BF16", (e, h)),
                  (p + "mlp.experts.gate_up_proj", "BF16", (e, 2 * i, h)),
                  (p + "mlp.experts.down_proj", "BF16", (e, h, i))]
            continue
        t.append((p + "block_sparse_moe.gate.weight", "BF16", (e, h)))
        for x in range(e):
            q = f"{p}block_sparse_moe.experts.{x}."
            t += [(q + "w1.weight", "BF16", (i, h)), (q + "w3.weight", "BF16", (i, h)),
                  (q + "w2.weight", "BF16", (h, i))]
    return t


def qwen_mlp(p, h, i, dtype="BF16"):
    return [(p + "gate_proj.weight", dtype, (i, h)), (p + "up_proj.weight", dtype, (i, h)),
            (p + "down_proj.weight", dtype, (h, i))]


def qwen3_moe_tensors(c):
    h, e = c["hidden_size"], c["num_experts"]
    hd = c["head_dim"]
    t = ends(c)
    for n in range(c["num_hidden_layers"]):
        p = f"model.layers.{n}."
        t += gqa(p, c, qk_norm=(hd, hd))
        if n in c["mlp_only_layers"] or (n + 1) % c["decoder_sparse_step"]:
            t += qwen_mlp(p + "mlp.", h, c["intermediate_size"])
            continue
        t.append((p + "mlp.gate.weight", "BF16", (e, h)))
        for x in range(e):
            t += qwen_mlp(f"{p}mlp.experts.{x}.", h, c["moe_intermediate_size"])
    return t


def olmoe_tensors(c):
    h, e = c["hidden_size"], c["num_experts"]
    t = ends(c)
    for n in range(c["num_hidden_layers"]):
        p = f"model.layers.{n}."
        t += gqa(p, c, qk_norm=(h, h))  # OLMoE normalises q and k over all heads
        t.append((p + "mlp.gate.weight", "BF16", (e, h)))
        for x in range(e):
            t += qwen_mlp(f"{p}mlp.experts.{x}.", h, c["intermediate_size"])
    return t


def gpt_oss_tensors(c):
    h, i, e = c["hidden_size"], c["intermediate_size"], c["num_local_experts"]
    t = ends(c)
    for n in range(c["num_hidden_layers"]):
        p = f"model.layers.{n}."
        t += gqa(p, c, bias=True)
        t += [(p + "self_attn.sinks", "BF16", (c["num_attention_heads"],)),
              (p + "mlp.router.weight", "BF16", (e, h)), (p + "mlp.router.bias", "BF16", (e,)),
              (p + "mlp.experts.gate_up_proj", "BF16", (e, h, 2 * i)),
              (p + "mlp.experts.gate_up_proj_bias", "BF16", (e, 2 * i)),
              (p + "mlp.experts.down_proj", "BF16", (e, i, h)),
              (p + "mlp.experts.down_proj_bias", "BF16", (e, h))]
    return t


def fp8_linear(name, out, inp):
    """DeepSeek-V3's FP8 weight and its 128 x 128 block scales (weight_scale_inv)."""
    return [(name + ".weight", "F8_E4M3", (out, inp)),
            (name + ".weight_scale_inv", "F32", (-(-out // 128), -(-inp // 128)))]


def deepseek_v3_tensors(c):
    h, e, heads = c["hidden_size"], c["n_routed_experts"], c["num_attention_heads"]
    qk = c["qk_nope_head_dim"] + c["qk_rope_head_dim"]
    t = ends(c)
    for n in range(c["num_hidden_layers"]):
        p = f"model.layers.{n}."
        a = p + "self_attn."
        t += fp8_linear(a + "q_a_proj", c["q_lora_rank"], h)
        t += fp8_linear(a + "q_b_proj", heads * qk, c["q_lora_rank"])
        t += fp8_linear(a + "kv_a_proj_with_mqa", c["kv_lora_rank"] + c["qk_rope_head_dim"], h)
        t += fp8_linear(a + "kv_b_proj", heads * (c["qk_nope_head_dim"] + c["v_head_dim"]),
                        c["kv_lora_rank"])
        t += fp8_linear(a + "o_proj", h, heads * c["v_head_dim"])
        t += [(a + "q_a_layernorm.weight", "BF16", (c["q_lora_rank"],)),
              (a + "kv_a_layernorm.weight", "BF16", (c["kv_lora_rank"],)),
              (p + "input_layernorm.weight", "BF16", (h,)),
              (p + "post_attention_layernorm.weight", "BF16", (h,))]
        if n < c["first_k_dense_replace"]:
            t += fp8_mlp(p + "mlp.", h, c["intermediate_size"])
            continue
        t += [(p + "mlp.gate.weight", "BF16", (e, h)),
              (p + "mlp.gate.e_score_correction_bias", "F32", (e,))]
        t += fp8_mlp(p + "mlp.shared_experts.", h,
                     c["moe_intermediate_size"] * c["n_shared_experts"])
        for x in range(e):
            t += fp8_mlp(f"{p}mlp.experts.{x}.", h, c["moe_intermediate_size"])
    return t


def fp8_mlp(p, h, i):
    return (fp8_linear(p + "gate_proj", i, h) + fp8_linear(p + "up_proj", i, h) +
            fp8_linear(p + "down_proj", h, i))


def is_routed_expert(name):
    return ".experts." in name and ".shared_experts." not in name


def logical(tensors):
    """The parameters of a tensor list: FP8 block scales are no parameters."""
    return [(n, d, s) for n, d, s in tensors if not n.endswith("weight_scale_inv")]


def expected_active(config, tensors, e, k):
    """The brief's formula, from the tensor list: dense, attention, embeddings, router and shared
    experts fully, each MoE layer's routed experts k / E."""
    params = logical(tensors)
    routed = sum(numel(s) for n, _, s in params if is_routed_expert(n))
    total = sum(numel(s) for _, _, s in params)
    assert routed % e == 0
    return total, total - routed + routed // e * k


# (name, config, tensors, published total, published active: exact or in billions to a tenth,
# and what the published active count leaves out). gpt-oss's model card counts 3.61B active
# without the input embedding (a lookup, no matmul); describe counts embeddings fully as the others
# publish them (Mixtral's 12.9B and Qwen3's 3.3B hold both embeddings).
PUBLISHED = [
    ("Mixtral-8x7B", MIXTRAL_8X7B, mixtral_tensors, 46_702_792_704, 12.9, 0),
    ("Qwen3-30B-A3B", QWEN3_30B_A3B, qwen3_moe_tensors, 30_532_122_624, 3.3, 0),
    ("OLMoE-1B-7B", OLMOE_1B_7B, olmoe_tensors, 6.9, 1.3, 0),
    ("gpt-oss-20b", GPT_OSS_20B, gpt_oss_tensors, 20.9, 3.6, 201088 * 2880),
]


def near(value, published):
    """An exact published count, or one published in billions to a tenth, rounded (Mixtral's
    12.88B as 12.9B) or truncated (Qwen3's 3.35B as 3.3B)."""
    if isinstance(published, int):
        return value == published
    tenths = round(published * 10)
    return tenths in (round(value / 1e8), value // 10**8)


@pytest.mark.parametrize("name,config,make,total,active,not_in_active", PUBLISHED,
                         ids=[p[0] for p in PUBLISHED])
def test_published_moe_checkpoints_give_their_total_and_active_parameters(
        tmp_path, name, config, make, total, active, not_in_active):
    d = str(tmp_path / name)
    tensors = make(config)
    stored = write_dir(d, config, tensors)
    info = metaload.describe(d)
    e = config.get("num_local_experts") or config.get("num_experts")
    k = config["num_experts_per_tok"]
    want_total, want_active = expected_active(config, tensors, e, k)
    assert info.n_params == want_total and near(info.n_params, total), info.n_params
    m = info.moe
    assert m is not None, name
    assert (m.n_experts, m.experts_per_token, m.n_moe_layers) == (e, k, config["num_hidden_layers"])
    assert m.active_params == want_active, m.active_params
    assert near(m.active_params - not_in_active, active), m.active_params
    assert m.expert_params == sum(numel(s) for n, _, s in tensors if is_routed_expert(n))
    assert m.expert_bytes == m.expert_params * 2  # BF16
    assert info.size_bytes == stored
    assert m.layout == ("fused" if name.startswith("gpt-oss") else "per-expert")
    assert m.max_ep_size == e and m.ep_degrees == [x for x in range(1, e + 1) if e % x == 0]
    assert m.n_shared_experts == 0 and m.shared_expert_params == 0


def test_mixtral_fused_and_per_expert_layouts_describe_alike(tmp_path):
    write_dir(str(tmp_path / "per"), MIXTRAL_8X7B, mixtral_tensors(MIXTRAL_8X7B))
    per = metaload.describe(str(tmp_path / "per"))
    write_dir(str(tmp_path / "fused"), MIXTRAL_8X7B, mixtral_tensors(MIXTRAL_8X7B, fused=True))
    fused = metaload.describe(str(tmp_path / "fused"))
    assert (per.moe.layout, fused.moe.layout) == ("per-expert", "fused")
    assert fused.n_params == per.n_params == 46_702_792_704
    for f in ("n_experts", "experts_per_token", "n_moe_layers", "expert_params", "expert_bytes",
              "active_params", "max_ep_size", "ep_degrees"):
        assert getattr(fused.moe, f) == getattr(per.moe, f), f
    assert per.n_tensors - fused.n_tensors == 32 * (3 * 8 - 2)


def test_max_tp_size_divides_every_experts_intermediate_size():
    # Qwen3-30B-A3B: gcd(32 heads, 4 kv heads, 6144, 768) = 4; Mixtral: gcd(32, 8, 14336) = 8.
    assert metaload.max_tp_size(QWEN3_30B_A3B) == 4
    assert metaload.max_tp_size(MIXTRAL_8X7B) == 8
    # DeepSeek-V3: 128 heads, 18432 dense, 2048 per expert.
    assert metaload.max_tp_size(DEEPSEEK_V3) == 128
    # An expert's rows that no larger degree divides: 8 heads and a dense 64 would allow 8, the
    # experts' 12 rows only 4; Qwen2-MoE's shared expert likewise.
    c = {"num_attention_heads": 8, "num_key_value_heads": 8, "intermediate_size": 64,
         "moe_intermediate_size": 12, "num_experts": 6}
    assert metaload.max_tp_size(c) == 4
    assert metaload.max_tp_size(dict(c, moe_intermediate_size=16,
                                      shared_expert_intermediate_size=40)) == 8
    # With expert parallelism the expert count joins: gcd(4, 6) = 2.
    assert metaload.max_tp_size(c, expert_parallel=True) == 2


def test_deepseek_v3_fp8_block_scales_per_expert_sized_exactly(tmp_path):
    d = str(tmp_path / "dsv3")
    tensors = deepseek_v3_tensors(DEEPSEEK_V3)
    stored = write_dir(d, DEEPSEEK_V3, tensors)
    info = metaload.describe(d)
    total, active = expected_active(DEEPSEEK_V3, tensors, 256, 8)
    assert info.size_bytes == stored == info.stored_bytes
    assert info.n_params == total and round(total / 1e9) == 671  # "671B" (MTP module not stored)
    m = info.moe
    assert m.active_params == active and active // 10**9 == 37  # "37B activated"
    assert (m.n_experts, m.n_shared_experts, m.experts_per_token) == (256, 1, 8)
    assert m.n_moe_layers == 61 - 3
    routed = [(n, d_, s) for n, d_, s in tensors if is_routed_expert(n)]
    assert m.expert_params == sum(numel(s) for _, _, s in logical(routed))
    # Every routed expert byte: the FP8 weights and their F32 block scales.
    assert m.expert_bytes == sum(numel(s) * NBYTES[t] for _, t, s in routed)
    shared = [(n, d_, s) for n, d_, s in logical(tensors) if ".shared_experts." in n]
    assert m.shared_expert_params == sum(numel(s) for _, _, s in shared)
    assert info.quantization is not None
    assert m.max_ep_size == 256 and m.ep_degrees[-3:] == [64, 128, 256]
    # Every expert's 2048 rows split on whole 128-row scale blocks: 16 ways at most (the dense
    # layers' 18432 = 144 blocks agree); MLA's q_a_proj and kv_a_proj_with_mqa (576 rows) stay
    # whole on every rank, as vLLM keeps them.
    assert info.quantization["max_tp_size_unquantized"] == 128
    assert info.max_tp_size == 16, info.quantization["tp_limited_by"]
    assert "2048" in info.quantization["tp_limited_by"] or "18432" in info.quantization[
        "tp_limited_by"]


CT_GROUP = 32


def ct_linear(name, out, inp):
    """compressed-tensors pack-quantized int4, group 32, symmetric: the stored parts."""
    return [(name + ".weight_packed", "I32", (out, -(-inp * 4 // 32))),
            (name + ".weight_scale", "BF16", (out, -(-inp // CT_GROUP))),
            (name + ".weight_shape", "I64", (2,))]


def weight_shapes(tensors):
    """{name: int64 [out, in] bytes} of each compressed-tensors weight_shape, from its packed
    weight's rows and the input width its scales' groups give."""
    rows = {n[:-len(".weight_packed")]: s for n, _, s in tensors if n.endswith(".weight_packed")}
    cols = {n[:-len(".weight_scale")]: s[1] * CT_GROUP for n, _, s in tensors
            if n.endswith(".weight_scale")}
    return {m + ".weight_shape": struct.pack("<2q", rows[m][0], cols[m]) for m in rows}


def small_moe(linear, e=4, k=2, h=64, i=32, layers=2, shared=False):
    """A Qwen2-MoE-like tiny checkpoint whose projections `linear` writes; layer 0 dense."""
    c = {"model_type": "qwen2_moe", "architectures": ["Qwen2MoeForCausalLM"], "hidden_size": h,
         "intermediate_size": 2 * i, "moe_intermediate_size": i, "num_hidden_layers": layers,
         "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 128,
         "num_experts": e, "num_experts_per_tok": k, "mlp_only_layers": [0],
         "tie_word_embeddings": False}
    if shared:
        c["shared_expert_intermediate_size"] = 2 * i
    t = ends(c)
    for n in range(layers):
        p = f"model.layers.{n}."
        for proj, out, inp in (("q_proj", h, h), ("k_proj", h // 2, h), ("v_proj", h // 2, h),
                               ("o_proj", h, h)):
            t += linear(p + "self_attn." + proj, out, inp)
        t += [(p + "input_layernorm.weight", "BF16", (h,)),
              (p + "post_attention_layernorm.weight", "BF16", (h,))]
        mlps = [(p + "mlp.", 2 * i)] if n == 0 else [
            (f"{p}mlp.experts.{x}.", i) for x in range(e)]
        if n and shared:
            mlps.append((p + "mlp.shared_expert.", 2 * i))
            t.append((p + "mlp.shared_expert_gate.weight", "BF16", (1, h)))
        if n:
            t.append((p + "mlp.gate.weight", "BF16", (e, h)))
        for q, width in mlps:
            t += (linear(q + "gate_proj", width, h) + linear(q + "up_proj", width, h) +
                  linear(q + "down_proj", h, width))
    return c, t


def test_compressed_tensors_experts_sized_exactly_and_counted_logically(tmp_path):
    c, t = small_moe(ct_linear, shared=True)
    c["quantization_config"] = {
        "quant_method": "compressed-tensors", "format": "pack-quantized",
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
            "num_bits": 4, "type": "int", "symmetric": True, "strategy": "group",
            "group_size": CT_GROUP}}}}
    d = str(tmp_path / "ct")
    # weight_shape holds [out, in] as int64: its values, not its header, give the logical shape.
    stored = write_dir(d, c, t, weight_shapes(t))
    info = metaload.describe(d)
    assert info.size_bytes == stored
    h, i, e, k = 64, 32, 4, 2
    per_expert = 3 * h * i  # logical elements, not packed int32 words
    plain = sum(numel(s) for n, _, s in t if n.endswith(("norm.weight", "gate.weight",
                                                         "embed_tokens.weight", "lm_head.weight")))
    attn = 2 * (h * h + 2 * (h // 2) * h + h * h)
    dense = 3 * h * 2 * i
    shared = 3 * h * 2 * i
    total = plain + attn + dense + shared + e * per_expert
    assert info.n_params == total
    m = info.moe
    assert (m.n_experts, m.experts_per_token, m.n_moe_layers, m.n_shared_experts) == (e, k, 1, 1)
    assert m.expert_params == e * per_expert
    assert m.shared_expert_params == shared
    assert m.active_params == total - e * per_expert + k * per_expert
    assert m.expert_bytes == sum(numel(s) * NBYTES[dt] for n, dt, s in t if ".experts." in n)


# ---------------------------------------------------------------------------------------------
# Tiny checkpoints with data, written by metaload.save_file: the formula, exactly.


def tiny_mixtral(e=4, k=2, h=16, i=8, layers=2, fused=False, drop=None):
    c = {"model_type": "mixtral", "architectures": ["MixtralForCausalLM"], "hidden_size": h,
         "intermediate_size": i, "num_hidden_layers": layers, "num_attention_heads": 4,
         "num_key_value_heads": 2, "vocab_size": 32, "num_local_experts": e,
         "num_experts_per_tok": k, "tie_word_embeddings": False}
    sd = {name: torch.randn(shape, dtype=torch.bfloat16)
          for name, _, shape in mixtral_tensors(c, fused=fused)}
    if drop:
        sd = {n: v for n, v in sd.items() if drop not in n}
    return c, sd


def save_tiny(d, config, sd):
    os.makedirs(d, exist_ok=True)
    metaload.save_file(sd, os.path.join(d, "model.safetensors"))
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(config, f)
    return d


@pytest.mark.parametrize("fused", [False, True], ids=["per-expert", "fused"])
def test_tiny_mixtral_active_parameters_follow_the_formula(tmp_path, fused):
    c, sd = tiny_mixtral(fused=fused)
    info = metaload.describe(save_tiny(str(tmp_path / "m"), c, sd))
    total = sum(v.numel() for v in sd.values())
    routed = sum(v.numel() for n, v in sd.items() if ".experts." in n)
    assert routed == 2 * 4 * 3 * 16 * 8
    assert info.n_params == total
    assert info.moe.active_params == total - routed + routed * 2 // 4
    assert info.moe.layout == ("fused" if fused else "per-expert")
    assert info.moe.expert_bytes == routed * 2
    assert (info.moe.max_ep_size, info.moe.ep_degrees) == (4, [1, 2, 4])


def test_a_dense_checkpoint_has_no_moe_section(tmp_path):
    c = {"model_type": "llama", "hidden_size": 16, "intermediate_size": 32,
         "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 1}
    sd = {"model.layers.0.mlp.gate_proj.weight": torch.zeros(32, 16),
          "model.embed_tokens.weight": torch.zeros(8, 16)}
    info = metaload.describe(save_tiny(str(tmp_path / "dense"), c, sd))
    assert info.moe is None


def test_config_without_top_k_leaves_active_unknown_and_headers_alone_count_experts(tmp_path):
    c, sd = tiny_mixtral()
    del c["num_experts_per_tok"], c["num_local_experts"]
    info = metaload.describe(save_tiny(str(tmp_path / "m"), c, sd))
    assert info.moe.n_experts == 4 and info.moe.experts_per_token is None
    assert info.moe.active_params is None


# A checkpoint whose headers and config disagree is an error naming both: describe's counts would
# be wrong either way (the active parameters depend on E), and load_into could not load it.
def test_config_and_headers_disagreeing_on_the_experts_is_a_format_error(tmp_path):
    c, sd = tiny_mixtral(e=8)
    sd = {n: v for n, v in sd.items() if ".experts.7." not in n}  # headers hold 7
    with pytest.raises(metaload.FormatError) as e:
        metaload.describe(save_tiny(str(tmp_path / "seven"), c, sd))
    msg = str(e.value)
    assert "moe-expert-count" in msg and "num_local_experts" in msg
    assert "is 8 routed experts" in msg and "hold 7" in msg, msg


def test_a_missing_expert_index_is_named(tmp_path):
    c, sd = tiny_mixtral(e=4, drop=".experts.1.")
    with pytest.raises(metaload.FormatError) as e:
        metaload.describe(save_tiny(str(tmp_path / "gap"), c, sd))
    assert "no expert 1" in str(e.value) and "moe-expert-count" in str(e.value)


def test_fused_experts_disagreeing_with_the_config(tmp_path):
    c, sd = tiny_mixtral(e=4, fused=True)
    c["num_local_experts"] = 6
    with pytest.raises(metaload.FormatError) as e:
        metaload.describe(save_tiny(str(tmp_path / "f"), c, sd))
    assert "is 6 routed experts" in str(e.value) and "hold 4" in str(e.value)


def test_top_k_above_the_experts_is_a_format_error(tmp_path):
    c, sd = tiny_mixtral(e=4)
    c["num_experts_per_tok"] = 5
    with pytest.raises(metaload.FormatError) as e:
        metaload.describe(save_tiny(str(tmp_path / "k"), c, sd))
    assert "moe-experts-per-token" in str(e.value)


def test_cli_describe_lists_experts_active_parameters_and_ep_degree(tmp_path):
    d = str(tmp_path / "q")
    write_dir(d, QWEN3_30B_A3B, qwen3_moe_tensors(QWEN3_30B_A3B))
    r = run_cli("describe", d)
    assert r.returncode == 0, r.stderr
    assert "128 routed, 8 per token" in r.stdout
    assert "3,353,032,704 per token" in r.stdout
    assert "max EP degree" in r.stdout and "max TP degree" in r.stdout
    j = run_cli("describe", d, "--json")
    out = json.loads(j.stdout)["moe"]
    assert out["active_params"] == 3_353_032_704 and out["ep_degrees"][-1] == 128
