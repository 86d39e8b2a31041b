"""metaload.meta() / metaload.real() from Python: factories, conversions, modules, threads, errors."""
import contextlib
import os
import shutil
import subprocess
import sys
import threading

import numpy as np
import pytest
import torch

import metaload
from conftest import (CUDA_INIT_COUNTER, ROOT, assert_cuda_initialised_by_real_requests_only,
                      lib_path, run_python)


def test_every_factory_lands_on_meta():
    real = torch.ones(2, 3)
    with metaload.meta():
        made = {
            "empty": torch.empty(4, 4),
            "empty cuda": torch.empty(4, 4, device="cuda"),
            "empty_strided": torch.empty_strided((2, 3), (1, 2)),
            "zeros": torch.zeros(1000, 1000),
            "ones": torch.ones(3, dtype=torch.half, device="cuda:1"),
            "full": torch.full((2, 2), 7.0),
            "rand": torch.rand(5),
            "randn": torch.randn(5, device="cuda"),
            "randint": torch.randint(10, (5,)),
            "arange": torch.arange(10),
            "linspace": torch.linspace(0, 1, 5),
            "eye": torch.eye(4),
            "scalar_tensor": torch.scalar_tensor(3.5),
            "empty_like": torch.empty_like(real),
            "zeros_like": torch.zeros_like(real, device="cuda"),
            "ones_like": torch.ones_like(real),
            "rand_like": torch.rand_like(real),
            "randn_like": torch.randn_like(real),
            "full_like": torch.full_like(real, 2),
            "new_zeros": real.new_zeros(3),
            "new_tensor": real.new_tensor([1, 2]),
            "tensor": torch.tensor([[1.0, 2.0], [3.0, 4.0]]),
            "tensor cuda": torch.tensor([1, 2, 3], device="cuda"),
            "as_tensor": torch.as_tensor([1, 2, 3]),
            "from_numpy": torch.from_numpy(np.arange(12.0).reshape(3, 4)),
        }
    for name, t in made.items():
        assert t.is_meta, name
    assert made["ones"].dtype == torch.half
    assert made["from_numpy"].shape == (3, 4) and made["from_numpy"].dtype == torch.float64
    assert made["tensor"].shape == (2, 2)
    assert made["tensor cuda"].dtype == torch.int64
    assert not real.is_meta


def test_every_conversion_lands_on_meta():
    real = torch.arange(6.0).reshape(2, 3)
    other = torch.zeros(1, dtype=torch.float16)
    with metaload.meta():
        outs = {
            "to cuda": real.to("cuda"),
            "to device": real.to(torch.device("cuda", 1)),
            "to int": real.to(0),
            "to kw": real.to(device="cuda", dtype=torch.bfloat16),
            "cuda": real.cuda(),
            "cpu": real.cpu(),
            "to other": real.to(other),
            "pin_memory": real.pin_memory(),
            "to dtype": real.to(torch.float64).cuda(),
        }
    for name, t in outs.items():
        assert t.is_meta, name
    assert outs["to kw"].dtype == torch.bfloat16
    assert outs["to other"].dtype == torch.float16
    assert outs["cuda"].shape == (2, 3)


def test_module_constructors_and_moves_build_on_meta():
    with metaload.meta():
        mods = [
            torch.nn.Linear(4096, 4096),
            torch.nn.Conv2d(64, 128, 3),
            torch.nn.BatchNorm2d(128),
            torch.nn.Embedding(50000, 1024),
            torch.nn.LayerNorm(1024),
            torch.nn.TransformerEncoderLayer(512, 8),
            torch.nn.LSTM(128, 256, num_layers=2),
            torch.nn.Linear(16, 16, device="cuda"),
        ]
        moved = torch.nn.Linear(8, 8).cuda().half()
    for m in mods + [moved]:
        for name, t in list(m.named_parameters()) + list(m.named_buffers()):
            assert t.is_meta, (type(m).__name__, name)
    assert moved.weight.dtype == torch.half


