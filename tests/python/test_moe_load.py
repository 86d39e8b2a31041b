"""Mixture-of-experts checkpoints into the fused experts transformers 5 builds (issue 25, loads).

transformers 5 builds Mixtral's experts as `mlp.experts.gate_up_proj` [E, 2I, H] and `down_proj`
[E, H, I]; save_pretrained writes one tensor per expert (`block_sparse_moe.experts.3.w1.weight`),
and from_pretrained merges them by its conversion mapping. metaload.load_into reads that mapping
from the installed transformers and assembles each fused target in the C++ plan: every
checkpoint tensor read once, straight into its place (loader/load/assembly.h).

For every model type whose mapping has a WeightConverter, a tiny random model (a config shrunk to
two layers, four experts, hidden 32) is saved with save_pretrained, one file and sharded; metaload
builds it on meta and loads it; its state_dict equals from_pretrained's bitwise and so do the
logits on a fixed input. The sweep prints one row per type and asserts a floor; the types it
cannot build tiny are listed with the reason. Then: dtype conversion during the load, the
already-fused layout (save_original_format=False), a checkpoint lacking an expert or holding one
of the wrong shape (a MismatchError naming the checkpoint tensor and the fused target; nothing
changes), an operation the loader cannot do (a PlanError naming it and the model type), the
peak RSS of a copying load (the model's bytes plus 5%: no per-expert tensor in between), and
zero-copy loads (mmap=True): the fused experts are views of the file's pages (where the
checkpoint tensors' pages line up; copied where not), holding no private memory.

transformers 5.x needs torch 2.x: on Debian's torch 1.13 this file is skipped (it says so).
"""
import gc
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

transformers = pytest.importorskip(
    "transformers", reason="transformers 5.x (tools/requirements.txt) is installed in the torch "
    "2.x environment only: it needs torch >= 2")

import metaload  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # no network: every checkpoint is written here

from transformers import AutoConfig, AutoModel, AutoModelForCausalLM  # noqa: E402

transformers.logging.set_verbosity_error()
transformers.utils.logging.disable_progress_bar()

SHARD_BYTES = 16 * 1024
# What a tiny model of any type gets, where its config has the field.
SMALL = dict(hidden_size=32, intermediate_size=32, moe_intermediate_size=16, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=4, num_local_experts=4, num_experts=4,
             n_routed_experts=4, num_experts_per_tok=2, vocab_size=96, head_dim=8,
             max_position_embeddings=64, shared_expert_intermediate_size=16, n_shared_experts=1,
             first_k_dense_replace=1, kv_lora_rank=16, q_lora_rank=16, qk_rope_head_dim=8,
             qk_nope_head_dim=8, v_head_dim=8, n_group=1, topk_group=1, decoder_sparse_step=1,
             mlp_only_layers=[], moe_layer_freq=1, num_nextn_predict_layers=0,
             ffn_hidden_size=32, expert_ffn_hidden_size=16, zero_expert_num=2, qk_head_dim=16,
             dense_intermediate_size=32, shared_intermediate_size=16, index_head_dim=8, moe_topk=2)
# What every other part of a composite config (a vision tower, a projector) gets, where it has the
# field: VLM MoEs load their towers beside the experts.
TOWER_SMALL = dict(hidden_size=32, intermediate_size=32, num_hidden_layers=1, depth=1,
                   num_attention_heads=4, num_heads=4, num_key_value_heads=4, out_hidden_size=32,
                   embed_dim=32, projection_dim=32, num_layers=1, head_dim=8)
# Per type, where SMALL's one size does not fit: kimi_linear's and MiMo's attention wants KV heads
# fewer than the query heads, DeepSeek's MLA as many.
# The others: layer lists SMALL's two layers cut to no experts or no attention, fields of
# another name or type, rotary sections that must sum to the small head's half.
OVERRIDES = {
    "kimi_linear": dict(num_key_value_heads=2, num_experts_per_token=2, linear_head_dim=8,
                        linear_num_heads=4),
    "mimo_v2_flash": dict(num_key_value_heads=2),
    "lfm2_moe": dict(layer_types=["conv", "full_attention"], num_dense_layers=1),
    "deepseek_ocr2": dict(mlp_layer_types=["dense", "sparse"]),
    "olmo_hybrid": dict(layer_types=["linear_attention", "full_attention"], linear_num_key_heads=4,
                        linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=8),
    "glm5_next": dict(qk_rope_head_dim=0, head_dim=0, mlp_layer_types=["dense", "sparse"],
                      layer_types=["linear_attention", "deepseek_sparse_attention"],
                      linear_head_dim=8, linear_num_heads=4, index_n_heads=4, index_topk=16),
    "ernie4_5_vl_moe": dict(moe_intermediate_size=[16, 16], moe_k=2, moe_num_experts=4,
                            mlp_layer_types=["dense", "sparse"],
                            rope_parameters={"rope_theta": 500000.0, "rope_type": "default",
                                             "mrope_section": [1, 1, 2]}),
    "glm4v_moe": dict(rope_parameters={"rope_theta": 10000.0, "partial_rotary_factor": 0.5,
                                       "rope_type": "default", "mrope_section": [1, 1, 0]}),
}
TINY_PARAMS = 10_000_000
# The sweep's floor: types whose tiny model loads bitwise as from_pretrained's. It only rises.
FLOOR = 48


