"""metaload beside torch's own machinery (issue 10): `with torch.device(...)`,
torch.set_default_device, torch's FakeTensorMode, torch.compile, torch.func, Module.to_empty,
load_state_dict(assign=True) and Parameter subclasses with __torch_function__, in one process.

What the tests hold metaload to:
- Inside metaload.meta() every tensor is meta, whatever torch's default device (a torch.device
  context outside or inside the scope, set_default_device): metaload wins, CUDA is never
  initialised, and torch's default is as before once the scope exits. metaload.real() lifts
  metaload's forcing only: torch's default device applies again inside it.
- Inside metaload.fake(device) factories claim the mode's device, not torch's default.
- torch's FakeTensorMode and metaload's scopes: the innermost wins (torch 2.1+), and either one
  used before or after the other gives the same results as alone.
- A model meta-built by metaload materialises as torch's own meta route does (to_empty,
  load_state_dict(assign=True), metaload.load_into) and computes what the original computes,
  also compiled (torch.compile: eager and inductor backends) and under torch.func transforms.

The file runs on torch 1.13 and 2.x: what exists only on 2.x is skipped on 1.13 with the reason.
"""
import contextlib
import inspect

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import metaload
from metaload.checkpoint import save_safetensors

try:
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
except ImportError:  # pragma: no cover (1.13 and 2.x both have it)
    FakeTensor = FakeTensorMode = None

try:  # torch 2.0+
    import torch.func as tfunc

    functional_call = tfunc.functional_call
except ImportError:  # torch 1.13: the same transforms, in the separate functorch package
    import functorch as tfunc
    from torch.nn.utils.stateless import functional_call

TORCH2 = int(torch.__version__.split(".")[0]) >= 2
needs_default_device = pytest.mark.skipif(
    not hasattr(torch, "get_default_device"),
    reason="torch.device as a context manager and torch.set_default_device came in torch 2.0 "
           "(get_default_device in 2.3): torch 1.13 has no default device to interplay with")
needs_compile = pytest.mark.skipif(not hasattr(torch, "compile"),
                                   reason="torch.compile came in torch 2.0")
needs_assign = pytest.mark.skipif(
    "assign" not in inspect.signature(nn.Module.load_state_dict).parameters,
    reason="load_state_dict(assign=True) came in torch 2.1")
needs_fake_slot = pytest.mark.skipif(
    not hasattr(torch._C, "_TorchDispatchModeKey"),
    reason="torch 1.13's FakeTensorMode is a plain dispatch mode with no slot of its own (2.1+ "
           "keeps it in the FAKE slot), so metaload cannot tell it apart to nest with it; used "
           "before and after metaload's scopes it is tested on 1.13 too")
NO_GPU = not torch.cuda.is_available()


class MLP(nn.Module):
    def __init__(self, n_in=8, hidden=16, n_out=3):
        super().__init__()
        self.fc1 = nn.Linear(n_in, hidden)
        self.fc2 = nn.Linear(hidden, n_out)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


class TracingParameter(nn.Parameter):
    """A Parameter subclass with its own __torch_function__ (as quantisation and sharding
    libraries make them): it records what it sees and lets torch do the rest."""

    seen = []

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        cls.seen.append(getattr(func, "__name__", str(func)))
        return super().__torch_function__(func, types, args, kwargs or {})


class Scaled(nn.Module):
    """y = linear(x, W) * scale, both TracingParameters."""

    def __init__(self, n_in=8, n_out=4):
        super().__init__()
        self.weight = TracingParameter(torch.empty(n_out, n_in))
        self.scale = TracingParameter(torch.ones(n_out))
        nn.init.normal_(self.weight)

    def forward(self, x):
        return F.linear(x, self.weight) * self.scale


def reference(cls=MLP, seed=0):
    torch.manual_seed(seed)
    return cls()


