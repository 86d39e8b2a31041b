"""metaload serve (issue 26) against nnsight's real client, on a tiny GPT-2 the test writes into a
hub cache of its own (no network ever).

Each server is `python -m metaload.serve` on 127.0.0.1 and a port the kernel picks, stopped (with
its executors) at the end of the module; each client is a process of its own running nnsight's
unmodified client (`model.trace(..., remote=URL)`, NDIF_HOST, blocking=False), which compares
what the server sent back with the same trace run locally (nnsight's own dispatch, no metaload),
bitwise. See serve_util.py for the scenarios. nnsight 0.8 and FastAPI are in the torch 2.x
environment only: skipped on Debian's torch 1.13.
"""
import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("nnsight", reason="nnsight 0.8 (tools/requirements.txt) is installed in the "
                    "torch 2.x environment only: it needs torch >= 2")
pytest.importorskip("fastapi", reason="metaload serve's pinned FastAPI is in the torch 2.x "
                    "environment only")
pytest.importorskip("uvicorn", reason="metaload serve's pinned uvicorn is in the torch 2.x "
                    "environment only")

import serve_util  # noqa: E402
from serve_util import REPO, Server, run_client  # noqa: E402


@pytest.fixture(scope="module")
def top(tmp_path_factory):
    top = str(tmp_path_factory.mktemp("serve"))
    r = subprocess.run([sys.executable, serve_util.__file__, "--write", os.path.join(top, "hub")],
                       env=serve_util.env_for(top), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-5000:]
    return top


@pytest.fixture(scope="module")
def server(top):
    s = Server(top, "--time-limit", "120")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def basic(top, server):
    """The first scenarios, in one client process (each starts nnsight: seconds)."""
    return run_client(top, server.url, "hidden", "unknown_key", "raises")


# ---------------------------------------------------------------------------------------------
# A trace, remotely and locally

def test_saved_hidden_states_and_logits_equal_the_local_trace_bitwise(basic):
    assert basic["hidden"] == {"equal": True, "n": 2}


def test_an_unknown_key_is_an_error_listing_the_keys_held(basic, server):
    error = basic["unknown_key"]["error"]
    assert error.startswith("RemoteError: "), error
    assert "metaload-test/not-deployed" in error and "is not deployed here" in error
    held = server.get("/status").json()["deployments"]
    assert [d["model_key"] for d in held.values()][0] in error


def test_user_code_that_raises_is_an_error_and_the_next_request_works(basic):
    error = basic["raises"]["error"]
    assert error.startswith("RemoteError: ") and "ValueError: raised by the request" in error
    assert basic["raises"]["after"] == {"equal": True, "n": 2}


def test_a_garbage_request_is_a_4xx_or_an_error_and_the_server_goes_on(top, server):
    import httpx
    url = server.url
    key = server.get("/status").json()["deployments"][REPO]["model_key"]
    envelope = json.dumps({"model_key": key, "session_id": "", "compress": False, "env": {}})
    not_form = httpx.post(url + "/request", content=b"\x00garbage", timeout=30)
    no_blob = httpx.post(url + "/request", data={"data": envelope},
                         files={"other": ("r", b"x", "application/octet-stream")}, timeout=30)
    bad_json = httpx.post(url + "/request", data={"data": "{not json"},
                          files={"blob": ("r", b"x", "application/octet-stream")}, timeout=30)
    assert not_form.status_code == 400 and "multipart" in not_form.json()["detail"]
    assert no_blob.status_code == 422 and "blob" in no_blob.json()["detail"]
    assert bad_json.status_code == 422 and "RequestModel" in bad_json.json()["detail"]
    for blob in (b"garbage", b"\x80\x04\x95" + os.urandom(64)):  # not a pickle; a broken one
        r = httpx.post(url + "/request", data={"data": envelope},
                       files={"blob": ("r", blob, "application/octet-stream")}, timeout=30)
        assert r.status_code == 200 and r.json()["status"] == "RECEIVED", r.text
        final = _poll(server, r.json()["id"])
        assert final["status"] == "ERROR" and "Error" in final["description"], final
    assert server.get("/ping").text == "pong"
    assert run_client(top, url, "hidden")["hidden"]["equal"]


