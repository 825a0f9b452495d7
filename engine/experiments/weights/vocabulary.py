"""Weight predictability's words: WeightsSettings (components, paradox layers, nulls), the
`weights.component` and `weights.paradox` events, and results/weights.json. Torch-free."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from engine.core.codec import ABSENT
from engine.core.errors import UserError
from engine.core.events import Event, ResultDocument, event, renamed_v1, result, table_row
from engine.core.settings import MAX_SEED, check_layers, setting
from engine.data.eval_data import EvalProtocol
from engine.data.text_settings import EvalTextSettings
from engine.experiments.contract import Contract, FigureShape, Frame
from engine.models.families import check_matrix_names
from engine.models.memory import ModelShape

S = TypeVar("S")

PREDICTIONS = ("in_sample", "loo")


@dataclass(frozen=True)
class WeightsSettings(EvalTextSettings):
    """Defaults: cubic polynomial plus sine/cosine at 1 and 2 cycles over the depth, alpha 1, the
    paper's predicted layers 2 to last, 5 draws of each null, paradox with 1, 3, 9 and all layers."""

    components: tuple[str, ...] = setting((), "canonical matrix names (Llama: q,k,v,o,gate,up,down); "
                                          "default: all")
    degree: int = setting(3, "polynomial degree of the index features", low=0)
    frequencies: tuple[float, ...] = setting((1.0, 2.0), "sin/cos features with these cycles over the depth",
                                             above=0)
    alpha: float = setting(1.0, "ridge penalty", above=0)
    first_layer: int = setting(2, "predict layers from this one to the last (paper: 2)", low=0)
    null_draws: int = setting(5, "shuffled orders and independent Gaussian draws per null", low=1)
    seed: int = setting(0, "seed of the nulls", low=0, high=MAX_SEED)
    paradox: bool = setting(True, "the perplexity runs with predicted weights (--no-paradox skips them)")
    paradox_counts: tuple[int, ...] = setting((1, 3, 9, 0), "how many layers to replace in each run",
                                              low=0, words={"all": 0})  # 0: every predicted layer
    paradox_layers: tuple[int, ...] = setting((), "replacement order (the first N are replaced); default "
                                              "best-predicted first", low=0)
    paradox_prediction: str = setting("in_sample", "in_sample: the fit that saw the layer (paper); loo: the "
                                      "fit that did not", choices=PREDICTIONS)
    chunk: int = setting(1 << 14, "elements per layer per Gram accumulation step (a few MB)", low=1, cli=False)

    def check(self) -> None:
        if self.degree == 0 and not self.frequencies:
            raise UserError("no features: give --degree 1 or more, or at least one --frequencies value")

    def validate_for(self, n: int, family: str) -> tuple[str, ...]:
        """Checks what depends on the model (its layer count, its family: the config's model_type,
        before the load too); returns the components to analyse."""
        if not 0 <= self.first_layer <= n - 3:
            raise UserError(f"--first-layer must be between 0 and {n - 3} (at least 3 layers to predict)")
        check_layers(self.paradox_layers, n, "--paradox-layers")
        for index in self.paradox_layers:
            if index < self.first_layer:
                raise UserError(f"--paradox-layers: layer {index} is not predicted (from {self.first_layer})")
        return check_matrix_names(family, self.components or None)

    def check_against(self, shape: ModelShape) -> None:
        self.validate_for(shape.n_layers, shape.family)

    def edits_weights(self) -> bool:
        return self.paradox  # the paradox runs put predicted weights in


@event("weights.component")
class ComponentAnalysed(Event):
    """One component's headline numbers, real beside the independent null."""

    component: str
    r2_in_sample: float
    r2_loo: float
    delta_corr_mean: float
    null_delta_corr_mean: float


@event("weights.paradox")
class ParadoxTrial(Event):
    """Predicted weights put into `layers_replaced`: the perplexity they give."""

    layers_replaced: tuple[int, ...]
    ppl: float
    baseline_ppl: float
    r2_in_sample_mean: float
    r2_loo_mean: float


@dataclass(frozen=True)
class ParadoxRow:
    """One row of results/weights.json's `paradox`: predicted weights in `layers_replaced`."""

    layers_replaced: list[int]
    ppl: float | None
    degradation_pct: float | None
    r2_in_sample_mean: float
    r2_loo_mean: float
    cosine_mean: float
    prediction: str  # in_sample or loo


