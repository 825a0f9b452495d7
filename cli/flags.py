"""Command-line flags derived from Settings fields: one declaration (engine/core/settings.py), every
front end's flags. Used by `cli/main.py` for `anatomy-tui run` and by the console for the flags a
user types into a form (growth's), so both accept exactly the same words."""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from collections.abc import Collection, Iterable, Sequence
from pathlib import Path
from typing import Any, NoReturn

from engine.core.errors import UserError
from engine.core.settings import FieldSpec, Settings
from engine.models.options import ModelOptions
from engine.registry import Experiment


def _default_text(spec: FieldSpec, value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if value is None:
        return spec.meta.get("none_word") or "none"
    try:
        return spec.show_text(value) or "none"
    except ValueError:
        return str(value)


def add_settings_arguments(parser: argparse._ActionsContainer, defaults: Settings, taken: set[str],
                           only: Collection[str] | None = None) -> None:
    """One flag per settings field (its aliases too, where no other flag has the name); `only`: the
    flags of these fields alone. Flags default to SUPPRESS, so the namespace holds exactly the
    values given on the command line. `parser`: a parser or one of its argument groups (argparse's
    common base of both)."""
    primary = {spec.flag for spec in defaults.fields()}
    for spec in defaults.fields():
        if not spec.meta.get("cli", True) or (only is not None and spec.name not in only):
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


def experiment_flags(parser: argparse.ArgumentParser, experiment: Experiment) -> None:
    taken = {"--session", "--json", "--resume", "--preset", "--cluster", "--retries", "-h", "--help"}
    if experiment.needs_model:
        group = parser.add_argument_group("model")
        add_settings_arguments(group, ModelOptions(), taken)
    parser.add_argument("--session", default=None, help="session name (default: a new timestamped one)")
    parser.add_argument("--json", type=Path, default=None, metavar="PATH", help="also write the result here")
    if experiment.resumable:
        parser.add_argument("--resume", action="store_true",
                            help="continue the run checkpointed in --session")
    if experiment.shardable:
        taken.add("--shards")
        parser.add_argument("--shards", type=_shards, default=None, metavar="N",
                            help="split the sweep over N worker processes on this machine (one per GPU, "
                            "or an equal share of the CPU threads); under torchrun the workers are torchrun's")
    cluster_arguments(parser)
    presets = experiment.presets
    if presets:
        parser.add_argument("--preset", default=experiment.preset, choices=sorted(presets),
                            help=f"the settings to start from; flags given override it (default {experiment.preset})")
    add_settings_arguments(parser.add_argument_group("settings"), experiment.defaults(), taken)


def cluster_arguments(parser: argparse.ArgumentParser) -> None:
    """`--cluster` and `--retries`: the run (or each measure of an atlas) as a Ray task (engine/cluster/)."""
    parser.add_argument("--cluster", default=None, metavar="ADDRESS",
                        help="run as a Ray task: local (Ray started on this machine) or auto (RAY_ADDRESS=HEAD:6379, "
                        "or the cluster `ray start` runs here); needs the cluster extra (pip install "
                        "'anatomy-tui[cluster]')")
    parser.add_argument("--retries", type=_retries, default=None, metavar="N",
                        help="with --cluster: tries after the first for a task whose worker died (default 2)")


def _retries(text: str) -> int:
    if not text.isdigit() or int(text) > 10:
        raise argparse.ArgumentTypeError(f"--retries {text}: must be a whole number from 0 to 10")
    return int(text)


def _shards(text: str) -> int:
    try:
        count = int(text)
    except ValueError:
        count = 0
    if count < 1:
        raise argparse.ArgumentTypeError(f"--shards {text}: must be a whole number of workers, at least 1")
    return count


NEGATIVE_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")  # argparse's own rule: a value, not a flag


def _is_flag(word: str) -> bool:
    """Whether argparse reads `word` as a flag: a leading '-', not a negative number, no space."""
    return word.startswith("-") and word != "-" and not NEGATIVE_NUMBER.match(word) and " " not in word


class CheckedParser(argparse.ArgumentParser):
    """A parser whose mistakes are caught where they are made, each a one-line UserError (never
    argparse's usage block and exit): no abbreviated flags (`--layer 3` was taken for `--layers 3`),
    and an unknown flag, command or experiment named, with the closest real one, before argparse
    blames the word after it (`--sesion lab` said "invalid choice: 'lab'"). Its sub-commands'
    parsers are of its class, so each checks its own words when argparse hands them over."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def parse_known_args(self, args: Sequence[str] | None = None,  # type: ignore[override]  # one for
                         namespace: Any = None) -> tuple[Any, list[str]]:  # typeshed's three overloads
        self.check_words(sys.argv[1:] if args is None else list(args))
        return super().parse_known_args(args, namespace)

    def check_words(self, words: Sequence[str]) -> None:
        """This parser's words up to its sub-command: each flag one of its own (read with the value
        it takes: the flags here take one or none), the sub-command one of its choices."""
        commands = next((action for action in self._actions if action.nargs == argparse.PARSER), None)
        index = 0
        while index < len(words) and words[index] != "--":
            word = words[index]
            if _is_flag(word):
                name = word.split("=", 1)[0]
                action = self._option_string_actions.get(name)
                if action is None:
                    self._unknown("flag", name, name, self._option_string_actions)
                values = action.nargs if isinstance(action.nargs, int) else 1
                index += 1 + (0 if "=" in word else values)
            elif commands is not None and isinstance(commands.choices, dict):
                if word not in commands.choices:
                    self._unknown(str(commands.dest).replace("_", " "), word, repr(word), commands.choices)
                return  # the rest is the sub-command's: its own parser checks it
            else:
                index += 1  # a positional value (`sessions show NAME`)

    def _unknown(self, what: str, word: str, shown: str, real: Iterable[str]) -> NoReturn:
        for match in difflib.get_close_matches(word, list(real), n=1):
            raise UserError(f"unknown {what} {shown}: did you mean {match}?")
        raise UserError(f"unknown {what} {shown}" + (f" (see {self.prog} --help)" if self.add_help else ""))

    def error(self, message: str) -> NoReturn:
        raise UserError(message)


def settings_from_flags(experiment: Experiment, flags: Sequence[str]) -> Settings:
    """Settings from flags typed in a form, exactly as `anatomy-tui run NAME FLAGS` reads them
    (model and session flags are the console's own, so they are refused here)."""
    parser = CheckedParser(prog=experiment.name, add_help=False)
    presets = experiment.presets
    if presets:
        parser.add_argument("--preset", default=experiment.preset, choices=sorted(presets))
    add_settings_arguments(parser, experiment.defaults(), {"--preset"})
    return settings_from_args(experiment, parser.parse_args(list(flags)))


def settings_from_args(experiment: Experiment, args: argparse.Namespace) -> Settings:
    """The preset (or the defaults) with the flags given on the command line over it, validated."""
    base = experiment.presets[args.preset] if getattr(args, "preset", None) else experiment.defaults()
    given = {spec.name: getattr(args, spec.name) for spec in base.fields() if hasattr(args, spec.name)}
    return base.override(given)


def flag_text(spec: FieldSpec, value: Any) -> str:
    """The one flag that sets this field to `value`, as `add_settings_arguments` reads it back."""
    if spec.base is bool and not spec.is_tuple:
        return spec.flag if value else "--no-" + spec.flag[2:]
    return f"{spec.flag}={spec.show_text(value)}"


def model_flags(options: ModelOptions) -> list[str]:
    """The flags that give these model options (those that differ from the defaults): how jobs and
    the served console get the console's model, device, dtype, determinism and TF32."""
    default = ModelOptions()
    return [flag_text(spec, getattr(options, spec.name)) for spec in options.fields()
            if getattr(options, spec.name) != getattr(default, spec.name)]


def model_options_from_args(args: argparse.Namespace) -> ModelOptions:
    defaults = ModelOptions()
    given = {spec.name: getattr(args, spec.name) for spec in defaults.fields() if hasattr(args, spec.name)}
    return defaults.override(given)
