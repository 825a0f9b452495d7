"""The `anatomy-tui` command: the console by default, `run EXPERIMENT` headless, `sessions`.

Every `run` sub-command comes from the experiment registry (engine/registry.py): its flags are the
fields of its Settings (type, default, help and range declared once, on the field), plus the model
flags (engine/models/options.py) and the session flags. Only the chosen experiment's flags are built, so
`anatomy-tui --help` and the console start import no torch.
"""

from __future__ import annotations

import argparse
import os
import sys
import typing
from collections.abc import Sequence

from cli.flags import CheckedParser, add_settings_arguments, experiment_flags
from engine import registry
from engine.core.errors import UserError
from engine.core.frozen_imports import one_job_process
from engine.core.process import Stopped, exit_code, hand_to_launcher, say, stop_on_signals
from engine.models.options import ModelOptions
from sessions.store import SessionError


def chosen_experiment(argv: Sequence[str]) -> str | None:
    """The experiment named after `run`, if any (only its flags are built)."""
    if "run" not in argv:
        return None
    return next((word for word in argv[list(argv).index("run") + 1 :] if word in registry.BY_NAME), None)


TOO_LARGE = ("out of memory", "can't allocate memory", "storage size calculation overflowed")  # torch's words
NOT_DETERMINISTIC = " does not have a deterministic implementation"  # torch's words, under --deterministic


