"""metaload.load_into: a torchvision resnet50 exported with the project's safetensors writer and
loaded back into a meta-built model gives the same outputs as load_state_dict of the same weights;
errors are typed and leave the module as it was."""
import pytest
import torch
import torchvision

from metaload import _lib
from metaload._load import load_into
from metaload.checkpoint import save_safetensors

MismatchError = _lib.error_class("MismatchError")


@pytest.fixture(scope="module")
def resnet(tmp_path_factory):
    torch.manual_seed(0)
    ref = torchvision.models.resnet50()
    # Non-trivial batch-norm statistics, so the buffers matter in eval mode.
    with torch.no_grad():
        for m in ref.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.uniform_(-0.1, 0.1)
                m.running_var.uniform_(0.5, 1.5)
                m.num_batches_tracked.fill_(7)
    path = str(tmp_path_factory.mktemp("resnet") / "resnet50.safetensors")
    save_safetensors(path, ref)
    return ref.eval(), path


def test_resnet50_same_outputs_as_load_state_dict(resnet):
    ref, path = resnet
    expected = torchvision.models.resnet50()
    expected.load_state_dict(ref.state_dict())
    expected.eval()

    model = torchvision.models.resnet50().to("meta")  # no weight memory
    conv1 = model.conv1.weight  # a reference taken before the load
    report = load_into(model, path, progress=False)
    model.eval()
    assert conv1 is model.conv1.weight and conv1.device.type == "cpu"
    assert conv1.requires_grad
    assert report.engine == "cpu" and report.slot_bytes == sum(
        t.numel() * t.element_size() for t in ref.state_dict().values())
    assert model.bn1.num_batches_tracked.item() == 7
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        assert torch.equal(model(x), expected(x))


def test_bfloat16_load_and_previous_weights(resnet):
    ref, path = resnet
    model = torchvision.models.resnet50()  # real weights: replaced in place
    fc = model.fc.weight
    load_into(model, path, dtype=torch.bfloat16, progress=False)
    assert fc.dtype == torch.bfloat16
    assert torch.equal(fc, ref.fc.weight.to(torch.bfloat16))
    assert model.bn1.num_batches_tracked.dtype == torch.int64  # integers keep their dtype


def test_mismatch_lists_everything_and_changes_nothing(resnet):
    _, path = resnet
    model = torchvision.models.resnet18().to("meta")
    with pytest.raises(MismatchError) as e:
        load_into(model, path, progress=False)
    msg = str(e.value)
    assert "0 missing, 198 unexpected, 24 mismatched" in msg
    assert "unexpected: layer1.0.conv3.weight" in msg
    # The message shows 20 of each kind; the error's lists hold them all.
    assert "\n  ... and 178 more unexpected" in msg and "\n  ... and 4 more mismatched" in msg
    assert len(e.value.unexpected) == 198 and len(e.value.mismatched) == 24
    assert "fc.weight" in e.value.mismatched and "layer4.2.conv3.weight" in e.value.unexpected
    assert all(p.is_meta for p in model.parameters())


def test_bad_requests_are_typed(resnet, tmp_path):
    _, path = resnet
    model = torchvision.models.resnet50().to("meta")
    with pytest.raises(_lib.error_class("ResolveError")):
        load_into(model, str(tmp_path / "nothing-here"), progress=False)
    with pytest.raises(_lib.error_class("PlanError"), match="TP plan"):
        load_into(model, path, tp_size=2, progress=False)
    if not torch.cuda.is_available():
        with pytest.raises(_lib.Error):
            load_into(model, path, device="cuda", progress=False)
    assert all(p.is_meta for p in model.parameters())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_resnet50_onto_cuda(resnet):
    ref, path = resnet
    model = torchvision.models.resnet50().to("meta")
    report = load_into(model, path, device="cuda", dtype=torch.bfloat16, progress=False)
    assert report.engine.startswith("staged:cuda")
    for name, t in model.state_dict().items():
        assert t.is_cuda, name
        want = ref.state_dict()[name]
        want = want.to(torch.bfloat16) if want.is_floating_point() else want
        assert torch.equal(t.cpu(), want), name


def test_load_into_inside_the_meta_mode(resnet):
    import metaload
    if not hasattr(metaload, "meta"):
        pytest.skip("this tree has no metaload.meta() (c10_ext)")
    ref, path = resnet
    with metaload.meta():
        model = torchvision.models.resnet50()
        assert model.conv1.weight.is_meta
        load_into(model, path, progress=False)  # real data even inside meta()
    model.eval()
    assert model.conv1.weight.device.type == "cpu"
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        assert torch.equal(model(x), ref(x))


