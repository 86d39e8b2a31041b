"""The Python half of tools/demo: the embedded default through metaload.TransformersModel, and a
torchvision model built under metaload.meta(). Run by tools/demo (HF_HUB_CACHE points at the demo's
cache); every number is measured here."""
import time
import warnings

import torch

import metaload

warnings.simplefilter("ignore")
REPO = "openai-community/gpt2"


def ms(seconds):
    return f"{seconds * 1e3:.1f} ms"


print("== Python: metaload.TransformersModel")
t = time.perf_counter()
model = metaload.TransformersModel(REPO)
built = time.perf_counter() - t
print(f"TransformersModel({REPO!r}): {model.info['class']}, "
      f"{model.info['num_parameters']:,} parameters on meta, built in {ms(built)}")
print(f"key: {model.to_model_key()}")

t = time.perf_counter()
scan = model.scan(batch=8, seq=1024)  # the whole context of GPT-2
scanned = time.perf_counter() - t
logits = scan.modules[""]
print(f"scan of [8, 1024]: logits {logits.shape} {logits.dtype}, "
      f"{len(scan.modules)} modules, {scan.total_bytes / 2**30:.2f} GiB of activations, "
      f"in {ms(scanned)}; dispatched: {model.dispatched}")

held = model.parameter("transformer.h.11.mlp.c_proj.weight")
layer = model.capture("transformer.h.5")
ids = torch.tensor([[464, 2068, 7586, 21831, 18045]])
t = time.perf_counter()
out = model(ids)  # the first real forward dispatches
first = time.perf_counter() - t
report = model.dispatch()  # idempotent: the report of the load that already happened
# Zero-copy bytes are only mapped and their pages populated: that rate is no streaming rate.
how = ("copied" if report.mapped_bytes == 0 else "zero-copy" if report.mapped_bytes >= report.bytes
       else f"{report.mapped_bytes / 2**20:.0f} MiB zero-copy, the rest copied")
print(f"first real forward: {ms(first)}, of which loading {report.bytes / 2**20:.0f} MiB at "
      f"{report.gb_per_s:.2f} GB/s ({how})")
print(f"the tensor held before: now on {held.device}, the same object: "
      f"{model.parameter('transformer.h.11.mlp.c_proj.weight') is held}; "
      f"captured transformer.h.5: {tuple(layer.value.shape)}; next token {out[0, -1].argmax().item()}")

import torchvision  # noqa: E402  (after the model part: its import costs ~1 s)

t = time.perf_counter()
with metaload.meta():
    vit = torchvision.models.vit_h_14()
print(f"torchvision vit_h_14 under metaload.meta(): "
      f"{sum(p.numel() for p in vit.parameters()):,} parameters in {ms(time.perf_counter() - t)}, "
      f"on {next(vit.parameters()).device}")
