"""metaload.save_file / load_file / safe_open, the safetensors library's names over metaload's own
header reader, writer and loader: files written by PyPI's `safetensors` are read by metaload and
the reverse, case by case (every common dtype, 0-d and empty tensors, metadata, many tensors, large
offsets, names that need escaping): the same tensors both ways, and the same bytes where the format
leaves the writer no choice.

What both writers fix, checked before asserting identical bytes: the header is compact JSON with
`__metadata__` first, then the tensors in data order; data in order of the safetensors Dtype enum
descending (U64 I64 F64 C64 F32 U32 I32 BF16 F16 U16 I16 F8* I8 U8 BOOL), then by name bytewise;
the header padded with spaces to a multiple of 8. What is left open: the order of several metadata
entries (safetensors keeps them in a Rust HashMap, in a different order from run to run) and
whether empty metadata is written as `{}` or not at all; those cases compare parsed headers.

PyPI's safetensors is pinned for the torch 2.x environment (tools/requirements.txt); Debian packages
no python3-safetensors, so for Debian's torch 1.13 it comes from tools/setup's torch113-peers folder
(conftest.import_safetensors); without either, the interop tests skip and the metaload-only tests
(round trips, header bytes, slicing) run.
"""
import json
import os
import struct

import pytest
import torch

import metaload
from conftest import import_safetensors
from metaload import checkpoint

safetensors = import_safetensors()

needs_safetensors = pytest.mark.skipif(
    safetensors is None,
    reason="PyPI's safetensors is not importable for this Python: it is in tools/requirements.txt "
           "for the torch 2.x environment and tools/setup's torch113-peers folder for Debian's "
           "torch 1.13 (Debian has no python3-safetensors package)")


def _rand(shape, dtype, gen):
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=gen).bool()
    if dtype.is_complex:
        return torch.randn(shape, dtype=dtype, generator=gen)
    if dtype.is_floating_point:
        t = torch.randn(shape, generator=gen) * 3
        return t.to(dtype)
    info = torch.iinfo(dtype)
    lo, hi = max(info.min, -2**62), min(info.max, 2**62)
    return torch.randint(lo, hi, shape, generator=gen, dtype=torch.int64).to(dtype)


def _dtype(name):
    return getattr(torch, name, None)


COMMON = ["float32", "float16", "bfloat16", "float64", "int8", "uint8", "int16", "int32",
          "int64", "bool"]
NEWER = ["uint16", "uint32", "uint64", "float8_e4m3fn", "float8_e5m2", "complex64"]


def _case(name):
    """(tensors, metadata) of case `name`; pytest.skip when this torch lacks a dtype it needs."""
    gen = torch.Generator().manual_seed(sum(map(ord, name)))
    if name.startswith("dtype-"):
        dt = _dtype(name[len("dtype-"):])
        if dt is None:
            pytest.skip(f"torch {torch.__version__} has no torch.{name[6:]}")
        return {"x": _rand((3, 5), dt, gen), "y.bias": _rand((7,), dt, gen)}, None
    if name == "0-d":
        return {"scalar": torch.tensor(2.5), "step": torch.tensor(7),
                "flag": torch.tensor(True), "h": torch.tensor(1.5, dtype=torch.bfloat16)}, None
    if name == "empty":
        return {"e0": torch.empty(0), "e1": torch.empty(0, 3, dtype=torch.float16),
                "e2": torch.empty(2, 0, 4, dtype=torch.int64), "after": torch.arange(6.0)}, None
    if name == "metadata-one":
        return {"w": _rand((4, 4), torch.float32, gen)}, {"format": "pt"}
    if name == "metadata-many":
        return {"w": _rand((4, 4), torch.float32, gen)}, {
            "format": "pt", "zeta": "last", "alpha": "first", "json": '{"a": [1, 2]}',
            "unicode": "héllo wörld ✓"}
    if name == "same-size-dtypes":  # the writers' order among dtypes of one size
        out = {}
        for i, dt in enumerate(["float32", "int32", "uint32", "bfloat16", "float16", "int16",
                                "uint16", "int8", "uint8", "bool", "float64", "int64", "uint64"]):
            if _dtype(dt) is not None:
                out[f"t{12 - i:02d}.{dt}"] = _rand((3,), _dtype(dt), gen)
        return out, None
    if name == "names":  # bytewise name order; JSON escapes
        return {n: _rand((2,), torch.float32, gen) for n in
                ["a", "B", "a.10", "a.9", "é", "日本", 'quote"d', "back\\slash", "tab\tnl\n",
                 "ctl\x01", "del\x7f", "sp ace"]}, None
    if name == "many":
        dts = [torch.float32, torch.float16, torch.int64, torch.bool, torch.bfloat16, torch.int8]
        return {f"layers.{i}.w{i % 7}": _rand((i % 5 + 1, 3), dts[i % len(dts)], gen)
                for i in range(300)}, {"n": "300"}
    if name == "large-offsets":  # 40 MiB first: the later offsets pass 2**25
        return {"big": torch.ones(10 * 2**20, dtype=torch.float32),
                "small.a": _rand((5,), torch.float16, gen),
                "small.b": _rand((3, 3), torch.int32, gen)}, None
    raise KeyError(name)