def test_in_place_initialisation_of_meta_tensors_is_a_silent_no_op():
    real = torch.ones(8, 8)
    with metaload.meta():
        w = torch.empty(256, 256)
        with torch.no_grad():
            w.uniform_(-1, 1)
            w.normal_()
            w.zero_()
            w.fill_(3)
            torch.nn.init.kaiming_uniform_(w, a=5 ** 0.5)
            torch.nn.init.kaiming_normal_(w)
            torch.nn.init.xavier_uniform_(w)
            torch.nn.init.xavier_normal_(w)
            torch.nn.init.trunc_normal_(w, std=0.02)
            torch.nn.init.orthogonal_(w)
            small = torch.empty(8, 8)
            small.copy_(real)
        assert w.is_meta and small.is_meta
    assert torch.equal(real, torch.ones(8, 8))


def test_real_suspends_forcing_and_meta_forces_again_inside():
    assert not metaload.is_forcing()
    with metaload.meta():
        assert metaload.is_forcing()
        assert torch.zeros(2).is_meta
        with metaload.real():
            assert not metaload.is_forcing()
            assert torch.zeros(2).device.type == "cpu"
            with metaload.meta():
                assert torch.zeros(2).is_meta
            assert torch.zeros(2).device.type == "cpu"
        assert torch.zeros(2).is_meta
    assert not metaload.is_forcing()
    assert torch.zeros(2).device.type == "cpu"


def test_state_is_restored_when_an_exception_passes():
    with pytest.raises(ValueError):
        with metaload.meta():
            with metaload.real():
                with metaload.meta():
                    raise ValueError("boom")
    assert not metaload.is_forcing()
    assert torch.zeros(2).device.type == "cpu"
    with metaload.meta():
        with pytest.raises(ValueError):
            with metaload.real():
                raise ValueError("boom")
        assert metaload.is_forcing()