def _poll(server, job_id, timeout=120):
    import time
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r = server.get(f"/response/{job_id}")
        if r.status_code == 200 and r.json()["status"] in ("COMPLETED", "ERROR"):
            return r.json()
        time.sleep(0.2)
    raise AssertionError(f"request {job_id} did not finish within {timeout} s")


# ---------------------------------------------------------------------------------------------
# The rest of the client's ways in, on the same server

@pytest.fixture(scope="module")
def more(top, server):
    """nnsight's client with NDIF_HOST set (read at its import), then the other traces."""
    return run_client(top, server.url, "ndif_host", "edited", "invokes", "generate",
                      "nonblocking", "concurrent", "key_spellings", "queue_positions",
                      "disconnect", "prints", "compare_env", NDIF_HOST=server.url)


@pytest.mark.parametrize("trace", ["edited", "invokes", "generate", "nonblocking", "ndif_host"])
def test_remote_results_equal_the_local_trace_bitwise(more, trace):
    assert more[trace]["equal"] and more[trace]["n"] >= 1, more[trace]


def test_several_concurrent_clients_each_get_their_own_result(more):
    assert more["concurrent"] == {"errors": [], "equal": [True] * 4}


def test_every_spelling_of_the_key_reaches_the_deployment(more):
    assert len(more["key_spellings"]) == 3 and all(more["key_spellings"].values()), \
        more["key_spellings"]


def test_queued_frames_give_each_request_its_position(more):
    """Sent at once, two seconds each: while the first runs the third waits behind the second."""
    positions = [[p for s, p in frames if s == "QUEUED"] for frames in more["queue_positions"]]
    for frames, queued in zip(more["queue_positions"], positions):
        states = [s for s, _ in frames]
        assert states[-1] == "COMPLETED" and states.index("RUNNING") > states.index("QUEUED")
        assert queued == sorted(queued, reverse=True) and queued[-1] == 1, frames
    assert positions[2][0] >= 2, more["queue_positions"]


def test_nnsight_status_and_compare_read_this_server(more):
    # The client and the server share one environment here: nothing differs
    assert more["compare_env"] == {"listed": True, "state": "RUNNING", "python_matches": True,
                                   "mismatches": 0}


def test_what_a_request_prints_comes_back_as_log_frames(more):
    assert more["prints"] == ["first line from the request", "second line"]


def test_a_client_that_goes_away_leaves_no_queued_work(more):
    assert more["disconnect"]["queued_after_close"] == 0
    assert more["disconnect"]["after"]["equal"]


def test_status_and_env_have_the_shapes_nnsight_reads(server):
    status = server.get("/status").json()
    d = status["deployments"][REPO]
    assert d["model_key"].startswith("nnsight.modeling.transformers.TransformersModel:")
    assert (d["repo_id"], d["revision"], d["task"]) == (REPO, "main", "text-generation")
    assert d["n_params"] > 0 and d["config"]["model_type"] == "gpt2"
    assert (d["deployment_level"], d["application_state"]) == ("HOT", "RUNNING")
    assert d["placement"]["mode"] == "single" and d["placement"]["devices"] == ["cpu"]
    assert d["placement"]["weights"] == d["size_bytes"] > 0
    env = server.get("/env").json()
    assert env["python_version"] and env["packages"]["nnsight"] == "0.8.1"


# ---------------------------------------------------------------------------------------------
# A server with API keys, a short time limit, small inline results and a small body limit

KEY = "test-key-" + os.urandom(8).hex()


@pytest.fixture(scope="module")
def strict(top):
    keys = os.path.join(top, "keys.txt")
    with open(keys, "w") as f:
        f.write(f"# the test's keys\nother-key\n{KEY}\n")
    s = Server(top, "--api-keys", keys, "--time-limit", "8", "--inline-result", "512",
               "--max-body", "65536", refs=(REPO, serve_util.OTHER))
    yield s
    s.stop()


@pytest.fixture(scope="module")
def strict_runs(top, strict):
    other = strict.get("/status").json()["deployments"][serve_util.OTHER]
    runs = run_client(top, strict.url, "no_key", "wrong_key", "right_key", "sleeps", "exit",
                      "segfault", "oom", NDIF_API_KEY=KEY)
    runs["other_before"] = other
    return runs


