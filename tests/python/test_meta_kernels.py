"""metaload's Meta (shape) kernels seen from Python.

- Registration: what the library registers next to torch's Python meta kernels, with them disabled
  (PYTORCH_DISABLE_LIBRARY=1, which leaves exactly libtorch's C++ kernels), switched off
  (METALOAD_META_KERNELS=off) and preloaded before `import torch`.
- Coverage: every torchvision classification builder runs forward on meta tensors and gives the
  shape a real run gives; small models are also run for real and every module's output shape
  (and, where CPU kernels fix it, stride) is compared. Both with and without torch's Python meta
  kernels, each in its own interpreter.
- Transformer blocks (GPT-2, Llama, BERT style; nn.TransformerEncoderLayer and its fused ops).

Run: METALOAD_LIB=build/dev/libmetaload.so /usr/bin/python3 -m pytest tests/python/test_meta_kernels.py
"""
import json
import math
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

# Every torchvision 0.14 classification builder passes; the count may only rise.
COVERAGE_FLOOR = 80

# Built for real and compared module by module (small, and fine at a small input size).
SMALL_MODELS = {
    "resnet18": 64, "mobilenet_v3_small": 64, "mobilenet_v2": 64, "squeezenet1_1": 64,
    "shufflenet_v2_x0_5": 64, "mnasnet0_5": 64, "efficientnet_b0": 64, "densenet121": 64,
    "regnet_x_400mf": 64, "regnet_y_400mf": 64, "googlenet": 64, "convnext_tiny": 64,
    "alexnet": 64, "vgg11_bn": 32, "swin_t": 64, "inception_v3": 80, "efficientnet_v2_s": 64,
    "resnext50_32x4d": 64,
}


def lib_path():
    path = os.environ.get("METALOAD_LIB")
    if not path:
        import pytest
        pytest.exit("METALOAD_LIB is not set: point it at the built libmetaload.so", 2)
    return os.path.abspath(path)


def run_python(code, env=None, preload=False, timeout=600, args=()):
    """Runs code (or this file with args) in a fresh interpreter (this one); returns CompletedProcess."""
    e = dict(os.environ)
    e["PYTHONPATH"] = os.path.join(ROOT, "python") + os.pathsep + e.get("PYTHONPATH", "")
    e["METALOAD_LIB"] = lib_path()
    for k in ("METALOAD", "METALOAD_REPORT", "LD_PRELOAD", "PYTORCH_DISABLE_LIBRARY",
              "METALOAD_META_KERNELS"):
        e.pop(k, None)
    if preload:
        e["LD_PRELOAD"] = lib_path()
    e.update(env or {})
    cmd = [sys.executable, "-c", code] if code else [sys.executable, __file__, *args]
    return subprocess.run(cmd, env=e, capture_output=True, text=True, timeout=timeout)


# Without torch's Python meta kernels: torch 1.13 honours PYTORCH_DISABLE_LIBRARY=1 (its
# torch.library creates nothing); torch 2.x ignores it, so the children also destroy the Python
# meta libraries _meta_registrations made (NO_PY_META below), leaving libtorch's C++ kernels.
WITHOUT_PY_META = {"PYTORCH_DISABLE_LIBRARY": "1", "METALOAD_TEST_NO_PY_META": "1"}
NO_PY_META = """
import os, sys, torch
_m = sys.modules.get("torch._meta_registrations")  # imported by `import torch` on 2.x
if os.environ.get("METALOAD_TEST_NO_PY_META") == "1" and _m is not None:
    for _name in dir(_m):
        if _name.startswith("_meta_lib_dont_use_me") and hasattr(getattr(_m, _name), "_destroy"):
            getattr(_m, _name)._destroy()
"""


def disable_python_meta_kernels():
    exec(NO_PY_META, {})


def last_json(proc):
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ---- registration -----------------------------------------------------------------------------