CASES = ([f"dtype-{d}" for d in COMMON + NEWER] +
         ["0-d", "empty", "metadata-one", "metadata-many", "same-size-dtypes", "names", "many",
          "large-offsets"])
# Identical bytes except where the format leaves a choice (module docstring).
IDENTICAL = set(CASES) - {"metadata-many"}


def _same(a, b):
    """Same dtype, shape and bytes (float8 and bool have no torch.equal everywhere)."""
    if a.dtype != b.dtype or tuple(a.shape) != tuple(b.shape):
        return False
    return torch.equal(a.contiguous().reshape(-1).view(torch.uint8),
                       b.contiguous().reshape(-1).view(torch.uint8))


def _assert_same_tensors(got, want):
    assert sorted(got) == sorted(want)
    bad = [n for n in want if not _same(got[n], want[n])]
    assert not bad, bad


def _header(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(n))


def test_case_count():
    assert len(CASES) >= 15


@pytest.mark.parametrize("case", CASES)
def test_metaload_round_trip(tmp_path, case):
    tensors, metadata = _case(case)
    path = tmp_path / "m.safetensors"
    metaload.save_file(tensors, path, metadata=metadata)
    _assert_same_tensors(metaload.load_file(path), tensors)
    with metaload.safe_open(path, framework="pt", device="cpu") as f:
        assert f.keys() == sorted(tensors)
        assert f.metadata() == metadata
        _assert_same_tensors({k: f.get_tensor(k) for k in f.keys()}, tensors)
        for k in f.keys():
            s = f.get_slice(k)
            assert s.get_shape() == list(tensors[k].shape)
            assert _same(s[...], tensors[k])


@needs_safetensors
@pytest.mark.parametrize("case", CASES)
def test_safetensors_writes_metaload_reads(tmp_path, case):
    tensors, metadata = _case(case)
    path = str(tmp_path / "st.safetensors")
    safetensors.torch.save_file({k: v.contiguous() for k, v in tensors.items()}, path,
                                metadata=metadata)
    loaded = metaload.load_file(path)
    _assert_same_tensors(loaded, tensors)
    assert list(loaded) == [t["name"] for t in checkpoint.read_safetensors_header(path)["tensors"]]
    with metaload.safe_open(path) as f, safetensors.safe_open(path, framework="pt") as ref:
        assert f.keys() == ref.keys()
        # File order; empty tensors share their offset with a neighbour, and safetensors orders
        # such ties differently from run to run (a hash map): compare the tensors with data.
        def with_data(keys):
            return [k for k in keys if tensors[k].numel() > 0]
        assert with_data(f.offset_keys()) == with_data(ref.offset_keys())
        assert sorted(f.offset_keys()) == sorted(ref.offset_keys())
        assert f.metadata() == ref.metadata()
        for k in ref.keys():
            assert _same(f.get_tensor(k), ref.get_tensor(k))
            assert f.get_slice(k).get_dtype() == ref.get_slice(k).get_dtype()
            assert f.get_slice(k).get_shape() == ref.get_slice(k).get_shape()


