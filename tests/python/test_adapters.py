"""PEFT LoRA adapters on a model built on meta (issue 27, "Adapters on meta").

load_into(model, base, adapters=[dir]) puts peft's LoRA layers into a model built under
metaload.meta() and fills base and adapter weights in one call: the outputs are bitwise those of
PeftModel.from_pretrained(from_pretrained(base), dir) (the module structure is peft's own, made by
its injection), and a bad adapter (a missing tensor, another rank, a target the model lacks, an
adapter for another base model) or a bad base is a typed error naming the file and tensor, with
the model as it was. describe(dir) gives the adapter's size, rank, alpha, targets and base model.
With enable_nnsight(), nnsight's LanguageModel(base, peft=dir) dispatches through metaload with the
adapter and traces to the same values as nnsight's own dispatch.

The tests write their own tiny base models and adapters with peft (offline). peft is pinned for
the torch 2.x environment (tools/requirements.txt): skipped where it is absent (Debian's torch
1.13).
"""
import json
import os
import subprocess
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402

peft = pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")

import torch  # noqa: E402

import metaload  # noqa: E402
import metaload.checkpoint  # noqa: E402
from peft.tuners.tuners_utils import BaseTunerLayer  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
TARGETS = ["q_proj", "v_proj", "down_proj", "embed_tokens"]


def _llama_config(hidden=32):
    return transformers.LlamaConfig(
        num_hidden_layers=2, hidden_size=hidden, intermediate_size=2 * hidden,
        num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
        max_position_embeddings=64, bos_token_id=1, eos_token_id=1)


def _write_base(d, hidden=32, seed=0):
    torch.manual_seed(seed)
    transformers.LlamaForCausalLM(_llama_config(hidden)).save_pretrained(d)
    return str(d)


def _write_adapter(base, d, r=4, alpha=8, targets=TARGETS, dtype=None, seed=1):
    """A LoRA adapter of `base` with random (non-zero) A and B, as peft's save_pretrained
    writes it (base_model_name_or_path: the base's directory)."""
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_pretrained(base)
    config = peft.LoraConfig(r=r, lora_alpha=alpha, target_modules=list(targets),
                             init_lora_weights=False)
    pm = peft.get_peft_model(model, config)
    if dtype is not None:
        pm = pm.to(dtype)
    pm.save_pretrained(d)
    return str(d)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    top = tmp_path_factory.mktemp("adapters")
    base = _write_base(top / "base")
    return {"base": base, "adapter": _write_adapter(base, top / "lora"),
            "adapter_bf16": _write_adapter(base, top / "lora_bf16", dtype=torch.bfloat16,
                                           seed=2),
            "adapter_2": _write_adapter(base, top / "lora_2", r=2, alpha=4,
                                        targets=["k_proj", "up_proj"], seed=3),
            "other_base": _write_base(top / "other_base", hidden=48, seed=4)}


def _meta_model(base, dtype=None):
    config = transformers.AutoConfig.from_pretrained(base)
    with metaload.meta():
        return transformers.AutoModelForCausalLM.from_config(config, dtype=dtype)


def _reference(base, adapter, dtype=None):
    model = transformers.AutoModelForCausalLM.from_pretrained(base, dtype=dtype)
    return peft.PeftModel.from_pretrained(model, adapter).eval()


def _logits(model):
    ids = torch.tensor([[1, 5, 9, 17, 33, 65, 127, 2]])
    with torch.no_grad():
        return model(ids).logits


def _state(model):
    return {k.removeprefix("base_model.model."): v for k, v in model.state_dict().items()}


@pytest.mark.parametrize("dtype,adapter", [(None, "adapter"), (torch.bfloat16, "adapter_bf16")])
def test_lora_on_meta_equals_peft_from_pretrained(files, dtype, adapter):
    model = _meta_model(files["base"], dtype)
    report = metaload.load_into(model, files["base"], adapters=[files[adapter]])
    model.eval()
    ref = _reference(files["base"], files[adapter], dtype)
    assert not any(t.is_meta for t in model.state_dict().values())
    mine, theirs = _state(model), _state(ref)
    assert mine.keys() == theirs.keys()
    for k in theirs:
        assert mine[k].dtype == theirs[k].dtype, k
        assert torch.equal(mine[k], theirs[k]), k
    # the same modules where peft puts them, holding the originals as base_layer
    assert type(model.model.layers[0].self_attn.q_proj) is \
        type(ref.base_model.model.model.layers[0].self_attn.q_proj)
    assert torch.equal(_logits(model), _logits(ref))  # bitwise
    base_only = transformers.AutoModelForCausalLM.from_pretrained(files["base"], dtype=dtype)
    assert not torch.equal(_logits(model), _logits(base_only))  # the adapter does something
    header = metaload.checkpoint.read_safetensors_header(os.path.join(files[adapter],
                                                            "adapter_model.safetensors"))
    assert len(report.adapter_keys) == len(header["tensors"])
    # LoRA tensors, and the targeted embedding's own weight, which peft saves beside them
    assert all((".lora_" in k and ".default" in k) or k == "model.embed_tokens.base_layer.weight"
               for k in report.adapter_keys)
    assert any(f.path.endswith("adapter_model.safetensors") for f in report.files)
    # half-precision adapter weights are held in float32, as peft holds them
    assert model.model.layers[0].self_attn.q_proj.lora_A["default"].weight.dtype == torch.float32
    # frozen, as PeftModel.from_pretrained(is_trainable=False) leaves base and LoRA weights
    # (peft's own cast of a half-precision embedding's LoRA parameters thaws those two there)
    assert not any(p.requires_grad for p in model.parameters())


