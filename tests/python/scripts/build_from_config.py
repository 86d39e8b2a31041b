"""An unmodified transformers program: builds AutoModelForCausalLM.from_config(config in DIR).

Usage: build_from_config.py DIR ROUTE, ROUTE "torch.device" (built inside torch.device("meta")) or
"none" (as written: metaload switched on from outside, LD_PRELOAD + METALOAD=meta). Prints one JSON
line: the build's time, its peak RSS growth (the high-water mark reset just before), the devices of
every parameter and buffer, the parameter count.
"""
import contextlib, json, sys, time
import torch
from transformers import AutoConfig, AutoModelForCausalLM

def status(field):
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith(field + ":"))

config = AutoConfig.from_pretrained(sys.argv[1])
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")
before = status("VmRSS")
start = time.perf_counter()
with torch.device("meta") if sys.argv[2] == "torch.device" else contextlib.nullcontext():
    model = AutoModelForCausalLM.from_config(config)
took = time.perf_counter() - start
tensors = list(model.parameters()) + list(model.buffers())
print(json.dumps({"s": took, "rss_mb": (status("VmHWM") - before) / 1024,
                  "devices": sorted({str(t.device) for t in tensors}),
                  "params": sum(p.numel() for p in model.parameters())}))