STATE = NO_PY_META + """
import json, os, torch
before = torch.ops.aten.native_batch_norm(
    torch.empty(2, 3, 4, 4, device="meta"), None, None, torch.empty(3, device="meta"),
    torch.empty(3, device="meta"), False, 0.1, 1e-5)[1].shape if {check_before} else None
torch.ops.load_library(os.environ["METALOAD_LIB"])
ops = torch.ops.metaload
{extra}
after = torch.ops.aten.native_batch_norm(
    torch.empty(2, 3, 4, 4, device="meta"), None, None, torch.empty(3, device="meta"),
    torch.empty(3, device="meta"), False, 0.1, 1e-5)[1].shape
owners = {{}}
for op in ops.meta_kernel_table():
    try:
        owners[op] = ops.meta_kernel_owner(op)
    except RuntimeError:  # not an operator of this libtorch
        owners[op] = "absent"
print(json.dumps({{
    "registered": list(ops.registered_meta_kernels()),
    "replaced": list(ops.replaced_python_meta_kernels()),
    "table": list(ops.meta_kernel_table()),
    "owner_relu": ops.meta_kernel_owner("aten::relu"),
    "owner_add": ops.meta_kernel_owner("aten::add.Tensor"),
    "owners": owners,
    "before": list(before) if before is not None else None,
    "after": list(after),
}}))
"""


def test_overrides_python_meta_kernels_and_fixes_batch_norm_eval_stats():
    s = last_json(run_python(STATE.format(check_before=True, extra="")))
    assert "aten::native_batch_norm" in s["replaced"]
    assert "aten::relu" in s["replaced"]
    assert set(s["replaced"]) <= set(s["registered"]) <= set(s["table"])
    assert s["owner_relu"] == "metaload"
    # add.Tensor is no table op: left to torch (C++ on 1.13; 2.x puts a Python kernel over it).
    assert "aten::add.Tensor" not in s["registered"] and s["owner_add"] in ("native", "python")
    # torch 1.13's Python meta kernel returns save_mean of shape (C,) in eval; CPU returns (0,).
    if s["before"] != [0]:
        print("python meta native_batch_norm eval save_mean:", s["before"])
    assert s["after"] == [0]


def test_without_python_meta_kernels_ours_fill_the_cpp_gaps():
    s = last_json(run_python(STATE.format(check_before=False, extra=""), env=WITHOUT_PY_META))
    assert s["replaced"] == []
    # Each is ours, or libtorch's own C++ kernel where this torch has one (2.x has more).
    for op in ["aten::convolution", "aten::native_batch_norm", "aten::native_layer_norm",
               "aten::relu", "aten::where.self", "aten::index_select", "aten::logical_not.out",
               "aten::_adaptive_avg_pool2d", "aten::roll", "aten::native_group_norm"]:
        assert op in s["registered"] or s["owners"][op] == "native", (op, s["owners"][op])
    assert "aten::relu" in s["registered"]  # no C++ Meta kernel on any supported torch
    assert all(s["owners"][op] in ("metaload", "native", "none", "absent") for op in s["table"])
    print(f"\n{len(s['registered'])} of {len(s['table'])} table ops registered over C++ libtorch")


def test_switched_off_registers_nothing():
    code = NO_PY_META + """
torch.ops.load_library(os.environ["METALOAD_LIB"])
assert list(torch.ops.metaload.registered_meta_kernels()) == []
try:
    torch.relu(torch.empty(3, device="meta"))
    raise SystemExit("relu ran on meta without a kernel")
except NotImplementedError:
    pass
added = list(torch.ops.metaload.ensure_meta_kernels())   # explicit registration still works
assert "aten::relu" in added, added
print(torch.relu(torch.empty(3, device="meta")).shape)
"""
    p = run_python(code, env=dict(WITHOUT_PY_META, METALOAD_META_KERNELS="off"))
    assert p.returncode == 0, p.stderr[-3000:]
    assert "torch.Size([3])" in p.stdout


def test_preloaded_before_import_torch_waits_then_goes_over_python_kernels():
    code = """
import json, torch
ops = torch.ops.metaload
waiting = list(ops.registered_meta_kernels())
added = list(ops.ensure_meta_kernels())
print(json.dumps({"waiting": waiting, "added": added,
                  "replaced": list(ops.replaced_python_meta_kernels()),
                  "owner": ops.meta_kernel_owner("aten::native_batch_norm")}))
"""
    s = last_json(run_python(code, preload=True))
    # Registering at preload time would put torch's Python kernels on top of ours.
    assert s["waiting"] == []
    assert "aten::native_batch_norm" in s["added"]
    assert "aten::native_batch_norm" in s["replaced"]
    assert s["owner"] == "metaload"


# ---- coverage: torchvision classification models ----------------------------------------------

