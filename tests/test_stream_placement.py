"""The memory plan decides the placement once (device, dtype and why) and the load takes it as it is
(engine/models/memory.py `MemoryPlan.placement`, engine/models/loading.py and open_streamed's
`placement`): no second decision, no reason patched in afterwards, the streamed model's too."""

from __future__ import annotations

import json

import pytest
import torch
from tiny_models import save_tiny

import engine.models.loading as loading
from cli.main import main
from engine.models.loading import load_model
from engine.models.placement import Placement
from engine.models.streaming import open_streamed

pytestmark = pytest.mark.usefixtures("one_thread")

PLANNED = Placement("cpu", "bfloat16", "decided by the plan")


def test_the_load_takes_the_given_placement_as_it_is(tmp_path):
    """The flags say float32; the placement handed over says bfloat16 and why: the load follows it."""
    folder = save_tiny(tmp_path / "llama", "llama")
    loaded = load_model(str(folder), device="cpu", dtype="float32", placement=PLANNED)
    assert loaded.placement == PLANNED
    assert loaded.dtype_name == "bfloat16" and loaded.describe()["dtype_reason"] == "decided by the plan"
    assert {p.dtype for p in loaded.model.parameters()} == {torch.bfloat16}
    streamed = open_streamed(str(folder), device="cpu", dtype="float32", placement=PLANNED)
    assert streamed.stream is not None
    streamed.stream.close()
    assert streamed.placement == PLANNED and streamed.dtype_name == "bfloat16"


def test_the_runner_hands_the_plans_placement_to_the_load(tmp_path, monkeypatch):
    """`run` loads with the very Placement its plan printed (checked by catching the load's arguments)."""
    import engine.models.memory as memory

    folder = save_tiny(tmp_path / "qwen2", "qwen2")
    plans, placements = [], []
    plan_run, load = memory.plan_run, loading.load_model

    def planning(*args, **kwargs):
        plans.append(plan_run(*args, **kwargs))
        return plans[-1]

    def loading_model(*args, **kwargs):
        placements.append(kwargs["placement"])
        return load(*args, **kwargs)

    monkeypatch.setattr(memory, "plan_run", planning)
    monkeypatch.setattr(loading, "load_model", loading_model)
    assert main(["run", "dynamics", "--model", str(folder), "--device", "cpu", "--max-tokens", "64",
                 "--clusters", "2", "--components", "2", "--json", str(tmp_path / "d.json")]) == 0
    assert len(plans) == 1 and placements == [plans[0].placement]
    assert plans[0].placement is not None and plans[0].placement.why == "auto, the CPU"


def test_a_streamed_run_records_why_its_dtype(tmp_path, isolated_home):
    """The streamed model carries the plan's placement: its session's job says why its dtype."""
    folder = save_tiny(tmp_path / "llama", "llama")
    assert main(["run", "ablation", "--model", str(folder), "--device", "cpu", "--eval-set", "paper", "--stream",
                 "--proxies-only", "--session", "s"]) == 0
    jobs = list((isolated_home / "s" / "jobs").glob("*.json"))
    assert len(jobs) == 1
    assert json.loads(jobs[0].read_text())["spec"]["model"]["dtype_reason"] == "auto, the CPU"
