"""A stored session with known contents for the console tests and snapshots: an ablation map of
six layers (one of each class), a recovery run with a known curve, and a growth run mid-way.
Times are fixed so that nothing on screen depends on the clock."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from engine.core.codec import ABSENT, json_safe
from engine.core.events import Event, Finished, Started
from engine.core.process import process_identity
from engine.disk.atomic import atomic_write_json
from engine.experiments.ablation.vocabulary import AblationMap, AblationRow, AblationSettings
from engine.experiments.dynamics.vocabulary import (
    PcaSample,
)
from engine.experiments.evaluate.vocabulary import sample_score
from engine.experiments.growth.vocabulary import (
    GrowthEval,
    GrowthPhase,
    GrowthPlan,
    GrowthResult,
    GrowthStep,
)
from engine.experiments.prune.vocabulary import DepthLaw, PruneCut, PruneResult, PruneSettings
from engine.experiments.recovery.vocabulary import (
    RecoveryPoint,
    RecoveryRow,
    RecoveryStart,
)
from engine.experiments.scaling_fit.vocabulary import ScalingFitResult
from engine.registry import BY_NAME, experiment
from sessions.store import Session, SessionStore

T0 = 1_700_000_000.0
BASELINE = 20.0
# (D %, class, anti) for layers 0..5
MAP = [
    (9000.0, "critical", False),
    (45.0, "important", False),
    (12.0, "minor", False),
    (3.0, "redundant", False),
    (-8.0, "redundant", True),
    (150.0, "critical", False),
]
CURVE = [(0, 80.0), (5, 50.0), (10, 35.0), (20, 25.0), (40, 21.5)]


def round_trips(name: str, doc: dict) -> bool:
    """Whether `doc` is exactly a document of experiment `name`'s result class: decoded and written
    again, the same JSON, byte for byte."""
    cls = experiment(name).result_class
    return json.dumps(json_safe(cls.from_json(doc))) == json.dumps(doc)


def ablation_map(rows: list[AblationRow], model: str = "tiny") -> dict:
    """An ablation result document with these rows, as the engine writes it."""
    return json_safe(AblationMap(
        model=model, method="mean", baseline_ppl=BASELINE, eval_tokens=100, eval_texts=4, seconds=1.0,
        settings=AblationSettings(), layers=rows, spearman={"block_influence": 0.5, "angular_distance": 0.5},
    ))  # fmt: skip


def ablation_doc() -> dict:
    """The ablation vocabulary's sample map: one layer of each class (MAP above) and an anti-layer."""
    return json_safe(BY_NAME["ablation"].sample())


def recovery_row(layer: int = 1, difficulty: float = 40.0) -> RecoveryRow:
    """A finished layer's row of the recovery result, as `recovery.layer` carries it."""
    curve: list[list[float | None]] = [[float(step), ppl] for step, ppl in CURVE]
    return RecoveryRow(
        layer=layer, status="done", ppl_after_noise=CURVE[0][1], ratio_after_noise=CURVE[0][1] / BASELINE,
        steps_to={"2.0": 10, "1.5": 20, "1.1": None}, best_ppl=CURVE[-1][1], best_step=CURVE[-1][0],
        final_ppl=CURVE[-1][1], final_ratio=CURVE[-1][1] / BASELINE, improved_over_baseline=False,
        curve=curve, diverged_at=None, steps_run=40, seconds=2.0, seconds_per_step=0.05, train_loss=[[1, 3.0]],
        difficulty=difficulty, mean_final_ratio=CURVE[-1][1] / BASELINE, steps_to_mean={"2.0": 10.0},
        steps_to_sd={"2.0": None}, steps_to_reached={"2.0": 1}, repeats=[],
    )  # fmt: skip


def recovery_doc() -> dict:
    """results/recovery.json of a sweep over layers 1 and 3 (the recovery vocabulary's sample)."""
    return json_safe(BY_NAME["recovery"].sample())


