"""A stored session with known contents for the console tests and snapshots: an ablation map of
six layers (one of each class), a recovery run with a known curve, and a growth run mid-way.
Times are fixed so that nothing on screen depends on the clock."""

from __future__ import annotations

import json
from typing import Any

from engine.core.events import ABSENT, Event, Started, json_safe
from engine.core.process import process_identity
from engine.disk.atomic import atomic_write_json
from engine.evaluation.accuracy import GenerationCheck, LmEvalProtocol, TaskScore
from engine.experiments.ablation.vocabulary import AblationMap, AblationRow
from engine.experiments.dynamics.vocabulary import (
    DynamicsCore,
    DynamicsPca,
    DynamicsResult,
    DynamicsRow,
    PcaSample,
    Quartiles,
    TokenCluster,
)
from engine.experiments.evaluate.vocabulary import EvaluatedModel, EvaluateResult
from engine.experiments.growth.vocabulary import (
    GrowthArm,
    GrowthBudgetRow,
    GrowthData,
    GrowthPhase,
    GrowthPlan,
    GrowthResult,
    GrowthStep,
    GrowthWidths,
)
from engine.experiments.manipulate.vocabulary import ManipulateResult, ManipulateRow
from engine.experiments.prune.vocabulary import DepthLaw, PruneCut, PruneResult
from engine.experiments.recovery.vocabulary import (
    LayerBudget,
    RecoveryBudget,
    RecoveryPoint,
    RecoveryResult,
    RecoveryRow,
    RecoveryStart,
    RecoveryVsAblation,
)
from engine.experiments.scaling_fit.vocabulary import (
    DepthPoints,
    FitBootstrap,
    FitRestarts,
    ProfilePoint,
    ScalingFitResult,
    ScalingProfile,
)
from engine.experiments.toy_depth.vocabulary import ToyDepthCurve, ToyDepthResult
from engine.experiments.weights.vocabulary import FitSummary, NullModel, ParadoxRow, WeightsComponent, WeightsResult
from engine.registry import experiment
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
        settings={}, layers=rows, spearman={"block_influence": 0.5, "angular_distance": 0.5},
    ))  # fmt: skip


def ablation_doc() -> dict:
    return ablation_map([
        AblationRow(
            layer=index, ppl=BASELINE * (1 + d / 100), degradation_pct=d, layer_class=name, anti=anti,
            anti_within_noise=False, ci_low=d - 1.0, ci_high=d + 1.0,
            block_influence=0.01 * (index + 1), angular_distance=0.02 * (index + 1),
        )
        for index, (d, name, anti) in enumerate(MAP)
    ])  # fmt: skip


def recovery_row(layer: int = 1, difficulty: float = 40.0) -> RecoveryRow:
    """A finished layer's row of the recovery result, as `recovery.layer` carries it."""
    curve = [[float(step), ppl] for step, ppl in CURVE]
    return RecoveryRow(
        layer=layer, status="done", ppl_after_noise=CURVE[0][1], ratio_after_noise=CURVE[0][1] / BASELINE,
        steps_to={"2.0": 10, "1.5": 20, "1.1": None}, best_ppl=CURVE[-1][1], best_step=CURVE[-1][0],
        final_ppl=CURVE[-1][1], final_ratio=CURVE[-1][1] / BASELINE, improved_over_baseline=False,
        curve=curve, diverged_at=None, steps_run=40, seconds=2.0, seconds_per_step=0.05, train_loss=[[1, 3.0]],
        difficulty=difficulty, mean_final_ratio=CURVE[-1][1] / BASELINE, steps_to_mean={"2.0": 10.0},
        steps_to_sd={"2.0": None}, steps_to_reached={"2.0": 1}, repeats=[],
    )  # fmt: skip


def recovery_doc() -> dict:
    """results/recovery.json of a sweep over layers 1 and 3, as the engine writes it."""
    rows = [recovery_row(1, 40.0), recovery_row(3, 10.0)]
    budget = RecoveryBudget(
        rule="proposed: steps to get below 1.1x baseline", uniform_total=80, proposed_total=50, saving_steps=30,
        saving_pct=37.5, per_layer=[LayerBudget(layer=row.layer, difficulty=row.difficulty, uniform_steps=40,
                                                proposed_steps=int(row.difficulty), reallocated_steps=40)
                                    for row in rows],
    )  # fmt: skip
    versus = RecoveryVsAblation(layers=2, ablation_method="mean", difficulty=1.0, final_ratio=None,
                                ratio_after_noise=-1.0)  # fmt: skip
    return json_safe(RecoveryResult(
        model="tiny", baseline_ppl=BASELINE, eval_tokens=100, eval_texts=4, train_source="built-in", train_blocks=16,
        settings={"sigma": 0.5, "steps": 40, "lr": 1e-4}, layers=rows, ranking=[1, 3], spearman_vs_ablation=1.0,
        versus_ablation=versus, budget=budget, seconds_per_step=0.05, resumed_layers=[], seconds=4.0,
    ))  # fmt: skip


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


