"""Errors cross from C++ to Python as data (issue 23): a metaload::Error leaves its kind, its
message and its class's fields (FormatError's file, tensor, rule and detail, RepoIdError's repo id
and rule, MismatchError's full name lists) in the library's record (base/error.h), and
metaload.<Kind> is built from that record, never from the text. An error made in Python carries the
fields its maker passes; one whose record is gone keeps its kind and message, and its fields are
None: nothing reads names or rules back out of a message."""
import json
import pickle
import struct

import pytest
import torch

import metaload
from metaload import _lib
from metaload import checkpoint as ck


class _NoTextParsing:
    def __getattr__(self, name):
        raise AssertionError(f"_lib parsed an error's text ({name}) although its data was there")


@pytest.fixture
def no_text_parsing(monkeypatch):
    """Every regular expression _lib could read an error's text with raises."""
    for name in ("_prefix", "re"):
        monkeypatch.setattr(_lib, name, _NoTextParsing())


def write_safetensors(path, header, data_bytes):
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"\0" * data_bytes)
    return path


def short_tensor(tmp_path):
    """A file whose tensor 'w' (two floats) has 4 bytes: a FormatError naming file, tensor, rule."""
    return write_safetensors(tmp_path / "short.safetensors",
                             {"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}, 4)


def raw_error(fn, *args):
    """The RuntimeError an operator raises, as torch hands it to Python."""
    with pytest.raises(RuntimeError) as e:
        fn(*args)
    assert not isinstance(e.value, metaload.Error)
    return e.value


def test_a_format_error_arrives_with_its_file_tensor_and_rule(tmp_path, no_text_parsing):
    path = str(short_tensor(tmp_path))
    with pytest.raises(metaload.FormatError) as e:
        metaload.load_file(path)
    err = e.value
    assert type(err) is metaload.FormatError
    assert (err.file, err.tensor, err.rule) == (path, "w", "size-mismatch")
    assert str(err) == f"{path}: tensor 'w': {err.detail} (rule size-mismatch)"  # the message as it was
    with pytest.raises(metaload.FormatError) as e:  # the bytes' temporary file is not named
        metaload.load(open(path, "rb").read())
    assert (e.value.file, e.value.rule) == ("<bytes>", "size-mismatch")
    again = pickle.loads(pickle.dumps(err))  # pickling keeps the data
    assert (type(again), again.file, again.tensor, again.rule) == (
        metaload.FormatError, path, "w", "size-mismatch")


def test_the_kind_and_rule_come_from_the_record_not_from_the_text(tmp_path):
    path = str(short_tensor(tmp_path))
    raw = raw_error(torch.ops.metaload.load_file, path, "cpu", False)
    # Text that a parser would read as a PlanError with rule "forged": the record says otherwise.
    wrapped = RuntimeError(f"[metaload.PlanError] while loading: {raw} (rule forged)")
    err = _lib.translate(wrapped)
    assert type(err) is metaload.FormatError and err.rule == "size-mismatch" and err.tensor == "w"
    assert str(err) == str(raw).split("\nException raised from")[0][len("[metaload.FormatError] "):]


def test_a_shard_error_arrives_with_its_file_and_rule(tmp_path, no_text_parsing):
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"weight": "model-00001-of-00002.safetensors"}}))
    with pytest.raises(metaload.ShardError) as e:
        metaload.load_into(torch.nn.Linear(1, 1).to("meta"), str(tmp_path), progress=False)
    err = e.value
    assert type(err) is metaload.ShardError and err.rule == "missing-shard"
    assert err.file and err.file in str(err) and err.detail in str(err)
    assert str(err).endswith(" (rule missing-shard)")


def test_a_repo_id_error_arrives_with_its_repo_id_and_rule(no_text_parsing):
    key = "metaload.TransformersModel:" + json.dumps({"repo_id": "../x", "revision": None})
    with pytest.raises(metaload.RepoIdError) as e:
        ck.from_model_key(key)
    assert (e.value.repo_id, e.value.rule) == ("../x", "repo-id-parent-dir")
    assert isinstance(e.value, metaload.ModelKeyError)