@needs_safetensors
@pytest.mark.parametrize("case", CASES)
def test_metaload_writes_safetensors_reads(tmp_path, case):
    tensors, metadata = _case(case)
    mine = str(tmp_path / "m.safetensors")
    theirs = str(tmp_path / "st.safetensors")
    metaload.save_file(tensors, mine, metadata=metadata)
    _assert_same_tensors(safetensors.torch.load_file(mine), tensors)
    with safetensors.safe_open(mine, framework="pt") as f:
        assert f.metadata() == metadata
    safetensors.torch.save_file({k: v.contiguous() for k, v in tensors.items()}, theirs,
                                metadata=metadata)
    if case in IDENTICAL:
        with open(mine, "rb") as a, open(theirs, "rb") as b:
            assert a.read() == b.read()
    else:  # the same header, once parsed
        assert _header(mine) == _header(theirs)
        with open(mine, "rb") as a, open(theirs, "rb") as b:
            ma, mb = a.read(), b.read()
        assert ma[8 + struct.unpack("<Q", ma[:8])[0]:] == mb[8 + struct.unpack("<Q", mb[:8])[0]:]


def test_header_bytes_follow_the_format(tmp_path):
    """Without the safetensors package too: the exact bytes of a file whose names sort against
    safetensors' dtype order within each size (I64 before F64, F32 before I32, BF16 before F16,
    U8 before BOOL, whatever the names)."""
    path = tmp_path / "h.safetensors"
    metaload.save_file({"a": torch.zeros(2, dtype=torch.int32), "b": torch.zeros(1),
                        "c": torch.zeros(2, dtype=torch.float64),
                        "e": torch.zeros(3, dtype=torch.int64),
                        "f": torch.zeros(1, dtype=torch.float16),
                        "g": torch.zeros(1, dtype=torch.bfloat16),
                        "d": torch.zeros(1, dtype=torch.bool),
                        "h": torch.zeros(2, dtype=torch.uint8)}, path, metadata={"k": "v"})
    data = path.read_bytes()
    n = struct.unpack("<Q", data[:8])[0]
    text = ('{"__metadata__":{"k":"v"},'
            '"e":{"dtype":"I64","shape":[3],"data_offsets":[0,24]},'
            '"c":{"dtype":"F64","shape":[2],"data_offsets":[24,40]},'
            '"b":{"dtype":"F32","shape":[1],"data_offsets":[40,44]},'
            '"a":{"dtype":"I32","shape":[2],"data_offsets":[44,52]},'
            '"g":{"dtype":"BF16","shape":[1],"data_offsets":[52,54]},'
            '"f":{"dtype":"F16","shape":[1],"data_offsets":[54,56]},'
            '"h":{"dtype":"U8","shape":[2],"data_offsets":[56,58]},'
            '"d":{"dtype":"BOOL","shape":[1],"data_offsets":[58,59]}}')
    assert n % 8 == 0 and data[8:8 + n] == (text + " " * (n - len(text))).encode()
    assert len(data) == 8 + n + 59


@needs_safetensors
def test_slices_match_safetensors(tmp_path):
    path = str(tmp_path / "s.safetensors")
    w = torch.arange(6 * 8 * 3, dtype=torch.float32).reshape(6, 8, 3)
    safetensors.torch.save_file({"w": w, "v": torch.arange(10, dtype=torch.int16)}, path)
    keys = [(Ellipsis,), (slice(1, 4),), (slice(None), slice(2, 5)), (slice(None), slice(2, 5), 1),
            (2,), (-1,), (slice(-3, None),), (slice(None), slice(None), slice(0, 2)),
            (slice(4, 100),), (slice(2, 2),)]
    with metaload.safe_open(path) as f, safetensors.safe_open(path, framework="pt") as ref:
        for key in keys:
            k = key[0] if len(key) == 1 else key
            assert _same(f.get_slice("w")[k], ref.get_slice("w")[k]), key
            assert _same(f.get_slice("w")[k], w[k]), key
        assert _same(f.get_slice("v")[3:7], ref.get_slice("v")[3:7])


