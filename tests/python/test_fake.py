"""metaload.fake(device) and metaload.scan() from Python."""
import pytest
import torch
import torchvision

import metaload
from conftest import run_python


def test_factories_claim_the_mode_device_without_a_gpu():
    with metaload.fake("cuda"):
        a = torch.randn(4, 8)
        b = torch.zeros(3, device="cpu", dtype=torch.long)
        c = torch.ones(2, device="cuda:1")
        d = torch.arange(10)
        e = torch.tensor([1.0, 2.0])
        w = torch.nn.Linear(8, 16)
    assert metaload.is_fake(a) and a.device == torch.device("cuda", 0) and a.is_cuda
    assert not a.is_meta
    assert b.device.type == "cpu" and b.dtype == torch.long
    assert c.device == torch.device("cuda", 1)
    assert d.device == torch.device("cuda", 0) and d.shape == (10,)
    assert e.device == torch.device("cuda", 0)
    assert w.weight.device == torch.device("cuda", 0) and w.weight.requires_grad


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
        scaled = gpu * torch.tensor(2.0, device="cpu")  # zero-dim cpu tensors mix freely
    assert scaled.device == torch.device("cuda", 0)


@pytest.mark.parametrize("read", [
    lambda t: t.nonzero(),
    lambda t: t.masked_select(t > 0),
    lambda t: torch.unique(t),
    lambda t: t.sum().item(),
    lambda t: t.tolist(),
    lambda t: t.data_ptr(),
])
def test_reading_values_is_a_typed_error(read):
    with metaload.fake("cuda"):
        t = torch.randn(5)
        with pytest.raises(metaload.DataDependentError):
            read(t)


def test_real_tensors_enter_as_fake_and_are_untouched():
    real = torch.arange(6.0)
    with metaload.fake("cpu"):
        y = real * 2
    assert metaload.is_fake(y) and y.device.type == "cpu"
    assert real.sum().item() == 15.0 and not metaload.is_fake(real)


def test_scan_of_a_meta_built_model_gives_every_module_output():
    with metaload.meta():
        model = torchvision.models.resnet18()
    shapes = metaload.scan(model, torch.empty(2, 3, 224, 224, device="meta"), device="cuda")
    assert shapes[""] == ((2, 1000), torch.float32)
    assert shapes["layer4"] == ((2, 512, 7, 7), torch.float32)
    assert shapes["layer1.0.conv1"] == ((2, 64, 56, 56), torch.float32)
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
    assert {p: s for p, (s, _) in shapes.items()} == real


RSS_PROBE = """
import gc, torch, torchvision, metaload
def rss():
    with open('/proc/self/statm') as f:
        return int(f.read().split()[1]) * 4096
with metaload.meta():
    model = torchvision.models.vit_b_16()
x = torch.empty(64, 3, 224, 224, device='meta')
metaload.scan(model, x[:1], device='cuda')  # warm up code paths
gc.collect()
before = rss()
shapes = metaload.scan(model, x, device='cuda')
gc.collect()
after = rss()
assert shapes[''] == ((64, 1000), torch.float32), shapes['']
print(after - before)
"""


def test_scanning_vit_b_16_at_batch_64_grows_rss_by_less_than_16_mb():
    r = run_python(RSS_PROBE)
    assert r.returncode == 0, r.stderr
    growth = int(r.stdout.strip().splitlines()[-1])
    print(f"scan of vit_b_16 at batch 64: RSS +{growth / 2**20:.2f} MiB")
    assert growth < 16 * 2**20
