"""The rules of metaload's scopes meta(), real() and fake(), on torch 1.13 and 2.x:

- the innermost open scope decides what a tensor created on the thread is (meta, real or fake on
  the fake scope's device), and leaving it gives the outer scope back its own;
- an out-of-order exit is a ModeError that leaves a consistent thread: the scopes entered inside
  the one exited close with it, every scope can still be exited (a closed one is a ModeError
  saying it is not open), and once every scope is closed tensors are real again;
- a device fake tensors cannot claim is a ModeError naming the call and its argument, raised
  before anything changes;
- a training step (forward, loss, backward, optimizer step) runs on fake cpu tensors; through
  fake cuda tensors on a machine without CUDA the backward is a ModeError saying why (autograd's
  engine asks the CUDA runtime); torch.save inside meta() writes a file torch.load reads back onto
  meta.
"""
import itertools

import pytest
import torch

import metaload
from metaload import _mode

SCOPES = {
    "meta": metaload.meta,
    "real": metaload.real,
    "fake_cpu": lambda: metaload.fake("cpu"),
    "fake_cuda": lambda: metaload.fake("cuda"),
    "fake_cuda3": lambda: metaload.fake("cuda:3"),
}
EXPECTED = {
    "meta": ("meta", None),
    "real": ("real", torch.device("cpu")),
    "fake_cpu": ("fake", torch.device("cpu")),
    "fake_cuda": ("fake", torch.device("cuda", 0)),
    "fake_cuda3": ("fake", torch.device("cuda", 3)),
    None: ("real", torch.device("cpu")),  # no scope open
}


def kind_of(t):
    if metaload.is_fake(t):
        return "fake", t.device
    if t.is_meta:
        return "meta", None
    return "real", t.device


def made_here():
    """Tensors made the ways a module constructor and its forward make them."""
    return {
        "zeros": torch.zeros(2, 3),
        "tensor": torch.tensor([1.0, 2.0]),
        "arange": torch.arange(4),
        "linear": torch.nn.Linear(3, 2).weight,
        "like": torch.empty_like(torch.empty(0)),
        "new": torch.empty(0).new_zeros(2),
    }


def assert_made_as(scope):
    expected = EXPECTED[scope]
    kinds = {name: kind_of(t) for name, t in made_here().items()}
    assert all(k == expected for k in kinds.values()), (scope, kinds)
    assert metaload.is_forcing() == (scope == "meta")


def assert_back_to_real():
    assert _mode.innermost() is None
    assert not metaload.is_forcing()
    assert_made_as(None)
    assert torch.zeros(2).add(1).tolist() == [1.0, 1.0]


# ---- innermost wins ---------------------------------------------------------------------------


@pytest.mark.parametrize("outer,inner", list(itertools.product(SCOPES, repeat=2)))
def test_the_innermost_scope_decides_and_leaving_it_restores_the_outer(outer, inner):
    with SCOPES[outer]():
        assert_made_as(outer)
        with SCOPES[inner]():
            assert_made_as(inner)
        assert_made_as(outer)
    assert_back_to_real()


@pytest.mark.parametrize("chain", [("fake_cuda", "meta", "real"), ("meta", "fake_cpu", "real"),
                                   ("real", "fake_cuda3", "meta"), ("fake_cpu", "real", "fake_cuda"),
                                   ("meta", "real", "fake_cuda", "meta")])
def test_chains_of_scopes_follow_the_innermost_at_every_depth(chain):
    def enter(depth):
        with SCOPES[chain[depth]]():
            assert_made_as(chain[depth])
            if depth + 1 < len(chain):
                enter(depth + 1)
            assert_made_as(chain[depth])

    enter(0)
    assert_back_to_real()


def test_fake_tensors_stay_fake_inside_meta_and_real_and_ops_on_them_stay_fake():
    with metaload.fake("cuda"):
        x = torch.randn(4, 3)
        layer = torch.nn.Linear(3, 2)
        with metaload.meta():
            m = torch.ones(3)
            y = layer(x)
        with metaload.real():
            r = torch.ones(3)
            z = x * 2
    assert kind_of(y) == kind_of(z) == ("fake", torch.device("cuda", 0)) and y.shape == (4, 2)
    assert m.is_meta and kind_of(r) == ("real", torch.device("cpu")) and r.sum().item() == 3.0


def test_cuda_calls_inside_meta_inside_fake_are_meta_without_cuda():
    with metaload.fake("cuda:1"):
        with metaload.meta():
            made = [torch.zeros(2, device="cuda"), torch.ones(2).cuda(), torch.ones(2).to("cuda")]
        after = torch.zeros(2, device="cuda")  # "cuda" is the current device: the mode's
    assert all(t.is_meta for t in made)
    assert kind_of(after) == ("fake", torch.device("cuda", 1))


