"""The `anatomy-tui` command: the console by default, `run EXPERIMENT` headless, `sessions`."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from engine.errors import UserError
from sessions.store import SessionError

# (name, module under tui.commands, one-line help). Each module has add_arguments and main.
RUN_COMMANDS: tuple[tuple[str, str, str], ...] = (
    ("ablation", "ablation", "layer-importance map: ablate each layer, measure perplexity"),
    ("recovery", "recovery", "recovery speed: noise one layer, fine-tune it alone, follow its PPL"),
    ("growth", "growth", "grow a transformer phase by phase from an importance profile vs a uniform one"),
    ("dynamics", "dynamics", "hidden-state angles per layer, PCA and clusters of token profiles"),
    ("scaling-fit", "scaling_fit", "fit L = c_m/m^a_m + c_l/l^a_l + c_D/D^a_D + L0 to training runs (CSV)"),
    ("toy-depth", "toy_depth", "teacher-student toy models: student loss against depth, fitted a_l"),
    ("weights", "weights", "weight predictability (Ridge R², LOO), delta correlation, nulls, R²-PPL paradox"),
    ("manipulate", "manipulate", "zero, clone, blend, low-rank SVD blend, scale layers: perplexity, samples"),
)


def build_parser() -> argparse.ArgumentParser:
    from tui.commands.common import add_model_arguments

    parser = argparse.ArgumentParser(
        prog="anatomy-tui",
        description="A terminal lab console for the anatomy of transformer language models.",
    )
    add_model_arguments(parser)
    parser.add_argument("--session", default=None, help="open this session in the console")
    parser.add_argument("--resume", action="store_true", help="open the most recent session")
    parser.add_argument("--serve", action="store_true", help="serve the console to a browser (textual-serve)")
    parser.add_argument("--port", type=int, default=8000, help="port for --serve (default 8000)")
    commands = parser.add_subparsers(dest="command", metavar="{run,sessions,export}")

    run = commands.add_parser("run", help="run an experiment headless into a session")
    experiments = run.add_subparsers(dest="experiment", metavar="EXPERIMENT", required=True)
    for name, module_name, help_text in RUN_COMMANDS:
        module = importlib.import_module(f"tui.commands.{module_name}")
        sub = experiments.add_parser(name, help=help_text, description=help_text)
        module.add_arguments(sub)
        sub.set_defaults(handler=module.main)

    sessions = commands.add_parser("sessions", help="list or show saved sessions")
    which = sessions.add_subparsers(dest="sessions_command", required=True, metavar="{list,show}")
    which.add_parser("list", help="every session, newest first")
    show = which.add_parser("show", help="one session's manifest, results and jobs")
    show.add_argument("name")

    from tui.commands import export

    exporting = commands.add_parser("export", help="save a session's recovered, growth or uniform model as a HF folder")
    export.add_arguments(exporting)
    exporting.set_defaults(handler=export.main)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.command in ("run", "export"):
            return int(args.handler(args) or 0)
        if args.command == "sessions":
            from tui.commands.sessions import main as sessions_main

            return sessions_main(args)
        from tui.launch import launch

        return launch(args)
    except (UserError, SessionError) as exc:
        print(f"anatomy-tui: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("anatomy-tui: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
