"""metaload.scan of transformers 5's mixture-of-experts models against their real forward (issue 25,
"Scan and describe").

For each MoE model type, a tiny random model (a config shrunk to 2 layers, 4-8 experts, hidden 32)
in float32 and bfloat16, with each experts implementation (`config._experts_implementation`:
transformers' default "grouped_mm" and "eager"):
  - a real CPU forward on a fixed input records every module's output shape and dtype (forward
    hooks, the first tensor of a tuple or of a ModelOutput, the last call's);
  - metaload.scan of the same model built under metaload.meta() must give each of those modules
    the same shape and dtype, or mark it data-dependent, or leave it out because it sits inside a
    module marked data-dependent (a module that never ran in the scan);
  - torch's FakeTensorMode runs the same forward where it can (recorded, not required).

What is data-dependent, and why:
  - "grouped_mm" (the default): nothing. The routing sorts the S = tokens x top_k (token, expert)
    pairs by expert and counts the tokens per expert (histc), and the grouped matmul takes those
    counts as offsets into S rows: every shape is S or a config size, whatever the routing picked.
    Asserted: every module matched, none data-dependent, and metaload.fake alone gives the
    logits' shape and dtype.
  - Llama 4 (no implementation to choose: one batched matmul over every expert): nothing either.
  - "eager": each MoE layer's experts module loops over the experts the routing hit (nonzero of a
    per-expert hit mask) and gathers each expert's tokens (torch.where): the loop's trip count and
    the gathered sizes are values. The experts module is data-dependent (its reason names
    aten::nonzero), so is everything computed from its output (the MoE block, its decoder layer,
    every later layer, the final norm and the head), and its act_fn, which runs inside the loop on
    one expert's tokens, never runs in the scan. Asserted: the first MoE layer's experts module is
    data-dependent for aten::nonzero and every module that ran before it matched exactly.
One row per case is printed: type, dtype, implementation, modules matched, data-dependent, result,
and what FakeTensorMode did. A floor of fully matched grouped_mm / default cases never falls.

The pieces, without transformers (so on both torches): F.one_hot of fake tensors, histc of integers
on a fake cuda device, torch._grouped_mm in float32 on a fake cpu device, a ModelOutput-like
mapping as the model's output, and the data-dependent marking on a plain-torch eager MoE.

transformers 5.x needs torch 2.x: on Debian's torch 1.13 the transformers tests are skipped (they
say so).
"""
import collections
import logging
import warnings

import pytest
import torch

import metaload

try:
    import transformers
    if int(transformers.__version__.split(".")[0]) < 5:
        transformers = None
except ImportError:
    transformers = None
needs_transformers = pytest.mark.skipif(
    transformers is None, reason="transformers 5.x (tools/requirements.txt) is installed in the "
    "torch 2.x environment only; Debian's torch 1.13 has none")
if transformers is not None:
    transformers.logging.set_verbosity_error()

# Shrunk for every type; a case's own keywords override these.
BASE = dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=64,
            num_experts_per_tok=2, tie_word_embeddings=False)