@contextlib.contextmanager
def no_cuda_init():
    """The block must not initialise CUDA (checked when it was not initialised before)."""
    before = torch.cuda.is_initialized()
    yield
    if not before:
        assert not torch.cuda.is_initialized(), "CUDA was initialised"


@pytest.fixture
def default_device():
    """torch.set_default_device, reset to none after the test."""
    set_default = getattr(torch, "set_default_device", None)  # torch 2.0+
    yield set_default
    if set_default is not None:
        set_default(None)


@pytest.fixture
def dynamo_reset():
    """torch.compile's caches are emptied after the test (the file shares a process)."""
    yield
    torch._dynamo.reset()


def shapes_of(scan):
    return {path: (tuple(s.shape), s.dtype) if hasattr(s, "shape") else s
            for path, s in scan.items()}


# ---- metaload.meta() / real() and torch's default device --------------------------------------


@needs_default_device
def test_meta_wins_over_torch_device_contexts_outside_and_inside_and_restores_them():
    with no_cuda_init(), torch.device("cuda:1"):
        with metaload.meta():
            outer = [torch.ones(2), torch.tensor([1.0, 2.0]), torch.arange(3),
                     nn.Linear(3, 4).weight]
            with torch.device("cuda:0"):
                inner = [torch.zeros(2), torch.full((2,), 3.0), nn.Linear(2, 2).bias]
                assert torch.get_default_device() == torch.device("cuda", 0)
            with torch.device("cpu"):
                inner.append(torch.randn(2))
            assert torch.get_default_device() == torch.device("cuda", 1)
            explicit = torch.empty(2, device="cpu")
        assert torch.get_default_device() == torch.device("cuda", 1)
    assert torch.get_default_device() == torch.device("cpu")
    for t in outer + inner + [explicit]:
        assert t.is_meta, t
    assert torch.ones(1).device.type == "cpu"


@needs_default_device
def test_torch_device_meta_around_meta_and_real_inside():
    with torch.device("meta"):
        with metaload.meta():
            a = torch.ones(3)
            widths = (torch.arange(4) * 16).tolist()  # values tracked, not torch's meta values
            with metaload.real():  # metaload steps aside; torch's default device applies again
                follows_torch = torch.arange(3)
                explicit = torch.arange(3, device="cpu")
        with metaload.fake("cuda"):  # fake's device wins over torch's default
            f = torch.zeros(2)
        after = torch.ones(2)
    assert a.is_meta and after.is_meta and follows_torch.is_meta
    assert metaload.is_fake(f) and f.device == torch.device("cuda", 0)
    assert widths == [0, 16, 32, 48]
    assert not explicit.is_meta and explicit.tolist() == [0, 1, 2]


@needs_default_device
def test_set_default_device_cuda_initialises_no_cuda_under_meta_and_fake(default_device):
    default_device("cuda:0")
    with no_cuda_init():
        with metaload.meta():
            model = MLP()
            made = [torch.randn(2, 3), torch.empty(2), torch.asarray([1.0]), torch.eye(2),
                    torch.tensor([[1, 2]])]
            steps = (torch.arange(5) * 3).tolist()
            first = torch.linspace(0, 1, 3)[1].item()
            moved = torch.ones(2).cuda()
        with metaload.fake("cuda"):
            y = model(torch.randn(4, 8))
            z = torch.asarray([1.0, 2.0])
            table = torch.fft.rfftfreq(8)
        with metaload.fake("cpu"):
            w = torch.zeros(3)
        assert torch.get_default_device() == torch.device("cuda", 0)
    assert all(p.is_meta for p in model.parameters())
    assert all(t.is_meta for t in made) and moved.is_meta
    assert steps == [0, 3, 6, 9, 12] and first == 0.5
    assert y.shape == (4, 3) and y.device == torch.device("cuda", 0) and metaload.is_fake(y)
    assert z.device == torch.device("cuda", 0) and metaload.is_fake(z)
    assert table.shape == (5,) and table.device == torch.device("cuda", 0)
    assert w.device == torch.device("cpu") and metaload.is_fake(w)  # the mode's device wins


