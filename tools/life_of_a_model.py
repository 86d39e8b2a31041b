"""Draws the life of a model -- meta build, scan, dispatch, forward -- with the time and memory
each step took, measured here and now on the demo's model, into an SVG for the README.

    tools/life_of_a_model.py [--data DIR] [--out docs/life_of_a_model.svg]

The model is the demo's embedded default (GPT-2 124M, the real config, deterministic weights) in
the Hugging Face cache tree tools/demo writes under data/hf-cache; it is written there first when
missing (`metaload make-checkpoint`, about a second). Every number in the picture is measured by
this run: wall time of each step, and the process's resident memory after it (VmRSS) and at its
peak (VmHWM). Needs METALOAD_LIB and python/ on the path, as tools/demo sets them. No plotting
library: the SVG is written as text.
"""
import argparse
import os
import sys
import time
from html import escape

REPO = "openai-community/gpt2"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def status_kib(field):
    """A field of /proc/self/status in KiB (VmRSS: resident now; VmHWM: peak so far)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def reset_peak():
    """Starts VmHWM afresh at the current VmRSS, so each step's peak is its own (Linux >= 4.0)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass  # the peaks then include what came before: still upper bounds


def ensure_checkpoint(cache, metaload):
    snapshot_root = os.path.join(cache, "models--" + REPO.replace("/", "--"))
    if not os.path.isdir(snapshot_root):
        metaload.make_checkpoint(config="gpt2", arch="gpt2", hf_cache=cache, repo=REPO)


def measure():
    """[(step, detail, seconds, rss MiB after, peak MiB)] for the four steps, in order."""
    import torch

    import metaload

    steps = []
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    base = status_kib("VmRSS")

    def record(name, detail, t0):
        steps.append((name, detail, time.perf_counter() - t0, (status_kib("VmRSS") - base) / 1024,
                      (status_kib("VmHWM") - base) / 1024))

    reset_peak()
    t0 = time.perf_counter()
    model = metaload.TransformersModel(REPO, progress=False)
    record("meta build", f"{model.info['num_parameters'] / 1e6:.0f}M parameters on meta", t0)
    reset_peak()
    t0 = time.perf_counter()
    scan = model.scan(batch=8, seq=1024)
    record("scan", f"[8, 1024]: {len(scan.modules)} modules, "
           f"{scan.total_bytes / 2**30:.1f} GiB of activations", t0)
    reset_peak()
    t0 = time.perf_counter()
    report = model.dispatch()
    how = "zero-copy (mapped)" if report.mapped_bytes >= report.bytes else "copied"
    record("dispatch", f"{report.bytes / 2**20:.0f} MiB {how}", t0)
    ids = torch.tensor([[464, 2068, 7586, 21831, 18045]])
    reset_peak()
    t0 = time.perf_counter()
    with torch.no_grad():
        out = model.generate(ids, 16)
    record("forward", f"16 greedy tokens ({out.shape[1] - ids.shape[1]} new)", t0)
    return steps


def fmt_time(s):
    return f"{s * 1e3:.1f} ms" if s < 1 else f"{s:.2f} s"


def svg(steps, title):
    """Boxes left to right (one per step: name, what it did, its time), under each a bar of the
    memory held after it, scaled to the largest peak; peaks as a thin outline."""
    box_w, gap, left, top = 210, 30, 20, 50
    bar_h = 120
    width = left * 2 + len(steps) * box_w + (len(steps) - 1) * gap
    height = top + 90 + bar_h + 60
    top_mib = max(max(s[4] for s in steps), 1.0)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'font-family="sans-serif" font-size="13">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="{left}" y="28" font-size="16" font-weight="bold">{escape(title)}</text>']
    for i, (name, detail, secs, rss, peak) in enumerate(steps):
        x = left + i * (box_w + gap)
        out.append(f'<rect x="{x}" y="{top}" width="{box_w}" height="70" rx="8" fill="#e8f0fe" '
                   f'stroke="#3367d6"/>')
        out.append(f'<text x="{x + 10}" y="{top + 22}" font-weight="bold">{escape(name)}</text>')
        out.append(f'<text x="{x + 10}" y="{top + 42}" font-size="11">{escape(detail)}</text>')
        out.append(f'<text x="{x + 10}" y="{top + 61}">{escape(fmt_time(secs))}</text>')
        if i:
            ax = x - gap
            out.append(f'<path d="M{ax + 4},{top + 35} L{x - 4},{top + 35} M{x - 10},{top + 29} '
                       f'L{x - 4},{top + 35} L{x - 10},{top + 41}" stroke="#555" fill="none"/>')
        base_y = top + 90 + bar_h
        peak_h = bar_h * max(peak, 0) / top_mib
        rss_h = bar_h * max(rss, 0) / top_mib
        out.append(f'<rect x="{x + 60}" y="{base_y - peak_h:.1f}" width="90" height="{peak_h:.1f}" '
                   f'fill="none" stroke="#d93025" stroke-dasharray="4 2"/>')
        out.append(f'<rect x="{x + 60}" y="{base_y - rss_h:.1f}" width="90" height="{rss_h:.1f}" '
                   f'fill="#fbbc04"/>')
        out.append(f'<text x="{x + 10}" y="{base_y + 20}" font-size="12">held after: '
                   f'{rss:.1f} MiB</text>')
        out.append(f'<text x="{x + 10}" y="{base_y + 38}" font-size="12" fill="#d93025">peak: '
                   f'{peak:.1f} MiB</text>')
    out.append(f'<text x="{left}" y="{height - 6}" font-size="11" fill="#555">memory: growth of '
               'the process over its state before the build (VmRSS, VmHWM); bars to scale</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=os.environ.get("METALOAD_DEMO_DATA",
                                                     os.path.join(ROOT, "data")))
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "life_of_a_model.svg"))
    args = ap.parse_args(argv)
    cache = os.path.join(args.data, "hf-cache")
    os.environ["HF_HUB_CACHE"] = cache
    import torch

    import metaload
    ensure_checkpoint(cache, metaload)
    steps = measure()
    for name, detail, secs, rss, peak in steps:
        print(f"{name:<10} {fmt_time(secs):>10}  held {rss:8.1f} MiB  peak {peak:8.1f} MiB  {detail}")
    title = (f"The life of a model: GPT-2 124M (float32) with metaload, torch {torch.__version__}, "
             f"{time.strftime('%Y-%m-%d')}")
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        f.write(svg(steps, title))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
