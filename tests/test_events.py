"""The one vocabulary: every kind spelled one way, every event and result type round-tripping through
JSON, version 1 logs and results upgraded on reading, and the documentation's event table in step."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import types
import typing
from pathlib import Path
from typing import Any

import pytest
from tui_fixtures import (
    dynamics_doc,
    round_trips,
)

from engine.core.codec import ABSENT, from_doc, json_safe
from engine.core.events import (
    Started,
    decode_or_none,
    event_from_json,
    event_types,
    result_class,
    upgrade_event,
    upgrade_result,
)
from engine.core.settings import Settings
from engine.experiments.ablation.vocabulary import AblationMap, AblationRow, AblationSettings, LayerAblated
from engine.experiments.ablation.vocabulary import sample as ablation_sample
from engine.experiments.dynamics.vocabulary import (
    DynamicsCore,
    DynamicsPca,
    DynamicsResult,
    DynamicsRow,
    LensLosses,
    TokenCluster,
)
from engine.experiments.growth.vocabulary import (
    GrowthArm,
    GrowthBudgetRow,
    GrowthData,
    GrowthPhase,
    GrowthResult,
    GrowthWidths,
)
from engine.experiments.growth.vocabulary import sample as growth_sample
from engine.experiments.manipulate.vocabulary import ManipulateResult, ManipulateRow
from engine.experiments.prune.vocabulary import DepthLaw, PruneCut, PruneHeal, PruneResult
from engine.experiments.recovery.vocabulary import (
    LayerBudget,
    RecoveryBudget,
    RecoveryLayer,
    RecoveryResult,
    RecoveryRow,
    RecoveryVsAblation,
)
from engine.experiments.scaling_fit.vocabulary import ScalingFitResult
from engine.experiments.toy_depth.vocabulary import (
    StudentStep,
    ToyDepthCurve,
    ToyDepthResult,
    ToyDepthSettings,
    ToyDepthShare,
)
from engine.experiments.weights.vocabulary import (
    FitSummary,
    LayerFit,
    NullModel,
    ParadoxRow,
    WeightsComponent,
    WeightsLayer,
    WeightsResult,
)
from engine.registry import (
    EVENTS_BEGIN,
    EVENTS_END,
    EVENTS_PAGE,
    EXPERIMENTS,
    events_markdown,
    experiment,
    with_events_table,
)
from sessions.store import SessionStore
from tui.state import SessionState

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]  # every page that may name an event
COMMANDS = ("job", *(entry.name for entry in EXPERIMENTS))


def sample(hint: Any) -> Any:
    """A value of the annotated type, with every container non-empty, to round-trip."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return sample(next(a for a in args if a is not type(None)))
    if isinstance(hint, type) and issubclass(hint, Settings):
        return hint()  # settings are checked on reading: their defaults
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return build(hint)
    if origin is list:
        return [sample(args[0])]
    if origin is tuple:
        fixed = not (len(args) == 2 and args[1] is Ellipsis)
        return tuple(sample(arg) for arg in args) if fixed else (sample(args[0]),)
    if origin is dict:
        return {"k": sample(args[1])}
    return {bool: True, int: 3, float: 1.5, str: "x"}.get(hint, "any")


def build(cls: type) -> Any:
    hints = typing.get_type_hints(cls)
    return cls(**{f.name: sample(hints[f.name]) for f in dataclasses.fields(cls) if f.init and f.name != "t"})


@pytest.mark.parametrize("kind", list(event_types()))
def test_every_event_round_trips_through_json(kind):
    event = build(event_types()[kind])
    line = json.dumps(event.to_json(), allow_nan=False)
    assert event_from_json(json.loads(line)) == event


def test_kinds_are_command_dot_what_and_fields_say_layer():
    pattern = re.compile(rf"^({'|'.join(map(re.escape, COMMANDS))})\.[a-z_]+$")
    for kind, cls in event_types().items():
        assert pattern.match(kind), kind
        assert cls.kind == kind
        names = {f.name for f in dataclasses.fields(cls)}
        assert not names & {"index", "class"}, (kind, names)