# type -> (config class, causal LM class, keywords)
CASES = {
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", dict(num_local_experts=4)),
    "qwen2_moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM",
                  dict(num_experts=4, moe_intermediate_size=16,
                       shared_expert_intermediate_size=32)),
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", dict(num_experts=4,
                                                                moe_intermediate_size=16)),
    "olmoe": ("OlmoeConfig", "OlmoeForCausalLM", dict(num_experts=4)),
    "deepseek_v3": ("DeepseekV3Config", "DeepseekV3ForCausalLM",
                    dict(num_key_value_heads=4, n_routed_experts=8, n_shared_experts=1,
                         moe_intermediate_size=16, first_k_dense_replace=1, n_group=2, topk_group=1,
                         q_lora_rank=16, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8,
                         v_head_dim=8)),
    "deepseek_v2": ("DeepseekV2Config", "DeepseekV2ForCausalLM",
                    dict(num_key_value_heads=4, n_routed_experts=8, n_shared_experts=1,
                         moe_intermediate_size=16, first_k_dense_replace=1, n_group=2, topk_group=1,
                         q_lora_rank=16, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8,
                         v_head_dim=8)),
    "phimoe": ("PhimoeConfig", "PhimoeForCausalLM", dict(num_local_experts=4)),
    "granitemoe": ("GraniteMoeConfig", "GraniteMoeForCausalLM", dict(num_local_experts=4)),
    "glm4_moe": ("Glm4MoeConfig", "Glm4MoeForCausalLM",
                 dict(n_routed_experts=8, n_shared_experts=1, moe_intermediate_size=16,
                      first_k_dense_replace=1, n_group=2, topk_group=1)),
    "gpt_oss": ("GptOssConfig", "GptOssForCausalLM", dict(num_local_experts=4,
                                                          layer_types=None)),
    "qwen3_next": ("Qwen3NextConfig", "Qwen3NextForCausalLM",
                   dict(num_experts=4, moe_intermediate_size=16, shared_expert_intermediate_size=32,
                        linear_num_value_heads=4, linear_num_key_heads=2, linear_key_head_dim=8,
                        linear_value_head_dim=8, full_attention_interval=2)),
    "minimax": ("MiniMaxConfig", "MiniMaxForCausalLM", dict(num_local_experts=4)),
    "ernie4_5_moe": ("Ernie4_5_MoeConfig", "Ernie4_5_MoeForCausalLM",
                     dict(moe_num_experts=4, moe_k=2, moe_intermediate_size=16,
                          moe_layer_start_index=1)),
    "dots1": ("Dots1Config", "Dots1ForCausalLM",
              dict(n_routed_experts=8, n_shared_experts=1, moe_intermediate_size=16,
                   first_k_dense_replace=1, n_group=2, topk_group=1)),
    "flex_olmo": ("FlexOlmoConfig", "FlexOlmoForCausalLM", dict(num_experts=4, pad_token_id=1)),
    "hunyuan_v1_moe": ("HunYuanMoEV1Config", "HunYuanMoEV1ForCausalLM",
                       dict(num_experts=4, moe_topk=2, moe_intermediate_size=16)),
    "granitemoeshared": ("GraniteMoeSharedConfig", "GraniteMoeSharedForCausalLM",
                         dict(num_local_experts=4, shared_intermediate_size=32)),
    "jamba": ("JambaConfig", "JambaForCausalLM",
              dict(num_experts=4, expert_layer_period=2, expert_layer_offset=1,
                   attn_layer_period=2, attn_layer_offset=1, mamba_d_state=4, mamba_d_conv=4,
                   mamba_expand=2, mamba_dt_rank=4, use_mamba_kernels=False)),
    # Llama 4's experts are one batched matmul over every expert (no implementation to choose).
    "llama4_text": ("Llama4TextConfig", "Llama4ForCausalLM",
                    dict(num_local_experts=4, num_experts_per_tok=1, intermediate_size_mlp=64,
                         interleave_moe_layer_step=1, no_rope_layers=[1, 1]), ("default",)),
}
DTYPES = (torch.float32, torch.bfloat16)
IMPLS = ("grouped_mm", "eager")
# Fully matched grouped_mm / default cases (type x dtype) when this test was written; it may not
# fall.
FLOOR = 38
IDS = torch.arange(14).remainder(128).reshape(2, 7) * 5 % 128  # fixed input: 2 sequences of 7


def impls_of(kind):
    return CASES[kind][3] if len(CASES[kind]) > 3 else IMPLS


def config_for(kind, impl):
    config_cls, model_cls, extra = CASES[kind][:3]
    kwargs = dict(BASE, **extra)
    kwargs = {k: v for k, v in kwargs.items() if v is not None}
    config = getattr(transformers, config_cls)(**kwargs)
    if impl != "default":
        config._experts_implementation = impl
    return config, getattr(transformers, model_cls)


