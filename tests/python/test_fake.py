"""metaload.fake(device) and metaload.scan() from Python."""
import pytest
import torch
import torchvision

import metaload
from conftest import (CUDA_INIT_COUNTER, assert_cuda_initialised_by_real_requests_only,
                      run_python)


def test_factories_claim_the_mode_device_without_a_gpu():
    with metaload.fake("cuda"):
        a = torch.randn(4, 8)
        b = torch.zeros(3, device="cpu", dtype=torch.long)
        c = torch.ones(2, device="cuda:1")
        d = torch.arange(10)
        e = torch.tensor([1.0, 2.0])
        w = torch.nn.Linear(8, 16)
        # An explicit cpu device wins over the mode's, also for tensors made from data.
        explicit = [torch.tensor([0, 2], device="cpu"), torch.tensor(2.0, device="cpu"),
                    torch.as_tensor([1.0], device="cpu"),
                    torch.tensor([1.0], device=torch.device("cpu")),
                    torch.scalar_tensor(1.0, device="cpu")]
    assert metaload.is_fake(a) and a.device == torch.device("cuda", 0) and a.is_cuda
    assert not a.is_meta
    assert b.device.type == "cpu" and b.dtype == torch.long
    assert c.device == torch.device("cuda", 1)
    assert d.device == torch.device("cuda", 0) and d.shape == (10,)
    assert e.device == torch.device("cuda", 0)
    assert w.weight.device == torch.device("cuda", 0) and w.weight.requires_grad
    for t in explicit:
        assert metaload.is_fake(t) and t.device == torch.device("cpu"), t.device


def test_results_have_shapes_dtypes_strides_and_autograd_history():
    with metaload.fake("cuda"):
        x = torch.randn(8, 16, requires_grad=True)
        y = torch.nn.functional.gelu(x @ torch.randn(16, 32)).sum(1, keepdim=True)
        h = x.to(torch.float16)
        t = x.t()
    assert x.is_leaf and x.requires_grad
    assert y.shape == (8, 1) and y.requires_grad and y.grad_fn is not None
    assert h.dtype == torch.float16
    assert t.stride() == (1, 16) and t._base is x


def test_moves_between_devices_are_fake_moves():
    with metaload.fake("cuda"):
        a = torch.randn(2, 3)
        cpu = a.cpu()
        back = cpu.cuda()
        other = cpu.to("cuda:1", torch.half)
        leaf = torch.zeros(2, device="cuda:1", requires_grad=True)
    assert cpu.device.type == "cpu" and back.device == torch.device("cuda", 0)
    assert other.device == torch.device("cuda", 1) and other.dtype == torch.half
    assert leaf.is_leaf and leaf.requires_grad and leaf.device == torch.device("cuda", 1)


def test_mixing_devices_is_the_error_a_real_run_raises():
    with metaload.fake("cuda"):
        gpu = torch.ones(3)
        with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
            gpu + torch.ones(3, device="cpu")
        with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
            torch.ones(3, device="cpu") + gpu
        # Zero-dim cpu tensors mix freely; check that the operands really claim cpu first.
        scalars = [torch.zeros((), device="cpu"), torch.tensor(2.0, device="cpu")]
        assert [s.device.type for s in scalars] == ["cpu", "cpu"]
        scaled = [gpu * s for s in scalars]
    assert [s.device for s in scaled] == [torch.device("cuda", 0)] * 2


def test_cross_device_copy_and_cpu_indices_are_allowed_as_in_a_real_run():
    with metaload.fake("cuda"):
        gpu = torch.zeros(4, 3)
        cpu = torch.ones(4, 3, device="cpu")
        idx = torch.tensor([0, 2], device="cpu")
        assert cpu.device.type == "cpu" and idx.device.type == "cpu"
        copied = gpu.clone().copy_(cpu)
        gpu[0] = cpu[1]
        gpu[idx] = 1.0
        gpu[idx] = torch.ones(3)
        picked = gpu[idx]
        put = gpu.clone().index_put_((idx,), torch.ones(2, 3))
        with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
            gpu.index_select(0, idx)  # a real run rejects this one
        with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
            gpu.index_put_((idx,), torch.ones(2, 3, device="cpu"))
    assert copied.device == gpu.device == torch.device("cuda", 0)
    assert picked.device == torch.device("cuda", 0) and picked.shape == (2, 3)
    assert put.device == torch.device("cuda", 0) and put.shape == (4, 3)


