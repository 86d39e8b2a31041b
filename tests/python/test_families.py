"""The C++ GPT-2 and Llama families against an independent float64 reference written here.

The reference follows the published architectures (GPT-2: learned positions, pre-LayerNorm blocks,
Conv1D weights stored [in, out], tanh GELU, tied head; Llama: RMSNorm, rotary embeddings on
(i, i + d/2) pairs with rope_theta and the llama3 frequency rule, grouped-query attention, SiLU
gated MLP; Qwen2 q/k/v biases; Mistral/Qwen2 sliding windows). It is written from the papers and
the transformers configuration semantics, not from the C++ code: per-head loops, explicit repeated
kv heads, explicit masks. Weights are random and deterministic; the C++ model gets the same ones
through torch.ops.metaload._family_test_*, from the test operators' own library (conftest).
"""
import json
import math
import os

import pytest
import torch

from conftest import FAMILY_TEST_OPS, family_test_ops, lib_path, run_python
from metaload import _lib

ops = family_test_ops()

TINY = ["gpt2-tiny", "llama-tiny", "llama-tiny-tied", "qwen2-tiny", "mistral-tiny"]


def builtin(name):
    return json.loads(ops._family_builtin_config(name))


# ---------------------------------------------------------------------------------------------
# Hugging Face parameter names and shapes, from the transformers modeling files' attributes.

def hf_parameters(cfg):
    """[(name, shape)] of the state_dict, tied lm_head included; and the tied pairs."""
    out, tied = [], []
    if cfg["model_type"] == "gpt2":
        n, inner = cfg["n_embd"], cfg.get("n_inner") or 4 * cfg["n_embd"]
        out += [("transformer.wte.weight", (cfg["vocab_size"], n)),
                ("transformer.wpe.weight", (cfg["n_positions"], n))]
        for i in range(cfg["n_layer"]):
            p = f"transformer.h.{i}."
            out += [(p + "ln_1.weight", (n,)), (p + "ln_1.bias", (n,)),
                    (p + "attn.c_attn.weight", (n, 3 * n)), (p + "attn.c_attn.bias", (3 * n,)),
                    (p + "attn.c_proj.weight", (n, n)), (p + "attn.c_proj.bias", (n,)),
                    (p + "ln_2.weight", (n,)), (p + "ln_2.bias", (n,)),
                    (p + "mlp.c_fc.weight", (n, inner)), (p + "mlp.c_fc.bias", (inner,)),
                    (p + "mlp.c_proj.weight", (inner, n)), (p + "mlp.c_proj.bias", (n,))]
        out += [("transformer.ln_f.weight", (n,)), ("transformer.ln_f.bias", (n,)),
                ("lm_head.weight", (cfg["vocab_size"], n))]
        if cfg.get("tie_word_embeddings", True):
            tied.append(("lm_head.weight", "transformer.wte.weight"))
        return out, tied
    h, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    kv_heads = cfg.get("num_key_value_heads") or heads
    d = cfg.get("head_dim") or h // heads
    inter = cfg["intermediate_size"]
    qwen2 = cfg["model_type"] == "qwen2"
    llama = cfg["model_type"] == "llama"
    qkv_bias = qwen2 or (llama and cfg.get("attention_bias", False))
    o_bias = llama and cfg.get("attention_bias", False)
    mlp_bias = llama and cfg.get("mlp_bias", False)
    out.append(("model.embed_tokens.weight", (cfg["vocab_size"], h)))
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        for name, o, inp, bias in [("self_attn.q_proj", heads * d, h, qkv_bias),
                                   ("self_attn.k_proj", kv_heads * d, h, qkv_bias),
                                   ("self_attn.v_proj", kv_heads * d, h, qkv_bias),
                                   ("self_attn.o_proj", h, heads * d, o_bias),
                                   ("mlp.gate_proj", inter, h, mlp_bias),
                                   ("mlp.up_proj", inter, h, mlp_bias),
                                   ("mlp.down_proj", h, inter, mlp_bias)]:
            out.append((p + name + ".weight", (o, inp)))
            if bias:
                out.append((p + name + ".bias", (o,)))
        out += [(p + "input_layernorm.weight", (h,)), (p + "post_attention_layernorm.weight", (h,))]
    out += [("model.norm.weight", (h,)), ("lm_head.weight", (cfg["vocab_size"], h))]
    if cfg.get("tie_word_embeddings", False):
        tied.append(("lm_head.weight", "model.embed_tokens.weight"))
    return out, tied


