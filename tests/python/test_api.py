"""The Python API as a new user expects it: every error kind importable under its C++ parent,
MismatchError's names, load_into(strict=False) reporting missing and unexpected names as
load_state_dict does, one `progress` argument taking True/False, a callable or a tqdm-like bar,
one Scan type from metaload.scan and TransformersModel.scan, and every documented form of
Tensor.to inside metaload.fake() and metaload.meta()."""
import glob
import os
import re
import threading
import time
import warnings

import pytest
import torch

import metaload
from metaload import _lib, _progress

from conftest import ROOT

# ---------------------------------------------------------------------------------------------
# errors


def cpp_error_tree():
    """{kind: parent kind} from the C++ headers: METALOAD_DEFINE_ERROR(Kind, Parent) and the
    classes written out (class Kind : public Parent) that derive from metaload::Error."""
    tree = {}
    headers = []
    for component in ("base", "c10_ext", "kernels", "fake_mode", "loader", "distributed",
                      "identity", "estimate", "model", "tools"):
        headers += glob.glob(os.path.join(ROOT, component, "**", "*.h"), recursive=True)
    assert len(headers) > 20
    for h in headers:
        text = open(h, encoding="utf-8").read()
        for kind, parent in re.findall(r"^METALOAD_DEFINE_ERROR\((\w+),\s*(\w+)\);", text, re.M):
            tree[kind] = parent
        for kind, parent in re.findall(r"^class (\w+) : public (\w+) \{", text, re.M):
            tree[kind] = parent
    # Only what derives from metaload::Error (headers may declare other classes).
    def is_error(k):
        return k == "Error" or (k in tree and is_error(tree[k]))
    return {k: p for k, p in tree.items() if is_error(p)}


def test_every_cpp_error_kind_is_importable_under_its_cpp_parent():
    tree = cpp_error_tree()
    assert {"MismatchError", "FormatError", "ShardError", "ModulePathError"} <= set(tree)
    assert set(tree) | {"Error"} == set(_lib.error_kinds())
    for kind, parent in tree.items():
        cls = getattr(metaload, kind)
        assert cls.__bases__ == (getattr(metaload, parent),), kind
        assert cls.kind == kind and cls.__module__ == "metaload" and cls.__name__ == kind
        assert kind in metaload.__all__
    assert issubclass(metaload.Error, RuntimeError)


def _generator():
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        "gen_error_kinds", os.path.join(ROOT, "tools", "gen_error_kinds.py"))
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    return gen


def test_the_error_classes_are_generated_from_the_cpp_headers():
    """One list (issue 23): python/metaload/_error_kinds.py is what tools/gen_error_kinds.py makes
    of the headers, and _lib makes each class, its parent, its docstring and its fields of it."""
    from metaload import _error_kinds
    gen = _generator()
    with open(os.path.join(ROOT, gen.OUT), encoding="utf-8") as f:
        assert f.read() == gen.render(ROOT), "stale: run python3 tools/gen_error_kinds.py"
    assert {k: p for k, p, *_ in _error_kinds.KINDS} == cpp_error_tree()
    fields = {k: f for k, _, _, _, f in _error_kinds.KINDS}
    assert fields["FormatError"] == ("file", "tensor", "rule", "detail")
    assert fields["MismatchError"] == ("missing", "unexpected", "mismatched")  # from errors.cc
    assert fields["RepoIdError"] == ("repo_id", "rule")
    for kind, parent, header, doc, own in _error_kinds.KINDS:
        cls = getattr(metaload, kind)
        assert doc and doc in cls.__doc__ and header in cls.__doc__, kind
        for name in own:
            assert isinstance(vars(cls)[name], property), (kind, name)


