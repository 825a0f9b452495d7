"""Starts the console (or serves it to a browser). Imports nothing heavy: torch comes later, in a
worker, after the first screen is painted."""

from __future__ import annotations

import argparse
import shlex
import sys


def serve_command(args: argparse.Namespace) -> str:
    """The command textual-serve runs for each browser connection: this console, same flags."""
    parts = [
        sys.executable,
        "-m",
        "tui.cli",
        "--model",
        args.model,
        "--device",
        args.device,
        "--dtype",
        args.dtype,
    ]
    if args.trust_remote_code:
        parts.append("--trust-remote-code")
    if args.session:
        parts += ["--session", args.session]
    elif args.resume:
        parts.append("--resume")
    return shlex.join(parts)


def launch(args: argparse.Namespace) -> int:
    if args.serve:
        try:
            from textual_serve.server import Server
        except ImportError:
            print(
                "anatomy-tui: --serve needs textual-serve: pip install 'anatomy-tui[serve]'", file=sys.stderr
            )
            return 2
        print(
            f"serving the console on http://localhost:{args.port} (over ssh: ssh -L {args.port}:localhost:"
            f"{args.port} HOST); Ctrl+C stops",
            file=sys.stderr,
        )
        Server(serve_command(args), host="localhost", port=args.port, title="anatomy-tui").serve()
        return 0
    from tui.app import AnatomyApp, ModelOptions
    from tui.logging_setup import setup_logging

    setup_logging()  # nothing logs to the terminal the console draws on

    explicit = any(arg == "--model" or arg.startswith("--model=") for arg in sys.argv[1:])
    options = ModelOptions(args.model, args.device, args.dtype, args.trust_remote_code, explicit)
    app = AnatomyApp(session=args.session, resume=args.resume, options=options)
    app.run()
    return int(app.return_code or 0)
