"""The model flags: one helper (cli/flags.py `model_flags`) gives a job's command, a resumed job's
and the served console's the model options they run with, and each front end reads them back to
the same options, for every field of ModelOptions (the values come from the dataclass fields, so a
field added there and not passed on fails here). The export command reads ModelOptions' own
--device and --dtype."""

from __future__ import annotations

import argparse
import dataclasses
import shlex

from cli.flags import flag_text, model_flags, model_options_from_args
from cli.main import build_parser
from engine.core.settings import FieldSpec
from engine.experiments.ablation.vocabulary import AblationSettings
from engine.models.options import ModelOptions
from sessions.store import SessionStore

# free-text fields: a value other than the default that the field accepts (a new free-text field
# needs one here; a bool or a field with choices gets another value by itself)
TEXT = {"model": "org/some-model", "device": "cuda:1", "max_memory": "0=14GiB,1=14GiB,cpu=30GiB"}


def changed(spec: FieldSpec):
    if spec.name in TEXT:
        return TEXT[spec.name]
    if spec.base is bool:
        return not spec.default
    others = [choice for choice in spec.meta.get("choices") or () if choice != spec.default]
    assert others, f"ModelOptions.{spec.name}: give tests/test_model_flags.py TEXT a value for it"
    return others[0]


def all_changed() -> ModelOptions:
    """ModelOptions with every field away from its default (and still valid together)."""
    options = ModelOptions(**{spec.name: changed(spec) for spec in ModelOptions.fields()})
    options.validate()
    default = ModelOptions()
    assert all(getattr(options, f.name) != getattr(default, f.name) for f in dataclasses.fields(ModelOptions))
    return options


def run_options(argv: list[str]) -> ModelOptions:
    """The options `anatomy-tui run ...` reads from a job's argv (after `python -c PROGRAM`)."""
    assert argv[1] == "-c"
    return model_options_from_args(build_parser(argv[4]).parse_args(argv[3:]))


def test_every_model_flag_comes_and_goes_back() -> None:
    options = all_changed()
    flags = model_flags(options)
    assert len(flags) == len(ModelOptions.fields())  # one flag per field, none left out
    assert model_options_from_args(build_parser().parse_args(flags)) == options
    assert model_flags(ModelOptions()) == []  # defaults: no flags


def test_a_job_gets_the_consoles_model_options() -> None:
    from cli.argv import job_argv

    for options in (all_changed(), ModelOptions()):
        assert run_options(job_argv("ablation", AblationSettings(), options, "s", resume=False)) == options


def test_a_resumed_job_gets_its_recorded_model_options_never_remote_code() -> None:
    from cli.argv import resume_argv

    options = all_changed()
    session = SessionStore().create("r", model=options.model)
    doc = {"experiment": "recovery", "settings": {}, "model": options.to_dict()}
    assert run_options(resume_argv(doc, session)) == options.untrusted()


def test_the_served_console_gets_the_model_options() -> None:
    from cli.launch import serve_command

    options = all_changed()
    args = build_parser().parse_args([*model_flags(options), "--session", "s"])
    parts = shlex.split(serve_command(args))
    assert parts[1] == "-c" and parts[-2:] == ["--session", "s"]  # python -c PROGRAM (engine.core.process)
    assert model_options_from_args(build_parser().parse_args(parts[3:])) == options


def test_export_reads_the_model_options_device_and_dtype() -> None:
    from cli.commands.export import EXPORT_LOAD, LOAD_FLAGS

    options = all_changed()
    flags = [flag_text(spec, getattr(options, spec.name)) for spec in ModelOptions.fields() if spec.name in LOAD_FLAGS]
    args = build_parser().parse_args(["export", "s", "out", "--model", "recovered", *flags])
    assert isinstance(args, argparse.Namespace) and args.model == "recovered"
    given = {name: getattr(args, name) for name in LOAD_FLAGS}
    assert EXPORT_LOAD.override(given) == dataclasses.replace(EXPORT_LOAD, **given)
    assert given == {name: getattr(options, name) for name in LOAD_FLAGS}
    plain = build_parser().parse_args(["export", "s", "out", "--model", "recovered"])
    assert (plain.device, plain.dtype) == ("cpu", "auto")  # export loads on the CPU unless told
