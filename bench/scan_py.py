"""bench/scan (Python part): metaload.fake against PyTorch's own FakeTensorMode.

The same GPT-2-small-shaped Python model (12 layers, 768 wide, 12 heads, vocabulary 50257), batch
8 x 1024 tokens, forward under torch._subclasses.FakeTensorMode and under metaload.fake("cuda") in
the same run; the figure is the ratio of times. Peak RSS is reported next to each timing.
"""
import math
import resource
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import metaload


class Block(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.h = h
        self.ln_1 = nn.LayerNorm(d)
        self.c_attn = nn.Linear(d, 3 * d)
        self.c_proj = nn.Linear(d, d)
        self.ln_2 = nn.LayerNorm(d)
        self.c_fc = nn.Linear(d, 4 * d)
        self.mlp_proj = nn.Linear(4 * d, d)

    def forward(self, x, mask):
        b, s, d = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(d, dim=2)
        q, k, v = (t.view(b, s, self.h, d // self.h).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.h)
        att = torch.where(mask[:, :, :s, :s], att, torch.finfo(att.dtype).min)
        y = F.softmax(att, dim=-1) @ v
        x = x + self.c_proj(y.transpose(1, 2).reshape(b, s, d))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT2(nn.Module):
    def __init__(self, vocab=50257, d=768, layers=12, heads=12, n_pos=1024):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(n_pos, d)
        self.h = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.register_buffer("mask", torch.ones(n_pos, n_pos, dtype=torch.bool).tril()[None, None],
                             persistent=False)

    def forward(self, ids):
        pos = torch.arange(ids.shape[1], device=ids.device)
        x = self.wte(ids) + self.wpe(pos)
        for block in self.h:
            x = block(x, self.mask)
        return self.lm_head(self.ln_f(x))


def peak_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def timed(fn, reps):
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main():
    reps = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    batch, seq = 8, 1024
    rows = []

    from torch._subclasses import FakeTensorMode
    with FakeTensorMode() as mode:
        torch_model = GPT2()
        torch_ids = torch.zeros(batch, seq, dtype=torch.long)

    def torch_run():
        with torch.no_grad(), mode:
            out = torch_model(torch_ids)
        assert tuple(out.shape) == (batch, seq, 50257)

    t_torch = timed(torch_run, reps)
    rows.append(("anchor: torch FakeTensorMode (cpu)", t_torch, peak_mib()))

    with metaload.meta():
        model = GPT2()
    ids = torch.empty(batch, seq, dtype=torch.long, device="meta")

    def metaload_run():
        with torch.no_grad(), metaload.fake("cuda"):
            out = model(ids)
        assert tuple(out.shape) == (batch, seq, 50257) and out.device.type == "cuda"

    t_ml = timed(metaload_run, reps)
    rows.append(("metaload.fake('cuda')", t_ml, peak_mib()))
    t_scan = timed(lambda: metaload.scan(model, ids, device="cuda"), reps)
    rows.append(("metaload.scan (hooks on every module)", t_scan, peak_mib()))

    print(f"metaload bench/scan, Python (GPT-2-small-shaped, batch {batch} x {seq}, medians of {reps})\n")
    print(f"{'run':<40}{'ms':>10}{'x anchor':>10}{'speed-up':>10}{'peak RSS MiB':>14}")
    for name, t, rss in rows:
        print(f"{name:<40}{t * 1e3:>10.2f}{t / t_torch:>10.3f}{t_torch / t:>10.1f}{rss:>14.1f}")
    print("\ntarget: metaload at least 10x faster than FakeTensorMode")


if __name__ == "__main__":
    main()