def random_weights(cfg, seed):
    """float64 weights, scaled so that activations stay O(1) and attention is far from uniform."""
    g = torch.Generator().manual_seed(seed)
    params, tied = hf_parameters(cfg)
    tied_names = {a for a, _ in tied}
    w = {}
    for name, shape in params:
        if name in tied_names:
            continue
        if name.endswith("norm.weight") or name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight")):
            t = 1.0 + 0.2 * torch.randn(shape, generator=g, dtype=torch.float64)
        elif len(shape) == 1:
            t = 0.2 * torch.randn(shape, generator=g, dtype=torch.float64)
        elif "embed" in name or name.endswith(("wte.weight", "wpe.weight")):
            t = torch.randn(shape, generator=g, dtype=torch.float64)
        else:
            # std 2/sqrt(fan_in): larger than init, so the logits spread.
            fan_in = shape[0] if cfg["model_type"] == "gpt2" else shape[1]
            t = torch.randn(shape, generator=g, dtype=torch.float64) * (2.0 / math.sqrt(fan_in))
        w[name] = t
    for a, b in tied:
        w[a] = w[b]
    return w


def cxx_args(cfg, w):
    """The (names, tensors) the C++ op takes: each tied tensor once, under the stored name."""
    names = [n for n, _ in hf_parameters(cfg)[0] if n in w and not (
        n == "lm_head.weight" and any(a == n for a, _ in hf_parameters(cfg)[1]))]
    return names, [w[n].float() for n in names]


# ---------------------------------------------------------------------------------------------
# The float64 reference.

def layer_norm(x, weight, bias, eps):
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + eps) * weight + bias


def rms_norm(x, weight, eps):
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * weight