def recovery_events(job: str = "recovery-1", layer: int = 1) -> list[Event]:
    events: list[Event] = [
        Started("recovery", {"sigma": 0.5, "lr": 1e-4, "steps": 40}, job=job, t=T0),
        RecoveryStart(layer=layer, repeat=0, ppl_after_noise=90.0, baseline_ppl=BASELINE, steps=40,
                      job=job, t=T0 + 1),
    ]
    for step, ppl in CURVE:
        events.append(RecoveryPoint(layer=layer, repeat=0, step=step, train_loss=3.0, eval_ppl=ppl,
                                    ratio_to_baseline=ppl / BASELINE, job=job, t=T0 + 2 + step))
    return events


def _phase(name: str, start: int, steps: int, layers: list[int]) -> dict:
    return {"name": name, "start": start, "steps": steps, "layers": layers, "clone_from": {},
            "ffn_scale": 1.0}


GROWTH_PLAN: dict[str, dict[str, Any]] = {
    "growth_100": {
        "steps": 30,
        "phases": [_phase("core", 0, 10, [0, 5]), _phase("minor", 10, 10, [0, 1, 2, 5]),
                   _phase("full", 20, 10, [0, 1, 2, 3, 4, 5])],
    },
    "uniform_100": {"steps": 30, "phases": [_phase("uniform", 0, 30, [0, 1, 2, 3, 4, 5])]},
}  # fmt: skip


def growth_events(job: str = "growth-1", upto: int = 14) -> list[Event]:
    events: list[Event] = [
        Started("growth", {}, job=job, t=T0),
        GrowthPlan(arms=GROWTH_PLAN, seeds=[0], params={"growth": 1, "uniform": 1},
                   profile=["C", "I", "M", "R", "A", "C"], batch_tokens=64, job=job, t=T0),
    ]
    phases = GROWTH_PLAN["growth_100"]["phases"]
    for step in range(1, upto + 1):
        for index, phase in enumerate(phases):
            if step == phase["start"] + 1:
                events.append(GrowthPhase(
                    arm="growth_100", seed=0, phase=phase["name"], phase_index=index,
                    start_step=phase["start"], steps=phase["steps"], layers=phase["layers"], added=[],
                    job=job, t=T0 + step,
                ))  # fmt: skip
        events.append(GrowthStep(
            arm="growth_100", seed=0, phase="x", step=step, total_steps=30, train_loss=5.0 - 0.1 * step,
            tokens_per_s=1000.0, lr=1e-3, n_layers=2, job=job, t=T0 + step,
        ))  # fmt: skip
    return events


def uniform_and_eval_events(job: str = "growth-1") -> list[Event]:
    """The uniform arm's 30 steps and both arms' validation loss every 10 steps (the growth arm's
    steps are `growth_events`'): every curve of the loss plot, so its legend has every entry."""
    events: list[Event] = [GrowthStep(
        arm="uniform_100", seed=0, phase="uniform", step=step, total_steps=30, train_loss=5.2 - 0.09 * step,
        tokens_per_s=1000.0, lr=1e-3, n_layers=6, job=job, t=T0 + step,
    ) for step in range(1, 31)]  # fmt: skip
    for arm, start in (("growth_100", 4.6), ("uniform_100", 4.8)):
        events += [GrowthEval(arm=arm, seed=0, phase="x", step=step, val_loss=start - 0.08 * step, job=job,
                              t=T0 + step) for step in (10, 20, 30)]  # fmt: skip
    return events


def deep_session(store: SessionStore, name: str = "deep", layers: int = 30) -> Session:
    """A session whose map has 30 layers: more rows than an 80x24 terminal shows (the map scrolls)."""
    rows = [AblationRow(layer=i, ppl=BASELINE + i, degradation_pct=float(5 * i - 20),
                        layer_class="redundant" if i < 8 else "minor" if i < 20 else "important",
                        block_influence=0.01 * i, angular_distance=0.02 * i) for i in range(layers)]  # fmt: skip
    session = store.create(name, model="tiny")
    session.save_result("ablation", ablation_map(rows))
    manifest = {**session.manifest, "created": T0, "updated": T0}
    atomic_write_json(session.path / "manifest.json", manifest)
    session.manifest = manifest
    return session


