"""A module first imported inside metaload.meta() or metaload.fake() runs its top-level code real
(python/metaload/_imports.py), on torch 1.13 and 2.x:

- its constant tensors are real and its import-time reads (`int(t.sum())`) work, while tensors
  made in the block itself stay meta (or fake); the module keeps its own loader (inspect reads its
  source); a module that fails to import leaves the scope as it was;
- outside every scope the finder changes nothing;
- torch 2.x: torch._dynamo, whose import makes tensors and reads them, imports inside meta() (the
  reason nnsight imports it before entering its own meta mode) and works afterwards.
"""
import importlib
import inspect
import sys
import textwrap

import pytest
import torch

import metaload
from conftest import run_python

MODULE = textwrap.dedent("""
    import torch
    TABLE = torch.arange(8) * 3
    TOTAL = int(TABLE.sum())  # a read at import time
    ONES = torch.ones(4)
    FOUR = int(ONES.sum())  # ones() never has values on meta: fails there
    NOISE = torch.randn(16)
    def width():
        return TABLE.numel()
""")


@pytest.fixture
def module_dir(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in [m for m in sys.modules if m.startswith("ml_import_probe")]:
        del sys.modules[name]
    importlib.invalidate_caches()


def write(module_dir, name, text=MODULE):
    (module_dir / f"{name}.py").write_text(text)
    importlib.invalidate_caches()


@pytest.mark.parametrize("scope", ["meta", "fake"])
def test_a_module_imported_inside_a_scope_runs_real(module_dir, scope):
    write(module_dir, "ml_import_probe_a")
    enter = metaload.meta if scope == "meta" else (lambda: metaload.fake("cpu"))
    with enter():
        mod = importlib.import_module("ml_import_probe_a")
        inside = torch.ones(4)
    assert mod.TOTAL == 84 and mod.FOUR == 4
    assert mod.TABLE.device.type == "cpu" and not mod.TABLE.is_meta
    assert not metaload.is_fake(mod.TABLE) and not metaload.is_fake(mod.ONES)
    assert not mod.NOISE.is_meta and not metaload.is_fake(mod.NOISE)
    if scope == "meta":
        assert inside.is_meta
    else:
        assert metaload.is_fake(inside)
    # the module keeps its own loader: its source reads back
    assert type(mod.__loader__).__name__ == "SourceFileLoader"
    assert type(mod.__spec__.loader).__name__ == "SourceFileLoader"
    assert "TOTAL = int(TABLE.sum())" in inspect.getsource(mod)


def test_a_package_and_its_submodules_imported_inside_meta_run_real(module_dir):
    pkg = module_dir / "ml_import_probe_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("import torch\nROOT = torch.tensor([1.0, 2.0])\n")
    (pkg / "inner.py").write_text(MODULE)
    importlib.invalidate_caches()
    with metaload.meta():
        from ml_import_probe_pkg import inner
        import ml_import_probe_pkg
        assert torch.zeros(2).is_meta
    assert inner.TOTAL == 84 and inner.FOUR == 4 and not ml_import_probe_pkg.ROOT.is_meta
    assert ml_import_probe_pkg.ROOT.tolist() == [1.0, 2.0]


def test_a_module_that_fails_to_import_leaves_the_scope_as_it_was(module_dir):
    write(module_dir, "ml_import_probe_bad", "import torch\nX = torch.ones(2)\nraise ValueError('bad module')\n")
    with metaload.meta():
        with pytest.raises(ValueError, match="bad module"):
            importlib.import_module("ml_import_probe_bad")
        assert torch.ones(3).is_meta, "the scope is still meta() after the failed import"
        assert metaload.is_forcing()
    assert not torch.ones(3).is_meta


def test_outside_every_scope_imports_are_untouched(module_dir):
    write(module_dir, "ml_import_probe_out")
    mod = importlib.import_module("ml_import_probe_out")
    assert mod.TOTAL == 84
    assert type(mod.__loader__).__name__ == "SourceFileLoader"
    with metaload.real():  # real() inside nothing: nothing to change either
        write(module_dir, "ml_import_probe_out2")
        assert importlib.import_module("ml_import_probe_out2").TOTAL == 84


def test_without_the_finder_the_same_import_fails():
    """The finder is what makes it work: taken off sys.meta_path, the read of ones() at import
    time inside meta() is a DataDependentError (a fresh interpreter, so nothing is imported
    already)."""
    code = textwrap.dedent(f"""
        import sys, tempfile, os, importlib
        d = tempfile.mkdtemp(); sys.path.insert(0, d)
        open(os.path.join(d, "ml_import_probe_x.py"), "w").write({MODULE!r})
        import metaload, torch
        from metaload import _imports
        with metaload.meta():
            pass  # installs the finder
        sys.meta_path.remove(_imports._finder)
        _imports.install = lambda: None
        try:
            with metaload.meta():
                importlib.import_module("ml_import_probe_x")
            print("IMPORTED")
        except metaload.DataDependentError as e:
            print("DATA-DEPENDENT", str(e)[:80])
    """)
    r = run_python(code)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "DATA-DEPENDENT" in r.stdout, r.stdout


@pytest.mark.skipif(not hasattr(torch, "compile"), reason="torch._dynamo is torch 2.x's")
def test_torch_dynamo_imports_inside_meta_and_works_after():
    code = textwrap.dedent("""
        import sys, torch, metaload
        assert "torch._dynamo" not in sys.modules
        with metaload.meta():
            import torch._dynamo
            w = torch.empty(3, 3)
        assert w.is_meta
        bad = [n for n, m in list(sys.modules.items()) if n.startswith("torch._dynamo") and m
               for v in vars(m).values() if isinstance(v, torch.Tensor) and (v.is_meta or metaload.is_fake(v))]
        print("META-GLOBALS", bad)
        torch._dynamo.reset()
        f = torch.compile(lambda x: x * 2 + 1, backend="eager")
        print("COMPILED", f(torch.ones(2)).tolist())
    """)
    r = run_python(code)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "META-GLOBALS []" in r.stdout and "COMPILED [3.0, 3.0]" in r.stdout, r.stdout