def test_the_generator_follows_the_headers(tmp_path):
    """A kind declared, renamed or given a field in C++ changes the table (so the test above fails
    until it is regenerated)."""
    gen = _generator()
    (tmp_path / "base").mkdir()
    (tmp_path / "loader").mkdir()
    (tmp_path / "base" / "error.h").write_text(
        "// Base kinds.\n\n// A new kind,\n// on two lines.\nMETALOAD_DEFINE_ERROR(NewError, Error);\n")
    (tmp_path / "loader" / "errors.h").write_text(
        "// A child.\nclass ChildError : public NewError {\n public:\n  ChildError()"
        " : NewError(\"ChildError\", \"m\") {\n    record_field(\"rule\", r);\n  }\n};\n"
        "class Other : public std::exception {\n};\n")
    (tmp_path / "loader" / "errors.cc").write_text(
        "ChildError::ChildError(int) : NewError(\"ChildError\", \"m\") {\n"
        "  record_field(\"names\", n);\n}\n")
    assert gen.kinds(str(tmp_path)) == [
        ("NewError", "Error", "base/error.h", "A new kind, on two lines.", ()),
        ("ChildError", "NewError", "loader/errors.h", "A child.", ("rule", "names"))]
    namespace = {}
    exec(gen.render(str(tmp_path)), namespace)
    assert [k[0] for k in namespace["KINDS"]] == ["NewError", "ChildError"]


# Each layer's error kinds in one header (issue 13): a kind declared anywhere else in its layer
# fails here. The two layers with many kinds; the others have a single header each already.
# {layer: (its error header, the fewest kinds it holds)}.
ERROR_HEADERS = {"loader": ("loader/errors.h", 12), "identity": ("identity/errors.h", 4),
                 "model": ("model/errors.h", 4)}


def error_headers(component):
    """{header (repo-relative): [kinds]} for the headers under `component` declaring error kinds."""
    out = {}
    for h in glob.glob(os.path.join(ROOT, component, "**", "*.h"), recursive=True):
        text = open(h, encoding="utf-8").read()
        kinds = re.findall(r"^METALOAD_DEFINE_ERROR\((\w+),", text, re.M)
        kinds += re.findall(r"^class (\w+) : public \w*Error \{", text, re.M)
        if kinds:
            out[os.path.relpath(h, ROOT)] = kinds
    return out


@pytest.mark.parametrize("component", sorted(ERROR_HEADERS))
def test_each_layer_declares_its_error_kinds_in_one_header(component):
    headers = error_headers(component)
    header, fewest = ERROR_HEADERS[component]
    assert list(headers) == [header], headers
    assert len(headers[header]) >= fewest  # the whole tree, not a stray kind
    assert set(headers[header]) <= set(cpp_error_tree())


def test_errors_the_docs_name_are_importable():
    docs = glob.glob(os.path.join(ROOT, "*.md")) + glob.glob(os.path.join(ROOT, "*", "README.md"))
    docs += glob.glob(os.path.join(ROOT, "python", "metaload", "*.py"))
    named = set()
    for d in docs:
        named |= set(re.findall(r"metaload\.([A-Z]\w*(?:Error|Cancelled))\b",
                                open(d, encoding="utf-8").read()))
    assert {"MismatchError", "DataDependentError", "LoadError"} <= named
    for kind in named:
        assert issubclass(getattr(metaload, kind), metaload.Error), kind


@pytest.mark.parametrize("kind", sorted(cpp_error_tree()))
def test_translated_errors_are_caught_by_their_cpp_ancestors(kind):
    e = _lib.translate(RuntimeError(f"[metaload.{kind}] something\nException raised from x"))
    assert type(e) is getattr(metaload, kind) and str(e) == "something"
    tree, k = cpp_error_tree(), kind
    while k != "Error":  # every ancestor catches it
        k = tree[k]
        assert isinstance(e, getattr(metaload, k))


def test_a_kind_this_package_does_not_know_is_still_a_metaload_error():
    e = _lib.translate(RuntimeError("[metaload.BrandNewError] from a newer library"))
    assert isinstance(e, metaload.Error) and type(e).__name__ == "BrandNewError"


def test_errors_pickle_and_users_may_subclass():
    import pickle
    e = pickle.loads(pickle.dumps(metaload.MismatchError("fit: 1 missing\n  missing: w [2, 3]",
                                                         missing=["w"])))
    assert type(e) is metaload.MismatchError and e.missing == ["w"]

    class MyError(metaload.LoadError):
        pass

    assert MyError.__module__ == __name__ and "MyError" not in _lib.error_kinds()
    assert _lib.error_class("LoadError") is metaload.LoadError


class Two(torch.nn.Module):
    def __init__(self, a=(2, 3), b=(4,)):
        super().__init__()
        self.a = torch.nn.Parameter(torch.zeros(a))
        self.register_buffer("b", torch.zeros(b))
        self.c = torch.nn.Linear(3, 2)


