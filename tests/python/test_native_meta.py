"""metaload.fake computes shapes with libtorch's C++ kernels, not torch 2.x's Python Meta kernels.

torch 2.x registers Python Meta kernels (torch/_meta_registrations.py) over libtorch's C++ ones for
hundreds of ops; a fake op that redispatched to Meta ran one per op (the cause of metaload.fake
being only ~2x faster than FakeTensorMode on 2.11). kernels/native_meta has metaload's fallback
call libtorch's own C++ kernels for the ops of its table instead, and registers nothing: torch's
FakeTensorMode and torch.device("meta") keep the Python kernels. Both torches run these tests.
"""
import collections
import contextlib
import math
import os
import sys

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
import torchvision

import metaload
from nn_blocks import RmsNorm

TORCH2 = int(torch.__version__.split(".")[0]) >= 2
_TORCH_DIR = os.path.dirname(torch.__file__)
# Where torch's Python meta kernels live, and the refs/decompositions they are written with.
_PY_META = tuple(os.path.join(_TORCH_DIR, p) for p in
                 ("_meta_registrations.py", "_refs", "_prims", "_prims_common", "_decomp"))


@contextlib.contextmanager
def python_meta_calls():
    """Counts calls into torch's Python meta code entered from outside it, by function."""
    calls = collections.Counter()

    def profile(frame, event, arg):
        if event != "call" or not frame.f_code.co_filename.startswith(_PY_META):
            return
        caller = frame.f_back.f_code.co_filename if frame.f_back is not None else ""
        if not caller.startswith(_PY_META):
            name = os.path.relpath(frame.f_code.co_filename, _TORCH_DIR)
            calls[f"{name}:{frame.f_code.co_name}"] += 1

    previous = sys.getprofile()
    sys.setprofile(profile)
    try:
        yield calls
    finally:
        sys.setprofile(previous)