def _build(name, initialise=False):
    """The model, by default with parameters left uninitialised (values do not matter for shapes;
    initialising the big ones would dominate the run time)."""
    import torch
    from torchvision import models
    if initialise:
        return models.get_model(name, weights=None)
    init = torch.nn.init
    saved = {}
    for fn in dir(init):
        if fn.endswith("_") and not fn.startswith("_"):
            saved[fn] = getattr(init, fn)
            setattr(init, fn, lambda t, *a, **k: t)
    try:
        with torch.no_grad():
            return models.get_model(name, weights=None)
    finally:
        for k, v in saved.items():
            setattr(init, k, v)


def _default_size(name):
    return 299 if name == "inception_v3" else 224


def _record(model):
    """Forward hooks collecting each module's (first) tensor output: name -> (shape, stride)."""
    import torch
    seen = {}

    def hook(mod, inp, out, name):
        if isinstance(out, (tuple, list)):
            out = out[0] if out and isinstance(out[0], torch.Tensor) else None
        if isinstance(out, torch.Tensor):
            # the stride of a size-1 dimension is arbitrary (kernels differ there): left out
            strides = [st if sz > 1 else None for sz, st in zip(out.shape, out.stride())]
            seen[name] = (list(out.shape), strides, str(out.dtype))

    handles = [m.register_forward_hook(lambda mod, i, o, n=n: hook(mod, i, o, n))
               for n, m in model.named_modules() if n]
    return seen, handles


def coverage_worker():
    """Every classification builder: meta forward (train and eval) at the default size; small ones
    also real at a small size, module by module. Prints a JSON summary."""
    import warnings
    import torch
    from torchvision import models
    warnings.simplefilter("ignore")
    torch.ops.load_library(os.environ["METALOAD_LIB"])
    torch.set_num_threads(1)
    names = sorted(models.list_models(module=models))
    result = {"passed": [], "failed": {}, "compared": [], "mismatch": {}, "seconds": 0}
    start = time.time()
    for name in names:
        try:
            model = _build(name).to("meta")
            size = _default_size(name)
            x = torch.empty(2, 3, size, size, device="meta")
            model.eval()
            with torch.no_grad():
                y = model(x)
            assert tuple(y.shape) == (2, 1000), f"eval output {tuple(y.shape)}"
            assert y.is_meta
            model.train()
            y = model(x)
            y = y[0] if isinstance(y, tuple) else y   # inception/googlenet aux outputs
            assert tuple(y.shape) == (2, 1000), f"train output {tuple(y.shape)}"
            result["passed"].append(name)
        except Exception as e:  # noqa: BLE001 -- recorded and reported by the test
            result["failed"][name] = f"{type(e).__name__}: {str(e)[:300]}"
        finally:
            model = None
    # Real CPU forwards of the small models: every module's output must agree.
    for name, size in SMALL_MODELS.items():
        if name not in names:
            continue
        for fmt in (torch.contiguous_format, torch.channels_last):
            torch.manual_seed(0)
            x = torch.rand(2, 3, size, size).contiguous(memory_format=fmt)
            net = _build(name, initialise=True).eval().to(memory_format=fmt)
            seen_cpu, handles = _record(net)
            with torch.no_grad():
                net(x)
            for h in handles:
                h.remove()
            key = f"{name}/{'channels_last' if fmt is torch.channels_last else 'contiguous'}"
            result["compared"].append(key)
            meta = net.to("meta")
            seen_meta, handles = _record(meta)
            try:
                with torch.no_grad():
                    meta(x.to("meta"))
            except Exception as e:  # noqa: BLE001
                result["mismatch"][key] = f"{type(e).__name__}: {str(e)[:200]}"
                continue
            finally:
                for h in handles:
                    h.remove()
                net = meta = None
            bad = {k: (v, seen_meta.get(k)) for k, v in seen_cpu.items() if seen_meta.get(k) != v}
            if bad:
                result["mismatch"][key] = dict(list(bad.items())[:3])
    result["seconds"] = round(time.time() - start, 1)
    print(json.dumps(result))


def _check_coverage(env):
    r = last_json(run_python(None, env=env, args=["--coverage"]))
    total = len(r["passed"]) + len(r["failed"])
    label = "without" if env.get("METALOAD_TEST_NO_PY_META") == "1" else "with"
    print(f"\ntorchvision classification on meta ({label} torch's Python meta kernels): "
          f"{len(r['passed'])} passed out of {total} in {r['seconds']} s")
    for name, why in r["failed"].items():
        print(f"  {name}: {why}")
    print(f"  module-by-module against real CPU runs: {len(r['compared']) - len(r['mismatch'])} "
          f"of {len(r['compared'])} agree")
    for key, bad in r["mismatch"].items():
        print(f"  {key}: {bad}")
    assert total >= COVERAGE_FLOOR
    assert len(r["passed"]) >= COVERAGE_FLOOR, r["failed"]
    assert not r["mismatch"], r["mismatch"]


