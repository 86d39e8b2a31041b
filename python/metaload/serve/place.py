"""Placement from the key alone: which devices each deployment gets.

    python -m metaload.serve.place REF... --devices cuda:0=80GiB,cuda:1=80GiB   (metaload place)
                                          [--gpus 8x80GiB] [--dtype D] [--batch B --seq S]

A deployment needs its weights' exact stored bytes in the serving dtype (metaload.describe:
headers, quantized checkpoints included) plus activation room, measured by a scan (fake tensors,
no weights) at the declared batch x sequence length (at most the model's positions): the outputs of the largest layer plus every
output outside the layers (embeddings, logits). It gets, in this order of preference: one device
(the one it fits best); a tensor-parallel degree among the divisors of its max_tp_size, each rank
sized by the scan of that rank (its weight_bytes and outputs); or its layers split across devices
in order (each device holding whole layers and the activation room). Largest deployments first. A
deployment that fits none of these is refused (metaload.PlanError) with the numbers.
"""
import argparse
import json
import re
import sys
from typing import Dict, List, Optional, Tuple

_LAYER = re.compile(r"^(.*?\.(?:h|layers|layer|blocks|block)\.\d+)(?:\.|$)")


def parse_devices(devices: Optional[str] = None,
                  gpus: Optional[str] = None) -> List[Tuple[str, int]]:
    """[(device, bytes)] of "cuda:0=80GiB,cpu=64GiB" and/or "8x80GiB" (cuda:0..7)."""
    from .. import PlanError
    from ..checkpoint import parse_size
    out = []
    for item in (devices or "").split(","):
        if not item.strip():
            continue
        name, sep, size = item.partition("=")
        if not sep:
            raise PlanError(f"--devices: {item!r} is not DEVICE=SIZE (e.g. cuda:0=80GiB)")
        out.append((name.strip(), _size(parse_size, size, "--devices", item)))
    if gpus:
        count, sep, size = gpus.partition("x")
        if not sep or not count.strip().isdigit() or int(count) < 1:
            raise PlanError(f"--gpus: {gpus!r} is not NxSIZE (e.g. 8x80GiB)")
        start = sum(1 for d, _ in out if d.startswith("cuda"))
        out += [(f"cuda:{start + i}", _size(parse_size, size, "--gpus", gpus))
                for i in range(int(count))]
    if not out:
        raise PlanError("placement needs --devices DEVICE=SIZE,... or --gpus NxSIZE")
    if len({d for d, _ in out}) != len(out):
        raise PlanError(f"--devices: a device is named twice in {devices!r}")
    return out


def _size(parse_size, text, flag, item):
    from .. import PlanError
    try:
        return parse_size(text.strip())
    except ValueError as e:
        raise PlanError(f"{flag}: {item!r}: {e}") from None


def activation_bytes(scan) -> int:
    """The largest layer's outputs plus every output outside the layers."""
    layers: Dict[str, int] = {}
    outside = 0
    for path, m in scan.items():
        if path == "":
            continue
        hit = _LAYER.match(path)
        if hit:
            layers[hit.group(1)] = layers.get(hit.group(1), 0) + m.bytes
        elif not any(p.startswith(path + ".") for p in layers):
            outside += m.bytes
    return outside + max(layers.values(), default=0)


def _layer_bytes(model) -> Tuple[int, List[int]]:
    """(bytes outside the layers, [bytes of each layer]) of the skeleton's parameters and buffers
    in the serving dtype."""
    layers: Dict[str, int] = {}
    outside = 0
    named = list(model.named_parameters().items()) + list(model.named_buffers().items())
    for name, t in named:
        n = t.numel() * t.element_size()
        hit = _LAYER.match(name)
        if hit:
            layers[hit.group(1)] = layers.get(hit.group(1), 0) + n
        else:
            outside += n
    return outside, list(layers.values())