# ---- out-of-order exits -----------------------------------------------------------------------

ORDERS = [("meta", "real"), ("meta", "meta"), ("meta", "meta", "real"), ("fake_cuda", "meta"),
          ("meta", "fake_cpu"), ("real", "fake_cuda"), ("fake_cpu", "real", "meta"),
          ("meta", "fake_cuda", "real")]


@pytest.mark.parametrize("order,exit_at", [(order, at) for order in ORDERS
                                            for at in range(len(order) - 1)])
def test_an_out_of_order_exit_closes_the_inner_scopes_and_is_a_mode_error(order, exit_at):
    scopes = [SCOPES[name]() for name in order]
    for s in scopes:
        s.__enter__()
    with pytest.raises(metaload.ModeError, match="still open: scopes exit innermost first"):
        scopes[exit_at].__exit__(None, None, None)
    # The thread is as it was before scopes[exit_at] was entered ...
    assert_made_as(order[exit_at - 1] if exit_at else None)
    # ... the scopes inside it were closed with it: their exit says so, and changes nothing ...
    for s in reversed(scopes[exit_at:]):
        with pytest.raises(metaload.ModeError, match="is not open") as e:
            s.__exit__(None, None, None)
        assert "thread None" not in str(e.value)
    assert_made_as(order[exit_at - 1] if exit_at else None)
    # ... and the ones around it still exit in order.
    for s in reversed(scopes[:exit_at]):
        s.__exit__(None, None, None)
    assert_back_to_real()


def test_a_with_block_left_with_an_inner_scope_open_unwinds_it():
    inner = metaload.real()
    with pytest.raises(metaload.ModeError, match=r"metaload.meta\(\) exited while metaload.real"):
        with metaload.meta():
            inner.__enter__()
    assert_back_to_real()
    with pytest.raises(metaload.ModeError, match="closed when metaload.meta"):
        inner.__exit__(None, None, None)
    assert_back_to_real()


def test_exiting_a_closed_or_never_entered_scope_is_a_mode_error_saying_it_is_not_open():
    for make in SCOPES.values():
        scope = make()
        with pytest.raises(metaload.ModeError, match="is not open: it was never entered"):
            scope.__exit__(None, None, None)
        with scope:
            pass
        with pytest.raises(metaload.ModeError, match="is not open") as e:
            scope.__exit__(None, None, None)
        assert "thread None" not in str(e.value)
        with scope:  # a closed scope object may be entered again
            pass
    assert_back_to_real()


def test_an_out_of_order_exit_inside_a_fake_scope_leaves_torchs_function_modes_as_found():
    before = torch._C._len_torch_function_stack()
    outer = metaload.fake("cuda")
    outer.__enter__()
    for name in ("fake_cpu", "meta", "fake_cuda3"):
        SCOPES[name]().__enter__()
    with pytest.raises(metaload.ModeError, match="were still open"):
        outer.__exit__(None, None, None)
    assert_back_to_real()
    assert torch._C._len_torch_function_stack() == before


# ---- devices fake tensors cannot claim --------------------------------------------------------

BAD_DEVICES = ["xla", "cpu:99", "cpu:1", "meta", "mps", "cuda:16", "cuda:127", "gpu", "", "cuda:x",
               None, 1.5, torch.device("xla", 0), "privateuseone"]


def _no_hooks(model):
    return all(not m._forward_hooks for m in model.modules())


@pytest.mark.parametrize("device", BAD_DEVICES, ids=repr)
def test_a_device_fake_tensors_cannot_claim_is_a_mode_error_before_anything_changes(device):
    with pytest.raises(metaload.ModeError, match=r"metaload.fake\(device=.*(cannot claim|not a "
                                                 r"device).*a fake device is cpu"):
        metaload.fake(device)
    model = torch.nn.Sequential(torch.nn.Linear(3, 2))
    with pytest.raises(metaload.ModeError, match=r"metaload.scan\(device="):
        metaload.scan(model, torch.empty(1, 3, device="meta"), device=device)
    assert _no_hooks(model)
    assert_back_to_real()


@pytest.mark.parametrize("device", ["xla", "cpu:5", "cuda:16", "nonsense"])
def test_the_c_plus_plus_fake_scope_refuses_the_same_devices_typed(device):
    with pytest.raises(metaload.ModeError, match="enter_fake: the device"):
        try:
            metaload._lib.load().enter_fake(device)
        except RuntimeError as e:
            raise metaload._lib.translate(e) or e from None
    assert_back_to_real()


@pytest.mark.parametrize("device,claimed", [("cpu:0", "cpu"), (torch.device("cpu", 0), "cpu"),
                                            ("cuda", "cuda:0"), ("cuda:15", "cuda:15"),
                                            (0, "cuda:0")])