def test_resnet50_zero_copy_same_outputs_and_file_untouched(resnet):
    ref, path = resnet
    with open(path, "rb") as f:
        before = f.read()
    model = torchvision.models.resnet50().to("meta")
    report = load_into(model, path, progress=False, mmap=True)
    assert report.engine == "cpu+mapped" and report.mapped_bytes == report.slot_bytes
    model.eval()
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        assert torch.equal(model(x), ref(x))
        model.conv1.weight.mul_(2)  # copy-on-write: the checkpoint file never changes
    with open(path, "rb") as f:
        assert f.read() == before


# ---------------------------------------------------------------------------------------------
# The zero-copy contract (README, Reliability; loader/engine/file_mapping.h): a mapped file truncated or
# overwritten in place, or replaced by rename, after the load.

import os  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import textwrap  # noqa: E402
import time  # noqa: E402

import metaload  # noqa: E402

FileChangedError = _lib.error_class("FileChangedError")


class Small(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(256, 512)
        self.b = torch.nn.Linear(512, 256)

    def forward(self, x):
        return self.b(self.a(x))


@pytest.fixture
def small(tmp_path):
    torch.manual_seed(1)
    ref = Small()
    path = str(tmp_path / "small.safetensors")
    save_safetensors(path, ref)
    day_ago = os.stat(path).st_mtime - 86400  # a write in place then changes the mtime for sure
    os.utime(path, (day_ago, day_ago))
    return ref, path


def mapped(path):
    model = Small().to("meta")
    assert load_into(model, path, progress=False, mmap=True).engine == "cpu+mapped"
    return model


def same(model, ref):
    return all(torch.equal(a, b) for a, b in zip(model.state_dict().values(),
                                                  ref.state_dict().values()))


def rss_file_kib():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("RssFile:"))


def test_zero_copy_warm_load_maps_lazily_and_pages_arrive_at_first_touch(small):
    # A leased file whose pages are cached: the load faults none in (a warm load returns at once,
    # as safetensors' does); reading the weights does. Cold pages are read during the load
    # (tests/loader/file_mapping_test.cc: FileMappingPopulate).
    ref, path = small
    mapped(path)  # first call: the library's own code pages fault in here, not below
    before = rss_file_kib()
    model = mapped(path)
    if metaload.check_mapped_files(model) != {path: "lease"}:
        pytest.skip("no read lease here: every page is populated during the load")
    loaded = rss_file_kib()
    assert same(model, ref)  # touches every page of the weights (1 MiB)
    touched = rss_file_kib()
    assert loaded - before < 256, (before, loaded, touched)
    assert touched - loaded > 900, (before, loaded, touched)


PAGE = 4096