def test_mismatch_error_names_missing_unexpected_and_mismatched(tmp_path):
    path = tmp_path / "ck.safetensors"
    metaload.save_file({"a": torch.ones(3, 3), "c.weight": torch.ones(2, 3),
                        "extra.weight": torch.ones(1), "zz": torch.ones(2)}, path)
    model = Two().to("meta")
    try:
        metaload.load_into(model, str(path), progress=False)
    except metaload.LoadError as caught:  # a MismatchError is a LoadError, as in C++
        e = caught
    else:
        pytest.fail("no error")
    assert type(e) is metaload.MismatchError
    assert e.missing == ["b", "c.bias"]
    assert sorted(e.unexpected) == ["extra.weight", "zz"]
    assert e.mismatched == ["a"]
    assert all(t.is_meta for t in model.state_dict().values())  # all or nothing


def test_names_in_messages_are_escaped_and_lists_capped_but_the_error_keeps_every_name(tmp_path):
    import pickle
    # A NUL in a tensor name used to end the message there ("unexpected: w").
    path = tmp_path / "nul.safetensors"
    metaload.save_file({"w\x00x": torch.ones(2), "b\nunexpected: forged": torch.ones(1)}, path)
    with pytest.raises(metaload.MismatchError) as e:
        metaload.load_into(torch.nn.Linear(2, 1), str(path), progress=False)
    msg = str(e.value)
    assert "\n  unexpected: w\\x00x in nul.safetensors" in msg
    assert "\n  unexpected: b\\nunexpected: forged in nul.safetensors" in msg
    assert "\x00" not in msg and msg.count("\n  unexpected: ") == 2
    assert sorted(e.value.unexpected) == ["b\nunexpected: forged", "w\x00x"]  # as given
    assert e.value.missing == ["weight", "bias"]
    # 100,000 unexpected tensors: 20 in the message (it was 4 MB), every one in the error.
    many = {f"t{i:06d}": torch.zeros(1) for i in range(100000)}
    many["weight"], many["bias"] = torch.zeros(1, 2), torch.zeros(1)
    path = tmp_path / "many.safetensors"
    metaload.save_file(many, path)
    with pytest.raises(metaload.MismatchError) as e:
        metaload.load_into(torch.nn.Linear(2, 1), str(path), progress=False)
    msg = str(e.value)
    assert len(msg) < 4096, len(msg)
    assert msg.count("\n  unexpected: ") == 20 and "\n  ... and 99980 more unexpected" in msg
    assert len(e.value.unexpected) == 100000 and e.value.unexpected[-1] == "t099999"
    assert e.value.missing == [] and e.value.mismatched == []
    # Pickled, it keeps them all too.
    again = pickle.loads(pickle.dumps(e.value))
    assert len(again.unexpected) == 100000 and str(again) == msg
    # A 10 MB tensor name: the message shows 200 characters of it and its size.
    path = tmp_path / "long.safetensors"
    name = "n" * (10 << 20)
    metaload.save_file({name: torch.ones(1)}, path)
    with pytest.raises(metaload.MismatchError) as e:
        metaload.load_into(torch.nn.Linear(2, 1), str(path), progress=False)
    assert len(str(e.value)) < 2048
    assert "n" * 200 + "... (10485760 bytes) in long.safetensors" in str(e.value)
    assert e.value.unexpected == [name]


def test_the_python_side_quotes_and_caps_names_as_the_library_does(tmp_path):
    path = tmp_path / "one.safetensors"
    metaload.save_file({"w": torch.ones(1)}, path)
    name = "x\x00" + "n" * (1 << 20)
    with metaload.safe_open(str(path), framework="pt") as f:
        with pytest.raises(KeyError) as e:
            f.get_tensor(name)
    text = e.value.args[0]  # (str() of a KeyError is the repr of its message)
    assert "'x\\x00" in text and "\x00" not in text and "(1048578 characters)" in text
    assert len(text) < 600
    with pytest.raises(ValueError) as e:
        metaload.checkpoint.parse_size("9" * 100000 + "XB")
    assert len(str(e.value)) < 400


