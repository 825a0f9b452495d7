"""One model per GPU: jobs the console starts load the model it resolved (device, dtype), and the
console frees its copy when the GPU cannot hold both, reloading it when the job ends. The console's
choices are tested without a terminal in tests/test_lab.py; here the planner and the flags, and the
whole path from a key once."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from tiny_models import tiny_model

from cli.argv import job_argv
from engine.core.errors import UserError
from engine.experiments.ablation.vocabulary import AblationSettings
from engine.models.loading import LoadedModel
from engine.models.memory import model_bytes, plan_run
from engine.models.options import ModelOptions
from tui.jobs import BackgroundJob, job_options, job_placement


def on_gpu(folder: Path, device: str = "cuda:0", dtype: str = "float16", device_map: str | None = None
           ) -> LoadedModel:
    """The console's model as if loaded on a GPU (the tensors stay on the CPU: only sizes are read)."""
    return LoadedModel(tiny_model("llama"), None, folder.name, str(folder), device, dtype, "llama", 4,
                       device_map=device_map)


def test_jobs_get_the_resolved_device_and_dtype(tiny_folder):
    options = ModelOptions(str(tiny_folder))  # auto, auto
    resolved = job_options(options, on_gpu(tiny_folder))
    assert (resolved.device, resolved.dtype) == ("cuda:0", "float16")
    argv = job_argv("ablation", AblationSettings(), resolved, "s", resume=False)
    assert "--device=cuda:0" in argv and "--dtype=float16" in argv
    assert job_options(options, None) == options
    spread = job_options(ModelOptions(str(tiny_folder), device_map="auto"), on_gpu(tiny_folder, device_map="auto"))
    assert (spread.device, spread.dtype, spread.device_map) == ("auto", "float16", "auto")


def test_placement_against_a_fake_gpu_budget(tiny_folder):
    settings = AblationSettings(eval_set="paper")
    loaded = on_gpu(tiny_folder)
    options = job_options(ModelOptions(str(tiny_folder)), loaded)
    need = plan_run(str(tiny_folder), settings, "cpu", "float16").total
    held = model_bytes(loaded.model)
    assert job_placement("ablation", settings, options, loaded, free_bytes=10 * need) == "beside"
    assert job_placement("ablation", settings, options, loaded, free_bytes=int(need / 0.9) - held // 2) == "release"
    with pytest.raises(UserError, match=r"^the ablation job needs about .* on cuda:0 but .* is free"):
        job_placement("ablation", settings, options, loaded, free_bytes=0)
    cpu = on_gpu(tiny_folder, device="cpu", dtype="float32")
    assert job_placement("ablation", settings, options, cpu, free_bytes=0) == "beside"  # no GPU to share
    assert job_placement("ablation", settings, options, None, free_bytes=0) == "beside"
    spread = on_gpu(tiny_folder, device_map="auto")
    assert job_placement("ablation", settings, options, spread, free_bytes=10 * need) == "release"


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_the_console_releases_its_model_for_a_job_and_reloads_it(isolated_home, monkeypatch, tiny_folder):
    """From the key to the reload: `b` starts the map job where the console's model must go first,
    and the model loads again once the job's process has ended."""
    from tui.app import AnatomyApp
    from tui.console_settings import ConsoleSettings

    stub = on_gpu(tiny_folder)
    loads, started = [], []

    def fake_load(name, **kwargs):
        loads.append(name)
        return stub

    def launch(session, experiment, argv):  # the job: a process that ends on its own
        started.append(argv)
        process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1.5)"])
        return BackgroundJob(experiment, process.pid, Path("fake.log"), argv, process)

    monkeypatch.setattr("engine.models.loading.load_model", fake_load)
    monkeypatch.setattr("tui.lab_jobs.launch_job", launch)
    monkeypatch.setattr("tui.lab_jobs.job_placement", lambda *args, **kwargs: "release")
    app = AnatomyApp(session="demo", options=ModelOptions(str(tiny_folder)), console=ConsoleSettings(auto_map=False))
    async with app.run_test(size=(120, 36)) as pilot:
        for _ in range(100):
            if app.loaded is stub:
                break
            await pilot.pause(0.1)
        await pilot.press("b")
        await pilot.pause()
        assert app.loaded is None and "released from cuda:0" in app.lab.model_status
        [argv] = started
        assert "--device=cuda:0" in argv and "--dtype=float16" in argv
        for _ in range(100):
            if len(loads) == 2 and app.loaded is stub:
                break
            await pilot.pause(0.1)
        assert len(loads) == 2 and app.loaded is stub and app.lab.released_for is None