def _config_only(ref, dtype):
    """(weights, config, max_tp_size) of a directory holding only config.json: the skeleton's
    parameters and buffers in `dtype`, each tensor once (what its checkpoint would store)."""
    import os

    import metaload
    with open(os.path.join(ref, "config.json")) as f:
        config = json.load(f)
    model = metaload.TransformersModel(ref, dtype=dtype, allow_local_paths=True)
    seen, total = set(), 0
    for t in list(model.named_parameters().values()) + list(model.named_buffers().values()):
        if id(t) not in seen:
            seen.add(id(t))
            total += t.numel() * t.element_size()
    return total, config, metaload.max_tp_size(config)


def need(ref: str, dtype=None, batch: int = 1, seq: int = 2048, revision=None) -> dict:
    """What one deployment needs: weights (stored bytes in `dtype`, from the headers; for a
    directory holding only config.json, from its skeleton), activations, the layers' bytes, and
    the TP degrees it takes."""
    import os

    import metaload
    try:
        info = metaload.describe_checkpoint(ref, dtype=dtype, revision=revision,
                                            allow_local_paths=True)
        weights, cfg, max_tp = info.size_bytes, info.config or {}, info.max_tp_size
    except metaload.ResolveError:
        if not os.path.isfile(os.path.join(str(ref), "config.json")):
            raise
        weights, cfg, max_tp = _config_only(ref, dtype)
    cfg = cfg.get("text_config", cfg)
    longest = cfg.get("max_position_embeddings") or cfg.get("n_positions")
    seq = min(seq, longest) if isinstance(longest, int) and longest > 0 else seq
    try:
        model = metaload.TransformersModel(ref, revision=revision, dtype=dtype,
                                           allow_local_paths=True)
        scan = model.scan(batch=batch, seq=seq)
    except metaload.Error as e:  # a family metaload cannot build: weights only, said so
        model, scan, why = None, {}, f"{type(e).__name__}: {e}"
    else:
        why = None
    outside, layers = _layer_bytes(model) if model is not None else (weights, [])
    degrees = [d for d in range(2, max_tp + 1) if max_tp % d == 0] if max_tp else []
    return {"ref": ref, "weights": int(weights), "activations": activation_bytes(scan),
            "outside_layers": outside, "layers": layers, "tp_degrees": degrees,
            "model": model, "batch": batch, "seq": seq, "scan_error": why}


