"""metaload beside nnsight (PyPI's, tools/requirements.txt), on checkpoints the test writes.

- metaload.enable_nnsight(): nnsight's meta build runs under metaload.meta() and its dispatch
  streams the weights into the skeleton it built (metaload.load_into) instead of building the
  model a second time with from_pretrained. A trace saving module outputs gives the same values
  with and without it (bitwise), the module objects nnsight wraps stay the same objects, the
  dispatch reads each weight byte once (/proc/self/io) and never calls from_pretrained. GPT-2,
  Llama, and Mixtral, whose per-expert checkpoint tensors the dispatch assembles into
  transformers' fused experts (copied, as nnsight's own dispatch does, unless
  enable_nnsight(mmap_fused=True) maps them as views of the file's pages: that trace is compared
  with the reference's experts at the same address alignment, see _align_like).
- Scan: with enable_nnsight(), `model.scan(...)` runs on metaload.fake(), claiming the dispatch
  device: two invokes' layer and logits outputs have the shapes and dtypes nnsight's own scan
  (FakeTensorMode) saves, for GPT-2, Llama and Mixtral in float32 and bf16, without dispatching
  or touching the meta weights; scan=False gives nnsight's own back; Mixtral in float32, which
  nnsight's own scan cannot run (grouped_mm on meta wants bf16), scans on metaload. nnsight's own
  scan runs after metaload's in the same process: metaload's kernels must not change it.
- Model keys: for the same repo id and revision, nnsight's key function and metaload's write the
  same string, and each side builds from the other's key. nnsight canonicalises the repo id
  through the Hub (HfApi().model_info, network): the test fills nnsight's cache of that answer
  with the id itself, so what is compared is the offline part, the key's text.

nnsight and transformers import much and keep global state, and the hub must be offline from its
first import: everything runs in one worker subprocess (this file run as a script), which prints
its findings as JSON. nnsight 0.8 needs torch 2.x: skipped on Debian's torch 1.13.
"""
import json
import os
import sys

import pytest

from conftest import write_tokenizer

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
REPO = "metaload-test/tiny-gpt2"


# ---------------------------------------------------------------------------------------------
# The worker

def _write_models(top):
    import torch
    import transformers as tf
    configs = {
        "gpt2": tf.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=300, n_positions=64,
                              bos_token_id=1, eos_token_id=1),
        "llama": tf.LlamaConfig(num_hidden_layers=2, hidden_size=32, intermediate_size=64,
                                num_attention_heads=4, num_key_value_heads=2, vocab_size=300,
                                max_position_embeddings=64, bos_token_id=1, eos_token_id=1),
        # A mixture of experts: per-expert checkpoint tensors the dispatch assembles into
        # transformers' fused experts (issue 25).
        "mixtral": tf.MixtralConfig(num_hidden_layers=2, hidden_size=32, intermediate_size=32,
                                    num_attention_heads=4, num_key_value_heads=2,
                                    num_local_experts=4, num_experts_per_tok=2, vocab_size=300,
                                    max_position_embeddings=64, bos_token_id=1, eos_token_id=1),
    }
    dirs = {}
    for i, (name, cfg) in enumerate(configs.items()):
        torch.manual_seed(i)
        d = os.path.join(top, name)
        tf.AutoModelForCausalLM.from_config(cfg).save_pretrained(d)
        write_tokenizer(d)
        dirs[name] = d
    return dirs


def _weight_bytes(d):
    """The bytes of every tensor of the checkpoint, from its safetensors headers."""
    import struct
    total = 0
    for f in sorted(os.listdir(d)):
        if f.endswith(".safetensors"):
            with open(os.path.join(d, f), "rb") as fh:
                (n,) = struct.unpack("<Q", fh.read(8))
                header = json.loads(fh.read(n))
            total += sum(e["data_offsets"][1] - e["data_offsets"][0]
                         for k, e in header.items() if k != "__metadata__")
    return total


def _rchar():
    with open("/proc/self/io") as f:
        return next(int(l.split()[1]) for l in f if l.startswith("rchar:"))