def test_forcing_in_one_thread_never_affects_another():
    wrong = []

    def build(forced):
        for _ in range(10):
            ctx = metaload.meta() if forced else metaload.real()
            with ctx:
                net = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(),
                                          torch.nn.Linear(128, 64), torch.nn.LayerNorm(64))
                if any(p.is_meta != forced for p in net.parameters()):
                    wrong.append(forced)

    threads = [threading.Thread(target=build, args=(i % 2 == 0,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert wrong == []


@pytest.mark.parametrize("read,op", [
    (lambda t: t.sum().item(), "item()"),
    (lambda t: t.tolist(), "tolist"),
    (lambda t: t.numpy(), "numpy"),
    (lambda t: t.nonzero(), "aten::nonzero"),
    (lambda t: t.masked_select(t > 0), "aten::masked_select"),
    (lambda t: torch.unique(t), "unique"),
    (lambda t: float(t.sum()), "aten::item"),
    (lambda t: bool(t.sum() > 0), "aten::is_nonzero"),
    (lambda t: torch.equal(t, t.clone()), "aten::equal"),
])
def test_data_dependent_reads_raise_a_typed_error_naming_the_op(read, op):
    # Inside the block: tolist() and numpy() raise it typed (Python wraps them), the reads that
    # torch's bindings turn into RuntimeError carry the kind in their message ...
    with metaload.meta():
        t = torch.zeros(3)
        with pytest.raises(RuntimeError) as inside:
            read(t)
    assert isinstance(inside.value, metaload.DataDependentError) or \
        str(inside.value).startswith("[metaload.DataDependentError] ")
    # ... and the `with` statement re-raises every one of them typed.
    with pytest.raises(metaload.DataDependentError) as info:
        with metaload.meta():
            read(torch.zeros(3))
    assert op in str(info.value)
    assert "metaload.real()" in str(info.value) or "RealGuard" in str(info.value)
    assert isinstance(info.value, metaload.Error) and isinstance(info.value, RuntimeError)
    assert info.value.__traceback__ is not None  # where in the block it happened


def test_tolist_and_numpy_of_meta_tensors_are_typed_inside_the_block():
    with metaload.meta():
        t = torch.zeros(3)
        for read in (lambda: t.tolist(), lambda: t.numpy(), lambda: np.asarray(t)):
            with pytest.raises(metaload.DataDependentError, match="reads the values"):
                read()
    # outside any scope torch's own methods are back, with torch's own errors
    assert "tolist" not in vars(torch.Tensor) and "numpy" not in vars(torch.Tensor)
    with pytest.raises(RuntimeError) as info:
        torch.zeros(3, device="meta").tolist()
    assert not isinstance(info.value, metaload.Error)


def test_errors_that_are_not_metaloads_pass_through_the_block_unchanged():
    with pytest.raises(RuntimeError, match="size mismatch|must match the size|broadcast") as info:
        with metaload.meta():
            torch.zeros(3) + torch.zeros(4)
    assert not isinstance(info.value, metaload.Error)
    with pytest.raises(KeyError):
        with metaload.meta():
            {}["x"]


def test_printing_a_forced_tensor_shows_no_values_and_does_not_crash():
    with metaload.meta():
        t = torch.zeros(3)
        text = repr(t)
    assert "meta" in text and "size=(3,)" in text


def test_forcing_stats_count_tensors_and_bytes():
    metaload.reset_forcing_stats()
    with metaload.meta():
        torch.zeros(1024, 1024)  # 4 MiB
        torch.zeros(10, device="meta")  # asked for meta: not a saving
    tensors, nbytes = metaload.forcing_stats()
    assert tensors == 1 and nbytes == 4 * 1024 * 1024


def test_no_effect_outside_the_mode():
    m = torch.nn.Linear(4, 4)
    assert m.weight.device.type == "cpu"
    assert torch.tensor([1.0, 2.0]).sum().item() == 3.0


def test_import_without_library_is_a_clear_import_error():
    r = run_python("import metaload", env={"METALOAD_LIB": "/nonexistent/libmetaload.so"})
    assert r.returncode != 0
    assert "libmetaload.so" in r.stderr


RSS_PROBE = """
import gc, torch, torchvision, metaload
def rss():
    with open('/proc/self/statm') as f:
        return int(f.read().split()[1]) * 4096
torchvision.models.resnet18()  # warm up code paths and allocator caches
with metaload.meta():
    torchvision.models.resnet18()
gc.collect()
before = rss()
with metaload.meta():
    m = torchvision.models.resnet50()
gc.collect()
after = rss()
assert all(p.is_meta for p in m.parameters())
print(after - before)
"""


def test_building_resnet50_grows_rss_by_less_than_8_mb():
    r = run_python(RSS_PROBE)
    assert r.returncode == 0, r.stderr
    growth = int(r.stdout.strip().splitlines()[-1])
    print(f"resnet50 under metaload.meta(): RSS +{growth / 2**20:.2f} MiB")
    assert growth < 8 * 2**20


def test_value_typed_factories_get_the_dtypes_of_a_real_run():
    # torch 1.13's own Python meta kernels say int64 for arange(16.) and float32 for full(.., 7).
    with metaload.meta():
        forced = [torch.arange(16.), torch.arange(0, 2.5), torch.arange(5), torch.full((2,), 7),
                  torch.full((2,), True), torch.full((2,), 1.5)]
    real = [torch.arange(16.), torch.arange(0, 2.5), torch.arange(5), torch.full((2,), 7),
            torch.full((2,), True), torch.full((2,), 1.5)]
    for f, r in zip(forced, real):
        assert f.is_meta and (f.dtype, f.shape) == (r.dtype, r.shape)


def _copy_of_the_library(tmp_path):
    copy = tmp_path / "copy" / "libmetaload.so"
    copy.parent.mkdir()
    shutil.copyfile(lib_path(), copy)
    return str(copy)


SECOND_COPY_STILL_WORKS = """
import torch, metaload
with metaload.meta():
    assert torch.zeros(2).is_meta and torch.nn.Linear(2, 2).weight.is_meta
with metaload.real():
    assert torch.zeros(2).device.type == 'cpu'
print('ok')
"""


def test_loading_a_second_copy_never_aborts_the_process(tmp_path):
    copy = _copy_of_the_library(tmp_path)
    # A second copy through torch.ops.load_library, after the package loaded the first.
    r = run_python(f"import torch, metaload\ntorch.ops.load_library({copy!r})\n" +
                   SECOND_COPY_STILL_WORKS)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["ok"]
    assert "another copy of libmetaload is already loaded" in r.stderr and copy in r.stderr
    # One copy preloaded, the package's (METALOAD_LIB) loaded after it: the first one serves.
    r = run_python(SECOND_COPY_STILL_WORKS, env={"LD_PRELOAD": copy})
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["ok"]
    assert "another copy of libmetaload is already loaded" in r.stderr


LOAD_WARNING = """
import warnings, torch
# Another library defined one of metaload's operators first: registering that file's operators
# fails while the library loads, which is a warning, never an abort.
lib = torch._C._dispatch_library("FRAGMENT", "metaload", "")
lib.define("swap_tensors(Tensor x) -> Tensor")
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import metaload
ours = [w for w in caught if "registering operators from" in str(w.message)]
print(len(ours), ours[0].category.__name__ if ours else "-")
print(str(ours[0].message) if ours else "-")
"""


def test_a_warning_of_the_load_reaches_pythons_warnings():
    # Kept by the library (it happened inside dlopen, where no Python caller could catch it) and
    # raised by the package right after loading it: `warnings` sees it, stderr does not.
    r = run_python(LOAD_WARNING)
    assert r.returncode == 0, r.stderr
    first, message = r.stdout.split("\n", 1)  # torch's message may span lines
    assert first == "1 UserWarning", r.stdout
    assert "swap.cc" in message and "failed" in message and "swap_tensors" in message, message
    assert "Exception raised from" not in message  # torch's message, without its backtrace
    assert "registering operators from" not in r.stderr


def test_key_taken_before_the_library_loads_is_a_mode_error_not_an_abort():
    code = """
import torch
lib = torch._C._dispatch_library("IMPL", "_", "DeferredInit")
lib.fallback_fallthrough()  # another library owns the mode's dispatch key
import metaload
assert not metaload.ops.mode_key_registered()
try:
    with metaload.meta():
        pass
except metaload.ModeError as e:
    print("ModeError", "DeferredInit" in str(e), "already" in str(e))
assert torch.zeros(2).device.type == 'cpu'
"""
    r = run_python(code)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["ModeError", "True", "True"]


def test_import_finds_the_library_next_to_the_package(tmp_path):
    pkg = tmp_path / "site" / "metaload"
    shutil.copytree(os.path.join(ROOT, "python", "metaload"), pkg)
    shutil.copyfile(lib_path(), pkg / "libmetaload.so")
    env = dict(os.environ)
    env.pop("METALOAD_LIB", None)
    env.pop("LD_PRELOAD", None)
    env["PYTHONPATH"] = str(tmp_path / "site")
    r = subprocess.run([sys.executable, "-c", "import metaload, torch\n"
                        "with metaload.meta(): assert torch.zeros(1).is_meta\n"
                        "print(metaload.__file__)"], env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(pkg / "__init__.py")


def test_small_tensors_made_from_constants_keep_their_values_on_meta():
    with metaload.meta():
        widths = torch.arange(4) * 2.5 + 1  # RegNet-style constructor arithmetic
        depths = torch.diff(torch.tensor([0, 2, 5, 9]))
        assert widths.is_meta and depths.is_meta  # still forced: values are a side record
        assert widths.tolist() == [1.0, 3.5, 6.0, 8.5]
        assert torch.round(torch.log(widths)).int().tolist() == [0, 1, 2, 2]
        assert depths.tolist() == [2, 3, 4] and int(depths.sum()) == 9
        assert float(widths.max()) == 8.5 and bool((depths > 1).all())
        assert depths.numpy().tolist() == [2, 3, 4]
        with metaload.real():
            assert torch.arange(3).tolist() == [0, 1, 2]


@pytest.mark.parametrize("make", [
    lambda: torch.zeros(3),  # weights and buffers never carry values
    # a random draw after a skipped one (the Linear's init): an eager run would draw other numbers
    lambda: (torch.nn.Linear(3, 3), torch.randn(3))[1],
    lambda: torch.randn(3, device="cuda"),  # another device's generator
    lambda: torch.nn.Linear(3, 3).weight,
    lambda: torch.arange(5000),  # larger than the tracked limit
    lambda: torch.arange(3) + torch.zeros(3),  # mixed with an untracked meta tensor
    lambda: torch.arange(3.0).add_(torch.ones(3)),  # modified in place by an untracked one
])
def test_values_are_never_invented(make):
    with metaload.meta():
        t = make()
        with pytest.raises(metaload.DataDependentError):
            t.tolist()


def test_meta_runs_no_python_per_torch_call_at_any_nesting_depth():
    """meta() pushes no Python mode (it was one per scope, 2x the time per level): under 1 or 64
    nested scopes a torch call enters no Python function at all and neither mode stack grows. What
    a call costs at each depth: bench/meta_build_py.py (its "nested scopes" table); a unit test
    asserts no time."""
    stacks = (torch._C._len_torch_function_stack(), torch._C._len_torch_dispatch_stack())

    def python_calls_in_torch_empty(depth):
        with contextlib.ExitStack() as stack:
            for _ in range(depth):
                stack.enter_context(metaload.meta())
            assert (torch._C._len_torch_function_stack(),
                    torch._C._len_torch_dispatch_stack()) == stacks, depth
            seen = []
            sys.setprofile(lambda frame, event, arg: seen.append(frame.f_code.co_name)
                           if event == "call" else None)
            try:
                t = torch.empty(1)
            finally:
                sys.setprofile(None)
            assert t.is_meta, depth
        return seen

    for depth in (1, 64):
        assert python_calls_in_torch_empty(depth) == [], depth


def test_twenty_thousand_nested_scopes_work_and_unwind():
    with contextlib.ExitStack() as stack:
        for i in range(20000):
            stack.enter_context(metaload.meta() if i % 2 == 0 else metaload.real())
        assert not torch.empty(1).is_meta  # innermost is real()
        with metaload.meta():
            assert torch.empty(1).is_meta
    assert not metaload.is_forcing() and not torch.empty(1).is_meta


def test_a_scope_exited_on_another_thread_is_a_mode_error_and_the_owner_can_still_exit_it():
    scope = metaload.meta()
    scope.__enter__()
    errors = []

    def wrong_thread():
        try:
            scope.__exit__(None, None, None)
        except Exception as e:  # noqa: BLE001 - the test inspects it
            errors.append(e)

    t = threading.Thread(target=wrong_thread)
    t.start()
    t.join()
    assert len(errors) == 1 and isinstance(errors[0], metaload.ModeError), errors
    assert "entered on thread" in str(errors[0]) and "exited on thread" in str(errors[0])
    assert torch.empty(1).is_meta  # still open on its own thread ...
    scope.__exit__(None, None, None)  # ... which closes it
    assert not torch.empty(1).is_meta


def test_a_scope_object_cannot_be_entered_twice_but_works_as_a_decorator():
    scope = metaload.meta()
    with scope:
        with pytest.raises(metaload.ModeError, match="already open"):
            scope.__enter__()
    calls = []

    @metaload.meta()
    def build(depth):
        calls.append(torch.empty(1).is_meta)
        if depth:
            build(depth - 1)

    build(2)
    assert calls == [True, True, True] and not metaload.is_forcing()


_CUDA_INIT_PROBE = CUDA_INIT_COUNTER + r'''

with metaload.meta():
    made = [torch.empty(2, device="cuda"), torch.ones(2).cuda(), torch.zeros(2).to("cuda:1"),
            torch.tensor([[1, 2]], device="cuda"), torch.nn.Linear(2, 2, device="cuda").weight,
            torch.arange(3, device="cuda")]
    assert all(t.is_meta for t in made), [t.device for t in made]
    assert made[3].tolist() == [[1, 2]] and made[5].tolist() == [0, 1, 2]
    inside = list(calls)
    during = real_requests_still_initialise()
report(inside, during)
'''


def test_cuda_is_never_initialised_by_meta_and_real_use_still_initialises_it():
    assert_cuda_initialised_by_real_requests_only(_CUDA_INIT_PROBE)


INITS = [("uniform_", (-0.5, 0.5)), ("normal_", (0.0, 0.02)), ("trunc_normal_", (0.0, 0.02)),
         ("kaiming_uniform_", (5 ** 0.5,)), ("kaiming_normal_", ()), ("xavier_uniform_", ()),
         ("xavier_normal_", ()), ("orthogonal_", ())]


def _rng_states(gen):
    return torch.random.get_rng_state(), gen.get_state()


@pytest.mark.parametrize("name,args", INITS, ids=[n for n, _ in INITS])
def test_random_initialisers_of_meta_weights_are_skipped_with_the_same_result(name, args):
    """Inside meta(), torch.nn.init's random initialisers return a large meta weight untouched,
    without running their Python: the same object, and the generators' state of the real call on
    meta (whose kernels draw no numbers)."""
    init = getattr(torch.nn.init, name)
    gen = torch.Generator().manual_seed(7)
    kwargs = {"generator": gen} if "generator" in init.__code__.co_varnames else {}
    ref = torch.empty(96, 64, device="meta")
    before = _rng_states(gen)
    assert init(ref, *args, **kwargs) is ref
    ran = _rng_states(gen)
    with metaload.meta():
        wrapped = getattr(torch.nn.init, name)
        assert wrapped is not init and wrapped.__wrapped__ is init
        w = torch.empty(96, 64)
        calls = []  # the wrapper must not reach the tensor's own initialising methods
        orig_uniform, orig_normal = torch.Tensor.uniform_, torch.Tensor.normal_
        try:
            torch.Tensor.uniform_ = lambda *a, **k: calls.append("uniform_")
            torch.Tensor.normal_ = lambda *a, **k: calls.append("normal_")
            assert wrapped(w, *args, **kwargs) is w
        finally:
            torch.Tensor.uniform_, torch.Tensor.normal_ = orig_uniform, orig_normal
        assert calls == [] and w.is_meta and w.shape == (96, 64)
    assert [torch.equal(a, b) for a, b in zip(_rng_states(gen), before)] == [True, True]
    assert [torch.equal(a, b) for a, b in zip(ran, before)] == [True, True]
    assert getattr(torch.nn.init, name) is init  # restored when the last scope closes


def test_initialisers_keep_their_errors_and_run_where_values_exist():
    init = torch.nn.init
    with metaload.meta():
        w = torch.empty(96, 64)
        with pytest.raises(ValueError, match="fan_x"):
            init.kaiming_uniform_(w, mode="fan_x")
        with pytest.raises(ValueError, match="nonlinearity"):
            init.kaiming_normal_(w, nonlinearity="no_such")
        for f in (init.kaiming_uniform_, init.xavier_normal_, init.orthogonal_):
            with pytest.raises(ValueError):
                f(torch.empty(5000))
        # A small tensor made from constants keeps values: the real initialiser fills them, with
        # the draws an eager run makes (the generator seeded: earlier skips put it out of step).
        torch.manual_seed(0)
        small = torch.arange(16.0).reshape(4, 4)
        init.normal_(small)
        with metaload.real():
            torch.manual_seed(0)
            eager = init.normal_(torch.arange(16.0).reshape(4, 4))
        assert small.tolist() == eager.tolist() != torch.arange(16.0).reshape(4, 4).tolist()
        init.normal_(w)  # a skipped draw: the next one would differ from the eager run's
        init.normal_(small)
        with pytest.raises(metaload.DataDependentError, match="seeded again"):
            small.tolist()
        with metaload.real():  # real tensors inside meta() are initialised for real
            r = torch.zeros(96, 64)
            init.kaiming_uniform_(r)
            assert r.abs().sum() > 0
        # A subclass decides through its __torch_function__.
        seen = []

        class Traced(torch.Tensor):
            @classmethod
            def __torch_function__(cls, func, types, args=(), kwargs=None):
                seen.append(getattr(func, "__name__", str(func)))
                return super().__torch_function__(func, types, args, kwargs or {})

        init.xavier_uniform_(torch.empty(96, 64).as_subclass(Traced))
        assert "xavier_uniform_" in seen or "uniform_" in seen


def test_a_thread_that_does_not_force_initialises_its_meta_tensors_through_torch():
    calls = []
    inside, done = threading.Event(), threading.Event()

    def forcing():
        with metaload.meta():
            inside.set()
            done.wait(10)

    t = threading.Thread(target=forcing)
    t.start()
    inside.wait(10)
    try:
        w = torch.empty(96, 64, device="meta")
        wrapped = torch.nn.init.kaiming_uniform_
        assert hasattr(wrapped, "__wrapped__")  # the scope on the other thread wrapped it
        original = torch.Tensor.uniform_
        torch.Tensor.uniform_ = lambda self, *a, **k: calls.append(self) or self
        try:
            wrapped(w)
        finally:
            torch.Tensor.uniform_ = original
        assert calls == [w]
    finally:
        done.set()
        t.join()