def test_a_nul_in_a_reference_or_repo_id_is_shown_escaped(tmp_path):
    for ref in (str(tmp_path) + "\x00/elsewhere", "org/na\x00me"):
        with pytest.raises(metaload.ResolveError) as e:
            metaload.load_into(torch.nn.Linear(2, 1), ref, progress=False)
        assert "\\x00" in str(e.value) and "\x00" not in str(e.value), str(e.value)
    # A NUL used to cut the path short: the model was built from the directory before it.
    (tmp_path / "config.json").write_text('{"model_type": "gpt2", "n_embd": 8, "n_head": 2, '
                                          '"n_layer": 1, "n_positions": 8, "vocab_size": 16}')
    from metaload.model import TransformersModel
    with pytest.raises(metaload.ResolveError, match=r"contains a NUL byte") as e:
        TransformersModel(str(tmp_path) + "\x00/elsewhere")
    assert "\\x00/elsewhere" in str(e.value)


def test_load_into_arguments_out_of_range_are_typed_errors_naming_them(tmp_path):
    path = tmp_path / "lin.safetensors"
    metaload.save_file(torch.nn.Linear(4, 3).state_dict(), path)
    cases = [
        (dict(threads=-1), "threads must be 0 (one per core) or from 1 to 1024, got -1"),
        (dict(threads=2 ** 40), "threads must be 0 (one per core) or from 1 to 1024, got 1099511627776"),
        (dict(staging_bytes=-1), "staging_bytes must be 0 (the default, 64 MiB) or a positive "
                                 "number of bytes, got -1"),
        (dict(staging_bytes=1, threads=2), "staging_bytes 1 split among 2 reader threads leaves 0 "
                                           "bytes each, less than one 4-byte element: "
                                           "staging_bytes must be at least 8"),
        (dict(tp_size=2 ** 32 + 1), "tp_size must be from 1 to 2^31-1, got 4294967297"),
        (dict(tp_rank=-1), "tp_rank must be from 0 to tp_size - 1 (0), got -1"),
    ]
    for kwargs, message in cases:
        model = torch.nn.Linear(4, 3).to("meta")
        with pytest.raises(metaload.PlanError) as e:
            metaload.load_into(model, str(path), progress=False, **kwargs)
        assert str(e.value) == message, kwargs
        assert all(t.is_meta for t in model.state_dict().values())
    model = torch.nn.Linear(4, 3).to("meta")
    metaload.load_into(model, str(path), progress=False, staging_bytes=8, threads=2)
    assert not model.weight.is_meta


# ---------------------------------------------------------------------------------------------
# load_into(strict=False)


def test_strict_false_reports_like_load_state_dict(tmp_path):
    path = tmp_path / "ck.safetensors"
    state = {"a": torch.randn(2, 3), "c.weight": torch.randn(2, 3), "extra": torch.ones(4),
             "more.bias": torch.ones(1)}
    metaload.save_file(state, path)

    reference = Two()
    expected = reference.load_state_dict(state, strict=False)
    model = Two().to("meta")
    report = metaload.load_into(model, str(path), strict=False, progress=False)
    assert report.missing_keys == expected.missing_keys == ["b", "c.bias"]
    assert sorted(report.unexpected_keys) == sorted(expected.unexpected_keys)
    assert torch.equal(model.a, state["a"]) and torch.equal(model.c.weight, state["c.weight"])
    assert model.b.is_meta and model.c.bias.is_meta  # left as they were
    assert report.slot_bytes == (6 + 6) * 4

    full = tmp_path / "full.safetensors"  # a strict load that succeeds has nothing to report
    metaload.save_file(Two().state_dict(), full)
    ok = metaload.load_into(Two().to("meta"), str(full), progress=False)
    assert ok.missing_keys == [] and ok.unexpected_keys == []


def test_strict_false_still_fails_on_a_shape_mismatch(tmp_path):
    path = tmp_path / "ck.safetensors"
    metaload.save_file({"a": torch.ones(5)}, path)
    model = Two().to("meta")
    with pytest.raises(metaload.MismatchError) as e:
        metaload.load_into(model, str(path), strict=False, progress=False)
    assert e.value.mismatched == ["a"] and e.value.missing == []
    assert model.a.is_meta


