"""How a run sets up torch on a GPU (faked on the CPU): deterministic kernels and TF32 as model
options, recorded, passed to jobs and shard workers; precision warnings for every front end."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from test_memory import fake_gpu_run, loaded_on_the_cpu

from cli.flags import model_options_from_args
from cli.main import build_parser, main
from cli.shards import SHARDS_DONE
from engine.models.loading import load_model
from engine.models.options import ModelOptions
from engine.models.precision import CUBLAS_WORKSPACE
from sessions.store import SessionStore


def test_the_flags_parse_on_run_and_the_console_and_default_on():
    assert (ModelOptions().deterministic, ModelOptions().tf32) == (True, True)
    run = model_options_from_args(build_parser("ablation").parse_args(
        ["run", "ablation", "--no-deterministic", "--no-tf32"]))
    assert (run.deterministic, run.tf32) == (False, False)
    console = model_options_from_args(build_parser().parse_args(["--no-deterministic"]))
    assert (console.deterministic, console.tf32) == (False, True)
    again = model_options_from_args(build_parser("recovery").parse_args(["run", "recovery", "--deterministic"]))
    assert again.deterministic


def test_the_load_sets_up_torch_as_asked(tiny_folder, monkeypatch):
    """On a GPU: deterministic kernels with the cuBLAS workspace set before any matmul, TF32 for
    float32 on Ampere; --no-deterministic and --no-tf32 turn them off; on the CPU torch is left alone."""
    deterministic = fake_gpu_run(monkeypatch, (8, 0), 10**12)  # an A100
    loaded_on_the_cpu(monkeypatch)
    loaded = load_model(str(tiny_folder), device="cuda:0", dtype="float32")
    assert deterministic == [True] and os.environ["CUBLAS_WORKSPACE_CONFIG"] == CUBLAS_WORKSPACE
    assert loaded.tf32 and torch.backends.cuda.matmul.allow_tf32
    assert loaded.describe()["deterministic"] and loaded.describe()["tf32"]
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG")
    loaded = load_model(str(tiny_folder), device="cuda:0", dtype="float32", deterministic=False, tf32=False)
    assert deterministic == [True, False] and "CUBLAS_WORKSPACE_CONFIG" not in os.environ
    assert not loaded.tf32 and not torch.backends.cuda.matmul.allow_tf32
    assert loaded.describe()["deterministic"] is False
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")  # the user's own choice is kept
    load_model(str(tiny_folder), device="cuda:0", dtype="float32")
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":16:8"
    load_model(str(tiny_folder), device="cpu")
    assert deterministic == [True, False, True]  # not called for the CPU


def test_the_flags_are_recorded_in_the_job(tiny_folder):
    argv = ["run", "ablation", "--model", str(tiny_folder), "--eval-set", "paper", "--layers", "1"]
    assert main([*argv, "--no-deterministic", "--no-tf32", "--session", "off"]) == 0
    assert main([*argv, "--session", "on"]) == 0
    for name, asked in (("off", False), ("on", True)):
        (job,) = SessionStore().open(name).jobs().values()
        assert job["model"]["deterministic"] is job["model"]["tf32"] is asked  # what resume rebuilds from
        assert job["spec"]["model"]["deterministic"] is asked


def test_jobs_and_shard_workers_get_the_flags(tiny_folder, monkeypatch, capsys):
    import engine.models.distributed
    from cli.argv import job_argv, resume_argv
    from engine.experiments.ablation.vocabulary import AblationSettings

    options = ModelOptions(str(tiny_folder), deterministic=False, tf32=False)
    argv = job_argv("ablation", AblationSettings(), options, "s", resume=False)
    assert "--no-deterministic" in argv and "--no-tf32" in argv
    assert model_options_from_args(build_parser("ablation").parse_args(argv[3:])) == options
    assert "--no-deterministic" not in job_argv("ablation", AblationSettings(), ModelOptions(), "s", resume=False)
    session = SessionStore().create("r", model=str(tiny_folder))
    doc = {"experiment": "recovery", "settings": {}, "model": options.to_dict()}
    assert "--no-deterministic" in resume_argv(doc, session)
    launched: list[list[str]] = []
    monkeypatch.setattr(engine.models.distributed, "launch", workers_that_finish(launched, lambda argv, shards: argv))
    assert main(["run", "ablation", "--model", str(tiny_folder), "--shards", "2", "--no-deterministic"]) == 0
    [workers] = launched
    assert "--no-deterministic" in workers  # every worker parses the command it was started with


def workers_that_finish(launched: list, seen: Callable[[list[str], int], object]) -> Callable[..., int]:
    """torch's launcher faked: records `seen(argv, shards)`, and rank 0 says its result was written
    (the file cli/runner.py names in SHARDS_DONE), as workers that finished do."""
    def launch(argv: list[str], shards: int, env: dict[str, str]) -> int:
        launched.append(seen(argv, shards))
        Path(env[SHARDS_DONE]).write_text("s", encoding="utf-8")
        return 0

    return launch


def test_shards_on_the_cpu_of_a_gpu_machine_are_not_counted_against_its_gpus(tiny_folder, monkeypatch):
    import engine.models.distributed

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    launched: list[int] = []
    monkeypatch.setattr(engine.models.distributed, "launch", workers_that_finish(launched, lambda argv, shards: shards))
    assert main(["run", "ablation", "--model", str(tiny_folder), "--shards", "2", "--device", "cpu"]) == 0
    assert launched == [2]


def test_a_kernel_without_a_deterministic_version_is_one_line(tiny_folder, monkeypatch, capsys):
    import engine.registry
    from engine.core.events import Progress

    def no_kernel(self, settings, context):
        yield Progress(0, 1)
        raise RuntimeError("adaptive_avg_pool2d_backward_cuda does not have a deterministic implementation, but you "
                           "set 'torch.use_deterministic_algorithms(True)'. You can turn off determinism ...")

    monkeypatch.setattr(engine.registry.Experiment, "run", no_kernel)
    assert main(["run", "ablation", "--model", str(tiny_folder), "--eval-set", "paper", "--session", "k"]) == 2
    (line,) = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert line == ("anatomy-tui: error: adaptive_avg_pool2d_backward_cuda has no deterministic GPU kernel; rerun "
                    "with --no-deterministic (results then agree within floating-point noise)")


@pytest.mark.parametrize("name", ["growth", "toy-depth"])
def test_growth_and_toy_depth_warn_of_emulated_bfloat16_like_run(name, monkeypatch):
    from engine.core.events import Message, Progress
    from engine.models.placement import Hardware, dtype_warnings
    from engine.registry import RunContext, experiment

    fake_gpu_run(monkeypatch, (7, 5), 10**12)  # a T4: no native bfloat16
    entry = experiment(name)
    settings = entry.presets["tiny"].override({"device": "cuda:0", "dtype": "bfloat16"})
    first = next(e for e in entry.run(settings, RunContext(model=None)) if not isinstance(e, Progress))
    assert isinstance(first, Message) and first.level == "warning"
    assert first.text == dtype_warnings("bfloat16", "cuda:0", Hardware.read())[0] and "emulated" in first.text


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_the_console_loads_its_model_with_the_flags(isolated_home, monkeypatch):
    from engine.models.loading import LoadedModel
    from tui.app import AnatomyApp

    stub = LoadedModel(None, None, "stub-model", "here", "cpu", "float32", "llama", 6)
    asked = []

    def fake_load(name, **kwargs):
        asked.append((kwargs["deterministic"], kwargs["tf32"]))
        return stub

    monkeypatch.setattr("engine.models.loading.load_model", fake_load)
    app = AnatomyApp(options=ModelOptions("stub-model", "cpu", deterministic=False, tf32=False))
    async with app.run_test(size=(120, 36)) as pilot:
        for _ in range(100):
            if app.loaded is stub:
                break
            await pilot.pause(0.1)
    assert asked == [(False, False)]
