"""Weight manipulation's words: ManipulationSettings (strategies, alphas, ranks, layers), the
`manipulate.trial` event, and results/manipulate.json (a row per trial). Torch-free."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from engine.core.codec import ABSENT
from engine.core.errors import UserError
from engine.core.events import Event, ResultDocument, event, result, table_row
from engine.core.settings import check_layers, setting
from engine.data.eval_data import EvalProtocol
from engine.data.text_settings import EvalTextSettings
from engine.experiments.contract import Contract, FigureShape, Frame
from engine.models.memory import ModelShape


def _layers_text(text: str) -> tuple[int, ...]:
    """'3,5' -> (3, 5); 'all' -> () (every layer)."""
    if text.strip().lower() == "all":
        return ()
    return tuple(int(part) for part in text.split(",") if part.strip())


STRATEGIES = ("zero", "clone", "blend", "svd", "scale")


PAPER_ALPHAS = (0.0, 0.1, 0.3, 0.5, 0.7, 0.9)


@dataclass(frozen=True)
class ManipulationSettings(EvalTextSettings):
    """Defaults follow the paper: the five strategies, alpha grid 0-0.9, one layer at a time."""

    layers: tuple[int, ...] | None = setting(
        None, "layers to manipulate, or 'all'; default: the redundant and anti layers of the session's "
        "ablation map of this model, else all", low=0, parse=_layers_text,
        show=lambda layers: ",".join(map(str, layers)) or "all",
    )  # (): every layer
    strategies: tuple[str, ...] = setting(STRATEGIES, "strategies to try", choices=STRATEGIES)
    alphas: tuple[float, ...] = setting(PAPER_ALPHAS, "scale factors for 'scale'")
    rank: int = setting(8, "svd: rank kept of the layer's own difference from the blend", low=1)
    together: bool = setting(False, "also apply each strategy to all chosen layers at once")
    prompt: str = setting("The capital of France is", "prompt of the greedy samples")
    sample_tokens: int = setting(20, "tokens per greedy sample (0: none)", low=0)

    def check(self) -> None:
        if not self.strategies:
            raise UserError(f"--strategies is empty; use some of {', '.join(STRATEGIES)}")
        if "scale" in self.strategies and not self.alphas:
            raise UserError("--alphas is empty; give at least one scale factor, e.g. 0.9")

    def check_against(self, shape: ModelShape) -> None:
        check_layers(self.layers or (), shape.n_layers, "--layers")

    def edits_weights(self) -> bool:
        return True  # every strategy replaces the layer's weights


@event("manipulate.trial")
class TrialDone(Event):
    """One manipulation trial: a strategy (with its parameter) on some layers, and what it gave."""

    layers: tuple[int, ...]
    strategy: str
    param: float | None
    ppl: float
    baseline_ppl: float
    degradation_pct: float
    sample: str


@dataclass(frozen=True)
class ManipulateRow:
    """One trial of results/manipulate.json (`results[]`)."""

    layers: list[int]
    strategy: str
    param: float | None  # alpha for scale, rank for svd
    ppl: float | None
    degradation_pct: float | None
    sample: str
    together: bool


@result("manipulate")
class ManipulateResult(ResultDocument):
    """results/manipulate.json: every trial, one layer at a time (then together with --together)."""

    model: str
    baseline_ppl: float
    baseline_sample: str  # the unchanged model's greedy sample of `prompt`
    prompt: str
    layers: list[int]  # the layers manipulated
    eval_tokens: int
    seconds: float
    settings: ManipulationSettings  # as the run resolved them
    results: list[ManipulateRow]  # in the order of the trials
    protocol: EvalProtocol = field(default=ABSENT, kw_only=True)  # absent before 0.4

    def tidy_rows(self) -> list[dict[str, Any]]:
        """A row per trial, in the order they ran: the layers changed, the strategy and its parameter,
        the perplexity and its degradation, the greedy sample."""
        return [table_row(row) for row in self.results]




def sample() -> ManipulateResult:
    """Four strategies on layer 3 with their samples: the tests' and snapshots' example."""
    baseline = 20.0
    rows = [
        ManipulateRow(layers=[3], strategy=strategy, param=param, ppl=baseline * (1 + d / 100), degradation_pct=d,
                      sample=f"The capital of France is Paris ({strategy})", together=False)
        for strategy, param, d in (("scale", 0.5, 2.5), ("svd", 8, 11.0), ("zero", None, 40.0), ("mean", None, -1.5))
    ]  # fmt: skip
    return ManipulateResult(
        model="tiny", baseline_ppl=baseline, baseline_sample="The capital of France is Paris",
        prompt="The capital of France is", layers=[3], eval_tokens=100, seconds=1.0,
        settings=ManipulationSettings(), results=rows,
    )  # fmt: skip


CONTRACT = Contract(
    ManipulationSettings, ManipulateResult, sample,
    frame=Frame(columns=("layers", "strategy", "param", "ppl", "degradation_pct", "sample", "together"), rows=4),
    figure=FigureShape(panels=(("D (%)", ""),)),
)