def _trace(model):
    """A few module outputs of one forward, saved."""
    import torch
    layers = model.transformer.h if hasattr(model, "transformer") else model.model.layers
    with torch.no_grad(), model.trace("the quick brown fox"):
        first = layers[0].output[0].save() if isinstance(layers[0].output, tuple) \
            else layers[0].output.save()
        last = layers[-1].output[0].save() if isinstance(layers[-1].output, tuple) \
            else layers[-1].output.save()
        logits = model.lm_head.output.save()
    return [first, last, logits]


def _align_like(module, like):
    """Moves each fused expert tensor of `module` to the address alignment (mod 64) of `like`'s.
    A zero-copy load maps fused experts where the file holds them (8-byte aligned, as safetensors
    writes), and the BLAS kernels of a matmul sum in an order that follows its operands'
    alignment: the same weights give outputs a last bit apart from 64-byte aligned ones."""
    import torch
    theirs = dict(like.named_parameters())
    with torch.no_grad():
        for n, p in module.named_parameters():
            if ".experts." not in n:
                continue
            want = theirs[n].data_ptr() % 64
            buf = torch.empty(p.numel() + 64, dtype=p.dtype)
            skip = (want - buf.data_ptr() % 64) % 64 // p.element_size()
            p.data = buf[skip:skip + p.numel()].view(p.shape).copy_(p)


def _compare_dispatch(name, d, nnsight, metaload, tf, mmap, fused=False):
    import torch
    plain = nnsight.LanguageModel(d, dispatch=False)
    before = _trace(plain)

    calls = []
    original = tf.PreTrainedModel.from_pretrained.__func__

    def counting(cls, *a, **k):
        calls.append(cls.__name__)
        return original(cls, *a, **k)

    metaload.enable_nnsight(mmap=mmap, mmap_fused=fused)
    tf.PreTrainedModel.from_pretrained = classmethod(counting)
    try:
        model = nnsight.LanguageModel(d, dispatch=False)
        module = model._module
        params = dict(module.named_parameters())
        all_meta = all(p.is_meta for p in params.values()) and \
            all(b.is_meta for b in module.buffers())
        start = _rchar()
        # read() is what rchar counts: a copying load whose pages the kernel fills straight from
        # the page cache (loader/engine/page_copy.h, tested on its own) would read none.
        os.environ["METALOAD_PAGE_COPY"] = "0"
        after = _trace(model)
        read = _rchar() - start
    finally:
        os.environ.pop("METALOAD_PAGE_COPY", None)
        tf.PreTrainedModel.from_pretrained = classmethod(original)
        metaload.disable_nnsight()
    _align_like(plain._module, module)
    aligned = _trace(plain)
    return {
        "arch": name,
        "mmap": mmap,
        "fused": fused,
        "mapped_bytes": model.metaload_report.mapped_bytes,
        "meta_before_dispatch": all_meta,
        "same_module": model._module is module,
        "same_parameters": all(p is params[n] for n, p in model._module.named_parameters()),
        "nothing_on_meta_after": not any(t.is_meta for t in
                                         list(module.parameters()) + list(module.buffers())),
        "from_pretrained_calls": calls,
        "equal": [bool(torch.equal(a, b)) for a, b in zip(before, after)],
        "equal_aligned": [bool(torch.equal(a, b)) for a, b in zip(aligned, after)],
        "outputs": len(after),
        "report_bytes": model.metaload_report.bytes,
        "weight_bytes": _weight_bytes(d),
        "rchar": read,
        "eval": not module.training,
    }


def _scan_shapes(model):
    """What a scan of two prompts (one invoke each) saves: each module output's shape and dtype,
    a computed shape, and the type of a saved tensor. (Saved values are handed back to a function
    only as plain variables, one per value.)"""
    import nnsight
    layers = model.transformer.h if hasattr(model, "transformer") else model.model.layers
    with model.scan() as tracer:
        with tracer.invoke("the quick brown fox"):
            first = layers[0].output
            first = (first[0] if isinstance(first, tuple) else first).save()
            last = layers[-1].output
            last = (last[0] if isinstance(last, tuple) else last).save()
            logits = model.lm_head.output.save()
            width = nnsight.save(model.lm_head.output.shape[-1])
        with tracer.invoke("jumps over the lazy dog today"):
            other = model.lm_head.output.save()
    out = [first, last, logits, other]
    return {"shapes": [list(t.shape) for t in out], "dtypes": [str(t.dtype) for t in out],
            "devices": [str(t.device) for t in out], "width": int(width),
            "types": sorted({type(t).__name__ for t in out})}