def converter_types():
    from transformers.conversion_mapping import _build_checkpoint_conversion_mapping
    from transformers.core_model_loading import WeightConverter
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    mapping = _build_checkpoint_conversion_mapping()
    return sorted(k for k, v in mapping.items()
                  if k in CONFIG_MAPPING and any(isinstance(t, WeightConverter) for t in v))


def _shrunk(cfg):
    """SMALL's fields the config has, its per-layer lists cut to the layers kept, token ids that
    fit the small vocabulary."""
    d = cfg.to_dict()
    layers = d.get("num_hidden_layers")
    out = {k: v for k, v in SMALL.items() if k in d}
    for k, v in d.items():
        if isinstance(v, list) and layers and len(v) == layers and k not in SMALL:
            out[k] = v[:SMALL["num_hidden_layers"]]
    for k in ("pad_token_id", "bos_token_id", "eos_token_id"):
        if isinstance(d.get(k), int) and d[k] >= SMALL["vocab_size"]:
            out[k] = 0
    return out


def tiny_config(model_type, **overrides):
    overrides = {**OVERRIDES.get(model_type, {}), **overrides}
    cfg = AutoConfig.for_model(model_type)
    text = cfg.get_text_config()
    if text is cfg:
        return type(cfg)(**{**cfg.to_dict(), **_shrunk(cfg), **overrides})
    for c in (text, cfg):  # composite configs: the text part and the outer one, field by field
        for k, v in {**_shrunk(c), **overrides}.items():
            _set(c, k, v)
    _shrink_towers(cfg, text, set())
    return cfg


def _set(cfg, field, value):
    try:
        setattr(cfg, field, value)
    except (AttributeError, TypeError, ValueError):
        pass


def _shrink_towers(cfg, text, seen):
    """TOWER_SMALL's integer fields in every sub-config but the text one, recursively."""
    for sub in list(vars(cfg).values()):
        if not isinstance(sub, transformers.PretrainedConfig) or sub is text or id(sub) in seen:
            continue
        seen.add(id(sub))
        layers = getattr(sub, "num_hidden_layers", None)
        for k, v in TOWER_SMALL.items():
            if isinstance(getattr(sub, k, None), int):
                _set(sub, k, v)
        for k, v in list(vars(sub).items()):  # per-layer lists cut to the layers kept
            if isinstance(v, list) and isinstance(layers, int) and len(v) == layers > 1:
                _set(sub, k, v[:TOWER_SMALL["num_hidden_layers"]])
        _shrink_towers(sub, text, seen)


def model_class(cfg):
    """The causal LM, else the base model, else any auto class's model for this config (omni
    and vision-language models are only in the multimodal ones)."""
    from transformers.models.auto import modeling_auto
    autos = [AutoModelForCausalLM, AutoModel] + [
        getattr(modeling_auto, n) for n in sorted(dir(modeling_auto)) if n.startswith("AutoModelFor")]
    for auto in autos:
        try:
            return auto._model_mapping[type(cfg)]
        except (KeyError, AttributeError):
            continue
    raise KeyError(f"no model class for {type(cfg).__name__}")


def meta_build(cls, cfg):
    with metaload.meta():
        model = cls(cfg)
    assert all(t.is_meta for t in model.parameters())
    return model


def assert_same(model, ref, what):
    a, b = ref.state_dict(), model.state_dict()
    assert sorted(a) == sorted(b), what
    for name in a:
        assert not b[name].is_meta, f"{what}: {name} still on meta"
        assert b[name].dtype == a[name].dtype, (what, name, b[name].dtype, a[name].dtype)
        assert torch.equal(b[name], a[name]), f"{what}: {name} differs from from_pretrained's"


