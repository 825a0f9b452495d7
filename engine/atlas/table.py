"""The anatomy atlas: per-layer measures of many models on one protocol, merged on relative depth.

Pure computation on result documents (no store, no UI): which experiment runs each measure, the
merged table (one row per model, layer and criterion, with relative depth layer / (L - 1)), the
criteria's agreement (Spearman per model), their consistency across models, their stability under
other calibration texts, and the relative depths where every model's layers are critical or all
redundant. `anatomy-tui atlas` (cli/commands/atlas.py) runs the measures into sessions and calls
these; `anatomy-tui compare` reads sessions or an atlas and prints them.

Relative-depth bins: `n_bins` equal bins of [0, 1]; layer l of a model of L layers falls in bin
min(l * n_bins // (L - 1), n_bins - 1) (integer arithmetic, so a layer on a boundary, 0.3 at L = 11,
goes to the upper bin exactly; the last layer, depth 1, goes to the last bin).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from engine.core.codec import from_doc, json_safe
from engine.core.errors import UserError
from engine.core.events import ResultDocument, decode_or_none
from engine.experiments.ablation.vocabulary import AblationMap
from engine.experiments.dynamics.vocabulary import DynamicsResult
from engine.experiments.prune.vocabulary import PruneResult
from engine.experiments.recovery.vocabulary import RecoveryResult

STABLE_RHO = 0.8  # a criterion is stable when its per-layer ranks under every other calibration text agree this well
DEFAULT_BINS = 10
MAIN = "main"  # the variant measured on the atlas's own evaluation text


@dataclass(frozen=True)
class Measure:
    """A measure `--measures` names: the experiment that computes it, the flags the atlas adds to
    that experiment's command line, and the criteria (table rows) it gives."""

    name: str
    experiment: str
    flags: tuple[str, ...]
    criteria: tuple[str, ...]
    reads_eval_text: bool = True  # measured again on each calibration variant


# the criteria, the table's `measure` column, with what they are (higher: the layer matters more)
CRITERIA: dict[str, str] = {
    "d_pct": "ablation D % (perplexity rise when the layer is replaced by its neighbours' mean), 95 % bootstrap CI",
    "block_influence": "Block Influence 1 - cos(h_in, h_out), mean over tokens (ShortGPT)",
    "angular_distance": "angular distance arccos(cos(h_in, h_out)) / pi, mean over tokens",
    "angular_last_token": "the same angular distance of each text's last token only (Gromov et al., PruneMe)",
    "removal_ppl": "perplexity with the layer removed (SLEB's first round, prune --method ppl)",
    "angle_state": "median angle (degrees) between a layer's input and output hidden states",
    "angle_update": "median angle (degrees) between consecutive layers' updates",
    "recovery_difficulty": "steps to recover below 1.1x the baseline after noising the layer (sampled layers)",
}

MEASURES: dict[str, Measure] = {m.name: m for m in (
    Measure("map", "ablation", ("--bootstrap", "200"), ("d_pct",)),
    Measure("proxies", "ablation", ("--bootstrap", "200"),
            ("block_influence", "angular_distance", "angular_last_token")),
    Measure("prune-ppl", "prune", ("--method", "ppl", "--remove", "1", "--bootstrap", "0"), ("removal_ppl",)),
    Measure("dynamics", "dynamics", (), ("angle_state", "angle_update")),
    Measure("recovery-sample", "recovery", ("--steps", "30", "--eval-every", "5"), ("recovery_difficulty",),
            reads_eval_text=False),
)}
RECOVERY_SAMPLE = (0.0, 1 / 3, 2 / 3, 1.0)  # the relative depths recovery-sample noises


def parse_measures(text: str) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(part.strip() for part in text.split(",") if part.strip()))
    unknown = [name for name in names if name not in MEASURES]
    if unknown or not names:
        raise UserError(f"--measures {text}: must be a comma-separated list of {', '.join(MEASURES)}")
    return names


def experiments_of(measures: Sequence[str]) -> list[str]:
    """The experiments to run for these measures, once each, in MEASURES' order (map and proxies
    share one ablation run)."""
    wanted = set(measures)
    return list(dict.fromkeys(m.experiment for m in MEASURES.values() if m.name in wanted))


def experiment_flags(experiment: str, measures: Sequence[str]) -> list[str]:
    """The flags the atlas adds to one experiment's run for these measures (the measures of one
    experiment declare the same flags, so it runs once for all of them)."""
    return next((list(m.flags) for m in MEASURES.values() if m.name in measures and m.experiment == experiment), [])


def sample_layers(n_layers: int, depths: Sequence[float] = RECOVERY_SAMPLE) -> list[int]:
    """The layers nearest to these relative depths, once each."""
    return list(dict.fromkeys(int(d * (n_layers - 1) + 0.5) for d in depths))  # halves up