def _compare_scan(name, d, nnsight, metaload, dtype):
    """nnsight's own scan and the one on metaload's fake mode, of the same model; the second does
    not dispatch and leaves every weight on meta."""
    import torch
    kwargs = {"dtype": dtype} if dtype is not None else {}
    out = {"arch": name, "dtype": str(dtype)}
    try:
        out["own"] = _scan_shapes(nnsight.LanguageModel(d, dispatch=False, **kwargs))
    except Exception as e:  # nnsight's own scan of a Mixtral in float32 (grouped_mm on meta)
        out["own"] = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
    metaload.enable_nnsight()
    try:
        model = nnsight.LanguageModel(d, dispatch=False, **kwargs)
        out["metaload"] = _scan_shapes(model)
        out["metaload_dispatched"] = bool(model.dispatched)
        out["metaload_all_meta"] = all(p.is_meta for p in model._module.parameters())
        metaload.enable_nnsight(scan=False)  # nnsight's own again, on the same model
        try:
            out["scan_off"] = _scan_shapes(model)
        except Exception as e:
            out["scan_off"] = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
        metaload.enable_nnsight(scan=True)
        model.dispatch()  # a scan of a dispatched model: the real weights taken as fake ones
        out["after_dispatch"] = _scan_shapes(model)
        out["weights_untouched"] = not any(metaload.is_fake(p) or p.is_meta
                                           for p in model._module.parameters())
    finally:
        metaload.disable_nnsight()
    return out


def _keys(top, nnsight, metaload):
    """nnsight's and metaload's keys for one repo id and revisions, and each built from the other's."""
    from nnsight.modeling import huggingface
    cache = os.environ["HF_HUB_CACHE"]
    made = metaload.make_checkpoint(config="gpt2-tiny", arch="gpt2", hf_cache=cache, repo=REPO)
    snapshots = os.path.join(cache, "models--" + REPO.replace("/", "--"), "snapshots")
    for snap in os.listdir(snapshots):  # nnsight's pipeline loads a tokenizer with the model
        write_tokenizer(os.path.join(snapshots, snap))
    huggingface._ID_CACHE[REPO] = REPO  # the Hub's canonical spelling: the network part
    out = []
    for revision in (None, made["commit"]):
        model = nnsight.LanguageModel(REPO, revision=revision, dispatch=False)
        theirs = model.to_model_key()
        class_path = theirs.split(":", 1)[0]
        ours = metaload.to_model_key(class_path, REPO, revision, extra={"task": "text-generation"})
        parsed = metaload.from_model_key(theirs)
        entry = {"revision": revision, "nnsight": theirs, "metaload": ours,
                 "parsed": [parsed.class_path, parsed.canonical_class, parsed.repo_id,
                            parsed.revision, parsed.extra]}
        built = metaload.TransformersModel.from_model_key(theirs)
        entry["metaload_built"] = [built.info["class"], built.dispatched, built.to_model_key()]
        back = nnsight.modeling.transformers.TransformersModel._remoteable_from_model_key(
            ours.split(":", 1)[1])
        entry["nnsight_built"] = [type(back).__name__, back.repo_id, back.revision, back.task,
                                  back.to_model_key() == theirs]
        out.append(entry)
    return out


# Field values nnsight writes with json.dumps: integers past 64 bits, floats at repr's switch to
# exponents, escapes. nnsight's key carries them as its task (hashable values only).
KEY_VALUES = [2 ** 64 + 1, -(2 ** 64) - 1, 10 ** 40, 1e16, 1e15, 1.5e-7, 0.1, -0.0, 5e-324,
              "e\u0301\u00e9\U0001F600\x7f\"\\\n", (1, 2.5, None, "x", 2 ** 70), True, None]


