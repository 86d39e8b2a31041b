"""Non-persistent buffers metaload has no values for, computed as from_pretrained does: by the
transformers model's own _init_weights of the module holding them (python/metaload/_buffer_init.py).

A buffer of more than 4096 elements made under metaload.meta() (a position or sinusoid table) has
no values; no checkpoint holds it. Before, load_into failed with a MismatchError naming it; a
transformers model's init now computes it, and only an init that sets it the same way twice counts.
"""
import os

import pytest
import torch

transformers = pytest.importorskip(
    "transformers", reason="transformers 5.x is installed in the torch 2.x environment only")

import metaload  # noqa: E402

ROWS, COLS = 80, 64  # 5120 elements: above the 4096 a meta() tensor keeps values for


class TinyConfig(transformers.PretrainedConfig):
    model_type = "metaload-buffer-init-test"

    def __init__(self, init="sets", **kw):
        self.init = init
        super().__init__(**kw)


class Table(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(COLS, 4)
        self.register_buffer("table", torch.zeros(ROWS, COLS), persistent=False)


class TinyModel(transformers.PreTrainedModel):
    config_class = TinyConfig

    def __init__(self, config):
        super().__init__(config)
        self.inner = Table()
        self.post_init()

    def _init_weights(self, module):
        if isinstance(module, Table):
            if self.config.init == "sets":
                module.table.copy_(torch.arange(ROWS * COLS, dtype=torch.float32).view(ROWS, COLS))
            elif self.config.init == "draws":
                module.table.normal_()
            # "skips": leaves it as it is
            torch.nn.init.normal_(module.proj.weight)  # a parameter write: must change nothing


def _checkpoint(tmp_path):
    d = str(tmp_path)
    w = {"inner.proj.weight": torch.randn(4, COLS), "inner.proj.bias": torch.randn(4)}
    metaload.save_file(w, os.path.join(d, "model.safetensors"))
    return d, w


def _meta(init):
    with metaload.meta():
        return TinyModel(TinyConfig(init=init))


def test_a_buffer_the_init_sets_is_computed_and_loaded(tmp_path):
    d, w = _checkpoint(tmp_path)
    model = _meta("sets")
    assert model.inner.table.is_meta
    report = metaload.load_into(model, d, progress=False)
    assert "inner.table" in report.computed_keys
    want = torch.arange(ROWS * COLS, dtype=torch.float32).view(ROWS, COLS)
    assert torch.equal(model.inner.table, want)
    # The parameters are the checkpoint's, not what the init wrote on its twin.
    assert torch.equal(model.inner.proj.weight, w["inner.proj.weight"])


@pytest.mark.parametrize("init", ["skips", "draws"])
def test_a_buffer_the_init_skips_or_draws_stays_unknown(tmp_path, init):
    """No values unless the init sets them, and the same way twice: a MismatchError naming the
    buffer, and nothing loaded."""
    d, _ = _checkpoint(tmp_path)
    model = _meta(init)
    with pytest.raises(metaload.MismatchError) as e:
        metaload.load_into(model, d, progress=False)
    assert "inner.table" in str(e.value) and "non-persistent buffer" in str(e.value)
    assert all(p.is_meta for p in model.parameters())
