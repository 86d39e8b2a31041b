"""python -m metaload.serve REF... [--host 127.0.0.1] [--port P] [--device D] [--dtype T]
(`metaload serve` runs this): serves nnsight's remote protocol for each REF (a model key, a repo
id in the hub cache, or a checkpoint directory). Ready when GET /ping answers; the line
"metaload serve: ready on http://HOST:PORT" is printed then.

A request is code that runs with this server's rights: only loopback by default; any other --host
needs --api-keys FILE (one key a line), which loopback then requires too.
"""
import argparse
import ipaddress
import os
import socket
import sys

from .._lib import UsageError


def parser():
    p = argparse.ArgumentParser(prog="metaload serve", description=__doc__.split("\n\n")[0])
    p.add_argument("refs", nargs="+", metavar="REF",
                   help="model key, Hugging Face repo id in the cache, or checkpoint directory")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default loopback)")
    p.add_argument("--port", type=int, default=0, help="port (default 0: any free port)")
    p.add_argument("--device", default="cpu", help="device of every deployment (cpu, cuda:0)")
    p.add_argument("--dtype", default=None, help="serving dtype (default: the checkpoint's)")
    p.add_argument("--revision", default=None, help="revision of the repo-id REFs")
    p.add_argument("--devices", default=None,
                   help="DEVICE=SIZE,... to place the deployments on (metaload place); default: "
                        "--device with the memory free on it now")
    p.add_argument("--gpus", default=None, help="NxSIZE: place on N GPUs of SIZE each")
    p.add_argument("--batch", type=int, default=1, help="declared batch size, for placement")
    p.add_argument("--seq", type=int, default=2048, help="declared sequence length, for placement")
    p.add_argument("--threads", type=int, default=0,
                   help="torch threads of each executor (default 0: torch's default, the cores)")
    p.add_argument("--api-keys", default=None, metavar="FILE", help="file of API keys, one a line")
    p.add_argument("--time-limit", type=float, default=600.0, help="seconds a request may run")
    p.add_argument("--max-body", type=int, default=64 << 20, help="largest request body, bytes")
    p.add_argument("--inline-result", type=int, default=8 << 20,
                   help="largest result sent on the websocket; larger ones go through a URL")
    p.add_argument("--result-ttl", type=float, default=600.0,
                   help="seconds a result too large to go inline (and a request's status) is "
                        "kept for its client when not downloaded (default 600)")
    p.add_argument("--max-subscribers", type=int, default=256,
                   help="most /subscribe websockets open at once (unauthenticated: capped)")
    p.add_argument("--max-subscribers-per-ip", type=int, default=16,
                   help="most /subscribe websockets open at once from one client address")
    p.add_argument("--subscribe-timeout", type=float, default=60.0,
                   help="seconds a /subscribe websocket stays open before a request names its "
                        "session")
    return p


def check_limits(args):
    """Every limit positive: a zero or negative one is a UsageError naming the option."""
    for option in ("time_limit", "max_body", "inline_result", "result_ttl", "max_subscribers",
                   "max_subscribers_per_ip", "subscribe_timeout"):
        value = getattr(args, option)
        if not value > 0:
            raise UsageError(f"metaload serve: --{option.replace('_', '-')} {value}: must be "
                             f"positive")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def read_api_keys(path):
    """The keys of --api-keys FILE (one a line; blank lines and # comments skipped)."""
    try:
        with open(path, encoding="utf-8") as f:
            found = [line.strip() for line in f]
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"metaload serve: --api-keys {path}: {e}") from None
    found = frozenset(k for k in found if k and not k.startswith("#"))
    if not found:
        raise UsageError(f"metaload serve: --api-keys {path}: the file holds no key")
    return found


def check_security(args):
    if args.api_keys is None and not is_loopback(args.host):
        raise UsageError(
            f"metaload serve: --host {args.host} is not a loopback address and no --api-keys "
            f"FILE was given: a request is code that runs with this server's rights, so a server "
            f"that others can reach needs API keys")
    return read_api_keys(args.api_keys) if args.api_keys else frozenset()


