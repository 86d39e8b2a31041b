"""A load into a module that another thread is reading never frees memory under the reader.

torch kernels release the GIL and keep only a tensor's data pointer: a load that swapped a real
parameter's storage freed the memory a reader's `sum` or forward was still using (a segfault in
the reader). A real target of the same shape, dtype and device is now written in place, as
torch's load_state_dict does (loader/load/swap.h). Each case runs in a child process, so a crash
is a failed test, not a dead pytest; thousands of loads run against a reader that never stops.
"""
import os
import subprocess
import sys
import textwrap

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))

SCRIPT = textwrap.dedent(r"""
    import sys, threading
    import torch
    sys.path.insert(0, sys.argv[1])
    import metaload
    from metaload.checkpoint import save_safetensors

    kind, loads, folder = sys.argv[2], int(sys.argv[3]), sys.argv[4]
    torch.manual_seed(0)

    def make():
        return torch.nn.Sequential(*[torch.nn.Linear(384, 384) for _ in range(4)])

    paths = []
    for k in range(2):  # two checkpoints, loaded in turn, so every load changes the values
        m = make()
        paths.append(f"{folder}/w{k}.safetensors")
        save_safetensors(paths[-1], m)
    model = make()
    x = torch.randn(64, 384)
    stop = threading.Event()
    reads = [0]

    def reader():
        with torch.no_grad():
            while not stop.is_set():
                if kind == "sum":
                    for p in model.parameters():
                        p.sum()
                else:
                    model(x)
                reads[0] += 1

    threads = [threading.Thread(target=reader) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        for i in range(loads):
            metaload.load_into(model, paths[i % 2], progress=False, mmap=(i % 3 == 0))
    finally:
        stop.set()
        for t in threads:
            t.join()
    ref = dict(metaload.load_file(paths[(loads - 1) % 2]))
    for name, t in model.state_dict().items():
        assert torch.equal(t, ref[name]), name
    print("reads", reads[0], "loads", loads)
""")


@pytest.mark.parametrize("kind", ["sum", "forward"])
def test_loads_while_other_threads_read_the_parameters(kind, tmp_path):
    env = dict(os.environ)
    r = subprocess.run([sys.executable, "-c", SCRIPT, os.path.join(HERE, "..", "..", "python"),
                        kind, "3000", str(tmp_path)],
                       capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, (r.returncode, r.stdout[-2000:], r.stderr[-4000:])
    reads = int(r.stdout.split()[1])
    assert reads > 0, r.stdout  # the readers really ran alongside the loads


def test_a_real_parameter_is_written_in_place(tmp_path):
    import torch
    import metaload
    from metaload.checkpoint import save_safetensors
    torch.manual_seed(3)
    src = torch.nn.Linear(8, 4)
    path = str(tmp_path / "w.safetensors")
    save_safetensors(path, src)
    model = torch.nn.Linear(8, 4)
    weight = model.weight
    ptr = weight.data_ptr()
    version = weight._version
    metaload.load_into(model, path, progress=False)
    # Same storage (never freed under a reader), new values, a bumped version as copy_ leaves.
    assert weight.data_ptr() == ptr and torch.equal(weight, src.weight)
    assert weight._version > version and weight.requires_grad and weight.is_leaf
    # A dtype change still replaces the storage (documented), with the right values.
    metaload.load_into(model, path, dtype=torch.bfloat16, progress=False)
    assert weight.dtype == torch.bfloat16 and torch.equal(weight, src.weight.to(torch.bfloat16))