class Many(torch.nn.Module):
    def __init__(self, n):
        super().__init__()
        for i in range(n):
            self.register_parameter(f"p{i:02d}", torch.nn.Parameter(torch.zeros(2)))


def test_a_mismatch_error_arrives_with_every_name(tmp_path, no_text_parsing):
    path = tmp_path / "one.safetensors"
    metaload.save_file({"zz": torch.ones(1), "p00": torch.ones(3)}, path)
    with pytest.raises(metaload.MismatchError) as e:
        metaload.load_into(Many(30).to("meta"), str(path), progress=False)
    err = e.value
    assert err.missing == [f"p{i:02d}" for i in range(1, 30)]  # 29: the message shows 20
    assert err.unexpected == ["zz"] and err.mismatched == ["p00"]
    assert str(err).count("\n  missing: ") == 20 and "\n  ... and 9 more missing" in str(err)
    assert pickle.loads(pickle.dumps(err)).missing == err.missing


def test_an_error_whose_record_is_gone_keeps_its_kind_and_message_only(tmp_path):
    path = tmp_path / "one.safetensors"
    metaload.save_file({"zz": torch.ones(1)}, path)
    with pytest.raises(RuntimeError) as e:
        torch.ops.metaload.load_into(list(Many(30).to("meta").parameters()),
                                     [f"p{i:02d}" for i in range(30)], str(path),
                                     progress_bar=False)
    raw = e.value
    assert not isinstance(raw, metaload.Error)
    assert len(_lib.translate(raw).missing) == 30  # from the record
    for _ in range(40):  # newer errors push it out of the record
        with pytest.raises(metaload.FormatError):
            metaload.load_file(str(short_tensor(tmp_path)))
    err = _lib.translate(raw)
    assert type(err) is metaload.MismatchError and "  missing: p00" in str(err)
    assert (err.missing, err.unexpected, err.mismatched) == (None, None, None)  # no guessing
    made = _lib.translate(RuntimeError("[metaload.FormatError] a: b (rule r-1)"))
    assert type(made) is metaload.FormatError and (made.rule, made.file) == (None, None)


def test_errors_made_in_python_carry_the_fields_their_maker_gives():
    made = metaload.MismatchError("x: 2 problems\n  missing: a [2]\n  unexpected: b in f.st",
                                  missing=["a"], unexpected=["b"], mismatched=[])
    assert (made.missing, made.unexpected, made.mismatched) == (["a"], ["b"], [])
    assert metaload.ShardError("i.json: bad", rule="index-mismatch").rule == "index-mismatch"
    # The message is not read: a rule written only in the text is not a field.
    assert metaload.ShardError("i.json: bad (rule index-mismatch)").rule is None
    assert metaload.DequantError("f: g", rule="tp-boundary").tensor is None
    made.missing = ["a", "c"]  # the fields can be set
    assert pickle.loads(pickle.dumps(made)).missing == ["a", "c"]
    d = pickle.loads(pickle.dumps(metaload.DistributedError("lost", {1: "gone"})))
    assert type(d) is metaload.DistributedError and d.failures == {1: "gone"}


def test_the_python_sites_give_their_fields(tmp_path):
    """The errors metaload raises from Python name their rule and tensors as fields."""
    with pytest.raises(metaload.FormatError) as e:
        metaload.save_file({"a": torch.ones(4, 4).t()}, str(tmp_path / "x.safetensors"))
    assert (e.value.rule, e.value.tensor) == ("non-contiguous", "a")
    with pytest.raises(metaload.FormatError) as e:
        metaload.save_file([torch.ones(1)], str(tmp_path / "x.safetensors"))
    assert e.value.rule == "not-a-dict"
    t = torch.ones(4)
    with pytest.raises(metaload.FormatError) as e:
        metaload.save_file({"a": t, "b": t}, str(tmp_path / "x.safetensors"))
    assert e.value.rule == "shared-memory"