def cached_pages(path):
    """(pages of the file in the page cache, pages), by mincore over a fresh mapping of it."""
    import ctypes
    import mmap as mmap_module
    libc = ctypes.CDLL(None, use_errno=True)
    size = os.path.getsize(path)
    n = -(-size // mmap_module.PAGESIZE)
    vec = (ctypes.c_ubyte * n)()
    with open(path, "rb") as f:
        m = mmap_module.mmap(f.fileno(), 0, access=mmap_module.ACCESS_COPY)
        view = ctypes.c_char.from_buffer(m)
        rc = libc.mincore(ctypes.c_void_p(ctypes.addressof(view)), ctypes.c_size_t(size), vec)
        del view
        m.close()
    assert rc == 0, ctypes.get_errno()
    return sum(v & 1 for v in vec), n


def mapped_rss_kib(tensor):
    """Resident KiB of the mapping that holds `tensor`'s bytes (/proc/self/smaps walks the page
    tables: exact, where RssFile's per-CPU counters lag behind other threads' faults)."""
    ptr = tensor.data_ptr()
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                a, b = (int(x, 16) for x in head.split("-"))
                inside = a <= ptr < b
            elif inside and head == "Rss:":
                return int(line.split()[1])
    raise AssertionError(f"no mapping holds {ptr:#x}")


def cache_only(path, keep):
    """Leaves only pages `keep` of the file in the page cache: all dropped, then those read back
    one by one without readahead (a partial drop would not do: the kernel keeps a large folio
    whole). No mapping may hold the file's pages."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fdatasync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        for p in keep:
            os.pread(fd, PAGE, p * PAGE)
    finally:
        os.close(fd)


def test_zero_copy_mostly_warm_load_returns_lazily_and_reads_the_missing_pages_ahead(small):
    # 8 pages of ~260 not cached (a VM's proactive reclaim leaves a warm file so): the sample
    # finds the file warm, the load maps nothing, and a background thread reads those 8 ahead.
    ref, path = small
    mapped(path)  # the library's own code pages fault in here
    cached, n = cached_pages(path)
    holes = {n * k // 9 for k in range(1, 9)}
    cache_only(path, [p for p in range(n) if p not in holes])
    if cached_pages(path)[0] != n - len(holes):
        pytest.skip("the kernel kept (or dropped) other pages of the file")
    model = mapped(path)
    if metaload.check_mapped_files(model) != {path: "lease"}:
        pytest.skip("no read lease here: every page is populated during the load")
    assert mapped_rss_kib(model.a.weight) == 0  # nothing mapped in the call
    for _ in range(2000):  # a hang guard, not a speed claim: up to 20 s for 8 pages read ahead
        if cached_pages(path)[0] == n:
            break
        time.sleep(0.01)
    assert cached_pages(path)[0] == n  # read ahead, before any touch
    assert mapped_rss_kib(model.a.weight) == 0  # and still not mapped
    assert same(model, ref)
    assert mapped_rss_kib(model.a.weight) >= 1024  # the touch maps them


def test_zero_copy_cold_load_reads_its_pages_during_the_call(small):
    ref, path = small
    mapped(path)
    cache_only(path, [])
    cached, n = cached_pages(path)
    if cached > 0:
        pytest.skip("the kernel kept the file's pages cached")
    model = mapped(path)
    if metaload.check_mapped_files(model) != {path: "lease"}:
        pytest.skip("no read lease here: every page is populated during the load")
    # Every page read in the call: the first weight's populated (mapped), the rest in the page
    # cache (the kernel's readahead for those populates may bring in a neighbour's pages, which
    # then map lazily, as cached pages do).
    assert mapped_rss_kib(model.a.weight) > 0
    assert cached_pages(path)[0] >= n - 1  # all but (at most) the header's own page
    assert same(model, ref)


@pytest.mark.parametrize("change", ["truncate", "overwrite"])
def test_zero_copy_leased_file_changed_in_place_keeps_the_loaded_weights(small, change):
    ref, path = small
    model = mapped(path)
    guards = metaload.check_mapped_files(model)
    if guards != {path: "lease"}:
        pytest.skip(f"no read lease here: {guards}")
    if change == "truncate":
        os.truncate(path, 0)  # waits while the weights are copied into private memory
    else:
        with open(path, "r+b") as f:
            f.write(b"\xff" * os.path.getsize(path))
    assert metaload.check_mapped_files(model) == {path: "detached"}
    assert same(model, ref)  # every page read: no SIGBUS, no foreign bytes


@pytest.mark.parametrize("change", ["truncate", "overwrite"])
def test_zero_copy_unleased_file_changed_in_place_is_a_typed_error_naming_it(small, change):
    ref, path = small
    with open(path, "r+b") as writer:  # an open writer: the kernel grants no lease
        model = mapped(path)
        assert metaload.check_mapped_files(model) == {path: "checked"}
        assert metaload.check_mapped_files(model.a.weight) == {path: "checked"}
        if change == "truncate":
            writer.truncate(100)
        else:
            writer.write(b"\xff" * 4096)
            writer.flush()
        with pytest.raises(FileChangedError) as e:
            metaload.check_mapped_files(model)
    assert isinstance(e.value, _lib.error_class("ReadError"))
    said = "truncated to 100 bytes" if change == "truncate" else "written in place"
    assert f"{path}: the file was {said}" in str(e.value)


def test_zero_copy_files_replaced_by_rename_are_fine(small):
    ref, path = small
    with open(path, "r+b"):  # checked, not leased: the harder case
        model = mapped(path)
        with open(path + ".new", "wb") as f:
            f.write(b"\0" * 1000)
        os.replace(path + ".new", path)
        assert metaload.check_mapped_files(model) == {path: "checked"}
    assert same(model, ref)
    assert metaload.check_mapped_files(torch.zeros(3)) == {}  # nothing mapped


def test_sigbus_on_a_truncated_mapped_file_names_it_before_the_process_ends(small):
    ref, path = small
    script = textwrap.dedent(f"""
        import torch, metaload
        from test_engine_load import Small
        f = open({path!r}, "r+b")  # no lease: the truncation lands under the mapping
        model = Small().to("meta")
        metaload.load_into(model, {path!r}, progress=False, mmap=True)
        assert metaload.check_mapped_files(model) == {{{path!r}: "checked"}}
        f.truncate(0)
        print(float(model.b.weight.sum()))  # reads a page past the end
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env,
                       cwd=os.path.dirname(os.path.abspath(__file__)))
    assert r.returncode == -signal.SIGBUS, (r.returncode, r.stderr)
    assert f"metaload: SIGBUS reading {path} at byte " in r.stderr, r.stderr
    assert "mapped zero-copy" in r.stderr and r.stdout == ""