def forward(model, cfg):
    """The output on fixed token ids; None for a model that takes no tokens (a vision tower)."""
    vocab = getattr(cfg.get_text_config(), "vocab_size", None)
    if vocab is None:
        return None
    ids = torch.randint(0, vocab, (1, 7), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():  # no cache: hybrid models' caches want an attention layer first
        out = model.eval()(input_ids=ids, use_cache=False)
    return out.logits if hasattr(out, "logits") else out.last_hidden_state


def sweep_one(model_type, root):
    """'ok', or why this type's tiny model did not load as from_pretrained's. Raises for a type
    that cannot be built tiny (the caller lists it with the reason)."""
    cfg = tiny_config(model_type)
    cls = model_class(cfg)
    n = sum(p.numel() for p in meta_build(cls, cfg).parameters())
    if n > TINY_PARAMS:
        raise RuntimeError(f"not tiny with these fields: {n} parameters")
    torch.manual_seed(0)
    model = cls(cfg).eval()
    one, sharded = str(root / f"{model_type}-one"), str(root / f"{model_type}-sharded")
    model.save_pretrained(one)
    model.save_pretrained(sharded, max_shard_size=SHARD_BYTES)
    ref = cls.from_pretrained(one).eval()
    want = forward(ref, cfg)
    for layout in (one, sharded):
        loaded = meta_build(cls, cfg)
        metaload.load_into(loaded, layout, progress=False)
        assert_same(loaded, ref, f"{model_type} {os.path.basename(layout)}")
        got = forward(loaded, cfg)
        assert (got is None) == (want is None)
        assert want is None or torch.equal(got, want), f"{model_type}: outputs differ"
    return "ok"


def test_every_converter_type_loads_as_from_pretrained(tmp_path):
    rows, unbuilt = [], []
    for model_type in converter_types():
        try:
            tiny_config(model_type)
            result = sweep_one(model_type, tmp_path)
        except (metaload.Error, AssertionError) as e:  # metaload's load itself: a failure
            result = f"FAIL {type(e).__name__}: {str(e).splitlines()[0][:160]}"
        except Exception as e:  # noqa: BLE001 -- the tiny model could not be built or saved
            unbuilt.append((model_type, f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"))
            continue
        rows.append((model_type, result))
    print(f"\n{'model type':24} result")
    for model_type, result in rows:
        print(f"{model_type:24} {result}")
    print("not built tiny:")
    for model_type, why in unbuilt:
        print(f"  {model_type:22} {why}")
    ok = [t for t, r in rows if r == "ok"]
    print(f"{len(ok)} of {len(rows) + len(unbuilt)} converter types load bitwise as "
          f"from_pretrained")
    # Failures metaload cannot fix, each a fact of the type, not of the loader: transformers' own
    # round trip loses a tensor there too.
    known = {"deepseek_v4": "its rename '\\.norm\\.' -> '.kv_norm.' also renames model.norm "
                            "(from_pretrained leaves model.norm.weight freshly initialised)"}
    for model_type, result in rows:
        if result != "ok":
            assert model_type in known, f"{model_type}: {result}"
            print(f"known: {model_type}: {known[model_type]}")
    assert len(ok) >= FLOOR
    # kimi_k25: Chunk, then PermuteForRope of q and k; jina_embeddings_v3, nomic_bert and
    # qwen3_omni_moe_thinker: non-persistent buffers only the model's _init_weights computes;
    # ernie4_5_vl_moe: a gate transposed (element by element).
    assert {"mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "deepseek_v3", "minimax", "phimoe",
            "kimi_k25", "jina_embeddings_v3", "nomic_bert", "qwen3_omni_moe_thinker",
            "ernie4_5_vl_moe"} <= set(ok)


def mixtral(tmp_path, dtype=torch.float32, experts=4, **kw):
    cfg = tiny_config("mixtral", num_local_experts=experts, **kw)
    torch.manual_seed(0)
    model = model_class(cfg)(cfg).to(dtype)
    d = str(tmp_path / f"mixtral-{dtype}".replace("torch.", ""))
    model.save_pretrained(d)
    return cfg, model, d


def test_dtype_converts_while_assembling(tmp_path):
    """A bfloat16 checkpoint into float32 fused experts: each expert converted on its way into
    the slot, equal to from_pretrained(dtype=float32)."""
    cfg, _, d = mixtral(tmp_path, torch.bfloat16)
    cls = model_class(cfg)
    ref = cls.from_pretrained(d, dtype=torch.float32)
    model = meta_build(cls, cfg)
    metaload.load_into(model, d, progress=False, dtype=torch.float32)
    assert model.model.layers[0].mlp.experts.gate_up_proj.dtype == torch.float32
    assert_same(model, ref, "bf16 -> f32")


def test_already_fused_layout_loads_and_maps(tmp_path):
    """save_original_format=False keeps transformers' fused tensors: they load by name, and from
    a hub-cache-like zero-copy load they are mapped, not copied."""
    cfg = tiny_config("mixtral")
    torch.manual_seed(0)
    model = model_class(cfg)(cfg)
    d = str(tmp_path / "fused")
    model.save_pretrained(d, save_original_format=False)
    names = metaload.load_file(os.path.join(d, "model.safetensors"))
    assert "model.layers.0.mlp.experts.gate_up_proj" in names
    loaded = meta_build(model_class(cfg), cfg)
    report = metaload.load_into(loaded, d, progress=False, mmap=True)
    assert report.mapped_bytes > 0
    assert_same(loaded, model_class(cfg).from_pretrained(d), "fused layout")


def _nbytes(t):
    return t.numel() * t.element_size()


def _in_a_memory_map(address):
    with open("/proc/self/maps") as f:
        for line in f:
            lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
            if lo <= address < hi:
                return True
    return False


def _mmap_load(cls, cfg, d):
    model = meta_build(cls, cfg)
    report = metaload.load_into(model, d, progress=False, mmap=True)
    return model, report


def test_mmap_maps_the_fused_experts_from_the_files_pages(tmp_path):
    """mmap=True: each fused expert tensor is a view of its file (the checkpoint tensors' pages
    side by side, FileMapping::map_view), not a copy. Every expert here is one page (32 x 32
    float32), so a layer's experts, consecutive in the file, share the page residue a view needs:
    every byte is mapped. The bytes equal from_pretrained's; the file guards the experts (found
    through their pointers); a write into one stays in the process."""
    for model_type in ("mixtral", "qwen3_moe"):
        cfg = tiny_config(model_type, moe_intermediate_size=32)
        cls = model_class(cfg)
        torch.manual_seed(0)
        d = str(tmp_path / model_type)
        cls(cfg).save_pretrained(d)
        path = os.path.join(d, "model.safetensors")
        model, report = _mmap_load(cls, cfg, d)
        state = model.state_dict()
        assert report.mapped_bytes == sum(_nbytes(t) for t in state.values()), model_type
        assert_same(model, cls.from_pretrained(d), f"{model_type} mmap")
        experts = model.model.layers[1].mlp.experts
        assert metaload.check_mapped_files(experts.gate_up_proj).keys() == {path}
        assert metaload.check_mapped_files(experts.down_proj).keys() == {path}
        with open(path, "rb") as f:
            before = f.read()
        with torch.no_grad():
            experts.gate_up_proj[1, 3, :5] = 7.0
        assert (experts.gate_up_proj[1, 3, :5] == 7.0).all()
        with open(path, "rb") as f:
            assert f.read() == before
        # The view goes with the last tensor over it.
        at = experts.gate_up_proj.data_ptr()
        assert _in_a_memory_map(at)
        del model, state, experts
        gc.collect()
        assert not _in_a_memory_map(at), model_type


def test_mmap_fused_false_copies_the_experts_as_from_pretrained_does(tmp_path):
    """mmap_fused=False: what lies whole in the file is mapped, the fused experts are copied into
    fresh memory at the alignment from_pretrained's have (a view keeps the file's, and CPU
    matmuls sum in an order that follows it): the same bytes and the same logits, bit for bit."""
    cfg = tiny_config("mixtral", moe_intermediate_size=32)
    cls = model_class(cfg)
    torch.manual_seed(0)
    d = str(tmp_path / "mixtral")
    cls(cfg).save_pretrained(d)
    mapped, report = _mmap_load(cls, cfg, d)  # mmap_fused=True: every byte mapped
    assert report.mapped_bytes == sum(_nbytes(t) for t in mapped.state_dict().values())
    model = meta_build(cls, cfg)
    report = metaload.load_into(model, d, progress=False, mmap=True, mmap_fused=False)
    state = model.state_dict()
    experts = [n for n in state if ".experts." in n]
    assert experts and report.mapped_bytes == sum(
        _nbytes(t) for n, t in state.items() if n not in experts)
    for n in experts:
        assert not metaload.check_mapped_files(state[n]) and state[n].data_ptr() % 64 == 0, n
    ref = cls.from_pretrained(d)
    assert_same(model, ref, "mixtral mmap_fused=False")
    assert torch.equal(forward(model, cfg), forward(ref, cfg))


def test_mmap_copies_the_fused_experts_it_cannot_map(tmp_path):
    """Where a view cannot line the checkpoint tensors' pages up, the fused target is copied,
    and equal all the same: Qwen3-MoE experts of half a page (16 x 32 float32, stored down, gate,
    up per expert) put gate and up of one expert at another page residue than the next expert's
    (down_proj's stride of three tensors keeps its residue: mapped); a sharded checkpoint whose
    file boundaries split a layer's experts copies that layer's fused tensors."""
    cfg = tiny_config("qwen3_moe")
    cls = model_class(cfg)
    torch.manual_seed(0)
    d = str(tmp_path / "qwen3")
    cls(cfg).save_pretrained(d)
    model, report = _mmap_load(cls, cfg, d)
    state = model.state_dict()
    gate_up = sum(_nbytes(t) for n, t in state.items() if n.endswith("gate_up_proj"))
    assert report.mapped_bytes == sum(_nbytes(t) for t in state.values()) - gate_up
    assert_same(model, cls.from_pretrained(d), "qwen3_moe mmap, gate_up copied")

    cfg, _, _ = mixtral(tmp_path)
    cls = model_class(cfg)
    torch.manual_seed(0)
    d = str(tmp_path / "sharded")
    cls(cfg).save_pretrained(d, max_shard_size=SHARD_BYTES)
    with open(os.path.join(d, "model.safetensors.index.json")) as f:
        where = json.load(f)["weight_map"]
    model, report = _mmap_load(cls, cfg, d)
    state = model.state_dict()
    split = 0  # bytes of fused targets whose experts lie in more than one file
    for layer in range(cfg.num_hidden_layers):
        for target, parts in (("gate_up_proj", ("w1", "w3")), ("down_proj", ("w2",))):
            files = {where[f"model.layers.{layer}.block_sparse_moe.experts.{e}.{w}.weight"]
                     for e in range(cfg.num_local_experts) for w in parts}
            if len(files) > 1:
                split += _nbytes(state[f"model.layers.{layer}.mlp.experts.{target}"])
    assert split > 0, "the shard size no longer splits a layer's experts"
    assert report.mapped_bytes == sum(_nbytes(t) for t in state.values()) - split
    assert_same(model, cls.from_pretrained(d), "mixtral sharded mmap")


def _rewrite(d, drop=(), replace=None):
    path = os.path.join(d, "model.safetensors")
    tensors = metaload.load_file(path)
    for n in drop:
        del tensors[n]
    tensors.update(replace or {})
    os.remove(path)
    metaload.save_file(tensors, path, metadata={"format": "pt"})


def test_a_lacking_expert_is_a_mismatch_naming_it_and_the_target(tmp_path):
    cfg, _, d = mixtral(tmp_path)
    gone = "model.layers.1.block_sparse_moe.experts.2.w3.weight"
    _rewrite(d, drop=[gone])
    model = meta_build(model_class(cfg), cfg)
    with pytest.raises(metaload.MismatchError) as e:
        metaload.load_into(model, d, progress=False)
    text = str(e.value)
    assert "model.layers.1.mlp.experts.gate_up_proj" in text and repr(gone) in text, text
    assert "model.layers.1.mlp.experts.gate_up_proj" in e.value.mismatched
    assert all(t.is_meta for t in model.parameters())  # nothing half-applied


def test_an_expert_of_the_wrong_shape_is_a_mismatch_naming_it(tmp_path):
    cfg, _, d = mixtral(tmp_path)
    bad = "model.layers.0.block_sparse_moe.experts.1.w2.weight"
    shape = list(metaload.load_file(os.path.join(d, "model.safetensors"))[bad].shape)
    _rewrite(d, replace={bad: torch.zeros(shape[0], shape[1] + 1)})
    model = meta_build(model_class(cfg), cfg)
    with pytest.raises(metaload.MismatchError) as e:
        metaload.load_into(model, d, progress=False)
    text = str(e.value)
    assert "model.layers.0.mlp.experts.down_proj" in text and repr(bad) in text, text
    assert all(t.is_meta for t in model.parameters())


def _patched_down_proj(monkeypatch, *ops):
    """Mixtral's mapping with its down_proj converter's operations replaced by `ops`."""
    import transformers.conversion_mapping as cm
    from transformers.core_model_loading import WeightConverter
    mapping = list(cm.get_checkpoint_conversion_mapping("mixtral"))
    at = next(i for i, c in enumerate(mapping) if isinstance(c, WeightConverter)
              and any("w2" in p for p in c.source_patterns))
    mapping[at] = WeightConverter(source_patterns=[".experts.*.w2.weight"],
                                  target_patterns=".experts.down_proj", operations=list(ops))
    monkeypatch.setitem(cm._checkpoint_conversion_mapping_cache, "mixtral", mapping)


@pytest.mark.parametrize("inverse", [False, True])
def test_interleave_streams_as_transformers_reshapes(tmp_path, monkeypatch, inverse):
    """Interleave(dim=1) after the merge (inkling's fused w13 experts use it): every row of each
    expert lands where transformers' reshape-transpose puts it, equal to from_pretrained's with
    the same mapping, bitwise."""
    from transformers.core_model_loading import Interleave, MergeModulelist
    cfg, _, d = mixtral(tmp_path)
    _patched_down_proj(monkeypatch, MergeModulelist(dim=0), Interleave(dim=1, inverse=inverse))
    cls = model_class(cfg)
    ref = cls.from_pretrained(d)
    plain = metaload.load_file(os.path.join(d, "model.safetensors"))
    w2 = torch.stack([plain[f"model.layers.0.block_sparse_moe.experts.{e}.w2.weight"]
                      for e in range(cfg.num_local_experts)])
    half = w2.shape[1] // 2
    shape = [w2.shape[0]] + ([2, half] if inverse else [half, 2]) + [w2.shape[2]]
    want = w2.reshape(shape).transpose(1, 2).reshape(w2.shape)
    assert not torch.equal(want, w2)  # the operation moves rows: the test can tell
    model = meta_build(cls, cfg)
    metaload.load_into(model, d, progress=False)
    assert torch.equal(model.model.layers[0].mlp.experts.down_proj, want)
    assert_same(model, ref, f"Interleave(inverse={inverse})")


def test_an_operation_it_cannot_do_is_a_plan_error_naming_it(tmp_path, monkeypatch):
    """A mapping whose converter uses an operation the plan does not stream (here
    SplitModulelist on Mixtral's down_proj): PlanError naming the operation and the model type,
    never a wrong tensor, and the module unchanged."""
    from transformers.core_model_loading import MergeModulelist, SplitModulelist
    cfg, _, d = mixtral(tmp_path)
    _patched_down_proj(monkeypatch, MergeModulelist(dim=0), SplitModulelist(dim=1))
    model = meta_build(model_class(cfg), cfg)
    with pytest.raises(metaload.PlanError) as e:
        metaload.load_into(model, d, progress=False)
    assert "SplitModulelist" in str(e.value) and "'mixtral'" in str(e.value), str(e.value)
    assert all(t.is_meta for t in model.parameters())


def test_non_strict_load_counts_assembled_targets_as_present(tmp_path):
    cfg, _, d = mixtral(tmp_path)
    model = meta_build(model_class(cfg), cfg)
    report = metaload.load_into(model, d, progress=False, strict=False)
    assert report.missing_keys == [] and report.unexpected_keys == []
    assert not model.model.layers[0].mlp.experts.down_proj.is_meta


PEAK_SCRIPT = textwrap.dedent("""
    import json, sys, torch, metaload
    from transformers import AutoConfig, MixtralForCausalLM

    def kb(field):
        with open("/proc/self/status") as f:
            return next(int(l.split()[1]) for l in f if l.startswith(field + ":"))

    cfg = AutoConfig.from_pretrained(sys.argv[1])
    mmap = sys.argv[2] == "mmap"
    with metaload.meta():
        model = MixtralForCausalLM(cfg)
    nbytes = sum(p.numel() * p.element_size() for p in model.parameters())
    experts = sum(p.numel() * p.element_size() for n, p in model.named_parameters()
                  if ".experts." in n)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # the high-water mark (VmHWM) starts again from the current RSS
    before, anon = kb("VmRSS") * 1024, kb("RssAnon") * 1024
    report = metaload.load_into(model, sys.argv[1], progress=False, mmap=mmap)
    after = kb("VmHWM") * 1024
    assert not model.model.layers[0].mlp.experts.gate_up_proj.is_meta
    print(json.dumps({"bytes": nbytes, "experts": experts, "growth": after - before,
                      "anon": kb("RssAnon") * 1024 - anon, "mapped": report.mapped_bytes,
                      "guards": sorted(set(metaload.check_mapped_files(model).values()))}))
""")


def _peak_rss(tmp_path, how):
    """The peak RSS growth of a load of a ~200 MB Mixtral (8 experts of 4 MiB per layer and
    projection: page multiples), measured in a fresh process; `how`: "copy" or "mmap"."""
    cfg = AutoConfig.for_model("mixtral", hidden_size=512, intermediate_size=2048,
                               num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2,
                               num_local_experts=8, num_experts_per_tok=2, vocab_size=256,
                               max_position_embeddings=64)
    d = tmp_path / "peak"
    if not d.exists():
        torch.manual_seed(0)
        model_class(cfg)(cfg).save_pretrained(str(d))
    # The metaload this test imports (the tree's python/, not an installed copy).
    package_root = os.path.dirname(os.path.dirname(metaload.__file__))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [package_root] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    out = subprocess.run([sys.executable, "-c", PEAK_SCRIPT, str(d), how], capture_output=True,
                         text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"\n{how}: model {r['bytes'] / 2**20:.1f} MiB (experts {r['experts'] / 2**20:.1f}), "
          f"peak RSS growth {r['growth'] / 2**20:.1f} MiB, anonymous {r['anon'] / 2**20:.1f} MiB")
    assert r["bytes"] > 190 * 2**20 and r["experts"] > 0.9 * r["bytes"]
    return r


def test_copying_load_peak_rss_is_the_model_plus_five_percent(tmp_path):
    """No intermediate per-expert tensors: a copying load of a ~200 MB Mixtral grows the
    process's peak RSS by at most the model's bytes plus 5%."""
    r = _peak_rss(tmp_path, "copy")
    assert r["growth"] <= 1.05 * r["bytes"], r


def test_mmap_load_holds_no_private_memory_for_the_experts(tmp_path):
    """A zero-copy load maps the fused experts (views of the file's pages): the process's
    private memory grows by a sliver of the experts' bytes (the pages where two experts meet),
    and where a lease guards the freshly written (cached) file, nothing is faulted in during the
    load, so its peak RSS grows by a sliver too."""
    r = _peak_rss(tmp_path, "mmap")
    assert r["mapped"] == r["bytes"], r
    assert r["anon"] < 0.05 * r["experts"], r
    if r["guards"] == ["lease"]:
        assert r["growth"] < 0.1 * r["experts"], r


def test_expert_parallel_ranks_take_their_experts_and_read_only_theirs(tmp_path):
    """tp_plan {"layers.*.mlp.experts": "experts"}: rank r of 2 holds experts [2r, 2r + 2) of 4
    in every fused tensor (the router and the rest whole), assembled from those experts' checkpoint
    tensors alone: the bytes it reads are the checkpoint's minus the other rank's experts."""
    cfg, _, d = mixtral(tmp_path)
    cls = model_class(cfg)
    ref = cls.from_pretrained(d)
    names = metaload.load_file(os.path.join(d, "model.safetensors"))
    total = sum(t.numel() * t.element_size() for t in names.values())
    for rank in range(2):
        model = meta_build(cls, cfg)
        for layer in model.model.layers:  # this rank's experts: half of the fused tensors
            experts = layer.mlp.experts
            for n in ("gate_up_proj", "down_proj"):
                full = getattr(experts, n)
                setattr(experts, n, torch.nn.Parameter(
                    torch.empty(2, *full.shape[1:], device="meta")))
        report = metaload.load_into(model, d, progress=False, tp_rank=rank, tp_size=2,
                                    tp_plan={"layers.*.mlp.experts": "experts"})
        others = sum(t.numel() * t.element_size() for n, t in names.items()
                     if ".experts." in n and int(n.split(".experts.")[1].split(".")[0]) // 2
                     != rank)
        assert report.bytes == total - others, (report.bytes, total, others)
        got, want = model.state_dict(), ref.state_dict()
        for n, t in want.items():
            if n.endswith(("experts.gate_up_proj", "experts.down_proj")):
                t = t[2 * rank:2 * rank + 2]
            assert torch.equal(got[n], t), (rank, n)


def _rank_slice(t, dim, rank, size, packs=1):
    """Rank `rank`'s part of `t` split on `dim` into `packs` packed parts, each split evenly."""
    parts = t.chunk(packs, dim)
    return torch.cat([p.chunk(size, dim)[rank] for p in parts], dim)


# transformers' own Mixtral plan, tensor by tensor: (dim, packed parts) of what a rank holds.
PLAN_SPLITS = {"q_proj.weight": (0, 1), "k_proj.weight": (0, 1), "v_proj.weight": (0, 1),
               "o_proj.weight": (1, 1), "experts.gate_up_proj": (1, 2),
               "experts.down_proj": (2, 1)}


def _plan_bytes(d):
    """(the checkpoint's bytes, the bytes of the tensors transformers' plan splits) of the
    per-expert checkpoint in d."""
    names = metaload.load_file(os.path.join(d, "model.safetensors"))
    total = sum(t.numel() * t.element_size() for t in names.values())
    split = sum(t.numel() * t.element_size() for n, t in names.items()
                if n.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight",
                               "w1.weight", "w2.weight", "w3.weight")))
    return total, split


def _assert_rank_holds(got, want, rank, what):
    for n, t in want.items():
        how = next((v for k, v in PLAN_SPLITS.items() if n.endswith(k)), None)
        expect = t if how is None else _rank_slice(t, how[0], rank, 2, how[1])
        assert torch.equal(got[n], expect), (what, rank, n, list(got[n].shape))


def test_transformers_own_tp_plan_splits_fused_experts_and_reads_only_each_ranks_bytes(tmp_path):
    """tp_plan=config.base_model_tp_plan, transformers' own plan as it is: q/k/v column-parallel,
    o_proj row-parallel, the fused gate_up_proj [E, 2I, H] packed column-parallel (rank r: its
    part of every expert's gate rows and of its up rows, as vLLM's merged column-parallel layer),
    down_proj [E, H, I] row-parallel, the forward-only styles (moe_tp_experts) whole. Each rank's
    tensors equal from_pretrained's sliced so, and it reads only those bytes of the per-expert
    checkpoint tensors it assembles them from."""
    cfg, _, d = mixtral(tmp_path)
    cls = model_class(cfg)
    plan = dict(cfg.base_model_tp_plan)
    assert plan["layers.*.mlp.experts.gate_up_proj"] == "packed_colwise"
    want = cls.from_pretrained(d).state_dict()
    total, split = _plan_bytes(d)
    for rank in range(2):
        model = meta_build(cls, cfg)
        report = metaload.load_into(model, d, progress=False, tp_rank=rank, tp_size=2,
                                    tp_plan=plan)
        assert report.bytes == total - split // 2, (report.bytes, total, split)
        _assert_rank_holds(model.state_dict(), want, rank, "one process")


def test_a_packed_split_that_does_not_divide_is_a_slice_error_and_changes_nothing(tmp_path):
    cfg, _, d = mixtral(tmp_path)
    model = meta_build(model_class(cfg), cfg)
    with pytest.raises(metaload.SliceError, match="packed parts"):
        metaload.load_into(model, d, progress=False, tp_rank=0, tp_size=3,
                           tp_plan={"layers.*.mlp.experts.gate_up_proj": "packed_colwise"})
    assert all(t.is_meta for t in model.state_dict().values())


def test_a_tp_load_of_another_model_without_a_plan_is_a_plan_error_saying_what_to_give(tmp_path):
    """tp_size > 1 without tp_plan= takes the model family's plan; a Mixtral has none: a
    PlanError naming the model type and tp_plan= (not the config reader's bare refusal), and
    nothing changes."""
    cfg, _, d = mixtral(tmp_path)
    model = meta_build(model_class(cfg), cfg)
    with pytest.raises(metaload.PlanError) as e:
        metaload.load_into(model, d, progress=False, tp_rank=0, tp_size=2)
    assert "'mixtral' is not supported" in str(e.value) and "give tp_plan=" in str(e.value)
    assert all(t.is_meta for t in model.state_dict().values())


def test_a_process_group_loads_fused_experts_by_transformers_own_plan(tmp_path):
    """Two gloo ranks, transformers' own tp_plan, every rank reading its own slice and then rank 0
    serving both (source_rank=0): each rank's fused experts and attention equal from_pretrained's
    sliced as the single-process load slices them (assembled from the per-expert checkpoint
    tensors on the reading rank), and a reading rank reads only its slices' bytes."""
    import socket
    cfg, _, d = mixtral(tmp_path)
    want = model_class(cfg).from_pretrained(d).state_dict()
    out = tmp_path / "out"
    out.mkdir()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    worker = os.path.join(os.path.dirname(__file__), "scripts", "dist_moe_worker.py")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(__file__))), "python"),
         os.environ.get("PYTHONPATH", "")]))
    procs = [subprocess.Popen([sys.executable, worker, d, str(out), "2", str(port), str(r)],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(2)]
    logs = [p.communicate(timeout=300)[0] for p in procs]
    total, split = _plan_bytes(d)
    for rank in range(2):
        result = json.load(open(out / f"rank{rank}.json"))
        assert "error" not in result, (result.get("error"), logs[rank])
        assert result["shared"]["bytes_read"] == total - split // 2, result
        # The source reads each rank's slice in turn (the whole tensors once per rank); the
        # other rank nothing.
        assert result["broadcast"]["bytes_read"] == (2 * (total - split // 2) if rank == 0
                                                     else 0), result
        for mode in ("shared", "broadcast"):
            _assert_rank_holds(torch.load(out / f"rank{rank}.{mode}.pt"), want, rank, mode)