class Gpt2Block(nn.Module):
    def __init__(self, d=32, h=4):
        super().__init__()
        self.h = h
        self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.c_attn, self.c_proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.c_fc, self.mlp_proj = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.register_buffer("mask", torch.ones(16, 16, dtype=torch.bool).tril()[None, None])

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(d, dim=2)
        q, k, v = (t.view(b, s, self.h, d // self.h).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.h)
        att = torch.where(self.mask[:, :, :s, :s], att, torch.finfo(att.dtype).min)
        y = F.softmax(att, dim=-1) @ v
        x = x + self.c_proj(y.transpose(1, 2).reshape(b, s, d))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class LlamaBlock(nn.Module):
    def __init__(self, vocab=64, d=32, h=4, ff=48):
        super().__init__()
        self.h = h
        self.embed = nn.Embedding(vocab, d)
        self.q, self.k, self.v, self.o = (nn.Linear(d, d, bias=False) for _ in range(4))
        self.gate, self.up = nn.Linear(d, ff, bias=False), nn.Linear(d, ff, bias=False)
        self.down = nn.Linear(ff, d, bias=False)
        self.norm_1, self.norm_2 = RmsNorm(d), RmsNorm(d)

    @staticmethod
    def rotate(x):
        half = x.shape[-1] // 2
        return torch.cat((-x[..., half:], x[..., :half]), dim=-1)

    def forward(self, ids):
        x = self.embed(ids)
        b, s, d = x.shape
        hd = d // self.h
        inv = 1.0 / (10000 ** (torch.arange(0, hd, 2, device=ids.device).float() / hd))
        freqs = torch.outer(torch.arange(s, device=ids.device).float(), inv)
        cos, sin = torch.cat((freqs, freqs), -1).cos(), torch.cat((freqs, freqs), -1).sin()
        y = self.norm_1(x)
        q, k, v = (m(y).view(b, s, self.h, hd).transpose(1, 2) for m in (self.q, self.k, self.v))
        q, k = q * cos + self.rotate(q) * sin, k * cos + self.rotate(k) * sin
        if hasattr(F, "scaled_dot_product_attention"):
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            a = F.softmax(q @ k.transpose(-1, -2) / math.sqrt(hd), -1) @ v
        x = x + self.o(a.transpose(1, 2).reshape(b, s, d))
        y = self.norm_2(x)
        return x + self.down(F.silu(self.gate(y)) * self.up(y))


def _gpt2():
    return Gpt2Block(), lambda device: torch.randn(2, 16, 32, device=device)


def _llama():
    return LlamaBlock(), lambda device: torch.randint(64, (2, 16), device=device)


def _resnet18():
    return torchvision.models.resnet18(), lambda device: torch.randn(2, 3, 64, 64, device=device)


MODELS = {"gpt2_block": _gpt2, "llama_block": _llama, "resnet18": _resnet18}


def test_every_table_entry_fits_this_torchs_schemas():
    ops = torch.ops.metaload
    assert list(ops.native_meta_unfit()) == []
    table = list(ops.native_meta_table())
    assert len(table) >= 120 and table == sorted(table)
    active = set(ops.native_meta_kernels())
    assert {"aten::add.Tensor", "aten::mm", "aten::_softmax", "aten::gelu"} <= active


@pytest.mark.skipif(not TORCH2, reason="torch 1.13 has no Python Meta kernels over C++ ones")
def test_on_torch2_the_table_stands_in_for_python_meta_kernels():
    ops = torch.ops.metaload
    active = set(ops.native_meta_kernels())
    for op in ("aten::add.Tensor", "aten::mul.Scalar", "aten::addmm", "aten::bmm", "aten::mm",
               "aten::_softmax", "aten::_safe_softmax", "aten::gelu", "aten::silu", "aten::cat",
               "aten::embedding", "aten::_unsafe_view", "aten::relu_", "aten::uniform_",
               "aten::max_pool2d_with_indices", "aten::cudnn_batch_norm"):
        assert op in active, op
        # ... each of which torch serves with a Python kernel (untouched by metaload).
        assert ops.meta_kernel_owner(op) == "python", op


@pytest.mark.parametrize("name", sorted(MODELS))
def test_forwards_under_metaload_fake_call_no_python_meta_kernel(name):
    with metaload.meta():
        model, make_input = MODELS[name]()
    model.eval()
    x = make_input("meta")
    with torch.no_grad(), metaload.fake("cuda"):
        model(x)  # first use: per-op facts are computed and cached
    with python_meta_calls() as calls, torch.no_grad(), metaload.fake("cuda"):
        out = model(x)
    assert out.device == torch.device("cuda", 0)
    assert dict(calls) == {}


@pytest.mark.skipif(not TORCH2, reason="torch 1.13 has no Python Meta kernels over C++ ones")
def test_torchs_own_meta_users_keep_the_python_kernels():
    model, make_input = _gpt2()
    with torch.no_grad():
        with python_meta_calls() as on_meta, torch.device("meta"):
            out = model.to("meta")(make_input("meta"))
        assert out.is_meta and out.shape == (2, 16, 32)
        assert any("_meta_registrations" in k or "_refs" in k for k in on_meta), dict(on_meta)
        from torch._subclasses import FakeTensorMode
        with FakeTensorMode() as mode:
            model, make_input = _gpt2()
            x = make_input("cpu")
        with python_meta_calls() as in_torch_fake, mode, torch.no_grad():
            out = model(x)
        assert type(out).__name__ == "FakeTensor" and out.shape == (2, 16, 32)
        assert sum(in_torch_fake.values()) > 0


@pytest.mark.parametrize("name", ["gpt2_block", "llama_block"])
def test_every_module_output_has_the_real_runs_shape_strides_and_dtype(name):
    torch.manual_seed(0)
    model, make_input = MODELS[name]()
    model.eval()
    x = make_input("cpu")

    def record(into):
        def hook(module, args, out):
            for t in out if isinstance(out, tuple) else (out,):
                if isinstance(t, torch.Tensor):
                    into.append((module.__class__.__name__, tuple(t.shape), t.stride(), t.dtype))
        return hook

    real, fake = [], []
    handles = [m.register_forward_hook(record(real)) for m in model.modules()]
    with torch.no_grad():
        model(x)
    for h in handles:
        h.remove()
    handles = [m.register_forward_hook(record(fake)) for m in model.modules()]
    with torch.no_grad(), metaload.fake("cpu"):
        model(x)
    for h in handles:
        h.remove()
    assert fake == real


def test_a_python_number_keeps_its_rank_in_type_promotion():
    def results():
        i, h = torch.ones(3, dtype=torch.long), torch.ones(3, dtype=torch.half)
        return [(i * 2.5).dtype, (2.5 * i).dtype, (h * 2.5).dtype, (i + True).dtype,
                (i * torch.tensor(2.5, dtype=torch.float64)).dtype,
                (h + torch.tensor(2.5, dtype=torch.float64)).dtype]

    real = results()
    assert real[0] == torch.get_default_dtype()
    with metaload.fake("cuda"):
        assert results() == real


@pytest.mark.parametrize("training", [False, True])
def test_cudnn_batch_norm_matches_torchs_own_meta_kernel(training):
    # batch_norm picks cudnn_batch_norm for cuda tensors on a CUDA build; metaload computes what
    # torch's Python kernel computes (its decomposition), in C++.
    def run(device):
        x = torch.empty(2, 3, 4, 4, device=device)
        w, b, rm, rv = (torch.empty(3, device=device) for _ in range(4))
        outs = torch.ops.aten.cudnn_batch_norm(x, w, b, rm, rv, training, 0.1, 1e-5)
        return [(tuple(t.shape), t.stride(), t.dtype) for t in outs]

    expected = run("meta")
    with metaload.fake("cuda"):
        assert run("cuda") == expected
