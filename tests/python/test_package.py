"""The package as a user meets it: its version, and a library built for another torch refused at
import with one message naming both versions (never an undefined-symbol trace or a crash)."""
import os
import re
import subprocess
import sys

import pytest
import torch

import metaload
from metaload import _lib

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def test_version_is_the_one_written_in_base_version_h():
    with open(os.path.join(ROOT, "base", "version.h")) as f:
        want = re.search(r'#define METALOAD_VERSION "([^"]+)"', f.read()).group(1)
    assert metaload.__version__ == want
    assert _lib.build_info()[0] == want


def test_the_library_names_the_torch_it_was_built_for():
    _, built = _lib.build_info()
    assert built.split(".")[:2] == torch.__version__.split(".")[:2], (built, torch.__version__)


@pytest.mark.parametrize("running", ["1.12.1", "2.10.0+cu128", "3.0.0"])
def test_another_torch_is_refused_naming_both_versions(running):
    _, built = _lib.build_info()
    with pytest.raises(ImportError) as info:
        _lib.check_torch_version(_lib.library_path(), torch_version=running)
    assert built in str(info.value) and running in str(info.value)


def test_a_file_without_build_information_is_refused(tmp_path):
    fake = tmp_path / "libmetaload.so"
    fake.write_bytes(b"\x7fELF not really a library" * 100)
    with pytest.raises(ImportError, match="not a metaload library"):
        _lib.build_info(str(fake))


def test_a_real_build_for_the_other_torch_is_refused_at_import():
    """tools/test points METALOAD_OTHER_TORCH_LIB at the build made for the other torch (Bazel's for
    1.13 when this runs on 2.x, and the reverse)."""
    other = os.environ.get("METALOAD_OTHER_TORCH_LIB")
    if not other or not os.path.exists(other):
        pytest.skip("METALOAD_OTHER_TORCH_LIB names no build for the other torch (tools/test sets it)")
    _, built = _lib.build_info(other)
    assert built.split(".")[:2] != torch.__version__.split(".")[:2]
    env = dict(os.environ, METALOAD_LIB=other, PYTHONPATH=os.path.join(ROOT, "python"))
    env.pop("LD_PRELOAD", None)
    p = subprocess.run([sys.executable, "-c", "import metaload"], env=env, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 1, (p.returncode, p.stderr[-2000:])  # an exception, not a signal
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: metaload:"), p.stderr[-2000:]
    assert built in last and torch.__version__ in last
