"""One load, one open of each checkpoint file (issue 23, "one load path"): every kind of
load_into (strict, non-strict, renamed by key_mapping, renamed by transformers after a first
attempt that did not fit, dequantizing, zero-copy, single-process TP) opens each safetensors file
of the checkpoint exactly once, the header and the tensor data read through that one descriptor.

The opens are counted by the kernel (inotify's IN_OPEN on the checkpoint's directory), not by
metaload: a second open anywhere in the package or the library, a header read again from Python
or a retry that resolves the checkpoint anew, fails these tests. Linux only."""
import ctypes
import ctypes.util
import os
import struct
import sys

import numpy as np
import pytest
import torch

import metaload
from metaload.checkpoint import save_safetensors

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="inotify")

_IN_OPEN = 0x20
_IN_NONBLOCK = 0o4000
_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len; then len bytes of name


class Opens:
    """Counts the opens of each file in `directory` whose name ends with `suffix` while the block
    runs (inotify)."""

    def __init__(self, directory, suffix=".safetensors"):
        self.directory, self.suffix = str(directory), suffix
        self.counts = {}

    def __enter__(self):
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        self._fd = libc.inotify_init1(_IN_NONBLOCK)
        assert self._fd >= 0, os.strerror(ctypes.get_errno())
        wd = libc.inotify_add_watch(self._fd, self.directory.encode(), _IN_OPEN)
        assert wd >= 0, os.strerror(ctypes.get_errno())
        return self

    def __exit__(self, *exc):
        try:
            while True:
                try:
                    data = os.read(self._fd, 1 << 16)
                except BlockingIOError:
                    break
                pos = 0
                while pos < len(data):
                    _, mask, _, n = _EVENT.unpack_from(data, pos)
                    name = data[pos + _EVENT.size:pos + _EVENT.size + n].rstrip(b"\0").decode()
                    pos += _EVENT.size + n
                    if mask & _IN_OPEN and name.endswith(self.suffix):
                        self.counts[name] = self.counts.get(name, 0) + 1
        finally:
            os.close(self._fd)


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(32, 16)
        self.layers = torch.nn.ModuleList([torch.nn.Linear(16, 16) for _ in range(4)])
        self.head = torch.nn.Linear(16, 8)


def sharded(tmp_path, state=None, num_shards=3):
    torch.manual_seed(0)
    src = Net()
    save_safetensors(str(tmp_path), state if state is not None else src, num_shards=num_shards)
    files = sorted(f for f in os.listdir(tmp_path) if f.endswith(".safetensors"))
    assert len(files) == num_shards
    return src, files


def meta_net():
    with metaload.meta():
        return Net()


def once_each(files, counts):
    assert counts == {f: 1 for f in files}


@pytest.mark.parametrize("mmap", [False, True])
def test_strict_load_opens_each_shard_once(tmp_path, mmap):
    src, files = sharded(tmp_path)
    model = meta_net()
    with Opens(tmp_path) as o:
        metaload.load_into(model, str(tmp_path), progress=False, mmap=mmap)
    once_each(files, o.counts)
    assert torch.equal(model.head.weight, src.head.weight)


def test_non_strict_load_opens_each_shard_once(tmp_path):
    state = Net().state_dict()
    state["extra.weight"] = torch.ones(3)
    del state["head.bias"]
    _, files = sharded(tmp_path, state)
    model = meta_net()
    with Opens(tmp_path) as o:
        report = metaload.load_into(model, str(tmp_path), progress=False, strict=False)
    once_each(files, o.counts)
    assert report.missing_keys == ["head.bias"] and report.unexpected_keys == ["extra.weight"]


def test_key_mapping_load_opens_each_shard_once(tmp_path):
    state = {k.replace("layers.", "blocks."): v for k, v in Net().state_dict().items()}
    _, files = sharded(tmp_path, state)
    model = meta_net()
    with Opens(tmp_path) as o:
        metaload.load_into(model, str(tmp_path), progress=False,
                           key_mapping={r"^blocks\.": "layers."})
    once_each(files, o.counts)
    assert torch.equal(model.layers[2].weight, state["blocks.2.weight"])


def test_tp_plan_load_opens_each_shard_once(tmp_path):
    src, files = sharded(tmp_path)
    model = meta_net()
    with Opens(tmp_path) as o:
        metaload.load_into(model, str(tmp_path), progress=False, tp_rank=1, tp_size=2,
                           tp_plan={"layers.*": "colwise"})
    once_each(files, o.counts)
    assert torch.equal(model.layers[1].weight, src.layers[1].weight[8:])


