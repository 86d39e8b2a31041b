"""The Python half of tools/demo: models built with no weight memory."""
import gc
import time
import warnings

import torch
import torchvision

import metaload

warnings.simplefilter("ignore")


def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def gib(n):
    return n / 2**30


print("== torchvision models built under metaload.meta() (Python):")
print(f"{'model':<22}{'params':>14}{'fp32 GiB':>10}{'build ms':>10}{'RSS +MiB':>10}  device")
for name in ["resnet50", "vit_b_16", "vit_h_14", "maskrcnn_resnet50_fpn", "raft_large"]:
    builder = torchvision.models.get_model_builder(name)
    kwargs = {"weights": None}
    if name.startswith("maskrcnn"):
        kwargs["weights_backbone"] = None
    gc.collect()
    before = rss()
    t0 = time.perf_counter()
    with metaload.meta():
        model = builder(**kwargs)
    dt = time.perf_counter() - t0
    grew = rss() - before
    n = sum(p.numel() for p in model.parameters())
    devices = {t.device.type for t in list(model.parameters()) + list(model.buffers())}
    print(f"{name:<22}{n:>14,}{gib(4 * n):>10.2f}{dt * 1e3:>10.1f}{grew / 2**20:>10.1f}  "
          f"{','.join(sorted(devices))}")
    del model

print("\n== metaload.real() opens a real window inside the meta build:")
with metaload.meta():
    head = torch.nn.Linear(4096, 32000)
    with metaload.real():
        vocab_ids = torch.arange(8)
print(f"Linear(4096, 32000).weight on {head.weight.device}; arange(8) on {vocab_ids.device}: "
      f"{vocab_ids.tolist()}")
try:
    with metaload.meta():
        torch.zeros(3).sum().item()
except metaload.DataDependentError as e:
    print(f"reading a value of a meta tensor: metaload.DataDependentError: {str(e)[:100]}...")
tensors, nbytes = metaload.forcing_stats()
print(f"\nthis process so far: {tensors} tensors forced onto meta, {gib(nbytes):.2f} GiB not allocated")