def _gib(n):
    """1.50 GiB, 12.0 MiB, 512 B (as the metaload tool writes sizes)."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} B"


def _single(n, free):
    want = n["weights"] + n["activations"]
    fits = [d for d, f in free.items() if f >= want]
    if not fits:
        return None
    best = min(fits, key=lambda d: free[d] - want)
    return {"mode": "single", "devices": [best], "per_device": {best: want}}


def _tensor_parallel(n, free):
    same_kind = sorted(free, key=lambda d: -free[d])
    for degree in n["tp_degrees"] if n["model"] is not None else []:
        if degree > len(same_kind):
            break
        rank = n["model"].scan(batch=n["batch"], seq=n["seq"], tp_size=degree)
        want = int(rank.weight_bytes) + activation_bytes(rank)
        chosen = same_kind[:degree]
        if free[chosen[-1]] >= want:
            return {"mode": "tp", "tp_size": degree, "devices": chosen,
                    "per_device": {d: want for d in chosen}}
    return None


def _split(n, free):
    """Whole layers in order over the devices with the most room; the first also holds what is
    outside the layers; each holds the activation room."""
    order = sorted(free, key=lambda d: -free[d])
    per, layers = {}, list(n["layers"])
    for i, d in enumerate(order):
        used = n["activations"] + (n["outside_layers"] if i == 0 else 0)
        while layers and used + layers[0] <= free[d]:
            used += layers.pop(0)
        if used > n["activations"]:
            per[d] = used
        if not layers:
            return {"mode": "split", "devices": list(per), "per_device": per}
    return None


def _refusal(n, free, dtype):
    room = ", ".join(f"{d} {_gib(f)}" for d, f in free.items())
    degrees = n["tp_degrees"] or "none (max_tp_size unknown or 1)"
    return (f"{n['ref']} does not fit: weights {_gib(n['weights'])} ({n['weights']} bytes, dtype "
            f"{dtype or 'as stored'}) + activations {_gib(n['activations'])} at batch "
            f"{n['batch']} x seq {n['seq']}; largest layer "
            f"{_gib(max(n['layers'], default=0))}; free: {room}; TP degrees: {degrees}")


def device_room(device: str) -> int:
    """The memory free on `device` now (cpu: MemAvailable; cuda: the driver's free bytes)."""
    import torch
    d = torch.device(device)
    if d.type == "cuda":
        return int(torch.cuda.mem_get_info(d)[0])
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def plan(refs, devices: List[Tuple[str, int]], dtype=None, batch: int = 1, seq: int = 2048,
         revision=None) -> Dict[str, dict]:
    """{ref: {mode, devices, per_device, weights, activations}}; metaload.PlanError when one does
    not fit (nothing is placed then)."""
    from .. import PlanError
    free = dict(devices)
    needs = sorted((need(r, dtype, batch, seq, revision) for r in refs),
                   key=lambda n: -(n["weights"] + n["activations"]))
    out = {}
    for n in needs:
        got = _single(n, free) or _tensor_parallel(n, free) or _split(n, free)
        if got is None:
            raise PlanError(_refusal(n, free, dtype))
        for d, b in got["per_device"].items():
            free[d] -= b
        got.update(weights=n["weights"], activations=n["activations"], batch=batch, seq=seq,
                   scan_error=n["scan_error"])
        out[n["ref"]] = got
    return {r: out[r] for r in refs}


def ndif_rule(n_params: int, dtype_bytes: float, per_card: int, max_tp: Optional[int]) -> dict:
    """NDIF's sizing, for comparison: n_params x bytes per element x 1.15 + 500 MiB; cards =
    ceil(padded / per card), rounded up to a TP degree (a divisor of max_tp) when it needs more
    than one."""
    import math
    padded = math.ceil(n_params * dtype_bytes * 1.15 + 500 * 2**20)
    cards = max(1, math.ceil(padded / per_card))
    if cards > 1 and max_tp:
        up = [d for d in range(cards, max_tp + 1) if max_tp % d == 0]
        cards = up[0] if up else cards
    return {"padded_bytes": padded, "cards": cards}


def parser():
    p = argparse.ArgumentParser(prog="metaload place", description=__doc__.split("\n\n")[0])
    p.add_argument("refs", nargs="+", metavar="REF")
    p.add_argument("--devices", default=None, help="DEVICE=SIZE,... (cuda:0=80GiB,cpu=64GiB)")
    p.add_argument("--gpus", default=None, help="NxSIZE: N GPUs of SIZE each (8x80GiB)")
    p.add_argument("--dtype", default=None, help="serving dtype (default: as stored)")
    p.add_argument("--batch", type=int, default=1, help="declared batch size of a request")
    p.add_argument("--seq", type=int, default=2048, help="declared sequence length")
    p.add_argument("--revision", default=None)
    p.add_argument("--json", action="store_true", help="print JSON")
    return p


def main(argv=None):
    args = parser().parse_args(argv)
    try:
        placed = plan(args.refs, parse_devices(args.devices, args.gpus), args.dtype, args.batch,
                      args.seq, args.revision)
    except Exception as e:  # noqa: BLE001 - one line, the kind first
        sys.stderr.write(f"metaload place: error: {type(e).__name__}: {e}\n")
        return 1
    if args.json:
        print(json.dumps(placed, indent=2))
        return 0
    for ref, p in placed.items():
        where = ", ".join(f"{d} {_gib(b)}" for d, b in p["per_device"].items())
        extra = f" tp={p['tp_size']}" if p["mode"] == "tp" else ""
        print(f"{ref}: {p['mode']}{extra} on {where} (weights {_gib(p['weights'])}, "
              f"activations {_gib(p['activations'])})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
