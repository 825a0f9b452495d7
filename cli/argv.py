"""A run's command line, rebuilt from data (the experiment, its settings, the model options), never
from a recorded argv: the job the console starts, the command that resumes an interrupted run, the
report's reproducing command. It runs this project's code (engine.core.process python_argv).
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from cli.flags import flag_text, model_flags
from engine.core.errors import UserError
from engine.core.process import python_argv
from engine.core.settings import Settings
from engine.models.options import ModelOptions
from engine.registry import BY_NAME
from engine.registry import experiment as find_experiment
from sessions.store import Session


def job_argv(
    experiment: str, settings: Settings, options: ModelOptions | None, session: str, resume: bool,
    cluster: str | None = None,
) -> list[str]:
    """The exact `anatomy-tui run` command of a job on this machine (`run_argv`), with `--shards` for
    a sweep that splits over the visible GPUs, or `--cluster` for a Ray task there (`cluster`)."""
    where = ["--cluster", cluster] if cluster else shards_flag(experiment, settings, options)
    return [*run_argv(experiment, settings, options), *where, "--session", session, *(["--resume"] if resume else [])]


def run_argv(experiment: str, settings: Settings, options: ModelOptions | None) -> list[str]:
    """`python -m cli.main run` for these settings (as engine.core.process `python_argv` runs it: this
    project's code, never a `cli/` in the folder the job starts in), wherever it runs: `--preset` where the experiment
    has presets, then one flag for every setting that differs from where it starts, then the model
    flags. `--trust-remote-code` appears only if `options` asks for it (options read from a file
    never do: `untrusted()`)."""
    entry = find_experiment(experiment)
    argv = [*python_argv("cli.main"), "run", experiment]
    base = entry.defaults()
    presets = entry.presets
    preset: str | None = getattr(settings, "preset", None)
    if presets and preset is not None and preset in presets:
        argv.append(f"--preset={preset}")
        base = presets[preset]
    for spec in settings.fields():
        value = getattr(settings, spec.name)
        if value == getattr(base, spec.name) or (presets and spec.name == "preset"):
            continue
        if not spec.meta.get("cli", True):
            raise UserError(f"setting {spec.name} has no flag, so this {experiment} run cannot be started as a job")
        argv.append(flag_text(spec, value))
    if options is not None:
        argv += model_flags(options)
    return argv


def typed(argv: Sequence[str]) -> str:
    """A `job_argv` command as a user types it (`anatomy-tui` for its `python_argv("cli.main")`)."""
    return shlex.join(["anatomy-tui", *argv[3:]])


def shards_flag(experiment: str, settings: Settings, options: ModelOptions | None) -> list[str]:
    """`--shards=K` for a sweep that splits, K the visible GPUs when there are several (one worker
    per GPU, so the map or the recovery sweep uses all of them), or fewer when the sweep has fewer
    units (one layer noised once needs one); nothing otherwise, nor for a model spread over the
    GPUs by --device-map, nor for a job pinned to one device (`cpu`, or `cuda:N`: a console
    started on one GPU keeps its jobs off the others; `run` refuses --shards with cuda:N anyway)."""
    if not find_experiment(experiment).shardable or (options is not None and options.device_map is not None):
        return []
    device = options.device if options is not None else getattr(settings, "device", "auto")
    if device == "cpu" or device.startswith("cuda:"):
        return []
    from engine.models.placement import Hardware

    gpus = Hardware.read().gpus
    shards = gpus if gpus < 2 else min(gpus, find_experiment(experiment).known_units(settings) or gpus)
    return [f"--shards={shards}"] if shards >= 2 else []


def resume_argv(doc: Mapping[str, Any], session: Session) -> list[str]:
    """The command that resumes the job recorded in `doc` (a jobs/<id>.json someone may have
    sent): its settings are checked as untrusted data, the model must be the session's own, and
    a model's own code is never allowed."""
    name = str(doc.get("experiment"))
    entry = BY_NAME.get(name)
    if entry is None or not entry.resumable:
        raise UserError(f"job experiment {name!r} cannot be resumed")
    settings = entry.settings_class.from_dict(doc.get("settings") or {}, base=entry.defaults())
    options = None
    if entry.needs_model:
        options = ModelOptions.from_dict(doc.get("model") or {}).untrusted()
        recorded = session.manifest.get("model")
        if recorded and options.model != recorded:
            raise UserError(f"the job names model {options.model}, not the session's {recorded}; not resumed")
    return job_argv(name, settings, options, session.name, resume=True)