GROWTH_PLAN = {
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


def growth_doc(models: dict[str, str | None] | None = None) -> dict:
    """results/growth.json of the plan above, one seed, as the engine writes it; `models` gives an
    arm's saved model folder (none saved by default)."""
    models = models or {}
    arms = {
        name: GrowthArm(val_loss=[loss], mean=loss, sd=0.0, seconds=seconds, seconds_sd=0.0, tokens_per_s=1000.0,
                        tokens_per_s_sd=0.0, steps=30, tokens=30 * 64,
                        phases=[{"name": p["name"], "steps": p["steps"], "seconds": 1.0, "tokens_per_s": 1000.0}
                                for p in GROWTH_PLAN[name]["phases"]], model=models.get(name))
        for name, loss, seconds in (("growth_100", 1.2, 3.0), ("uniform_100", 1.5, 3.5))
    }  # fmt: skip
    steps = {0: 30, 1: 20, 2: 20, 3: 10, 4: 10, 5: 30}
    budget = [GrowthBudgetRow(layer=layer, layer_class=name, steps={"growth_100": steps[layer], "uniform_100": 30},
                              epochs={"growth_100": steps[layer] / 60, "uniform_100": 0.5})
              for layer, (_, name, _) in enumerate(MAP)]  # fmt: skip
    return json_safe(GrowthResult(
        preset="tiny", params={"growth": 1000, "uniform": 1004}, arms=arms,
        phases=[{**p, "seconds": 1.0, "tokens_per_s": 1000.0} for p in GROWTH_PLAN["growth_100"]["phases"]],
        generations=[{"prompt": "The", "growth_100": " cat", "uniform_100": " the"}], budget_table=budget,
        ratio_uniform_over_growth_seconds=3.5 / 3.0, profile=["C", "I", "M", "R", "A", "C"],
        widths=GrowthWidths(growth=[64, 48, 32, 16, 16, 64], uniform=40),
        data=GrowthData(source="built-in", tokenizer="character", vocab_size=96, train_tokens=9000, val_tokens=1000,
                        batch_tokens=64),
        settings={}, paper={"growth_val_loss": 0.127},
    ))  # fmt: skip


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
    recovering) or 'growth' (a growth run half way)."""
    session = store.create(stage, model="tiny")
    if stage != "empty":
        session.save_result("ablation", ablation_doc())
    if stage == "recovery":
        write_events(session, recovery_events())
        running_job(session, "recovery-1", "recovery")
    elif stage == "growth":
        write_events(session, growth_events(upto=15))
        running_job(session, "growth-1", "growth")
    manifest = {**session.manifest, "created": T0, "updated": T0}
    atomic_write_json(session.path / "manifest.json", manifest)
    session.manifest = manifest
    return session


SCALING = {"alpha_m": 0.5, "alpha_l": 0.3, "alpha_D": 0.3, "c_m": 4.0, "c_l": 2.0, "c_D": 50.0, "L0": 1.5}


def scaling_fit_doc(with_points: bool = True) -> dict:
    """The parts of results/scaling-fit.json its view draws: the estimate, its intervals, the profile
    and (unless `with_points` is off, as in a result of anatomy-tui 0.2) the runs against depth,
    whose depth part lies on the fitted term 2 / l^0.3 but for a +-2 % wobble."""
    profile = [ProfilePoint(alpha_l=0.1 + 0.02 * i, objective=0.01 + (0.1 + 0.02 * i - 0.3) ** 2) for i in range(21)]
    depths = [2.0, 4.0, 8.0, 12.0, 16.0, 24.0, 32.0, 48.0]
    rest = [1.5 + 0.1 * (i % 3) for i in range(len(depths))]
    loss = [r + SCALING["c_l"] / d ** SCALING["alpha_l"] * (1.02 if i % 2 else 0.98)
            for i, (d, r) in enumerate(zip(depths, rest, strict=True))]
    return json_safe(ScalingFitResult(
        source="runs.csv", columns={"loss": "loss", "width": "width", "depth": "depth", "tokens": "tokens"},
        n_rows=8, n_excluded=0, n_points=8, optimizer="lm", loss_function="least_squares", huber_delta=None,
        params=SCALING, objective=1.25e-4,
        depth_points=DepthPoints(depth=depths, loss=loss, rest=rest) if with_points else ABSENT,
        profile=ScalingProfile(alpha_l=profile), alpha_l_profile_ci95=[0.24, 0.37],
        ci95={"alpha_l": [0.22, 0.41], "alpha_m": [0.45, 0.55], "L0": [1.4, 1.6]}, se={}, train_rmse=0.011,
        train_rmse_log=0.01, restarts=FitRestarts(n=64, reaching_best=10, best_objective=1.25e-4),
        bootstrap=FitBootstrap(n=100, n_valid=100, restarts=4, seconds=1.0), heldout_rmse=0.014,
        heldout_rmse_log=0.012, heldout_splits=10, heldout_n_test=2,
        optimal_shape={"width_depth_exponent": None, "note": "an exponent is 0: no interior optimum"}, settings={},
        seconds=1.0,
    ))  # fmt: skip


def prune_result(curve: list[PruneCut], exported_point: PruneCut | None = None,
                 depth_fit: DepthLaw | None = None, agreement: dict | None = None) -> dict:
    """A prune result document with this curve, as the engine writes it."""
    methods = list(dict.fromkeys(cut.method for cut in curve))
    return json_safe(PruneResult(
        model="tiny", baseline_ppl=BASELINE, eval_tokens=100, eval_texts=4, n_layers=6, settings={},
        methods=methods, curve=curve, agreement=agreement or {}, agreement_note="", scores={}, depth_fit=depth_fit,
        heal=None, exported="pruned" if exported_point else None, exported_point=exported_point, seconds=1.0,
    ))  # fmt: skip


def cut(method: str, layers: list[int], ppl: float = BASELINE) -> PruneCut:
    """One point of a prune curve: `layers` removed by `method`, not healed."""
    return PruneCut(method=method, removed=len(layers), layers=layers, ppl=ppl, ci_low=None, ci_high=None,
                    healed_ppl=None)  # fmt: skip


def prune_doc() -> dict:
    """results/prune.json's curve: perplexity with 1..4 layers removed by each criterion."""
    growth = {"angular": 1.3, "bi": 1.5, "ppl": 1.2}
    curve = [cut(method, list(range(k)), BASELINE * factor**k)
             for method, factor in growth.items() for k in range(1, 5)]  # fmt: skip
    fit = DepthLaw(a=1.1, c=2.0, L0=1.0, ci95=[0.7, 1.6], points=5, depths=[6.0, 5.0, 4.0, 3.0, 2.0], label="",
                   chinchilla={})  # fmt: skip
    return prune_result(curve, depth_fit=fit, agreement={"angular": 0.6, "bi": 0.8})


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
    rows = [
        ManipulateRow(layers=[3], strategy=strategy, param=param, ppl=BASELINE * (1 + d / 100), degradation_pct=d,
                      sample=f"The capital of France is Paris ({strategy})", together=False)
        for strategy, param, d in (("scale", 0.5, 2.5), ("svd", 8, 11.0), ("zero", None, 40.0), ("mean", None, -1.5))
    ]  # fmt: skip
    return json_safe(ManipulateResult(
        model="tiny", baseline_ppl=BASELINE, baseline_sample="The capital of France is Paris",
        prompt="The capital of France is", layers=[3], eval_tokens=100, seconds=1.0, settings={}, results=rows,
    ))  # fmt: skip


