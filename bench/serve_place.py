"""bench/serve_place: metaload place against NDIF's sizing rule on the configs in ../shared/configs.

    METALOAD_LIB=build/torch2/libmetaload.so PYTHONPATH=python python bench/serve_place.py

For each config (bfloat16; batch 1 x seq 2048, at most the model's positions): the weights'
exact bytes (the skeleton's tensors, each once, as the checkpoint stores them), the scan's
activation room, and the placement on 8 GPUs of 80 GiB and of 24 GiB; against NDIF's rule
(Hub parameter count x 2 bytes x 1.15 + 500 MiB, cards = ceil(padded / card), rounded up to a
TP degree), with the published parameter counts (../shared/configs/README.md).
"""
import os
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
CONFIGS = os.path.join(os.path.dirname(os.path.dirname(HERE)), "shared", "configs")
PUBLISHED = {"gpt2": 124439808, "llama-2-7b": 6738415616, "llama-2-70b": 68976648192,
             "llama-3.2-1b": 1235814400, "qwen2.5-0.5b": 494032768,
             "mistral-7b-v0.1": 7241732096}


def _where(p):
    if p is None:
        return "refused"
    extra = f" tp={p['tp_size']}" if p["mode"] == "tp" else ""
    each = max(p["per_device"].values()) / 2**30
    return f"{p['mode']}{extra}, {len(p['devices'])} x <= {each:.1f} GiB"


def main():
    from metaload.serve import place
    top = tempfile.mkdtemp(prefix="bench-place-")
    print("| config | params | weights (GiB) | activations (GiB) | metaload, 8 x 80 GiB | NDIF "
          "padded (GiB) | NDIF cards of 80 | metaload, 8 x 24 GiB | NDIF cards of 24 |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, n_params in PUBLISHED.items():
        d = os.path.join(top, name)
        os.makedirs(d)
        shutil.copy(os.path.join(CONFIGS, name + ".json"), os.path.join(d, "config.json"))
        n = place.need(d, "bfloat16", 1, 2048)
        row = [name, f"{n_params:,}", f"{n['weights'] / 2**30:.2f}",
               f"{n['activations'] / 2**30:.2f}"]
        max_tp = n["tp_degrees"][-1] if n["tp_degrees"] else None
        for card in (80, 24):
            try:
                p = place.plan([d], place.parse_devices(gpus=f"8x{card}GiB"), "bfloat16")[d]
            except Exception:  # noqa: BLE001 - a refusal is a result here
                p = None
            ndif = place.ndif_rule(n_params, 2, card * 2**30, max_tp)
            if card == 80:
                row += [_where(p), f"{ndif['padded_bytes'] / 2**30:.2f}", str(ndif["cards"])]
            else:
                row += [_where(p), str(ndif["cards"])]
        print("| " + " | ".join(row) + " |", flush=True)
    shutil.rmtree(top)


if __name__ == "__main__":
    sys.exit(main())
