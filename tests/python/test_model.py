"""metaload.TransformersModel end to end on generated checkpoints.

make_checkpoint writes each tiny config (the families' variants included) in the Hugging Face
layout; TransformersModel builds it on meta from the directory or from a hub-cache repo id and
dispatches it; the logits and greedy tokens must match the float64 reference of test_families.py
(imported, not duplicated), which reads the weights from the safetensors files itself with the
small reader below. So the whole chain is checked: writer, layout, names, loader, swap, family.
"""
import json
import math
import os
import re
import struct

import pytest
import torch

import metaload
from metaload import _lib
from metaload.model import TransformersModel, make_checkpoint

from conftest import family_test_ops
from test_families import VARIANTS, random_ids, reference, reference_greedy, relative_error


# ---------------------------------------------------------------------------------------------
# A small independent safetensors reader: u64 header length, JSON header, raw little-endian data.

_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "F64": torch.float64}


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    header.pop("__metadata__", None)
    out = {}
    for name, e in header.items():
        b, end = e["data_offsets"]
        raw = bytearray(data[8 + n + b:8 + n + end])
        t = torch.frombuffer(raw, dtype=_DTYPES[e["dtype"]]) if raw else torch.empty(0)
        out[name] = t.reshape(e["shape"]).to(torch.float64)
    return out


def read_checkpoint(directory):
    index = os.path.join(directory, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    w = {}
    for name in files:
        w.update(read_safetensors(os.path.join(directory, name)))
    return w


def module_weights(cfg, stored):
    """Checkpoint names -> the reference's (module) names: GPT-2's published names lack the
    'transformer.' prefix; tied heads are the embedding."""
    w = {}
    for name, t in stored.items():
        if cfg["model_type"] == "gpt2" and not name.startswith(("transformer.", "lm_head")):
            name = "transformer." + name
        w[name] = t
    if cfg["model_type"] == "gpt2":
        if cfg.get("tie_word_embeddings", True):
            w["lm_head.weight"] = w["transformer.wte.weight"]
    elif cfg.get("tie_word_embeddings", False):
        w["lm_head.weight"] = w["model.embed_tokens.weight"]
    return w


def write_config(tmp_path, name, cfg):
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(cfg))
    return str(path)


# Each variant once; a few also as bf16 files, shards, or through a hub cache (each setting is
# exercised by at least one family).
CASES = [(name, cfg, {}) for name, cfg in VARIANTS] + [
    ("llama-tiny/bf16+3-shards", dict(VARIANTS[1][1]), {"dtype": "bfloat16", "shards": 3}),
    ("gpt2-tiny/hub+saved", dict(VARIANTS[0][1]), {"hub": True, "layout": "saved"}),
    ("qwen2-tiny/hub+f16", dict(VARIANTS[3][1]), {"hub": True, "dtype": "float16", "shards": 2}),
    ("gpt2-tiny/buffers", dict(VARIANTS[0][1]), {"buffers": True}),
]


def build(tmp_path, name, cfg, opts, monkeypatch):
    arch = "gpt2" if cfg["model_type"] == "gpt2" else "llama"
    safe = name.replace("/", "_").replace("+", "_")
    config = write_config(tmp_path, safe, cfg)
    kw = dict(config=config, arch=arch, dtype=opts.get("dtype", "float32"),
              shards=opts.get("shards", 1), seed=5, layout=opts.get("layout", "published"),
              buffers=opts.get("buffers", False))
    if opts.get("hub"):
        hub = tmp_path / "hub"
        made = make_checkpoint(hf_cache=str(hub), repo=f"metaload-test/{safe}", **kw)
        monkeypatch.setenv("HF_HUB_CACHE", str(hub))
        return TransformersModel(f"metaload-test/{safe}", progress=False), made
    made = make_checkpoint(str(tmp_path / safe), **kw)
    return TransformersModel(made["dir"], progress=False), made


