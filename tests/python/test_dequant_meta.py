"""Quantized transformers models without weights: bitsandbytes' Linear4bit / Linear8bitLt (and
their Params4bit / Int8Params) built under metaload.meta() -- the structure transformers makes
for BitsAndBytesConfig (replace_with_bnb_linear) -- and scanned with metaload.scan / fake(),
where nnsight's users report failures. torch 2.x only (bitsandbytes, transformers from PyPI)."""
import pytest
import torch

import metaload

bnb = pytest.importorskip("bitsandbytes", reason="bitsandbytes comes from PyPI (torch 2.x venv)")
transformers = pytest.importorskip("transformers", reason="transformers comes from PyPI")
from transformers import BitsAndBytesConfig, LlamaConfig, LlamaForCausalLM  # noqa: E402
from transformers.integrations import replace_with_bnb_linear  # noqa: E402

CONFIG = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)


def build(quant):
    with metaload.meta():
        model = LlamaForCausalLM(LlamaConfig(**CONFIG))
        model = replace_with_bnb_linear(model, quantization_config=quant)
    return model


@pytest.mark.parametrize("kind", ["4bit", "8bit"])
def test_build_and_scan_bnb_llama_on_meta(kind):
    quant = (BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                bnb_4bit_compute_dtype=torch.bfloat16)
             if kind == "4bit" else BitsAndBytesConfig(load_in_8bit=True))
    model = build(quant)
    cls = bnb.nn.Linear4bit if kind == "4bit" else bnb.nn.Linear8bitLt
    q = model.model.layers[0].self_attn.q_proj
    assert isinstance(q, cls)
    assert all(p.is_meta for p in model.parameters())
    assert tuple(q.weight.shape) == (64, 64)
    s = metaload.scan(model, torch.zeros(1, 8, dtype=torch.long), device="cpu")
    assert s["model.layers.0.self_attn.q_proj"].shape == (1, 8, 64)
    assert s["model.layers.1.mlp.down_proj"].shape == (1, 8, 64)
    assert s["lm_head"].shape == (1, 8, 256)
    # Still no memory: every parameter on meta after the scan.
    assert all(p.is_meta for p in model.parameters())


def test_fake_forward_of_bnb_linear4bit():
    with metaload.meta():
        lin = bnb.nn.Linear4bit(64, 32, compute_dtype=torch.bfloat16, quant_type="nf4")
    assert isinstance(lin.weight, bnb.nn.Params4bit) and lin.weight.is_meta
    with metaload.fake("cpu"):
        y = lin(torch.zeros(2, 64, dtype=torch.bfloat16))
    assert tuple(y.shape) == (2, 32)
