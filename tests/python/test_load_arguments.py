"""load_into's arguments: each wrong one is a typed error naming that argument and its rule (not
a neighbour, not the module), raised before anything loads: tp_size / tp_rank in every
combination, dtype / dequantize, the integer arguments, tp_plan, and key_mapping (a pattern that
is no regex, a replacement that cannot apply, two checkpoint tensors mapped onto one module name,
a module name whose own checkpoint tensor was renamed away). Both torches."""
import pytest
import torch

import metaload
from metaload import _lib


class Two(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(4, 3)
        self.b = torch.nn.Linear(4, 3)


def checkpoint(tmp_path, state=None):
    path = str(tmp_path / "two.safetensors")
    metaload.save_file(state if state is not None else Two().state_dict(), path)
    return path


def meta_two():
    return Two().to("meta")


def untouched(model):
    return all(t.is_meta for t in model.state_dict().values())


@pytest.mark.parametrize("kwargs,message", [
    (dict(tp_size=-1), "tp_size must be from 1 to 2^31-1, got -1"),
    (dict(tp_size=0), "tp_size must be from 1 to 2^31-1, got 0"),
    (dict(tp_size=-1, tp_rank=0), "tp_size must be from 1 to 2^31-1, got -1"),
    (dict(tp_size=-3, tp_rank=5), "tp_size must be from 1 to 2^31-1, got -3"),
    (dict(tp_size=2 ** 31), "tp_size must be from 1 to 2^31-1, got 2147483648"),
    (dict(tp_size=2.0), "tp_size must be from 1 to 2^31-1, got 2.0"),
    (dict(tp_size=True), "tp_size must be from 1 to 2^31-1, got True"),
    (dict(tp_size="2"), "tp_size must be from 1 to 2^31-1, got '2'"),
    (dict(tp_size=2, tp_rank=2), "tp_rank must be from 0 to tp_size - 1 (1), got 2"),
    (dict(tp_size=2, tp_rank=-1), "tp_rank must be from 0 to tp_size - 1 (1), got -1"),
    (dict(tp_size=1, tp_rank=1), "tp_rank must be from 0 to tp_size - 1 (0), got 1"),
    (dict(tp_rank=-1), "tp_rank must be from 0 to tp_size - 1 (0), got -1"),
    (dict(tp_rank=0.0, tp_size=2), "tp_rank must be an integer from 0 to tp_size - 1, got 0.0"),
    (dict(source_rank=-1), "source_rank must be None or a rank of the process group (an integer "
                           ">= 0), got -1"),
    (dict(threads="4"), "threads must be an integer (0: the default), got '4'"),
    (dict(staging_bytes=1.5), "staging_bytes must be an integer (0: the default), got 1.5"),
    (dict(buffer_bytes=None), "buffer_bytes must be an integer (0: the default), got None"),
    (dict(tp_plan=["a"]), "tp_plan must be None or a dict, got ['a']"),
    (dict(tp_plan={"a": "diagonal"}), "tp_plan style 'diagonal' of 'a' is not one of "
                                      "['all_reduce', 'colwise', 'colwise_gather_output', "
                                      "'colwise_rep', 'embedding_rowwise', 'ep_router', 'experts', "
                                      "'grouped_gemm', 'moe_identity_expert', 'moe_tp_experts', "
                                      "'packed_colwise', 'packed_rowwise', "
                                      "'replicated_with_grad_allreduce', 'rowwise', 'rowwise_rep', "
                                      "'rowwise_split_input', 'sequence_parallel']"),
    (dict(key_mapping=[("a", "b")]), "key_mapping must be None or a dict, got [('a', 'b')]"),
    (dict(device="gpu0"), "device must be None, a torch.device or a device string ('cpu', "
                          "'cuda:0'), got 'gpu0'"),
    (dict(device=1.5), "device must be None, a torch.device or a device string ('cpu', "
                       "'cuda:0'), got 1.5"),
    (dict(strict="no"), "strict must be True or False, got 'no'"),
    (dict(mmap=1), "mmap must be True or False or None, got 1"),
    (dict(mmap_fused=None), "mmap_fused must be True or False, got None"),
    (dict(distributed="yes"), "distributed must be True or False or None, got 'yes'"),
    (dict(timeout=-1), "timeout must be None, a positive number of seconds or a timedelta, "
                       "got -1"),
    (dict(timeout="5"), "timeout must be None, a positive number of seconds or a timedelta, "
                        "got '5'"),
])
def test_tensor_parallel_and_integer_arguments_name_themselves(tmp_path, kwargs, message):
    path = checkpoint(tmp_path)
    model = meta_two()
    with pytest.raises(metaload.PlanError) as e:
        metaload.load_into(model, path, progress=False, **kwargs)
    assert str(e.value) == message
    assert untouched(model)


@pytest.mark.parametrize("name", ["dtype", "dequantize"])
@pytest.mark.parametrize("value", [torch.int8, torch.int64, torch.bool, torch.complex64,
                                   "float32", torch.float64])
def test_dtype_arguments_name_themselves_not_the_module(tmp_path, name, value):
    path = checkpoint(tmp_path)
    for tp in ({}, dict(tp_size=2, tp_rank=0)):
        model = meta_two()
        with pytest.raises(metaload.PlanError) as e:
            metaload.load_into(model, path, progress=False, **{name: value}, **tp)
        assert str(e.value).startswith(f"{name} must be float32, float16 or bfloat16 ("), str(e.value)
        assert str(e.value).endswith(f", got {value!r}")
        assert "in the module" not in str(e.value)
        assert untouched(model)


def test_the_library_names_the_dtype_argument_too(tmp_path):
    """The C++ planner's own rule (its other callers: the CLI, TransformersModel)."""
    path = checkpoint(tmp_path)
    model = meta_two()
    state = model.state_dict(keep_vars=True)
    with pytest.raises(metaload.PlanError, match=r"^dtype must be float32, float16 or bfloat16 "
                                                 r"\(.*\), got Char$"):
        _lib.typed_errors(_lib.load().load_into)(list(state.values()), list(state), path, None,
                                                 None, torch.int8)
    assert untouched(model)


def test_a_pattern_that_is_no_regex_is_a_typed_error_and_nothing_loads(tmp_path):
    path = checkpoint(tmp_path)
    for mapping, words in [({"a(": "c"}, ["'a('", "not a valid regular expression",
                                          "missing )"]),
                           ({"^a\\.": "b.", "[": "x"}, ["'['", "not a valid regular expression"]),
                           ({"^a": "\\9"}, ["'^a'", "'\\\\9'",
                                             "cannot rename checkpoint tensor"]),
                           ({"^a": 3}, ["key_mapping entry '^a': 3"])]:
        for strict in (True, False):
            model = meta_two()
            with pytest.raises(metaload.PlanError) as e:
                metaload.load_into(model, path, progress=False, key_mapping=mapping,
                                   strict=strict)
            for w in words:
                assert w in str(e.value), (w, str(e.value))
            assert untouched(model)


def test_two_checkpoint_tensors_onto_one_module_name_name_both_and_their_patterns(tmp_path):
    state = Two().state_dict()
    path = checkpoint(tmp_path, state)
    model = meta_two()
    # 'a.weight' renamed onto 'b.weight', which the checkpoint also has (and keeps).
    with pytest.raises(metaload.PlanError) as e:
        metaload.load_into(model, path, progress=False, key_mapping={r"^a\.": "b."})
    text = str(e.value)
    assert "onto module name 'b.bias'" in text or "onto module name 'b.weight'" in text, text
    assert "by pattern '^a\\\\.'" in text and "by no pattern (it keeps its name)" in text
    assert "'a." in text and "'b." in text
    assert untouched(model)
    # Both renamed, by two patterns.
    with pytest.raises(metaload.PlanError) as e:
        metaload.load_into(model, path, progress=False, strict=False,
                           key_mapping={r"^a\.(.*)": r"c.\1", r"^b\.(.*)": r"c.\1"})
    text = str(e.value)
    assert "onto module name 'c.weight'" in text or "onto module name 'c.bias'" in text, text
    assert "by pattern '^a\\\\.(.*)'" in text and "by pattern '^b\\\\.(.*)'" in text
    assert "two targets" not in text
    assert untouched(model)


def test_a_module_name_renamed_away_is_missing_not_a_duplicate_target(tmp_path):
    """The checkpoint's 'a.*' renamed to 'b.*': the module's own 'a.*' have no tensor now."""
    state = Two().state_dict()
    path = checkpoint(tmp_path, {k: v for k, v in state.items() if k.startswith("a.")})
    model = meta_two()
    with pytest.raises(metaload.MismatchError) as e:
        metaload.load_into(model, path, progress=False, key_mapping={r"^a\.": "b."})
    assert sorted(e.value.missing) == ["a.bias", "a.weight"]
    assert "key_mapping renames the checkpoint's 'a." in str(e.value)
    assert "two targets" not in str(e.value)
    assert untouched(model)
    report = metaload.load_into(model, path, progress=False, strict=False,
                                key_mapping={r"^a\.": "b."})
    assert sorted(report.missing_keys) == ["a.bias", "a.weight"]
    assert torch.equal(model.b.weight, state["a.weight"]) and model.a.weight.is_meta


def test_a_tied_module_name_renamed_away_loads_through_the_tie(tmp_path):
    state = Two().state_dict()
    path = checkpoint(tmp_path, {"a.weight": state["a.weight"], "b.bias": state["b.bias"],
                                 "a.bias": state["a.bias"]})
    model = meta_two()
    model.b.weight = model.a.weight  # tied: one Parameter under two names
    metaload.load_into(model, path, progress=False, key_mapping={r"^a\.weight$": "b.weight"},
                       strict=False)
    assert torch.equal(model.a.weight, state["a.weight"]) and model.b.weight is model.a.weight