def toy_depth_doc() -> dict:
    def regime(c: float, alpha: float) -> ToyDepthCurve:
        depths = [1, 2, 4, 8, 16]
        loss = [c / d**alpha * (1.02 if d % 4 else 0.98) for d in depths]
        return ToyDepthCurve(depths=depths, loss=loss, loss_per_seed=[[v] for v in loss], alpha_l=alpha, c=c, L0=None,
                             ci95=[alpha - 0.1, alpha + 0.1], se=0.05, bootstrap_valid=50)  # fmt: skip

    regimes = {"compositional": regime(2.0, 0.9), "ensemble": regime(1.5, 0.4)}
    return json_safe(ToyDepthResult(preset="tiny", regimes=regimes, temperature=1.0, by_temperature={"1": regimes},
                                    fit="L = c / l^alpha_l", settings={}, seconds=1.0))  # fmt: skip


def dynamics_doc() -> dict:
    def q(median: float) -> Quartiles:
        return Quartiles(median=median, q1=median - 5.0, q3=median + 5.0)

    layers = [
        DynamicsRow(layer=i, angle_state=q(20.0 + 2 * i), angle_update=q(95.0 - i), norm=q(10.0 + i),
                    update_norm=q(1.0), relative_update=q(0.1), angle_final=q(60.0 - 8 * i), progress=q(i / 6))
        for i in range(6)
    ]  # fmt: skip
    clusters = [
        TokenCluster(label=0, bulk=True, size=900, fraction=0.9, median_position=40.0,
                     top_tokens=[[" the", 40], [",", 30]], angle_state_median=[], angle_update_median=[],
                     examples=["of [the] city"]),
        TokenCluster(label=1, bulk=False, size=100, fraction=0.1, median_position=0.0, top_tokens=[["<s>", 50]],
                     angle_state_median=[], angle_update_median=[], examples=["[<s>] Once"]),
    ]  # fmt: skip
    pca = DynamicsPca(profile="angle_update", explained=[0.6, 0.2], k=2, k_choice="fixed by --clusters",
                      silhouette={}, bulk_fraction=0.9, clusters=clusters, sample=pca_sample())
    core = DynamicsCore(layers=[1, 4], angle_update_median=93.0, angle_state_median=25.0, relative_update_median=0.1)
    return json_safe(DynamicsResult(
        model="tiny", tokens=1000, texts=4, text_source="built-in", first_token="excluded", n_layers=6, seconds=1.0,
        settings={}, embedding_norm=q(8.0), core=core, layers=layers, pca=pca, logit_lens=None,
    ))  # fmt: skip


