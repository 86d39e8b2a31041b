import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "python"))


def lib_path():
    path = os.environ.get("METALOAD_LIB")
    if not path:
        pytest.exit("METALOAD_LIB is not set: tools/test sets it to the built libmetaload.so", 2)
    return os.path.abspath(path)


def offline_worker(script, top):
    """The JSON `script --worker top` prints on its last "RESULT " line, run in a fresh process
    offline (hub cache and HF home under `top`, no METALOAD activation or preload inherited);
    fails the test with the worker's output when it exits badly or prints no result."""
    import json
    env = dict(os.environ, METALOAD_LIB=lib_path(), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               HF_HUB_CACHE=str(top / "hub"), HF_HOME=str(top / "hf-home"),
               PYTHONPATH=os.pathsep.join([os.path.join(ROOT, "python"), HERE,
                                           os.environ.get("PYTHONPATH", "")]))
    for k in ("METALOAD", "LD_PRELOAD"):
        env.pop(k, None)
    r = subprocess.run([sys.executable, script, "--worker", str(top)], env=env,
                       capture_output=True, text=True, timeout=600)
    lines = [line for line in r.stdout.splitlines() if line.startswith("RESULT ")]
    assert r.returncode == 0 and lines, f"worker failed:\n{r.stdout[-3000:]}\n{r.stderr[-5000:]}"
    return json.loads(lines[-1][len("RESULT "):])


def import_safetensors():
    """PyPI's safetensors (its torch module imported too), or None: from this Python's
    site-packages (tools/requirements.txt pins it for the torch 2.x environment), else from the
    torch113-peers folder tools/setup fills beside that environment for Debian's torch 1.13,
    which is on sys.path for this import only (its other packages stay unseen)."""
    try:
        import safetensors
        import safetensors.torch
        return safetensors
    except ImportError:
        pass
    venv = subprocess.run([os.path.join(ROOT, "tools", "torch2_env")], capture_output=True,
                          text=True).stdout.strip()
    peers = os.path.join(os.path.dirname(venv), "torch113-peers")
    if not venv or not os.path.isdir(os.path.join(peers, "safetensors")):
        return None
    sys.path.append(peers)
    try:
        import safetensors
        import safetensors.torch
        return safetensors
    except ImportError:
        return None
    finally:
        sys.path.remove(peers)


def cli_path():
    """The metaload tool of the build under test: METALOAD_CLI, else next to the library."""
    if os.environ.get("METALOAD_CLI"):
        return os.environ["METALOAD_CLI"]
    base = os.path.dirname(lib_path())
    for rel in ("tools/metaload", "tools/cli/metaload"):  # Bazel, CMake
        if os.path.exists(os.path.join(base, rel)):
            return os.path.join(base, rel)
    pytest.fail(f"no metaload tool next to {lib_path()}: build //tools:metaload (or set METALOAD_CLI)")


def run_cli(*args, env=None, timeout=300):
    """Runs the metaload tool of the build under test (METALOAD switched off unless `env` sets
    it); a tool that outlives `timeout` fails the test, naming the subcommand."""
    e = {k: v for k, v in os.environ.items() if k != "METALOAD"}
    e.update(env or {})
    try:
        return subprocess.run([cli_path(), *map(str, args)], capture_output=True, text=True,
                              env=e, timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"metaload {args[0] if args else ''} blocked for {timeout} s")


# The families' test operators (torch.ops.metaload._family_*) live in a test-only library, not in
# libmetaload.so: tests/model/families/libmetaload_test_ops.so beside METALOAD_LIB in both builds
# (CMake's build folder, bazel-bin), or METALOAD_TEST_OPS_LIB.
FAMILY_TEST_OPS = ("_family_test_forward", "_family_test_forward_chunked", "_family_test_generate",
                   "_family_builtin_config", "_family_parameter_names")


def family_test_ops_path():
    return os.environ.get("METALOAD_TEST_OPS_LIB") or os.path.join(
        os.path.dirname(lib_path()), "tests", "model", "families", "libmetaload_test_ops.so")


def family_test_ops():
    """torch.ops.metaload with the families' test operators loaded (after the package's library,
    which the test library links)."""
    import torch
    from metaload import _lib
    ops = _lib.load()
    path = family_test_ops_path()
    if not os.path.exists(path):
        pytest.fail(f"no test operators library at {path}: build the tests (CMake: metaload_test_ops; "
                    "Bazel: //tests/model/families:libmetaload_test_ops.so) or set METALOAD_TEST_OPS_LIB")
    torch.ops.load_library(path)  # once per process: dlopen of a loaded path registers nothing again
    return ops


def run_python(code, env=None, preload=False, timeout=300):
    """Runs `code` in a fresh interpreter (this one); returns the CompletedProcess."""
    e = dict(os.environ)
    e["PYTHONPATH"] = os.path.join(ROOT, "python") + os.pathsep + e.get("PYTHONPATH", "")
    e["METALOAD_LIB"] = lib_path()
    for k in ("METALOAD", "METALOAD_REPORT", "LD_PRELOAD"):
        e.pop(k, None)
    if preload:
        e["LD_PRELOAD"] = lib_path()
    e.update(env or {})
    return subprocess.run([sys.executable, "-c", code], env=e, capture_output=True, text=True,
                          timeout=timeout)


# The start of a probe program (run with run_python) that counts torch's CUDA initialisations:
# torch.cuda._lazy_init is replaced, before metaload wraps it, by a stand-in that records the
# calling thread and raises Sentinel (no GPU is needed to see the calls); attempt(fn) calls fn and
# swallows Sentinel. Inside the scope under test, a probe records `inside = list(calls)`, then
# `during = real_requests_still_initialise()`, and after the scope calls report(inside, during),
# whose first line is CUDA_INIT_EXPECTED when nothing initialised CUDA but the real requests.
CUDA_INIT_COUNTER = r'''
import threading, torch
calls = []
class Sentinel(Exception):
    pass
def counting_lazy_init():
    calls.append(threading.current_thread().name)
    raise Sentinel()
torch.cuda._lazy_init = counting_lazy_init
import metaload

def attempt(fn):
    try:
        fn()
    except Sentinel:
        pass

def real_requests_still_initialise():
    # a thread doing real work meanwhile gets torch's initialisation on its first use, and
    # torch.cuda's own functions are real requests
    worker = threading.Thread(target=attempt, args=(lambda: torch.empty(1, device="cuda"),),
                              name="worker")
    worker.start()
    worker.join()
    attempt(torch.cuda.current_device)
    return list(calls)

def report(inside, during):
    attempt(lambda: torch.empty(1, device="cuda"))  # after the scope, this thread's first use
    print(inside, during, calls)
'''
CUDA_INIT_EXPECTED = "[] ['worker', 'MainThread'] ['worker', 'MainThread', 'MainThread']"


def assert_cuda_initialised_by_real_requests_only(probe):
    """Runs a probe built on CUDA_INIT_COUNTER; asserts its report."""
    r = run_python(probe)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[0] == CUDA_INIT_EXPECTED, r.stdout


def write_tokenizer(d):
    """A small byte-level BPE tokenizer, trained here (no download), saved as transformers does
    (test_nnsight's and the serve tests' tiny GPT-2s)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["the quick brown fox jumps over the lazy dog"] * 8, trainer)
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>",
                            unk_token="<unk>").save_pretrained(d)