def test_a_missing_field_is_an_error_not_a_default():
    doc = LayerAblated(layer=2, n_layers=4, ppl=1.0, baseline_ppl=1.0, degradation_pct=0.0,
                       layer_class="minor").to_json()
    del doc["layer"]
    with pytest.raises(TypeError):
        event_from_json(doc)
    with pytest.raises(ValueError, match="unknown event kind"):
        event_from_json({"v": 2, "kind": "nobody.knows"})


def ablated(**changes: Any) -> dict[str, Any]:
    doc = LayerAblated(layer=2, n_layers=4, ppl=1.0, baseline_ppl=1.0, degradation_pct=0.0,
                       layer_class="minor", job="j").to_json()
    return doc | changes


@pytest.mark.parametrize("changes", [
    {"layer": "2"}, {"layer": 2.0}, {"layer": True}, {"layer": [2]}, {"ppl": "1.0"}, {"ppl": False},
    {"layer_class": ["minor"]}, {"layer_class": 3}, {"job": 5}, {"job": {"no": "string"}}, {"t": "now"},
], ids=repr)
def test_a_value_of_the_wrong_type_is_an_error(changes):
    """The log is untrusted: a value its field's annotation does not allow raises, so the reader skips
    the line as damaged instead of drawing a job named 5 or a log line made of an object."""
    with pytest.raises(TypeError):
        event_from_json(ablated(**changes))


def test_the_types_a_document_may_use():
    """An int is fine for a float (1 for 1.0), None for any field (NaN is written as null), and the
    items of lists and dicts are checked too."""
    event = event_from_json(ablated(ppl=3, baseline_ppl=None, t=12))
    assert isinstance(event, LayerAblated)
    assert event.ppl == 3 and event.baseline_ppl is None
    started = event_from_json({"v": 2, "kind": "job.started", "experiment": "x", "spec": {"a": [1, "b"]}})
    assert isinstance(started, Started) and started.spec
    for spec in ("not an object", [1], 5):
        with pytest.raises(TypeError):
            event_from_json({"v": 2, "kind": "job.started", "experiment": "x", "spec": spec})
    doc = json_safe(build(AblationMap))
    assert from_doc(AblationMap, doc) == build(AblationMap)
    row = json_safe(build(AblationRow))
    for layers in ([row | {"layer": "1"}], ["not a row"], {"0": row}):
        with pytest.raises(TypeError):
            from_doc(AblationMap, doc | {"layers": layers})
    for spearman in ({"d": "high"}, {"d": [1.0]}, [0.5]):
        with pytest.raises(TypeError):
            from_doc(AblationMap, doc | {"spearman": spearman})
    assert from_doc(AblationMap, doc | {"spearman": {"d": None, "bi": 1}}).spearman == {"d": None, "bi": 1}


@pytest.mark.parametrize("cls", [AblationMap, RecoveryRow, GrowthArm, DynamicsRow, ManipulateRow, ParadoxRow,
                                 PruneResult, RecoveryResult, GrowthResult, ManipulateResult,
                                 WeightsResult, DynamicsResult, ToyDepthResult, ScalingFitResult])  # fmt: skip
def test_result_types_round_trip(cls):
    value = build(cls)
    assert from_doc(cls, json.loads(json.dumps(json_safe(value)))) == value