@needs_default_device
def test_set_default_device_inside_meta_holds_after_the_scope(default_device):
    with no_cuda_init():
        with metaload.meta():
            default_device("cuda:1")
            t = torch.ones(2)
        assert torch.get_default_device() == torch.device("cuda", 1)  # torch's call, kept
        default_device("meta")
        assert torch.ones(2).is_meta
    assert t.is_meta


def test_value_tracking_builds_a_regnet_whose_widths_need_values(default_device):
    torchvision = pytest.importorskip("torchvision")
    real = torchvision.models.regnet_y_400mf()
    if default_device is not None:
        default_device("cuda:0")  # 2.x: under a cuda default, which must stay untouched
    with no_cuda_init(), metaload.meta():
        model = torchvision.models.regnet_y_400mf()
    assert [(n, p.shape) for n, p in model.named_parameters()] == \
        [(n, p.shape) for n, p in real.named_parameters()]
    assert all(p.is_meta for p in model.parameters())


# ---- torch's FakeTensorMode ----------------------------------------------------------------


def ftm_forward():
    with FakeTensorMode():
        y = reference()(torch.randn(4, 8))
    return type(y), tuple(y.shape), y.device


def test_fake_tensor_mode_before_and_after_metaload_scopes_gives_the_same():
    before = ftm_forward()
    with metaload.meta():
        model = MLP()
    with metaload.fake("cuda"):
        y = model(torch.randn(4, 8))
    after = ftm_forward()
    assert before == after == (FakeTensor, (4, 3), torch.device("cpu"))
    assert not isinstance(y, FakeTensor) and metaload.is_fake(y)
    assert y.device == torch.device("cuda", 0) and y.shape == (4, 3)
    real = reference()
    x = torch.randn(4, 8)
    weight = real.fc1.weight.detach()
    with FakeTensorMode() as mode:  # and torch's conversion of real tensors still works
        fy = F.linear(mode.from_tensor(x), mode.from_tensor(weight))
    assert isinstance(fy, FakeTensor) and fy.shape == real.fc1(x).shape


@needs_fake_slot
@pytest.mark.parametrize("scope", ["meta", "fake_cuda"])
def test_fake_tensor_mode_entered_inside_a_metaload_scope_wins(scope):
    enter = metaload.meta() if scope == "meta" else metaload.fake("cuda")
    with enter:
        a = torch.ones(2)
        with FakeTensorMode():
            model = MLP()
            y = model(torch.randn(4, 8))
            t = torch.arange(3) * 2
        b = torch.ones(2)
    for made in (y, t, model.fc1.weight):
        assert isinstance(made, FakeTensor) and made.device == torch.device("cpu")
    assert y.shape == (4, 3) and t.shape == (3,)
    for outside in (a, b):  # metaload's scope holds before and after torch's
        assert not isinstance(outside, FakeTensor)
        assert outside.is_meta if scope == "meta" else \
            (metaload.is_fake(outside) and outside.device == torch.device("cuda", 0))


class _UsesTorchsFakeMode(nn.Module):
    """A forward that enters torch's FakeTensorMode for a side computation."""

    def __init__(self, data):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.data = data  # also read a FakeTensor's .data
        self.seen = []

    def forward(self, x):
        with FakeTensorMode():
            side = nn.Linear(8, 2)(torch.randn(3, 8))
            self.seen.append((type(side), type(side.detach())))
            if self.data:
                self.seen.append(type(nn.Linear(2, 2).weight.data))
        return self.fc(x)


