"""Every torchvision classification builder: built under metaload.meta(), scanned under
metaload.fake("cuda") at its default input size, checked against a real forward or its documented
output shape."""
import inspect
import time
import warnings

import pytest
import torch
from torchvision import models

import metaload

# The count reached when the scan issue was resolved (all of them); it may not fall. RegNets build
# under meta() because it tracks the values of small tensors made from constants.
FLOOR = 80

# Small models whose real CPU forward (on a small input) is cheap enough for every CI run: each
# module's output shape from the scan must equal the real one.
REAL_CHECK = ["resnet18", "squeezenet1_1", "mobilenet_v3_small", "shufflenet_v2_x0_5", "mnasnet0_5",
              "efficientnet_b0", "densenet121", "convnext_tiny", "swin_t", "googlenet", "alexnet",
              "regnet_y_400mf"]


def classification_models():
    return sorted(models.list_models(module=models))


def default_size(name, model):
    """The model's own input size (ViTs fix it at construction), else its default weights' crop."""
    if isinstance(getattr(model, "image_size", None), int):
        return model.image_size
    weights = models.get_model_weights(name).DEFAULT
    crop = weights.transforms().crop_size
    return crop[0] if isinstance(crop, (list, tuple)) else crop


def build_meta(name):
    builder = models.get_model_builder(name)
    kwargs = {"weights": None}
    if "aux_logits" in inspect.signature(builder).parameters and name in ("googlenet", "inception_v3"):
        kwargs["aux_logits"] = False
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with metaload.meta():
            return builder(**kwargs).eval()


def module_shapes_real(model, x):
    shapes = {}
    hooks = [m.register_forward_hook(
        lambda m, i, o, p=p: shapes.__setitem__(p, tuple((o[0] if isinstance(o, tuple) else o).shape))
        if isinstance(o[0] if isinstance(o, tuple) else o, torch.Tensor) else None)
        for p, m in model.named_modules()]
    with torch.no_grad():
        model(x)
    for h in hooks:
        h.remove()
    return shapes


def test_every_classification_model_scans_on_fake_cuda():
    ok, failed = [], {}
    t0 = time.time()
    for name in classification_models():
        try:
            model = build_meta(name)
            size = default_size(name, model)
            shapes = metaload.scan(model, torch.empty(2, 3, size, size, device="meta"), device="cuda")
        except metaload.Error as e:
            failed[name] = f"{type(e).__name__}: {str(e)[:150]}"
            continue
        out_shape, dtype = shapes[""].shape, shapes[""].dtype
        assert out_shape == (2, 1000) and dtype == torch.float32, (name, shapes[""])
        assert all(p.is_meta for p in model.parameters()), name
        ok.append(name)
    total = len(ok) + len(failed)
    print(f"\ntorchvision classification scanned on fake cuda: {len(ok)} passed out of {total} "
          f"({time.time() - t0:.1f} s)")
    for name, why in failed.items():
        print(f"  {name}: {why}")
    assert all(w.startswith("DataDependentError") for w in failed.values()), failed
    assert len(ok) >= FLOOR


@pytest.mark.parametrize("name", REAL_CHECK)
def test_scan_equals_a_real_forward_module_by_module(name):
    torch.manual_seed(0)
    builder = models.get_model_builder(name)
    kwargs = {"weights": None}
    if name == "googlenet":
        kwargs["aux_logits"] = False
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        real_model = builder(**kwargs).eval()
    x = torch.randn(1, 3, 64, 64) if name not in ("alexnet", "swin_t", "convnext_tiny") else \
        torch.randn(1, 3, 96, 96)
    expected = module_shapes_real(real_model, x)
    meta_model = build_meta(name)
    scanned = metaload.scan(meta_model, x, device="cuda")
    got = {p: m.shape for p, m in scanned.items()}
    assert got == expected