# Each result class's document keys, in the order the engine wrote them when it built the document as
# a dict: the class replaced the dict, the file stays byte for byte what it was.
RESULT_KEYS: dict[type, list[str]] = {
    PruneResult: ["model", "baseline_ppl", "eval_tokens", "eval_texts", "n_layers", "settings", "methods", "curve",
                  "agreement", "agreement_note", "scores", "depth_fit", "heal", "exported", "exported_point",
                  "seconds", "evaluation", "baseline_accuracy", "protocol"],
    PruneCut: ["method", "removed", "layers", "ppl", "ci_low", "ci_high", "healed_ppl", "accuracy", "healed_accuracy",
               "generation", "disagreement", "removed_params", "blocks"],
    DepthLaw: ["a", "c", "L0", "ci95", "points", "depths", "label", "chinchilla"],
    PruneHeal: ["steps", "what", "train_source", "train_blocks"],
    RecoveryResult: ["model", "baseline_ppl", "eval_tokens", "eval_texts", "train_source", "train_blocks", "settings",
                     "layers", "ranking", "spearman_vs_ablation", "versus_ablation", "budget", "seconds_per_step",
                     "resumed_layers", "seconds", "protocol", "partial"],
    RecoveryBudget: ["rule", "uniform_total", "proposed_total", "saving_steps", "saving_pct", "per_layer"],
    LayerBudget: ["layer", "difficulty", "uniform_steps", "proposed_steps", "reallocated_steps"],
    RecoveryVsAblation: ["layers", "ablation_method", "difficulty", "final_ratio", "ratio_after_noise"],
    GrowthResult: ["preset", "params", "arms", "phases", "generations", "budget_table",
                   "ratio_uniform_over_growth_seconds", "profile", "widths", "data", "settings", "paper"],
    GrowthArm: ["val_loss", "mean", "sd", "seconds", "seconds_sd", "tokens_per_s", "tokens_per_s_sd", "steps", "tokens",
                "phases", "model", "curve"],
    GrowthBudgetRow: ["layer", "layer_class", "steps", "epochs"],
    GrowthWidths: ["growth", "uniform"],
    GrowthData: ["source", "tokenizer", "vocab_size", "train_tokens", "val_tokens", "batch_tokens"],
    ManipulateResult: ["model", "baseline_ppl", "baseline_sample", "prompt", "layers", "eval_tokens", "seconds",
                       "settings", "results", "protocol"],
    ManipulateRow: ["layers", "strategy", "param", "ppl", "degradation_pct", "sample", "together"],
    WeightsResult: ["model", "family", "n_layers", "predicted_layers", "settings", "components", "paradox",
                    "baseline_ppl", "seconds", "protocol"],
    WeightsComponent: ["r2_in_sample", "r2_loo", "cosine_loo", "delta_corr_mean", "delta_corr_sd", "shape",
                       "all_layers", "null_shuffled", "null_independent", "reading", "per_layer"],
    NullModel: ["r2_in_sample", "r2_loo", "cosine_loo", "delta_corr_mean", "delta_corr_sd", "range", "draws"],
    FitSummary: ["r2_in_sample", "r2_loo", "cosine_loo"],
    WeightsLayer: ["layer", "predicted", "all_layers", "delta_corr", "mean", "std"],
    LayerFit: ["r2_in_sample", "r2_loo", "cosine_in_sample", "cosine_loo"],
    ParadoxRow: ["layers_replaced", "ppl", "degradation_pct", "r2_in_sample_mean", "r2_loo_mean", "cosine_mean",
                 "prediction"],
    DynamicsResult: ["model", "tokens", "texts", "text_source", "first_token", "n_layers", "seconds", "settings",
                     "embedding_norm", "core", "layers", "pca", "logit_lens"],
    DynamicsCore: ["layers", "angle_update_median", "angle_state_median", "relative_update_median"],
    DynamicsPca: ["profile", "explained", "k", "k_choice", "silhouette", "bulk_fraction", "clusters", "sample"],
    TokenCluster: ["label", "bulk", "size", "fraction", "median_position", "top_tokens", "angle_state_median",
                   "angle_update_median", "examples"],
    LensLosses: ["lens", "loss", "final_loss", "predicted_tokens"],
    DynamicsRow: ["layer", "angle_state", "angle_update", "norm", "update_norm", "relative_update", "angle_final",
                  "progress", "lens_loss"],
    ToyDepthResult: ["preset", "regimes", "temperature", "by_temperature", "fit", "settings", "seconds"],
    ToyDepthCurve: ["depths", "loss", "loss_per_seed", "alpha_l", "c", "L0", "ci95", "se", "bootstrap_valid"],
    ScalingFitResult: ["source", "columns", "n_rows", "n_excluded", "n_points", "optimizer", "loss_function",
                       "huber_delta", "params", "objective", "depth_points", "profile", "alpha_l_profile_ci95",
                       "ci95", "se", "train_rmse", "train_rmse_log", "restarts", "bootstrap", "heldout_rmse",
                       "heldout_rmse_log", "heldout_splits", "heldout_n_test", "paper", "optimal_shape", "settings",
                       "seconds"],
}  # fmt: skip