def test_load_dtype_converts_the_base_and_keeps_adapters_float32(files):
    """load_into(dtype=bf16) into a float32 build: the base (and the embedding weight the adapter
    stores) in bf16, LoRA weights in float32, as peft holds them on a bf16 base."""
    model = _meta_model(files["base"])
    metaload.load_into(model, files["base"], dtype=torch.bfloat16, adapters=[files["adapter"]])
    ref = _reference(files["base"], files["adapter"], torch.bfloat16)
    mine, theirs = _state(model), _state(ref)
    assert {k: v.dtype for k, v in mine.items()} == {k: v.dtype for k, v in theirs.items()}
    assert all(torch.equal(mine[k], theirs[k]) for k in theirs)
    assert torch.equal(_logits(model.eval()), _logits(ref))


def test_two_adapters_both_active(files):
    model = _meta_model(files["base"])
    metaload.load_into(model, files["base"],
                       adapters={"default": files["adapter"], "second": files["adapter_2"]})
    model.eval()
    ref = _reference(files["base"], files["adapter"])
    ref.load_adapter(files["adapter_2"], adapter_name="second")
    ref.base_model.set_adapter(["default", "second"])
    mine, theirs = _state(model), _state(ref)
    assert mine.keys() == theirs.keys()
    assert all(torch.equal(mine[k], theirs[k]) for k in theirs)
    assert torch.equal(_logits(model), _logits(ref))


def _rewrite_adapter(src, dst, drop=(), config=None):
    """A copy of adapter `src` without the tensors `drop`, its config updated by `config`."""
    os.makedirs(dst, exist_ok=True)
    from safetensors.torch import load_file, save_file
    tensors = load_file(os.path.join(src, "adapter_model.safetensors"))
    save_file({k: v for k, v in tensors.items() if k not in drop},
              os.path.join(dst, "adapter_model.safetensors"))
    with open(os.path.join(src, "adapter_config.json")) as f:
        c = json.load(f)
    c.update(config or {})
    with open(os.path.join(dst, "adapter_config.json"), "w") as f:
        json.dump(c, f)
    return str(dst)


def _structure(model):
    return [(n, type(m)) for n, m in model.named_modules()], \
        [(n, tuple(t.shape), t.dtype, t.is_meta, t.requires_grad)
         for n, t in model.named_parameters()]


def _assert_unchanged(model, before):
    assert _structure(model) == before
    assert not any(isinstance(m, BaseTunerLayer) for m in model.modules())
    assert all(t.is_meta for t in model.state_dict().values())  # nothing swapped


DROPPED = "base_model.model.model.layers.1.self_attn.v_proj.lora_B.weight"


def test_missing_tensor_is_a_mismatch_naming_file_and_tensor(files, tmp_path):
    bad = _rewrite_adapter(files["adapter"], tmp_path / "bad", drop=[DROPPED])
    model = _meta_model(files["base"])
    before = _structure(model)
    with pytest.raises(metaload.MismatchError) as e:
        metaload.load_into(model, files["base"], adapters=[bad])
    assert os.path.join(bad, "adapter_model.safetensors") in str(e.value)
    assert e.value.missing == [DROPPED]
    _assert_unchanged(model, before)


def test_other_rank_is_a_mismatch(files, tmp_path):
    bad = _rewrite_adapter(files["adapter"], tmp_path / "bad", config={"r": 8})
    model = _meta_model(files["base"])
    before = _structure(model)
    with pytest.raises(metaload.MismatchError) as e:
        metaload.load_into(model, files["base"], adapters=[bad])
    assert "rank 8" in str(e.value) and "lora_A.weight" in str(e.value)
    assert e.value.mismatched and not e.value.missing and not e.value.unexpected
    _assert_unchanged(model, before)