def test_torchvision_classification_on_meta_with_our_kernels_only():
    _check_coverage(WITHOUT_PY_META)


def test_torchvision_classification_on_meta_next_to_python_kernels():
    _check_coverage({})


# ---- transformer blocks -----------------------------------------------------------------------

def blocks_worker():
    """GPT-2, Llama and BERT style blocks and nn.Transformer* on meta vs CPU, module by module."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    from nn_blocks import RmsNorm
    torch.ops.load_library(os.environ["METALOAD_LIB"])
    torch.manual_seed(0)

    class GPT2Block(nn.Module):
        """Hugging Face GPT-2's block: Conv1D projections, bool causal-mask buffer, where."""

        def __init__(self, d=32, h=4, n_pos=64):
            super().__init__()
            self.h, self.d = h, d
            self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.c_attn = nn.Parameter(torch.randn(d, 3 * d) * 0.02)
            self.c_attn_b = nn.Parameter(torch.zeros(3 * d))
            self.c_proj = nn.Parameter(torch.randn(d, d) * 0.02)
            self.c_proj_b = nn.Parameter(torch.zeros(d))
            self.fc = nn.Linear(d, 4 * d)
            self.proj = nn.Linear(4 * d, d)
            self.register_buffer("bias", torch.tril(torch.ones(n_pos, n_pos, dtype=torch.bool))
                                 .view(1, 1, n_pos, n_pos))
            self.drop = nn.Dropout(0.1)

        def forward(self, x):
            b, t, d = x.shape
            q, k, v = torch.addmm(self.c_attn_b, self.ln_1(x).view(-1, d), self.c_attn) \
                .view(b, t, 3 * d).split(d, dim=2)
            split = lambda z: z.view(b, t, self.h, d // self.h).permute(0, 2, 1, 3)
            q, k, v = split(q), split(k), split(v)
            w = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(d // self.h)
            w = torch.where(self.bias[:, :, :t, :t], w,
                            torch.full([], torch.finfo(w.dtype).min, dtype=w.dtype,
                                       device=w.device))
            a = torch.matmul(self.drop(F.softmax(w, dim=-1)), v)
            a = a.permute(0, 2, 1, 3).contiguous().view(b, t, d)
            x = x + torch.addmm(self.c_proj_b, a.view(-1, d), self.c_proj).view(b, t, d)
            h = self.fc(self.ln_2(x))
            h = 0.5 * h * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * h.pow(3))))
            return x + self.proj(h)

    class GPT2(nn.Module):
        def __init__(self, vocab=50, d=32):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(64, d)
            self.h = nn.ModuleList([GPT2Block(d), GPT2Block(d)])
            self.ln_f = nn.LayerNorm(d)

        def forward(self, ids):
            pos = torch.arange(ids.shape[-1], device=ids.device).unsqueeze(0)
            x = self.wte(ids) + self.wpe(pos)
            for blk in self.h:
                x = blk(x)
            return F.linear(self.ln_f(x), self.wte.weight)

    class LlamaBlock(nn.Module):
        """Llama: RMSNorm, rotary embedding (cat, sin/cos), GQA, causal mask (triu/full), SiLU."""

        def __init__(self, d=32, h=4, kv=2, inter=64, sdpa=False):
            super().__init__()
            self.h, self.kv, self.hd, self.sdpa = h, kv, d // h, sdpa
            self.q = nn.Linear(d, d, bias=False)
            self.k = nn.Linear(d, kv * self.hd, bias=False)
            self.v = nn.Linear(d, kv * self.hd, bias=False)
            self.o = nn.Linear(d, d, bias=False)
            self.gate = nn.Linear(d, inter, bias=False)
            self.up = nn.Linear(d, inter, bias=False)
            self.down = nn.Linear(inter, d, bias=False)
            self.n1, self.n2 = RmsNorm(d), RmsNorm(d)
            self.register_buffer("inv_freq", 1.0 / (10000 ** (torch.arange(0, self.hd, 2).float()
                                                               / self.hd)), persistent=False)

        def forward(self, x, mask):
            b, t, d = x.shape
            y = self.n1(x)
            q = self.q(y).view(b, t, self.h, self.hd).transpose(1, 2)
            k = self.k(y).view(b, t, self.kv, self.hd).transpose(1, 2)
            v = self.v(y).view(b, t, self.kv, self.hd).transpose(1, 2)
            freqs = torch.outer(torch.arange(t, device=x.device).float(), self.inv_freq)
            emb = torch.cat((freqs, freqs), dim=-1)
            cos, sin = emb.cos()[None, None], emb.sin()[None, None]
            rot = lambda z: torch.cat((-z[..., self.hd // 2:], z[..., :self.hd // 2]), dim=-1)
            q, k = q * cos + rot(q) * sin, k * cos + rot(k) * sin
            rep = self.h // self.kv
            k = k[:, :, None].expand(b, self.kv, rep, t, self.hd).reshape(b, self.h, t, self.hd)
            v = v[:, :, None].expand(b, self.kv, rep, t, self.hd).reshape(b, self.h, t, self.hd)
            if self.sdpa:
                if hasattr(F, "scaled_dot_product_attention"):  # torch 2.x: public
                    a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                else:  # torch 1.13: private, returns (output, weights)
                    a = F._scaled_dot_product_attention(q, k, v, is_causal=True)[0]
            else:
                w = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(self.hd) + mask
                a = torch.matmul(F.softmax(w, dim=-1, dtype=torch.float32).to(q.dtype), v)
            x = x + self.o(a.transpose(1, 2).reshape(b, t, d))
            y = self.n2(x)
            return x + self.down(F.silu(self.gate(y)) * self.up(y))

    class Llama(nn.Module):
        def __init__(self, vocab=50, d=32, sdpa=False):
            super().__init__()
            self.embed = nn.Embedding(vocab, d)
            self.layers = nn.ModuleList([LlamaBlock(d, sdpa=sdpa) for _ in range(2)])
            self.norm, self.lm_head = RmsNorm(d), nn.Linear(d, vocab, bias=False)

        def forward(self, ids, attention_mask):
            b, t = ids.shape
            x = self.embed(ids)
            mask = torch.full((t, t), torch.finfo(x.dtype).min, device=x.device).triu(1)
            inv = 1.0 - attention_mask[:, None, None, :].to(x.dtype)
            mask = mask[None, None] + inv.masked_fill(inv.to(torch.bool), torch.finfo(x.dtype).min)
            for layer in self.layers:
                x = layer(x, mask)
            return self.lm_head(self.norm(x))

    class Bert(nn.Module):
        """BERT embeddings (word/position/token-type), extended mask, encoder layer, pooler."""

        def __init__(self, vocab=50, d=32):
            super().__init__()
            self.word = nn.Embedding(vocab, d, padding_idx=0)
            self.pos, self.tt = nn.Embedding(64, d), nn.Embedding(2, d)
            self.ln, self.drop = nn.LayerNorm(d, eps=1e-12), nn.Dropout(0.1)
            self.register_buffer("position_ids", torch.arange(64).expand((1, -1)))
            self.layer = nn.TransformerEncoderLayer(d, 4, 64, activation="gelu",
                                                    batch_first=True)
            self.pool = nn.Linear(d, d)

        def forward(self, ids, attention_mask):
            t = ids.shape[1]
            tt = torch.zeros_like(ids)
            x = self.drop(self.ln(self.word(ids) + self.pos(self.position_ids[:, :t]) +
                                  self.tt(tt)))
            x = self.layer(x, src_key_padding_mask=attention_mask.logical_not())
            return torch.tanh(self.pool(x[:, 0]))

    class Losses(nn.Module):
        """Segmentation-style NLL (nll_loss2d) and BCE, summed to one value."""

        def forward(self, scores, target):
            nll = F.nll_loss(F.log_softmax(scores, 1), target)
            bce = F.binary_cross_entropy(scores.sigmoid(), torch.ones_like(scores))
            return nll + bce

    ids = torch.randint(1, 50, (2, 12))
    am = torch.ones(2, 12, dtype=torch.long)
    am[1, 8:] = 0
    seq = torch.rand(2, 12, 32)
    cases = {
        "gpt2": (GPT2, (ids,)),
        "llama": (Llama, (ids, am)),
        "llama_sdpa": (lambda: Llama(sdpa=True), (ids, am)),
        "bert": (Bert, (ids, am)),
        "encoder_layer": (lambda: nn.TransformerEncoderLayer(32, 4, 64, batch_first=True),
                          (seq,)),
        "encoder_layer_norm_first_gelu": (lambda: nn.TransformerEncoderLayer(
            32, 4, 64, activation="gelu", batch_first=True, norm_first=True), (seq,)),
        "encoder": (lambda: nn.TransformerEncoder(nn.TransformerEncoderLayer(32, 4, 64), 2),
                    (seq.transpose(0, 1),)),
        "multihead_attention": (lambda: nn.MultiheadAttention(32, 4, batch_first=True),
                                (seq, seq, seq)),
        # Smaller pieces other models are made of.
        "embedding_bag": (lambda: nn.EmbeddingBag(50, 8, mode="mean"), (ids,)),
        "weight_norm_prelu_logsigmoid": (lambda: nn.Sequential(
            nn.utils.weight_norm(nn.Linear(32, 16)), nn.PReLU(12), nn.LogSigmoid()), (seq,)),
        "losses": (Losses, (torch.rand(2, 3, 5, 5), torch.randint(0, 3, (2, 5, 5)))),
    }
    result = {"passed": [], "failed": {}}
    for name, (make, args) in cases.items():
        for mode in ("eval", "train"):
            key = f"{name}/{mode}"
            try:
                torch.manual_seed(0)
                model = make()
                getattr(model, mode)()
                seen_cpu, handles = _record(model)
                with torch.set_grad_enabled(mode == "train"):
                    out_cpu = model(*args)
                for h in handles:
                    h.remove()
                meta = model.to("meta")
                seen_meta, handles = _record(meta)
                with torch.set_grad_enabled(mode == "train"):
                    out_meta = meta(*[a.to("meta") for a in args])
                for h in handles:
                    h.remove()
                first = lambda o: o[0] if isinstance(o, tuple) else o
                assert first(out_meta).shape == first(out_cpu).shape, \
                    (first(out_meta).shape, first(out_cpu).shape)
                bad = {k: (v, seen_meta.get(k)) for k, v in seen_cpu.items()
                       if seen_meta.get(k, [None])[0] != v[0]}
                assert not bad, bad
                result["passed"].append(key)
            except Exception as e:  # noqa: BLE001
                result["failed"][key] = f"{type(e).__name__}: {str(e)[:400]}"
    # The fused fast paths (taken on CPU/CUDA tensors in eval under no_grad; on fake tensors
    # they reach the Meta kernels): called directly.
    d, h = 32, 4
    layer = nn.TransformerEncoderLayer(d, h, 64, batch_first=True).eval()
    mha = layer.self_attn
    p = lambda t: t.detach().to("meta")
    try:
        x = torch.empty(2, 12, d, device="meta")
        out = torch._transformer_encoder_layer_fwd(
            x, d, h, p(mha.in_proj_weight), p(mha.in_proj_bias), p(mha.out_proj.weight),
            p(mha.out_proj.bias), False, False, 1e-5, p(layer.norm1.weight), p(layer.norm1.bias),
            p(layer.norm2.weight), p(layer.norm2.bias), p(layer.linear1.weight),
            p(layer.linear1.bias), p(layer.linear2.weight), p(layer.linear2.bias), None, None)
        assert out.shape == (2, 12, d)
        attn, weights = torch._native_multi_head_attention(
            x, x, x, d, h, p(mha.in_proj_weight), p(mha.in_proj_bias), p(mha.out_proj.weight),
            p(mha.out_proj.bias), None, True, False, None)
        assert attn.shape == (2, 12, d) and weights.shape == (2, h, 12, 12)
        result["passed"].append("fused_fast_paths")
    except Exception as e:  # noqa: BLE001
        result["failed"]["fused_fast_paths"] = f"{type(e).__name__}: {str(e)[:400]}"
    print(json.dumps(result))


def _check_blocks(env):
    r = last_json(run_python(None, env=env, args=["--blocks"]))
    print(f"\ntransformer blocks on meta: {len(r['passed'])} passed out of "
          f"{len(r['passed']) + len(r['failed'])}")
    for k, why in r["failed"].items():
        print(f"  {k}: {why}")
    assert not r["failed"], r["failed"]


def test_transformer_blocks_with_our_kernels_only():
    _check_blocks(WITHOUT_PY_META)


def test_transformer_blocks_next_to_python_kernels():
    _check_blocks({})


if __name__ == "__main__":
    sys.path.insert(0, HERE)
    disable_python_meta_kernels()
    if "--coverage" in sys.argv:
        coverage_worker()
    elif "--blocks" in sys.argv:
        blocks_worker()