@pytest.mark.parametrize("cls", list(RESULT_KEYS), ids=lambda cls: cls.__name__)
def test_result_documents_keep_the_keys_of_the_dicts_they_replace(cls):
    assert list(json_safe(build(cls))) == RESULT_KEYS[cls]


@pytest.mark.parametrize("name", [entry.name for entry in EXPERIMENTS])
def test_each_experiment_sample_is_its_result_class_and_round_trips(name):
    """Every experiment's vocabulary builds a sample from its result class that reads back byte for
    byte."""
    sample = experiment(name).sample()
    assert isinstance(sample, experiment(name).result_class)
    assert round_trips(name, json_safe(sample))


def test_version_2_documents_pass_the_upgrade_unchanged():
    for cls in event_types().values():
        doc = build(cls).to_json()
        assert upgrade_event(doc) == doc
    doc = json_safe(build(AblationMap))
    assert upgrade_result("ablation", doc) == doc


# --- a session written by 0.1 (schema 1), in the shapes it wrote ---------------------------------
V1_ROW = {"index": 1, "ppl": 30.0, "degradation_pct": 50.0, "class": "important", "anti": False,
          "anti_within_noise": False, "ci_low": None, "ci_high": None, "block_influence": 0.1,
          "angular_distance": 0.2}  # fmt: skip
V1_RECOVERY_ROW = {
    "index": 1, "status": "done", "ppl_after_noise": 90.0, "ratio_after_noise": 4.5,
    "steps_to": {"2.0": 5, "1.5": 10, "1.1": None}, "best_ppl": 21.0, "best_step": 40, "final_ppl": 21.0,
    "final_ratio": 1.05, "improved_over_baseline": False, "curve": [[0, 90.0], [40, 21.0]],
    "diverged_at": None, "steps_run": 40, "seconds": 2.0, "seconds_per_step": 0.05,
    "train_loss": [[1, 3.0]], "difficulty": 40.0, "mean_final_ratio": 1.05,
    "steps_to_mean": {"2.0": 5.0}, "steps_to_sd": {"2.0": None}, "steps_to_reached": {"2.0": 1},
    "repeats": [],
}  # fmt: skip
V1_LOG = [
    {"v": 1, "kind": "started", "job": "ablation-1", "t": 1.0, "experiment": "ablation", "spec": {}},
    {"v": 1, "kind": "ablation.layer", "job": "ablation-1", "t": 2.0, "index": 0, "n_layers": 2,
     "ppl": 40.0, "baseline_ppl": 20.0, "degradation_pct": 100.0, "layer_class": "critical"},
    {"v": 1, "kind": "progress", "job": "ablation-1", "t": 2.0, "done": 1, "total": 2, "label": "ablation"},
    {"v": 1, "kind": "result", "job": "ablation-1", "t": 3.0, "name": "ablation",
     "data": {"model": "tiny", "method": "mean", "baseline_ppl": 20.0, "eval_tokens": 10, "eval_texts": 2,
              "seconds": 1.0, "settings": {}, "spearman": {}, "layers": [{**V1_ROW, "index": 0}, V1_ROW]}},
    {"v": 1, "kind": "finished", "job": "ablation-1", "t": 3.0, "status": "done", "error": ""},
    {"v": 1, "kind": "recovery.layer", "job": "recovery-1", "t": 4.0, "index": 1, "result": V1_RECOVERY_ROW},
    {"v": 1, "kind": "growth.phase", "job": "growth-1", "t": 5.0, "arm": "growth_100", "seed": 0,
     "phase": "core", "index": 0, "start_step": 0, "steps": 3, "layers": [1], "added": []},
    {"v": 1, "kind": "toy-depth-step", "job": "toy-depth-1", "t": 6.0, "regime": "tied",
     "temperature": 1.0, "depth": 2, "step": 10, "steps": 20, "loss": 0.5},
]  # fmt: skip


