"""metaload.load_into: a torchvision resnet50 exported with the project's safetensors writer and
loaded back into a meta-built model gives the same outputs as load_state_dict of the same weights;
errors are typed and leave the module as it was."""
import pytest
import torch
import torchvision

from metaload import _lib
from metaload._load import load_into
from metaload.checkpoint import save_safetensors

MismatchError = _lib.error_class("MismatchError")


@pytest.fixture(scope="module")
def resnet(tmp_path_factory):
    torch.manual_seed(0)
    ref = torchvision.models.resnet50()
    # Non-trivial batch-norm statistics, so the buffers matter in eval mode.
    with torch.no_grad():
        for m in ref.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.uniform_(-0.1, 0.1)
                m.running_var.uniform_(0.5, 1.5)
                m.num_batches_tracked.fill_(7)
    path = str(tmp_path_factory.mktemp("resnet") / "resnet50.safetensors")
    save_safetensors(path, ref)
    return ref.eval(), path


def test_resnet50_same_outputs_as_load_state_dict(resnet):
    ref, path = resnet
    expected = torchvision.models.resnet50()
    expected.load_state_dict(ref.state_dict())
    expected.eval()

    model = torchvision.models.resnet50().to("meta")  # no weight memory
    conv1 = model.conv1.weight  # a reference taken before the load
    report = load_into(model, path, progress=False)
    model.eval()
    assert conv1 is model.conv1.weight and conv1.device.type == "cpu"
    assert conv1.requires_grad
    assert report.engine == "cpu" and report.slot_bytes == sum(
        t.numel() * t.element_size() for t in ref.state_dict().values())
    assert model.bn1.num_batches_tracked.item() == 7
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        assert torch.equal(model(x), expected(x))


def test_bfloat16_load_and_previous_weights(resnet):
    ref, path = resnet
    model = torchvision.models.resnet50()  # real weights: replaced in place
    fc = model.fc.weight
    load_into(model, path, dtype=torch.bfloat16, progress=False)
    assert fc.dtype == torch.bfloat16
    assert torch.equal(fc, ref.fc.weight.to(torch.bfloat16))
    assert model.bn1.num_batches_tracked.dtype == torch.int64  # integers keep their dtype


def test_mismatch_lists_everything_and_changes_nothing(resnet):
    _, path = resnet
    model = torchvision.models.resnet18().to("meta")
    with pytest.raises(MismatchError) as e:
        load_into(model, path, progress=False)
    msg = str(e.value)
    assert "0 missing, 198 unexpected, 24 mismatched" in msg
    assert "unexpected: layer1.0.conv3.weight" in msg
    # The message shows 20 of each kind; the error's lists hold them all.
    assert "\n  ... and 178 more unexpected" in msg and "\n  ... and 4 more mismatched" in msg
    assert len(e.value.unexpected) == 198 and len(e.value.mismatched) == 24
    assert "fc.weight" in e.value.mismatched and "layer4.2.conv3.weight" in e.value.unexpected
    assert all(p.is_meta for p in model.parameters())


def test_bad_requests_are_typed(resnet, tmp_path):
    _, path = resnet
    model = torchvision.models.resnet50().to("meta")
    with pytest.raises(_lib.error_class("ResolveError")):
        load_into(model, str(tmp_path / "nothing-here"), progress=False)
    with pytest.raises(_lib.error_class("PlanError"), match="TP plan"):
        load_into(model, path, tp_size=2, progress=False)
    if not torch.cuda.is_available():
        with pytest.raises(_lib.Error):
            load_into(model, path, device="cuda", progress=False)
    assert all(p.is_meta for p in model.parameters())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_resnet50_onto_cuda(resnet):
    ref, path = resnet
    model = torchvision.models.resnet50().to("meta")
    report = load_into(model, path, device="cuda", dtype=torch.bfloat16, progress=False)
    assert report.engine.startswith("staged:cuda")
    for name, t in model.state_dict().items():
        assert t.is_cuda, name
        want = ref.state_dict()[name]
        want = want.to(torch.bfloat16) if want.is_floating_point() else want
        assert torch.equal(t.cpu(), want), name


def test_load_into_inside_the_meta_mode(resnet):
    import metaload
    if not hasattr(metaload, "meta"):
        pytest.skip("this tree has no metaload.meta() (c10_ext)")
    ref, path = resnet
    with metaload.meta():
        model = torchvision.models.resnet50()
        assert model.conv1.weight.is_meta
        load_into(model, path, progress=False)  # real data even inside meta()
    model.eval()
    assert model.conv1.weight.device.type == "cpu"
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        assert torch.equal(model(x), ref(x))


def test_resnet50_zero_copy_same_outputs_and_file_untouched(resnet):
    ref, path = resnet
    with open(path, "rb") as f:
        before = f.read()
    model = torchvision.models.resnet50().to("meta")
    report = load_into(model, path, progress=False, mmap=True)
    assert report.engine == "cpu+mapped" and report.mapped_bytes == report.slot_bytes
    model.eval()
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        assert torch.equal(model(x), ref(x))
        model.conv1.weight.mul_(2)  # copy-on-write: the checkpoint file never changes
    with open(path, "rb") as f:
        assert f.read() == before