@needs_fake_slot
@pytest.mark.parametrize("data", [False, True])
def test_a_cpu_scan_of_a_forward_entering_fake_tensor_mode_lets_that_mode_win(data, monkeypatch):
    """A cpu scan's first pass runs without fake()'s Python mode (_scan.py): the C++ mode sends the
    calls made under torch's FakeTensorMode on to it, but torch also calls into that mode past the
    dispatcher (a FakeTensor's `.data`), which only the Python mode's guard covers: the C++ mode
    counts what it sent on, and the scan runs again under the full mode. Torch's mode gets every
    call made under it, and the scan is exact."""
    from metaload import _scan

    with metaload.meta():
        model = _UsesTorchsFakeMode(data)
    passes = []
    original = _scan._forward
    monkeypatch.setattr(_scan, "_forward",
                        lambda *a, **k: passes.append(k["function_mode"]) or original(*a, **k))
    s = metaload.scan(model, torch.empty(4, 8, device="meta"))
    assert s[""][2:5] == ((4, 8), torch.float32, torch.device("cpu"))
    assert s["fc"].calls == 1
    assert model.seen[-1] == FakeTensor if data else model.seen[-1] == (FakeTensor, FakeTensor)
    assert passes == [False, True]


@needs_fake_slot
def test_metaload_scopes_entered_inside_fake_tensor_mode_win_and_hand_it_back():
    with FakeTensorMode() as mode:
        a = torch.ones(2)
        with metaload.meta():
            model = MLP()
            m = model(torch.randn(4, 8))
            assert torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE) is None
        with metaload.fake("cuda:1"):
            f = model(torch.randn(4, 8))
        b = torch.ones(2)
        assert torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE) is mode
    assert isinstance(a, FakeTensor) and isinstance(b, FakeTensor)
    assert not isinstance(m, FakeTensor) and m.is_meta and m.shape == (4, 3)
    assert all(p.is_meta and not isinstance(p, FakeTensor) for p in model.parameters())
    assert metaload.is_fake(f) and f.device == torch.device("cuda", 1) and f.shape == (4, 3)


# ---- torch.compile -------------------------------------------------------------------------


@needs_assign
@needs_compile
@pytest.mark.parametrize("backend", ["eager", "inductor"])
def test_compile_a_meta_built_model_after_metaload_scopes(backend, dynamo_reset):
    real = reference()
    x = torch.randn(5, 8)
    expected = real(x)
    with metaload.meta():
        model = MLP()
    scanned = metaload.scan(model, torch.empty(5, 8, device="meta"), device="cuda")
    assert shapes_of(scanned)[""] == ((5, 3), torch.float32)
    model.to_empty(device="cpu")
    model.load_state_dict(real.state_dict(), assign=True)
    compiled = torch.compile(model, backend=backend)
    assert torch.allclose(compiled(x), expected, atol=1e-6)
    with metaload.meta():  # metaload after dynamo: unchanged, and the compiled model too
        assert torch.zeros(2).is_meta
    with metaload.fake("cpu"):  # the real model, run on fake inputs
        assert metaload.is_fake(model(torch.randn(2, 8)))
    assert torch.allclose(compiled(x), expected, atol=1e-6)


@pytest.mark.skipif(getattr(getattr(torch, "compiler", None), "set_stance", None) is None,
                    reason="torch.compiler.set_stance came in torch 2.6")
def test_a_compiled_model_scans_inside_metaload_scopes_with_the_force_eager_stance(
        dynamo_reset):
    # Called inside a metaload scope, dynamo would trace metaload's meta and fake tensors with
    # its own FakeTensorMode and guards; torch's force_eager stance runs the module's Python.
    with metaload.meta():
        model = MLP()
    compiled = torch.compile(model, backend="eager")
    with torch.compiler.set_stance("force_eager"):
        scanned = shapes_of(metaload.scan(compiled, torch.empty(4, 8, device="meta"),
                                          device="cuda"))
        with metaload.meta():
            y = compiled(torch.randn(4, 8))
    plain = shapes_of(metaload.scan(model, torch.empty(4, 8, device="meta"), device="cuda"))
    assert {path.replace("_orig_mod", "").lstrip("."): s for path, s in scanned.items()} == plain
    assert y.is_meta and y.shape == (4, 3)


# ---- torch.func ------------------------------------------------------------------------------