def _bind(host, port):
    """A listening socket (port 0: the kernel picks a free one)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP named: asyncio sets TCP_NODELAY only on sockets whose proto says TCP (with
    # proto 0 every response waited out the peer's delayed ACK, 40 ms).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)
    return sock


def placement(args, specs):
    """{ref: plan} (metaload place); a deployment that needs more than one device is refused."""
    from . import place
    devices = place.parse_devices(args.devices, args.gpus) if (args.devices or args.gpus) \
        else [(args.device, place.device_room(args.device))]
    plans = place.plan([s.repo_id for s in specs], devices, args.dtype, args.batch, args.seq,
                       args.revision)
    out = {}
    for s in specs:
        p = out[s.ref] = plans[s.repo_id]
        if p["mode"] != "single":
            raise UsageError(
                f"metaload serve: {s.ref} needs {p['mode']} placement over {p['devices']} "
                f"(metaload place); metaload serve runs each deployment on one device: give "
                f"it a device with {p['weights'] + p['activations']} bytes free")
    return out


def _deployments(args, limits, emit):
    from . import keys
    from .deployment import Deployment
    specs = {}
    for ref in args.refs:
        spec = keys.spec(ref, args.revision)
        if spec.identity in specs:
            raise UsageError(f"metaload serve: {ref} names the same deployment as "
                             f"{specs[spec.identity].ref}")
        specs[spec.identity] = spec
    plans = placement(args, list(specs.values()))
    held = {i: Deployment(s, keys.describe(s), plans[s.ref]["devices"][0], args.dtype, limits,
                          emit, threads=args.threads) for i, s in specs.items()}
    return held, plans


def _start_fork_server():
    """Starts the executors' fork server now: its imports (torch, transformers, nnsight) run
    while this process resolves the deployments and plans their placement."""
    from multiprocessing import forkserver

    from .deployment import _context
    _context()
    forkserver.ensure_running()


def serve(args):
    import uvicorn

    from .app import Front, Settings, make_app, python_env
    from .deployment import Limits
    check_limits(args)
    settings = Settings(api_keys=check_security(args), max_body_bytes=args.max_body,
                        inline_result_bytes=args.inline_result, result_ttl_s=args.result_ttl,
                        max_subscribers=args.max_subscribers,
                        max_subscribers_per_ip=args.max_subscribers_per_ip,
                        subscribe_timeout_s=args.subscribe_timeout)
    _start_fork_server()
    holder = {}
    held, settings.placement = _deployments(args, Limits(time_limit_s=args.time_limit),
                                            lambda *a, **k: holder["front"].emit(*a, **k))
    front = holder["front"] = Front(held, settings, python_env())
    sock = _bind(args.host, args.port)
    for d in held.values():
        d.start()
    host, port = sock.getsockname()[:2]
    config = uvicorn.Config(make_app(front), log_level="warning", ws="websockets-sansio",
                            ws_max_size=args.max_body, timeout_graceful_shutdown=5)
    server = uvicorn.Server(config)
    print(f"metaload serve: ready on http://{host}:{port}", flush=True)
    try:
        server.run(sockets=[sock])
    finally:
        for d in held.values():
            d.stop()


def main(argv=None):
    args = parser().parse_args(argv)
    try:
        serve(args)
    except ImportError as e:
        sys.stderr.write(f"metaload serve: error: {e}: metaload serve needs nnsight 0.8, "
                         f"fastapi, uvicorn, websockets and python-multipart (pip install "
                         f"'metaload[serve]'; pinned in tools/requirements.txt)\n")
        return 1
    except Exception as e:  # noqa: BLE001 - one line, the kind first, as the CLI's errors
        kind = type(e).__name__
        sys.stderr.write(f"metaload serve: error: {kind}: {e}\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