@pytest.mark.parametrize("name,cfg,opts", CASES, ids=[c[0] for c in CASES])
def test_generated_checkpoints_match_the_float64_reference(tmp_path, monkeypatch, name, cfg, opts):
    model, made = build(tmp_path, name, cfg, opts, monkeypatch)
    assert not model.dispatched
    assert all(p.is_meta for p in model.named_parameters().values())
    w = module_weights(cfg, read_checkpoint(made["dir"]))
    ids = random_ids(cfg, 2, 13, seed=2)
    want = reference(cfg, w, ids)
    got = model(ids)  # the first real forward dispatches
    assert model.dispatched
    assert got.dtype == torch.float32 and got.shape == want.shape
    assert relative_error(got, want) < 1e-4
    assert want.std() > 0.5  # the logits spread: the comparison means something
    prompt = random_ids(cfg, 2, 4, seed=4)
    tokens = model.generate(prompt, 8)
    assert torch.equal(tokens, reference_greedy(cfg, w, prompt, 8))
    assert len(set(tokens[:, 4:].flatten().tolist())) > 1


def tiny(tmp_path, config="llama-tiny", **kw):
    return make_checkpoint(str(tmp_path / config), config=config, seed=1, **kw)["dir"]


def test_same_tensor_objects_before_and_after_dispatch(tmp_path):
    model = TransformersModel(tiny(tmp_path), progress=False)
    before = model.named_parameters()
    w = model.parameter("model.layers.0.self_attn.q_proj.weight")
    assert w.is_meta and w is before["model.layers.0.self_attn.q_proj.weight"]
    report = model.dispatch()
    assert report.bytes > 0 and report.engine == "cpu"
    assert not w.is_meta and w.device.type == "cpu"
    assert model.parameter("model.layers.0.self_attn.q_proj.weight") is w
    assert all(before[n] is t for n, t in model.named_parameters().items())
    # Idempotent: the same report, nothing loaded again.
    assert model.dispatch() == report
    # Buffers equal those of an eager real build of the family (the families' test op).
    cfg = model.config
    ids = random_ids(cfg, 1, 5, seed=1)
    eager = family_test_ops()._family_test_forward(
        json.dumps(cfg), list(before), [t.detach() for t in before.values()], ids)
    assert torch.equal(model(ids), eager)
    inv_freq = model.named_buffers()["model.rotary_emb.inv_freq"]
    assert inv_freq.device.type == "cpu" and inv_freq.dtype == torch.float32


def test_scan_never_loads_and_reports_every_module(tmp_path):
    model = TransformersModel(tiny(tmp_path, "gpt2-tiny"), progress=False)
    scan = model.scan(batch=2, seq=7)
    assert not model.dispatched
    assert all(p.is_meta for p in model.named_parameters().values())
    m = scan.modules
    assert m[""].shape == (2, 7, 256) and m[""].cls == "GPT2LMHeadModel"
    assert m["transformer.h.1.attn.attn_dropout"].shape == (2, 4, 7, 7)
    assert m["transformer.h.0.mlp.c_fc"].bytes == 2 * 7 * 256 * 4
    assert scan.total_bytes == sum(x.bytes for x in m.values())
    assert list(m)[-1] == ""
    on_cuda = model.scan(batch=1, seq=3, device="cuda")
    assert on_cuda.device == on_cuda.modules["transformer.ln_f"].device == torch.device("cuda:0")
    # ids inside metaload.fake(): forward is a scan, the logits are fake.
    with metaload.fake("cpu"):
        ids = torch.zeros(3, 4, dtype=torch.long)
        logits = model(ids)
    assert metaload.is_fake(logits) and tuple(logits.shape) == (3, 4, 256)
    assert not model.dispatched
    bf16 = TransformersModel(model.info["checkpoint"], dtype=torch.bfloat16)
    assert bf16.scan(batch=1, seq=2).modules["transformer.h.0"].dtype == torch.bfloat16
    # scan(ids, device=...): only the ids' shape counts; every module claims that device. A tuple
    # output (rotary_emb's cos, sin) is reported element by element as "<path>.0", "<path>.1".
    llama = TransformersModel(tiny(tmp_path), progress=False)
    s = llama.scan(torch.zeros(2, 3, dtype=torch.long), device="cuda:1")
    assert s.device == torch.device("cuda:1") and s.modules[""].shape == (2, 3, 256)
    assert {m.device for m in s.modules.values()} == {torch.device("cuda:1")}
    assert s.modules["model.layers.0.self_attn.k_proj"].shape == (2, 3, 32)
    cos, sin = s.modules["model.rotary_emb.0"], s.modules["model.rotary_emb.1"]
    assert cos.shape == sin.shape == (2, 3, 16) and cos.cls == "LlamaRotaryEmbedding"
    assert cos.bytes == 2 * 3 * 16 * 4 and list(s.modules)[:3] == [
        "model.embed_tokens", "model.rotary_emb.0", "model.rotary_emb.1"]
    # Every module reports except the containers (and rotary_emb, through its elements).
    silent = {"model.layers", "model.rotary_emb"}
    assert set(llama.module_paths()) - silent <= set(s.modules)
    assert not llama.dispatched