def test_func_transforms_inside_fake_cuda_give_fake_results():
    with metaload.meta():
        model = MLP()
    with metaload.fake("cuda"):
        xs = torch.randn(5, 4, 8)
        batched = tfunc.vmap(model)(xs)
        params = {k: torch.zeros_like(v) for k, v in model.named_parameters()}
        called = functional_call(model, params, (xs[0],))
        out, tangent = tfunc.jvp(torch.sin, (xs,), (torch.ones(5, 4, 8),))
    assert batched.shape == (5, 4, 3) and called.shape == (4, 3) and tangent.shape == (5, 4, 8)
    for t in (batched, called, out, tangent):
        assert metaload.is_fake(t) and t.device == torch.device("cuda", 0)


@pytest.mark.parametrize("scope", ["meta", "fake_cpu"])
def test_func_grad_inside_meta_and_fake_cpu_gives_gradient_shapes(scope):
    enter = metaload.meta() if scope == "meta" else metaload.fake("cpu")
    with enter:
        model = MLP()
        x = torch.randn(4, 8)
        grads = tfunc.grad(lambda p: functional_call(model, p, (x,)).sum())(
            dict(model.named_parameters()))
    for name, p in model.named_parameters():
        assert grads[name].shape == p.shape
        assert grads[name].is_meta if scope == "meta" else metaload.is_fake(grads[name])


@pytest.mark.xfail(NO_GPU, strict=True, reason=(
    "backward through fake cuda tensors without a GPU: torch 1.13's autograd.backward makes "
    "ones_like of a cuda-claiming tensor in Python (CUDA init), torch 2.x's engine asks the CUDA "
    "driver for a primary context (hasPrimaryContext) -- both below metaload's Python layer"))
def test_func_grad_inside_fake_cuda_without_a_gpu():
    with metaload.fake("cuda"):
        model = MLP()
        grads = tfunc.grad(lambda p: functional_call(model, p, (torch.randn(4, 8),)).sum())(
            dict(model.named_parameters()))
    assert grads["fc1.weight"].device == torch.device("cuda", 0)


def test_func_transforms_after_metaload_scopes_compute_real_values():
    with metaload.meta():
        MLP()
    with metaload.fake("cuda"):
        tfunc.vmap(torch.sin)(torch.randn(3, 2))
    model = reference()
    xs = torch.randn(5, 4, 8)
    assert torch.allclose(tfunc.vmap(model)(xs), model(xs), atol=1e-6)
    grads = tfunc.grad(lambda p: functional_call(model, p, (xs[0],)).sum())(
        dict(model.named_parameters()))
    assert torch.allclose(grads["fc2.bias"], torch.full((3,), 4.0))


# ---- materialising: to_empty, load_state_dict(assign=True), load_into ------------------------


def test_to_empty_then_load_state_dict_gives_the_original_outputs():
    real = reference()
    x = torch.randn(4, 8)
    with metaload.meta():
        model = MLP()
        model.to_empty(device="cuda")  # inside the scope: still meta, no CUDA
        assert all(p.is_meta for p in model.parameters())
    model.to_empty(device="cpu")
    assert all(p.device.type == "cpu" for p in model.parameters())
    model.load_state_dict(real.state_dict())
    assert torch.equal(model(x), real(x))


@needs_assign
def test_load_state_dict_assign_into_meta_built_model_as_torch_device_meta_does():
    real = reference()
    x = torch.randn(4, 8)
    with metaload.meta():
        ours = MLP()
    with torch.device("meta"):
        torchs = MLP()
    for model in (ours, torchs):
        model.load_state_dict(real.state_dict(), assign=True)
    assert torch.equal(ours(x), real(x)) and torch.equal(torchs(x), real(x))
    for (name, p), q in zip(ours.named_parameters(), torchs.parameters()):
        assert type(p) is type(q) is nn.Parameter and p.requires_grad == q.requires_grad, name
        assert p.data_ptr() == real.state_dict()[name].data_ptr()  # assigned, not copied


