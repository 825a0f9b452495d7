"""Starts the console (or serves it to a browser). Imports nothing heavy: torch comes later, in a
worker, after the first screen is painted."""

from __future__ import annotations

import argparse
import shlex
import socket
import sys

from engine.core.errors import UserError


def serve_command(args: argparse.Namespace) -> str:
    """The command textual-serve runs (through a shell) for each browser connection: this console,
    same flags, this project's code wherever the server was started (engine.core.process python_argv)."""
    from cli.flags import model_flags, model_options_from_args
    from engine.core.process import python_argv

    parts = [*python_argv("cli.main"), *model_flags(model_options_from_args(args))]
    if args.cluster:
        parts += ["--cluster", args.cluster]
    if args.session:
        parts += ["--session", args.session]
    elif args.resume:
        parts.append("--resume")
    return shlex.join(parts)


def check_session(name: str | None) -> None:
    """A one-line SessionError, before any screen, for a session name that escapes the sessions
    folder or names a session that cannot be opened (the console would only say it later)."""
    if name is None:
        return
    from sessions.store import SessionStore

    store = SessionStore()
    if store.exists(name):
        store.open(name)


def check_cluster(address: str | None) -> None:
    """The console's --cluster, before any screen: a known form, and Ray installed (looked up, not
    imported: each job connects on its own), or one line."""
    if address is None:
        return
    import importlib.util

    from engine.cluster import INSTALL, check_address

    check_address(address)
    if importlib.util.find_spec("ray") is None:
        raise UserError(f"--cluster needs Ray: {INSTALL}")


def check_model(model: str) -> None:
    """The console's --model, before any screen or session: the check `run` makes before its load
    (engine/models/preflight.py config_shape: the name resolved, the config's sizes, the tokenizer's
    files), so a path that is not there is one line now, not a failed load in a session that names
    it. The embedded default is not checked: the console fetches it where it is missing, saying so."""
    from engine.models.sources import DEFAULT_MODEL

    if model != DEFAULT_MODEL:
        from engine.models.preflight import config_shape

        config_shape(model)


def check_port(port: int) -> None:
    """--serve's port: in range and free to listen on (textual-serve would fail with a traceback
    after printing its address). The probe binds as aiohttp does (SO_REUSEADDR), so a port still in
    TIME_WAIT from a console just stopped is not refused."""
    if not 1 <= port <= 65535:
        raise UserError(f"--port {port}: must be 1 to 65535 (default 8000)")
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("localhost", port))
        except OSError as exc:
            raise UserError(f"--port {port}: cannot listen there ({exc.strerror or exc}); "
                            "pick another with --port") from None


def launch(args: argparse.Namespace) -> int:
    from sessions.store import SessionStore

    SessionStore().check_home()  # a file or a read-only folder: one line before any screen (the console writes)
    check_session(args.session)
    check_cluster(args.cluster)
    from cli.flags import model_options_from_args

    options = model_options_from_args(args)
    check_model(options.model)
    if args.serve_token and not args.serve:
        print("anatomy-tui: error: --serve-token goes with --serve", file=sys.stderr)
        return 2
    if args.serve:
        check_port(args.port)
        try:
            from tui.serve import TokenServer
        except ImportError:
            print(
                "anatomy-tui: --serve needs textual-serve: pip install 'anatomy-tui[serve]'", file=sys.stderr
            )
            return 2
        server = TokenServer(serve_command(args), port=args.port, token=args.serve_token)
        print(
            f"serving the console on {server.entry_url} (over ssh: ssh -L {args.port}:localhost:"
            f"{args.port} HOST); Ctrl+C stops",
            file=sys.stderr,
        )
        if not args.serve_token:
            print(
                "anatomy-tui: no authentication: anyone who can reach this port on this machine gets the "
                "console; use --serve-token on a shared machine",
                file=sys.stderr,
            )
        server.serve()
        return 0
    from tui.app import AnatomyApp
    from tui.console_settings import ConsoleSettings
    from tui.logging_setup import setup_logging

    setup_logging()  # nothing logs to the terminal the console draws on

    explicit = any(arg == "--model" or arg.startswith("--model=") for arg in sys.argv[1:])
    app = AnatomyApp(session=args.session, resume=args.resume, options=options, model_explicit=explicit,
                     console=ConsoleSettings(cluster=args.cluster))
    app.run()
    if app.exit_line:
        print(app.exit_line, file=sys.stderr)
    return int(app.return_code or 0)