def growth_doc(models: dict[str, str | None] | None = None) -> dict:
    """results/growth.json of the plan above, one seed (the growth vocabulary's sample); `models`
    gives an arm's saved model folder (none saved by default)."""
    result = BY_NAME["growth"].sample()
    assert isinstance(result, GrowthResult)
    arms = {name: dataclasses.replace(arm, model=(models or {}).get(name)) for name, arm in result.arms.items()}
    return json_safe(dataclasses.replace(result, arms=arms))


def write_events(session: Session, events: list[Event]) -> None:
    with open(session.events_path, "a", encoding="utf-8") as handle:
        for event in events:
            handle.write(json.dumps(event.to_json()) + "\n")


def demo_session(store: SessionStore, name: str = "demo", model: str = "tiny") -> Session:
    """The stored session, with its manifest times pinned."""
    session = store.create(name, model=model)
    session.save_result("ablation", ablation_doc())
    write_events(session, recovery_events() + growth_events())
    manifest = {**session.manifest, "created": T0, "updated": T0}
    atomic_write_json(session.path / "manifest.json", manifest)
    session.manifest = manifest
    return session


def running_job(session: Session, job: str, experiment: str) -> None:
    """A job file that reads as running in this process, so its panels show it live."""
    session.write_job(job, {"status": "running", **process_identity(), "experiment": experiment})


def dashboard_session(store: SessionStore, stage: str) -> Session:
    """A session at one stage of the first hour: 'empty', 'map' (the map done), 'recovery' (layer 1
    recovering), 'growth' (a growth run half way) or 'grown' (the growth run done: its final table)."""
    session = store.create(stage, model="tiny")
    if stage != "empty":
        session.save_result("ablation", ablation_doc())
    if stage == "recovery":
        write_events(session, recovery_events())
        running_job(session, "recovery-1", "recovery")
    elif stage == "growth":
        write_events(session, growth_events(upto=15))
        running_job(session, "growth-1", "growth")
    elif stage == "grown":
        write_events(session, [*growth_events(upto=30), *uniform_and_eval_events(),
                               Finished(status="done", job="growth-1", t=T0 + 31)])
        session.save_result("growth", growth_doc())
    manifest = {**session.manifest, "created": T0, "updated": T0}
    atomic_write_json(session.path / "manifest.json", manifest)
    session.manifest = manifest
    return session


def parts_session(store: SessionStore, name: str = "parts") -> Session:
    """A session whose map has parts (`run ablation --part both`): the ablation vocabulary's sample
    with each layer's attention and MLP removed alone."""
    from engine.experiments.ablation.vocabulary import sample_parts

    session = store.create(name, model="tiny")
    session.save_result("ablation", json_safe(sample_parts()))
    manifest = {**session.manifest, "created": T0, "updated": T0}
    atomic_write_json(session.path / "manifest.json", manifest)
    session.manifest = manifest
    return session


SCALING = {"alpha_m": 0.5, "alpha_l": 0.3, "alpha_D": 0.3, "c_m": 4.0, "c_l": 2.0, "c_D": 50.0, "L0": 1.5}


def scaling_fit_doc(with_points: bool = True) -> dict:
    """The scaling-fit vocabulary's sample: the estimate, its intervals, the profile and (unless
    `with_points` is off, as in a result of anatomy-tui 0.2) the runs against depth."""
    result = BY_NAME["scaling-fit"].sample()
    assert isinstance(result, ScalingFitResult)
    return json_safe(result if with_points else dataclasses.replace(result, depth_points=ABSENT))