def test_a_version_1_session_still_opens(isolated_home):
    session = SessionStore().create("old")
    (session.results_dir / "ablation.json").write_text(json.dumps(V1_LOG[3]["data"]))
    with open(session.events_path, "w", encoding="utf-8") as handle:
        handle.writelines(json.dumps(doc) + "\n" for doc in V1_LOG)
    events, _ = session.read_events()
    assert [e.kind for e in events] == [
        "job.started", "ablation.layer", "job.progress", "job.result", "job.finished", "recovery.layer",
        "growth.phase", "toy-depth.step",
    ]  # fmt: skip
    assert isinstance(events[0], Started) and isinstance(events[1], LayerAblated) and events[1].layer == 0
    assert isinstance(events[5], RecoveryLayer) and events[5].layer == 1 and events[5].result.layer == 1
    assert isinstance(events[6], GrowthPhase) and events[6].phase_index == 0
    assert isinstance(events[7], StudentStep) and events[7].loss == 0.5
    saved = session.load_result("ablation")
    assert saved is not None
    assert [(row["layer"], row["layer_class"]) for row in saved["layers"]] == [(0, "important"), (1, "important")]
    state = SessionState()
    state.set_result("ablation", saved)
    for event in events:
        state.apply(event)
    renamed: dict[str, Any] = {("layer" if k == "index" else "layer_class" if k == "class" else k): v
                               for k, v in V1_ROW.items()}
    assert state.ablation[1] == AblationRow(**renamed)
    assert state.difficulty[1].difficulty == 40.0
    assert state.growth.current["growth_100"].phase_index == 0


def test_version_1_result_rows_are_renamed_everywhere():
    recovery = upgrade_result("recovery", {"layers": [V1_RECOVERY_ROW],
                                           "budget": {"per_layer": [{"index": 1, "difficulty": 40.0}]}})
    assert recovery["layers"][0]["layer"] == 1 and recovery["budget"]["per_layer"][0]["layer"] == 1
    assert RecoveryRow.from_json(V1_RECOVERY_ROW).layer == 1  # a 0.1 resume checkpoint row
    weights = upgrade_result("weights", {"components": {"q": {"per_layer": [{"index": 2}]}}})
    assert weights["components"]["q"]["per_layer"] == [{"layer": 2}]
    growth = upgrade_result("growth", {"budget_table": [{"layer": 0, "class": "critical"}]})
    assert growth["budget_table"] == [{"layer": 0, "layer_class": "critical"}]
    assert upgrade_result("dynamics", {"layers": [{"index": 4}]})["layers"] == [{"layer": 4}]


def test_results_of_older_versions_decode_without_what_they_lacked():
    """A dynamics result of 0.2 has no PCA sample, one of 0.1 no lens name (nor the angles to the final
    state): what a newer version added reads as None."""
    doc = dynamics_doc()
    del doc["pca"]["sample"]
    doc["logit_lens"] = {"loss": [1.0, 0.5], "final_loss": 0.5, "predicted_tokens": 10}
    doc["layers"] = [{k: v for k, v in row.items() if k not in ("angle_final", "progress", "lens_loss")}
                     for row in doc["layers"]]
    old = DynamicsResult.from_json(doc)
    assert old.logit_lens is not None
    assert old.pca.sample is None and old.logit_lens.lens is None and old.layers[0].progress is None


def test_a_fixed_tuples_items_are_checked_each_as_its_own():
    """A growth arm's curve is (step, loss) pairs: a pair of the wrong length or types is an error, and
    a growth result of 0.3 (no curve) reads with the curve absent."""
    doc = json.loads(json.dumps(json_safe(growth_sample())))
    assert from_doc(GrowthResult, doc).arms["growth_100"].curve[0] == (10, pytest.approx(2.2))
    for curve in ([[10, "low"]], [[10, 1.0, 2.0]], [[1.5, 1.0]], [10]):
        with pytest.raises(TypeError):
            from_doc(GrowthResult, doc | {"arms": doc["arms"] | {"uniform_100": doc["arms"]["uniform_100"]
                                                                 | {"curve": curve}}})
    del doc["arms"]["growth_100"]["curve"]
    assert from_doc(GrowthResult, doc).arms["growth_100"].curve is ABSENT


