"""A dispatch is all or nothing: what it will hold is computed before the first swap.

A GPT-2 config with a long context needs a causal mask of positions^2 bytes, a non-persistent
buffer computed at dispatch. When it cannot be allocated the dispatch used to have swapped every
parameter in already, left the buffers on meta and raised torch's untyped allocator message.
"""
import json
import os

import pytest
import torch

import metaload
from metaload.model import TransformersModel, make_checkpoint

POSITIONS = 1 << 19  # a mask of 2^38 bytes (256 GiB): no machine this runs on can give it


@pytest.fixture(scope="module")
def long_context(tmp_path_factory):
    folder = tmp_path_factory.mktemp("long")
    config = {"activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"],
              "model_type": "gpt2", "n_embd": 8, "n_head": 2, "n_layer": 2,
              "n_positions": POSITIONS, "vocab_size": 32, "layer_norm_epsilon": 1e-5,
              "initializer_range": 0.02, "tie_word_embeddings": True, "torch_dtype": "float32"}
    path = folder / "config.json"
    path.write_text(json.dumps(config))
    return make_checkpoint(str(folder / "ckpt"), config=str(path), seed=1)["dir"]


def test_a_buffer_that_cannot_be_made_fails_the_dispatch_with_nothing_changed(long_context):
    m = TransformersModel(long_context, progress=False)
    weight = m.parameter("transformer.wte.weight")
    for attempt in range(2):  # the model is left as it was: a second try fails the same way
        with pytest.raises(metaload.FamilyError) as e:
            m.dispatch()
        text = str(e.value)
        assert "transformer.h.*.attn.bias" in text, text
        assert f"[1, 1, {POSITIONS}, {POSITIONS}]" in text and str(POSITIONS ** 2) in text, text
        assert not m.dispatched
        assert weight.is_meta, attempt
        assert all(p.is_meta for p in m.named_parameters().values())
        assert all(b.is_meta for b in m.named_buffers().values())


def test_a_forward_that_dispatches_fails_the_same_way(long_context):
    m = TransformersModel(long_context, progress=False)
    with pytest.raises(metaload.FamilyError, match=r"attn\.bias"):
        m(torch.tensor([[1, 2, 3]]))
    assert not m.dispatched and m.parameter("transformer.wte.weight").is_meta


def test_a_model_whose_buffers_fit_still_dispatches_them(tmp_path):
    d = make_checkpoint(str(tmp_path / "g"), config="gpt2-tiny", seed=2)["dir"]
    m = TransformersModel(d, progress=False)
    m.dispatch()
    buffers = m.named_buffers()
    assert buffers and all(not b.is_meta for b in buffers.values())
    bias = next(b for n, b in buffers.items() if n.endswith("attn.bias"))
    n = bias.shape[-1]
    assert torch.equal(bias[0, 0], torch.ones(n, n, dtype=torch.bool).tril())
    assert os.path.isdir(d)
