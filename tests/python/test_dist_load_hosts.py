"""Two hosts: two network namespaces joined by a veth pair (ip netns, Debian's iproute2), one
rank in each, rendezvous over their addresses. The same weights load on both; in broadcast mode
the checkpoint is visible in the first namespace only (the second rank runs in its own mount
namespace with an empty tmpfs over the checkpoint's folder), into a module and into a
tensor-parallel TransformersModel whose greedy tokens are tp 1's. Skips, saying why, where the machine
forbids namespaces (not root, no `ip`, no CAP_NET_ADMIN)."""
import os
import shutil
import subprocess

import pytest
import torch

import metaload
from dist_load_util import GPT2_12, make_fixture, reference, run_ranks, saved, skeleton_spec

SUBNET = "10.231.{}.{}"


def _ip(*args, check=True):
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=20, check=check)


@pytest.fixture
def hosts():
    """(namespace a, its address, interface), (namespace b, ...); removed afterwards."""
    if shutil.which("ip") is None:
        pytest.skip("no `ip` (Debian's iproute2: tools/setup installs it)")
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root (ip netns add); this test runs as uid "
                    f"{os.geteuid()}")
    tag = str(os.getpid() % 100000)
    ns = [f"metaload-a{tag}", f"metaload-b{tag}"]
    dev = [f"mla{tag}", f"mlb{tag}"]
    octet = os.getpid() % 250 + 1
    addr = [SUBNET.format(octet, 1), SUBNET.format(octet, 2)]
    made = []
    try:
        for n in ns:
            r = _ip("netns", "add", n, check=False)
            if r.returncode != 0:
                pytest.skip(f"this machine forbids network namespaces: ip netns add: "
                            f"{r.stderr.strip()}")
            made.append(n)
        _ip("link", "add", dev[0], "type", "veth", "peer", "name", dev[1])
        for n, d, a in zip(ns, dev, addr):
            _ip("link", "set", d, "netns", n)
            _ip("netns", "exec", n, "ip", "addr", "add", f"{a}/24", "dev", d)
            _ip("netns", "exec", n, "ip", "link", "set", d, "up")
            _ip("netns", "exec", n, "ip", "link", "set", "lo", "up")
        yield list(zip(ns, addr, dev))
    finally:
        for n in made:
            _ip("netns", "del", n, check=False)  # takes its end of the veth pair with it


def test_two_hosts_shared_and_broadcast_with_the_checkpoint_on_one_host(hosts, tmp_path):
    (ns_a, addr_a, dev_a), (ns_b, _, dev_b) = hosts
    only_a = tmp_path / "host-a-disk"
    only_a.mkdir()
    ckpt = make_fixture(only_a, "gpt2-12", GPT2_12, shards=2)
    spec = skeleton_spec(ckpt, str(tmp_path / "skeleton.json"))
    ref = {r: reference(ckpt, r, 2) for r in range(2)}
    prefix = {0: ["ip", "netns", "exec", ns_a],
              # host b: its own network and, for the broadcast step, no checkpoint to see
              1: ["ip", "netns", "exec", ns_b, "unshare", "--mount", "--propagation", "private",
                  "sh", "-c", f'mount -t tmpfs none "{only_a}" && exec "$0" "$@"']}
    extra = {0: {"GLOO_SOCKET_IFNAME": dev_a}, 1: {"GLOO_SOCKET_IFNAME": dev_b}}
    # Step 0 (shared) needs the checkpoint on both hosts: run it with host b seeing it.
    shared = [{"ref": ckpt, "save": True}]
    both = {0: prefix[0], 1: ["ip", "netns", "exec", ns_b]}
    results, out, logs = run_ranks(tmp_path, 2, shared, spec, addr=addr_a, prefix=both,
                                   extra_env=extra)
    for r in range(2):
        assert results[r] and results[r][0]["ok"], (r, results[r], logs[r])
        assert all(torch.equal(t, ref[r][n]) for n, t in saved(out, r, 0).items())
    # Broadcast into a module, then into a tensor-parallel TransformersModel that runs: host b
    # builds it from host a's config.json and slice, and generates tp 1's greedy tokens.
    ids = [[3, 14, 15, 92, 65], [35, 89, 79, 32, 38]]
    steps = [{"ref": ckpt, "source_rank": 0, "buffer_bytes": 8192, "save": True},
             {"ref": ckpt, "source_rank": 0, "generate": {"ids": ids, "new_tokens": 4}}]
    results, out, logs = run_ranks(tmp_path, 2, steps, spec, addr=addr_a, prefix=prefix,
                                   extra_env=extra)
    want = metaload.TransformersModel(ckpt, progress=False).generate(torch.tensor(ids), 4)
    for r in range(2):
        assert results[r] and results[r][0]["ok"], (r, results[r], logs[r])
        assert all(torch.equal(t, ref[r][n]) for n, t in saved(out, r, 0).items())
        e = results[r][1]
        assert e["ok"] and torch.equal(torch.tensor(e["tokens"]), want), (r, e, logs[r])
    for step in (0, 1):
        d = results[1][step]["distributed"]
        assert d["bytes_read"] == 0 and d["bytes_received"] == d["held_bytes"] > 0
    # On host b the checkpoint's folder is empty: the receiver could not have read it.
    probe = subprocess.run(prefix[1] + ["ls", "-A", str(only_a)], capture_output=True, text=True,
                           timeout=20)
    assert probe.returncode == 0 and probe.stdout.strip() == "", probe