def _extra_keys(nnsight, metaload):
    """For each of KEY_VALUES: nnsight's key with it as the task, and metaload's."""
    model = nnsight.LanguageModel(REPO, dispatch=False)
    class_path = model.to_model_key().split(":", 1)[0]
    out = []
    for value in KEY_VALUES:
        model.task = value
        out.append({"value": repr(value), "nnsight": model.to_model_key(),
                    "metaload": metaload.to_model_key(class_path, REPO, None,
                                                      extra={"task": value})})
    return out


def worker(top):
    import warnings
    warnings.simplefilter("ignore")
    import metaload
    import nnsight
    import transformers as tf
    tf.logging.set_verbosity_error()
    dirs = _write_models(top)
    result = {"dispatch": [_compare_dispatch(n, d, nnsight, metaload, tf, mmap)
                           for n, d in dirs.items() for mmap in (False, True)] +
              [_compare_dispatch("mixtral", dirs["mixtral"], nnsight, metaload, tf, True, True)],
              "keys": _keys(top, nnsight, metaload)}
    result["extra_keys"] = _extra_keys(nnsight, metaload)
    import torch
    result["scan"] = [_compare_scan(n, d, nnsight, metaload, dt) for n, d in dirs.items()
                      for dt in (None, torch.bfloat16)]
    print("RESULT " + json.dumps(result))


if __name__ == "__main__" and sys.argv[1:2] == ["--worker"]:
    worker(sys.argv[2])
    sys.exit(0)


# ---------------------------------------------------------------------------------------------
# The tests

from conftest import offline_worker  # noqa: E402

pytest.importorskip("nnsight", reason="nnsight 0.8 (tools/requirements.txt) is installed in the "
                    "torch 2.x environment only: it needs torch >= 2")


@pytest.fixture(scope="module")
def findings(tmp_path_factory):
    top = tmp_path_factory.mktemp("nnsight")
    return offline_worker(__file__, top)


@pytest.mark.parametrize("mmap", [False, True])
@pytest.mark.parametrize("arch", ["gpt2", "llama", "mixtral"])
def test_a_trace_gives_the_same_values_with_metaload_dispatching(findings, arch, mmap):
    row = next(r for r in findings["dispatch"] if r["arch"] == arch and r["mmap"] == mmap and
               not r["fused"])
    assert row["meta_before_dispatch"], "the meta build left real tensors"
    assert row["equal"] == [True] * row["outputs"], row
    assert row["same_module"] and row["same_parameters"], "the dispatch replaced the skeleton"
    assert row["nothing_on_meta_after"], "a tensor stayed on meta after the dispatch"
    assert row["eval"], "from_pretrained leaves models in eval mode; the dispatch must too"
    assert row["from_pretrained_calls"] == [], "the dispatch built the model a second time"


@pytest.mark.parametrize("arch", ["gpt2", "llama", "mixtral"])
def test_the_copying_dispatch_reads_each_weight_byte_once(findings, arch):
    row = next(r for r in findings["dispatch"] if r["arch"] == arch and not r["mmap"])
    assert row["report_bytes"] == row["weight_bytes"] > 0 and row["mapped_bytes"] == 0
    # Everything the trace read from files: the weights once (a second copy would double it),
    # plus small metadata (the safetensors header).
    assert row["weight_bytes"] <= row["rchar"] < row["weight_bytes"] + 64 * 1024, row


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_the_default_dispatch_maps_the_weights_as_from_pretrained_does(findings, arch):
    row = next(r for r in findings["dispatch"] if r["arch"] == arch and r["mmap"] and
               not r["fused"])
    assert row["report_bytes"] == row["weight_bytes"] == row["mapped_bytes"] > 0
    assert row["rchar"] < 64 * 1024, row  # mapped, not read through read()


def test_an_moe_dispatch_maps_what_lies_whole_and_copies_the_assembled_experts(findings):
    """As nnsight's own dispatch (from_pretrained) does: its trace is the same, bit for bit."""
    row = next(r for r in findings["dispatch"] if r["arch"] == "mixtral" and r["mmap"] and
               not r["fused"])
    assert row["report_bytes"] == row["weight_bytes"] > row["mapped_bytes"] > 0, row