def test_dequantizing_load_opens_the_file_once(tmp_path):
    from quant_refs import gptq_tensors, write_safetensors
    rng = np.random.default_rng(0)
    tensors = {}
    for i in range(2):
        tensors.update(gptq_tensors(rng, f"layers.{i}", 16, 64, bits=4, group=32)[0])
    write_safetensors(str(tmp_path / "model.safetensors"), tensors,
                      {"quantization_config": {"quant_method": "gptq", "bits": 4,
                                               "group_size": 32, "desc_act": False,
                                               "sym": False}})

    class Q(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleList([torch.nn.Linear(64, 16) for _ in range(2)])

    with metaload.meta():
        model = Q().to(torch.bfloat16)
    with Opens(tmp_path) as o:
        report = metaload.load_into(model, str(tmp_path / "model.safetensors"),
                                    dequantize=torch.bfloat16, progress=False)
    once_each(["model.safetensors"], o.counts)
    assert sorted(report.dequantized_keys) == ["layers.0.weight", "layers.1.weight"]


def test_transformers_rename_retry_opens_each_shard_once(tmp_path):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPTNeoXConfig(vocab_size=64, hidden_size=16, num_hidden_layers=2,
                                     num_attention_heads=2, intermediate_size=32,
                                     max_position_embeddings=32, tie_word_embeddings=False)
    torch.manual_seed(0)
    src = transformers.GPTNeoXForCausalLM(cfg)
    # The checkpoint's old name of the head (transformers renames embed_out -> lm_head).
    state = {("embed_out." + k[len("lm_head."):] if k.startswith("lm_head.") else k): v
             for k, v in src.state_dict().items()}
    save_safetensors(str(tmp_path), state, num_shards=2)
    files = sorted(f for f in os.listdir(tmp_path) if f.endswith(".safetensors"))
    with metaload.meta():
        model = transformers.GPTNeoXForCausalLM(cfg)
    with Opens(tmp_path) as o:
        metaload.load_into(model, str(tmp_path), progress=False)
    once_each(files, o.counts)
    assert torch.equal(model.lm_head.weight, src.lm_head.weight)


def test_family_tp_load_opens_each_shard_once(tmp_path):
    """One process's TP slice by the family's plan (the checkpoint's config.json) is the same
    C++ load as the rest: each file opened once, rank 1's slice exactly."""
    import json
    from dist_load_util import GPT2_12, make_fixture, reference, skeleton_spec
    from scripts.dist_load_worker import skeleton
    ckpt = make_fixture(tmp_path, "gpt2-12", GPT2_12, shards=2)
    model = skeleton(json.load(open(skeleton_spec(ckpt, str(tmp_path / "spec.json")))))
    files = sorted(f for f in os.listdir(ckpt) if f.endswith(".safetensors"))
    with Opens(ckpt) as o:
        metaload.load_into(model, ckpt, tp_rank=1, tp_size=2, progress=False)
    once_each(files, o.counts)
    want = reference(ckpt, 1, 2)
    for n, t in model.named_parameters():
        assert torch.equal(t, want[n]), n


def test_hub_cache_load_opens_each_blob_once(tmp_path, monkeypatch):
    """A repo id in the hub cache (zero-copy by default): the snapshot's links lead to blobs,
    each opened once, header and mapping alike."""
    import json
    from dist_load_util import skeleton_spec
    from scripts.dist_load_worker import skeleton
    hub = tmp_path / "hub"
    made = metaload.make_checkpoint(config="llama-tiny", hf_cache=str(hub), repo="org/llama",
                                    shards=2)
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    spec = json.load(open(skeleton_spec(made["dir"], str(tmp_path / "spec.json"))))
    # Parameters only: a skeleton's non-persistent buffers hold no values to load.
    model = skeleton({"tensors": [e for e in spec["tensors"] if e["param"]]})
    blobs = hub / "models--org--llama" / "blobs"
    weights = {os.path.basename(os.path.realpath(os.path.join(made["dir"], f)))
               for f in os.listdir(made["dir"]) if f.endswith(".safetensors")}
    assert len(weights) == 2
    with Opens(blobs, suffix="") as o:
        report = metaload.load_into(model, "org/llama", progress=False)
    counts = o.counts
    assert {b: counts.get(b, 0) for b in weights} == {b: 1 for b in weights}
    assert report.mapped_bytes > 0  # zero-copy: mapped through the header's descriptor


def test_transformers_model_dispatch_opens_each_shard_once(tmp_path):
    """The C++ model's own load (TransformersModel.dispatch: load_tensors) reads each file
    through one descriptor as well."""
    made = metaload.make_checkpoint(str(tmp_path / "g"), config="gpt2-tiny", shards=2)
    files = sorted(f for f in os.listdir(made["dir"]) if f.endswith(".safetensors"))
    assert len(files) == 2
    model = metaload.TransformersModel(made["dir"], progress=False)
    with Opens(made["dir"]) as o:
        model.dispatch()
    once_each(files, o.counts)