def test_captures_and_module_access(tmp_path):
    model = TransformersModel(tiny(tmp_path), progress=False)
    h = model.capture("model.layers.1")
    logits = model.capture("")
    model.scan(batch=2, seq=3)
    assert metaload.is_fake(h.value) and tuple(h.value.shape) == (2, 3, 64)
    ids = random_ids(model.config, 2, 3, seed=9)
    out = model(ids)
    assert torch.equal(logits.value, out) and not metaload.is_fake(h.value)
    assert h.count == 2
    assert model.module_class("model.layers.1.self_attn") == "LlamaAttention"
    with pytest.raises(_lib.error_class("ModulePathError"), match="closest: model.layers.1.mlp"):
        model.module_class("model.layers.1.mpl")
    with pytest.raises(_lib.error_class("ModelError"), match="is a container"):
        model.capture("model.layers")
    # rotary_emb returns (cos, sin): each element is captured by its own path.
    with pytest.raises(_lib.error_class("ModelError"), match=r"model\.rotary_emb\.0"):
        model.capture("model.rotary_emb")
    cos, sin = model.capture("model.rotary_emb.0"), model.capture("model.rotary_emb.1")
    model(ids)
    assert tuple(cos.value.shape) == (2, 3, 16) and cos.count == 1
    assert torch.equal(cos.value[:, 0], torch.ones(2, 16))  # position 0: cos 1, sin 0
    assert torch.equal(sin.value[:, 0], torch.zeros(2, 16)) and sin.value[0, 1].abs().sum() > 0
    assert "" in model.module_paths() and "lm_head" in model.module_paths()


