"""Weights into transformers models: metaload.load_into against transformers' from_pretrained.

For each architecture a tiny random config (2 layers, hidden 32, vocab 128) is built on the CPU
with a fixed seed and written with save_pretrained, as one file and sharded (a small
max_shard_size, so model.safetensors.index.json is read). The same architecture is built under
metaload.meta() with AutoModelForCausalLM.from_config and filled with metaload.load_into; against
AutoModelForCausalLM.from_pretrained(dir): logits on the same input ids equal bitwise in float32,
every parameter and every buffer (the non-persistent ones too: rotary inv_freq and
original_inv_freq, Gemma 2's embed_scale, which transformers recomputes on load and metaload takes
from the values the constructor computed under metaload.meta()) equal, ties stay ties, nothing
stays on meta. Then dtypes: a bfloat16 config builds and loads in bfloat16 as
from_pretrained(dtype=torch.bfloat16) does, and a bfloat16 checkpoint converts into float32 slots.

Checkpoint names transformers 5 changes on load: GPT-NeoX's embed_out (a rename, in
transformers' own conversion mapping, which load_into applies too). Mixtral's, Qwen2-MoE's and
the other per-expert checkpoints, which transformers fuses into 3-D parameters on load, are
test_moe_load.py's; here GPT-OSS, whose checkpoints hold the fused 3-D expert tensors themselves.

transformers 5.x needs torch 2.x: on Debian's torch 1.13 this file is skipped (it says so).
"""
import os

import pytest
import torch

transformers = pytest.importorskip(
    "transformers", reason="transformers 5.x (tools/requirements.txt) is installed in the torch "
    "2.x environment only: it needs torch >= 2")

import metaload  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # no network: every checkpoint is written here

from transformers import AutoConfig, AutoModelForCausalLM  # noqa: E402

transformers.logging.set_verbosity_error()
transformers.utils.logging.disable_progress_bar()

SMALL = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=128, max_position_embeddings=64)
# model type -> (config arguments, load_into's key_mapping)
ARCHS = {
    "gpt2": (dict(n_embd=32, n_layer=2, n_head=4, vocab_size=128, n_positions=64), None),
    "llama": (SMALL, None),
    "mistral": (dict(SMALL, sliding_window=16), None),
    "qwen2": (dict(SMALL, tie_word_embeddings=True), None),
    "gemma2": (dict(SMALL, head_dim=8, sliding_window=16), None),
    "phi3": (dict(SMALL, pad_token_id=0), None),
    "gpt_neox": (dict(SMALL, num_key_value_heads=None), None),  # transformers' own rename
    # mixture of experts, 4 experts of which 2 per token, stored as 3-D tensors
    "gpt_oss": (dict(SMALL, intermediate_size=32, head_dim=8, num_local_experts=4,
                     num_experts_per_tok=2, layer_types=["sliding_attention", "full_attention"],
                     sliding_window=16), None),
}
TIED = {"gpt2", "qwen2", "gemma2"}  # tie_word_embeddings: lm_head is the input embedding
SHARD_BYTES = 16 * 1024  # several shards for every model above


def make_config(model_type, dtype=None):
    kwargs, _ = ARCHS[model_type]
    kwargs = {k: v for k, v in kwargs.items() if v is not None}
    cfg = AutoConfig.for_model(model_type, **kwargs)
    if dtype is not None:
        cfg.dtype = dtype
    return cfg