def test_a_key_a_document_has_in_one_shape_only_stays_out_when_absent():
    """toy-depth writes `se` only beside a fitted law: a curve without a fit has no such key, and
    reads back as it was."""
    unfitted = {"depths": [1], "loss": [0.5], "loss_per_seed": [[0.5]], "alpha_l": None, "c": None, "L0": None,
                "ci95": None, "bootstrap_valid": 0}
    curve = from_doc(ToyDepthCurve, unfitted)
    assert curve.se is ABSENT and json.dumps(json_safe(curve)) == json.dumps(unfitted)
    fitted = {**unfitted, "alpha_l": 1.0, "ci95": None, "se": None, "bootstrap_valid": 1}
    fitted = {key: fitted[key] for key in RESULT_KEYS[ToyDepthCurve]}
    assert json.dumps(json_safe(from_doc(ToyDepthCurve, fitted))) == json.dumps(fitted)


# --- the documentation ----------------------------------------------------------------------------
def test_the_event_table_in_the_docs_is_generated_from_the_classes():
    page = EVENTS_PAGE.read_text(encoding="utf-8")
    assert with_events_table(page) == page, "docs/events.md's event table is stale: run `python3 -m engine.registry`"


def test_regenerating_the_event_table_replaces_only_what_lies_between_its_markers():
    stale = f"# Events\nbefore\n{EVENTS_BEGIN}| kind |\n| old |{EVENTS_END}\nafter\n"
    assert with_events_table(stale) == f"# Events\nbefore\n{EVENTS_BEGIN}{events_markdown()}{EVENTS_END}\nafter\n"


def test_the_docs_mention_only_real_kinds_with_their_fields():
    text = "\n".join(path.read_text(encoding="utf-8") for path in DOCS)
    commands = "|".join(map(re.escape, COMMANDS))
    mentions = re.findall(rf"`((?:{commands})[.-][a-z_]+)`([^`{{]{{0,30}}?\{{([^}}]*)\}})?", text)
    assert len(mentions) > 10
    kinds = event_types()
    for kind, braces, fields in mentions:
        if kind.endswith(("json", "png", "svg", "pdf")) or result_class(kind) is not None:  # files, result names
            continue
        assert kind in kinds, f"the docs name `{kind}`, which no event class declares"
        if braces:
            declared = [f.name for f in dataclasses.fields(kinds[kind]) if f.name not in ("job", "t")]
            assert [name.strip() for name in fields.split(",")] == declared, kind


# --- a result's settings -----------------------------------------------------------------------
def test_a_results_settings_are_its_settings_class_written_as_to_dict_writes_them():
    """The `settings` a run records is the experiment's Settings, written as the job file's form
    (`to_dict()`, as the dict the result held before), and read back through `from_dict`."""
    settings = AblationSettings(method="skip", layers=(1, 2), eval_batch_size=4)
    result = dataclasses.replace(ablation_sample(), settings=settings)
    doc = json.loads(json.dumps(json_safe(result)))
    assert json.dumps(doc["settings"]) == json.dumps(settings.to_dict())
    assert AblationMap.from_json(doc).settings == settings and AblationMap.from_json(doc) == result


@pytest.mark.parametrize("name", [entry.name for entry in EXPERIMENTS])
def test_each_result_keeps_its_experiments_settings_through_json(name):
    """Its sample with settings other than its own (a field changed from the sample's) reads back
    with exactly those: a `settings` field of another class, or none, could not (the contract test,
    tests/test_contract.py, names a result without one)."""
    entry = experiment(name)
    own: Any = entry.sample()
    number = next(spec.name for spec in entry.settings_class.fields()
                  if type(getattr(own.settings, spec.name)) is int and spec.name != "seed")
    changed = dataclasses.replace(own.settings, **{number: getattr(own.settings, number) + 1})
    doc = json.loads(json.dumps(json_safe(dataclasses.replace(own, settings=changed))))
    decoded: Any = entry.result_class.from_json(doc)
    assert decoded.settings == changed != own.settings


