"""The experiment registry and the settings declared once: flags, validation, job files, resume.

Registry-driven: every entry of engine.registry.EXPERIMENTS is checked, so a new experiment is
covered without a list typed again here; only the defaults a run starts from are written here by
hand (from the docs and the paper), so a changed default shows.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from typing import Any

import pytest

from cli.argv import job_argv, resume_argv
from cli.flags import model_options_from_args, settings_from_args
from cli.main import build_parser, main
from engine.core.errors import UserError
from engine.models.options import ModelOptions
from engine.registry import EXPERIMENTS, experiment
from tui.jobs import resumable_job

NAMES = [entry.name for entry in EXPERIMENTS]


def parse(argv: list[str]):
    """Settings and model options from an `anatomy-tui run ...` argv, as the CLI builds them."""
    args = build_parser(argv[1]).parse_args(argv)
    entry = experiment(argv[1])
    return settings_from_args(entry, args), model_options_from_args(args)


# what `anatomy-tui run NAME` runs with no flag: a few telling settings of each, as documented
NO_FLAGS: dict[str, dict[str, Any]] = {
    "ablation": {"method": "mean", "layers": None, "part": "layer", "max_length": 256, "bootstrap": 0},
    "recovery": {"layers": (11, 14, 17), "sigma": 0.5, "steps": None, "lr": 1e-4, "repeats": 1, "batch_size": 4},
    "growth": {"preset": "paper", "steps": 656, "hidden_size": 256, "profile_layers": 12,
               "arms": ("growth_100", "growth_50", "uniform_100")},
    "dynamics": {"max_tokens": 8192, "components": 10, "profile": "both", "clusters": 0},
    "scaling-fit": {"csv": None, "restarts": 512, "bootstrap": 200, "exclude_highest": 40, "optimizer": "lm"},
    "toy-depth": {"preset": "tiny", "width": 32, "teacher_depth": 32, "student_depths": (2, 3, 4, 6, 8, 12, 16),
                  "regimes": ("tied", "independent"), "seeds": 2},
    "weights": {"degree": 3, "null_draws": 5, "first_layer": 2, "paradox": True, "paradox_counts": (1, 3, 9, 0)},
    "manipulate": {"strategies": ("zero", "clone", "blend", "svd", "scale"), "rank": 8,
                   "alphas": (0.0, 0.1, 0.3, 0.5, 0.7, 0.9), "prompt": "The capital of France is"},
    "prune": {"method": "all", "remove": (1, 2, 4, 8), "heal_steps": 0, "bootstrap": 1000, "unit": "layer"},
    "evaluate": {"tasks": (), "variants": ("original",), "batch_size": 1, "folder": None},
}


@pytest.mark.parametrize("name", sorted(NO_FLAGS))
def test_no_flags_give_the_documented_defaults(name):
    settings, options = parse(["run", name])
    assert {field: getattr(settings, field) for field in NO_FLAGS[name]} == NO_FLAGS[name]
    assert options == ModelOptions()


@pytest.mark.parametrize("name", NAMES)
def test_every_field_has_help_and_round_trips_through_json(name):
    entry = experiment(name)
    cls = entry.settings_class
    for spec in cls.fields():
        assert spec.help and spec.rule(), (name, spec.name)
    for settings in (entry.defaults(), *entry.presets.values()):
        doc = json.loads(json.dumps(settings.to_dict(), allow_nan=False))
        assert cls.from_dict(doc) == settings


@pytest.mark.parametrize("name", NAMES)
def test_job_command_rebuilds_the_settings(name):
    entry = experiment(name)
    options = ModelOptions(model="some/model", dtype="float16") if entry.needs_model else None
    argv = job_argv(name, entry.defaults(), options, "s1", resume=entry.resumable)
    assert argv[:2] == [sys.executable, "-c"] and argv[3:5] == ["run", name]  # tests/test_planted_folder.py runs it
    assert argv[-2:] == ["s1", "--resume"] if entry.resumable else argv[-2:] == ["--session", "s1"]
    settings, parsed_options = parse([a for a in argv[3:] if a != "--resume"])
    assert settings == entry.defaults()
    if options is not None:
        assert parsed_options == options


@pytest.mark.parametrize(
    "name, changes",
    [
        ("recovery", dict(layers=None, sigma=0.25, seed=3, eval_batch_size=2, train_file="t.txt")),
        ("weights", dict(paradox=False, paradox_counts=(2, 0), frequencies=(0.5,), components=("q", "v"))),
        ("manipulate", dict(layers=(), alphas=(-0.5, 1.0), together=True, prompt="Hi, there")),
        ("scaling-fit", dict(huber_delta=1e-3, budgets=(1e9,), loss_column="L")),
        ("toy-depth", dict(fit_floor=True, temperatures=(0.1, 1.0), steps=7)),
        ("dynamics", dict(include_first=True, eval_batch_size=3)),
    ],
)
def test_job_command_rebuilds_changed_settings(name, changes):
    settings = dataclasses.replace(experiment(name).defaults(), **changes)
    argv = job_argv(name, settings, None, "s", resume=False)
    assert parse(argv[3:-2])[0] == settings


def test_growth_job_command_carries_the_phase_table_and_seeds():
    from engine.experiments.growth.protocol import Phase
    from engine.experiments.growth.vocabulary import PRESETS

    phases = (Phase("core", (4, 5), steps=3), Phase("all", tuple(range(12)), clone_from=((0, 4),), epochs=0.5))
    settings = dataclasses.replace(PRESETS["tiny"], phases=phases, steps=0, seeds=(4,),
                                   multipliers=(("critical", 3.0), ("important", 2.0), ("minor", 1.5),
                                                ("redundant", 1.0)))  # fmt: skip
    argv = job_argv("growth", settings, None, "s", resume=True)
    assert "--preset=tiny" in argv and argv[-1] == "--resume"
    assert parse(argv[3:-3])[0] == settings


def test_from_dict_refuses_unknown_keys_and_bad_values():
    from engine.experiments.recovery.vocabulary import RecoverySettings

    with pytest.raises(UserError, match="unknown setting 'argv'"):
        RecoverySettings.from_dict({"argv": ["--trust-remote-code"]})
    for bad in ({"seed": -1}, {"lr": "0.1"}, {"steps": 1.5}, {"layers": [1, "x"]}, {"sigma": None}):
        with pytest.raises(UserError):
            RecoverySettings.from_dict(bad)
    assert RecoverySettings.from_dict({"layers": None}).layers is None


def _job(**changes):
    return {"experiment": "recovery", "status": "interrupted", "started": 1.0,
            "settings": {"layers": [1], "steps": 3}, "model": {"model": "m", "trust_remote_code": True},
            **changes}  # fmt: skip


def test_resume_command_never_trusts_the_job_file():
    from sessions.store import SessionStore

    session = SessionStore().create("r", model="m")
    argv = resume_argv(_job(), session)
    assert "--trust-remote-code" not in argv and argv[-1] == "--resume"
    assert "--layers=1" in argv and "--steps=3" in argv and "--model=m" in argv
    with pytest.raises(UserError, match="not the session's"):
        resume_argv(_job(model={"model": "/elsewhere/evil"}), session)
    with pytest.raises(UserError, match="unknown setting"):
        resume_argv(_job(settings={"layers": [1], "extra": "--trust-remote-code"}), session)
    with pytest.raises(UserError, match="cannot be resumed"):
        resume_argv(_job(experiment="prune"), session)


def test_only_the_latest_interrupted_job_that_resumes_is_offered():
    dead = {"status": "interrupted"}
    jobs: dict[str, dict[str, Any]] = {
        "growth-old": {**dead, "experiment": "growth", "started": 1.0},
        "growth-new": {"status": "done", "experiment": "growth", "started": 2.0},  # resumed since
        "prune-1": {**dead, "experiment": "prune", "started": 3.0},  # prune does not resume
        "bogus-1": {**dead, "experiment": "bogus", "started": "x"},
        "recovery-1": {**dead, "experiment": "recovery", "started": 0.5},
    }
    offered = resumable_job(jobs)
    assert offered is not None and offered[0] == "recovery-1"
    del jobs["recovery-1"]
    assert resumable_job(jobs) is None


@pytest.mark.parametrize(
    "argv, words",
    [
        (["growth", "--lr", "-1"], "--lr -1: must be a number above 0"),
        (["growth", "--lr", "0"], "--lr 0"),
        (["growth", "--batch-size", "0"], "--batch-size 0"),
        (["growth", "--heads", "0"], "--heads 0"),
        (["growth", "--hidden-size", "0"], "--hidden-size 0"),
        (["growth", "--seq-len", "0"], "--seq-len 0"),
        (["growth", "--eval-batches", "0"], "--eval-batches 0"),
        (["growth", "--base-ffn", "0"], "--base-ffn 0"),
        (["growth", "--eval-every", "0"], "--eval-every 0"),
        (["growth", "--gen-tokens", "-1"], "--gen-tokens -1"),
        (["growth", "--threads", "-1"], "--threads -1"),
        (["growth", "--half-fraction", "nan"], "--half-fraction nan"),
        (["growth", "--lr", "inf"], "--lr inf"),
        (["growth", "--heads", "3"], "multiple of --heads"),
        (["toy-depth", "--temperatures", "1,nan"], "--temperatures"),
        (["scaling-fit", "--huber", "inf"], "--huber inf"),
        (["scaling-fit", "--budgets", "1e9,-1"], "--budgets"),
        (["weights", "--frequencies", "nan"], "--frequencies nan"),
        (["ablation", "--seed", "-1"], "--seed -1"),
        (["ablation", "--max-length", "1"], "--max-length 1"),
        (["manipulate", "--layers", "abc"], "--layers abc"),
        (["recovery", "--eval-file", "/nope/eval.txt"], "does not exist"),
        (["recovery", "--train-file", "/nope/train.txt"], "training file /nope/train.txt does not exist"),
        (["prune", "--train-file", "/nope/train.txt", "--heal-steps", "2"], "training file /nope/train.txt"),
        (["ablation", "--json", "/"], "is a directory"),
    ],
)
def test_bad_values_are_one_line_before_any_model_loads(argv, words, capsys, isolated_home):
    extra = ["--model", "no-such-model"] if experiment(argv[0]).needs_model else []
    assert main(["run", *argv, *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("anatomy-tui: error: ") and words in err[0], err
    assert not isolated_home.exists() or not any(isolated_home.iterdir())  # no session left behind


def test_a_model_that_fails_to_load_leaves_no_session(capsys, isolated_home):
    assert main(["run", "ablation", "--model", "no-such-model", "--session", "s"]) == 2
    assert "unknown model" in capsys.readouterr().err
    assert not (isolated_home / "s").exists()


def test_help_and_the_cli_import_no_torch():
    code = ("import sys\nfrom cli.main import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
            "print('torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip().splitlines()[-1] == "False"