@pytest.mark.parametrize("read", [
    lambda t: t.nonzero(),
    lambda t: t.masked_select(t > 0),
    lambda t: torch.unique(t),
    lambda t: t.sum().item(),
    lambda t: t.tolist(),
    lambda t: t.data_ptr(),
    lambda t: t.repeat_interleave(torch.ones(5, dtype=torch.long)),
    lambda t: torch.repeat_interleave(torch.ones(5, dtype=torch.long)),
    lambda t: torch.bincount(t.long()),
    lambda t: torch.unique_consecutive(t),
    lambda t: torch.unique(t.reshape(5, 1), dim=0),
    lambda t: repr(t),
])
def test_reading_values_is_a_typed_error(read):
    with metaload.fake("cuda"):
        t = torch.randn(5)
        with pytest.raises(metaload.DataDependentError):
            read(t)


def test_reads_of_real_tensors_inside_fake_read_them_and_fake_ones_stay_typed():
    # A real run on cuda reads a cpu tensor's value (narrow's start, tensor_split's sections):
    # inside fake() the same read of a real tensor gives the value; of a fake one, the typed error.
    start, sections = torch.tensor(2), torch.tensor(3)
    with metaload.fake("cuda"):
        x = torch.randn(4, 6)
        n = torch.narrow(x, 1, start, 3)
        parts = torch.tensor_split(x, sections, dim=1)
        assert start.item() == 2 and sections.tolist() == 3
        fake_start = torch.tensor(2)
        assert metaload.is_fake(fake_start)
        with pytest.raises(metaload.DataDependentError):
            torch.narrow(x, 1, fake_start, 3)
        with pytest.raises(metaload.DataDependentError):  # returns a tensor: stays typed
            torch.nonzero(start)
    assert n.shape == (4, 3) and n.device == torch.device("cuda", 0) and metaload.is_fake(n)
    assert [p.shape for p in parts] == [(4, 2), (4, 2), (4, 2)]
    assert all(p.device == torch.device("cuda", 0) for p in parts)


def test_repeat_interleave_without_output_size_is_a_typed_error_on_meta_too():
    with metaload.meta():
        t = torch.empty(4, 2)
        repeats = torch.empty(4, dtype=torch.long)
        assert t.is_meta and repeats.is_meta
        assert t.repeat_interleave(repeats, dim=0, output_size=9).shape == (9, 2)
    # Inside meta() torch's binding raises it as RuntimeError; the `with` makes it typed.
    with pytest.raises(metaload.DataDependentError, match="repeat_interleave"):
        with metaload.meta():
            torch.empty(4, 2).repeat_interleave(torch.empty(4, dtype=torch.long), dim=0)


def test_repeat_interleave_with_int_repeats_has_its_shape():
    with metaload.fake("cuda"):
        x = torch.randn(2, 3, 4, requires_grad=True)
        flat = x.repeat_interleave(2)
        along = x.repeat_interleave(3, dim=1)
        last = torch.repeat_interleave(x, 3, dim=-1, output_size=12)
    assert flat.shape == (48,) and flat.device == torch.device("cuda", 0) and flat.requires_grad
    assert along.shape == (2, 9, 4) and along.stride() == (36, 4, 1)
    assert last.shape == (2, 3, 12)
    with metaload.meta():
        m = torch.empty(2, 3).repeat_interleave(2, dim=0)
    assert m.is_meta and m.shape == (4, 3)
    real = torch.arange(3).repeat_interleave(2)  # real tensors keep libtorch's kernel
    assert real.tolist() == [0, 0, 1, 1, 2, 2]


def test_real_tensors_enter_as_fake_and_are_untouched():
    real = torch.arange(6.0)
    # The mode claims cuda: real cpu tensors must come out on cpu, their own device.
    with metaload.fake("cuda"):
        y = real * 2
        d = real.detach()
        v = real.view(2, 3)
        made = torch.tensor([1.0, 2.0], device="cpu")
        real.add_(1)  # computed on a stand-in
    for t in (y, d, v, made):
        assert metaload.is_fake(t) and t.device.type == "cpu", t.device
    assert real.sum().item() == 15.0 and not metaload.is_fake(real)


def test_scan_of_a_meta_built_model_gives_every_module_output():
    with metaload.meta():
        model = torchvision.models.resnet18()
    shapes = metaload.scan(model, torch.empty(2, 3, 224, 224, device="meta"), device="cuda")
    assert shapes[""][2:5] == ((2, 1000), torch.float32, torch.device("cuda", 0))
    assert shapes["layer4"].shape == (2, 512, 7, 7) and shapes["layer4"].cls == "Sequential"
    assert shapes["layer1.0.conv1"].shape == (2, 64, 56, 56)
    assert shapes["layer1.0.conv1"].bytes == 2 * 64 * 56 * 56 * 4
    assert len(shapes) == len(list(model.named_modules()))
    assert all(p.is_meta for p in model.parameters())  # scanning never loads or allocates