def first_tensor(out):
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
        return out[0]
    if isinstance(out, dict) and out:
        first = next(iter(out.values()))
        return first if isinstance(first, torch.Tensor) else None
    return None


def record_forward(model, ids):
    """{path: (shape, dtype)} of every module's last output on a forward of `ids`."""
    seen = {}

    def hook(path):
        def f(module, args, out):
            t = first_tensor(out)
            if t is not None:
                seen[path] = (tuple(t.shape), t.dtype)
        return f

    hooks = [m.register_forward_hook(hook(p)) for p, m in model.named_modules()]
    try:
        with torch.no_grad():
            model(ids)
    finally:
        for h in hooks:
            h.remove()
    return seen


def torch_fake_forward(config, model_cls, dtype, real):
    """What torch's FakeTensorMode does with the same forward: 'matches', 'differs at <path>' or
    the error's kind."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    logging.getLogger("torch._subclasses.fake_tensor").setLevel(logging.CRITICAL)  # its traces
    try:
        with warnings.catch_warnings(), FakeTensorMode(allow_non_fake_inputs=True):
            warnings.simplefilter("ignore")
            model = model_cls._from_config(config, dtype=dtype).eval()
            got = record_forward(model, IDS)
    except Exception as e:  # recorded, not required
        return type(e).__name__
    wrong = [p for p in real if got.get(p) != real[p]]
    return "matches" if not wrong else f"differs at {wrong[0]}"


def ancestors(path):
    parts = path.split(".")
    return [""] + [".".join(parts[:i]) for i in range(1, len(parts))]


def compare(real, scan):
    """(matched, data-dependent, problems) of a scan against a real forward's shapes."""
    matched, dd, problems = 0, 0, []
    for path, (shape, dtype) in real.items():
        m = scan.get(path)
        if m is None:
            if not any(a in scan and scan[a].data_dependent for a in ancestors(path)):
                problems.append(f"{path or '<root>'}: missing from the scan")
        elif m.data_dependent:
            dd += 1
            assert m.shape is None and m.dtype is None and m.bytes is None, m
        elif (m.shape, m.dtype) != (shape, dtype):
            problems.append(f"{path or '<root>'}: scan {m.shape} {m.dtype}, real {shape} {dtype}")
        else:
            matched += 1
    problems += [f"{p}: in the scan, not in the real forward" for p in scan if p not in real]
    return matched, dd, problems


def run_case(kind, dtype, impl):
    config, model_cls = config_for(kind, impl)
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        real_model = model_cls(config).to(dtype).eval()
        real = record_forward(real_model, IDS)
        with metaload.meta():
            meta_model = model_cls(config).to(dtype).eval()
    scan = metaload.scan(meta_model, IDS)
    assert all(p.is_meta for p in meta_model.parameters())
    assert all("forward" not in m.__dict__ for m in meta_model.modules())  # the scan's guards left
    matched, dd, problems = compare(real, scan)
    if impl != "eager":  # metaload.fake alone runs the same forward
        with metaload.fake("cpu"), torch.no_grad():
            logits = meta_model(IDS).logits
            got = (tuple(logits.shape), logits.dtype, metaload.is_fake(logits))
        if got != (real[""][0], real[""][1], True):
            problems.append(f"metaload.fake's logits {got}, real {real['']}")
    return real, scan, matched, dd, problems, torch_fake_forward(config, model_cls, dtype, real)


def buildable(kind):
    try:
        config, model_cls = config_for(kind, impls_of(kind)[0])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model_cls(config)
        return None
    except Exception as e:
        return f"{type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}"