@dataclass(frozen=True)
class WeightStats:
    """How predictable one component's matrices are from the layer index (Ridge R² in-sample and
    leave-one-layer-out, the mean leave-one-out cosine) and how its layer-to-layer differences
    correlate, over the predicted layers: of the real weights, or mean of a null's draws."""

    r2_in_sample: float | None
    r2_loo: float | None
    cosine_loo: float | None
    delta_corr_mean: float | None
    delta_corr_sd: float | None


@dataclass(frozen=True)
class NullModel(WeightStats):
    """results/weights.json `null_shuffled` (the layers in a random order) or `null_independent`
    (independent layers of the same means and spreads): the mean of each statistic over the draws,
    with its [min, max] `range`."""

    range: dict[str, list[float | None]]
    draws: int


@dataclass(frozen=True)
class FitSummary:
    """A component's Ridge fit over every layer (`all_layers`)."""

    r2_in_sample: float | None
    r2_loo: float | None
    cosine_loo: float | None


@dataclass(frozen=True)
class LayerFit:
    """One layer's prediction: R² and cosine with its real matrix, in-sample and leave-one-out."""

    r2_in_sample: float | None
    r2_loo: float | None
    cosine_in_sample: float | None
    cosine_loo: float | None


@dataclass(frozen=True)
class WeightsLayer:
    """One layer of a component's `per_layer`."""

    layer: int
    predicted: LayerFit | None  # None below --first-layer
    all_layers: LayerFit
    delta_corr: float | None  # corr(W_l+1 - W_l, W_l+2 - W_l+1); None on the last two layers
    mean: float
    std: float


@dataclass(frozen=True)
class WeightsComponent(WeightStats):
    """One component (attn.q, mlp.down...) of results/weights.json `components`: its statistics
    beside both nulls', a line `reading` each against them, and every layer."""

    shape: list[int]
    all_layers: FitSummary
    null_shuffled: NullModel
    null_independent: NullModel
    reading: dict[str, str]
    per_layer: list[WeightsLayer]


@result("weights")
class WeightsResult(ResultDocument):
    """results/weights.json."""

    model: str
    family: str
    n_layers: int
    predicted_layers: list[int]  # [first, last]
    settings: WeightsSettings  # as the run resolved them
    components: dict[str, WeightsComponent]
    paradox: list[ParadoxRow]  # [] with --no-paradox
    baseline_ppl: float | None  # None with --no-paradox
    seconds: float
    protocol: EvalProtocol = field(default=ABSENT, kw_only=True)  # absent before 0.4

    def tidy_rows(self) -> list[dict[str, Any]]:
        """A row per component and weights (`real`, or a null: `shuffled`, `independent`): how well
        the layer index predicts them, and their delta correlation."""
        names = [f.name for f in dataclasses.fields(WeightStats)]
        return [{"component": name, "weights": weights, **table_row(stats, *names)}
                for name, component in self.components.items()
                for weights, stats in (("real", component), ("shuffled", component.null_shuffled),
                                       ("independent", component.null_independent))]

    @classmethod
    def upgrade_v1(cls, doc: dict[str, Any]) -> dict[str, Any]:
        if isinstance(doc.get("components"), dict):
            doc["components"] = {
                key: {**comp, "per_layer": [renamed_v1(row) for row in comp.get("per_layer", [])]}
                for key, comp in doc["components"].items()
            }
        return doc


def sample() -> WeightsResult:
    """Two components, the real fit beside both nulls, and the paradox: the tests' and snapshots' example."""
    def stats(cls: Callable[..., S], r2_in: float, r2_loo: float, **more: Any) -> S:
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
    baseline = 20.0
    paradox = [ParadoxRow(layers_replaced=layers, ppl=baseline * (1 + len(layers)), degradation_pct=100.0 * len(layers),
                          r2_in_sample_mean=0.8, r2_loo_mean=0.5, cosine_mean=0.4, prediction="loo")
               for layers in ([3], [2, 3, 4])]  # fmt: skip
    return WeightsResult(model="tiny", family="llama", n_layers=6, predicted_layers=[1, 5], settings=WeightsSettings(),
                         components=components, paradox=paradox, baseline_ppl=baseline, seconds=1.0)


CONTRACT = Contract(
    WeightsSettings, WeightsResult, sample,
    frame=Frame(columns=("component", "weights", "r2_in_sample", "r2_loo", "cosine_loo", "delta_corr_mean",
                        "delta_corr_sd"), rows=2 * 3),
    figure=FigureShape(panels=(("matrix", "R² (leave one layer out)"), ("matrix", "corr(ΔW_l, ΔW_l+1)"),
                               ("layers replaced by their prediction", "D (%)"))),
)