def gelu_tanh(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def attention(q, k, v, window=None, scale=None):
    """q [S, Dh], k and v [S, Dh] of one head: causal softmax attention, optional window."""
    S, dh = q.shape
    scores = q @ k.T * (1 / math.sqrt(dh) if scale is None else scale)
    i = torch.arange(S).unsqueeze(1)
    j = torch.arange(S).unsqueeze(0)
    allowed = j <= i
    if window:
        allowed = allowed & (i - j < window)
    scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.softmax(scores, -1) @ v


def gpt2_reference(cfg, w, ids):
    n, heads = cfg["n_embd"], cfg["n_head"]
    dh = n // heads
    eps = cfg.get("layer_norm_epsilon", 1e-5)
    logits = []
    for seq in ids:
        S = seq.shape[0]
        x = w["transformer.wte.weight"][seq] + w["transformer.wpe.weight"][:S]
        for layer in range(cfg["n_layer"]):
            p = f"transformer.h.{layer}."
            a = layer_norm(x, w[p + "ln_1.weight"], w[p + "ln_1.bias"], eps)
            qkv = a @ w[p + "attn.c_attn.weight"] + w[p + "attn.c_attn.bias"]  # Conv1D: x @ W
            q, k, v = qkv[:, :n], qkv[:, n:2 * n], qkv[:, 2 * n:]
            scale = 1 / math.sqrt(dh) if cfg.get("scale_attn_weights", True) else 1.0
            if cfg.get("scale_attn_by_inverse_layer_idx", False):
                scale /= layer + 1
            out = torch.cat([attention(q[:, h * dh:(h + 1) * dh], k[:, h * dh:(h + 1) * dh],
                                       v[:, h * dh:(h + 1) * dh], scale=scale)
                             for h in range(heads)], -1)
            x = x + out @ w[p + "attn.c_proj.weight"] + w[p + "attn.c_proj.bias"]
            m = layer_norm(x, w[p + "ln_2.weight"], w[p + "ln_2.bias"], eps)
            m = m @ w[p + "mlp.c_fc.weight"] + w[p + "mlp.c_fc.bias"]
            m = torch.relu(m) if cfg.get("activation_function") == "relu" else gelu_tanh(m)
            x = x + m @ w[p + "mlp.c_proj.weight"] + w[p + "mlp.c_proj.bias"]
        x = layer_norm(x, w["transformer.ln_f.weight"], w["transformer.ln_f.bias"], eps)
        logits.append(x @ w["lm_head.weight"].T)
    return torch.stack(logits)


def rope_frequencies(cfg, d):
    """Per-pair angular frequencies, in float64: theta^(-2j/d), then rope_scaling."""
    theta = cfg.get("rope_theta", 10000.0)
    freqs = [theta ** (-(2 * j) / d) for j in range(d // 2)]
    scaling = cfg.get("rope_scaling") or {}
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "linear":
        freqs = [f / scaling["factor"] for f in freqs]
    elif kind == "llama3":
        # Llama 3.1: keep high frequencies, divide low ones by factor, interpolate between.
        factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
        context = scaling["original_max_position_embeddings"]
        out = []
        for f in freqs:
            wavelength = 2 * math.pi / f
            if wavelength < context / high:
                out.append(f)
            elif wavelength > context / low:
                out.append(f / factor)
            else:
                smooth = (context / wavelength - low) / (high - low)
                out.append((1 - smooth) * f / factor + smooth * f)
        freqs = out
    return torch.tensor(freqs, dtype=torch.float64)


def rotate(x, freqs):
    """x [S, d]: rotates each pair (x[j], x[j + d/2]) by angle position * freqs[j]."""
    S, d = x.shape
    half = d // 2
    angles = torch.arange(S, dtype=torch.float64).unsqueeze(1) * freqs.unsqueeze(0)  # [S, d/2]
    c, s = torch.cos(angles), torch.sin(angles)
    a, b = x[:, :half], x[:, half:]
    return torch.cat([a * c - b * s, b * c + a * s], -1)


def layer_windows(cfg):
    layers = cfg["num_hidden_layers"]
    if cfg["model_type"] == "mistral":
        w = cfg.get("sliding_window", 4096)
        return [w] * layers
    if cfg["model_type"] == "qwen2" and cfg.get("use_sliding_window", False):
        w = cfg.get("sliding_window", 4096)
        first = cfg.get("max_window_layers", 28)
        return [w if i >= first else None for i in range(layers)]
    return [None] * layers


def llama_reference(cfg, w, ids, rotate_fn=None, kv_of=None):
    h, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    kv_heads = cfg.get("num_key_value_heads") or heads
    rotate_fn = rotate_fn or rotate
    # Grouped-query attention: consecutive query heads share one kv head.
    kv_of = kv_of or (lambda head: head * kv_heads // heads)
    d = cfg.get("head_dim") or h // heads
    eps = cfg.get("rms_norm_eps", 1e-6)
    freqs = rope_frequencies(cfg, d)
    windows = layer_windows(cfg)

    def linear(x, name):
        y = x @ w[name + ".weight"].T
        return y + w[name + ".bias"] if name + ".bias" in w else y

    logits = []
    for seq in ids:
        x = w["model.embed_tokens.weight"][seq]
        for layer in range(cfg["num_hidden_layers"]):
            p = f"model.layers.{layer}."
            a = rms_norm(x, w[p + "input_layernorm.weight"], eps)
            q = linear(a, p + "self_attn.q_proj")
            k = linear(a, p + "self_attn.k_proj")
            v = linear(a, p + "self_attn.v_proj")
            outs = []
            for head in range(heads):
                kv = kv_of(head)
                qh = rotate_fn(q[:, head * d:(head + 1) * d], freqs)
                kh = rotate_fn(k[:, kv * d:(kv + 1) * d], freqs)
                outs.append(attention(qh, kh, v[:, kv * d:(kv + 1) * d], windows[layer]))
            x = x + linear(torch.cat(outs, -1), p + "self_attn.o_proj")
            m = rms_norm(x, w[p + "post_attention_layernorm.weight"], eps)
            gate = linear(m, p + "mlp.gate_proj")
            x = x + linear(gate * torch.sigmoid(gate) * linear(m, p + "mlp.up_proj"), p + "mlp.down_proj")
        x = rms_norm(x, w["model.norm.weight"], eps)
        logits.append(x @ w["lm_head.weight"].T)
    return torch.stack(logits)


def reference(cfg, w, ids):
    return (gpt2_reference if cfg["model_type"] == "gpt2" else llama_reference)(cfg, w, ids)


def reference_greedy(cfg, w, ids, n):
    seq = ids.clone()
    for _ in range(n):
        nxt = reference(cfg, w, seq)[:, -1].argmax(-1, keepdim=True)
        seq = torch.cat([seq, nxt], 1)
    return seq


def relative_error(got, want):
    return ((got.double() - want).abs().max() / want.abs().max()).item()


def random_ids(cfg, batch, length, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(cfg["vocab_size"], (batch, length), generator=g)


# ---------------------------------------------------------------------------------------------

def variants():
    """The built-in tiny configs plus variants of them that exercise other config keys."""
    out = [(name, builtin(name)) for name in TINY]
    linear = builtin("llama-tiny")
    linear["rope_scaling"] = {"rope_type": "linear", "factor": 4.0}
    out.append(("llama-tiny+linear-rope", linear))
    old_key = builtin("llama-tiny")
    old_key["rope_scaling"]["type"] = old_key["rope_scaling"].pop("rope_type")  # older configs
    old_key["tie_word_embeddings"] = True
    out.append(("llama-tiny+tied+type-key", old_key))
    gpt2 = builtin("gpt2-tiny")
    gpt2["n_inner"] = 96
    gpt2["tie_word_embeddings"] = False
    out.append(("gpt2-tiny+n_inner+untied", gpt2))
    scales = builtin("gpt2-tiny")
    scales["scale_attn_by_inverse_layer_idx"] = True
    out.append(("gpt2-tiny+inverse-layer-scale", scales))
    unscaled = builtin("gpt2-tiny")
    unscaled["scale_attn_weights"] = False
    unscaled["activation_function"] = "relu"
    out.append(("gpt2-tiny+unscaled+relu", unscaled))
    qwen = builtin("qwen2-tiny")
    qwen["use_sliding_window"] = False
    out.append(("qwen2-tiny+no-window", qwen))
    # A large eps moves the logits far (> 1e-2) from a forward that used another eps, so the
    # reference (which uses the configured one) catches an eps the forward ignores.
    out.append(("llama-tiny+eps", dict(builtin("llama-tiny"), rms_norm_eps=0.3)))
    out.append(("gpt2-tiny+eps", dict(builtin("gpt2-tiny"), layer_norm_epsilon=0.3)))
    return out


VARIANTS = variants()


@pytest.mark.parametrize("name,cfg", VARIANTS, ids=[v[0] for v in VARIANTS])
def test_names_are_the_hugging_face_ones(name, cfg):
    expected = [n for n, _ in hf_parameters(cfg)[0]]
    assert list(ops._family_parameter_names(json.dumps(cfg))) == expected


@pytest.mark.parametrize("name,cfg", VARIANTS, ids=[v[0] for v in VARIANTS])
def test_logits_match_the_float64_reference(name, cfg):
    w = random_weights(cfg, seed=1)
    ids = random_ids(cfg, 2, 13, seed=2)  # longer than every tiny sliding window
    want = reference(cfg, w, ids)
    names, tensors = cxx_args(cfg, w)
    got = ops._family_test_forward(json.dumps(cfg), names, tensors, ids)
    assert got.dtype == torch.float32 and got.shape == want.shape
    assert relative_error(got, want) < 1e-4
    # Not trivially small: the logits spread, so the comparison is meaningful.
    assert want.std() > 0.5
    # The same logits when fed in chunks through the KV cache.
    chunked = ops._family_test_forward_chunked(json.dumps(cfg), names, tensors, ids, [5, 1, 4, 3])
    assert relative_error(chunked, want) < 1e-4


@pytest.mark.parametrize("name,cfg", VARIANTS, ids=[v[0] for v in VARIANTS])
def test_greedy_tokens_match_the_reference(name, cfg):
    w = random_weights(cfg, seed=3)
    prompt = random_ids(cfg, 2, 4, seed=4)
    want = reference_greedy(cfg, w, prompt, 8)
    names, tensors = cxx_args(cfg, w)
    cached = ops._family_test_generate(json.dumps(cfg), names, tensors, prompt, 8, True)
    plain = ops._family_test_generate(json.dumps(cfg), names, tensors, prompt, 8, False)
    assert torch.equal(cached, want)
    assert torch.equal(plain, want)
    assert len(set(want[:, 4:].flatten().tolist())) > 1  # the model conditions on its input


def rotate_interleaved(x, freqs):
    """The other RoPE convention (GPT-J, Meta's original code): pairs (x[2j], x[2j+1])."""
    S, d = x.shape
    angles = torch.arange(S, dtype=torch.float64).unsqueeze(1) * freqs.unsqueeze(0)
    c, s = torch.cos(angles), torch.sin(angles)
    a, b = x[:, 0::2], x[:, 1::2]
    out = torch.empty_like(x)
    out[:, 0::2] = a * c - b * s
    out[:, 1::2] = b * c + a * s
    return out


def test_the_tolerance_separates_wrong_conventions():
    """The C++ logits are far (> 1e-3) from references with one convention changed: no llama3
    frequency rule, interleaved rotary pairs, kv head h % kv instead of h // (heads / kv)."""
    cfg = builtin("llama-tiny")
    w = random_weights(cfg, seed=1)
    ids = random_ids(cfg, 1, 13, seed=2)
    names, tensors = cxx_args(cfg, w)
    got = ops._family_test_forward(json.dumps(cfg), names, tensors, ids)
    assert relative_error(got, llama_reference(cfg, w, ids)) < 1e-4
    assert relative_error(got, llama_reference(dict(cfg, rope_scaling=None), w, ids)) > 1e-3
    assert relative_error(got, llama_reference(cfg, w, ids, rotate_fn=rotate_interleaved)) > 1e-3
    kv = cfg["num_key_value_heads"]
    assert relative_error(got, llama_reference(cfg, w, ids, kv_of=lambda h: h % kv)) > 1e-3


@pytest.mark.parametrize("name,key", [("llama-tiny", "rms_norm_eps"),
                                      ("gpt2-tiny", "layer_norm_epsilon")])
def test_the_norm_eps_reaches_the_forward(name, key):
    """With eps 0.3 the C++ logits match the reference that uses 0.3 and are far from one that
    uses the default eps: the "+eps" variants above would fail if the forward ignored eps."""
    cfg = dict(builtin(name), **{key: 0.3})
    w = random_weights(cfg, seed=1)
    ids = random_ids(cfg, 1, 7, seed=2)
    names, tensors = cxx_args(cfg, w)
    got = ops._family_test_forward(json.dumps(cfg), names, tensors, ids)
    assert relative_error(got, reference(cfg, w, ids)) < 1e-4
    assert relative_error(got, reference(builtin(name), w, ids)) > 1e-2


def typed(fn):
    return _lib.typed_errors(fn)


def test_config_errors_are_typed():
    cfg = builtin("llama-tiny")
    del cfg["num_attention_heads"]
    with pytest.raises(_lib.error_class("ConfigError"), match="'num_attention_heads' is missing"):
        typed(ops._family_parameter_names)(json.dumps(cfg))
    with pytest.raises(_lib.error_class("ConfigError"), match="invalid JSON"):
        typed(ops._family_parameter_names)("{")
    with pytest.raises(_lib.error_class("ConfigError"), match="unknown built-in config 'gpt3'"):
        typed(ops._family_builtin_config)("gpt3")


def test_weight_and_input_errors_are_typed():
    cfg = builtin("gpt2-tiny")
    w = random_weights(cfg, seed=1)
    names, tensors = cxx_args(cfg, w)
    family_error = _lib.error_class("FamilyError")
    text = json.dumps(cfg)
    ids = random_ids(cfg, 1, 3, seed=1)
    with pytest.raises(family_error, match=r"missing: transformer\.ln_f\.bias"):
        typed(ops._family_test_forward)(text, names[:-1], tensors[:-1], ids)
    with pytest.raises(family_error, match=r"unexpected: transformer\.h\.0\.attn\.q_proj\.weight"):
        typed(ops._family_test_forward)(text, names + ["transformer.h.0.attn.q_proj.weight"],
                                        tensors + [tensors[0]], ids)
    bad = list(tensors)
    bad[2] = bad[2][:-1]
    with pytest.raises(family_error, match=r"'transformer\.h\.0\.ln_1\.weight' has shape \[63\]"):
        typed(ops._family_test_forward)(text, names, bad, ids)
    with pytest.raises(family_error, match=r"token id 256 at \[0, 1\]"):
        typed(ops._family_test_forward)(text, names, tensors, torch.tensor([[1, 256, 2]]))
    with pytest.raises(family_error, match="positions"):
        typed(ops._family_test_generate)(text, names, tensors, ids, 62, True)


# ---------------------------------------------------------------------------------------------
# The test operators are not part of the release library (issue 13).

def test_the_release_library_registers_no_family_test_operator():
    # A fresh process with the package's library alone: none of the operators, and no op at all
    # whose name starts with _family_ in torch's dispatcher; with the test library, all of them.
    r = run_python(
        f"import sys; sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})\n"
        "import torch, metaload\n"
        "from conftest import FAMILY_TEST_OPS, family_test_ops\n"
        "def family_ops():  # every registered schema (torch._C has no op-name list in 1.13)\n"
        "    return sorted({s.name for s in torch._C._jit_get_all_schemas()\n"
        "                   if s.name.startswith('metaload::_family_')})\n"
        "assert 'metaload::init' in {s.name for s in torch._C._jit_get_all_schemas()}\n"
        "print(family_ops())\n"
        "def has(n):  # torch 1.13 raises RuntimeError for an unknown op, 2.x AttributeError\n"
        "    try:\n"
        "        return getattr(torch.ops.metaload, n) is not None\n"
        "    except (AttributeError, RuntimeError):\n"
        "        return False\n"
        "print([n for n in FAMILY_TEST_OPS if has(n)])\n"
        "family_test_ops()\n"
        "print(family_ops())\n")
    assert r.returncode == 0, r.stderr
    release, named, with_tests = r.stdout.splitlines()[-3:]
    assert release == "[]" and named == "[]", r.stdout
    assert with_tests == str(sorted("metaload::" + n for n in FAMILY_TEST_OPS)), r.stdout
    # Nor their schema strings in the file itself.
    data = open(lib_path(), "rb").read()
    assert all(n.encode() + b"(" not in data for n in FAMILY_TEST_OPS)