@needs_transformers
def test_moe_models_scan_like_their_real_forward():
    rows, failures, unbuilt, full = [], [], {}, 0
    for kind in CASES:
        why = buildable(kind)
        if why is not None:
            unbuilt[kind] = why
            continue
        for dtype in DTYPES:
            for impl in impls_of(kind):
                try:
                    real, scan, matched, dd, problems, torch_fake = run_case(kind, dtype, impl)
                except Exception as e:
                    failures.append(f"{kind} {dtype} {impl}: {type(e).__name__}: {str(e)[:300]}")
                    rows.append((kind, dtype, impl, "-", "-", "error", "-"))
                    continue
                failures += [f"{kind} {dtype} {impl}: {p}" for p in problems]
                ok = not problems
                if impl != "eager":
                    if dd:
                        failures.append(f"{kind} {dtype} {impl}: data-dependent modules "
                                        f"{sorted(scan.data_dependent)[:4]}: its shapes are static")
                    full += ok and not dd
                else:
                    ok = ok and check_eager(kind, dtype, real, scan, failures)
                rows.append((kind, dtype, impl, f"{matched}/{len(real)}", dd,
                             "ok" if ok else "FAIL", torch_fake))
    print(f"\n{'type':<16} {'dtype':<15} {'impl':<11} {'matched':>8} {'data-dep':>8}  result  "
          "FakeTensorMode")
    for kind, dtype, impl, matched, dd, result, torch_fake in rows:
        print(f"{kind:<16} {str(dtype):<15} {impl:<11} {matched:>8} {dd:>8}  {result:<7} "
              f"{torch_fake}")
    for kind, why in unbuilt.items():
        print(f"{kind:<16} not built tiny: {why}")
    print(f"grouped_mm / default cases fully matched: {full} (floor {FLOOR})")
    assert not failures, "\n".join(failures)
    assert full >= FLOOR


def check_eager(kind, dtype, real, scan, failures):
    """The eager experts: the first MoE layer's experts module is data-dependent for nonzero, and
    every module that ran before it matched."""
    experts = [p for p in real if p.endswith(".experts") and p in scan]
    if not experts:
        failures.append(f"{kind} {dtype} eager: no experts module in the scan")
        return False
    first = experts[0]
    reason = scan[first].data_dependent or ""
    if "aten::nonzero" not in reason:
        failures.append(f"{kind} {dtype} eager: {first} not data-dependent for aten::nonzero "
                        f"({scan[first]})")
        return False
    order = list(scan)
    before = [p for p in order[:order.index(first)] if not scan[p].data_dependent]
    if not before or any(scan[p].data_dependent for p in order[:order.index(first)]):
        failures.append(f"{kind} {dtype} eager: modules before {first} are not all exact")
        return False
    return True


def test_grouped_mm_on_fake_cpu_checks_as_the_cpu_kernel_does():
    """torch._grouped_mm under fake('cpu'): float32 and float16 (the CPU kernel multiplies them,
    torch's Meta kernel takes bf16 only), the real kernel's result shape; a float64 or a stride
    that is not a multiple of 16 bytes is an error as it is on real cpu tensors."""
    if not hasattr(torch, "_grouped_mm"):
        pytest.skip("this torch has no _grouped_mm")
    offs = torch.tensor([2, 4, 6], dtype=torch.int32)
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        a, b = torch.randn(6, 8, dtype=dtype), torch.randn(3, 16, 8, dtype=dtype).transpose(-2, -1)
        real = torch._grouped_mm(a, b, offs=offs)
        with metaload.fake("cpu"):
            fa, fb = torch.empty(6, 8, dtype=dtype), torch.empty(3, 16, 8, dtype=dtype)
            fo = torch.empty(3, dtype=torch.int32)
            out = torch._grouped_mm(fa, fb.transpose(-2, -1), offs=fo)
            assert metaload.is_fake(out)
        assert (tuple(out.shape), out.dtype, out.device) == (tuple(real.shape), real.dtype,
                                                             real.device)
    with pytest.raises(RuntimeError):
        torch._grouped_mm(torch.randn(6, 8, dtype=torch.float64),
                          torch.randn(3, 8, 16, dtype=torch.float64), offs=offs)
    with metaload.fake("cpu"), pytest.raises(metaload.ShapeError, match="Float32"):
        torch._grouped_mm(torch.empty(6, 8, dtype=torch.float64),
                          torch.empty(3, 8, 16, dtype=torch.float64), offs=offs)
    with pytest.raises(RuntimeError, match="16 bytes"):
        torch._grouped_mm(torch.randn(6, 4), torch.randn(3, 4, 5), offs=offs)
    with metaload.fake("cpu"), pytest.raises(metaload.ShapeError, match="16 bytes"):
        torch._grouped_mm(torch.empty(6, 4), torch.empty(3, 4, 5), offs=offs)