def test_a_missing_or_wrong_api_key_is_refused_and_the_right_one_works(strict_runs):
    assert strict_runs["no_key"]["error"].startswith("RemoteError: Failed to send request: ")
    assert "no API key" in strict_runs["no_key"]["error"]
    assert "a wrong API key" in strict_runs["wrong_key"]["error"]
    assert strict_runs["right_key"] == {"equal": True, "n": 2}


def test_the_api_key_guards_polling_too(strict):
    assert strict.get("/response/0123").status_code == 401
    assert strict.get("/response/0123", headers={"ndif-api-key": KEY}).status_code == 404


def test_a_result_above_the_inline_limit_goes_through_a_url_and_is_deleted(strict_runs, strict):
    # right_key's logits (4 x 300 float32) are over --inline-result 512: downloaded by URL
    assert strict_runs["right_key"]["equal"]
    assert strict.get("/status").json()["results_held"] == 0


def test_a_request_past_its_time_limit_is_an_error_and_the_deployment_goes_on(strict_runs):
    assert "time limit of 8 s" in strict_runs["sleeps"]["error"], strict_runs["sleeps"]
    assert strict_runs["sleeps"]["after"] == {"equal": True, "n": 2}


@pytest.mark.parametrize("how,said", [("exit", "exited with status 3"),
                                      ("segfault", "killed by SIGSEGV")])
def test_an_executor_crash_is_an_error_and_it_restarts(strict_runs, strict, how, said):
    assert said in strict_runs[how]["error"] and "restarted" in strict_runs[how]["error"]
    assert strict_runs[how]["after"] == {"equal": True, "n": 2}
    d = strict.get("/status").json()["deployments"][REPO]
    assert d["restarts"] == 3 and len(d["load_seconds"]) == 4  # sleeps, exit, segfault
    assert d["application_state"] == "RUNNING"
    # The other deployment's executor went on as it was
    other = strict.get("/status").json()["deployments"][serve_util.OTHER]
    assert other["executor_pid"] == strict_runs["other_before"]["executor_pid"]
    assert other["restarts"] == 0 and other["application_state"] == "RUNNING"


def test_a_request_that_exhausts_memory_is_an_error_and_the_next_works(strict_runs):
    if "skipped" in strict_runs["oom"]:
        pytest.skip(strict_runs["oom"]["skipped"])
    assert "MemoryError" in strict_runs["oom"]["error"], strict_runs["oom"]
    assert strict_runs["oom"]["after"] == {"equal": True, "n": 2}


def test_a_body_over_the_limit_is_refused(strict):
    import httpx
    r = httpx.post(strict.url + "/request", headers={"ndif-api-key": KEY},
                   files={"blob": ("r", b"x" * 100000, "application/octet-stream")}, timeout=30)
    assert r.status_code == 413 and "65536" in r.json()["detail"]


def test_a_host_others_can_reach_needs_api_keys(top):
    r = subprocess.run([sys.executable, "-m", "metaload.serve", REPO, "--host", "0.0.0.0"],
                       env=serve_util.env_for(top), capture_output=True, text=True, timeout=120)
    assert r.returncode == 1
    assert "UsageError" in r.stderr and "--api-keys" in r.stderr and "0.0.0.0" in r.stderr


# ---------------------------------------------------------------------------------------------
# The metaload tool's hand-off, and placement

def test_metaload_serve_is_the_tools_subcommand(top):
    from conftest import cli_path
    s = Server(top, command=[cli_path(), "serve"])
    try:
        assert s.get("/ping").text == "pong"
        assert s.get("/status").json()["deployments"][REPO]["application_state"] == "RUNNING"
    finally:
        s.stop()


def _place(top, *args):
    from conftest import run_cli
    return run_cli("place", REPO, *args, env=serve_util.env_for(top))


def test_metaload_place_gives_a_model_one_device_when_it_fits(top):
    r = _place(top, "--devices", "cpu=1GiB", "--json")
    assert r.returncode == 0, r.stderr
    p = json.loads(r.stdout)[REPO]
    assert (p["mode"], p["devices"]) == ("single", ["cpu"])
    # Exact stored bytes: the safetensors headers' 37,120 float32 parameters (tied lm_head once)
    assert p["weights"] == 37120 * 4 and 0 < p["activations"] < 1 << 20
    assert p["per_device"]["cpu"] == p["weights"] + p["activations"]