def prune_result(curve: list[PruneCut], exported_point: PruneCut | None = None,
                 depth_fit: DepthLaw | None = None, agreement: dict | None = None) -> dict:
    """A prune result document with this curve, as the engine writes it."""
    methods = list(dict.fromkeys(cut.method for cut in curve))
    return json_safe(PruneResult(
        model="tiny", baseline_ppl=BASELINE, eval_tokens=100, eval_texts=4, n_layers=6, settings=PruneSettings(),
        methods=methods, curve=curve, agreement=agreement or {}, agreement_note="", scores={}, depth_fit=depth_fit,
        heal=None, exported="pruned" if exported_point else None, exported_point=exported_point, seconds=1.0,
    ))  # fmt: skip


def cut(method: str, layers: list[int], ppl: float = BASELINE) -> PruneCut:
    """One point of a prune curve: `layers` removed by `method`, not healed."""
    return PruneCut(method=method, removed=len(layers), layers=layers, ppl=ppl, ci_low=None, ci_high=None,
                    healed_ppl=None)  # fmt: skip


def prune_doc() -> dict:
    """results/prune.json's curve: perplexity with 1..4 layers removed by each criterion."""
    return json_safe(BY_NAME["prune"].sample())


def analyses_session(store: SessionStore) -> Session:
    """A session with a map and a result of every analysis the Analyses view draws."""
    session = dashboard_session(store, "map")
    session.save_result("scaling-fit", scaling_fit_doc())
    session.save_result("prune", prune_doc())
    session.save_result("manipulate", manipulate_doc())
    session.save_result("toy-depth", toy_depth_doc())
    session.save_result("dynamics", dynamics_doc())
    session.save_result("weights", weights_doc())
    session.save_result("evaluate", evaluate_doc())
    return session


def older_analyses_session(store: SessionStore) -> Session:
    """A session with a scaling fit and a dynamics result of anatomy-tui 0.2 (no runs to plot against
    depth, no PCA sample) and no other analysis: the views say which command fills what is missing."""
    session = dashboard_session(store, "map")
    session.save_result("scaling-fit", scaling_fit_doc(with_points=False))
    dynamics = dynamics_doc()
    del dynamics["pca"]["sample"]
    session.save_result("dynamics", dynamics)
    return session


def manipulate_doc() -> dict:
    return json_safe(BY_NAME["manipulate"].sample())


def toy_depth_doc() -> dict:
    return json_safe(BY_NAME["toy-depth"].sample())


def dynamics_doc() -> dict:
    return json_safe(BY_NAME["dynamics"].sample())


