"""Every torchvision model builder constructed under metaload.meta()."""
import inspect
import warnings

import torch
from torchvision import models

import metaload

# The count reached when the foundation issue was resolved (all of them); it may not fall. The 15
# RegNets read back values of tensors they compute in their constructor (`.tolist()`): they build
# because meta() tracks the values of small tensors made from constants (metaload/_values.py).
FLOOR = 118


def build_all():
    ok, failed = [], {}
    for name in sorted(models.list_models()):
        builder = models.get_model_builder(name)
        kwargs = {"weights": None}
        if "weights_backbone" in inspect.signature(builder).parameters:
            kwargs["weights_backbone"] = None
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                with metaload.meta():
                    model = builder(**kwargs)
        except metaload.Error as e:
            failed[name] = f"{type(e).__name__}: {e}"
            continue
        tensors = list(model.named_parameters()) + list(model.named_buffers())
        not_meta = [n for n, t in tensors if not t.is_meta]
        assert not not_meta, f"{name}: not on meta: {not_meta[:5]}"
        assert tensors, name
        ok.append(name)
    return ok, failed


def test_every_torchvision_builder_under_meta():
    ok, failed = build_all()
    total = len(ok) + len(failed)
    print(f"\ntorchvision builders on meta: {len(ok)} passed out of {total}")
    for name, why in failed.items():
        print(f"  {name}: {why[:160]}")
    # Every failure must be the typed data-dependent error, never a crash or an untyped error.
    assert all(why.startswith("DataDependentError") for why in failed.values()), failed
    assert len(ok) >= FLOOR
    # Families the issue names: classification, segmentation, detection, video, optical flow.
    for name in ["resnet50", "vit_b_16", "deeplabv3_resnet50", "fasterrcnn_resnet50_fpn",
                 "maskrcnn_resnet50_fpn", "r3d_18", "raft_large", "swin_t", "convnext_tiny"]:
        assert name in ok, name
