"""metaload's C++ families (GPT-2, Llama, Mistral, Qwen2) against transformers' own implementation.

The primary correctness test of the families: each case builds a tiny random transformers model
(GPT2LMHeadModel, LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM; a few layers; grouped-
query attention, Qwen2's q/k/v biases, Mistral's and Qwen2's sliding windows, the rope variants the
family supports), writes it with save_pretrained (config.json as transformers writes it, so
transformers 5's `rope_parameters` included) and loads that directory twice: with
metaload.TransformersModel (the C++ family) and with transformers' from_pretrained. Asserted, in
float32 on the CPU:
  - logits: max |metaload - transformers| / max |transformers| < 1e-4 over the whole
    [batch, seq, vocab] tensor (the max-norm relative error, as test_families.py's);
  - 16 greedy tokens identical (metaload's generate against transformers' generate).
Config variants metaload does not implement are refused with a ConfigError naming the field.
test_families.py keeps the float64 reference written from the papers.

transformers 5.x needs torch 2.x: on Debian's torch 1.13 this file is skipped (it says so).
"""
import json
import math
import os

import pytest
import torch

transformers = pytest.importorskip(
    "transformers", reason="transformers 5.x (tools/requirements.txt) is installed in the torch "
    "2.x environment only: it needs torch >= 2")

from metaload import _lib  # noqa: E402
from metaload.model import TransformersModel  # noqa: E402

transformers.logging.set_verbosity_error()

TOLERANCE = 1e-4
STEPS = 16
VOCAB = 256


def gpt2(**kw):
    base = dict(vocab_size=VOCAB, n_embd=64, n_layer=3, n_head=4, n_positions=64,
                bos_token_id=0, eos_token_id=0)
    return transformers.GPT2Config(**dict(base, **kw)), transformers.GPT2LMHeadModel


def llama(**kw):
    base = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    return transformers.LlamaConfig(**dict(base, **kw)), transformers.LlamaForCausalLM


def mistral(**kw):
    base = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                sliding_window=5)
    return transformers.MistralConfig(**dict(base, **kw)), transformers.MistralForCausalLM


def qwen2(**kw):
    base = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                num_attention_heads=4, num_key_value_heads=1, max_position_embeddings=64,
                use_sliding_window=True, sliding_window=5, max_window_layers=1)
    return transformers.Qwen2Config(**dict(base, **kw)), transformers.Qwen2ForCausalLM


LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 16,
               "rope_theta": 500000.0}

CASES = {
    "gpt2": lambda: gpt2(),
    "gpt2+untied+n_inner+eps": lambda: gpt2(tie_word_embeddings=False, n_inner=80,
                                            layer_norm_epsilon=0.3),
    "gpt2+inverse-layer-scale+gelu": lambda: gpt2(scale_attn_by_inverse_layer_idx=True,
                                                  activation_function="gelu"),
    "gpt2+unscaled+relu": lambda: gpt2(scale_attn_weights=False, activation_function="relu"),
    "llama+gqa": lambda: llama(),
    "llama+llama3-rope": lambda: llama(rope_parameters=dict(LLAMA3_ROPE)),
    "llama+linear-rope+theta": lambda: llama(
        rope_parameters={"rope_type": "linear", "factor": 4.0, "rope_theta": 1000.0}),
    "llama+legacy-rope_scaling": lambda: llama(
        rope_scaling={"type": "linear", "factor": 2.0}, rope_theta=5000.0),
    "llama+tied+biases+mha": lambda: llama(tie_word_embeddings=True, attention_bias=True,
                                           mlp_bias=True, num_key_value_heads=4),
    "llama+head_dim+eps+gelu": lambda: llama(head_dim=24, rms_norm_eps=0.3,
                                             hidden_act="gelu_pytorch_tanh"),
    "mistral+gqa+window": lambda: mistral(),
    "mistral+no-window": lambda: mistral(sliding_window=None),
    "qwen2+mqa+bias+window": lambda: qwen2(),
    "qwen2+tied+no-window": lambda: qwen2(use_sliding_window=False, tie_word_embeddings=True,
                                          num_key_value_heads=2),
}