def test_strict_false_tied_weights_need_one_name(tmp_path):
    class Tied(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(5, 3)
            self.head = torch.nn.Linear(3, 5, bias=False)
            self.head.weight = self.emb.weight

    src = Tied()
    path = tmp_path / "tied.safetensors"
    metaload.save_safetensors(str(path), src)  # stores the tie once, as emb.weight
    assert [t["name"] for t in metaload.checkpoint.read_safetensors_header(str(path))["tensors"]] \
        == ["emb.weight"]
    with metaload.meta():  # (Module.to("meta") would untie them)
        model = Tied()
    assert model.head.weight is model.emb.weight and model.emb.weight.is_meta
    report = metaload.load_into(model, str(path), strict=False, progress=False)
    assert report.missing_keys == [] and report.unexpected_keys == []
    assert model.head.weight is model.emb.weight and torch.equal(model.head.weight, src.emb.weight)


def test_strict_false_with_nothing_in_common(tmp_path):
    path = tmp_path / "other.safetensors"
    metaload.save_file({"unrelated": torch.ones(3)}, path)
    model = Two().to("meta")
    report = metaload.load_into(model, str(path), strict=False, progress=False)
    assert report.missing_keys == list(Two().state_dict())
    assert report.unexpected_keys == ["unrelated"]
    assert report.bytes == 0 and all(t.is_meta for t in model.state_dict().values())


# ---------------------------------------------------------------------------------------------
# progress


class FakeTqdm:
    """What load_into uses of a tqdm bar: total, update(n), refresh()."""

    def __init__(self):
        self.total = None
        self.n = 0
        self.updates = []
        self.threads = set()

    def update(self, n):
        self.n += n
        self.updates.append(n)
        self.threads.add(threading.get_ident())

    def refresh(self):
        pass


@pytest.fixture(scope="module")
def checkpoint_file(tmp_path_factory):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.Linear(512, 256))
    path = str(tmp_path_factory.mktemp("progress") / "mlp.safetensors")
    metaload.save_safetensors(path, model)
    return model, path


def fresh_mlp():
    return torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.Linear(512, 256)).to("meta")


def test_progress_drives_a_tqdm_like_bar(checkpoint_file):
    src, path = checkpoint_file
    bar = FakeTqdm()
    model = fresh_mlp()
    report = metaload.load_into(model, path, progress=bar)
    assert report.bytes > 0 and bar.total == report.bytes and bar.n == report.bytes
    assert all(n > 0 for n in bar.updates)
    assert torch.equal(model[0].weight, src[0].weight)


def test_progress_callable_gets_done_and_total(checkpoint_file):
    _, path = checkpoint_file
    calls = []
    report = metaload.load_into(fresh_mlp(), path, progress=lambda d, t: calls.append((d, t)))
    assert calls and calls[-1] == (report.bytes, report.bytes)
    assert all(a[0] <= b[0] for a, b in zip(calls, calls[1:]))  # done never goes back
    assert all(0 <= d <= t for d, t in calls)


def test_progress_callback_errors_surface_after_the_load(checkpoint_file):
    src, path = checkpoint_file

    def broken(done, total):
        raise ValueError("display broke")

    model = fresh_mlp()
    with pytest.raises(ValueError, match="display broke"):
        metaload.load_into(model, path, progress=broken)
    assert torch.equal(model[0].weight, src[0].weight)  # the load itself completed


def test_progress_arguments_are_checked(checkpoint_file):
    _, path = checkpoint_file
    with pytest.raises(TypeError, match="progress"):
        metaload.load_into(fresh_mlp(), path, progress=3)
    assert metaload.load_into(fresh_mlp(), path, progress=False).bytes > 0
    assert _progress.split(True) == (True, None) and _progress.split(False) == (False, None)


def test_progress_is_polled_while_the_library_works(monkeypatch):
    """The helper thread forwards what the library posts while the call runs (a stand-in library
    posts 10 more bytes at each read): several calls, from another thread, the last on the caller's
    thread with done == total."""
    posted = {"n": 0}

    class Ops:
        def load_progress(self, progress_id, release=False):
            posted["n"] = min(posted["n"] + 10, 100)
            return [100 if release else posted["n"], 100]

    class Lib:
        Error = metaload.Error

        @staticmethod
        def load():
            return Ops()

        @staticmethod
        def library_path():
            return "stand-in"

    monkeypatch.setattr(_progress, "_lib", Lib)
    seen = []
    me = threading.get_ident()
    with _progress.Watch(lambda d, t: seen.append((d, t, threading.get_ident()))) as w:
        assert w.id > 0
        # Until the helper thread has forwarded twice (a fixed sleep assumed it ran on time); the
        # 30 s is a hang guard, not a speed claim: it polls every 0.1 s.
        for _ in range(3000):
            if sum(tid != me for _, _, tid in seen) >= 2:
                break
            time.sleep(0.01)
    assert len(seen) >= 3 and seen[-1] == (100, 100, me)
    assert any(tid != me for _, _, tid in seen[:-1])
    assert [d for d, _, _ in seen] == sorted(d for d, _, _ in seen)