def test_settings_of_older_and_newer_writers_decode():
    """A setting the document lacks (older than it) takes its default, `{}` (the 0.1 test sessions)
    reads as the defaults, a setting this version does not know (a newer writer's) is left out, and a
    value the settings refuse makes the whole result unreadable, as any field that does not fit."""
    doc = json.loads(json.dumps(json_safe(dataclasses.replace(
        ablation_sample(), settings=AblationSettings(method="zero")))))
    del doc["settings"]["prefix_cache"]
    doc["settings"]["retired"] = 3
    assert AblationMap.from_json(doc).settings == AblationSettings(method="zero")
    assert AblationMap.from_json({**doc, "settings": {}}).settings == AblationSettings()
    bad = {**doc, "settings": {**doc["settings"], "method": "bogus"}}
    with pytest.raises(ValueError, match="--method bogus"):
        AblationMap.from_json(bad)
    reasons: list[Exception] = []
    assert decode_or_none(AblationMap, bad, on_error=reasons.append) is None and len(reasons) == 1
    assert decode_or_none(AblationMap, None, on_error=reasons.append) is None and len(reasons) == 1


def test_a_toy_depth_worker_share_is_a_class_that_writes_the_dict_it_replaced():
    settings = ToyDepthSettings()
    share = ToyDepthShare(students=[("tied", 1.0, 2, [0.5, None])], settings=settings, seconds=1.5)
    doc = json.loads(json.dumps(json_safe(share)))
    assert doc == {"students": [["tied", 1.0, 2, [0.5, None]]], "settings": settings.to_dict(), "seconds": 1.5}
    assert from_doc(ToyDepthShare, doc) == share


WORDS_WHEN_NEEDED = """
import json, sys
from engine import registry
from engine.core.events import event_from_json, event_types, result_class

def imported():
    return sorted(name.split(".")[2] for name in sys.modules if name.endswith(".vocabulary"))

print(json.dumps(imported()))
event_from_json(json.loads(sys.argv[1]))
print(json.dumps(imported()))
result_class("toy-depth")
print(json.dumps(imported()))
registry.BY_NAME["scaling-fit"].settings_class
print(json.dumps(imported()))
event_types()
print(json.dumps(imported()))
"""


def test_a_vocabulary_is_imported_when_one_of_its_words_is_first_needed():
    """The registry names each experiment's vocabulary without importing it: reading one of its
    events imports that one alone (by the kind's command), as does asking for its result class or
    its row's settings; every kind asked for imports them all."""
    point = json.dumps(build(event_types()["recovery.point"]).to_json())
    out = subprocess.run([sys.executable, "-c", WORDS_WHEN_NEEDED, point], cwd=ROOT, capture_output=True,
                         text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr[-2000:]
    steps = [json.loads(line) for line in out.stdout.splitlines()]
    assert steps[:4] == [[], ["recovery"], ["recovery", "toy_depth"], ["recovery", "scaling_fit", "toy_depth"]]
    assert steps[4] == sorted(entry.name.replace("-", "_") for entry in EXPERIMENTS)


def test_the_console_folds_kinds_and_results_the_vocabularies_declare():
    """tui/state.py folds events by kind and results by name (so it imports no vocabulary before
    the first paint): each of its words is one a vocabulary declares."""
    from tui import state

    kinds = event_types()
    assert set(state._HANDLERS) <= set(kinds)
    assert (kinds[state.RECOVERY_POINT].__name__, kinds[state.GROWTH_STEP].__name__,
            kinds[state.GROWTH_EVAL].__name__) == ("RecoveryPoint", "GrowthStep", "GrowthEval")  # fmt: skip
    assert all(experiment(name).writes == name for name in state._RESULT_HANDLERS)
