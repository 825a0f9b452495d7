"""The `anatomy-tui` command: the console by default, `run EXPERIMENT` headless, `sessions`.

Every `run` sub-command comes from the experiment registry (engine/registry.py): its flags are the
fields of its Settings (type, default, help and range declared once, on the field), plus the model
flags (engine/options.py) and the session flags. Only the chosen experiment's flags are built, so
`anatomy-tui --help` and the console start import no torch.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from engine.errors import UserError
from engine.options import ModelOptions
from engine.registry import BY_NAME, EXPERIMENTS, Experiment
from engine.settings import FieldSpec, Settings
from sessions.store import SessionError

# Read by the console (tui/app.py) until it reads engine.registry itself.
RUN_COMMANDS: tuple[tuple[str, str, str], ...] = tuple((e.name, e.module, e.help) for e in EXPERIMENTS)


def _default_text(spec: FieldSpec, value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if value is None:
        return spec.meta.get("none_word") or "none"
    try:
        return spec.show_text(value) or "none"
    except ValueError:
        return str(value)


def add_settings_arguments(parser: argparse.ArgumentParser, defaults: Settings, taken: set[str]) -> None:
    """One flag per settings field (its aliases too, where no other flag has the name). Flags
    default to SUPPRESS, so the namespace holds exactly the values given on the command line."""
    primary = {spec.flag for spec in defaults.fields()}
    for spec in defaults.fields():
        if not spec.meta.get("cli", True):
            continue
        names = [spec.flag, *(a for a in spec.meta.get("aliases", ()) if a not in taken | primary)]
        taken.update(names)
        default = _default_text(spec, getattr(defaults, spec.name))
        if spec.base is bool and not spec.is_tuple:
            # on by default: --flag/--no-flag; off by default: --flag alone
            action = argparse.BooleanOptionalAction if getattr(defaults, spec.name) else "store_true"
            parser.add_argument(*names, dest=spec.name, action=action, default=argparse.SUPPRESS,
                                help=f"{spec.help} (default {default})".replace("%", "%%"))
            continue
        plain_text = spec.base is str and not spec.is_tuple and not spec.meta.get("choices")
        rule = "" if plain_text or spec.meta.get("parse") else spec.rule() + "; "  # parse: the help says
        parser.add_argument(*names, dest=spec.name, type=spec.parse_text, default=argparse.SUPPRESS,
                            metavar=_metavar(spec), help=f"{spec.help} ({rule}default {default})".replace("%", "%%"))


def _metavar(spec: FieldSpec) -> str:
    if spec.meta.get("file"):
        return "FILE"
    if spec.base not in (int, float, str, bool):
        return "SPEC"  # a structured value (a phase table, pairs): its help says how to write it
    if spec.is_tuple:
        return "LIST"
    return {int: "N", float: "X"}.get(spec.base, "TEXT")


def _experiment_flags(parser: argparse.ArgumentParser, experiment: Experiment) -> None:
    taken = {"--session", "--json", "--resume", "--preset", "-h", "--help"}
    if experiment.needs_model:
        group = parser.add_argument_group("model")
        add_settings_arguments(group, ModelOptions(), taken)  # type: ignore[arg-type]
    parser.add_argument("--session", default=None, help="session name (default: a new timestamped one)")
    parser.add_argument("--json", type=Path, default=None, metavar="PATH", help="also write the result here")
    if experiment.resumable:
        parser.add_argument("--resume", action="store_true",
                            help="continue the run checkpointed in --session")
    presets = experiment.presets
    if presets:
        parser.add_argument("--preset", default=experiment.preset, choices=sorted(presets),
                            help=f"the settings to start from; flags given override it (default {experiment.preset})")
    add_settings_arguments(parser.add_argument_group("settings"), experiment.defaults(), taken)  # type: ignore[arg-type]


def chosen_experiment(argv: Sequence[str]) -> str | None:
    """The experiment named after `run`, if any (only its flags are built)."""
    if "run" not in argv:
        return None
    return next((word for word in argv[list(argv).index("run") + 1 :] if word in BY_NAME), None)


def build_parser(experiment: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="anatomy-tui",
        description="A terminal lab console for the anatomy of transformer language models.",
    )
    add_settings_arguments(parser, ModelOptions(), set())
    parser.set_defaults(**ModelOptions().to_dict())  # the console reads them all
    parser.add_argument("--session", default=None, help="open this session in the console")
    parser.add_argument("--resume", action="store_true", help="open the most recent session")
    parser.add_argument("--serve", action="store_true", help="serve the console to a browser (textual-serve)")
    parser.add_argument("--port", type=int, default=8000, help="port for --serve (default 8000)")
    commands = parser.add_subparsers(dest="command", metavar="{run,sessions}")

    run = commands.add_parser("run", help="run an experiment headless into a session")
    experiments = run.add_subparsers(dest="experiment", metavar="EXPERIMENT", required=True)
    for entry in EXPERIMENTS:
        sub = experiments.add_parser(entry.name, help=entry.help, description=entry.help)
        if entry.name == experiment:
            _experiment_flags(sub, entry)

    sessions = commands.add_parser("sessions", help="list or show saved sessions")
    which = sessions.add_subparsers(dest="sessions_command", required=True, metavar="{list,show}")
    which.add_parser("list", help="every session, newest first")
    show = which.add_parser("show", help="one session's manifest, results and jobs")
    show.add_argument("name")
    return parser


def settings_from_args(experiment: Experiment, args: argparse.Namespace) -> Settings:
    """The preset (or the defaults) with the flags given on the command line over it, validated."""
    base = experiment.presets[args.preset] if getattr(args, "preset", None) else experiment.defaults()
    given = {spec.name: getattr(args, spec.name) for spec in base.fields() if hasattr(args, spec.name)}
    return base.override(given)


def model_options_from_args(args: argparse.Namespace) -> ModelOptions:
    defaults = ModelOptions()
    given = {spec.name: getattr(args, spec.name) for spec in defaults.fields() if hasattr(args, spec.name)}
    return defaults.override(given)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = build_parser(chosen_experiment(argv)).parse_args(argv)
        if args.command == "run":
            from tui.runner import run_command

            return run_command(BY_NAME[args.experiment], args)
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