def test_absent_target_module_is_a_plan_error(files, tmp_path):
    bad = _rewrite_adapter(files["adapter"], tmp_path / "bad",
                           config={"target_modules": ["no_such_proj"]})
    model = _meta_model(files["base"])
    before = _structure(model)
    with pytest.raises(metaload.PlanError, match="no_such_proj") as e:
        metaload.load_into(model, files["base"], adapters=[bad])
    assert "adapter_config.json" in str(e.value)
    _assert_unchanged(model, before)


def test_adapter_of_another_base_model(files, tmp_path):
    other = _write_adapter(files["other_base"], tmp_path / "other")
    model = _meta_model(files["base"])
    before = _structure(model)
    with pytest.raises(metaload.MismatchError) as e:
        metaload.load_into(model, files["base"], adapters=[other])
    assert "made for base model" in str(e.value) and files["other_base"] in str(e.value)
    assert "adapter_model.safetensors" in str(e.value) and e.value.mismatched
    _assert_unchanged(model, before)


@pytest.mark.parametrize("config,match", [({"peft_type": "IA3"}, "not a LoRA adapter"),
                                          ({"use_dora": True}, "use_dora"),
                                          ({"modules_to_save": ["lm_head"]}, "modules_to_save")])
def test_what_is_not_loaded_yet_is_a_plan_error(files, tmp_path, config, match):
    bad = _rewrite_adapter(files["adapter"], tmp_path / "bad", config=config)
    model = _meta_model(files["base"])
    before = _structure(model)
    with pytest.raises(metaload.PlanError, match=match) as e:
        metaload.load_into(model, files["base"], adapters=[files["adapter"], bad])
    assert "adapter_config.json" in str(e.value)
    _assert_unchanged(model, before)


def test_gpt2_conv1d_targets(tmp_path):
    """GPT-2's fused c_attn (a Conv1D, fan_in_fan_out) as peft adapts it."""
    torch.manual_seed(5)
    base = str(tmp_path / "gpt2")
    transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_layer=2, n_embd=32, n_head=2, vocab_size=128, n_positions=64)).save_pretrained(base)
    torch.manual_seed(6)
    pm = peft.get_peft_model(transformers.AutoModelForCausalLM.from_pretrained(base),
                             peft.LoraConfig(r=4, lora_alpha=16, target_modules=["c_attn", "c_fc"],
                                             fan_in_fan_out=True, init_lora_weights=False))
    pm.save_pretrained(tmp_path / "lora")
    model = _meta_model(base)
    metaload.load_into(model, base, adapters=[str(tmp_path / "lora")])
    ref = _reference(base, str(tmp_path / "lora"))
    assert torch.equal(_logits(model.eval()), _logits(ref))


def test_bad_base_leaves_model_without_adapter(files, tmp_path):
    from safetensors.torch import load_file, save_file
    base = tmp_path / "base"
    os.makedirs(base)
    tensors = load_file(os.path.join(files["base"], "model.safetensors"))
    save_file({k: v for k, v in tensors.items() if k != "model.norm.weight"},
              str(base / "model.safetensors"), metadata={"format": "pt"})
    model = _meta_model(files["base"])
    before = _structure(model)
    with pytest.raises(metaload.MismatchError, match="model.norm.weight"):
        metaload.load_into(model, str(base), adapters=[files["adapter"]])
    _assert_unchanged(model, before)


def test_adapter_directory_without_weights(files, tmp_path):
    d = tmp_path / "empty"
    os.makedirs(d)
    with open(os.path.join(files["adapter"], "adapter_config.json")) as f:
        (d / "adapter_config.json").write_text(f.read())
    model = _meta_model(files["base"])
    before = _structure(model)
    with pytest.raises(metaload.ResolveError, match="adapter_model.safetensors"):
        metaload.load_into(model, files["base"], adapters=[str(d)])
    _assert_unchanged(model, before)
    with pytest.raises(metaload.PlanError, match="adapters"):
        metaload.load_into(model, files["base"], adapters="not-a-list")
    with pytest.raises(metaload.PlanError, match="tp_size"):
        metaload.load_into(model, files["base"], tp_size=2, tp_rank=0,
                           adapters=[files["adapter"]])


def test_preinjected_adapter_is_filled_and_kept_on_error(files, tmp_path):
    """A model that already has the adapter's layers (nnsight's meta build) keeps them: filled on
    success, still on meta after a failed load."""
    model = _meta_model(files["base"])
    config = peft.PeftConfig.from_pretrained(files["adapter"])
    with metaload.meta():
        peft.inject_adapter_in_model(config, model)
    q = model.model.layers[0].self_attn.q_proj
    bad = _rewrite_adapter(files["adapter"], tmp_path / "bad", drop=[DROPPED])
    with pytest.raises(metaload.MismatchError):
        metaload.load_into(model, files["base"], adapters=[bad])
    assert model.model.layers[0].self_attn.q_proj is q
    assert all(t.is_meta for t in model.state_dict().values())
    weight = q.lora_A["default"].weight
    metaload.load_into(model, files["base"], adapters=[files["adapter"]])
    assert q.lora_A["default"].weight is weight and not weight.is_meta  # the same Parameter
    assert torch.equal(_logits(model.eval()), _logits(_reference(files["base"],
                                                                 files["adapter"])))


