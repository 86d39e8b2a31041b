"""metaload.scan of transformers 5 MoE models against PyTorch's own FakeTensorMode (issue 25).

A tiny Mixtral and a tiny Qwen3-MoE (2 layers, hidden 32, 4 experts, top-2: the shapes of
tests/python/test_moe_scan.py), bfloat16 (FakeTensorMode's grouped_mm shape kernel takes bf16
only), transformers' default grouped_mm experts, input 8 x 128 tokens. Timed, median of --runs:
  - FakeTensorMode: the model built under it once, then `model(ids)` under the mode;
  - metaload.fake:  the model built under metaload.meta() once, then `model(ids)` under fake("cpu");
  - metaload.scan:  the same model, `metaload.scan(model, ids)` (forward hooks on every module and
    the result table included).
Printed: each time, and FakeTensorMode's time over metaload's (the ratio; > 1: metaload faster).
Peak RSS of the process at the end. torch 2.x with transformers 5 only.

    METALOAD_LIB=build/torch2/libmetaload.so PYTHONPATH=python \\
        ~/.cache/metaload/venv-torch2/bin/python bench/moe_scan.py [--runs 20] [--tokens 128]
"""
import argparse
import logging
import resource
import statistics
import time
import warnings

import torch
import transformers
from torch._subclasses.fake_tensor import FakeTensorMode

import metaload

transformers.logging.set_verbosity_error()
logging.getLogger("torch._subclasses.fake_tensor").setLevel(logging.CRITICAL)

BASE = dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=256,
            num_experts_per_tok=2, tie_word_embeddings=False)
MODELS = {
    "mixtral": (transformers.MixtralConfig, transformers.MixtralForCausalLM,
                dict(num_local_experts=4)),
    "qwen3_moe": (transformers.Qwen3MoeConfig, transformers.Qwen3MoeForCausalLM,
                  dict(num_experts=4, moe_intermediate_size=16)),
}


def median_time(fn, runs):
    fn()  # warm-up: first-call costs (kernel tables, caches) are not the scan's
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def bench(name, runs, tokens, dtype=torch.bfloat16):
    config_cls, model_cls, extra = MODELS[name]
    config = config_cls(**dict(BASE, **extra))
    ids = torch.randint(0, 128, (8, tokens))

    mode = FakeTensorMode(allow_non_fake_inputs=True)
    with warnings.catch_warnings(), mode:
        warnings.simplefilter("ignore")
        torch_model = model_cls._from_config(config, dtype=dtype).eval()

    def torch_fake():
        with mode, torch.no_grad():
            return torch_model(ids)

    with warnings.catch_warnings(), metaload.meta():
        warnings.simplefilter("ignore")
        model = model_cls(config).to(dtype).eval()

    def ml_fake():
        with metaload.fake("cpu"), torch.no_grad():
            return model(ids)

    def ml_scan():
        return metaload.scan(model, ids)

    assert tuple(torch_fake().logits.shape) == tuple(ml_fake().logits.shape) == \
        ml_scan()[""].shape == (8, tokens, 128)
    t_torch = median_time(torch_fake, runs)
    t_fake = median_time(ml_fake, runs)
    t_scan = median_time(ml_scan, runs)
    print(f"{name:<10} {str(dtype):<15} FakeTensorMode {t_torch * 1e3:8.2f} ms   metaload.fake "
          f"{t_fake * 1e3:7.2f} ms ({t_torch / t_fake:5.1f}x)   metaload.scan {t_scan * 1e3:7.2f} "
          f"ms ({t_torch / t_scan:5.1f}x)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--tokens", type=int, default=128)
    args = ap.parse_args()
    print(f"torch {torch.__version__}, transformers {transformers.__version__}; batch 8 x "
          f"{args.tokens}, median of {args.runs}; (Nx) = FakeTensorMode's time / metaload's")
    for name in MODELS:
        bench(name, args.runs, args.tokens)
    print(f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")


if __name__ == "__main__":
    main()