def test_slices_are_torch_indexing(tmp_path):
    path = tmp_path / "s.safetensors"
    w = torch.randn(5, 6, 7)
    metaload.save_file({"w": w, "zero_d": torch.tensor(4)}, path)
    with metaload.safe_open(path) as f:
        s = f.get_slice("w")
        assert s.get_shape() == [5, 6, 7] and s.get_dtype() == "F32" and len(s) == 5
        for k in [Ellipsis, slice(1, 3), (slice(None), slice(2, 4)), (1, slice(None), 3),
                  (slice(None, None, 2),), (-1, -2)]:
            got = s[k]
            assert torch.equal(got, w[k]) and got.is_contiguous()
        assert s[...].data_ptr() != f.get_slice("w")[...].data_ptr()  # each read owns its memory
        assert f.get_slice("zero_d")[...].item() == 4 and f.get_slice("zero_d").get_shape() == []
        with pytest.raises(KeyError, match="nope"):
            f.get_tensor("nope")


@pytest.mark.parametrize("case", CASES)
def test_load_file_mmap_gives_the_same_tensors(tmp_path, case):
    tensors, metadata = _case(case)
    path = tmp_path / "m.safetensors"
    metaload.save_file(tensors, path, metadata=metadata)
    mapped = metaload.load_file(path, mmap=True)
    _assert_same_tensors(mapped, tensors)
    assert list(mapped) == list(metaload.load_file(path))  # file order, as the copying load


def test_load_file_mmap_maps_the_file_copy_on_write(tmp_path):
    path = str(tmp_path / "w.safetensors")
    want = {"a": torch.arange(4096.0), "b": torch.ones(64, 64, dtype=torch.bfloat16)}
    metaload.save_file(want, path)
    before = open(path, "rb").read()
    got = metaload.load_file(path, mmap=True)
    guards = metaload.check_mapped_files(got)
    assert list(guards) == [path] and guards[path] in ("lease", "checked")
    got["a"].add_(1)  # a private copy of the page: the file keeps its bytes
    assert torch.equal(got["a"], want["a"] + 1)
    assert open(path, "rb").read() == before
    assert metaload.check_mapped_files(metaload.load_file(path)) == {}  # the copying load


@needs_safetensors
def test_load_file_mmap_equals_safetensors_load_file(tmp_path):
    path = str(tmp_path / "st.safetensors")
    gen = torch.Generator().manual_seed(1)
    safetensors.torch.save_file({f"w{i}": torch.randn(33, 17, generator=gen).to(dt)
                                 for i, dt in enumerate([torch.float32, torch.bfloat16,
                                                         torch.float16])}, path)
    _assert_same_tensors(metaload.load_file(path, mmap=True), safetensors.torch.load_file(path))


@pytest.mark.parametrize("mmap", [False, True])
def test_load_file_of_a_dtype_this_torch_lacks_is_a_dtype_error(tmp_path, mmap):
    # F8_E4M3: torch 2.x has float8_e4m3fn; Debian's torch 1.13 has not.
    header = json.dumps({"w": {"dtype": "F8_E4M3", "shape": [2], "data_offsets": [0, 2]}})
    header += " " * (-len(header) % 8)
    path = tmp_path / "f8.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header.encode() + b"\x38\xb8")
    if hasattr(torch, "float8_e4m3fn"):
        w = metaload.load_file(path, mmap=mmap)["w"]
        assert w.dtype == torch.float8_e4m3fn and w.float().tolist() == [1.0, -1.0]
    else:
        with pytest.raises(metaload.DTypeError, match=f"{path}: .*no dtype for the file's F8_E4M3"):
            metaload.load_file(path, mmap=mmap)


def test_safe_open_reads_the_header_only(tmp_path):
    path = tmp_path / "lazy.safetensors"
    metaload.save_file({"big": torch.ones(2**20), "small": torch.arange(3)}, path)
    checkpoint.reset_io_bytes_read()
    f = metaload.safe_open(path)
    header_bytes = checkpoint.io_bytes_read()
    n = struct.unpack("<Q", path.read_bytes()[:8])[0]
    assert header_bytes == 8 + n  # the 4 MiB of data are not read
    assert torch.equal(f.get_tensor("small"), torch.arange(3))
    f.close()