def test_model_keys(tmp_path, monkeypatch):
    hub = tmp_path / "hub"
    made = make_checkpoint(config="gpt2-tiny", hf_cache=str(hub), repo="openai-community/gpt2-tiny")
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    model = TransformersModel("openai-community/gpt2-tiny", progress=False)
    key = model.to_model_key()
    assert key == ('metaload.TransformersModel:{"repo_id": "openai-community/gpt2-tiny", '
                   '"revision": null}')
    assert key == metaload.to_model_key("metaload.TransformersModel", "openai-community/gpt2-tiny")
    for cls in ["metaload.TransformersModel", "nnsight.modeling.language.LanguageModel"]:
        again = TransformersModel.from_model_key(cls + key[key.index(":"):])
        assert not again.dispatched
        assert all(p.is_meta for p in again.named_parameters().values())
        assert again.to_model_key() == key
    pinned = TransformersModel.from_model_key(metaload.to_model_key(
        "metaload.TransformersModel", "openai-community/gpt2-tiny", made["commit"]))
    assert pinned.info["commit"] == made["commit"]
    with pytest.raises(_lib.error_class("ModelKeyError")):
        TransformersModel.from_model_key("metaload.Unknown:{\"repo_id\": \"a/b\"}")
    # nnsight's TransformersModel keys name their pipeline task: a causal LM's builds, another
    # task (another model class) or another field is refused, naming it.
    nnsight_cls = "nnsight.modeling.transformers.TransformersModel"
    causal = TransformersModel.from_model_key(metaload.to_model_key(
        nnsight_cls, "openai-community/gpt2-tiny", extra={"task": "text-generation"}))
    assert causal.to_model_key() == key
    for extra, says in [({"task": "text-classification"}, 'field "task" = "text-classification" is not supported'),
                        ({"trust_remote_code": True}, 'field "trust_remote_code" is not supported')]:
        with pytest.raises(_lib.error_class("ModelKeyError"), match=says):
            TransformersModel.from_model_key(metaload.to_model_key(
                nnsight_cls, "openai-community/gpt2-tiny", extra=extra))
    # A local checkpoint's key names its directory: only with local paths allowed, both ways.
    local = TransformersModel(made["dir"], progress=False)
    with pytest.raises(_lib.error_class("RepoIdError"), match="repo-id-absolute-path"):
        local.to_model_key()
    local_key = local.to_model_key(allow_local_paths=True)
    assert os.path.realpath(made["dir"]) in local_key
    assert TransformersModel(made["dir"], allow_local_paths=True).to_model_key() == local_key
    for make in (TransformersModel, TransformersModel.from_model_key):
        with pytest.raises(_lib.error_class("RepoIdError"), match="repo-id-absolute-path"):
            make(local_key)
        assert make(local_key, allow_local_paths=True).info["checkpoint"] == os.path.realpath(made["dir"])
    for hostile in ["/etc/passwd", "../x", "org/.."]:
        with pytest.raises(_lib.error_class("RepoIdError")):
            TransformersModel.from_model_key(metaload.to_model_key(
                "metaload.TransformersModel", hostile, allow_local_paths=True))


def test_errors_are_typed_and_leave_the_model_meta(tmp_path):
    with pytest.raises(_lib.error_class("ResolveError")):
        TransformersModel(str(tmp_path / "absent"))
    (tmp_path / "bert").mkdir()
    (tmp_path / "bert" / "config.json").write_text('{"model_type": "bert"}')
    with pytest.raises(_lib.error_class("ConfigError"), match="model_type"):
        TransformersModel(str(tmp_path / "bert"))
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text('{"model_type": ')
    with pytest.raises(_lib.error_class("FormatError")):
        TransformersModel(str(tmp_path / "broken"))
    # A hostile layer count was a MemoryError (std::bad_alloc) when the per-layer tables were sized.
    (tmp_path / "deep").mkdir()
    (tmp_path / "deep" / "config.json").write_text(json.dumps(
        {"model_type": "llama", "vocab_size": 32, "hidden_size": 16, "intermediate_size": 32,
         "num_attention_heads": 4, "num_hidden_layers": 10**12}))
    with pytest.raises(_lib.error_class("ConfigError"), match="num_hidden_layers.*at most 65536"):
        TransformersModel(str(tmp_path / "deep"))
    with pytest.raises(_lib.error_class("DTypeError")):
        TransformersModel(tiny(tmp_path, "gpt2-tiny"), dtype="nf4")
    # A checkpoint whose config disagrees with its weights: every mismatch listed, still meta.
    d = tiny(tmp_path)
    cfg = json.loads(open(os.path.join(d, "config.json")).read())
    cfg["hidden_size"] = 32
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f)
    model = TransformersModel(d, progress=False)
    with pytest.raises(metaload.MismatchError) as e:
        model.dispatch()
    assert "model.embed_tokens.weight: shape [256, 32]" in str(e.value)
    assert str(e.value).count("mismatched:") > 10
    assert not model.dispatched
    assert all(p.is_meta for p in model.named_parameters().values())
    assert model.scan(batch=1, seq=2).modules[""].shape == (1, 2, 256)
    with pytest.raises(_lib.error_class("ModelError"), match="need.* values|pass real ids"):
        model.generate(torch.zeros(1, 2, dtype=torch.long, device="meta"), 2)