def one_line(text: str) -> str:
    """An error as one line: a newline or control character (in a typed path, say) is escaped."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


class OneLineParser(CheckedParser):
    """A usage mistake is one line and exit 2 like any bad value (argparse prints its usage block);
    an unknown or abbreviated flag, command or experiment is named with the closest real one."""

    def error(self, message: str) -> typing.NoReturn:
        if "expected one argument" in message:  # argparse reads '-0.5,1' or '-inf' as a flag
            message += "; write a value that starts with '-' as --flag=VALUE (--alphas=-0.5,1)"
        raise UserError(f"{message} (see {self.prog} --help)")


def build_parser(experiment: str | None = None) -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="anatomy-tui",
        description="A terminal lab console for the anatomy of transformer language models.",
    )
    add_settings_arguments(parser, ModelOptions(), set())
    parser.set_defaults(**ModelOptions().to_dict())  # the console reads them all
    parser.add_argument("--session", default=None, help="open this session in the console")
    parser.add_argument("--resume", action="store_true",
                        help="open the session the console had open last (else the most recent), where it was")
    parser.add_argument("--serve", action="store_true", help="serve the console to a browser (textual-serve)")
    parser.add_argument("--port", type=int, default=8000, help="port for --serve (default 8000)")
    parser.add_argument(
        "--serve-token",
        action="store_true",
        help="with --serve: require a random token (printed at start, in the URL); without it anyone "
        "who can reach the port gets the console",
    )
    parser.add_argument("--cluster", default=None, metavar="ADDRESS",
                        help="start the console's jobs as Ray tasks there: local (Ray started on this machine) or auto "
                        "(RAY_ADDRESS=HEAD:6379) (pip install 'anatomy-tui[cluster]')")
    commands = parser.add_subparsers(dest="command", metavar="{run,sessions,export,atlas,compare,report}")

    run = commands.add_parser("run", help="run an experiment headless into a session")
    experiments = run.add_subparsers(dest="experiment", metavar="EXPERIMENT", required=True)
    for entry in registry.EXPERIMENTS:  # read now, not at import: a row added since (a test's) is listed
        sub = experiments.add_parser(entry.name, help=entry.help, description=entry.help)
        if entry.name == experiment:
            experiment_flags(sub, entry)

    sessions = commands.add_parser("sessions", help="list or show saved sessions")
    which = sessions.add_subparsers(dest="sessions_command", required=True, metavar="{list,show}")
    which.add_parser("list", help="every session, newest first")
    show = which.add_parser("show", help="one session's manifest, results and jobs")
    show.add_argument("name")

    from cli.commands import export

    exporting = commands.add_parser("export", help="save a session's recovered, growth or uniform model as a HF "
                                                   "folder; --push-to-hub uploads it (or the prune export)")
    export.add_arguments(exporting)
    exporting.set_defaults(handler=export.main)

    from cli.commands import atlas, compare

    mapping = commands.add_parser("atlas", help="the same measures of many models on one protocol, merged on "
                                  "relative depth (resumable; exported as a dataset)")
    atlas.add_arguments(mapping)
    mapping.set_defaults(handler=lambda args: atlas.main(args, run=main))
    comparing = commands.add_parser("compare", help="sessions or an atlas side by side on relative depth, "
                                    "with the criteria's agreement")
    compare.add_arguments(comparing)
    comparing.set_defaults(handler=compare.main)

    from cli.commands import report

    reporting = commands.add_parser("report", help="a session's results as figures (PNG, SVG), an HTML page, "
                                    "Markdown and one PDF: tables, settings, versions, reproducing commands")
    report.add_arguments(reporting)
    reporting.set_defaults(handler=report.main)
    return parser


SIGPIPE_EXIT = 141  # 128 + SIGPIPE: what a shell reports for a command whose reader went away


def main(argv: Sequence[str] | None = None) -> int:
    """The command's exit status. Output into a pipe its reader closed (`sessions show S | head -1`)
    ends the command quietly with SIGPIPE_EXIT, as the Python docs' recipe does: the rest of the
    output goes to the null device, so nothing complains when the interpreter flushes at exit."""
    try:
        status = _main(argv)
        sys.stdout.flush()  # what is still buffered: a closed pipe is found here, not at exit
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return SIGPIPE_EXIT
    return status


def _main(argv: Sequence[str] | None) -> int:
    own_process = argv is None  # started for its command line, not `main([...])` called from Python
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = build_parser(chosen_experiment(argv)).parse_args(argv)
        if own_process and args.command in ("run", "atlas"):  # one headless job: engine/core/frozen_imports.py
            one_job_process()
        if args.command == "run":
            from cli.runner import run_command

            with stop_on_signals():  # SIGTERM, SIGHUP stop a run the way Ctrl-C does
                return run_command(registry.BY_NAME[args.experiment], args, argv)
        if args.command == "atlas":  # its runs, and what it does between them, stop on SIGTERM, SIGHUP too
            with stop_on_signals():
                return int(args.handler(args) or 0)
        if args.command in ("export", "compare", "report"):
            return int(args.handler(args) or 0)
        if args.command == "sessions":
            from cli.commands.sessions import main as sessions_main

            return sessions_main(args)
        from cli.launch import launch

        return launch(args)
    except (UserError, SessionError) as exc:
        if not hand_to_launcher(one_line(str(exc))):  # a worker of --shards: said once, by rank 0 or the launcher
            say(f"anatomy-tui: error: {one_line(str(exc))}")
        return 2
    except (MemoryError, RuntimeError) as exc:  # a huge count or size (--restarts 10**12) asks for terabytes
        if NOT_DETERMINISTIC in str(exc):
            operation = str(exc).split(NOT_DETERMINISTIC)[0].strip()
            say(f"anatomy-tui: error: {one_line(operation)} has no deterministic GPU kernel; rerun with "
                "--no-deterministic (results then agree within floating-point noise)")
            return 2
        if not isinstance(exc, MemoryError) and not any(w in str(exc).lower() for w in TOO_LARGE):
            raise
        say(f"anatomy-tui: error: out of memory ({one_line(str(exc)) or 'MemoryError'}); the settings ask "
            "for more than this machine has: use smaller counts or sizes")
        return 2
    except OSError as exc:  # a path a user gave, wherever a check first touched it (engine.data.text.PATH_ERRNOS)
        from engine.core.files import PATH_ERRNOS, short_path

        if exc.errno not in PATH_ERRNOS:
            raise

        where = f"{short_path(exc.filename)}: " if exc.filename else ""
        say(f"anatomy-tui: error: {where}{exc.strerror or exc}")
        return 2
    except KeyboardInterrupt as exc:  # before the job started (the model loading) or after it ended
        say(f"anatomy-tui: interrupted{f' by {exc.name}' if isinstance(exc, Stopped) else ''}")
        return exit_code(exc)


if __name__ == "__main__":
    sys.exit(main())
