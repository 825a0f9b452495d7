"""Every count a run shows names its unit and its pass (issue 43): the map's status went 0/48, 40/48,
then 0/30 (texts, then layers, unlabelled), and a headless `--part both` run said "90/90 layers" on a
30-layer model. Each Progress that counts names what it counts (`texts`, `layers`, `layers and
blocks`), and the headless line and the console say it before the count: `baseline: texts 40/48`."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from cli.progress import ProgressLines, progress_text
from engine.core.events import Progress, count_text

ENGINE = Path(__file__).resolve().parent.parent / "engine"


def _counts_nothing(call: ast.Call) -> bool:
    """`Progress(0, 0, ...)`: a job starting, before anything is counted."""
    return len(call.args) >= 2 and all(isinstance(a, ast.Constant) and a.value == 0 for a in call.args[:2])


def test_every_progress_the_engine_builds_names_its_unit():
    """Read from the source, so an emitter no run below reaches (growth, toy-depth, scaling-fit,
    evaluate, a sharded sweep's merge) is checked too."""
    unnamed = []
    for path in sorted(ENGINE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            called = getattr(node, "func", None)
            if not isinstance(node, ast.Call) or getattr(called, "id", getattr(called, "attr", "")) != "Progress":
                continue
            if _counts_nothing(node):
                continue
            unit = next((k.value for k in node.keywords if k.arg == "unit"), None)
            if unit is None or (isinstance(unit, ast.Constant) and not unit.value):
                unnamed.append(f"{path.relative_to(ENGINE.parent)}:{node.lineno}")
    assert not unnamed, f"Progress without a unit at {unnamed}"


def test_the_count_says_its_unit_first():
    assert count_text(40, 48, "texts") == "texts 40/48"
    assert count_text(3, 0, "steps") == "3 steps" and count_text(0, 0, "") == ""
    event = Progress(12, 48, "baseline", phase="baseline", unit="texts", rate=4.0)
    assert progress_text(event) == "baseline: texts 12/48, 4/s, about 9 s left"
    assert progress_text(Progress(0, 0, "recovery: starting", phase="starting")) == "recovery: starting"
    assert progress_text(Progress(3, 30, "ablation", phase="ablation", unit="layers")) == "ablation: layers 3/30"


# the runs themselves, on a tiny model -------------------------------------------------------------------


@pytest.fixture(scope="module")
def model():
    from tiny_models import tiny_model

    return tiny_model("llama", seed=3)


def _events(name: str, model, settings) -> list:
    from tiny_models import byte_tokenizer

    from engine.experiments.context import RunContext
    from engine.models.anatomy import LayerStack
    from engine.models.loading import LoadedModel
    from engine.registry import experiment

    loaded = LoadedModel(model, byte_tokenizer(), "tiny", "test", "cpu", "float32", model.config.model_type,
                         len(LayerStack(model)))
    return list(experiment(name).run(settings, RunContext(model=loaded)))


def _settings(name: str, eval_file: str):
    from engine.experiments.ablation.vocabulary import AblationSettings
    from engine.experiments.dynamics.vocabulary import DynamicsSettings
    from engine.experiments.manipulate.vocabulary import ManipulationSettings
    from engine.experiments.prune.vocabulary import PruneSettings
    from engine.experiments.weights.vocabulary import WeightsSettings

    return {
        "ablation": AblationSettings(eval_set="paper"),
        "ablation --part both": AblationSettings(eval_set="paper", part="both", method="skip"),
        "manipulate": ManipulationSettings(layers=(1,), strategies=("scale",), alphas=(0.5,), eval_file=eval_file,
                                           sample_tokens=0),
        "weights": WeightsSettings(first_layer=1, null_draws=1, paradox_counts=(1,), eval_file=eval_file),
        "prune": PruneSettings(method="bi", remove=(1,), bootstrap=0, eval_file=eval_file),
        "dynamics": DynamicsSettings(text_file=eval_file, max_tokens=120, max_length=32),
    }[name]


RUNS = ["ablation", "ablation --part both", "manipulate", "weights", "prune", "dynamics"]


@pytest.mark.parametrize("run", RUNS)
def test_every_progress_of_a_run_names_its_unit(run, model, files):
    events = _events(run.split()[0], model, _settings(run, files[0]))
    counted = [e for e in events if isinstance(e, Progress) and (e.total or e.done)]
    assert counted, "the run said no count"
    assert all(e.unit for e in counted), [(e.label, e.done, e.total) for e in counted if not e.unit]


def test_a_map_of_each_layer_and_its_blocks_counts_layers_and_blocks(model):
    """--part both on 4 layers: 12 removals (each layer, its attention, its MLP): `layers and
    blocks 12/12` at the end, never `layers 12/12` (the old "90/90 layers" of a 30-layer model)."""
    from engine.experiments.ablation.vocabulary import AblationSettings

    events = _events("ablation", model, AblationSettings(eval_set="paper", part="both", method="skip"))
    lines = ProgressLines()
    said = [text for e in events if isinstance(e, Progress) and (text := lines.line(e)) is not None]
    assert said[0] == "ablation: starting"
    assert any(line.startswith("baseline: texts 0/") for line in said)  # the first pass, in texts
    assert said[-1].startswith("ablation: layers and blocks 12/12")
    assert not any("layers 12/12" in line and "blocks" not in line for line in said)
    whole = _events("ablation", model, AblationSettings(eval_set="paper", method="skip"))
    assert [e.count for e in whole if isinstance(e, Progress) and e.phase == "ablation"][-1] == "layers 4/4"