def save(model_type, root, dtype=torch.float32):
    """{"one": dir, "sharded": dir} of one random model (seeded), as save_pretrained writes it."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(make_config(model_type), dtype=dtype)
    dirs = {"one": str(root / f"{model_type}-one"), "sharded": str(root / f"{model_type}-sharded")}
    model.save_pretrained(dirs["one"])
    model.save_pretrained(dirs["sharded"], max_shard_size=SHARD_BYTES)
    assert os.path.exists(os.path.join(dirs["sharded"], "model.safetensors.index.json"))
    assert not os.path.exists(os.path.join(dirs["one"], "model.safetensors.index.json"))
    return dirs


def meta_build(cfg):
    with metaload.meta():
        model = AutoModelForCausalLM.from_config(cfg)
    assert all(t.is_meta for t in list(model.parameters()) + list(model.buffers()))
    return model


def logits(model, vocab=128):
    ids = torch.randint(0, vocab, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        return model.eval()(input_ids=ids).logits


def assert_same(model, ref, model_type):
    """model (meta-built, loaded by metaload) equals ref (from_pretrained), tensor by tensor."""
    named = dict(model.named_parameters(remove_duplicate=False))
    named.update(model.named_buffers(remove_duplicate=False))
    ref_named = dict(ref.named_parameters(remove_duplicate=False))
    ref_named.update(ref.named_buffers(remove_duplicate=False))
    assert sorted(named) == sorted(ref_named)
    for name, t in named.items():
        r = ref_named[name]
        assert not t.is_meta, f"{model_type}: {name} is still on meta"
        assert t.dtype == r.dtype and t.device == r.device, (name, t.dtype, r.dtype)
        assert torch.equal(t, r), f"{model_type}: {name} differs from from_pretrained's"
    tied = model.lm_head.weight is model.get_input_embeddings().weight
    assert tied == (model_type in TIED)
    assert tied == (ref.lm_head.weight is ref.get_input_embeddings().weight)
    if tied:
        assert model.lm_head.weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()
    assert model.config._attn_implementation == ref.config._attn_implementation
    assert torch.equal(logits(model), logits(ref)), f"{model_type}: logits differ"


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    return {mt: save(mt, root) for mt in ARCHS}


@pytest.mark.parametrize("model_type", list(ARCHS))
def test_load_equals_from_pretrained(model_type, checkpoints):
    ref = AutoModelForCausalLM.from_pretrained(checkpoints[model_type]["one"])
    for layout in ("one", "sharded"):
        model = meta_build(make_config(model_type))
        report = metaload.load_into(model, checkpoints[model_type][layout], progress=False,
                                    key_mapping=ARCHS[model_type][1])
        non_persistent = sorted(set(dict(model.named_buffers())) - set(model.state_dict()))
        assert sorted(report.computed_keys) == non_persistent
        assert any(k.endswith("inv_freq") for k in report.computed_keys) or model_type == "gpt2"
        assert len(report.files) == 1 if layout == "one" else len(report.files) > 1
        assert_same(model, ref, model_type)


@pytest.mark.parametrize("model_type", list(ARCHS))
def test_dtypes(model_type, tmp_path):
    """A bfloat16 config builds and loads in bfloat16 (as from_pretrained(dtype=torch.bfloat16));
    a bfloat16 checkpoint converts into a float32 model (as from_pretrained(dtype=float32))."""
    d = save(model_type, tmp_path, dtype=torch.bfloat16)["one"]
    key_mapping = ARCHS[model_type][1]

    model = meta_build(make_config(model_type, dtype=torch.bfloat16))
    assert model.get_input_embeddings().weight.dtype == torch.bfloat16
    metaload.load_into(model, d, progress=False, key_mapping=key_mapping)
    assert_same(model, AutoModelForCausalLM.from_pretrained(d, dtype=torch.bfloat16), model_type)

    ref32 = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32)
    assert ref32.get_input_embeddings().weight.dtype == torch.float32
    model = meta_build(make_config(model_type, dtype=torch.float32))
    metaload.load_into(model, d, progress=False, key_mapping=key_mapping)
    assert_same(model, ref32, model_type)


def test_dtype_argument_converts_checkpoint_tensors(tmp_path):
    """load_into(dtype=float32) on a bfloat16-built model: the checkpoint's float tensors become
    float32, the computed buffers keep the dtype their constructor gave them (inv_freq float32)."""
    d = save("llama", tmp_path, dtype=torch.bfloat16)["one"]
    model = meta_build(make_config("llama", dtype=torch.bfloat16))
    metaload.load_into(model, d, dtype=torch.float32, progress=False)
    assert_same(model, AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32), "llama")


# Rotary scalings whose inv_freq a constructor computes with more ops (clamps, where, smooth
# interpolation, per-dimension factors): the values metaload.meta() keeps follow them all.
ROPE_VARIANTS = {
    "llama3": ("llama", dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                             high_freq_factor=4.0, original_max_position_embeddings=16)),
    "yarn": ("qwen2", dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=16)),
    "longrope": ("phi3", dict(rope_type="longrope", short_factor=[1.0] * 4, long_factor=[2.0] * 4,
                              original_max_position_embeddings=16)),
}


@pytest.mark.parametrize("variant", list(ROPE_VARIANTS))
def test_rope_variants(variant, tmp_path):
    model_type, rope = ROPE_VARIANTS[variant]
    kwargs = dict(ARCHS[model_type][0], rope_parameters=dict(rope, rope_theta=10000.0))
    cfg = AutoConfig.for_model(model_type, **kwargs)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(str(tmp_path))
    model = meta_build(cfg)
    report = metaload.load_into(model, str(tmp_path), progress=False)
    assert "model.rotary_emb.inv_freq" in report.computed_keys
    ref = AutoModelForCausalLM.from_pretrained(str(tmp_path))
    assert ref.model.rotary_emb.rope_type == variant
    assert_same(model, ref, model_type)


def test_gpt_neox_rename_is_transformers_own(checkpoints):
    """GPT-NeoX checkpoints name the head embed_out, which transformers 5 renames to lm_head on
    load (its conversion mapping): load_into applies the same rename by itself, and a plain module
    of the same names gets no rename (a MismatchError naming both sides, nothing half-applied)."""
    from transformers.conversion_mapping import get_checkpoint_conversion_mapping
    renames = get_checkpoint_conversion_mapping("GPTNeoXForCausalLM")
    assert [(r.source_patterns, r.target_patterns) for r in renames] == [
        ([r"^embed_out\."], ["lm_head."])]
    model = meta_build(make_config("gpt_neox"))
    metaload.load_into(model, checkpoints["gpt_neox"]["one"], progress=False)
    assert not model.lm_head.weight.is_meta

    plain = torch.nn.Module()
    plain.lm_head = torch.nn.Linear(*reversed(model.lm_head.weight.shape), bias=False,
                                    device="meta")
    with pytest.raises(metaload.MismatchError) as e:
        metaload.load_into(plain, checkpoints["gpt_neox"]["one"], progress=False)
    assert "lm_head.weight" in e.value.missing and "embed_out.weight" in e.value.unexpected
    assert plain.lm_head.weight.is_meta  # nothing was half-applied


def test_conversion_table_is_consulted_only_when_a_name_is_not_found(checkpoints, monkeypatch):
    """transformers' table of checkpoint conversions takes 150 ms to build on a process's first
    load: load_into asks it only when the checkpoint's names leave a tensor unfound (the tied
    lm_head of Qwen2 and the computed rotary buffers count as found)."""
    import transformers.conversion_mapping as cm
    asked = []
    original = cm.get_model_conversion_mapping
    monkeypatch.setattr(cm, "get_model_conversion_mapping",
                        lambda *a, **k: asked.append(a) or original(*a, **k))
    for model_type in ("llama", "qwen2"):
        model = meta_build(make_config(model_type))
        metaload.load_into(model, checkpoints[model_type]["sharded"], progress=False)
        assert not any(t.is_meta for t in model.parameters())
    assert asked == []
    model = meta_build(make_config("gpt_neox"))  # embed_out -> lm_head: the table is needed
    metaload.load_into(model, checkpoints["gpt_neox"]["one"], progress=False)
    assert len(asked) == 1 and not model.lm_head.weight.is_meta