def test_an_moe_dispatch_with_mmap_fused_maps_the_assembled_experts_too(findings):
    """enable_nnsight(mmap_fused=True): every expert here is one page (32 x 32 float32), so the
    fused experts are views of the file's pages (FileMapping::map_view) and nothing is copied.
    They keep the file's alignment, and CPU matmuls sum in an order that follows it: the trace
    equals the reference's once the reference's experts sit at the same alignment."""
    row = next(r for r in findings["dispatch"] if r["fused"])
    assert row["report_bytes"] == row["weight_bytes"] == row["mapped_bytes"] > 0, row
    # Mapped, not read through read(), but for the pages where two experts meet: at most two
    # for each of the 24 expert tensors (2 layers x 4 experts x w1, w2, w3).
    assert row["rchar"] < 64 * 1024 + 24 * 2 * os.sysconf("SC_PAGESIZE"), row
    assert row["equal_aligned"] == [True] * row["outputs"], row
    assert row["same_module"] and row["nothing_on_meta_after"], row


def test_nnsight_and_metaload_write_the_same_model_key(findings):
    for entry in findings["keys"]:
        assert entry["metaload"] == entry["nnsight"], entry
        class_path, canonical, repo_id, revision, extra = entry["parsed"]
        assert class_path == entry["nnsight"].split(":", 1)[0]
        assert canonical == "metaload.TransformersModel"
        assert (repo_id, revision, extra) == (REPO, entry["revision"], {"task": "text-generation"})


def test_every_field_value_is_written_as_nnsight_writes_it(findings):
    # 2**64 + 1 was written as 1.8446744073709552e+19: the key differed from nnsight's.
    assert len(findings["extra_keys"]) == len(KEY_VALUES)
    for entry in findings["extra_keys"]:
        assert entry["metaload"] == entry["nnsight"], entry


def test_each_side_builds_from_the_other_sides_key(findings):
    for entry in findings["keys"]:
        cls, dispatched, own_key = entry["metaload_built"]
        assert (cls, dispatched) == ("GPT2LMHeadModel", False)
        assert own_key == metaload_key(REPO, entry["revision"])
        assert entry["nnsight_built"][1:] == [REPO, entry["revision"], "text-generation", True]


def metaload_key(repo_id, revision):
    return "metaload.TransformersModel:" + json.dumps({"repo_id": repo_id, "revision": revision})


@pytest.mark.parametrize("dtype", ["None", "torch.bfloat16"])
@pytest.mark.parametrize("arch", ["gpt2", "llama", "mixtral"])
def test_a_scan_on_metaload_saves_what_nnsights_own_scan_saves(findings, arch, dtype):
    row = next(r for r in findings["scan"] if r["arch"] == arch and r["dtype"] == dtype)
    ours = row["metaload"]
    assert "error" not in ours, ours
    assert ours["types"] == ["Tensor"], "a scan on metaload saves metaload's fake tensors"
    assert ours["devices"] == ["cpu"] * len(ours["shapes"]), "the dispatch device is claimed"
    # one row per invoke, the two prompts padded to one length; the vocabulary's logits
    assert ours["shapes"][2][0] == ours["shapes"][3][0] == 1 and ours["width"] == 300, ours
    assert ours["shapes"][2] == ours["shapes"][3] and ours["shapes"][0][-1] == 32, ours
    assert not row["metaload_dispatched"] and row["metaload_all_meta"], \
        "a scan must neither dispatch nor touch the meta weights"
    assert row["after_dispatch"]["shapes"] == ours["shapes"] and row["weights_untouched"]
    assert row["after_dispatch"]["dtypes"] == ours["dtypes"]
    own = row["own"]
    if arch == "mixtral" and dtype == "None":
        # nnsight's own scan cannot run transformers' grouped_mm experts in float32 on meta
        # (torch's meta kernel wants bf16); metaload's fake mode runs them as the CPU kernel does.
        assert "error" in own and "error" in row["scan_off"], own
        return
    assert "error" not in own, own
    assert (ours["shapes"], ours["dtypes"], ours["width"]) == \
        (own["shapes"], own["dtypes"], own["width"])
    assert own["types"] == ["FakeTensor"] and own["devices"] == ["meta"] * len(own["shapes"])
    # enable_nnsight(scan=False) gives nnsight's own scan back, on the same model.
    assert row["scan_off"] == own