def tiny_model_dir(tmp_path):
    return metaload.make_checkpoint(str(tmp_path / "gpt2-tiny"), config="gpt2-tiny", seed=1)["dir"]


def test_transformers_model_takes_the_same_progress_argument(tmp_path):
    d = tiny_model_dir(tmp_path)
    calls = []
    model = metaload.TransformersModel(d, progress=lambda done, total: calls.append((done, total)))
    assert calls == []  # construction loads nothing
    report = model.dispatch()
    assert calls and calls[-1] == (report.bytes, report.bytes) and report.bytes > 0
    n = len(calls)
    model.dispatch()  # idempotent: nothing more to load, no more calls
    assert len(calls) == n

    bar = FakeTqdm()
    lazy = metaload.TransformersModel(d, progress=bar)
    lazy(torch.tensor([[1, 2, 3]]))  # the first real forward dispatches
    assert bar.total == bar.n == report.bytes

    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        old = metaload.TransformersModel(d, progress_bar=False)
    assert any(issubclass(x.category, DeprecationWarning) for x in w)
    assert old.dispatch().bytes == report.bytes


def test_one_progress_name_everywhere():
    import inspect
    for fn in (metaload.load_into, metaload.TransformersModel.__init__):
        params = inspect.signature(fn).parameters
        assert "progress" in params, fn
        assert params["progress"].default is True


# ---------------------------------------------------------------------------------------------
# scan results


