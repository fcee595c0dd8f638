"""``interp-seal dashboard``: the head-pruning dashboard as a web page.

    interp-seal dashboard --model organism
    interp-seal dashboard --model path/to/checkpoint --lengths 40 80 120 160 --n 20 --port 8765

Serves the dashboard with Voila on 127.0.0.1 and prints its URL with the page's token (a new
random one per start unless ``--token``), like ``jupyter lab``; ``--port 0`` (the default)
picks a free port, and a port in use is refused before anything starts. Scale files and merged
checkpoints are saved in ``--save-dir`` (default: the directory the command runs in). Each
browser tab runs its own kernel: it loads the model, teacher-forces ``--n`` seeded LongEval
records per number of lines (the clean run every edit starts from) and shows the widgets
(``interp_seal.widgets.app``). At most ``--max-kernels`` tabs are served at once (each kernel
holds a copy of the model); one more gets a one-line 503 page saying so.
"""

from __future__ import annotations

import argparse
import socket
from pathlib import Path

from interp_seal.cli.common import nonnegative_int, positive_int, sample_count
from interp_seal.defaults import DASHBOARD_KERNELS


def register(subparsers) -> None:
    parser = subparsers.add_parser("dashboard", help="serve the head-pruning dashboard page")
    parser.add_argument(
        "--model", default="organism", help="'organism', checkpoint dir or hub name"
    )
    parser.add_argument(
        "--lengths",
        type=positive_int,
        nargs="+",
        default=[40, 80, 120, 160],  # widgets.dashboard.DEFAULT_LENGTHS (a test keeps them equal)
        help="lines per record",
    )
    parser.add_argument("--n", type=sample_count, default=20, help="records per length")
    parser.add_argument("--seed", type=int, default=0, help="seed of the evaluation records")
    parser.add_argument(
        "--port", type=nonnegative_int, default=0, help="port on 127.0.0.1 (0: a free one)"
    )
    parser.add_argument(
        "--threads", type=positive_int, help="torch threads (default: torch's choice)"
    )
    parser.add_argument(
        "--save-dir",
        type=Path,
        default=Path("."),
        help="where the page saves scale files and merged checkpoints (paths outside it are "
        "refused)",
    )
    parser.add_argument(
        "--idle-timeout",
        type=positive_int,
        default=600,
        help="seconds after which the kernel of a page that nobody has open is shut down",
    )
    parser.add_argument(
        "--max-kernels",
        type=positive_int,
        default=DASHBOARD_KERNELS,
        help="the most browser tabs served at once (each runs a kernel holding the model); one "
        "more gets a one-line 503 page",
    )
    parser.add_argument(
        "--token",
        help="the token the page's URL carries (default: a new random one per start); the "
        "server's log lines show it as [redacted]",
    )
    parser.set_defaults(func=run_dashboard)


def check_port_free(port: int) -> None:
    """Raise ``ValueError`` if something already listens on ``127.0.0.1:port``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            raise ValueError(
                f"port {port} on 127.0.0.1 is in use; pass --port 0 for a free one, or another "
                f"port (e.g. --port {free_port()})"
            ) from None


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_dashboard(args: argparse.Namespace) -> int:
    if args.port > 65535:  # counts and the port's sign are checked when parsing
        raise ValueError(f"--port must be in 0..65535 (0: a free port), got {args.port}")
    if args.token is not None and len(args.token) < 16:
        raise ValueError("--token must be at least 16 characters (leave it out for a random one)")
    if not args.save_dir.is_dir():
        raise ValueError(f"--save-dir {args.save_dir} is not a directory; create it first")
    from interp_seal.models.load import resolve
    from interp_seal.outputs import check_output_dir
    from interp_seal.widgets.app import new_token, serve

    check_output_dir(args.save_dir, flag="--save-dir")
    resolve(args.model)  # a missing model fails here, not in the page
    if args.port:
        check_port_free(args.port)
    port = args.port or free_port()
    serve(
        model=args.model,
        lengths=args.lengths,
        n=args.n,
        seed=args.seed,
        port=port,
        save_dir=args.save_dir,
        token=args.token or new_token(),
        threads=args.threads,
        idle_timeout=args.idle_timeout,
        max_kernels=args.max_kernels,
        device=args.device,
        dtype=args.dtype,
        device_map=args.device_map,
    )
    return 0