def test_sizes_past_64_bits_and_arguments_out_of_range_are_typed(tmp_path):
    from conftest import ROOT
    d = tmp_path / "gpt2"
    d.mkdir()
    with open(os.path.join(ROOT, "model", "families", "configs", "gpt2.json")) as f:
        (d / "config.json").write_text(f.read())
    model = TransformersModel(str(d))
    # The total used to wrap (44e9 x 1024 reported less than lm_head alone).
    with pytest.raises(metaload.SizeOverflowError, match=r"total output bytes of the scan"):
        model.scan(batch=44_000_000_000, seq=1024)
    # Larger: torch's own limit, typed (it was a RuntimeError with a C++ backtrace).
    with pytest.raises(metaload.SizeOverflowError, match=r"activation .* overflows") as e:
        model.scan(batch=440_000_000_000, seq=1024)
    assert "Exception raised from" not in str(e.value)
    assert model.scan(batch=2, seq=3).modules[""].shape == (2, 3, 50257)
    # Python ints past C++ int are errors naming the argument, not wrapped.
    for kwargs, message in [(dict(threads=2 ** 32), "threads must be 0 (one per core) or from 1 "
                                                    "to 1024, got 4294967296"),
                            (dict(threads=-1), "threads must be 0"),
                            (dict(tp_size=2 ** 32 + 2), "tp_size must be from 1 to 2^31-1")]:
        with pytest.raises(metaload.ModelError, match=re.escape(message)):
            TransformersModel(str(d), **kwargs)


def mapped_gpt2(tmp_path, name):
    made = make_checkpoint(config="gpt2-tiny", hf_cache=str(tmp_path / name), repo="org/gpt2-tiny")
    file = os.path.join(made["dir"], "model.safetensors")  # a link to the blob: mapped by default
    day_ago = os.stat(file).st_mtime - 86400  # a write in place then changes the mtime for sure
    os.utime(file, (day_ago, day_ago))
    return made["dir"], file


def test_zero_copy_forward_refuses_weights_whose_file_changed_in_place(tmp_path):
    # Rewritten in place by a writer that held the file open (so no lease kept it whole): the next
    # forward raises, naming the file, and so does every one after it.
    ckpt, file = mapped_gpt2(tmp_path, "hub")
    ids = torch.tensor([[1, 2, 3]])
    with open(file, "r+b") as writer:
        model = TransformersModel(ckpt, progress=False)
        model(ids)
        assert metaload.check_mapped_files(model) == {file: "checked"}
        writer.seek(8192)
        writer.write(b"\x7f" * 4096)
        writer.flush()
        for _ in range(2):
            with pytest.raises(metaload.FileChangedError, match=f"{file}: the file was written in place"):
                model(ids)


def test_zero_copy_forward_keeps_weights_whose_leased_file_changed_in_place(tmp_path):
    ckpt, file = mapped_gpt2(tmp_path, "hub")
    ids = torch.tensor([[1, 2, 3]])
    model = TransformersModel(ckpt, progress=False)
    before = model(ids)
    if metaload.check_mapped_files(model) != {file: "lease"}:
        pytest.skip("no read lease here")
    with open(file, "r+b") as f:  # waits while the weights are copied into private memory
        f.write(b"\x7f" * 100000)
    assert metaload.check_mapped_files(model) == {file: "detached"}
    assert torch.equal(model(ids), before)