def test_describe_adapter(files):
    info = metaload.describe(files["adapter"])
    a = info.adapter
    header = metaload.checkpoint.read_safetensors_header(os.path.join(files["adapter"],
                                                            "adapter_model.safetensors"))
    numel = sum(int(torch.tensor(t["shape"]).prod()) for t in header["tensors"])
    assert (a.peft_type, a.rank, a.alpha) == ("LORA", 4, 8)
    assert a.target_modules == sorted(TARGETS)
    assert a.base_model == files["base"]
    assert a.n_params == numel == info.n_params
    assert a.size_bytes == 4 * numel == info.size_bytes
    assert a.n_tensors == len(header["tensors"]) and a.dtype == "F32"
    assert "model.layers.0.self_attn.q_proj" in a.layers
    assert metaload.describe(files["base"]).adapter is None


NNSIGHT_WORKER = r"""
import json, os, sys, warnings
os.environ["HF_HUB_OFFLINE"] = "1"
import torch, metaload, nnsight
base, adapter, mode = sys.argv[1:4]
if mode == "metaload":
    metaload.enable_nnsight()
with warnings.catch_warnings():
    warnings.simplefilter("error", UserWarning)  # no fallback to nnsight's own dispatch
    model = nnsight.LanguageModel(base, peft=adapter, dispatch=False)
    ids = torch.tensor([[1, 5, 9, 17, 33, 65]])
    with model.trace(ids):
        q = model.model.layers[0].self_attn.q_proj.output.save()
        out = model.lm_head.output.save()
report = getattr(model, "metaload_report", None)
torch.save({"q": q, "out": out}, sys.argv[4])
print(json.dumps({"adapter_keys": len(report.adapter_keys) if report else None,
                  "type": type(model._module.model.layers[0].self_attn.q_proj).__name__}))
"""


def test_nnsight_peft_through_metaload(files, tmp_path):
    pytest.importorskip("nnsight")
    sys.path.insert(0, HERE)
    from conftest import write_tokenizer
    write_tokenizer(files["base"])
    results = {}
    for mode in ("nnsight", "metaload"):
        out = tmp_path / f"{mode}.pt"
        r = subprocess.run([sys.executable, "-c", NNSIGHT_WORKER, files["base"], files["adapter"],
                            mode, str(out)], capture_output=True, text=True, timeout=600,
                           env=dict(os.environ, HF_HUB_OFFLINE="1",
                                    PYTHONPATH=os.path.join(ROOT, "python")))
        assert r.returncode == 0, r.stderr[-3000:]
        results[mode] = (json.loads(r.stdout.strip().splitlines()[-1]), torch.load(out))
    (own, own_saved), (ml, ml_saved) = results["nnsight"], results["metaload"]
    assert own["type"] == ml["type"] == "Linear"
    assert ml["adapter_keys"] and own["adapter_keys"] is None
    for k in own_saved:
        assert torch.equal(own_saved[k], ml_saved[k]), k


def test_adapter_by_repo_id_in_the_hub_cache(files, tmp_path, monkeypatch):
    import shutil
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "models--org--lora"
    snapshot = repo / "snapshots" / commit
    shutil.copytree(files["adapter"], snapshot)
    os.makedirs(repo / "refs")
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    model = _meta_model(files["base"])
    metaload.load_into(model, files["base"], adapters=["org/lora"])
    assert torch.equal(_logits(model.eval()), _logits(_reference(files["base"],
                                                                 files["adapter"])))
    with pytest.raises(metaload.ResolveError, match="org/other"):
        metaload.load_into(_meta_model(files["base"]), files["base"], adapters=["org/other"])


def test_a_real_model_and_a_second_load(files):
    """A model with real (random) weights takes base and adapter as well, and a second load
    into the model that has the adapter's layers fills them again."""
    torch.manual_seed(7)
    model = transformers.AutoModelForCausalLM.from_config(
        transformers.AutoConfig.from_pretrained(files["base"]))
    ref = _reference(files["base"], files["adapter"])
    metaload.load_into(model, files["base"], adapters=[files["adapter"]])
    assert torch.equal(_logits(model.eval()), _logits(ref))
    layer = model.model.layers[0].self_attn.q_proj
    with torch.no_grad():
        layer.lora_B["default"].weight.zero_()
        model.model.norm.weight.zero_()
    metaload.load_into(model, files["base"], adapters=[files["adapter"]])
    assert model.model.layers[0].self_attn.q_proj is layer  # not injected twice
    assert torch.equal(_logits(model.eval()), _logits(ref))