def pca_sample() -> PcaSample:
    """40 sampled tokens: the bulk (label 0) on a ring round the origin, cluster 1 in a clump at (6, 3)."""
    import math

    bulk = [(math.cos(i / 5), math.sin(i / 5)) for i in range(30)]
    clump = [(6.0 + 0.1 * (i % 3), 3.0 + 0.1 * (i // 3)) for i in range(10)]
    points = bulk + clump
    return PcaSample(token=list(range(0, 80, 2)), pc1=[x for x, _ in points], pc2=[y for _, y in points],
                     label=[0] * 30 + [1] * 10)


def weights_doc() -> dict:
    """results/weights.json for two components: the real fit beside both nulls, and the paradox."""
    def stats(cls: type, r2_in: float, r2_loo: float, **more) -> Any:
        return cls(r2_in_sample=r2_in, r2_loo=r2_loo, cosine_loo=r2_loo / 2, delta_corr_mean=-0.2, delta_corr_sd=0.05,
                   **more)

    def null(r2_in: float, r2_loo: float) -> NullModel:
        return stats(NullModel, r2_in, r2_loo, range={}, draws=5)

    components = {
        name: stats(WeightsComponent, r2, r2 - 0.3, shape=[8, 8],
                    all_layers=FitSummary(r2_in_sample=r2 + 0.05, r2_loo=r2 - 0.25, cosine_loo=(r2 - 0.25) / 2),
                    null_shuffled=null(r2 - 0.2, r2 - 0.6), null_independent=null(0.3, -0.1), reading={}, per_layer=[])
        for name, r2 in (("attn.q", 0.9), ("mlp.down", 0.7))
    }  # fmt: skip
    paradox = [ParadoxRow(layers_replaced=layers, ppl=BASELINE * (1 + len(layers)), degradation_pct=100.0 * len(layers),
                          r2_in_sample_mean=0.8, r2_loo_mean=0.5, cosine_mean=0.4, prediction="loo")
               for layers in ([3], [2, 3, 4])]
    return json_safe(WeightsResult(model="tiny", family="llama", n_layers=6, predicted_layers=[1, 5], settings={},
                                   components=components, paradox=paradox, baseline_ppl=BASELINE, seconds=1.0))


def task_score(task: str, acc: float, acc_norm: float | None = None, samples: int = 80) -> TaskScore:
    """One lm-eval task's scores as engine/evaluation/accuracy.py reads them from simple_evaluate."""
    stderr = (acc * (1 - acc) / (samples - 1)) ** 0.5
    metrics = {"acc,none": acc, "acc_stderr,none": stderr}
    if acc_norm is not None:
        metrics |= {"acc_norm,none": acc_norm, "acc_norm_stderr,none": stderr}
    return TaskScore(task=task, acc=acc, acc_stderr=stderr, acc_norm=acc_norm,
                     acc_norm_stderr=None if acc_norm is None else stderr, samples=samples, metrics=metrics)


def evaluate_doc() -> dict:
    """results/evaluate.json: the original and two variants on two local tasks, side by side."""
    protocol = LmEvalProtocol(tasks=["everyday_sense", "tiny_qa"], batch_size=1, limit=None, num_fewshot=None,
                              include_path="/data/tasks", lm_eval_version="0.4.13",
                              n_shot={"everyday_sense": 0, "tiny_qa": 0},
                              task_versions={"everyday_sense": "Yaml", "tiny_qa": "Yaml"})

    def row(variant: str, label: str, description: str, n_layers: int, accs: tuple[float, float],
            agreement: tuple[float, float] | None) -> EvaluatedModel:
        check = None if agreement is None else GenerationCheck(
            texts=[f"Paris, the city of light ({label})"], unit="token", prefix_agreement=agreement[0],
            token_agreement=agreement[1])
        return EvaluatedModel(variant=variant, label=label, description=description, n_layers=n_layers,
                              scores=[task_score("everyday_sense", accs[0], accs[0] - 0.05),
                                      task_score("tiny_qa", accs[1])],
                              generation=check, seconds=12.5)

    models = [row("original", "original", "tiny, 6 layers", 6, (0.6, 0.5), (1.0, 1.0)),
              row("pruned", "pruned -2,3", "layers 2,3 removed (the session's prune cut)", 4, (0.45, 0.5),
                  (0.25, 0.4)),
              row("folder", "folder /models/smol-minus-2", "the exported model in /models/smol-minus-2", 4,
                  (0.55, 0.5), None)]
    return json_safe(EvaluateResult(model="tiny", protocol=protocol, prompts=["The capital of France is"],
                                    gen_tokens=32, models=models, settings={}, seconds=40.0))


def atlas_session(store: SessionStore, name: str = "atlas") -> Session:
    """An atlas of three models of 4, 6 and 9 layers (D % with intervals, Block Influence, angular
    distance, removal perplexity; a calibration variant), saved as `anatomy-tui atlas` saves one."""
    from engine.atlas import table as A
    from engine.evaluation.statistics import importance_class

    shapes = {"tiny-llama": [300.0, 12.0, 5.0, 150.0], "tiny-qwen2": [250.0, 40.0, 8.0, 2.0, 3.0, 120.0],
              "smol-gemma": [400.0, 90.0, 20.0, 6.0, 4.0, -1.5, 3.0, 35.0, 110.0]}
    rows = []
    for model, d in shapes.items():
        n = len(d)
        for variant, bend in ((A.MAIN, 1.0), ("seed-1", 1.1)):
            for layer, value in enumerate(d):
                common = dict(model=model, variant=variant, session=f"{name}-{model}", n_layers=n, layer=layer,
                              relative_depth=A.relative_depth(layer, n), eval_text="builtin:paper", context=None,
                              stride=None, eval_tokens=194, protocol='{"eval_set": "paper"}')
                rows.append(A.AtlasRow(measure="d_pct", value=value * bend, lo=value * 0.8, hi=value * 1.2,
                                       layer_class=importance_class(value), **common))
                rows.append(A.AtlasRow(measure="block_influence", value=0.01 * (value + 10) ** 0.5 + 0.001 * layer,
                                       lo=None, hi=None, layer_class=None, **common))
                rows.append(A.AtlasRow(measure="angular_distance", value=0.05 + 0.0002 * value * bend - 0.01 * layer,
                                       lo=None, hi=None, layer_class=None, **common))
                rows.append(A.AtlasRow(measure="removal_ppl", value=30.0 + value / 5, lo=None, hi=None,
                                       layer_class=None, **common))
    sessions = {m: {v: {"ablation": f"{name}-{m}"} for v in (A.MAIN, "seed-1")} for m in shapes}
    doc = A.build(name, list(shapes), ["map", "proxies", "prune-ppl"], sessions,
                  {A.MAIN: {"eval_set": "paper"}, "seed-1": {"eval_file": "seed-1.txt"}}, rows)
    session = store.create(name, model="", settings={"atlas": {"models": list(shapes)}})
    session.save_result("atlas", doc.to_json())
    return session