def test_load_file_and_safe_open_are_real_inside_meta(tmp_path):
    path = tmp_path / "r.safetensors"
    metaload.save_file({"w": torch.arange(4.0)}, path)
    with metaload.meta():
        loaded = metaload.load_file(path)["w"]
        with metaload.safe_open(path) as f:
            opened = f.get_tensor("w")
        assert torch.empty(1).is_meta  # the mode is still on
    assert torch.equal(loaded, torch.arange(4.0)) and torch.equal(opened, torch.arange(4.0))


def test_save_file_rejects_what_it_cannot_write(tmp_path):
    path = tmp_path / "bad.safetensors"
    with pytest.raises(metaload.FormatValueError) as e:  # safetensors' ValueError
        metaload.save_file([torch.ones(1)], path)
    assert isinstance(e.value, ValueError) and e.value.rule == "not-a-dict"
    with pytest.raises(TypeError, match="names must be str"):
        metaload.save_file({1: torch.ones(1)}, path)
    with pytest.raises(TypeError):
        metaload.save_file({"a": torch.ones(1)}, path, metadata={"n": 1})
    with pytest.raises(metaload.FormatError) as e:
        metaload.save_file({"a": torch.ones(2, device="meta")}, path)
    assert e.value.rule == "no-data" and isinstance(e.value, metaload.Error)
    with pytest.raises(ValueError, match="framework"):
        metaload.safe_open(path, framework="np")
    assert not os.path.exists(path)


def _no_file(path):
    return not os.path.exists(path)


@pytest.mark.parametrize("bad, rule", [
    ({"w": {"a": 1}}, "not-a-tensor"),
    ({"w": torch.ones(2, 3).to_sparse()}, "unsupported-layout"),
    ({"w": torch.ones(4, 4).t()}, "non-contiguous"),
    ({"w": torch.ones(4, 4)[:, ::2]}, "non-contiguous"),
])
def test_what_safetensors_calls_a_value_error_is_a_format_value_error(tmp_path, bad, rule):
    path = str(tmp_path / "v.safetensors")
    for save in (lambda: metaload.save_file(bad, path), lambda: metaload.save(bad)):
        with pytest.raises(ValueError) as e:
            save()
        assert isinstance(e.value, metaload.FormatError) and isinstance(e.value, metaload.Error)
        assert e.value.rule == rule and "'w'" in str(e.value)
    assert _no_file(path)


def test_tensors_sharing_memory_are_refused_naming_each_group(tmp_path):
    a, b = torch.arange(12.0), torch.arange(5.0)
    path = str(tmp_path / "s.safetensors")
    tensors = {"a": a, "a.head": a[:4], "a.tail": a[8:], "b": b, "b.same": b, "c": torch.ones(2)}
    with pytest.raises(metaload.FormatError) as e:
        metaload.save_file(tensors, path)
    assert e.value.rule == "shared-memory" and isinstance(e.value, RuntimeError)
    assert "'a', 'a.head', 'a.tail'; 'b', 'b.same'" in str(e.value) and "'c'" not in str(e.value)
    assert _no_file(path)
    # Disjoint parts of one storage share no byte: written, as safetensors writes them.
    metaload.save_file({"head": a[:4], "tail": a[4:]}, path)
    assert torch.equal(metaload.load_file(path)["tail"], a[4:])


def test_save_safetensors_still_writes_any_strides_and_ties(tmp_path):
    """checkpoint.save_safetensors is metaload's own writer, not the drop-in: it takes the views
    and tied tensors of a state dict as they are."""
    base = torch.arange(24.0).reshape(6, 4)
    path = str(tmp_path / "any.safetensors")
    metaload.save_safetensors(path, {"t": base.t(), "every_other": base[::2], "c": base})
    got = metaload.load_file(path)
    assert torch.equal(got["t"], base.t()) and torch.equal(got["every_other"], base[::2])
    assert torch.equal(got["c"], base)


