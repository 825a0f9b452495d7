"""The layer map's words: AblationSettings (method, bootstrap, layers), the `ablation.layer`,
`ablation.proxies` and `ablation.layer_proxies` events, and results/ablation.json (AblationMap, a
row per layer). Torch-free."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from engine.core.codec import ABSENT
from engine.core.events import Event, ResultDocument, event, renamed_v1, result, table_row
from engine.core.settings import MAX_SEED, check_layers, setting
from engine.data.eval_data import EvalProtocol
from engine.data.text_settings import EvalTextSettings
from engine.experiments.contract import Contract, FigureShape, Frame
from engine.models.families import check_parts
from engine.models.memory import ModelShape

METHODS = ("mean", "skip", "zero")
PART_CHOICES = ("layer", "attention", "mlp", "both")  # what --part maps below the whole layer


def reach_of(method: str) -> int:
    """Layers on each side a unit's removal reads: the neighbour mean its neighbours."""
    return 1 if method == "mean" else 0


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
    part: str = setting("layer", "layer: whole layers (the map); attention, mlp or both: each layer's block(s) too, "
                        "removed alone (skip: its term in the residual sum zero; zero: its matrices zeroed; mean: "
                        "its matrices the neighbours' mean)", choices=PART_CHOICES)
    proxies_only: bool = setting(False, "only Block Influence and the angular distances (of every layer, and with "
                                 "--part every block) from one pass, no ablation: results/ablation-proxies.json")
    stream: bool = setting(False, "read the model from its safetensors layer by layer, each weight once, every "
                           "branch of the map advancing through the layer in memory (a model larger than memory; "
                           "the same map)", resume_free=True)

    def parts(self) -> tuple[str, ...]:
        """The blocks mapped below the whole layer, in the order a layer runs them."""
        return {"layer": (), "attention": ("attention",), "mlp": ("mlp",), "both": ("attention", "mlp")}[self.part]

    def branches(self, n_layers: int) -> int:
        """A streamed map's branches: the clean pass and one per ablated unit (a layer, then its blocks)."""
        units = 0 if self.proxies_only else len(set(self.layers or range(n_layers))) * (1 + len(self.parts()))
        return 1 + units

    def reach(self) -> int:
        """Layers on each side a streamed map holds beside the one computing: those a unit's removal
        reads (the neighbour mean's neighbours); none for the proxies alone, which remove nothing."""
        return 0 if self.proxies_only else reach_of(self.method)

    def window(self) -> int:
        """Layers a streamed map holds while one computes: the ablated one and those its removal reads."""
        return 2 * self.reach() + 1

    def check_against(self, shape: ModelShape) -> None:
        check_layers(self.layers or (), shape.n_layers, "--layers")
        if self.parts() and shape.family:
            check_parts(shape.family)

    def edits_weights(self) -> bool:
        return self.method != "skip"  # mean and zero put other weights in the ablated layer


@event("ablation.layer", v1_fields={"index": "layer"})
class LayerAblated(Event):
    """One row of the map, as soon as it is known (before any bootstrap); with `part` (--part), a
    block's row: "attention" or "mlp" of that layer (absent: the whole layer)."""

    layer: int
    n_layers: int
    ppl: float
    baseline_ppl: float
    degradation_pct: float
    layer_class: str
    part: str = field(default=ABSENT, kw_only=True)  # "attention" or "mlp" for a block (--part); absent: the layer

    def row(self) -> AblationRow:
        """The map's row it tells, live: its first four fields (the saved map fills in the rest)."""
        return AblationRow(layer=self.layer, ppl=self.ppl, degradation_pct=self.degradation_pct,
                           layer_class=self.layer_class)


@event("ablation.proxies")
class AblationProxies(Event):
    """Block Influence and angular distance of every layer (lists indexed by layer) and the baseline
    perplexity, known after the first pass, long before the last ablation."""

    block_influence: list[float]
    angular_distance: list[float]
    baseline_ppl: float


@event("ablation.layer_proxies")
class LayerProxies(Event):
    """One layer's Block Influence and angular distance as a streamed map's wavefront passes it
    (its perplexities come only at the end), so the console shows each layer's proxies live."""

    layer: int
    n_layers: int
    block_influence: float
    angular_distance: float


@dataclass(frozen=True)
class AblationRow:
    """One layer of the importance map, or with `part` one of its blocks ("attention" or "mlp",
    removed alone; `part` is absent for a whole layer, so a layer map's rows read as before). A
    live row (from `LayerAblated`) has only the first four; the saved map fills in the rest. A
    block's proxies compare the residual stream before and after its addition (a parallel layer:
    the layer's input and the input plus the block's own term)."""

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
    part: str = field(default=ABSENT, kw_only=True)  # "attention" or "mlp": a block's row (--part)


