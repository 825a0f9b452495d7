"""The layer map's words: AblationSettings (method, bootstrap, layers), the `ablation.layer` and
`ablation.proxies` events, and results/ablation.json (AblationMap, a row per layer). Torch-free."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from engine.core.events import (
    ABSENT,
    Event,
    ResultDocument,
    event_type,
    renamed_v1,
    result_type,
)
from engine.core.settings import MAX_SEED, check_layers, setting
from engine.data.eval_data import EvalProtocol
from engine.data.text_settings import EvalTextSettings
from engine.models.memory import ModelShape

METHODS = ("mean", "skip", "zero")


@dataclass(frozen=True)
class AblationSettings(EvalTextSettings):
    """Defaults follow the paper: neighbour mean, norms untouched."""

    method: str = setting("mean", "mean: neighbours' mean (paper); skip: pass the input through; "
                          "zero: zero matrices", choices=METHODS)
    bootstrap: int = setting(0, "resample the texts N times for 95% intervals of D (e.g. 1000; 0: off)", low=0)
    seed: int = setting(0, "bootstrap seed", low=0, high=MAX_SEED)
    prefix_cache: bool = setting(True, "reuse the layers below the ablated one (off only to measure the "
                                 "straightforward version)", cli=False)
    layers: tuple[int, ...] | None = setting(None, "ablate only these layers (a shard of a split sweep takes a few)",
                                             low=0, none_word="all")

    def check_against(self, shape: ModelShape) -> None:
        check_layers(self.layers or (), shape.n_layers, "--layers")

    def edits_weights(self) -> bool:
        return self.method != "skip"  # mean and zero put other weights in the ablated layer


@event_type
@dataclass(frozen=True)
class LayerAblated(Event):
    """One row of the map, as soon as it is known (before any bootstrap)."""

    kind: ClassVar[str] = "ablation.layer"
    v1_fields: ClassVar[Mapping[str, str]] = {"index": "layer"}
    layer: int
    n_layers: int
    ppl: float
    baseline_ppl: float
    degradation_pct: float
    layer_class: str


@event_type
@dataclass(frozen=True)
class AblationProxies(Event):
    """Block Influence and angular distance of every layer (lists indexed by layer) and the baseline
    perplexity, known after the first pass, long before the last ablation."""

    kind: ClassVar[str] = "ablation.proxies"
    block_influence: list[float]
    angular_distance: list[float]
    baseline_ppl: float


@dataclass(frozen=True)
class AblationRow:
    """One layer of the importance map. A live row (from `LayerAblated`) has only the first four;
    the saved map fills in the rest."""

    layer: int
    ppl: float | None
    degradation_pct: float | None
    layer_class: str
    anti: bool = False
    anti_within_noise: bool = False
    ci_low: float | None = None
    ci_high: float | None = None
    block_influence: float | None = None
    angular_distance: float | None = None  # angular_all_tokens: arccos(cos(h_in, h_out)) / pi, mean over real tokens
    angular_last_token: float | None = field(default=ABSENT, kw_only=True)  # the same, of each text's last token


@result_type
@dataclass(frozen=True)
class AblationMap(ResultDocument):
    """results/ablation.json."""

    name: ClassVar[str] = "ablation"  # results/ablation.json

    model: str
    method: str
    baseline_ppl: float
    eval_tokens: int
    eval_texts: int
    seconds: float
    settings: AblationSettings  # as the run resolved them
    layers: list[AblationRow]
    spearman: dict[str, float | None]
    protocol: EvalProtocol = field(default=ABSENT, kw_only=True)  # absent before 0.4
    # angular_block_n (Gromov et al.): n -> [arccos(cos(h_l, h_{l+n})) / pi of the last token, l = 0 .. depth - n]
    angular_blocks: dict[str, list[float]] = field(default=ABSENT, kw_only=True)
    angular_block_best: dict[str, int] = field(default=ABSENT, kw_only=True)  # n -> its smallest block's first layer

    @classmethod
    def upgrade_v1(cls, doc: dict[str, Any]) -> dict[str, Any]:
        if isinstance(doc.get("layers"), list):
            doc["layers"] = [renamed_v1(row) for row in doc["layers"]]
        return doc


def sample() -> AblationMap:
    """A map of six layers, one of each class and an anti-layer, with intervals and proxies: the
    tests' and snapshots' example, and what a new view is first drawn with."""
    baseline = 20.0
    rows = [
        AblationRow(layer=layer, ppl=baseline * (1 + d / 100), degradation_pct=d, layer_class=name, anti=anti,
                    anti_within_noise=False, ci_low=d - 1.0, ci_high=d + 1.0, block_influence=0.01 * (layer + 1),
                    angular_distance=0.02 * (layer + 1))
        for layer, (d, name, anti) in enumerate([
            (9000.0, "critical", False), (45.0, "important", False), (12.0, "minor", False),
            (3.0, "redundant", False), (-8.0, "redundant", True), (150.0, "critical", False),
        ])
    ]  # fmt: skip
    return AblationMap(model="tiny", method="mean", baseline_ppl=baseline, eval_tokens=100, eval_texts=4, seconds=1.0,
                       settings=AblationSettings(), layers=rows,
                       spearman={"block_influence": 0.5, "angular_distance": 0.5})