def pca_sample() -> PcaSample:
    """40 sampled tokens: the bulk (label 0) on a ring round the origin, cluster 1 in a clump at (6, 3)."""
    import math

    bulk = [(math.cos(i / 5), math.sin(i / 5)) for i in range(30)]
    clump = [(6.0 + 0.1 * (i % 3), 3.0 + 0.1 * (i // 3)) for i in range(10)]
    points = bulk + clump
    return PcaSample(token=list(range(0, 80, 2)), pc1=[x for x, _ in points], pc2=[y for _, y in points],
                     label=[0] * 30 + [1] * 10)


def weights_doc() -> dict:
    return json_safe(BY_NAME["weights"].sample())


task_score = sample_score  # one lm-eval task's scores, as the evaluate sample builds them


def evaluate_doc() -> dict:
    return json_safe(BY_NAME["evaluate"].sample())


def atlas_session(store: SessionStore, name: str = "atlas") -> Session:
    """An atlas of three models of 4, 6 and 9 layers (D % with intervals, Block Influence, angular
    distance, removal perplexity; a calibration variant), saved as `anatomy-tui atlas` saves one."""
    session = store.create(name, model="", settings={"atlas": {"models": list(ATLAS_SHAPES)}})
    session.save_result("atlas", atlas_document(name).to_json())
    return session


ATLAS_SHAPES = {"tiny-llama": [300.0, 12.0, 5.0, 150.0], "tiny-qwen2": [250.0, 40.0, 8.0, 2.0, 3.0, 120.0],
                "smol-gemma": [400.0, 90.0, 20.0, 6.0, 4.0, -1.5, 3.0, 35.0, 110.0]}  # each model's D % by layer


def atlas_document(name: str) -> Any:
    """atlas_session's table (an AtlasDocument)."""
    from engine.atlas import table as A
    from engine.evaluation.statistics import importance_class

    shapes = ATLAS_SHAPES
    rows = []
    for model, d in shapes.items():
        n = len(d)
        for variant, bend in ((A.MAIN, 1.0), ("seed-1", 1.1)):
            for layer, value in enumerate(d):
                common: dict[str, Any] = dict(
                    model=model, variant=variant, session=f"{name}-{model}", n_layers=n, layer=layer,
                    relative_depth=A.relative_depth(layer, n), eval_text="builtin:paper", context=None, stride=None,
                    eval_tokens=194, protocol='{"eval_set": "paper"}')
                rows.append(A.AtlasRow(measure="d_pct", value=value * bend, lo=value * 0.8, hi=value * 1.2,
                                       layer_class=importance_class(value), **common))
                rows.append(A.AtlasRow(measure="block_influence", value=0.01 * (value + 10) ** 0.5 + 0.001 * layer,
                                       lo=None, hi=None, layer_class=None, **common))
                rows.append(A.AtlasRow(measure="angular_distance", value=0.05 + 0.0002 * value * bend - 0.01 * layer,
                                       lo=None, hi=None, layer_class=None, **common))
                rows.append(A.AtlasRow(measure="removal_ppl", value=30.0 + value / 5, lo=None, hi=None,
                                       layer_class=None, **common))
    sessions = {m: {v: {"ablation": f"{name}-{m}"} for v in (A.MAIN, "seed-1")} for m in shapes}
    return A.build(name, list(shapes), ["map", "proxies", "prune-ppl"], sessions,
                   {A.MAIN: {"eval_set": "paper"}, "seed-1": {"eval_file": "seed-1.txt"}}, rows)


def atlas_under_way(store: SessionStore, name: str = "live", finished: bool = False) -> Session:
    """atlas_session's atlas as it runs on a cluster, each state a measure can be in (its log, and its
    members' as a run writes them): tiny-llama's done and reused, tiny-qwen2's running (3 of 6
    layers) and placed after a retry, smol-gemma's queued and waiting; `finished`: its table saved
    too (the measures as they were)."""
    from engine.core.events import Progress, TaskState

    atlas = store.create(name, model="", settings={"atlas": {"models": list(ATLAS_SHAPES)}})
    states = {("tiny-llama", "main"): ("done", ""), ("tiny-llama", "seed-1"): ("reused", "from session lab"),
              ("tiny-qwen2", "main"): ("running", ""), ("tiny-qwen2", "seed-1"): ("queued", ""),
              ("smol-gemma", "main"): ("queued", "in the driver"), ("smol-gemma", "seed-1"): ("waiting", "")}
    for (model, variant), (state, detail) in states.items():
        member = f"{name}-{model}" + ("" if variant == "main" else f"-{variant}")
        atlas.append_event(TaskState("waiting", "", f"{model}|{variant}|ablation", member))
        if state != "waiting":
            atlas.append_event(TaskState(state, detail, f"{model}|{variant}|ablation", member))
    qwen = store.create(f"{name}-tiny-qwen2", model="tiny-qwen2")
    qwen.append_event(Started(experiment="ablation", spec={}, job="q"))
    qwen.append_event(TaskState("placed", "node 5f3a9c21 (10.0.0.2) GPU 1, pid 4242", job="q"))
    qwen.append_event(Progress(3, 6, "ablation", phase="layers", unit="layers", job="q"))
    seed = store.create(f"{name}-tiny-qwen2-seed-1", model="tiny-qwen2")
    seed.append_event(Started(experiment="ablation", spec={}, job="s"))
    seed.append_event(TaskState("retried", "try 2 of 3: its worker died (node lost)", job="s"))
    seed.append_event(TaskState("placed", "node 0b77e410 (10.0.0.3) GPU 0, pid 977", job="s"))
    if finished:
        atlas.save_result("atlas", atlas_document(name).to_json())
    return atlas