@result("ablation")
class AblationMap(ResultDocument):
    """results/ablation.json: `layers`, one row per whole layer, always (every reader of the map
    reads these), and with `--part` also `parts`, one row per (layer, block) in layer order,
    attention before MLP, each with its `part` (absent from a layer map, which reads and writes
    byte for byte as before). `spearman` ranks the whole layers; a part map adds
    `<part>:<measure>` keys for each block's ranking. `partial` (true) marks the map of a run stopped
    before its last layer (cancelled, Ctrl-C, SIGTERM): `layers` holds the rows it finished, each
    equal to a full run's, and `--resume` completes it (absent from a finished map)."""

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
    parts: list[AblationRow] = field(default=ABSENT, kw_only=True)  # --part: each block's row; absent: a layer map
    partial: bool = field(default=ABSENT, kw_only=True)  # true: a stopped run's finished rows; absent: the whole map

    def planned_layers(self) -> int:
        """How many whole layers the run set out to map: its --layers, else every layer of the model
        (the length of the one-layer blocks' row; a map from before those: the rows it has)."""
        if self.settings.layers is not None:
            return len(set(self.settings.layers))
        return len(self.angular_blocks.get("1", ())) if self.angular_blocks else len(self.layers)

    def partial_text(self) -> str:
        """`partial: 12 of 30 layers` for a stopped run's map; empty for a whole one."""
        return f"partial: {len(self.layers)} of {self.planned_layers()} layers" if self.partial is True else ""

    def part_rows(self, part: str) -> dict[int, AblationRow]:
        """Layer -> the row of its `part` block (empty for a layer map)."""
        return {row.layer: row for row in self.parts or () if row.part == part}

    def tidy_rows(self) -> list[dict[str, Any]]:
        """A row per whole layer (`part` "layer"), then with --part a row per block."""
        return block_rows(self.layers, self.parts)

    @classmethod
    def upgrade_v1(cls, doc: dict[str, Any]) -> dict[str, Any]:
        if isinstance(doc.get("layers"), list):
            doc["layers"] = [renamed_v1(row) for row in doc["layers"]]
        return doc


@dataclass(frozen=True)
class ProxyRow:
    """One layer's (or with `part`, one block's) cheap measures from the one pass, no ablation."""

    layer: int
    block_influence: float
    angular_distance: float  # all tokens
    angular_last_token: float
    part: str = field(default=ABSENT, kw_only=True)


@result("ablation-proxies")
class AblationProxyMap(ResultDocument):
    """results/ablation-proxies.json (`run ablation --proxies-only`): Block Influence and the
    angular distances of every layer, and with --part of every block, from one forward with
    hidden states over the evaluation texts; equal to the full map's proxies at one pass's price.
    A file of its own, so the session's map (results/ablation.json, read by recovery, prune and
    the console) is left as it is."""

    model: str
    baseline_ppl: float
    eval_tokens: int
    eval_texts: int
    seconds: float
    settings: AblationSettings
    layers: list[ProxyRow]
    protocol: EvalProtocol
    angular_blocks: dict[str, list[float]]
    angular_block_best: dict[str, int]
    parts: list[ProxyRow] = field(default=ABSENT, kw_only=True)

    def tidy_rows(self) -> list[dict[str, Any]]:
        """A row per whole layer (`part` "layer"), then with --part a row per block."""
        return block_rows(self.layers, self.parts)


def block_rows(layers: list[Any], parts: list[Any]) -> list[dict[str, Any]]:
    """The tidy rows of a map: each layer's, then each block's, `part` "layer" for a whole layer."""
    return [{"layer": row.layer, "part": "layer" if row.part is ABSENT else row.part,
             **{name: value for name, value in table_row(row).items() if name != "part"}}
            for row in (*layers, *(parts or ()))]


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


def sample_parts() -> AblationMap:
    """The sample map with its blocks: in each layer the attention and the MLP removed alone, the
    MLP of layer 0 the critical one, one block an anti-block (the console's side-by-side columns)."""
    import dataclasses

    whole = sample()
    baseline = whole.baseline_ppl
    degradations = [(800.0, 4000.0), (20.0, 15.0), (5.0, 6.0), (1.0, 0.5), (-3.0, 2.0), (40.0, 90.0)]
    parts = []
    for layer, pair in enumerate(degradations):
        for part, d in zip(("attention", "mlp"), pair, strict=True):
            name = "critical" if d >= 100 else "important" if d >= 30 else "minor" if d >= 10 else "redundant"
            parts.append(AblationRow(layer=layer, ppl=baseline * (1 + d / 100), degradation_pct=d, layer_class=name,
                                     anti=d < 0, ci_low=d - 0.5, ci_high=d + 0.5 if d > 0 else -1.0,
                                     block_influence=0.005 * (layer + 1), angular_distance=0.01 * (layer + 1),
                                     angular_last_token=0.012 * (layer + 1), part=part))
    return dataclasses.replace(whole, parts=parts)


CONTRACT = Contract(
    AblationSettings, AblationMap, sample,
    frame=Frame(columns=("layer", "part", "ppl", "degradation_pct", "layer_class", "anti", "anti_within_noise",
                         "ci_low", "ci_high", "block_influence", "angular_distance", "angular_last_token"), rows=6),
    figure=FigureShape(panels=(("layer", "D (%)"), ("Block Influence", "D (%)"), ("angular distance", ""))),
)
