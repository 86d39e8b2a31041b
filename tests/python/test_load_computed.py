"""load_into and the tensors no checkpoint holds: non-persistent buffers computed by a constructor
(as transformers' rotary inv_freq), and checkpoint names renamed on load (key_mapping).

Under metaload.meta() a small buffer made from constants keeps its values (c10_ext/values.h);
load_into makes it a real tensor on the load's device, in its own dtype, in the same
all-or-nothing step as the checkpoint's tensors. Runs on both torches (no transformers needed).
"""
import pytest
import torch

import metaload
from metaload.checkpoint import save_safetensors


class Rotary(torch.nn.Module):
    def __init__(self, dim=8):
        super().__init__()
        self.proj = torch.nn.Linear(dim, dim)
        self.norm = torch.nn.LayerNorm(dim)
        inv = 1.0 / (10000 ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
        self.register_buffer("inv_freq", inv, persistent=False)
        self.register_buffer("scale", torch.tensor(2.5, dtype=torch.float64), persistent=False)
        # Not made from constants: no values under metaload.meta() (a weight-like buffer).
        self.register_buffer("noise", torch.empty(3), persistent=False)

    def forward(self, x):
        return self.norm(self.proj(x)) * self.scale + self.inv_freq.sum()


def _without_noise(m):
    del m._buffers["noise"]
    m._non_persistent_buffers_set.discard("noise")
    return m


@pytest.fixture
def ckpt(tmp_path):
    torch.manual_seed(0)
    ref = _without_noise(Rotary())
    path = str(tmp_path / "rotary.safetensors")
    save_safetensors(path, {k: v.contiguous() for k, v in ref.state_dict().items()})
    return ref, path


def _meta_model(noise=False):
    with metaload.meta():
        m = Rotary()
    return m if noise else _without_noise(m)


def test_computed_buffers_take_their_values(ckpt):
    ref, path = ckpt
    m = _meta_model()
    inv_before = m.inv_freq
    assert m.inv_freq.is_meta and m.scale.is_meta
    report = metaload.load_into(m, path, progress=False)
    assert sorted(report.computed_keys) == ["inv_freq", "scale"]
    assert report.missing_keys == []
    assert m.inv_freq is inv_before  # the same object, now real (references held elsewhere see it)
    for name, t in list(m.named_parameters()) + list(m.named_buffers()):
        assert not t.is_meta, name
    assert torch.equal(m.inv_freq, ref.inv_freq) and m.inv_freq.dtype == torch.float32
    assert m.scale.dtype == torch.float64 and m.scale.item() == 2.5
    x = torch.randn(2, 8)
    assert torch.equal(m(x), ref(x))


def test_dtype_converts_checkpoint_tensors_only(ckpt):
    _, path = ckpt
    m = _meta_model()
    metaload.load_into(m, path, dtype=torch.bfloat16, progress=False)
    assert m.proj.weight.dtype == torch.bfloat16
    assert m.inv_freq.dtype == torch.float32 and m.scale.dtype == torch.float64


def test_unknown_values_are_missing(ckpt):
    _, path = ckpt
    m = _meta_model(noise=True)
    with pytest.raises(metaload.MismatchError) as e:
        metaload.load_into(m, path, progress=False)
    assert e.value.missing == ["noise"]
    assert "non-persistent buffer" in str(e.value) and "values are unknown" in str(e.value)
    # all or nothing: the failed load changed nothing
    assert m.proj.weight.is_meta and m.inv_freq.is_meta and m.noise.is_meta

    report = metaload.load_into(m, path, strict=False, progress=False)
    assert report.missing_keys == ["noise"]
    assert sorted(report.computed_keys) == ["inv_freq", "scale"]
    assert m.noise.is_meta and not m.inv_freq.is_meta and not m.proj.weight.is_meta


def test_real_buffers_stay_or_move(ckpt):
    ref, path = ckpt
    m = _without_noise(Rotary())  # built on the CPU: its buffers are real already
    inv = m.inv_freq
    report = metaload.load_into(m, path, progress=False)
    assert report.computed_keys == []  # nothing to do: they are where the load puts the rest
    assert m.inv_freq is inv and torch.equal(m.inv_freq, ref.inv_freq)
    assert torch.equal(m.proj.weight, ref.proj.weight)


def test_checkpoint_tensor_of_a_computed_name_is_unexpected(ckpt, tmp_path):
    ref, _ = ckpt
    path = str(tmp_path / "with_inv.safetensors")
    sd = {k: v.contiguous() for k, v in ref.state_dict().items()}
    sd["inv_freq"] = torch.zeros(4)  # as old transformers checkpoints stored it
    save_safetensors(path, sd)
    with pytest.raises(metaload.MismatchError) as e:
        metaload.load_into(_meta_model(), path, progress=False)
    assert e.value.unexpected == ["inv_freq"] and e.value.missing == []
    m = _meta_model()
    report = metaload.load_into(m, path, strict=False, progress=False)
    assert report.unexpected_keys == ["inv_freq"]
    assert torch.equal(m.inv_freq, ref.inv_freq)  # the values, not the checkpoint's zeros


def test_key_mapping_renames_checkpoint_names(ckpt, tmp_path):
    ref, _ = ckpt
    path = str(tmp_path / "renamed.safetensors")
    save_safetensors(path, {("out." + k[len("proj."):] if k.startswith("proj.") else k):
                            v.contiguous() for k, v in ref.state_dict().items()})
    with pytest.raises(metaload.MismatchError) as e:
        metaload.load_into(_meta_model(), path, progress=False)
    assert sorted(e.value.missing) == ["proj.bias", "proj.weight"]
    m = _meta_model()
    metaload.load_into(m, path, key_mapping={r"^out\.": "proj."}, progress=False)
    assert torch.equal(m.proj.weight, ref.proj.weight) and torch.equal(m.proj.bias, ref.proj.bias)

    m = _meta_model()
    report = metaload.load_into(m, path, key_mapping={r"^out\.": "proj.", r"^norm\.bias$": "x"},
                                strict=False, progress=False)
    assert report.missing_keys == ["norm.bias"] and report.unexpected_keys == ["norm.bias"]
    assert torch.equal(m.proj.weight, ref.proj.weight) and m.norm.bias.is_meta

    with pytest.raises(metaload.PlanError, match="maps both 'out.bias' and 'out.weight'"):
        metaload.load_into(_meta_model(), path, key_mapping={r"^out\..*": "proj.weight"},
                           progress=False)
