"""Small random tensors inside metaload.meta() keep the values an eager run draws
(c10_ext/random_draws.h), on torch 1.13 and 2.x:

- a constructor that computes a buffer from a small random draw (torch.linalg.qr(torch.randn(8, 8)),
  the seed scenario that init_empty_weights and torch.device("meta") cannot build) builds, and the
  buffer equals the eager build's under the same seed, bitwise; so does the generator's state
  after the build when nothing was skipped;
- once a draw was skipped (a weight's random init on meta draws nothing where the eager run
  advances the generator), random tensors get no values -- reading one is a DataDependentError
  saying why -- until torch.manual_seed puts the generator back in step;
- a draw for another device or from a generator of the caller's gets no values and leaves the
  default generator as it was; a large random factory draws nothing and counts as skipped.
"""
import pytest
import torch

import metaload
from metaload import _lib


class QrFirst(torch.nn.Module):
    """The seed scenario: a buffer from a random draw, then a layer whose init draws."""

    def __init__(self):
        super().__init__()
        q, _ = torch.linalg.qr(torch.randn(8, 8))
        self.register_buffer("rotation", q)
        self.noise = torch.nn.Parameter(torch.rand(3, 4))
        self.proj = torch.nn.Linear(128, 128)  # 16384 weights: skipped on meta


class QrAfterInit(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(128, 128)
        q, _ = torch.linalg.qr(torch.randn(8, 8))
        self.register_buffer("rotation", q)


def values(t):
    return _lib.load().values_of(t)


def in_step():
    return bool(_lib.load().random_draws_in_step())


def test_the_seed_scenario_builds_with_the_eager_buffer():
    torch.manual_seed(1234)
    eager = QrFirst()
    torch.manual_seed(1234)
    with metaload.meta():
        lazy = QrFirst()
        assert lazy.rotation.is_meta and lazy.noise.is_meta and lazy.proj.weight.is_meta
        listed = lazy.rotation.tolist()  # read inside the build, as a constructor would
    assert torch.equal(values(lazy.rotation), eager.rotation)
    assert listed == eager.rotation.tolist()
    assert torch.equal(values(lazy.noise), eager.noise.detach())
    # the Linear's init was skipped: the generator is out of step now, and says so
    assert not in_step()


def test_the_generator_state_matches_eager_when_nothing_was_skipped():
    def build():
        q, _ = torch.linalg.qr(torch.randn(8, 8))
        return q, torch.randint(0, 100, (5,)), torch.randperm(7)
    torch.manual_seed(7)
    eager = build()
    after_eager = torch.get_rng_state()
    torch.manual_seed(7)
    with metaload.meta():
        lazy = build()
    assert all(t.is_meta for t in lazy)
    for a, b in zip(lazy, eager):
        assert torch.equal(values(a), b)
    assert torch.equal(torch.get_rng_state(), after_eager)
    assert in_step()


def test_after_a_skipped_draw_random_tensors_have_no_values_until_reseeded():
    torch.manual_seed(3)
    with metaload.meta():
        model = QrAfterInit()
        assert not in_step()
        with pytest.raises(metaload.DataDependentError, match="seeded again"):
            model.rotation.tolist()
        with pytest.raises(RuntimeError, match="seeded again"):  # typed when the `with` exits
            torch.randn(2).sum().item()
    torch.manual_seed(3)  # in step again: what an eager QrFirst draws first
    assert in_step()
    eager = QrFirst()
    torch.manual_seed(3)
    with metaload.meta():
        again = QrFirst()
    assert torch.equal(values(again.rotation), eager.rotation)


def test_a_large_random_factory_draws_nothing_and_counts_as_skipped():
    torch.manual_seed(5)
    before = torch.get_rng_state()
    with metaload.meta():
        big = torch.randn(100, 100)
    assert big.is_meta and values(big) is None
    assert torch.equal(torch.get_rng_state(), before)
    assert not in_step()
    torch.manual_seed(5)


def test_other_devices_and_own_generators_get_no_values_and_leave_the_default_generator():
    torch.manual_seed(11)
    before = torch.get_rng_state()
    g = torch.Generator().manual_seed(0)
    with metaload.meta():
        on_cuda = torch.randn(4, device="cuda")
        own = torch.randn(4, generator=g)
        explicit_meta = torch.randn(4, device="meta")
    assert values(on_cuda) is None and values(own) is None and values(explicit_meta) is None
    assert torch.equal(torch.get_rng_state(), before)
    assert in_step(), "the default CPU generator drew nothing an eager run would have drawn"


def test_seeding_inside_the_scope_counts_too():
    with metaload.meta():
        torch.randn(100, 100)
        assert not in_step()
        torch.manual_seed(9)
        assert in_step()
        drawn = torch.rand(3)
    torch.manual_seed(9)
    assert torch.equal(values(drawn), torch.rand(3))