def test_devices_fake_tensors_can_claim(device, claimed):
    with metaload.fake(device) as d:
        t = torch.zeros(2)
    assert d == torch.device(claimed) and t.device == torch.device(claimed)
    with metaload.meta():
        model = torch.nn.Linear(3, 2)
    s = metaload.scan(model, torch.empty(1, 3, device="meta"), device=device)
    assert s[""].device == torch.device(claimed)


# ---- a training step on fake tensors -----------------------------------------------------------


def _training_step(device, optimizer_class):
    with metaload.fake(device):
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
        opt = optimizer_class(model.parameters(), lr=0.1)
        x, target = torch.randn(4, 8), torch.randint(0, 3, (4,))
        loss = torch.nn.functional.cross_entropy(model(x), target)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=False)
        grads = [p.grad for p in model.parameters()]
        model(x).sum().backward()  # a second backward accumulates into the same tensors
    assert loss.shape == () and metaload.is_fake(loss), loss
    for p, g in zip(model.parameters(), grads):
        assert metaload.is_fake(p.grad) and p.grad.shape == p.shape, (p.shape, p.grad)
        assert p.grad.device == p.device == torch.device(device), (p.device, p.grad.device)
        assert g is p.grad


OPTIMIZERS = {"sgd": torch.optim.SGD,
              "momentum": lambda params, lr: torch.optim.SGD(params, lr=lr, momentum=0.9)}


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_a_training_step_under_fake_cpu_gives_every_parameter_a_fake_gradient(optimizer):
    w = torch.ones(2, requires_grad=True)  # a real backward before and after
    (w * 3).sum().backward()
    _training_step("cpu", OPTIMIZERS[optimizer])
    (w * 3).sum().backward()
    assert w.grad.tolist() == [6.0, 6.0]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without CUDA")
@pytest.mark.parametrize("device", ["cuda", "cuda:3"])
@pytest.mark.parametrize("how", ["Tensor.backward", "autograd.backward", "autograd.grad"])
def test_a_backward_through_fake_cuda_tensors_without_cuda_is_a_mode_error_at_backward(device, how):
    with metaload.fake(device):
        layer = torch.nn.Linear(4, 2)
        loss = layer(torch.randn(3, 4)).sum()
        with pytest.raises(metaload.ModeError, match=r"autograd's engine asks the CUDA runtime.*"
                                                     r"metaload.fake\('cpu'\)"):
            if how == "Tensor.backward":
                loss.backward()
            elif how == "autograd.backward":
                torch.autograd.backward([loss])
            else:
                torch.autograd.grad(loss, [layer.weight])
    assert layer.weight.grad is None  # nothing ran
    with pytest.raises(metaload.ModeError, match="fake tensors on cuda"):
        loss.backward()  # outside the scope too
    x = torch.randn(2, 2, requires_grad=True)  # real autograd is untouched
    (x * x).sum().backward()
    assert torch.equal(x.grad, 2 * x)


# ---- torch.save / torch.load and meta() --------------------------------------------------------


def _assert_meta_like(loaded, reference):
    assert loaded.keys() == reference.keys()
    for name, t in reference.items():
        assert loaded[name].is_meta, name
        assert (loaded[name].shape, loaded[name].dtype) == (t.shape, t.dtype), name


def test_torch_load_inside_meta_gives_meta_tensors_as_map_location_meta_does(tmp_path):
    real = dict(torch.nn.Linear(3, 2).state_dict(), half=torch.zeros(4, dtype=torch.float16),
                steps=torch.arange(5), scalar=torch.tensor(2.0))
    torch.save(real, tmp_path / "real.pt")
    with metaload.meta():
        torch.save(real, tmp_path / "saved_inside.pt")  # real tensors saved inside: their data
        built = dict(torch.nn.LayerNorm(8).state_dict(), small=torch.tensor([1, 2]))
        torch.save(built, tmp_path / "built.pt")  # meta tensors: shapes only
        loaded = [torch.load(tmp_path / "real.pt"), torch.load(tmp_path / "saved_inside.pt"),
                  torch.load(tmp_path / "real.pt", map_location="cpu"),
                  torch.load(tmp_path / "real.pt", "cpu"),
                  torch.load(open(tmp_path / "real.pt", "rb"))]
        built_back = torch.load(tmp_path / "built.pt")
        with metaload.real():
            real_back = torch.load(tmp_path / "saved_inside.pt")
    for got in loaded:
        _assert_meta_like(got, real)
    _assert_meta_like(built_back, built)
    _assert_meta_like(torch.load(tmp_path / "built.pt"), built)  # outside: meta as saved
    expected = torch.load(tmp_path / "real.pt", map_location="meta")
    _assert_meta_like(expected, real)
    for back in (real_back, torch.load(tmp_path / "saved_inside.pt")):
        assert all(torch.equal(back[k], v) for k, v in real.items())  # real() and outside: data
