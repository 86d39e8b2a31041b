"""`pip install .` as a user runs it: tools/test installs the package into the torch 2.x environment
and runs this file from outside the source tree, with no METALOAD_LIB and no PYTHONPATH."""
import os
import subprocess
import sys
import sysconfig

import torch

import metaload


def test_imported_from_site_packages_with_its_library_inside():
    site = os.path.realpath(sysconfig.get_paths()["purelib"])
    assert "METALOAD_LIB" not in os.environ and "PYTHONPATH" not in os.environ
    assert os.path.realpath(metaload.__file__).startswith(site), metaload.__file__
    lib = os.path.realpath(metaload.library_path())
    assert lib == os.path.join(os.path.dirname(os.path.realpath(metaload.__file__)), "libmetaload.so")
    assert os.path.exists(os.path.join(os.path.dirname(metaload.__file__), "py.typed"))


def test_it_works():
    with metaload.meta():
        layer = torch.nn.Linear(4096, 4096)
    assert layer.weight.is_meta
    assert metaload.__version__ == metaload.build_info()[0]


def test_the_tool_is_installed_and_finds_the_library():
    tool = os.path.join(os.path.dirname(sys.executable), "metaload")
    p = subprocess.run([tool, "--version"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and p.stdout.strip() == f"metaload {metaload.__version__}", p
    # make-checkpoint runs inside libmetaload.so: the tool must find the package's copy.
    env = {k: v for k, v in os.environ.items() if k != "METALOAD_LIB"}
    p = subprocess.run([tool, "make-checkpoint", "--help"], capture_output=True, text=True,
                       timeout=120, env=env)
    assert p.returncode == 0, p.stderr