def test_both_scans_return_one_type(tmp_path):
    with metaload.meta():
        mlp = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
        shared = torch.nn.Linear(4, 4)

    class Twice(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.mlp, self.shared = mlp, shared

        def forward(self, x):
            return self.shared(self.shared(self.mlp(x)))

    a = metaload.scan(Twice(), torch.empty(3, 8, device="meta"), device="cuda")
    model = metaload.TransformersModel(tiny_model_dir(tmp_path), progress=False)
    b = model.scan(batch=2, seq=5)
    assert type(a) is type(b) is metaload.Scan
    for s in (a, b):
        assert all(type(m) is metaload.ModuleShape for m in s.values())
        assert all(isinstance(m.dtype, torch.dtype) and isinstance(m.device, torch.device)
                   for m in s.values())
        assert isinstance(s.device, torch.device) and s.seconds >= 0
        assert s.total_bytes == sum(m.bytes for m in s.values()) > 0
        assert list(s)[-1] == "" and s[""] is s.modules[""] and len(s) == len(s.modules)
    assert a[""] == metaload.ModuleShape("", "Twice", (3, 4), torch.float32,
                                         torch.device("cuda", 0), 1, 3 * 4 * 4)
    assert a["shared"].calls == 2 and a["mlp.1"].cls == "ReLU"
    assert a.device == torch.device("cuda:0")
    assert b[""].shape == (2, 5, 256) and b[""].dtype == torch.float32
    assert b[""].device == b.device == torch.device("cpu")


# ---------------------------------------------------------------------------------------------
# Tensor.to in every documented form


def _to_forms():
    """(label, call(t, other), requested device or None, expected dtype or None)."""
    f64, f16 = torch.float64, torch.float16
    return [
        ("to(dtype)", lambda t, o: t.to(f64), None, f64),
        ("to(dtype, non_blocking, copy)", lambda t, o: t.to(f64, False, True), None, f64),
        ("to(dtype, non_blocking=, copy=)", lambda t, o: t.to(f64, non_blocking=True, copy=True),
         None, f64),
        ("to(dtype=)", lambda t, o: t.to(dtype=f64), None, f64),
        ("to(device)", lambda t, o: t.to("cpu"), "cpu", None),
        ("to('cuda')", lambda t, o: t.to("cuda"), "cuda:0", None),
        ("to(torch.device)", lambda t, o: t.to(torch.device("cuda", 1)), "cuda:1", None),
        ("to(int)", lambda t, o: t.to(0), "cuda:0", None),
        ("to(device=)", lambda t, o: t.to(device="cuda:1"), "cuda:1", None),
        ("to(device, dtype)", lambda t, o: t.to("cpu", f64), "cpu", f64),
        ("to(device, dtype, non_blocking, copy)", lambda t, o: t.to("cpu", f64, False, True),
         "cpu", f64),
        ("to('cuda', dtype, non_blocking, copy)", lambda t, o: t.to("cuda", f64, True, True),
         "cuda:0", f64),
        ("to(device, dtype, non_blocking=, copy=)",
         lambda t, o: t.to(torch.device("cpu"), f64, non_blocking=True, copy=True), "cpu", f64),
        ("to(device, dtype=)", lambda t, o: t.to("cuda:1", dtype=f16), "cuda:1", f16),
        ("to(device=, dtype=, non_blocking=, copy=)",
         lambda t, o: t.to(device="cpu", dtype=f16, non_blocking=False, copy=True), "cpu", f16),
        ("to(None, dtype)", lambda t, o: t.to(None, f16), None, f16),
        ("to(other)", lambda t, o: t.to(o), "other", f16),
        ("to(other, non_blocking, copy)", lambda t, o: t.to(o, False, True), "other", f16),
        ("to(other, copy=)", lambda t, o: t.to(o, copy=True), "other", f16),
        ("to(memory_format=)", lambda t, o: t.to(memory_format=torch.channels_last), None, None),
        ("to(dtype, memory_format=)",
         lambda t, o: t.to(f16, memory_format=torch.channels_last), None, f16),
        ("to(device, dtype, non_blocking, copy, memory_format=)",
         lambda t, o: t.to("cuda", f16, False, True, memory_format=torch.channels_last),
         "cuda:0", f16),
        ("to(other, memory_format=)",
         lambda t, o: t.to(o, memory_format=torch.channels_last), "other", f16),
    ]


MODES = {
    "fake-cuda": lambda: metaload.fake("cuda"),
    "fake-cpu": lambda: metaload.fake("cpu"),
    "meta": metaload.meta,
}


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("form", _to_forms(), ids=[f[0] for f in _to_forms()])
def test_every_documented_form_of_tensor_to(mode, form):
    label, call, device, dtype = form
    real = torch.ones(1, 2, 3, 4)
    real_other = torch.zeros(1, dtype=torch.float16)
    plain = call(real, real_other) if device in (None, "cpu", "other") else None  # torch's own
    with MODES[mode]():
        t = torch.ones(1, 2, 3, 4)
        other = torch.zeros(1, dtype=torch.float16)
        if device == "other" and mode == "fake-cuda":
            other = other.to("cuda:1")
        out = call(t, other)
    assert out.shape == t.shape
    assert out.dtype == (dtype or torch.float32)
    if plain is not None:
        assert plain.dtype == out.dtype
    if "memory_format" in label:
        assert out.is_contiguous(memory_format=torch.channels_last)
    if "copy" in label and "copy=False" not in label:
        assert out is not t
    if mode == "meta":
        assert out.is_meta
        return
    assert metaload.is_fake(out)
    want = {None: t.device, "other": other.device}.get(device) or torch.device(device)
    assert out.device == want, (label, out.device)


def test_the_form_the_issue_names():
    with metaload.fake("cuda"):
        t = torch.ones(2, 3)
        out = t.to("cpu", torch.float64, False, True)
    assert metaload.is_fake(out) and out.device == torch.device("cpu")
    assert out.dtype == torch.float64 and out is not t


@pytest.mark.parametrize("mode", sorted(MODES))
def test_forms_torch_rejects_are_still_rejected(mode):
    t0 = torch.ones(2)
    for bad in [lambda t: t.to("cpu", False, True), lambda t: t.to(torch.float16, device="cpu"),
                lambda t: t.to(other=torch.ones(1))]:
        with pytest.raises(TypeError):
            bad(t0)  # torch itself
        with MODES[mode]():
            t = torch.ones(2)
            with pytest.raises(TypeError):
                bad(t)