def test_save_and_load_in_memory(tmp_path):
    gen = torch.Generator().manual_seed(5)
    tensors = {"w": torch.randn(3, 5, generator=gen), "ids": torch.arange(4),
               "e": torch.empty(0, 2), "s": torch.tensor(1.5)}
    data = metaload.save(tensors, metadata={"format": "pt"})
    path = tmp_path / "f.safetensors"
    metaload.save_file(tensors, path, metadata={"format": "pt"})
    assert data == path.read_bytes()
    for source in (data, bytearray(data), memoryview(data)):
        _assert_same_tensors(metaload.load(source), tensors)
    with pytest.raises(TypeError):
        metaload.load(str(path))
    with pytest.raises(metaload.FormatError, match="^<bytes>: ") as e:
        metaload.load(data[:20])
    assert "metaload-load-" not in str(e.value)
    with pytest.raises(metaload.FormatError) as e:  # the C++ writer's refusal, on <bytes>
        metaload.save({"m": torch.ones(2, device="meta")})
    assert e.value.rule == "no-data" and str(e.value).startswith("<bytes>: ")


def _one_tensor_file(path, dtype, shape, nbytes):
    header = json.dumps({"w": {"dtype": dtype, "shape": shape, "data_offsets": [0, nbytes]}})
    header += " " * (-len(header) % 8)
    path.write_bytes(struct.pack("<Q", len(header)) + header.encode() + bytes(nbytes))
    return path


# Every dtype safetensors 0.8 knows, by name, with its bits a value (the torch names are the
# library's table's, checked against torch and safetensors' writer below).
FORMAT_DTYPES = [
    ("BOOL", 8), ("F4", 4), ("F6_E2M3", 6), ("F6_E3M2", 6), ("U8", 8), ("I8", 8), ("F8_E5M2", 8),
    ("F8_E4M3", 8), ("F8_E8M0", 8), ("F8_E4M3FNUZ", 8), ("F8_E5M2FNUZ", 8), ("I16", 16),
    ("U16", 16), ("F16", 16), ("BF16", 16), ("I32", 32), ("U32", 32), ("F32", 32), ("C64", 64),
    ("F64", 64), ("I64", 64), ("U64", 64)]


def _row(name):
    from metaload import _safetensors
    return next(d for d in _safetensors.format_dtypes() if d.name == name)


def test_format_dtypes_are_safetensors_0_8s():
    from metaload import _safetensors
    rows = _safetensors.format_dtypes()
    assert sorted((d.name, d.bits) for d in rows) == sorted(FORMAT_DTYPES)
    assert rows is _safetensors.format_dtypes()  # read from the library once
    for d in rows:  # only F4 packs (two values a torch element); F6 has no torch dtype
        assert d.values_per_element == (2 if d.name == "F4" else 1), d
        assert (d.torch is None) == d.name.startswith("F6_"), d


@pytest.mark.parametrize("name", [n for n, _ in FORMAT_DTYPES])
def test_format_dtypes_agree_with_torch(tmp_path, name):
    """Each table row's torch attribute is a dtype of this torch (where it has it: 1.13 lacks the
    unsigned 16-64 bit integers, float8 and float4) whose element holds values_per_element values
    of the row's bits; a tensor of it round-trips save_file / load_file (dtype, shape, bytes), and
    safetensors' own writer stores it under the row's name."""
    row = _row(name)
    dtype = getattr(torch, row.torch, None) if row.torch else None
    if dtype is None:
        pytest.skip(f"torch {torch.__version__} has no dtype for {name}")
    assert isinstance(dtype, torch.dtype)
    assert torch.empty(0, dtype=dtype).element_size() * 8 == row.bits * row.values_per_element
    raw = torch.arange(48, dtype=torch.uint8).reshape(3, 16)  # rows of whole 1-8 byte elements
    t = (raw % 2 if name == "BOOL" else raw).view(dtype)
    metaload.save_file({"w": t}, tmp_path / "a.safetensors")
    header = _header(tmp_path / "a.safetensors")
    assert header["w"]["dtype"] == name
    assert header["w"]["shape"] == list(t.shape[:-1]) + [t.shape[-1] * row.values_per_element]
    got = metaload.load_file(tmp_path / "a.safetensors")["w"]
    assert got.dtype == dtype and got.shape == t.shape
    assert torch.equal(got.view(torch.uint8), t.view(torch.uint8))
    if safetensors is not None:
        import safetensors.torch as st
        data = st.save({"w": t})
        n = struct.unpack("<Q", data[:8])[0]
        assert json.loads(data[8:8 + n])["w"]["dtype"] == name