def test_a_job_goes_to_another_gpu_with_room_before_the_console_releases_its_model(tiny_folder, monkeypatch):
    import torch

    from engine.experiments.recovery.vocabulary import RecoverySettings
    from engine.models.memory import other_gpu

    loaded = on_gpu(tiny_folder, device="cuda")  # the console's model where its `auto` put it
    options = job_options(ModelOptions(str(tiny_folder)), loaded)
    one_run = RecoverySettings(layers=(1,), eval_set="paper", steps=2)
    need = plan_run(str(tiny_folder), one_run, "cpu", "float16").total
    held = model_bytes(loaded.model)
    free = {"cuda:0": int(need / 0.9) - held // 2, "cuda:1": need // 2, "cuda:2": 2 * need}  # 0: only if released
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 3)
    monkeypatch.setattr("engine.models.memory.free_memory", lambda device: free.get(device, 2**40))  # the host: plenty
    assert job_placement("recovery", one_run, options, loaded, free_bytes=free["cuda:0"]) == "cuda:2"
    pinned = on_gpu(tiny_folder, device="cuda:0")  # started with --device cuda:0: its jobs stay on that GPU
    assert job_placement("recovery", one_run, job_options(ModelOptions(str(tiny_folder), device="cuda:0"), pinned),
                         pinned, free_bytes=free["cuda:0"]) == "release"
    free["cuda:2"] = need // 2  # no GPU with room: the console frees its own
    assert job_placement("recovery", one_run, options, loaded, free_bytes=free["cuda:0"]) == "release"
    free["cuda:2"] = 2 * need  # a sweep split over every GPU needs the console's GPU too
    assert job_placement("recovery", RecoverySettings(eval_set="paper"), options, loaded,
                         free_bytes=free["cuda:0"]) == "release"
    plan = plan_run(str(tiny_folder), one_run, "cpu", "float16")
    assert other_gpu(plan, "cuda:2", 3, free.__getitem__) is None  # the busy GPU is never the other one
    assert other_gpu(plan, "cuda", 3, free.__getitem__) == "cuda:2"


def shards_of(argv: list[str]) -> list[str]:
    return [arg for arg in argv if arg.startswith("--shards")]


@pytest.mark.parametrize("gpus", [2, 0])
def test_sweeps_started_as_jobs_take_every_visible_gpu(gpus, monkeypatch, tiny_folder):
    import dataclasses

    import torch

    from cli.main import build_parser
    from engine.experiments.recovery.vocabulary import RecoverySettings

    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    options = ModelOptions(str(tiny_folder), device="cuda", dtype="float16")  # a console's `auto` on a GPU
    every = ["--shards=2"] if gpus == 2 else []
    argv = job_argv("ablation", AblationSettings(), options, "s", resume=False)
    assert shards_of(argv) == every
    assert build_parser("ablation").parse_args(argv[3:]).shards == (2 if gpus == 2 else None)

    def recovery(**changes) -> list[str]:
        return shards_of(job_argv("recovery", RecoverySettings(**changes), options, "s", resume=False))

    assert recovery(layers=None) == recovery(layers=(3, 5)) == recovery(layers=(3,), repeats=2) == every
    assert recovery(layers=(3,)) == []  # one run: one worker
    spread = dataclasses.replace(options, device_map="auto")
    assert shards_of(job_argv("ablation", AblationSettings(), spread, "s", resume=False)) == []
    from engine.experiments.growth.vocabulary import PRESETS

    assert shards_of(job_argv("growth", PRESETS["tiny"], None, "s", resume=False)) == []  # does not split


@pytest.mark.parametrize("device", ["cuda:0", "cpu"])
def test_a_job_pinned_to_one_device_is_not_sharded_so_run_accepts_it(device, monkeypatch, tiny_folder):
    """A console started with --device cuda:0 (or cpu) on a 2-GPU machine: its sweeps run where it
    was pinned, one process, not `--device=cuda:0 --shards=2`, which `run` refuses."""
    import torch

    from cli.flags import model_options_from_args, settings_from_args
    from cli.main import build_parser
    from cli.shards import torchrun_world
    from engine.registry import experiment

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    options = ModelOptions(str(tiny_folder), device=device, dtype="float16")
    argv = job_argv("ablation", AblationSettings(), options, "s", resume=False)
    assert shards_of(argv) == [] and f"--device={device}" in argv
    args = build_parser("ablation").parse_args(argv[3:])
    entry = experiment("ablation")
    assert torchrun_world(entry, args, model_options_from_args(args),
                          settings_from_args(entry, args)) is None  # no refusal