def test_one_hot_of_fake_tensors():
    """F.one_hot with num_classes: [*shape, num_classes] int64 without reading the values (libtorch
    reads min() of any tensor not on the Meta backend); num_classes=-1 needs max():
    data-dependent."""
    idx = torch.tensor([[0, 3], [1, 2], [3, 3]])
    real = torch.nn.functional.one_hot(idx, num_classes=5)
    for device in ("cpu", "cuda"):
        with metaload.fake(device):
            x = torch.empty(3, 2, dtype=torch.long)
            out = torch.nn.functional.one_hot(x, num_classes=5)
            assert metaload.is_fake(out)
            assert (tuple(out.shape), out.dtype, out.stride()) == (tuple(real.shape), real.dtype,
                                                                   real.stride())
            assert out.device == torch.device(device if device == "cpu" else "cuda:0")
            with pytest.raises(metaload.DataDependentError, match="num_classes"):
                torch.nn.functional.one_hot(x)
            with pytest.raises(RuntimeError, match="LongTensor"):
                torch.nn.functional.one_hot(x.int(), num_classes=5)
    with metaload.fake("cpu"):  # a real index tensor: a fake result, as every op inside fake()
        out = torch.nn.functional.one_hot(idx, num_classes=5)
        assert metaload.is_fake(out) and tuple(out.shape) == (3, 2, 5)
        with metaload.real():  # real() inside fake(): torch's own one_hot, values and all
            assert torch.equal(torch.nn.functional.one_hot(idx, num_classes=5), real)


def test_histc_of_integers_on_fake_cuda():
    """transformers' grouped_mm routing counts tokens per expert with histc of int32 expert ids on
    cuda (CUDA counts integers, the result in their dtype) and of float ids on cpu (CPU refuses
    integers, as a real run does)."""
    with metaload.fake("cuda"):
        ids = torch.empty(14, dtype=torch.int32)
        counts = torch.histc(ids, bins=4, min=0, max=3)
        assert (tuple(counts.shape), counts.dtype, str(counts.device)) == ((4,), torch.int32,
                                                                           "cuda:0")
        assert ids.histc(bins=4, min=0, max=3).dtype == torch.int32
        assert torch.histc(ids.float(), bins=4, min=0, max=3).dtype == torch.float32
        with pytest.raises(metaload.ShapeError, match="max must be larger than min"):
            torch.histc(ids, bins=4, min=3, max=1)
    with pytest.raises(RuntimeError, match="Int"):
        torch.histc(torch.zeros(14, dtype=torch.int32), bins=4, min=0, max=3)
    with metaload.fake("cpu"), pytest.raises(metaload.ShapeError, match="Int"):
        torch.histc(torch.empty(14, dtype=torch.int32), bins=4, min=0, max=3)


class Out(collections.OrderedDict):
    """What a transformers ModelOutput is to a scan: a mapping of the fields that are set."""