@needs_assign
def test_to_empty_and_assign_with_parameter_subclasses_match_torchs_meta_route():
    real = reference(Scaled)
    x = torch.randn(3, 8)
    with metaload.meta():
        ours = Scaled()
    with torch.device("meta"):
        torchs = Scaled()
    for model in (ours, torchs):
        model.to_empty(device="cpu")
        model.load_state_dict(real.state_dict(), assign=True)
        assert torch.equal(model(x), real(x))
    assert [type(p) for p in ours.parameters()] == [type(p) for p in torchs.parameters()]


def test_load_into_keeps_parameter_subclass_objects(tmp_path):
    real = reference(Scaled)
    path = str(tmp_path / "scaled.safetensors")
    save_safetensors(path, real)
    with metaload.meta():
        model = Scaled()
    before = {name: (id(p), type(p)) for name, p in model.named_parameters()}
    metaload.load_into(model, path, progress=False)
    x = torch.randn(3, 8)
    assert {name: (id(p), type(p)) for name, p in model.named_parameters()} == before
    assert all(type(p) is TracingParameter and not p.is_meta for p in model.parameters())
    assert torch.equal(model(x), real(x))


@needs_default_device
def test_load_into_a_module_built_under_torch_device_meta_and_a_cuda_default(tmp_path,
                                                                          default_device):
    real = reference()
    path = str(tmp_path / "mlp.safetensors")
    save_safetensors(path, real)
    with torch.device("meta"):
        model = MLP()
    weight = model.fc1.weight
    default_device("cuda:0")  # torch's default is no target for load_into: cpu is
    with no_cuda_init():
        metaload.load_into(model, path, progress=False)
    default_device(None)
    with torch.device("meta"):  # nor is a meta default (a second load: all or nothing, again)
        metaload.load_into(model, path, progress=False)
    x = torch.randn(4, 8)
    assert model.fc1.weight is weight and weight.device == torch.device("cpu")
    assert torch.equal(model(x), real(x))


# ---- metaload.scan / fake() under torch's default device ------------------------------------


@needs_default_device
def test_scan_is_the_same_under_torch_device_contexts(default_device):
    with torch.device("meta"):
        model = MLP()  # torch's own meta route
    with metaload.meta():
        ours = MLP()
    expected = (tuple(reference()(torch.randn(4, 8)).shape), torch.float32)
    plain = shapes_of(metaload.scan(model, torch.empty(4, 8, device="meta"), device="cuda"))
    with torch.device("meta"):
        in_meta = shapes_of(metaload.scan(ours, torch.randn(4, 8), device="cuda"))
    default_device("cuda:0")
    with no_cuda_init():
        in_cuda = shapes_of(metaload.scan(model, torch.empty(4, 8, device="meta"),
                                          device="cuda"))
    assert plain == in_meta == in_cuda
    assert plain[""] == expected
    assert plain["fc1"] == ((4, 16), torch.float32)


# ---- Parameter subclasses with __torch_function__ ---------------------------------------------


def test_parameter_subclass_built_and_run_under_meta_and_fake():
    TracingParameter.seen.clear()
    with no_cuda_init(), metaload.meta():
        model = Scaled()
        y = model(torch.randn(3, 8))
        moved = model.weight.cuda()
        with pytest.raises(metaload.DataDependentError):
            model.scale.tolist()  # a weight has no values, subclass or not
    assert type(model.weight) is TracingParameter and model.weight.is_meta
    assert model.weight.requires_grad and y.is_meta and y.shape == (3, 4) and moved.is_meta
    assert "linear" in TracingParameter.seen  # its __torch_function__ ran under the mode
    TracingParameter.seen.clear()
    with no_cuda_init(), metaload.fake("cuda"):
        f = model(torch.randn(3, 8))
    assert metaload.is_fake(f) and f.device == torch.device("cuda", 0) and f.shape == (3, 4)
    assert "linear" in TracingParameter.seen
