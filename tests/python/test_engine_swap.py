"""The all-or-nothing swap from Python: torch.ops.metaload.swap_tensors on nn.Module parameters."""
import pytest
import torch

from metaload import _lib


@pytest.fixture(scope="module")
def ops():
    return _lib.load()


swap = _lib.typed_errors(lambda targets, sources: _lib.load().swap_tensors(targets, sources))


def test_meta_module_takes_loaded_weights_in_place(ops):
    m = torch.nn.Linear(4, 3, device="meta")
    weight = m.weight  # a reference taken before the load
    w, b = torch.randn(3, 4), torch.randn(3)
    swap([m.weight, m.bias], [w, b])
    assert m.weight is weight
    assert isinstance(weight, torch.nn.Parameter)
    assert weight.device.type == "cpu" and weight.requires_grad and weight.is_leaf
    assert torch.equal(weight, w) and torch.equal(m.bias, b)
    x = torch.randn(2, 4)
    assert torch.allclose(m(x), x @ w.t() + b)
    m(x).sum().backward()
    assert torch.allclose(weight.grad, x.sum(0).expand(3, 4))


def test_buffers_and_dtype_change(ops):
    bn = torch.nn.BatchNorm1d(5, device="meta")
    names = ["weight", "bias", "running_mean", "running_var"]
    srcs = [torch.randn(5).to(torch.bfloat16) for _ in names]
    swap([getattr(bn, n) for n in names], srcs)
    for n, s in zip(names, srcs):
        assert getattr(bn, n).dtype == torch.bfloat16
        assert torch.equal(getattr(bn, n), s)
    assert bn.weight.requires_grad and not bn.running_mean.requires_grad


def test_a_bad_pair_changes_nothing(ops):
    m = torch.nn.Linear(4, 3, device="meta")
    with pytest.raises(_lib.error_class("SwapError"), match=r"shape \[3\] in the module but \[4\] loaded"):
        swap([m.weight, m.bias], [torch.randn(3, 4), torch.randn(4)])
    assert m.weight.is_meta and m.bias.is_meta
    with pytest.raises(_lib.Error):
        swap([m.weight], [torch.zeros(3, 4, dtype=torch.int64)])  # int cannot require grad
    assert m.weight.is_meta