def test_scan_matches_a_real_forward_on_a_small_model():
    torch.manual_seed(0)
    model = torchvision.models.squeezenet1_1().eval()
    x = torch.randn(1, 3, 64, 64)
    real = {}
    hooks = [m.register_forward_hook(lambda m, i, o, p=p: real.__setitem__(p, tuple(o.shape)))
             for p, m in model.named_modules()]
    with torch.no_grad():
        model(x)
    for h in hooks:
        h.remove()
    shapes = metaload.scan(model, x, device="cpu")
    assert {p: m.shape for p, m in shapes.items()} == real


def _count_python_mode_calls(monkeypatch):
    """How often fake()'s Python TorchFunctionMode is asked from now on: calls[0]."""
    from metaload import _fake

    calls = [0]
    original = _fake._FakeFunctionMode.__torch_function__

    def counted(self, func, types, args=(), kwargs=None):
        calls[0] += 1
        return original(self, func, types, args, kwargs)

    monkeypatch.setattr(_fake._FakeFunctionMode, "__torch_function__", counted)
    return calls


def test_a_cpu_scan_runs_without_the_python_mode_and_gives_what_the_full_mode_gives(monkeypatch):
    """A cpu scan first runs with the C++ mode alone (no Python call per torch call); where
    nothing needs the Python mode, its result is the full mode's, module for module. Under another
    TorchFunctionMode (as torch.device's context on 2.x), the full mode runs from the start."""
    from torch.overrides import TorchFunctionMode
    from metaload import _scan

    calls = _count_python_mode_calls(monkeypatch)
    with metaload.meta():
        model = torchvision.models.squeezenet1_1()
    x = torch.empty(2, 3, 64, 64, device="meta")
    lean = metaload.scan(model, x)
    assert calls[0] == 0
    with monkeypatch.context() as m:
        m.setattr(_scan, "_lean_pass_fits", lambda device: False)
        full = metaload.scan(model, x)
    assert calls[0] > 20
    assert list(lean.items()) == list(full.items()) and len(lean) == len(list(model.modules()))
    calls[0] = 0
    class Passing(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    with Passing():
        assert list(metaload.scan(model, x).items()) == list(full.items())
    assert calls[0] > 20


class _OneHotRouter(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.gate = torch.nn.Linear(8, 4)

    def forward(self, x):
        picked = self.gate(x).topk(2, dim=-1).indices
        return torch.nn.functional.one_hot(picked, num_classes=4).sum(-2)


def test_a_cpu_scan_that_needs_the_python_mode_runs_again_under_it(monkeypatch):
    """F.one_hot is decomposed above the C++ mode and reads min() of its input: the pass without
    the Python mode fails there, and the scan starts over under the full mode, whose shape rule
    gives the real shape. Each module is recorded once, from the second pass."""
    calls = _count_python_mode_calls(monkeypatch)
    with metaload.meta():
        model = torch.nn.Sequential(torch.nn.Linear(8, 8), _OneHotRouter())
    real = torch.nn.Sequential(torch.nn.Linear(8, 8), _OneHotRouter())(torch.randn(5, 8))
    s = metaload.scan(model, torch.empty(5, 8, device="meta"))
    assert calls[0] > 0
    assert s[""][2:6] == (tuple(real.shape), real.dtype, torch.device("cpu"), 1)
    assert s["0"].calls == 1 and s["1.gate"].shape == (5, 4) and not s.data_dependent


def test_the_first_metaload_scope_of_any_kind_registers_fakes_dispatch_key():
    """Registering fake()'s fallback rewrites every operator's dispatch table (a few ms): the first
    scope of any kind does it, so that a scan's first forward does not."""
    r = run_python(
        "import torch, metaload\n"
        "def fake_entry():\n"
        "    table = torch._C._dispatch_dump_table('aten::add.Tensor').splitlines()\n"
        "    return [line for line in table if line.startswith('Fake:')]\n"
        "print(fake_entry())\n"
        "with metaload.meta():\n"
        "    pass\n"
        "print(fake_entry())\n")
    assert r.returncode == 0, r.stderr
    before, after = r.stdout.splitlines()[-2:]
    assert "metaload" not in before and "metaload fake tensor fallback" in after, r.stdout


RSS_PROBE = """
import gc, torch, torchvision, metaload
def peak():
    # VmHWM: the peak resident size since the last reset, so memory that the scan allocates and
    # frees again still counts.
    with open('/proc/self/status') as f:
        return next(int(l.split()[1]) * 1024 for l in f if l.startswith('VmHWM:'))
def reset_peak():
    with open('/proc/self/clear_refs', 'w') as f:
        f.write('5')
with metaload.meta():
    model = torchvision.models.vit_b_16()
x = torch.empty(64, 3, 224, 224, device='meta')
metaload.scan(model, x[:1], device='cuda')  # warm up code paths
gc.collect()
reset_peak()
before = peak()
shapes = metaload.scan(model, x, device='cuda')
after = peak()
assert shapes[''].shape == (64, 1000), shapes['']
# The probe itself: a freed 37 MB tensor must show in the peak, or the number above means nothing.
reset_peak()
base = peak()
del_me = torch.ones(64, 197, 768)
del del_me
print(peak() - base)
print(after - before)
"""


def test_scanning_vit_b_16_at_batch_64_grows_peak_rss_by_less_than_16_mb():
    r = run_python(RSS_PROBE)
    assert r.returncode == 0, r.stderr
    probe, growth = (int(v) for v in r.stdout.strip().splitlines()[-2:])
    print(f"scan of vit_b_16 at batch 64: peak RSS +{growth / 2**20:.2f} MiB")
    assert probe > 30 * 2**20, "the peak RSS probe does not see a freed 37 MB tensor"
    assert growth < 16 * 2**20


def test_calls_whose_python_bindings_would_initialise_cuda_stay_fake():
    # torch's bindings initialise CUDA before dispatching when they make a tensor on a cuda
    # device: list indices (both torches), *_like (1.13) and 1.13's Tensor.__rpow__.
    with metaload.fake("cuda"):
        x = torch.randn(5, 4, 3)
        got = {
            "list": x[[1, 2]], "tuple with lists": x[[0, 1], [1, 2]],
            "slice and list": x[:, [0, 3]],
            "zeros_like": torch.zeros_like(x), "full_like": torch.full_like(x, 2.0),
            "randint_like": torch.randint_like(x, 5), "rpow": 2 ** x, "rpow float": 2.5 ** x.long(),
            "rpow tensor": x.__rpow__(torch.ones(4, 3)),
            "like leaf": torch.zeros_like(x, requires_grad=True),
        }
        y = x.clone()
        y[[0, 4]] = 1.0
    real = torch.randn(5, 4, 3)
    want = {
        "list": real[[1, 2]], "tuple with lists": real[[0, 1], [1, 2]],
        "slice and list": real[:, [0, 3]], "zeros_like": real, "full_like": real,
        "randint_like": real, "rpow": real, "rpow float": 2.5 ** real.long(), "rpow tensor": real,
        "like leaf": real,
    }
    for k, t in got.items():
        assert (t.shape, t.dtype, t.device) == (want[k].shape, want[k].dtype,
                                                torch.device("cuda", 0)), k
    assert got["like leaf"].is_leaf and got["like leaf"].requires_grad
    assert y.device == torch.device("cuda", 0)


def test_boolean_mask_indexing_is_a_typed_data_dependent_error():
    """x[x > 0] has as many rows as the mask has true values: unknowable on fake tensors. torch
    2.x's own Meta kernel raises an untyped NotImplementedError; metaload's is typed on both."""
    # torch 1.13's TorchFunctionMode does not see Tensor.__getitem__, so the package cannot turn
    # the error into its class there: the RuntimeError carries the kind as its prefix instead.
    typed = metaload.DataDependentError if hasattr(torch, "compile") else RuntimeError
    with metaload.fake("cuda"):
        t = torch.randn(5, 3)
        with pytest.raises(typed, match=r"DataDependentError|aten::index") as info:
            t[t > 0]
        assert "aten::index" in str(info.value) and "size depends on the values" in str(info.value)
        with pytest.raises(typed, match="aten::index"):
            t[torch.tensor([True, False, True, False, True])]
        picked = t[torch.tensor([0, 2])]  # integer indices: the shape is known
    assert picked.shape == (2, 3) and picked.device == torch.device("cuda", 0)


_FAKE_CUDA_INIT_PROBE = CUDA_INIT_COUNTER + r'''
import torch.nn.functional as F

with metaload.fake("cuda"):
    x = torch.randn(1, 3, 8, 8).cuda()
    # F.fractional_max_pool2d makes its samples with torch.rand(..., device=input.device) inside a
    # function the Python mode is handling, so only the dispatcher sees that call.
    y = F.fractional_max_pool2d(x, 2, output_size=(4, 4))
    with torch._C.DisableTorchFunction():
        z = torch.rand(2, 3, device="cuda")
    assert (tuple(y.shape), str(y.device), tuple(z.shape), str(z.device)) == (
        (1, 3, 4, 4), "cuda:0", (2, 3), "cuda:0"), (y.shape, y.device, z.shape, z.device)
    assert metaload.is_fake(y) and metaload.is_fake(z)
    inside = list(calls)
    during = real_requests_still_initialise()
report(inside, during)
'''


def test_fake_cuda_factories_inside_python_functions_stay_fake_without_cuda_init():
    assert_cuda_initialised_by_real_requests_only(_FAKE_CUDA_INIT_PROBE)