def relative_depth(layer: int, n_layers: int) -> float:
    return layer / (n_layers - 1) if n_layers > 1 else 0.0


def depth_bin(layer: int, n_layers: int, n_bins: int = DEFAULT_BINS) -> int:
    """The relative-depth bin of a layer (module docstring)."""
    if n_layers <= 1:
        return 0
    return min(layer * n_bins // (n_layers - 1), n_bins - 1)


# protocol --------------------------------------------------------------------------------------

PROTOCOL_SETTINGS = ("eval_set", "eval_file", "eval_dataset", "text_column", "context", "stride", "max_windows",
                     "max_tokens", "max_length", "text_file", "method")


def protocol_of(doc: Mapping[str, Any]) -> dict[str, Any]:
    """The evaluation protocol a result was measured under: its own `protocol` record where it has
    one, else the evaluation settings it names (text, lengths, ablation method)."""
    recorded = doc.get("protocol")
    if isinstance(recorded, dict):
        return dict(recorded)
    named = doc.get("settings")
    settings: dict[str, Any] = named if isinstance(named, dict) else {}
    found = {key: settings[key] for key in PROTOCOL_SETTINGS if settings.get(key) is not None}
    if "eval_file" in found or "eval_dataset" in found or "text_file" in found:
        found.pop("eval_set", None)
    return found


def eval_text_of(protocol: Mapping[str, Any]) -> str:
    for key in ("dataset", "eval_dataset", "eval_file", "text_file", "source"):
        if protocol.get(key):
            return str(protocol[key])
    return f"builtin:{protocol.get('eval_set', 'full')}"


# the table -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class AtlasRow:
    """One row of the merged table: a criterion's value at one layer of one model under one
    calibration variant, with the protocol it was measured under."""

    model: str
    variant: str
    session: str
    n_layers: int
    layer: int
    relative_depth: float
    measure: str
    value: float | None
    lo: float | None
    hi: float | None
    layer_class: str | None  # the ablation class (d_pct rows only)
    eval_text: str
    context: int | None
    stride: int | None
    eval_tokens: int | None
    protocol: str  # the whole protocol record, as sorted JSON


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else None


PER_LAYER: dict[str, type[ResultDocument]] = {
    cls.name: cls for cls in (AblationMap, PruneResult, DynamicsResult, RecoveryResult)
}  # the results with per-layer values, by experiment


def rows_of(model: str, variant: str, session: str, results: Mapping[str, Mapping[str, Any]]) -> list[AtlasRow]:
    """The table rows of one model's session results (experiment name -> result document): a
    result that is absent gives none; one of the wrong shape is a UserError naming it."""
    rows: list[AtlasRow] = []
    for experiment, doc in results.items():
        cls = PER_LAYER.get(experiment)
        if cls is None or doc is None:
            continue

        def unreadable(exc: Exception, experiment: str = experiment) -> UserError:
            return UserError(f"session {session}: results/{experiment}.json cannot be read ({exc})")

        unfit: list[Exception] = []
        result = decode_or_none(cls, doc, on_error=unfit.append)
        if result is None:
            raise unreadable(unfit[0]) from None
        try:
            found = list(_per_layer(result))
        except (TypeError, ValueError, KeyError, AttributeError) as exc:  # a value of the wrong type inside it
            raise unreadable(exc) from None
        if not found:
            continue
        n_layers = max(n for n, *_ in found)
        protocol = protocol_of(doc)
        common: dict[str, Any] = dict(eval_text=eval_text_of(protocol), context=_int(protocol.get("context")),
                      stride=_int(protocol.get("stride")), eval_tokens=_int(doc.get("eval_tokens", doc.get("tokens"))),
                      protocol=json.dumps(protocol, sort_keys=True))
        for _, layer, measure, value, lo, hi, layer_class in found:
            rows.append(AtlasRow(model, variant, session, n_layers, layer, relative_depth(layer, n_layers), measure,
                                 _number(value), _number(lo), _number(hi), layer_class, **common))
    return rows


def _per_layer(result: ResultDocument) -> Iterable[tuple[int, int, str, float | None, float | None, float | None,
                                                        str | None]]:
    """(n_layers, layer, criterion, value, lo, hi, class) of every per-layer value of a result."""
    if isinstance(result, AblationMap):
        n = len(result.layers)
        for row in result.layers:
            yield n, row.layer, "d_pct", row.degradation_pct, row.ci_low, row.ci_high, row.layer_class
            yield n, row.layer, "block_influence", row.block_influence, None, None, None
            yield n, row.layer, "angular_distance", row.angular_distance, None, None, None
            last = row.angular_last_token
            if isinstance(last, (int, float)):  # ABSENT in maps made before it was measured
                yield n, row.layer, "angular_last_token", last, None, None, None
    elif isinstance(result, PruneResult):
        for layer, value in enumerate(result.scores.get("ppl") or []):
            yield result.n_layers, layer, "removal_ppl", value, None, None, None
    elif isinstance(result, DynamicsResult):
        for angles in result.layers:
            yield result.n_layers, angles.layer, "angle_state", angles.angle_state.median, None, None, None
            if angles.angle_update is not None and angles.angle_update.median is not None:
                yield result.n_layers, angles.layer, "angle_update", angles.angle_update.median, None, None, None
    elif isinstance(result, RecoveryResult):
        for recovered in result.layers:  # its model's depth is not in it: `with_depth` gives it
            yield 0, recovered.layer, "recovery_difficulty", recovered.difficulty, None, None, None


def with_depth(rows: list[AtlasRow], n_layers: int) -> list[AtlasRow]:
    """Rows whose model depth was not in their result (recovery's) given the model's depth."""
    return [replace(row, n_layers=n_layers, relative_depth=relative_depth(row.layer, n_layers))
            if row.n_layers < n_layers else row for row in rows]


def profile(rows: Iterable[AtlasRow], model: str, measure: str, variant: str = MAIN) -> dict[int, float]:
    """layer -> value of one criterion of one model (finite values only)."""
    return {row.layer: row.value for row in rows
            if row.model == model and row.measure == measure and row.variant == variant and row.value is not None}


def models_of(rows: Iterable[AtlasRow]) -> list[str]:
    return list(dict.fromkeys(row.model for row in rows))


def criteria_of(rows: Iterable[AtlasRow]) -> list[str]:
    present = {row.measure for row in rows}
    return [name for name in CRITERIA if name in present]


def rank_agreement(a: Mapping[int, float], b: Mapping[int, float]) -> float | None:
    """Spearman between two per-layer profiles over the layers both have (None: fewer than 3)."""
    from engine.evaluation.statistics import spearman  # numpy: not at import, the command line's parser imports this

    common = sorted(set(a) & set(b))
    return spearman([a[k] for k in common], [b[k] for k in common])


# agreement, consistency, stability -------------------------------------------------------------

@dataclass(frozen=True)
class Agreement:
    """Per model, Spearman between every two criteria; across models, for each criterion, its
    Spearman with ablation D % (mean and lowest over models) and how alike its relative-depth profiles
    of different models rank the depth bins (mean Spearman over model pairs)."""

    pairs: dict[str, dict[str, float | None]]  # model -> "a~b" -> rho
    with_d: dict[str, dict[str, float | None]]  # criterion -> {"mean", "min"} over models, vs d_pct
    across_models: dict[str, float | None]  # criterion -> mean pairwise Spearman of binned profiles
    most_consistent: str | None  # the criterion with the highest across_models value


def pair_key(a: str, b: str) -> str:
    return f"{a}~{b}"


def agreement(rows: Sequence[AtlasRow], n_bins: int = DEFAULT_BINS) -> Agreement:
    models, criteria = models_of(rows), criteria_of(rows)
    pairs: dict[str, dict[str, float | None]] = {}
    for model in models:
        profiles = {c: profile(rows, model, c) for c in criteria}
        pairs[model] = {pair_key(a, b): rank_agreement(profiles[a], profiles[b])
                        for i, a in enumerate(criteria) for b in criteria[i + 1:]}
    with_d: dict[str, dict[str, float | None]] = {}
    for criterion in criteria:
        if criterion == "d_pct":
            continue
        values = [pairs[m].get(pair_key("d_pct", criterion)) for m in models]
        known = [v for v in values if v is not None]
        with_d[criterion] = {"mean": sum(known) / len(known) if known else None, "min": min(known) if known else None}
    across: dict[str, float | None] = {}
    for criterion in criteria:
        binned = [binned_profile(rows, m, criterion, n_bins) for m in models]
        binned = [b for b in binned if b]
        rhos = [rank_agreement(binned[i], binned[j]) for i in range(len(binned)) for j in range(i + 1, len(binned))]
        known = [r for r in rhos if r is not None]
        across[criterion] = sum(known) / len(known) if known else None
    ranked = {c: rho for c in criteria if (rho := across[c]) is not None}
    best = max(ranked, key=ranked.__getitem__) if ranked else None
    return Agreement(pairs, with_d, across, best)


def binned_profile(rows: Iterable[AtlasRow], model: str, measure: str, n_bins: int = DEFAULT_BINS,
                   variant: str = MAIN) -> dict[int, float]:
    """bin -> mean value of the model's layers in it."""
    sums: dict[int, list[float]] = {}
    for row in rows:
        if row.model == model and row.measure == measure and row.variant == variant and row.value is not None:
            sums.setdefault(depth_bin(row.layer, row.n_layers, n_bins), []).append(row.value)
    return {b: sum(v) / len(v) for b, v in sorted(sums.items())}


@dataclass(frozen=True)
class Stability:
    """Per model and criterion, Spearman between its per-layer values on the main evaluation text
    and on each other calibration variant; stable when the lowest is at least STABLE_RHO."""

    rho: dict[str, dict[str, dict[str, float | None]]]  # model -> criterion -> variant -> rho
    stable: dict[str, bool | None]  # criterion -> stable on every model (None: no variant)
    threshold: float = STABLE_RHO


def stability(rows: Sequence[AtlasRow]) -> Stability:
    variants = [v for v in dict.fromkeys(row.variant for row in rows) if v != MAIN]
    rho: dict[str, dict[str, dict[str, float | None]]] = {}
    verdicts: dict[str, list[float | None]] = {}
    for model in models_of(rows):
        rho[model] = {}
        for criterion in criteria_of(rows):
            main = profile(rows, model, criterion)
            per = {v: rank_agreement(main, profile(rows, model, criterion, v)) for v in variants
                   if profile(rows, model, criterion, v)}
            if per:
                rho[model][criterion] = per
                verdicts.setdefault(criterion, []).extend(per.values())
    stable = {c: (all(r is not None and r >= STABLE_RHO - 1e-9 for r in rs) if rs else None)  # 0.8 comes out 0.7999...
              for c, rs in verdicts.items()}
    return Stability(rho, stable)


# class bands -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class DepthBand:
    """One relative-depth bin: [lo, hi), and whether every model's layers there are critical, all
    redundant, mixed, or whether some model has no layer in it (uncovered)."""

    bin: int
    lo: float
    hi: float
    verdict: str  # critical, redundant, mixed or uncovered


def classes_by_model(rows: Iterable[AtlasRow]) -> dict[str, dict[int, str]]:
    """model -> layer -> ablation class (from the d_pct rows: their class, else their value's)."""
    from engine.evaluation.statistics import importance_class

    found: dict[str, dict[int, str]] = {}
    for row in rows:
        if row.measure == "d_pct" and row.variant == MAIN and (row.layer_class or row.value is not None):
            found.setdefault(row.model, {})[row.layer] = row.layer_class or importance_class(row.value or 0.0)
    return found


def shared_bands(rows: Sequence[AtlasRow], n_bins: int = DEFAULT_BINS) -> list[DepthBand]:
    classes = classes_by_model(rows)
    depth = {row.model: row.n_layers for row in rows}
    bands = []
    for b in range(n_bins):
        verdict = "uncovered" if not classes else ""
        per_model = []
        for model, layers in classes.items():
            inside = [c for layer, c in layers.items() if depth_bin(layer, depth[model], n_bins) == b]
            if not inside:
                verdict = "uncovered"
            per_model.extend(inside)
        if not verdict:
            verdict = next((c for c in ("critical", "redundant") if all(x == c for x in per_model)), "mixed")
        bands.append(DepthBand(b, b / n_bins, (b + 1) / n_bins, verdict))
    return bands


def class_band(layers: Mapping[int, str], n_layers: int, width: int) -> str:
    """A model's classes as `width` characters on relative depth: column j shows the layer nearest
    to depth j / (width - 1), halves up (C critical, I important, m minor, r redundant, . unknown)."""
    letters = {"critical": "C", "important": "I", "minor": "m", "redundant": "r"}
    return "".join(letters.get(layers.get(int(j * (n_layers - 1) / max(width - 1, 1) + 0.5), ""), ".")
                   for j in range(width))


# the document ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class AtlasDocument:
    """results/atlas.json of an atlas session (and what `compare` computes from sessions)."""

    name: str
    models: list[str]
    measures: list[str]
    sessions: dict[str, dict[str, dict[str, str]]]  # model -> variant -> experiment -> session
    variants: dict[str, dict[str, Any]]  # variant -> its evaluation flags
    n_bins: int
    rows: list[AtlasRow]
    agreement: Agreement
    stability: Stability
    bands: list[DepthBand]
    criteria: dict[str, str] = field(default_factory=lambda: dict(CRITERIA))

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = json_safe(self)
        return doc

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> AtlasDocument:
        try:
            return from_doc(cls, doc)
        except (TypeError, ValueError, KeyError) as exc:
            raise UserError(f"the atlas document cannot be read ({exc}); run the atlas again") from None


def build(name: str, models: list[str], measures: list[str], sessions: dict[str, dict[str, dict[str, str]]],
          variants: dict[str, dict[str, Any]], rows: list[AtlasRow], n_bins: int = DEFAULT_BINS) -> AtlasDocument:
    return AtlasDocument(name, models, measures, sessions, variants, n_bins, rows, agreement(rows, n_bins),
                         stability(rows), shared_bands(rows, n_bins))