@pytest.mark.parametrize("mmap", [False, True])
@pytest.mark.parametrize("name, bits", FORMAT_DTYPES)
def test_every_format_dtype_is_read(tmp_path, name, bits, mmap):
    """The header of every 0.8 dtype parses (describe, safe_open); its tensor loads where torch
    has the dtype, else a DTypeError names the dtype, the tensor and the file."""
    shape = [2, 4]  # 8 values: a whole number of bytes for the 4- and 6-bit dtypes too
    path = _one_tensor_file(tmp_path / f"{name}.safetensors", name, shape, 8 * bits // 8)
    info = metaload.describe(str(path))
    assert info.n_tensors == 1 and info.stored_bytes == 8 * bits // 8
    with metaload.safe_open(path) as f:
        assert f.get_slice("w").get_dtype() == name and f.get_slice("w").get_shape() == shape
    attr = _row(name).torch
    dtype = getattr(torch, attr, None) if attr else None
    if dtype is None:
        with pytest.raises(metaload.DTypeError) as e:
            metaload.load_file(path, mmap=mmap)
        assert str(e.value).startswith(f"{path}: tensor 'w': ") and name in str(e.value)
        with pytest.raises(metaload.DTypeError, match=f"tensor 'w': .*{name}"):
            metaload.safe_open(path).get_tensor("w")
        return
    w = metaload.load_file(path, mmap=mmap)["w"]
    want = [2, 2] if name == "F4" else shape  # float4_e2m1fn_x2 holds two F4 values a byte
    assert w.dtype == dtype and list(w.shape) == want
    assert w.view(torch.uint8).sum().item() == 0
    with metaload.safe_open(path) as f:
        assert f.get_tensor("w").dtype == dtype and list(f.get_tensor("w").shape) == want


def test_f4_with_an_odd_last_dimension_names_the_tensor(tmp_path):
    if not hasattr(torch, "float4_e2m1fn_x2"):
        pytest.skip(f"torch {torch.__version__} has no float4_e2m1fn_x2")
    path = _one_tensor_file(tmp_path / "odd.safetensors", "F4", [2, 3], 3)
    with pytest.raises(metaload.FormatError) as e:
        metaload.load_file(path)
    assert e.value.rule == "unsupported-dtype" and "'w'" in str(e.value) and "[2, 3]" in str(e.value)
    with pytest.raises(metaload.FormatError, match="'w'.*unsupported-dtype"):
        metaload.safe_open(path).get_tensor("w")
    with pytest.raises(metaload.FormatError, match="0-d"):
        metaload.save_file({"s": torch.tensor([0], dtype=torch.uint8).view(
            torch.float4_e2m1fn_x2).reshape(())}, tmp_path / "s.safetensors")


def test_f4_loads_into_a_module(tmp_path):
    """load_into plans F4 as torch holds it: the module's float4_e2m1fn_x2 [n, k/2]."""
    if not hasattr(torch, "float4_e2m1fn_x2"):
        pytest.skip(f"torch {torch.__version__} has no float4_e2m1fn_x2")
    f4 = torch.float4_e2m1fn_x2
    packed = torch.arange(8, dtype=torch.uint8).reshape(2, 4).view(f4)
    path = tmp_path / "m.safetensors"
    metaload.save_file({"packed": packed}, path)
    module = torch.nn.Module()
    module.register_buffer("packed", torch.empty(2, 4, dtype=f4, device="meta"))
    metaload.load_into(module, str(path))
    assert module.packed.dtype == f4 and list(module.packed.shape) == [2, 4]
    assert module.packed.view(torch.uint8).tolist() == packed.view(torch.uint8).tolist()
