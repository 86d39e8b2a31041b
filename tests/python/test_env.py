"""The environment route from Python: LD_PRELOAD=libmetaload.so METALOAD=meta python program.py."""
import os

from conftest import ROOT, run_python

VIT = """
import torch, torchvision
m = torchvision.models.vit_b_16()
tensors = list(m.parameters()) + list(m.buffers())
print("meta" if all(t.is_meta for t in tensors) else "real", sum(p.numel() for p in m.parameters()))
"""


def test_unmodified_python_program_builds_vit_b_16_on_meta():
    r = run_python(VIT, env={"METALOAD": "meta", "METALOAD_REPORT": "1"}, preload=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["meta", "86567656"]
    # One summary line on exit, nothing else (no warnings from kernel registration either).
    assert r.stderr.startswith("metaload: ") and "tensors forced onto meta" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_off_or_unset_has_no_effect():
    for env in ({"METALOAD": "off"}, {}):
        r = run_python(VIT + "\nimport metaload\nprint(torch.ops.metaload.mode_key_registered())",
                       env=env, preload=True)
        assert r.returncode == 0, r.stderr
        assert r.stdout.split() == ["real", "86567656", "False"], env
        assert r.stderr == "", r.stderr


def test_empty_is_unset_as_the_readme_says():
    # A shell's `METALOAD= prog`, a Dockerfile's `ENV METALOAD=`: switched off, not a bad value.
    r = run_python(VIT + "\nimport metaload\nprint(torch.ops.metaload.mode_key_registered())",
                   env={"METALOAD": "", "METALOAD_REPORT": ""}, preload=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["real", "86567656", "False"]
    assert r.stderr == "", r.stderr
    readme = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    said = " ".join(readme.split())
    assert ("`METALOAD=off`, an empty `METALOAD=` or no `METALOAD` at all has no effect; any other "
            "value stops the process") in said
    assert "`METALOAD_REPORT=1` prints one summary line on exit; `0`, empty or unset prints none" \
        in said


def test_a_bad_value_is_shown_escaped_on_one_line():
    r = run_python("print('the program ran')", env={"METALOAD": "me\nta\x7f"}, preload=True)
    assert r.returncode == 2 and "the program ran" not in r.stdout
    assert r.stderr.strip() == ("metaload: METALOAD='me\\nta\\x7f' is not valid: accepted values "
                                "are 'meta' (build every tensor on the meta device) and 'off', "
                                "empty or unset (no effect)"), r.stderr


def test_invalid_value_stops_the_process_at_start():
    r = run_python("print('the program ran')", env={"METALOAD": "1"}, preload=True)
    assert r.returncode == 2
    assert "the program ran" not in r.stdout
    assert "METALOAD='1' is not valid" in r.stderr
    assert "'meta'" in r.stderr and "'off'" in r.stderr


def test_invalid_report_value_stops_the_process_at_start():
    r = run_python("print('the program ran')", env={"METALOAD_REPORT": "yes"}, preload=True)
    assert r.returncode == 2
    assert "METALOAD_REPORT='yes' is not valid" in r.stderr


def test_import_metaload_under_preload_works_with_the_same_library():
    code = VIT + """
import metaload
with metaload.real():
    assert torch.zeros(2).device.type == 'cpu'
assert torch.zeros(2).is_meta
print('ok')
"""
    r = run_python(code, env={"METALOAD": "meta"}, preload=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[-1] == "ok"


def test_unmodified_program_data_dependent_reads_name_the_op():
    code = """
import torch
t = torch.zeros(3)
for read in (lambda: t.sum().item(), lambda: t.nonzero(), lambda: torch.unique(t)):
    try:
        read()
        print("no-error")
    except RuntimeError as e:
        first = str(e).splitlines()[0]
        print(first.startswith("[metaload.DataDependentError] aten::"), "RealGuard" in first)
"""
    r = run_python(code, env={"METALOAD": "meta"}, preload=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["True", "True"] * 3, r.stdout