def test_metaload_place_splits_layers_or_uses_tp_when_one_device_is_too_small(top):
    whole = json.loads(_place(top, "--devices", "cpu=1GiB", "--json").stdout)[REPO]
    half = (whole["weights"] + whole["activations"]) * 3 // 4
    r = _place(top, "--devices", f"cuda:0={half},cuda:1={half}", "--json")
    assert r.returncode == 0, r.stderr
    p = json.loads(r.stdout)[REPO]
    assert p["mode"] in ("tp", "split") and sorted(p["devices"]) == ["cuda:0", "cuda:1"], p
    assert all(b <= half for b in p["per_device"].values()), p


def test_metaload_place_refuses_a_model_that_does_not_fit_with_the_numbers(top):
    r = _place(top, "--gpus", "2x64KiB")
    assert r.returncode == 1
    assert "PlanError" in r.stderr and "does not fit" in r.stderr and "148480 bytes" in r.stderr
    assert "free: cuda:0 64.00 KiB, cuda:1 64.00 KiB" in r.stderr, r.stderr
    assert "TP degrees: [2]" in r.stderr


# ---------------------------------------------------------------------------------------------
# Results' time to live, a running request whose client went away, and the /subscribe caps

@pytest.fixture(scope="module")
def short(top):
    s = Server(top, "--time-limit", "120", "--result-ttl", "1", "--max-subscribers", "3",
               "--max-subscribers-per-ip", "2", "--subscribe-timeout", "2")
    yield s
    s.stop()


def test_a_result_not_downloaded_within_its_ttl_is_gone(top, short):
    r = run_client(top, short.url, "ttl")["ttl"]
    assert (r["at_once"], r["at_once_again"]) == (200, 404), r  # downloaded once, then gone
    assert r["late"] == 404 and "downloaded or expired" in r["late_detail"], r
    assert short.get("/status").json()["results_held"] == 0


def test_a_running_request_whose_client_went_away_is_cancelled(top, short):
    before = short.get("/status").json()["deployments"][REPO]
    r = run_client(top, short.url, "cancel_running")["cancel_running"]
    assert r["states"][-1] == "RUNNING" and r["after"] == {"equal": True, "n": 2}, r
    after = short.get("/status").json()["deployments"][REPO]
    assert after["cancelled"] == before["cancelled"] + 1
    assert after["restarts"] == before["restarts"] + 1 and after["application_state"] == "RUNNING"
    assert after["executor_pid"] != before["executor_pid"]
    assert "was cancelled after" in short.stderr() and "its client went away" in short.stderr()


def _socket_from(server, source):
    """A /subscribe websocket from the loopback address `source` (Linux routes 127/8 to lo)."""
    import socket

    import websocket
    host, port = server.url.split("//", 1)[1].rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=30, source_address=(source, 0))
    return websocket.create_connection(server.url.replace("http", "ws", 1) + "/subscribe",
                                       socket=sock, timeout=30)


def test_subscribe_sockets_are_capped_per_address_and_in_all_and_idle_ones_closed(short):
    import websocket
    refused0 = short.get("/status").json()["subscribers_refused"]
    a = [_socket_from(short, "127.0.0.1") for _ in range(2)]
    for ws in a:
        assert json.loads(ws.recv())["session_id"]
    with pytest.raises(websocket.WebSocketBadStatusException) as third_from_a:
        _socket_from(short, "127.0.0.1")  # over --max-subscribers-per-ip 2
    assert third_from_a.value.status_code == 403
    b = _socket_from(short, "127.0.0.2")
    assert json.loads(b.recv())["session_id"]
    with pytest.raises(websocket.WebSocketBadStatusException):
        _socket_from(short, "127.0.0.3")  # over --max-subscribers 3
    status = short.get("/status").json()
    assert status["subscribers"] == 3 and status["subscribers_refused"] == refused0 + 2
    # No request names these sessions: each is closed after --subscribe-timeout 2 s
    for ws in a + [b]:
        ws.settimeout(30)
        op, frame = ws.recv_data(control_frame=True)
        assert op == websocket.ABNF.OPCODE_CLOSE, (op, frame)
        assert int.from_bytes(frame[:2], "big") == 1008 and b"within 2 s" in frame, frame
    status = short.get("/status").json()
    assert status["subscribers"] == 0 and status["subscribers_idle_closed"] >= 3
    c = _socket_from(short, "127.0.0.3")  # room again
    assert json.loads(c.recv())["session_id"]
    c.close()