def scale_weights(model, seed):
    """transformers' init (std 0.02) gives near-uniform logits; these spread them, so that the
    comparison and the greedy tokens mean something: matrices std 2/sqrt(fan_in), embeddings
    std 1, norm weights 1 + 0.2 N(0, 1), biases 0.2 N(0, 1)."""
    g = torch.Generator().manual_seed(seed)
    gpt2_model = isinstance(model, transformers.GPT2LMHeadModel)
    with torch.no_grad():
        for name, p in model.named_parameters():  # a tied head is listed once
            if "norm" in name or ".ln_" in name:
                value = 1.0 + 0.2 * torch.randn(p.shape, generator=g) if name.endswith("weight") \
                    else 0.2 * torch.randn(p.shape, generator=g)
            elif p.dim() == 1:
                value = 0.2 * torch.randn(p.shape, generator=g)
            elif "embed" in name or "wte" in name or "wpe" in name:
                value = torch.randn(p.shape, generator=g)
            else:
                fan_in = p.shape[0] if gpt2_model else p.shape[1]  # GPT-2's Conv1D is [in, out]
                value = torch.randn(p.shape, generator=g) * (2.0 / math.sqrt(fan_in))
            p.copy_(value)


def write_model(tmp_path, case, seed=1):
    config, cls = CASES[case]()
    torch.manual_seed(seed)
    model = cls(config).float().eval()
    scale_weights(model, seed)
    out = tmp_path / case.replace("+", "_")
    model.save_pretrained(str(out))
    return str(out)


def relative_error(got, want):
    return ((got.double() - want.double()).abs().max() / want.double().abs().max()).item()


def random_ids(batch, length, seed):
    return torch.randint(VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


def hf_model(directory):
    return transformers.AutoModelForCausalLM.from_pretrained(
        directory, dtype=torch.float32, attn_implementation="eager").eval()


def hf_greedy(model, ids, n):
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n,
                         min_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0)
    assert out.shape == (ids.shape[0], ids.shape[1] + n)
    return out


@pytest.mark.parametrize("case", list(CASES))
def test_logits_and_greedy_tokens_match_transformers(case, tmp_path):
    directory = write_model(tmp_path, case)
    hf = hf_model(directory)
    ml = TransformersModel(directory, dispatch=True)
    assert ml.config["model_type"] == hf.config.model_type

    ids = random_ids(2, 13, seed=2)  # longer than every sliding window here
    with torch.no_grad():
        want = hf(ids).logits
    got = ml(ids)
    assert got.dtype == torch.float32 and got.shape == want.shape
    err = relative_error(got, want)
    assert err < TOLERANCE, f"{case}: logits differ from transformers' by {err:.2e} (max-norm)"
    assert want.std() > 0.5  # the logits spread: the comparison means something

    prompt = random_ids(2, 4, seed=3)
    with torch.no_grad():
        want_tokens = hf_greedy(hf, prompt, STEPS)
    got_tokens = ml.generate(prompt, STEPS)
    assert torch.equal(got_tokens, want_tokens), f"{case}:\n{got_tokens}\n{want_tokens}"
    assert len(set(want_tokens[:, 4:].flatten().tolist())) > 1  # conditioned on the input


def test_the_tolerance_separates_a_wrong_rope_theta(tmp_path):
    """The tolerance is tight enough to see a rope_theta ignored: transformers' own logits with
    rope_theta 10000 instead of the written 500000 are far (> 1e-3) from those with it."""
    directory = write_model(tmp_path, "llama+llama3-rope")
    ids = random_ids(1, 13, seed=2)
    with torch.no_grad():
        want = hf_model(directory)(ids).logits
        config, cls = CASES["llama+llama3-rope"]()
        config.rope_parameters["rope_theta"] = 10000.0
        wrong = cls.from_pretrained(directory, config=config, dtype=torch.float32).eval()(ids).logits
    assert relative_error(wrong, want) > 1e-3
    assert relative_error(TransformersModel(directory, dispatch=True)(ids), want) < TOLERANCE


def rewrite_config(directory, **changes):
    path = os.path.join(directory, "config.json")
    with open(path) as f:
        cfg = json.load(f)
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(cfg.get(key), dict):
            cfg[key].update(value)
        else:
            cfg[key] = value
    with open(path, "w") as f:
        json.dump(cfg, f)


@pytest.mark.parametrize("changes,field", [
    ({"rope_parameters": {"rope_type": "yarn", "factor": 4.0}}, "rope_parameters.rope_type"),
    ({"rope_parameters": {"rope_type": "dynamic", "factor": 4.0}}, "rope_parameters.rope_type"),
    ({"rope_parameters": {"partial_rotary_factor": 0.5}}, "rope_parameters.partial_rotary_factor"),
    ({"rope_parameters": {"rope_theta": -1.0}}, "rope_parameters.rope_theta"),
    ({"rope_parameters": [1, 2]}, "rope_parameters"),
])
def test_unsupported_rope_variants_are_refused_naming_the_field(changes, field, tmp_path):
    directory = write_model(tmp_path, "llama+gqa")
    rewrite_config(directory, **changes)
    with pytest.raises(_lib.error_class("ConfigError"), match=f"field '{field}'"):
        TransformersModel(directory)