class EagerMoE(torch.nn.Module):
    """transformers' eager experts in plain torch: loops over the experts the router hit."""

    def __init__(self, hidden=8, experts=4, top_k=2):
        super().__init__()
        self.gate = torch.nn.Linear(hidden, experts, bias=False)
        self.experts = torch.nn.ModuleList(torch.nn.Linear(hidden, hidden) for _ in range(experts))
        self.act = torch.nn.SiLU()
        self.top_k, self.n = top_k, experts

    def forward(self, x):
        weights, picked = self.gate(x).softmax(-1).topk(self.top_k, dim=-1)
        out = torch.zeros_like(x)
        mask = torch.nn.functional.one_hot(picked, num_classes=self.n).permute(2, 1, 0)
        for e in (mask.sum(dim=(-1, -2)) > 0).nonzero():
            slot, token = torch.where(mask[e[0]])
            y = self.act(self.experts[e[0]](x[token])) * weights[token, slot, None]
            out.index_add_(0, token, y)
        return out


class Toy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(16, 8)
        self.moe = EagerMoE()
        self.head = torch.nn.Linear(8, 16)
        self.side = torch.nn.Linear(8, 3)

    def forward(self, ids):
        h = self.embed(ids)
        side = self.side(h)  # before the MoE and not from it: exact
        h = self.moe(h)
        a, b = h.chunk(2)  # unpacking a stand-in still works here; a tuple from a module is next
        return Out(logits=self.head(torch.cat([a, b])), side=side)


def test_scan_marks_data_dependent_modules_and_goes_on():
    """An eager MoE: nonzero inside moe is data-dependent, so moe, the head (fed by it) and the
    whole model are marked with that reason, no shape; embed, side and moe.gate (the router, before
    the loop) are exact; the experts and act inside the loop never ran. The root's output is a
    mapping (transformers' ModelOutput): its first tensor counts."""
    torch.manual_seed(0)
    ids = torch.arange(6) % 16
    real_model = Toy().eval()
    with torch.no_grad():
        real_out = real_model(ids)
    with metaload.meta():
        model = Toy().eval()
    s = metaload.scan(model, ids)
    assert set(s.data_dependent) == {"moe", "head", ""}
    for path in s.data_dependent:
        assert "aten::nonzero" in s.data_dependent[path] and "moe" in s.data_dependent[path]
        assert (s[path].shape, s[path].dtype, s[path].device, s[path].bytes) == (None,) * 4
    assert (s["embed"].shape, s["side"].shape, s["moe.gate"].shape) == ((6, 8), (6, 3), (6, 4))
    assert "moe.act" not in s and "moe.experts.0" not in s
    assert s.total_bytes == (6 * 8 + 6 * 3 + 6 * 4) * 4
    assert "data-dependent" in repr(s)
    assert all("forward" not in m.__dict__ for m in model.modules())
    assert tuple(real_out["logits"].shape) == (6, 16)
    # Without the MoE, the mapping's first tensor is the root's output.
    with metaload.meta():
        plain = torch.nn.Embedding(16, 8)
    wrapped = torch.nn.Module()
    wrapped.embed = plain
    wrapped.forward = lambda ids: Out(hidden=wrapped.embed(ids), ids=ids)
    s = metaload.scan(wrapped, ids)
    assert (s[""].shape, s[""].dtype, s.data_dependent) == ((6, 8), torch.float32, {})
    with metaload.fake("cpu"), pytest.raises(metaload.DataDependentError, match="nonzero"):
        model(ids)  # outside a scan a data-dependent op stays an error


def test_scan_error_without_data_dependence_is_raised():
    """A module that fails for another reason (a shape mismatch) is not data-dependent: the scan
    raises that error as before."""
    class Bad(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(4, 4)

        def forward(self, x):
            return self.a(x.reshape(2, 5))

    with metaload.meta():
        model = Bad()
    with pytest.raises((metaload.Error, RuntimeError)):
        metaload.scan(model, torch.empty(10))
    assert all("forward" not in m.__dict__ for m in model.modules())
